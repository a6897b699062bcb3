"""Real requests: eval rows of a tfpipe data directory (or a ready JSON body), shaped for the
signature the server reports in its metadata, as REST bodies or gRPC PredictRequests."""

from __future__ import annotations

import base64
import glob
import json
import math
import os
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlparse

import numpy as np

from tfpipe.loadtest.errors import LoadtestError
from tfpipe.prediction_logs import WARMUP_FILE

MAX_PAYLOADS = 200
_NUMPY = {"DT_FLOAT": np.float32, "DT_DOUBLE": np.float64, "DT_INT64": np.int64, "DT_INT32": np.int32,
          "DT_STRING": object, "DT_BOOL": np.bool_}


def parse_target(target: str) -> tuple[str, str]:
    """('rest', 'http://host:port') or ('grpc', 'host:port'); only these schemes."""
    u = urlparse(target or "")
    if u.scheme in ("http", "https") and u.hostname:
        return "rest", f"{u.scheme}://{u.netloc}"
    if u.scheme == "grpc" and u.hostname and u.port:
        return "grpc", u.netloc
    raise LoadtestError(f"--target must be http://HOST:PORT (REST) or grpc://HOST:PORT, got {target!r}")


def model_path(model: str, version: int | None, label: str | None) -> str:
    path = f"/v1/models/{model}"
    if version is not None:
        path += f"/versions/{version}"
    elif label:
        path += f"/labels/{label}"
    return path


def signature_inputs(kind: str, address: str, model: str, version, label, signature: str) -> dict[str, str]:
    """{input name: dtype name} of the signature, from the server's metadata; fails with one
    clear line when the server is unreachable, or the model or signature is unknown."""
    if kind == "rest":
        url = address + model_path(model, version, label) + "/metadata"
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                meta = json.load(r)
        except urllib.error.HTTPError as e:
            raise LoadtestError(f"{url}: HTTP {e.code}: {_error_text(e)}") from None
        except (urllib.error.URLError, OSError) as e:
            raise LoadtestError(f"cannot reach {address}: {getattr(e, 'reason', e)}") from None
        sigs = meta["metadata"]["signature_def"]["signature_def"]
        if signature not in sigs:
            raise LoadtestError(f"model {model} has no signature {signature!r}; it has: "
                                f"{', '.join(k for k in sigs if not k.startswith('__'))}")
        return {k: v["dtype"] for k, v in sigs[signature]["inputs"].items()}
    import grpc
    from tensorflow.core.framework import types_pb2
    from tensorflow_serving.apis import get_model_metadata_pb2, prediction_service_pb2_grpc

    req = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    req.model_spec.name = model
    if version is not None:
        req.model_spec.version.value = version
    elif label:
        req.model_spec.version_label = label
    try:
        with grpc.insecure_channel(address) as channel:
            resp = prediction_service_pb2_grpc.PredictionServiceStub(channel).GetModelMetadata(req, timeout=10)
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.UNAVAILABLE:
            raise LoadtestError(f"cannot reach grpc://{address}: {e.details()}") from None
        raise LoadtestError(f"grpc://{address}: {e.code().name}: {e.details()}") from None
    sigs = get_model_metadata_pb2.SignatureDefMap()
    resp.metadata["signature_def"].Unpack(sigs)
    if signature not in sigs.signature_def:
        raise LoadtestError(f"model {model} has no signature {signature!r}; it has: "
                            f"{', '.join(k for k in sigs.signature_def if not k.startswith('__'))}")
    return {k: types_pb2.DataType.Name(v.dtype) for k, v in sigs.signature_def[signature].inputs.items()}


def _error_text(e: urllib.error.HTTPError) -> str:
    try:
        return json.loads(e.read())["error"]
    except Exception:
        return e.reason


def rest_value(value: Any, binary: bool) -> Any:
    """A value (nested lists too) as TF Serving's REST API writes it: bytes as {"b64": ...} when
    `binary` (an input named *_bytes, an encoded image) or not UTF-8, else as text."""
    if isinstance(value, list):
        return [rest_value(v, binary) for v in value]
    if isinstance(value, bytes):
        if not binary:
            try:
                return value.decode("utf-8")
            except UnicodeDecodeError:
                pass
        return {"b64": base64.b64encode(value).decode("ascii")}
    return value


def json_row(row: dict) -> dict:
    """A row as a REST instance: bytes values (encoded images) as {"b64": ...}, TF Serving's way."""
    return {k: rest_value(v, binary=True) for k, v in row.items()}


def image_rows(data_dir: str, inputs: dict[str, str], limit: int) -> list[dict]:
    """Encoded images of the test split (eval, then train, when it is empty) as {input: bytes}, for a
    signature with one string input (an image model's serving_default)."""
    import tensorflow as tf

    strings = [k for k, v in inputs.items() if v == "DT_STRING"]
    if len(inputs) != 1 or not strings:
        raise LoadtestError(f"{data_dir} holds images, which only a signature with one string input (encoded "
                            f"image bytes) takes; this one takes {', '.join(f'{k} ({v})' for k, v in inputs.items())}: "
                            f"pass --payload with a request body instead")
    files = _split_files(data_dir, ("test", "eval", "train"))
    rows = []
    for record in tf.data.TFRecordDataset(files, compression_type="GZIP").take(limit):
        ex = tf.train.Example.FromString(record.numpy())
        rows.append({strings[0]: ex.features.feature["image/encoded"].bytes_list.value[0]})
    return rows


def _split_files(data_dir: str, order: tuple[str, ...]) -> list[str]:
    for split in order:
        files = sorted(glob.glob(os.path.join(data_dir, f"{split}-*.tfrecord.gz")))
        if files:
            return files
    raise LoadtestError(f"{data_dir} holds no TFRecords: pass the output directory of tfpipe data")


def is_image_data(data_dir: str) -> bool:
    try:
        with open(os.path.join(data_dir, "schema.json")) as f:
            return json.load(f).get("kind") == "images"
    except (OSError, ValueError):
        return False


# An eval split with fewer rows than this is joined by the test split: the requests of a small data
# set otherwise repeat a few dozen rows, and a skew check on that traffic sees mostly sampling noise.
SMALL_SPLIT_ROWS = 200


def rows_from_data(data_dir: str, inputs: dict[str, str], limit: int) -> list[dict]:
    """Eval rows as {input: python value}, with the test rows after them when the eval split has
    fewer than SMALL_SPLIT_ROWS (train rows when both are empty); for a folder of images, encoded
    test images (see image_rows)."""
    if is_image_data(data_dir):
        return image_rows(data_dir, inputs, limit)
    rows = []
    for split in ("eval", "test"):
        files = sorted(glob.glob(os.path.join(data_dir, f"{split}-*.tfrecord.gz")))
        if files and len(rows) < SMALL_SPLIT_ROWS:
            rows += _example_rows(data_dir, files, inputs, limit - len(rows))
    return rows or _example_rows(data_dir, _split_files(data_dir, ("train",)), inputs, limit)


def _records(data_dir: str, files: list[str], limit: int):
    """Up to `limit` serialized records of `files`, spread evenly over all of them when they hold
    more: a table stored sorted (R's diamonds is in blocks of price) would otherwise send only
    its first rows, and a skew check on that traffic sees a shift that is the file's order. The
    counts come from data.json; without them, the first `limit` records."""
    import tensorflow as tf

    dataset = tf.data.TFRecordDataset(files, compression_type="GZIP")
    counts = _record_counts(data_dir)
    total = sum(counts.get(os.path.basename(f), 0) for f in files) if counts else 0
    if total <= limit:
        yield from dataset.take(limit)
        return
    keep = set(np.linspace(0, total - 1, limit).round().astype(np.int64).tolist())
    for i, record in enumerate(dataset):
        if i in keep:
            yield record


def _record_counts(data_dir: str) -> dict[str, int]:
    """Records per TFRecord file name, from the data stage's data.json ({} when it has none)."""
    try:
        with open(os.path.join(data_dir, "data.json")) as f:
            splits = json.load(f)["outputs"]["splits"]
    except (OSError, ValueError, KeyError):
        return {}
    return {os.path.basename(e["file"]): int(e["records"]) for entries in splits.values() for e in entries}


def _example_rows(data_dir: str, files: list[str], inputs: dict[str, str], limit: int) -> list[dict]:
    import tensorflow as tf

    rows = []
    for record in _records(data_dir, files, limit):
        ex = tf.train.Example.FromString(record.numpy())
        row = {}
        for name, dtype in inputs.items():
            f = ex.features.feature.get(name)
            kind = f.WhichOneof("kind") if f is not None else None
            values = list(getattr(f, kind).value) if kind else []
            if dtype == "DT_STRING":
                row[name] = values[0].decode("utf-8", "replace") if values else ""
            elif dtype in ("DT_FLOAT", "DT_DOUBLE"):
                row[name] = float(values[0]) if values else float("nan")
            else:
                row[name] = int(values[0]) if values else 0
        if not any(n in ex.features.feature for n in inputs):
            raise LoadtestError(f"the rows in {data_dir} share no feature with the signature's inputs "
                                f"{sorted(inputs)}")
        rows.append(row)
    return rows


def rows_from_warmup(version_dir: str, signature: str = "serving_default") -> list[dict]:
    """The rows of the Predict requests in a SavedModel's warmup records (TF Serving's
    assets.extra/tf_serving_warmup_requests, which tfpipe export writes) to `signature`, as
    {input: python value}, as rows_from_data gives them: text as str, binary (inputs named *_bytes,
    or not UTF-8) as bytes."""
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    path = os.path.join(version_dir, WARMUP_FILE)
    if not os.path.exists(path):
        raise LoadtestError(f"{version_dir} has no warmup records ({WARMUP_FILE}): give --data or --payload")
    rows: list[dict] = []
    for record in tf.data.TFRecordDataset(path).take(1000):
        log = prediction_log_pb2.PredictionLog.FromString(record.numpy())
        if log.WhichOneof("log_type") != "predict_log":
            continue
        req = log.predict_log.request
        if (req.model_spec.signature_name or "serving_default") != signature:
            continue
        tensors = {k: _text_or_bytes(tf.make_ndarray(t).tolist(), k.endswith("_bytes")) for k, t in req.inputs.items()}
        lengths = {len(v) if isinstance(v, list) else None for v in tensors.values()}
        if len(lengths) != 1 or None in lengths:
            continue  # not a batch of rows (scalars, or inputs of different lengths)
        n = lengths.pop()
        rows.extend({k: v[i] for k, v in tensors.items()} for i in range(n))
    if not rows:
        raise LoadtestError(f"the warmup records of {version_dir} hold no Predict request to {signature!r} with rows: "
                            "give --data or --payload")
    return rows


def _text_or_bytes(value: Any, binary: bool) -> Any:
    if isinstance(value, list):
        return [_text_or_bytes(v, binary) for v in value]
    if isinstance(value, bytes) and not binary:
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            pass
    return value


def rows_from_payload(path: str) -> list[dict] | dict:
    try:
        with open(path) as f:
            body = json.load(f)
    except (OSError, ValueError) as e:
        raise LoadtestError(f"--payload {path}: {e}") from None
    if not isinstance(body, dict) or not ({"instances", "inputs"} & set(body)):
        raise LoadtestError(f"--payload {path} must be a JSON object with 'instances' (or 'inputs')")
    return body


def chunks(rows: list[dict], batch_size: int) -> list[list[dict]]:
    """Up to MAX_PAYLOADS requests of batch_size rows each: cycling through the rows when they
    are fewer than the requests hold, else rows spread evenly over all of them, so the traffic
    is a sample of the whole split and not of its first rows (which may be in time or file order)."""
    n = min(MAX_PAYLOADS, max(1, math.ceil(len(rows) / batch_size)))
    need = n * batch_size
    picked = [rows[k * len(rows) // need] for k in range(need)] if len(rows) > need else \
        [rows[k % len(rows)] for k in range(need)]
    return [picked[i * batch_size:(i + 1) * batch_size] for i in range(n)]


def rest_bodies(rows: list[dict], batch_size: int, signature: str) -> list[str]:
    return [json.dumps({"signature_name": signature, "instances": [json_row(r) for r in chunk]})
            for chunk in chunks(rows, batch_size)]


def grpc_requests(rows: list[dict], batch_size: int, inputs: dict[str, str], model: str, version, label,
                  signature: str) -> list[bytes]:
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    out = []
    for chunk in chunks(rows, batch_size):
        req = predict_pb2.PredictRequest()
        req.model_spec.name, req.model_spec.signature_name = model, signature
        if version is not None:
            req.model_spec.version.value = version
        elif label:
            req.model_spec.version_label = label
        for name, dtype in inputs.items():
            values = [r[name] for r in chunk]
            if dtype == "DT_STRING":
                values = [v.encode() if isinstance(v, str) else v for v in values]
            req.inputs[name].CopyFrom(tf.make_tensor_proto(np.array(values, dtype=_NUMPY.get(dtype, object))))
        out.append(req.SerializeToString())
    return out


def saved_model_inputs(path: str, signature: str) -> dict[str, str] | None:
    """{input name: dtype name} of a SavedModel's signature, from its SignatureDef (the names
    a client sends, which tf.function's structured signature may spell otherwise); None when
    the SavedModel has no such signature."""
    from tensorflow.core.framework import types_pb2
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    graph = next((g for g in proto.meta_graphs if "serve" in g.meta_info_def.tags), proto.meta_graphs[0])
    if signature not in graph.signature_def:
        return None
    return {k: types_pb2.DataType.Name(v.dtype) for k, v in graph.signature_def[signature].inputs.items()}


def saved_model_feeds(inputs: dict[str, str], rows: list[dict]) -> dict:
    """Tensors for a SavedModel signature function from rows of {input: python value}, keyed by
    the signature's input names (`inputs`: name -> dtype name, as the server's metadata gives)."""
    import tensorflow as tf
    from tensorflow.core.framework import types_pb2

    return {key: tf.constant([r[key].encode() if isinstance(r[key], str) else r[key] for r in rows],
                             tf.as_dtype(types_pb2.DataType.Value(dtype)))
            for key, dtype in inputs.items()}


def resolve_saved_model(path: str, version: int | None) -> str:
    """A version directory: `path` itself when it holds saved_model.pb, else its newest (or the
    given) numeric version."""
    if os.path.exists(os.path.join(path, "saved_model.pb")):
        return path
    versions = sorted(int(v) for v in os.listdir(path) if v.isdigit()) if os.path.isdir(path) else []
    if version is not None and version in versions:
        versions = [version]
    if not versions:
        raise LoadtestError(f"--model-path {path} is neither a SavedModel nor a base path with numeric versions")
    return os.path.join(path, str(versions[-1]))
