"""`tfpipe loadtest --replay PREFIX`: logged requests sent again, at the times they came in.

Each record of a request log (tfpipe.prediction_logs) holds one answered call: its request,
the API and protocol it came in on, when it started and how long the server took. Replay sends
every request over the same API and protocol, at its recorded offset from the first one
(divided by --speed): an open model, so a server slower than the original falls behind and the
latency counted from each request's due time shows it.

A gRPC request goes as the logged message. A REST request is rebuilt as the JSON the server
turned into that message: named tensors as rows ("instances") or columns ("inputs"), as the
client laid them out; tf.Examples as "examples" (and "context"); binary strings as {"b64": ...}.
The model version is left out, so the requests reach whatever version now serves the model.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from tfpipe.loadtest.errors import LoadtestError
from tfpipe.loadtest.histogram import LatencyHistogram
from tfpipe.loadtest.payloads import rest_value

GRPC_METHODS = {"predict": "Predict", "classify": "Classify", "regress": "Regress",
                "multi_inference": "MultiInference"}


def predict_json(request, signature: str, rest_format: str) -> dict[str, Any]:
    """The JSON body of a REST :predict call that the server reads as `request`."""
    import tensorflow as tf

    # TF Serving's convention: an input whose name ends in _bytes holds binary data.
    tensors = {k: rest_value(tf.make_ndarray(t).tolist(), k.endswith("_bytes")) for k, t in request.inputs.items()}
    body: dict[str, Any] = {"signature_name": signature} if signature else {}
    if rest_format == "inputs":
        body["inputs"] = tensors
    elif len(tensors) == 1:
        body["instances"] = next(iter(tensors.values()))
    else:
        n = len(next(iter(tensors.values())))
        body["instances"] = [{k: v[i] for k, v in tensors.items()} for i in range(n)]
    return body


def _features_json(example) -> dict[str, Any]:
    out = {}
    for key, f in example.features.feature.items():
        kind = f.WhichOneof("kind")
        values = list(getattr(f, kind).value) if kind else []
        values = rest_value(values, key.endswith("_bytes"))
        out[key] = values[0] if len(values) == 1 else values
    return out


def examples_json(request, signature: str) -> dict[str, Any]:
    """The JSON body of a REST :classify or :regress call that the server reads as `request`."""
    body: dict[str, Any] = {"signature_name": signature} if signature else {}
    inp = request.input
    if inp.WhichOneof("kind") == "example_list_with_context":
        body["context"] = _features_json(inp.example_list_with_context.context)
        examples = inp.example_list_with_context.examples
    else:
        examples = inp.example_list.examples
    body["examples"] = [_features_json(ex) for ex in examples]
    return body


def build_items(logs: list[tuple], model: str | None) -> tuple[list[list], dict[str, Any]]:
    """[[offset_s, protocol, path or gRPC method, body (REST JSON text, or base64 gRPC request)], ...]
    in the order the requests came in, and what the log recorded (count, span, rate, latency)."""
    timed = [(t.start_unix_nanos or lg.log_metadata.timestamp_secs * 10**9, lg, t) for lg, t in logs]
    if not timed:
        raise LoadtestError("the request log holds no request to replay")
    timed.sort(key=lambda x: x[0])
    first = timed[0][0]
    items, latency, kinds = [], LatencyHistogram(), {}
    for start, lg, t in timed:
        which = lg.WhichOneof("log_type")
        if which is None:
            continue
        api = which.removesuffix("_log")
        request = getattr(lg, which).request
        name = model or lg.log_metadata.model_spec.name
        signature = lg.log_metadata.model_spec.signature_name
        protocol = t.protocol or "grpc"  # a log from another server: its protocol is unknown
        if protocol == "rest" and api == "multi_inference":
            protocol = "grpc"  # TF Serving has no REST MultiInference; only gRPC can carry it
        if protocol == "rest":
            body = predict_json(request, signature, t.rest_format) if api == "predict" else examples_json(request,
                                                                                                          signature)
            items.append([(start - first) / 1e9, "rest", f"/v1/models/{name}:{api}", json.dumps(body)])
        else:
            request = type(request).FromString(request.SerializeToString())
            specs = [task.model_spec for task in request.tasks] if api == "multi_inference" else [request.model_spec]
            for spec in specs:
                spec.name = name
                spec.ClearField("version")
                spec.ClearField("version_label")
            items.append([(start - first) / 1e9, "grpc", GRPC_METHODS[api],
                          base64.b64encode(request.SerializeToString()).decode("ascii")])
        kinds[f"{api}/{protocol}"] = kinds.get(f"{api}/{protocol}", 0) + 1
        if t.latency_nanos:
            latency.add(t.latency_nanos / 1e9)
    if not items:
        raise LoadtestError("the request log holds no request to replay")
    span = items[-1][0]
    recorded = {"requests": len(items), "span_s": span, "rate": (len(items) - 1) / span if span > 0 else None,
                "by_api": kinds, "server_latency": latency.summary() if latency.n else None}
    return items, recorded


def read_items(prefix: str, model: str | None, limit: int) -> tuple[list[list], dict[str, Any]]:
    from tfpipe.prediction_logs import iter_logs, read_log

    read = read_log(prefix, limit=limit)
    if not read.files:
        raise LoadtestError(f"--replay {prefix}: no request log files there (looked for {prefix}-*.tfrecord)")
    items, recorded = build_items(list(iter_logs(read.records)), model)
    recorded["files"], recorded["truncated"] = len(read.files), read.truncated
    return items, recorded
