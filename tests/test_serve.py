"""Behaviour of `tfpipe serve`: the embedded server on 127.0.0.1 ephemeral ports, answering
TF Serving's REST and gRPC APIs (official stubs and messages) with SavedModels built here and
one exported by tfpipe; TF Serving configs round-tripped through the official protos."""

from __future__ import annotations

import asyncio
import base64
import collections
import glob
import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
import requests
from conftest import free_port, run_cli, start_cli_server
from reloading import metric, metrics_readings, publish_and_wait

# its expensive fixtures (servers, runs) are session-scoped and built once, on one xdist worker: a
# worker may run other files in between, which would tear down and rebuild module-scoped ones
pytestmark = pytest.mark.xdist_group("serve")


def _opts(**kw):
    from tfpipe.serve.flags import ServeOptions

    return ServeOptions(host="127.0.0.1", port=-1, rest_api_port=-1, **kw)


@pytest.fixture(scope="session")
def models(tmp_path_factory, first_export):
    """A model_config_file serving three models: half (with a warmup file), multi, and penguins
    as exported by tfpipe export (the suite's first export, linked: only read)."""
    from serving_models import save_half, save_multi

    root = tmp_path_factory.mktemp("serve")
    save_half(str(root / "half" / "1"), b=2.0, warmup=3)
    save_half(str(root / "half" / "2"), b=3.0)
    save_multi(str(root / "multi" / "7"))
    os.symlink(os.path.join(first_export, "penguins"), root / "penguins")
    # Relative base paths are relative to the server's working directory, as in TF Serving.
    (root / "models.config").write_text(f"""
model_config_list {{
  config {{ name: "half" base_path: "{root / 'half'}" model_platform: "tensorflow"
           model_version_policy {{ all {{}} }}
           version_labels {{ key: "stable" value: 1 }} version_labels {{ key: "canary" value: 2 }} }}
  config {{ name: "multi" base_path: "{root / 'multi'}" model_platform: "tensorflow" }}
  config {{ name: "penguins" base_path: "{root / 'penguins'}" model_platform: "tensorflow" }}
}}""")
    (root / "monitoring.config").write_text('prometheus_config { enable: true path: "/monitoring/prometheus/metrics" }')
    return root


@pytest.fixture(scope="session")
def server(models):
    from tfpipe.serve.server import ServerThread

    opts = _opts(model_config_file=str(models / "models.config"), file_system_poll_wait_seconds=0,
                 monitoring_config_file=str(models / "monitoring.config"), max_request_bytes=256 * 1024)
    with ServerThread(opts) as s:
        s.url = f"http://127.0.0.1:{s.rest_port}"
        yield s


def _stubs(port: int):
    import grpc
    from tensorflow_serving.apis import (
        model_service_pb2_grpc,
        prediction_service_pb2_grpc,
    )

    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    return (prediction_service_pb2_grpc.PredictionServiceStub(channel),
            model_service_pb2_grpc.ModelServiceStub(channel))


def test_rest_api_answers_as_tf_serving_documents(server):
    url = server.url
    # Status: every version, versions as strings, TF Serving's state and status names.
    status = requests.get(f"{url}/v1/models/half").json()
    assert status == {"model_version_status": [
        {"version": "2", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}},
        {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}]}
    assert requests.get(f"{url}/v1/models/half/versions/1").json()["model_version_status"][0]["version"] == "1"
    assert requests.get(f"{url}/v1/models/half/labels/canary").json()["model_version_status"][0]["version"] == "2"

    # Predict, row and columnar, as in TF Serving's REST example (half_plus_two: 0.5x + 2);
    # with no version the latest (2: 0.5x + 3) answers.
    post = lambda path, body: requests.post(f"{url}/v1/models/{path}", data=json.dumps(body))
    assert post("half/versions/1:predict", {"instances": [1.0, 2.0, 5.0]}).json() == {"predictions": [2.5, 3.0, 4.5]}
    assert post("half/labels/stable:predict", {"inputs": [1.0, 2.0]}).json() == {"outputs": [2.5, 3.0]}
    assert post("half:predict", {"inputs": {"x": [1.0]}}).json() == {"outputs": [3.5]}
    assert post("half:predict", {"instances": [{"x": 1.0}]}).json() == {"predictions": [3.5]}
    # Regress over tf.Examples on a named signature, as in TF Serving's example.
    r = post("half/versions/1:regress", {"signature_name": "regress_x", "examples": [{"x": 1.0}, {"x": 2.0}]})
    assert r.json() == {"results": [2.5, 3.0]}

    # Several named inputs and outputs: objects per row; b64 in, `_bytes` outputs b64 out.
    rows = [{"a": [1.0, 2.0], "b": 3, "tag": "x"}, {"a": [0.5, 0.5], "b": -1, "tag": {"b64": base64.b64encode(b"y").decode()}}]
    r = post("multi:predict", {"instances": rows}).json()
    assert r == {"predictions": [
        {"sum": 6.0, "double": [2.0, 4.0], "tag_bytes": {"b64": base64.b64encode(b"x!").decode()}, "upper": "X"},
        {"sum": 0.0, "double": [1.0, 1.0], "tag_bytes": {"b64": base64.b64encode(b"y!").decode()}, "upper": "Y"}]}
    r = post("multi:predict", {"inputs": {"a": [[1.0, 1.0]], "b": [1], "tag": ["q"]}}).json()
    assert r["outputs"]["sum"] == [3.0] and r["outputs"]["upper"] == ["Q"]

    # Metadata: the SignatureDefMap, version as a string.
    meta = requests.get(f"{url}/v1/models/multi/metadata").json()
    assert meta["model_spec"] == {"name": "multi", "signature_name": "", "version": "7"}
    sig = meta["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert sig["method_name"] == "tensorflow/serving/predict"
    assert sig["inputs"]["a"]["dtype"] == "DT_FLOAT"
    assert [d["size"] for d in sig["inputs"]["a"]["tensor_shape"]["dim"]] == ["-1", "2"]
    assert set(sig["outputs"]) == {"sum", "double", "tag_bytes", "upper"}

    # The model exported by tfpipe: raw rows in, classes out; :classify on its classification signature.
    row = {"island": "Biscoe", "bill_length_mm": 48.0, "bill_depth_mm": 15.0, "flipper_length_mm": 220,
           "body_mass_g": 5400, "sex": "male", "year": 2008}
    r = post("penguins:predict", {"instances": [row]}).json()["predictions"][0]
    assert r["classes"] == "Gentoo" and len(r["probabilities"]) == 3
    r = post("penguins:classify", {"signature_name": "classification", "examples": [row]}).json()
    labels = [label for label, _ in r["results"][0]]
    assert labels == ["Adelie", "Chinstrap", "Gentoo"] and max(r["results"][0], key=lambda p: p[1])[0] == "Gentoo"

    # Warmup records ran before version 1 became AVAILABLE; Prometheus metrics are exported.
    metrics = requests.get(f"{url}/monitoring/prometheus/metrics").text
    assert re.search(r'tfpipe_serving_requests_total\{model="half",api="predict",status="OK"\} [1-9]', metrics)
    assert 'tfpipe_serving_loaded_versions{model="half"} 2' in metrics
    assert "tfpipe_serving_request_latency_seconds_bucket" in metrics


@pytest.fixture(scope="session")
def stubs(server):
    """(PredictionService, ModelService) stubs on the shared server's gRPC port."""
    return _stubs(server.grpc_port)


def _penguin_example():
    import tensorflow as tf

    penguin = tf.train.Example()
    for k, v in {"island": b"Torgersen", "sex": b"female"}.items():
        penguin.features.feature[k].bytes_list.value.append(v)
    for k, v in {"bill_length_mm": 38.0, "bill_depth_mm": 19.0}.items():
        penguin.features.feature[k].float_list.value.append(v)
    for k, v in {"flipper_length_mm": 185, "body_mass_g": 3600, "year": 2007}.items():
        penguin.features.feature[k].int64_list.value.append(v)
    return penguin


def _code(call, request):
    """The gRPC status code `call` fails with."""
    import grpc

    with pytest.raises(grpc.RpcError) as e:
        call(request, timeout=10)
    return e.value.code()


def test_grpc_predict_by_label_and_with_an_output_filter(stubs):
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    predict_stub, _ = stubs
    req = predict_pb2.PredictRequest()
    req.model_spec.name = "half"
    req.model_spec.version_label = "stable"
    req.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([1.0, 2.0], np.float32)))
    resp = predict_stub.Predict(req, timeout=10)
    assert tf.make_ndarray(resp.outputs["y"]).tolist() == [2.5, 3.0]
    assert (resp.model_spec.name, resp.model_spec.version.value, resp.model_spec.signature_name) == \
        ("half", 1, "serving_default")

    req = predict_pb2.PredictRequest()
    req.model_spec.name = "multi"
    req.inputs["a"].CopyFrom(tf.make_tensor_proto(np.ones((2, 2), np.float32)))
    req.inputs["b"].CopyFrom(tf.make_tensor_proto(np.array([1, 2], np.int64)))
    req.inputs["tag"].CopyFrom(tf.make_tensor_proto(np.array([b"p", b"q"], object)))
    req.output_filter.append("upper")
    resp = predict_stub.Predict(req, timeout=10)
    assert list(resp.outputs) == ["upper"] and tf.make_ndarray(resp.outputs["upper"]).tolist() == [b"P", b"Q"]


def test_grpc_regress_on_tf_examples(stubs):
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import regression_pb2

    predict_stub, _ = stubs
    ex = tf.train.Example()
    ex.features.feature["x"].float_list.value.append(4.0)
    reg = regression_pb2.RegressionRequest()
    reg.model_spec.name, reg.model_spec.signature_name = "half", "regress_x"
    reg.input.example_list.examples.append(ex)
    assert [r.value for r in predict_stub.Regress(reg, timeout=10).result.regressions] == [5.0]
    reg.model_spec.signature_name = "serving_default"  # a predict signature: not for Regress
    assert _code(predict_stub.Regress, reg) == grpc.StatusCode.INVALID_ARGUMENT


def test_grpc_classify_and_multi_inference_on_the_exported_model(stubs):
    from tensorflow_serving.apis import classification_pb2, inference_pb2

    predict_stub, _ = stubs
    cls = classification_pb2.ClassificationRequest()
    cls.model_spec.name, cls.model_spec.signature_name = "penguins", "classification"
    cls.input.example_list.examples.append(_penguin_example())
    result = predict_stub.Classify(cls, timeout=10).result.classifications[0]
    assert max(result.classes, key=lambda c: c.score).label == "Adelie"
    assert abs(sum(c.score for c in result.classes) - 1.0) < 1e-5

    multi = inference_pb2.MultiInferenceRequest()
    multi.input.CopyFrom(cls.input)
    task = multi.tasks.add()
    task.model_spec.name, task.model_spec.signature_name = "penguins", "classification"
    task.method_name = "tensorflow/serving/classify"
    out = predict_stub.MultiInference(multi, timeout=10).results[0]
    assert out.model_spec.signature_name == "classification" and len(out.classification_result.classifications) == 1


def test_grpc_metadata_and_model_status(stubs):
    from tensorflow_serving.apis import get_model_metadata_pb2, get_model_status_pb2

    predict_stub, model_stub = stubs
    meta_req = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    meta_req.model_spec.name = "penguins"
    meta = predict_stub.GetModelMetadata(meta_req, timeout=10)
    sigs = get_model_metadata_pb2.SignatureDefMap()
    meta.metadata["signature_def"].Unpack(sigs)
    assert {"serving_default", "predict_examples", "classification"} <= set(sigs.signature_def)

    status = model_stub.GetModelStatus(get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "multi"}))
    assert [(s.version, s.state) for s in status.model_version_status] == \
        [(7, get_model_status_pb2.ModelVersionStatus.AVAILABLE)]


def test_grpc_errors_carry_tf_servings_codes(stubs):
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    predict_stub, _ = stubs
    bad = predict_pb2.PredictRequest()
    bad.model_spec.name = "nope"
    assert _code(predict_stub.Predict, bad) == grpc.StatusCode.NOT_FOUND
    bad.model_spec.name = "half"
    bad.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array(["a"], object)))
    assert _code(predict_stub.Predict, bad) == grpc.StatusCode.INVALID_ARGUMENT
    bad.model_spec.signature_name = "missing"
    assert _code(predict_stub.Predict, bad) == grpc.StatusCode.FAILED_PRECONDITION


def test_grpc_reload_config_request_drops_and_brings_back_a_model(server, stubs):
    import grpc
    import tensorflow as tf
    from google.protobuf import text_format
    from tensorflow_serving.apis import get_model_status_pb2, model_management_pb2, predict_pb2
    from tensorflow_serving.config import model_server_config_pb2

    predict_stub, model_stub = stubs
    config = text_format.Parse(open(server.opts.model_config_file).read(), model_server_config_pb2.ModelServerConfig())
    for c in config.model_config_list.config:
        c.base_path = os.path.join(os.path.dirname(server.opts.model_config_file), c.base_path)
    smaller = model_server_config_pb2.ModelServerConfig()
    smaller.model_config_list.config.extend(c for c in config.model_config_list.config if c.name != "multi")
    try:
        model_stub.HandleReloadConfigRequest(model_management_pb2.ReloadConfigRequest(config=smaller), timeout=60)
        with pytest.raises(grpc.RpcError) as e:
            model_stub.GetModelStatus(get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "multi"}))
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        half = predict_pb2.PredictRequest(model_spec={"name": "half"})
        half.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([0.0], np.float32)))
        assert predict_stub.Predict(half, timeout=10).outputs["y"].float_val == [3.0]
    finally:  # ...and back, for the other tests on this server: 'multi' loads again
        model_stub.HandleReloadConfigRequest(model_management_pb2.ReloadConfigRequest(config=config), timeout=60)
    status = model_stub.GetModelStatus(get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "multi"}))
    assert status.model_version_status[0].state == get_model_status_pb2.ModelVersionStatus.AVAILABLE


BAD_REQUESTS = [
    # (method, path, body, expected HTTP status)
    # integer literals beyond a double: rapidjson's refusal (Python's int() refuses 4,301 digits or more)
    ("POST", "/v1/models/half:predict", '{"instances": [' + "1" * 5000 + "]}", 400),
    ("POST", "/v1/models/half:predict", '{"instances": [' + "9" * 400 + "]}", 400),
    ("POST", "/v1/models/half:regress", '{"signature_name": "regress_x", "examples": [{"x": -' + "1" * 5000 + "}]}",
     400),
    ("POST", "/v1/models/half:predict", "{not json", 400),
    ("POST", "/v1/models/half:predict", '{"instances": [1.0], "inputs": [1.0]}', 400),
    ("POST", "/v1/models/half:predict", '{"instances": ["a", "b"]}', 400),
    ("POST", "/v1/models/penguins:predict", '{"instances": [{"island": "\\ud800", "sex": "female", '
     '"bill_length_mm": 38.0, "bill_depth_mm": 19.0, "flipper_length_mm": 185, "body_mass_g": 3600, "year": 2007}]}',
     400),  # half a surrogate pair in a string
    ("POST", "/v1/models/half:predict", '{"instances": [[1.0, 2.0], [1.0]]}', 400),
    ("POST", "/v1/models/half:predict", '{"instances": [1.0], "signature_name": "nope"}', 400),
    ("POST", "/v1/models/half:predict", '{"inputs": {"z": [1.0]}}', 400),
    ("POST", "/v1/models/half:predict", '[1, 2]', 400),
    ("POST", "/v1/models/half:predict", '{}', 400),
    ("POST", "/v1/models/multi:predict", '{"instances": [{"a": [1, 2], "b": 1.5, "tag": "x"}]}', 400),
    ("POST", "/v1/models/multi:predict", '{"instances": [{"a": [1, 2], "b": 1, "tag": "x"}, {"a": [1, 2]}]}', 400),
    # Shapes go to the model as they are (as in TF Serving); its reduce_sum over axis 1 refuses a 1-D `a`.
    ("POST", "/v1/models/multi:predict", '{"inputs": {"a": [1, 2, 3], "b": [1], "tag": ["x"]}}', 400),
    ("POST", "/v1/models/multi:predict", '{"instances": [{"a": [1, 2], "b": 1, "tag": {"b64": "%%%"}}]}', 400),
    ("POST", "/v1/models/nope:predict", '{"instances": [1.0]}', 404),
    ("POST", "/v1/models/half/versions/9:predict", '{"instances": [1.0]}', 404),
    ("POST", "/v1/models/half/versions/x:predict", '{"instances": [1.0]}', 400),
    ("POST", "/v1/models/half/labels/nolabel:predict", '{"instances": [1.0]}', 400),
    ("POST", "/v1/models/half:explode", '{"instances": [1.0]}', 400),
    ("GET", "/v1/models/half:predict", None, 400),
    ("POST", "/v1/models/half", '{}', 400),
    ("PUT", "/v1/models/half:predict", '{"instances": [1.0]}', 400),
    ("GET", "/v1/models/nope", None, 404),
    ("GET", "/v2/health", None, 404),
    ("POST", "/v1/models/half:regress", '{"examples": [{"x": 1.0}]}', 400),
    ("POST", "/v1/models/half:classify", '{"signature_name": "regress_x", "examples": [{"x": 1.0}]}', 400),
    ("POST", "/v1/models/half:regress", '{"signature_name": "regress_x", "examples": []}', 400),
    ("POST", "/v1/models/half:regress", '{"signature_name": "regress_x", "examples": [{"x": [1.0, "a"]}]}', 400),
]


def _fuzz_body(rng: random.Random) -> str:
    values = [None, True, 1, -1, 1.5, "x", [], {}, [1, [2]], {"b64": "@@"}, "NaN", [[1.0, 2.0]], 1e400,
              {"instances": 1}, [{"x": 1}], 2 ** 70]
    keys = ["instances", "inputs", "signature_name", "examples", "context", "x", "a"]
    body = {rng.choice(keys): rng.choice(values) for _ in range(rng.randint(0, 3))}
    text = json.dumps(body)
    mutation = rng.randint(0, 4)
    if mutation == 0 and text:
        i = rng.randrange(len(text))
        text = text[:i] + rng.choice(['"', "{", "]", ",", "\\", "\x00", "é"]) + text[i + 1:]
    elif mutation == 1:
        text = text[: rng.randrange(len(text) + 1)]
    return text


def test_the_servers_signature_call_answers_like_the_public_call(models):
    """The server calls a signature with same-dtype inputs packed into one tensor and no
    Python argument binding (saved_model.flat_caller); it answers exactly as the public
    `signatures[key](**tensors)` does, and inputs with different row counts are a clear 400."""
    from tfpipe.serve.errors import ServingError
    from tfpipe.serve.core.saved_model import keyword_caller
    from tfpipe.serve.core.servable import Servable

    version = next(p for p in (models / "penguins").iterdir() if p.name.isdigit())
    servable = Servable("penguins", int(version.name), str(version))
    sig = servable.signature("")
    assert "flat_caller" in sig.call.__qualname__  # the packed path was built for this model
    public = keyword_caller(sig.function, sig.inputs)
    rng = np.random.default_rng(3)
    words = np.array([b"Biscoe", b"Dream", b"Torgersen", b"male", b"female", b"", b"unseen"], dtype=object)
    inputs = {}
    for name, (dtype, _) in sig.inputs.items():
        if dtype.is_floating:
            x = rng.normal(40, 15, 6).astype(dtype.as_numpy_dtype)
            x[2] = np.nan
        elif dtype.is_integer:
            x = rng.integers(2000, 2030, 6).astype(dtype.as_numpy_dtype)
        else:
            x = rng.choice(words, 6)
        inputs[name] = x
    dtypes = [d for d, _ in sig.inputs.values()]
    shared = [name for name, (d, _) in sig.inputs.items() if dtypes.count(d) > 1]
    assert shared  # some inputs share a dtype, so they go in packed
    fast, slow = sig.call(inputs), public(inputs)
    assert set(fast) == set(slow)
    for k in slow:
        np.testing.assert_array_equal(fast[k].numpy(), slow[k].numpy(), err_msg=k)
    ragged = dict(inputs, **{shared[0]: inputs[shared[0]][:4]})
    with pytest.raises(ServingError, match="different numbers of rows") as e:
        servable.run(sig, ragged)
    assert e.value.http_status == 400


def test_bad_requests_get_4xx_and_the_server_keeps_serving(server):
    session = requests.Session()
    for method, path, body, expected in BAD_REQUESTS:
        r = session.request(method, server.url + path, data=body)
        assert r.status_code == expected, (method, path, body, r.text)
        assert isinstance(r.json()["error"], str) and r.json()["error"], (path, body)

    # A body its Content-Encoding does not decode: 400 (the connection closes after it)
    for encoding in ("gzip", "deflate", "br", "zstd"):
        r = session.post(server.url + "/v1/models/half:predict", data=b"not compressed",
                         headers={"Content-Encoding": encoding})
        assert r.status_code == 400 and f"Content-Encoding ({encoding})" in r.json()["error"], (encoding, r.text)

    # Over the request size limit: 413, and the connection is still usable for the next one.
    r = session.post(server.url + "/v1/models/half:predict", data=json.dumps({"instances": [1.0] * 60000}))
    assert r.status_code == 413 and "too large" in r.json()["error"]

    # 1000 random malformed requests against every endpoint: never a 5xx.
    rng = random.Random(6)
    paths = ["/v1/models/half:predict", "/v1/models/multi:predict", "/v1/models/penguins:predict",
             "/v1/models/half:regress", "/v1/models/penguins:classify", "/v1/models/half/versions/1:predict",
             "/v1/models/half/labels/stable:predict", "/v1/models/half/metadata", "/v1/models/%ff:predict"]
    statuses = {}
    for _ in range(1000):
        r = session.request(rng.choice(["POST", "POST", "POST", "GET"]), server.url + rng.choice(paths),
                            data=_fuzz_body(rng).encode("utf-8", "surrogatepass"))
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        assert r.status_code < 500, r.text
    assert sum(n for s, n in statuses.items() if 400 <= s < 500) >= 900, statuses
    ok = session.post(server.url + "/v1/models/half/versions/1:predict", data='{"instances": [2.0]}')
    assert ok.status_code == 200 and ok.json() == {"predictions": [3.0]}


def test_fuzzed_json_bodies_get_4xx_and_the_server_keeps_serving(server):
    """tests/rest_fuzz.py's bodies (deep nesting up to 50,000 levels, huge and ragged arrays, mixed
    types, bad UTF-8, b64 errors) over HTTP to every model and API: never a 5xx, and a good
    request still answers after them. The long run: `python tests/rest_fuzz.py`."""
    from hypothesis import HealthCheck, given, settings

    from rest_fuzz import encode, requests_

    session = requests.Session()
    paths = ["/v1/models/half:predict", "/v1/models/multi:predict", "/v1/models/penguins:predict",
             "/v1/models/half:regress", "/v1/models/penguins:classify"]
    statuses: dict[int, int] = {}

    @settings(max_examples=150, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(requests_)
    def send(request):
        body, mutation, rng = request
        r = session.post(server.url + rng.choice(paths), data=encode(body, mutation, rng), timeout=60)
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        assert r.status_code < 500, r.text[:500]

    send()
    assert sum(statuses.values()) >= 150 and sum(n for s, n in statuses.items() if s >= 400) > 0, statuses
    ok = session.post(server.url + "/v1/models/half/versions/1:predict", data='{"instances": [2.0]}')
    assert ok.status_code == 200 and ok.json() == {"predictions": [3.0]}


# ---- a hostile client: a request's cost bounded by its size, never by what it declares -----------

READ_TIMEOUT_S = 1.0  # the hostile server's --rest_read_timeout_seconds
BODY_LIMIT = 256 * 1024  # and its --max_request_bytes


@pytest.fixture(scope="session")
def hostile_server(models):
    """`tfpipe serve` in a process of its own, so that its memory is its own to measure, on the
    models above, with a REST read timeout of READ_TIMEOUT_S and a body limit of BODY_LIMIT, and the
    health service (which the gRPC fuzzing sends to too)."""
    proc, grpc_port, rest_port = start_cli_server(
        f"--model_config_file={models / 'models.config'}", "--file_system_poll_wait_seconds=0",
        f"--monitoring_config_file={models / 'monitoring.config'}", f"--rest_read_timeout_seconds={READ_TIMEOUT_S}",
        f"--max_request_bytes={BODY_LIMIT}", "--enable_grpc_healthcheck_service")
    yield proc, grpc_port, rest_port
    proc.terminate()
    proc.wait(timeout=60)


def _penguin_predict(**shapes):
    """A one-row Predict to penguins; `shapes` gives inputs another shape (their one value kept)."""
    from tensorflow.core.framework import types_pb2
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest(model_spec={"name": "penguins"})
    row = {"island": (types_pb2.DT_STRING, "string_val", b"Biscoe"),
           "sex": (types_pb2.DT_STRING, "string_val", b"male"),
           "bill_length_mm": (types_pb2.DT_FLOAT, "float_val", 48.0),
           "bill_depth_mm": (types_pb2.DT_FLOAT, "float_val", 15.0),
           "flipper_length_mm": (types_pb2.DT_DOUBLE, "double_val", 220.0),
           "body_mass_g": (types_pb2.DT_DOUBLE, "double_val", 5400.0), "year": (types_pb2.DT_INT64, "int64_val", 2008)}
    for name, (dtype, field, value) in row.items():
        tensor = request.inputs[name]
        tensor.dtype = dtype
        for d in shapes.get(name, [1]):
            tensor.tensor_shape.dim.add(size=d)
        getattr(tensor, field).append(value)
    return request


def _status(call, request):
    """(code name, details) of a call that fails, with the client's default limits."""
    import grpc

    with pytest.raises(grpc.RpcError) as e:
        call(request, timeout=60)
    return e.value.code().name, e.value.details()


def test_grpc_requests_beyond_their_values_or_undecodable_are_refused_as_the_clients_error(hostile_server):
    """What a hostile client sent: a 231-byte Predict declaring 250,000,000 floats, one of 1e12, dims whose
    product overflows int64, a rank-40 input, bytes that are no request (to every method), a model name
    of 10,000 characters and one of 255 KB. Each is INVALID_ARGUMENT (naming the input) or NOT_FOUND with
    the name cut, before anything the size of the declared shape is allocated; the unknown names stay
    out of the metrics' labels, and the server answers a good request afterwards."""
    from grpc_fuzz import channel, reset_peak_rss, rss_bytes
    from tensorflow_serving.apis import (
        get_model_status_pb2,
        model_service_pb2_grpc,
        prediction_service_pb2_grpc,
    )

    proc, port, rest_port = hostile_server
    with channel(f"127.0.0.1:{port}") as ch:
        predict = prediction_service_pb2_grpc.PredictionServiceStub(ch).Predict
        assert predict(_penguin_predict(), timeout=60).outputs["classes"].string_val == [b"Gentoo"]
        start = rss_bytes(proc.pid)
        reset_peak_rss(proc.pid)
        big = _penguin_predict(bill_length_mm=[250_000_000])
        assert big.ByteSize() < 300
        code, details = _status(predict, big)
        assert code == "INVALID_ARGUMENT" and "input 'bill_length_mm'" in details and "250,000,000" in details
        assert _status(predict, _penguin_predict(bill_length_mm=[10**12]))[0] == "INVALID_ARGUMENT"
        code, details = _status(predict, _penguin_predict(body_mass_g=[2**40, 2**40, 2**40]))
        assert code == "INVALID_ARGUMENT" and "input 'body_mass_g'" in details and "too large" in details
        code, details = _status(predict, _penguin_predict(island=[1] * 40))
        assert (code, details) == ("INVALID_ARGUMENT", "input 'island' has 40 dimensions; the signature's shape [-1] "
                                                       "takes at most 2")
        assert rss_bytes(proc.pid, "VmHWM") - start < 50 * 2**20  # 250,000,000 floats would be 1 GB

        for method in ["/tensorflow.serving.PredictionService/" + m for m in
                       ("Predict", "Classify", "Regress", "MultiInference", "GetModelMetadata")] + [
                "/tensorflow.serving.ModelService/GetModelStatus",
                "/tensorflow.serving.ModelService/HandleReloadConfigRequest"]:
            call = ch.unary_unary(method, request_serializer=None, response_deserializer=None)
            for raw in (b"\xff" * 50, _penguin_predict().SerializeToString()[:37]):
                code, details = _status(call, raw)
                assert code == "INVALID_ARGUMENT" and details.startswith("Error parsing message with type "
                                                                         "'tensorflow.serving."), (method, details)

        for size in (10_000, BODY_LIMIT - 1000):  # a longer one is over the server's --max_request_bytes
            request = _penguin_predict()
            request.model_spec.name = "m" * size
            code, details = _status(predict, request)
            assert (code, details) == ("NOT_FOUND", f"Servable not found for request: Latest({'m' * 256}...)")
            status = get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "m" * size})
            code, details = _status(model_service_pb2_grpc.ModelServiceStub(ch).GetModelStatus, status)
            assert (code, details) == ("NOT_FOUND", f"Could not find any versions of model {'m' * 256}...")
        assert predict(_penguin_predict(), timeout=60).outputs["classes"].string_val == [b"Gentoo"]
    page = requests.get(f"http://127.0.0.1:{rest_port}/monitoring/prometheus/metrics", timeout=30).text
    assert 'model="",api="predict",status="NOT_FOUND"' in page and "mmmm" not in page
    assert 'model="",api="predict",status="INVALID_ARGUMENT"' in page  # the undecodable Predicts


def test_hostile_grpc_requests_are_refused_within_bounded_memory(hostile_server):
    """tests/grpc_fuzz.py's hostile requests, a seeded round of 400 in the suite: undecodable bytes,
    shapes beyond their values, overflowing dims, wrong dtypes and ranks, huge names, missing inputs,
    to every model and to the health service, plain and compressed (gzip, deflate) in turn. Every
    answer is one its kind allows (never UNKNOWN or
    INTERNAL), the server's peak RSS stays within 100 MB of where it started, and it answers good
    requests afterwards. The long run: `python tests/grpc_fuzz.py` (docs/benchmarks.md, gRPC fuzzing)."""
    import grpc_fuzz

    proc, port, _ = hostile_server
    target = f"127.0.0.1:{port}"
    with grpc_fuzz.channel(target) as ch:
        sigs = grpc_fuzz.signatures(ch, ["half", "multi", "penguins"])
    assert grpc_fuzz.answers_good_requests(target, sigs)
    start = grpc_fuzz.rss_bytes(proc.pid)
    grpc_fuzz.reset_peak_rss(proc.pid)
    result = grpc_fuzz.run(target, sigs, cases=400, seed=37, max_name=200_000, max_request_bytes=BODY_LIMIT)
    growth = grpc_fuzz.rss_bytes(proc.pid, "VmHWM") - start
    assert not result.failures, result.failures[:10]
    assert result.total == 400 and {kind for kind, _ in result.counts} == set(grpc_fuzz.KINDS), result.counts
    assert result.methods["Check"] and result.methods["Watch"], result.methods
    assert sorted(result.encodings.values()) == [133, 133, 134], result.encodings
    assert "UNKNOWN" not in result.by_code() and "INTERNAL" not in result.by_code()
    assert growth <= 100 * 2**20, growth / 2**20
    assert grpc_fuzz.answers_good_requests(target, sigs)

    # what the fuzzing found: a scalar string in, a scalar string out (numpy() gives it as bytes) was a 500
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    scalar = grpc_fuzz.good_predict(next(s for s in sigs if s.model == "multi"))
    del scalar.inputs["tag"].tensor_shape.dim[:]
    with grpc_fuzz.channel(target) as ch:
        answer = prediction_service_pb2_grpc.PredictionServiceStub(ch).Predict(scalar, timeout=30)
    assert answer.outputs["upper"].string_val == [b"A"] and not answer.outputs["upper"].tensor_shape.dim


@pytest.mark.parametrize("algorithm", ["Gzip", "Deflate"])  # what grpc compresses with
def test_a_compressed_grpc_request_cannot_inflate_beyond_the_request_limit(hostile_server, algorithm):
    """A compressed Predict (gzip, deflate) of about 64 KB on the wire that inflates to 64 MiB of tensor_content
    zeros (a compression bomb, scaled down): RESOURCE_EXHAUSTED against --max_request_bytes (BODY_LIMIT
    here), checked as it inflates, with the server's peak memory within 32 MiB of where it started; an
    uncompressed request over the limit likewise. Compressed requests within it are answered as the
    plain ones, a small one (inflated on the loop) and one of 160 KB (on a thread); bytes that begin
    as a gzip stream and are none are INVALID_ARGUMENT."""
    import grpc
    import grpc_fuzz
    import numpy as np
    import tensorflow as tf
    from tensorflow.core.framework import types_pb2
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    proc, port, rest_port = hostile_server
    compression = getattr(grpc.Compression, algorithm)

    def refused_large() -> int:  # the requests counted RESOURCE_EXHAUSTED as they were read
        page = requests.get(f"http://127.0.0.1:{rest_port}/monitoring/prometheus/metrics", timeout=30).text
        found = re.search(r'^tfpipe_serving_requests_total\{model="",api="predict",status="RESOURCE_EXHAUSTED"\} (\d+)',
                          page, re.MULTILINE)
        return int(found[1]) if found else 0
    counted = refused_large()
    bomb = predict_pb2.PredictRequest(model_spec={"name": "half"})
    bomb.inputs["x"].dtype = types_pb2.DT_FLOAT
    bomb.inputs["x"].tensor_shape.dim.add(size=16 * 2**20)
    bomb.inputs["x"].tensor_content = bytes(64 * 2**20)
    over = predict_pb2.PredictRequest(model_spec={"name": "half"})
    over.inputs["x"].CopyFrom(tf.make_tensor_proto(np.zeros(BODY_LIMIT // 4 + 1024, np.float32)))
    start = grpc_fuzz.rss_bytes(proc.pid)
    grpc_fuzz.reset_peak_rss(proc.pid)
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", -1)]) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        for request, how in ((bomb, compression), (over, grpc.Compression.NoCompression)):
            with pytest.raises(grpc.RpcError) as caught:
                stub.Predict(request, timeout=60, compression=how)
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, caught.value
        growth = grpc_fuzz.rss_bytes(proc.pid, "VmHWM") - start
        assert refused_large() == counted + 1  # the bomb (the plain one over the bound never reaches the handler)
        for values in (np.array([2.0], np.float32), np.arange(40_000, dtype=np.float32)):
            good = predict_pb2.PredictRequest(model_spec={"name": "half"})
            good.inputs["x"].CopyFrom(tf.make_tensor_proto(values))
            plain = stub.Predict(good, timeout=30).outputs["y"]
            assert stub.Predict(good, timeout=30, compression=compression).outputs["y"] == plain
            assert len(tf.make_ndarray(plain)) == len(values)
        not_gzip = channel.unary_unary("/tensorflow.serving.PredictionService/Predict")
        with pytest.raises(grpc.RpcError) as caught:
            not_gzip(b"\x1f\x8b\x08\x00" + bytes(60), timeout=30)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value
    assert growth <= 32 * 2**20, growth / 2**20


def _compressors():
    import gzip
    import zlib

    import brotli
    import zstandard

    return {"gzip": gzip.compress, "deflate": zlib.compress, "br": brotli.compress,
            "zstd": zstandard.ZstdCompressor().compress}


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", "zstd"])
def test_a_compressed_rest_body_is_read_within_the_request_limit(hostile_server, encoding):
    """Each Content-Encoding a client may send: a compressed Predict is answered as the plain one;
    a compression bomb (64 MiB of spaces in a JSON body, a few KB on the wire) is a 413 against
    --max_request_bytes, checked as it inflates; an integer of 10,000 digits is a 400 in rapidjson's
    words; the server's peak memory stays within 32 MiB of where it started. An encoding the server
    cannot decode is a 400 naming it, for every one of these bodies."""
    import grpc_fuzz

    proc, _, rest_port = hostile_server
    compress = _compressors()[encoding]
    url = f"http://127.0.0.1:{rest_port}/v1/models/half:predict"
    good = compress(json.dumps({"instances": [1.0, 2.0]}).encode())
    bomb = compress(b'{"instances": [1.0' + b" " * (64 * 2**20) + b"]}")
    digits = compress(b'{"instances": [' + b"9" * 10_000 + b"]}")
    assert len(bomb) < 2**20 < 64 * 2**20
    start = grpc_fuzz.rss_bytes(proc.pid)
    grpc_fuzz.reset_peak_rss(proc.pid)
    answers = [requests.post(url, data=body, headers={"Content-Encoding": encoding}, timeout=60)
               for body in (good, bomb, digits)]
    growth = grpc_fuzz.rss_bytes(proc.pid, "VmHWM") - start
    if answers[0].status_code == 400:  # not an encoding this server decodes
        for r in answers:
            assert r.status_code == 400 and f"Content-Encoding ({encoding})" in r.json()["error"], r.text
    else:
        plain = requests.post(url, json={"instances": [1.0, 2.0]}, timeout=30).json()
        assert answers[0].json() == plain and len(plain["predictions"]) == 2, answers[0].text
        assert answers[1].status_code == 413 and "too large" in answers[1].json()["error"], answers[1].text
        assert answers[2].status_code == 400 and "Number too big to be stored in double" in answers[2].text
    assert requests.post(url, json={"instances": [1.0]}, timeout=30).status_code == 200  # and it keeps serving
    assert growth <= 32 * 2**20, growth / 2**20


def _until_closed(sock) -> bytes:
    """Everything the server sends until it closes the connection (the socket's timeout fails a
    server that never does)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_rest_refuses_a_content_length_over_the_limit_before_reading_the_body(hostile_server):
    """A Content-Length over --max_request_bytes is a 413 at once, with none of the body sent (with
    `Expect: 100-continue`, instead of the interim answer); the connection then closes, since the body
    never comes."""
    import socket

    _, _, rest_port = hostile_server
    sockets = []  # both at once: each closes at the read timeout
    for expect in ("", "Expect: 100-continue\r\n"):
        s = socket.create_connection(("127.0.0.1", rest_port), timeout=30)
        sockets.append(s)
        s.sendall(f"POST /v1/models/half:predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {10**12}\r\n"
                  f"Content-Type: application/json\r\n{expect}\r\n".encode())
    for s in sockets:
        with s:
            answer = _until_closed(s)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 413 "), answer[:200]
        assert json.loads(body) == {"error": f"Request body too large (limit {BODY_LIMIT} bytes)"}


def test_rest_closes_connections_slower_than_the_read_timeout(hostile_server):
    """--rest_read_timeout_seconds: a connection that sends nothing, or only part of its headers, is
    closed without an answer once the timeout has passed; one whose body is slower gets a 408 and is
    closed. A client that keeps to it is answered on the same server."""
    import socket

    _, _, rest_port = hostile_server
    head = "POST /v1/models/half/versions/1:predict HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    slow = []  # the three at once: their timeouts run side by side
    for sent, answer in [(b"", b""), (head.encode(), b""),
                         ((head + "Content-Length: 100\r\n\r\n" + '{"instances": [').encode(), b"HTTP/1.1 408 ")]:
        s = socket.create_connection(("127.0.0.1", rest_port), timeout=30)
        slow.append((s, time.monotonic(), answer))
        s.sendall(sent)
    for s, started, answer in slow:
        with s:
            got = _until_closed(s)
        waited = time.monotonic() - started
        assert got.startswith(answer) and (answer or not got), got[:200]
        assert READ_TIMEOUT_S * 0.9 <= waited < 15, waited  # closed by the timeout, not at once
    r = requests.post(f"http://127.0.0.1:{rest_port}/v1/models/half/versions/1:predict", json={"instances": [2.0]},
                      timeout=30)
    assert r.status_code == 200 and r.json() == {"predictions": [3.0]}

    # tfpipe loadtest's keep-alive client sees the idle connection closed and opens another
    import select

    from tfpipe.loadtest.http_client import TimedConnection, build_request

    address = f"http://127.0.0.1:{rest_port}"
    raw = build_request(address, "POST", "/v1/models/half/versions/1:predict", b'{"instances": [2.0]}')
    conn = TimedConnection(address)
    try:
        assert conn.request(raw)[0] == 200
        first = conn.sock
        assert select.select([first], [], [], 30)[0]  # the server closes it after READ_TIMEOUT_S
        assert conn.request(raw)[0] == 200 and conn.sock is not first
    finally:
        conn.close()


def test_a_shape_the_signature_cannot_take_is_the_callers_error(tmp_path):
    """More dimensions than the signature's shape plus one is INVALID_ARGUMENT before TensorFlow
    runs; one more is left to the model (as TF Serving leaves it). Where the signature gives no
    rank, what TensorFlow's kernels refuse about the caller's shape (tf.where over nine
    dimensions: UnimplementedError) is INVALID_ARGUMENT too, not INTERNAL."""
    import tensorflow as tf

    from tfpipe.serve.errors import ServingError
    from tfpipe.serve.core.servable import Servable

    module = tf.Module()
    module.f = tf.function(lambda x: {"y": tf.where(x > 0.0, x, 0.0)}, autograph=False,
                           input_signature=[tf.TensorSpec([None], tf.float32)])
    module.g = tf.function(lambda x: {"y": tf.where(x > 0.0, x, 0.0)}, autograph=False,
                           input_signature=[tf.TensorSpec(None, tf.float32)])
    tf.saved_model.save(module, str(tmp_path / "1"), signatures={"serving_default": module.f, "any_rank": module.g})
    servable = Servable("m", 1, str(tmp_path / "1"))
    known, unknown = servable.signature(""), servable.signature("any_rank")
    two = {"x": np.full((3, 1), -1.0, np.float32)}
    assert servable.run(known, servable.check_inputs(known, two))["y"].tolist() == [[0.0]] * 3
    with pytest.raises(ServingError) as e:
        servable.check_inputs(known, {"x": np.ones([1] * 3, np.float32)})
    assert (e.value.code.name, e.value.message) == (
        "INVALID_ARGUMENT", "input 'x' has 3 dimensions; the signature's shape [-1] takes at most 2")
    nine = servable.check_inputs(unknown, {"x": np.ones([1] * 9, np.float32)})
    with pytest.raises(ServingError) as e:
        servable.run(unknown, nine)
    assert e.value.code.name == "INVALID_ARGUMENT" and "not supported" in e.value.message, e.value.message
    assert servable.run(unknown, servable.check_inputs(unknown, {"x": np.ones([1] * 8, np.float32)}))["y"].ndim == 8


@pytest.mark.parametrize("batching", [False, True])
def test_a_rest_call_over_its_timeout_is_a_504_and_the_server_goes_on(tmp_path, batching):
    """--rest_api_timeout_in_ms: a call to a model slower than it answers 504 (DEADLINE_EXCEEDED
    in the metrics), with batching (its queued answer is dropped) and without; the next call to a
    fast model is answered."""
    from serving_models import save_half, save_slow

    from tfpipe.serve.server import ServerThread

    save_half(str(tmp_path / "half" / "1"))
    save_slow(str(tmp_path / "slow" / "1"), seconds=0.25)
    (tmp_path / "models.config").write_text(
        f'model_config_list {{ config {{ name: "half" base_path: "{tmp_path / "half"}" }} '
        f'config {{ name: "slow" base_path: "{tmp_path / "slow"}" }} }}')
    (tmp_path / "batching.config").write_text("max_batch_size { value: 8 }\nbatch_timeout_micros { value: 0 }\n")
    (tmp_path / "monitoring.config").write_text("prometheus_config { enable: true }")
    opts = _opts(model_config_file=str(tmp_path / "models.config"), rest_api_timeout_in_ms=100,
                 enable_batching=batching,
                 batching_parameters_file=str(tmp_path / "batching.config") if batching else "",
                 monitoring_config_file=str(tmp_path / "monitoring.config"), file_system_poll_wait_seconds=0,
                 enable_model_warmup=False)
    with ServerThread(opts) as s:
        url = f"http://127.0.0.1:{s.rest_port}"
        slow = requests.post(f"{url}/v1/models/slow:predict", json={"instances": [1.0]}, timeout=30)
        assert slow.status_code == 504 and "timed out" in slow.json()["error"]
        # The fast model's first call (no warmup records) instantiates its function, which on a
        # busy machine can itself pass 100 ms: the server goes on when a call soon comes back.
        for _ in range(20):
            ok = requests.post(f"{url}/v1/models/half:predict", json={"instances": [2.0]}, timeout=30)
            if ok.status_code != 504:
                break
        assert ok.status_code == 200 and ok.json() == {"predictions": [3.0]}
        metrics = requests.get(f"{url}/monitoring/prometheus/metrics", timeout=30).text
        assert re.search(r'tfpipe_serving_requests_total\{model="slow",api="predict",status="DEADLINE_EXCEEDED"\} 1',
                         metrics), metrics


def test_batching_merges_requests_and_fails_fast_when_the_queue_is_full(tmp_path):
    from serving_models import save_half, save_slow

    from tfpipe.serve.server import ServerThread

    save_half(str(tmp_path / "half" / "1"))
    save_slow(str(tmp_path / "slow" / "1"), seconds=0.05)
    (tmp_path / "models.config").write_text(
        f'model_config_list {{ config {{ name: "half" base_path: "{tmp_path / "half"}" }} '
        f'config {{ name: "slow" base_path: "{tmp_path / "slow"}" }} }}')
    (tmp_path / "batching.config").write_text(
        "max_batch_size { value: 8 }\nbatch_timeout_micros { value: 50000 }\nnum_batch_threads { value: 1 }\n"
        "max_enqueued_batches { value: 2 }\nallowed_batch_sizes: 4\nallowed_batch_sizes: 8\n")
    (tmp_path / "monitoring.config").write_text("prometheus_config { enable: true }")
    opts = _opts(model_config_file=str(tmp_path / "models.config"), enable_batching=True,
                 batching_parameters_file=str(tmp_path / "batching.config"),
                 monitoring_config_file=str(tmp_path / "monitoring.config"), file_system_poll_wait_seconds=0)
    with ServerThread(opts) as s:
        url = f"http://127.0.0.1:{s.rest_port}/v1/models"

        def predict(model, x):
            return requests.post(f"{url}/{model}:predict", data=json.dumps({"instances": [x]}), timeout=30)

        # 6 concurrent one-row requests within the 50 ms window: merged, each gets its own row back.
        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(lambda x: predict("half", float(x)), range(6)))
        assert [a.json()["predictions"] for a in answers] == [[0.5 * x + 2.0] for x in range(6)]
        metrics = requests.get(f"http://127.0.0.1:{s.rest_port}/monitoring/prometheus/metrics").text
        count = int(re.search(r"^tfpipe_serving_batch_size_count (\d+)", metrics, re.MULTILINE)[1])
        assert count < 6, metrics  # fewer model calls than requests
        padding = int(re.search(r"^tfpipe_serving_batch_padding_rows_total (\d+)", metrics, re.MULTILINE)[1])
        assert padding > 0  # padded up to an allowed batch size (4 or 8)

        # Regress (and Classify) go through the same queue: 6 concurrent gRPC Regress calls
        # over tf.Examples, fewer model calls again, each answer its own.
        import grpc
        from tensorflow_serving.apis import prediction_service_pb2_grpc, regression_pb2

        stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(f"127.0.0.1:{s.grpc_port}"))

        def regress(x):
            req = regression_pb2.RegressionRequest()
            req.model_spec.name, req.model_spec.signature_name = "half", "regress_x"
            req.input.example_list.examples.add().features.feature["x"].float_list.value.append(x)
            return stub.Regress(req, timeout=30).result.regressions[0].value

        with ThreadPoolExecutor(6) as pool:
            values = list(pool.map(regress, [float(x) for x in range(6)]))
        assert values == [0.5 * x + 2.0 for x in range(6)]
        metrics = requests.get(f"http://127.0.0.1:{s.rest_port}/monitoring/prometheus/metrics").text
        after = int(re.search(r"^tfpipe_serving_batch_size_count (\d+)", metrics, re.MULTILINE)[1])
        assert 0 < after - count < 6, metrics  # batched (unbatched calls do not count here)

        # The slow model (one thread, two batches may wait): a burst of 40 overflows the queue,
        # and the overflow fails at once with 503, as TF Serving's batch queue does.
        with ThreadPoolExecutor(40) as pool:
            burst = list(pool.map(lambda x: predict("slow", float(x)), range(40)))
        codes = [r.status_code for r in burst]
        assert set(codes) == {200, 503}, codes
        assert all("queue" in r.json()["error"] for r in burst if r.status_code == 503)
        assert all(r.json()["predictions"] == [x + 1.0] for x, r in enumerate(burst) if r.status_code == 200)
        assert predict("slow", 1.0).json() == {"predictions": [2.0]}  # and it recovers


def test_batched_classify_and_regress_wait_for_their_batch_holding_no_thread(tmp_path):
    """With one gRPC thread and one REST thread, eight Regress calls (five gRPC, three REST) that
    arrive together make one batch of eight: each waits for the batch without a thread (one that
    held its thread until its batch ran would leave the others unread until the batch timeout,
    ten seconds here, and make batches of one)."""
    import grpc
    from serving_models import save_half
    from tensorflow_serving.apis import prediction_service_pb2_grpc, regression_pb2

    from tfpipe.serve.server import ServerThread

    save_half(str(tmp_path / "half" / "1"))
    (tmp_path / "batching.config").write_text(
        "max_batch_size { value: 8 }\nbatch_timeout_micros { value: 10000000 }\nnum_batch_threads { value: 1 }\n")
    (tmp_path / "monitoring.config").write_text("prometheus_config { enable: true }")
    opts = _opts(model_name="half", model_base_path=str(tmp_path / "half"), enable_batching=True,
                 batching_parameters_file=str(tmp_path / "batching.config"), grpc_max_threads=1,
                 rest_api_num_threads=1, monitoring_config_file=str(tmp_path / "monitoring.config"),
                 file_system_poll_wait_seconds=0)
    with ServerThread(opts) as s:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(f"127.0.0.1:{s.grpc_port}"))
        url = f"http://127.0.0.1:{s.rest_port}"

        def regress(x: float) -> float:
            if x >= 5:
                body = {"signature_name": "regress_x", "examples": [{"x": x}]}
                return requests.post(f"{url}/v1/models/half:regress", json=body, timeout=60).json()["results"][0]
            req = regression_pb2.RegressionRequest()
            req.model_spec.name, req.model_spec.signature_name = "half", "regress_x"
            req.input.example_list.examples.add().features.feature["x"].float_list.value.append(x)
            return stub.Regress(req, timeout=60).result.regressions[0].value

        def batches() -> tuple[int, float]:
            metrics = requests.get(f"{url}/monitoring/prometheus/metrics", timeout=30).text
            return (int(re.search(r"^tfpipe_serving_batch_size_count (\d+)", metrics, re.MULTILINE)[1]),
                    float(re.search(r"^tfpipe_serving_batch_size_sum (\S+)", metrics, re.MULTILINE)[1]))

        before = batches()
        with ThreadPoolExecutor(8) as pool:
            values = list(pool.map(regress, [float(x) for x in range(8)]))
        assert values == [0.5 * x + 2.0 for x in range(8)]
        count, rows = batches()
        assert (count - before[0], rows - before[1]) == (1, 8), (before, count, rows)


def test_hot_reload_under_load_has_zero_failed_requests(tmp_path):
    from serving_models import save_half

    from tfpipe.serve.server import ServerThread

    base = tmp_path / "half"
    save_half(str(base / "1"), b=2.0)
    save_half(str(tmp_path / "staging2"), b=3.0)
    (tmp_path / "staging3").mkdir()
    (tmp_path / "staging3" / "saved_model.pb").write_bytes(b"not a SavedModel")
    # A failed load is retried twice, 0.2 s apart, before it is reported.
    opts = _opts(model_name="half", model_base_path=str(base), file_system_poll_wait_seconds=1,
                 max_num_load_retries=2, load_retry_interval_micros=200_000)
    with ServerThread(opts) as s:
        url = f"http://127.0.0.1:{s.rest_port}/v1/models/half"
        stop = threading.Event()
        results: list[tuple[int, float | None]] = []

        def client():
            session = requests.Session()
            while not stop.is_set():
                r = session.post(f"{url}:predict", data='{"instances": [2.0]}', timeout=30)
                results.append((r.status_code, r.json()["predictions"][0] if r.status_code == 200 else None))

        threads = [threading.Thread(target=client) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        os.rename(tmp_path / "staging2", base / "2")  # a new version appears, published atomically
        deadline = time.time() + 30
        while time.time() < deadline and not (results and results[-1][1] == 4.0):
            time.sleep(0.1)
        os.rename(tmp_path / "staging3", base / "3")  # a broken version appears
        deadline = time.time() + 30
        while time.time() < deadline:
            states = {v["version"]: v for v in requests.get(url).json()["model_version_status"]}
            if "3" in states and states["3"]["state"] == "END":
                break
            time.sleep(0.2)
        time.sleep(1.0)
        stop.set()
        for t in threads:
            t.join()

    codes = [c for c, _ in results]
    values = [v for _, v in results]
    assert len(results) > 100 and set(codes) == {200}, {c: codes.count(c) for c in set(codes)}
    # v1 answered (0.5*2+2 = 3), then v2 (0.5*2+3 = 4); never a mix after the swap.
    assert values[0] == 3.0 and values[-1] == 4.0
    first_v2 = values.index(4.0)
    assert set(values[first_v2 + 20:]) == {4.0}
    # The broken version is reported with its error and took no traffic; v1 was unloaded.
    assert states["3"]["status"]["error_code"] != "OK" and "Failed to load" in states["3"]["status"]["error_message"]
    assert states["2"]["state"] == "AVAILABLE" and states["1"]["state"] == "END"


def test_a_corrupt_new_version_shows_its_load_error_in_status_while_retried_and_when_given_up(tmp_path):
    """A new version whose saved_model.pb is cut short: GetModelStatus, over gRPC and REST, shows
    it LOADING with its failed attempt's error as soon as that attempt fails, while it waits to
    be tried again (--max_num_load_retries=1, --load_retry_interval_micros=1 s), then END with
    the error once it is given up, as TF Serving reports a failed version; version 1 serves
    throughout."""
    from serving_models import save_half
    from tensorflow.core.protobuf import error_codes_pb2
    from tensorflow_serving.apis import get_model_status_pb2

    from tfpipe.serve.server import ServerThread

    base = tmp_path / "half"
    save_half(str(base / "1"), b=2.0)
    staging = tmp_path / "staging2"
    save_half(str(staging), b=3.0)
    pb = (staging / "saved_model.pb").read_bytes()
    (staging / "saved_model.pb").write_bytes(pb[:len(pb) // 2])
    opts = _opts(model_name="half", model_base_path=str(base), file_system_poll_wait_seconds=1,
                 max_num_load_retries=1, load_retry_interval_micros=1_000_000)
    with ServerThread(opts) as s:
        url = f"http://127.0.0.1:{s.rest_port}/v1/models/half"
        _, model_stub = _stubs(s.grpc_port)
        request = get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "half"})
        Status = get_model_status_pb2.ModelVersionStatus

        def version_2(state: str) -> tuple[dict, object]:
            """Version 2's status over REST and gRPC, once REST shows it in `state` with an error."""
            deadline = time.monotonic() + 30
            while True:
                rest = {v["version"]: v for v in requests.get(url, timeout=10).json()["model_version_status"]}
                if "2" in rest and rest["2"]["state"] == state and rest["2"]["status"]["error_message"]:
                    grpc_status = {v.version: v for v in model_stub.GetModelStatus(request, 10).model_version_status}
                    return rest, grpc_status
                assert time.monotonic() < deadline, f"version 2 never showed {state} with an error: {rest}"
                time.sleep(0.02)

        os.rename(staging, base / "2")
        rest, grpc_status = version_2("LOADING")
        error = rest["2"]["status"]
        assert error["error_code"] == "UNKNOWN" and error["error_message"].startswith(f"Failed to load {base / '2'}: ")
        assert "SavedModel" in error["error_message"] and "\n" not in error["error_message"]
        assert rest["1"] == {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
        assert grpc_status[2].state == Status.LOADING
        assert (grpc_status[2].status.error_code, grpc_status[2].status.error_message) == \
            (error_codes_pb2.UNKNOWN, error["error_message"])

        rest, grpc_status = version_2("END")
        assert rest["2"]["status"] == error
        assert grpc_status[2].state == Status.END and grpc_status[2].status.error_message == error["error_message"]
        assert rest["1"]["state"] == "AVAILABLE" and grpc_status[1].state == Status.AVAILABLE
        r = requests.post(f"{url}:predict", json={"instances": [2.0]}, timeout=10)
        assert r.json() == {"predictions": [3.0]}  # version 1 (0.5 * 2 + 2)


def _follow(stream, into: list) -> None:
    """A gRPC response stream's messages' statuses, then the code it ended with, into `into`."""
    try:
        for response in stream:
            into.append(response.status)
        into.append("OK")
    except grpc.RpcError as e:
        into.append(e.code().name)


def test_cli_takes_tf_serving_flags_and_sigterm_drains(tmp_path):
    """SIGTERM with requests in flight on both APIs (slow batched calls, REST bodies still coming in,
    large requests the server is reading, keep-alive and pipelining connections, the health service
    watched): every request sent before the signal is answered OK, connections made after it are
    refused once the listener has closed, the health watch is told
    NOT_SERVING and ended, then the server exits 0 and no longer answers."""
    from draining import BATCHING, DrainLoad
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from serving_models import save_slow

    save_slow(str(tmp_path / "slow" / "1"), seconds=0.3)
    (tmp_path / "batching.config").write_text(BATCHING)
    proc, grpc_port, rest_port = start_cli_server(
        "--model_name=slow", f"--model_base_path={tmp_path / 'slow'}", "--file_system_poll_wait_seconds=0",
        "--enable_model_warmup=false", "--rest_api_timeout_in_ms", "60000", "--enable_grpc_healthcheck_service",
        "--enable_batching", f"--batching_parameters_file={tmp_path / 'batching.config'}",
        f"--request_log_prefix={tmp_path / 'logs' / 'slow'}")
    try:
        url = f"http://127.0.0.1:{rest_port}/v1/models/slow:predict"
        assert requests.post(url, data='{"instances": [1.0]}', timeout=30).json() == {"predictions": [2.0]}
        channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""), timeout=90)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        watched: list = []  # the statuses the watch is sent after SERVING, then how it ended
        watcher = threading.Thread(target=_follow, args=(watch, watched))
        watcher.start()
        # the drain's probe: an abstract Unix socket (no file), as the TCP port has no credentials
        with open("/proc/net/unix") as f:
            assert f" @tfpipe-drain-{proc.pid}-" in f.read()
        assert not glob.glob(os.path.join(tempfile.gettempdir(), f"tfpipe-drain-{proc.pid}-*"))
        load = DrainLoad(grpc_port, rest_port, "slow", connectors=2)
        load.start()
        mark = proc.output.mark()
        load.signal(proc)
        proc.output.wait_for("shutting down", after=mark)
        load.release.set()  # the uploads' last bytes come while the server drains
        code = load.finish(proc)
        watcher.join(timeout=30)
        channel.close()
        assert load.lost() == []
        assert code == 0
        # connections made after the signal are answered or refused, never reset after their request
        connector = collections.Counter(o.split(":")[0] for k, _, _, o in load.results if k == "connector")
        assert "refused" in connector and set(connector) <= {"OK", "refused"}, (connector, load.resets_after_sent())
        assert watched == [health_pb2.HealthCheckResponse.NOT_SERVING, "OK"]  # told, then the stream ended
        kinds = {kind: sum(k == kind and o == "OK" for k, _, _, o in load.results) for kind in ("upload", "large")}
        in_flight = load.in_flight()
        assert kinds == {"upload": 3, "large": 3} and in_flight.get("grpc", 0) >= 1, (kinds, in_flight)
        assert in_flight.get("rest-pipelined", 0) >= 1, in_flight  # answered behind one answered as the drain began
        assert not [line for line in proc.output.lines if "cut off" in line]
        with pytest.raises(requests.ConnectionError):
            requests.post(url, data='{"instances": [1.0]}', timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_drain_that_runs_out_of_time_says_how_many_requests_it_cut_off(tmp_path):
    """A drain whose time is up with a REST request and a gRPC call still in the model: one log line
    counts them, both are cut off (the clients see an error, not a hang), and the server stops."""
    from serving_models import save_slow

    from tfpipe.serve.flags import ServeOptions
    from tfpipe.serve.server import ServerThread
    from tfpipe.serve.transports.aiohttp_internals import waiting_for_request

    save_slow(str(tmp_path / "slow" / "1"), seconds=3)
    lines: list[str] = []
    opts = ServeOptions(host="127.0.0.1", port=-1, rest_api_port=-1, model_name="slow",
                        model_base_path=str(tmp_path / "slow"), file_system_poll_wait_seconds=0,
                        enable_model_warmup=False, rest_api_timeout_in_ms=60000)
    thread = ServerThread(opts, log=lines.append)
    with thread as server, ThreadPoolExecutor(1) as pool:
        rest = pool.submit(requests.post, f"http://127.0.0.1:{server.rest_port}/v1/models/slow:predict",
                           data='{"instances": [1.0]}', timeout=60)
        with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

            req = predict_pb2.PredictRequest()
            req.model_spec.name = "slow"
            req.inputs["x"].dtype, req.inputs["x"].float_val[:] = 1, [1.0]
            req.inputs["x"].tensor_shape.dim.add().size = 1
            call = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict.future(req, timeout=60)
            deadline = time.time() + 30
            rest_server = server._rest.server
            while server.metrics.grpc_in_flight < 1 or all(waiting_for_request(c) for c in rest_server.connections):
                assert time.time() < deadline, "the requests did not reach the model"
                time.sleep(0.01)  # polls the server's own count of the calls in its handlers
            asyncio.run_coroutine_threadsafe(server.stop(0.5), thread.loop).result(timeout=30)
            with pytest.raises(grpc.RpcError):
                call.result(timeout=30)
        with pytest.raises(requests.ConnectionError):
            rest.result(timeout=30)
    assert "drain: 2 request(s) still open after --drain_seconds 0.5 (1 REST, 1 gRPC): cut off" in lines, lines


def test_a_listener_told_to_refuse_completes_no_new_connection_and_keeps_the_queued_ones():
    """The drain's first step on the REST listener: a connection queued before it is still accepted
    (and so answered), and no new one completes (its SYN is dropped; the client's connect waits),
    so that closing the listener afterwards resets no client that has sent its request."""
    from tfpipe.serve.drain import refuse_new_connections

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    queued = socket.create_connection(("127.0.0.1", port), timeout=5)
    refuse_new_connections(listener)
    late = socket.socket()
    late.settimeout(0.5)
    with pytest.raises(TimeoutError):
        late.connect(("127.0.0.1", port))
    accepted, _ = listener.accept()
    queued.sendall(b"ping")
    assert accepted.recv(4) == b"ping"
    for s in (late, queued, accepted, listener):
        s.close()


def _segment(src: int, dst: int, flags: int) -> bytes:
    """A TCP header (no options, no data) from 127.0.0.1:src to 127.0.0.1:dst, its checksum set."""
    header = struct.pack("!HHIIBBHHH", src, dst, 1000, 0, 5 << 4, flags, 65535, 0, 0)
    pseudo = socket.inet_aton("127.0.0.1") * 2 + struct.pack("!BBH", 0, socket.IPPROTO_TCP, len(header))
    data = pseudo + header
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return header[:16] + struct.pack("!H", ~total & 0xFFFF) + header[18:]


def _answer(raw: socket.socket, src: int, dst: int, seconds: float) -> int | None:
    """The flags of the first segment from 127.0.0.1:src to port dst seen within `seconds`, or None."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        raw.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            packet = raw.recv(65535)
        except TimeoutError:
            return None
        tcp = packet[(packet[0] & 0x0F) * 4:]
        if struct.unpack("!HH", tcp[:4]) == (src, dst):
            return tcp[13]
    return None


def test_a_refusing_listener_drops_only_syns_so_a_handshake_under_way_completes():
    """The drain's filter drops SYNs (no new connection starts) and lets every other segment
    through: the ACK that completes a handshake the kernel answered just before the filter still
    reaches TCP (here, a bare ACK for no handshake is answered with a reset, which TCP sends only
    if the segment got to it). Sent and watched with raw sockets, which need root."""
    from tfpipe.serve.drain import refuse_new_connections

    try:
        raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)
    except PermissionError:
        pytest.skip("raw sockets need root (CAP_NET_RAW)")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    with raw, listener:
        probe = socket.socket()  # a port of ours that no connection uses, for the raw segments
        probe.bind(("127.0.0.1", 0))
        src = probe.getsockname()[1]
        raw.sendto(_segment(src, port, 0x02), ("127.0.0.1", 0))  # SYN, before the filter: SYN-ACK
        assert _answer(raw, port, src, 2.0) == 0x12
        refuse_new_connections(listener)
        raw.sendto(_segment(src + 1 if src < 65535 else src - 1, port, 0x02), ("127.0.0.1", 0))
        assert _answer(raw, port, src + 1 if src < 65535 else src - 1, 0.5) is None  # a SYN now: dropped
        raw.sendto(_segment(src, port, 0x10), ("127.0.0.1", 0))  # an ACK: through to TCP, which resets it
        assert (_answer(raw, port, src, 2.0) or 0) & 0x04, "the ACK never reached TCP: the filter dropped it"
        probe.close()


def test_a_body_never_sent_after_100_continue_does_not_hold_the_drain(tmp_path):
    """Clients that asked `Expect: 100-continue`, were told to send, and never send a byte: the drain
    answers them 503 at once (nothing of their request came) rather than waiting out their read
    timeout."""
    from serving_models import save_half

    from tfpipe.serve.flags import ServeOptions
    from tfpipe.serve.server import ServerThread

    save_half(str(tmp_path / "half" / "1"))
    lines: list[str] = []
    opts = ServeOptions(host="127.0.0.1", port=-1, rest_api_port=-1, model_name="half",
                        model_base_path=str(tmp_path / "half"), file_system_poll_wait_seconds=0,
                        rest_read_timeout_seconds=60)
    head = (b"POST /v1/models/half:predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\nExpect: 100-continue\r\n\r\n")
    thread = ServerThread(opts, log=lines.append)
    with thread as server:
        held = []
        for _ in range(5):
            sock = socket.create_connection(("127.0.0.1", server.rest_port), timeout=30)
            sock.sendall(head)
            assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue"), "not told to send"
            held.append(sock)
        stopping = asyncio.run_coroutine_threadsafe(server.stop(20.0), thread.loop)
        for sock in held:
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 503") and b"did not read this request" in answer, answer
            sock.close()
        stopping.result(timeout=30)
    assert not [line for line in lines if "cut off" in line], lines


def test_tfserving_and_docker_backends_write_valid_configs(tmp_path):
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    from tfpipe.serve.tfserving.protos import BatchingParameters, MonitoringConfig

    base = tmp_path / "models" / "taxi"
    (base / "1").mkdir(parents=True)
    (tmp_path / "batching.config").write_text("max_batch_size { value: 32 }\nbatch_timeout_micros { value: 2000 }")
    args = ["serve", "--port=9000", "--rest_api_port=9001", "--model_name=taxi", f"--model_base_path={base}",
            "--enable_batching", f"--batching_parameters_file={tmp_path / 'batching.config'}",
            f"--config_dir={tmp_path / 'cfg'}", "--file_system_poll_wait_seconds=5"]
    if shutil.which("tensorflow_model_server") is None:
        res = run_cli(*args, "--backend=tfserving")
        assert res.returncode == 2 and "tensorflow_model_server is not on PATH" in res.stderr
        assert len(res.stderr.strip().splitlines()) == 1
    res = run_cli(*args, "--backend=tfserving", "--dry_run")
    assert res.returncode == 0, res.stderr
    command = res.stdout.strip().splitlines()[-1].split()
    cfg = tmp_path / "cfg"
    assert command[0].endswith("tensorflow_model_server")
    for flag in ["--port=9000", "--rest_api_port=9001", f"--model_config_file={cfg / 'models.config'}",
                 "--enable_batching=true", f"--batching_parameters_file={cfg / 'batching.config'}",
                 f"--monitoring_config_file={cfg / 'monitoring.config'}", "--file_system_poll_wait_seconds=5"]:
        assert flag in command, (flag, command)
    models = text_format.Parse((cfg / "models.config").read_text(), model_server_config_pb2.ModelServerConfig())
    (model,) = models.model_config_list.config
    assert (model.name, model.base_path, model.model_platform) == ("taxi", str(base), "tensorflow")
    batching = text_format.Parse((cfg / "batching.config").read_text(), BatchingParameters())
    assert batching.max_batch_size.value == 32 and batching.batch_timeout_micros.value == 2000
    monitoring = text_format.Parse((cfg / "monitoring.config").read_text(), MonitoringConfig())
    assert monitoring.prometheus_config.enable and monitoring.prometheus_config.path == "/monitoring/prometheus/metrics"

    # Docker: the model mounted read-only where the container's config points, ports mapped.
    res = run_cli(*args, "--backend=docker", "--gpu", "--dry_run")
    assert res.returncode == 0, res.stderr
    command = res.stdout.strip().splitlines()[-1].split()
    assert command[:2] == ["docker", "run"] and "tensorflow/serving:latest-gpu" in command
    assert f"{base}:/models/taxi:ro" in command and "9000:8500" in command and "9001:8501" in command
    assert "--model_config_file=/config/models.config" in command and "--gpus" in command
    inside = text_format.Parse((cfg / "models.config").read_text(), model_server_config_pb2.ModelServerConfig())
    assert inside.model_config_list.config[0].base_path == "/models/taxi"
    if shutil.which("docker") is None:
        res = run_cli(*args, "--backend=docker")
        assert res.returncode == 2 and "docker is not on PATH" in res.stderr


@pytest.mark.skipif(shutil.which("tensorflow_model_server") is None,
                    reason="tensorflow_model_server is not installed here (not on PyPI or Debian)")
def test_real_tensorflow_model_server_answers_like_the_embedded_one(tmp_path):  # pragma: no cover
    from serving_models import save_half

    save_half(str(tmp_path / "half" / "1"))
    rest_port = free_port()
    proc = subprocess.Popen(["tensorflow_model_server", "--port=0", f"--rest_api_port={rest_port}", "--model_name=half",
                             f"--model_base_path={tmp_path / 'half'}"])
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                r = requests.post(f"http://127.0.0.1:{rest_port}/v1/models/half:predict", data='{"instances": [1.0]}')
                break
            except requests.ConnectionError:
                time.sleep(0.5)
        assert r.json() == {"predictions": [2.5]}
    finally:
        proc.terminate()
        proc.wait()


def test_emit_k8s_writes_deployment_service_and_autoscaler(tmp_path):
    import yaml

    base = tmp_path / "models" / "taxi"
    (base / "1").mkdir(parents=True)
    out = tmp_path / "k8s"
    res = run_cli("serve", "--model_name=taxi", f"--model_base_path={base}", "--gpu", f"--emit-k8s={out}")
    assert res.returncode == 0, res.stderr
    docs = {p.stem: yaml.safe_load(p.read_text()) for p in out.glob("*.yaml")}
    assert set(docs) == {"configmap", "deployment", "service", "horizontalpodautoscaler"}
    dep = docs["deployment"]
    assert dep["apiVersion"] == "apps/v1" and dep["kind"] == "Deployment"
    pod = dep["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "tensorflow/serving:latest-gpu"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1 and container["resources"]["requests"]["cpu"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/v1/models/taxi", "port": "rest"}
    assert "--model_config_file=/config/models.config" in container["args"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts == {"config": "/config", "models": "/models"}
    assert volumes["config"]["configMap"]["name"] == docs["configmap"]["metadata"]["name"]
    assert "persistentVolumeClaim" in volumes["models"]
    assert dep["spec"]["selector"]["matchLabels"] == dep["spec"]["template"]["metadata"]["labels"]
    svc = docs["service"]
    assert svc["spec"]["selector"] == dep["spec"]["template"]["metadata"]["labels"]
    assert {p["port"] for p in svc["spec"]["ports"]} == {8500, 8501}
    hpa = docs["horizontalpodautoscaler"]
    assert hpa["apiVersion"] == "autoscaling/v2" and hpa["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]
    assert hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    config = text_format.Parse(docs["configmap"]["data"]["models.config"], model_server_config_pb2.ModelServerConfig())
    assert config.model_config_list.config[0].base_path == "/models/taxi"


PACE_S = 0.005  # each reload-test client's pause between requests
# A leak of anything per version (a servable, its queue, its graph) grows RSS by about one model
# per reload: the seven after the first are seven times the bound the test allows (one model).
RELOADS = 8


@pytest.mark.long
def test_hot_reloads_under_load_stay_flat_in_memory(models, tmp_path):
    """12 versions published one after another while clients call REST and gRPC, batching on,
    two malloc arenas (MALLOC_ARENA_MAX=2, as docs/benchmarks.md advises for flat memory): no request fails; after each reload one version is left in memory and the old version's
    batch queue is gone; resident memory after the 12th reload is within one model's size (the
    growth the server measured while a version loaded) of what it was after the first."""
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    source = next(p for p in (models / "penguins").iterdir() if p.name.isdigit())
    base = tmp_path / "penguins"
    shutil.copytree(source, base / "1")
    (tmp_path / "batching.config").write_text("max_batch_size { value: 8 }\nbatch_timeout_micros { value: 1000 }\n"
                                              "num_batch_threads { value: 1 }\nmax_enqueued_batches { value: 100 }\n")
    (tmp_path / "monitoring.config").write_text("prometheus_config { enable: true }")
    proc, grpc_port, rest_port = start_cli_server(
        "--model_name=penguins", f"--model_base_path={base}", "--file_system_poll_wait_seconds=1",
        "--enable_batching", f"--batching_parameters_file={tmp_path / 'batching.config'}",
        f"--monitoring_config_file={tmp_path / 'monitoring.config'}", "--max_num_load_retries=0",
        env={"MALLOC_ARENA_MAX": "2"})  # docs/benchmarks.md: flatter memory across reloads
    url = f"http://127.0.0.1:{rest_port}"
    row = {"island": "Biscoe", "bill_length_mm": 48.0, "bill_depth_mm": 15.0, "flipper_length_mm": 220,
           "body_mass_g": 5400, "sex": "male", "year": 2008}
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "penguins"
    for k, v in row.items():
        request.inputs[k].CopyFrom(tf.make_tensor_proto([v.encode() if isinstance(v, str) else v],
                                                        dtype=tf.string if isinstance(v, str) else None))
    stop, outcomes, lock = threading.Event(), [], threading.Lock()

    # Steady load rather than as much as three threads can send: a reload's load and warmup
    # share the two cores with the clients, and unpaced clients made each reload take ~3 s.
    def rest_client():
        session = requests.Session()
        while not stop.wait(PACE_S):
            r = session.post(f"{url}/v1/models/penguins:predict", json={"instances": [row]}, timeout=60)
            with lock:
                outcomes.append(r.status_code == 200 and r.json()["predictions"][0]["classes"] == "Gentoo")

    def grpc_client():
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            while not stop.wait(PACE_S):
                try:
                    answer = stub.Predict(request, timeout=60)
                    ok = tf.make_ndarray(answer.outputs["classes"]).tolist() == [b"Gentoo"]
                except grpc.RpcError:
                    ok = False
                with lock:
                    outcomes.append(ok)

    clients = [threading.Thread(target=f) for f in (rest_client, rest_client, grpc_client)]
    for t in clients:
        t.start()
    samples = []  # per reload: (RSS, live servables, batch queues, load sizes)
    try:
        for version in range(2, 2 + RELOADS):
            publish_and_wait(str(source), str(base), version, url, "penguins")
            texts = metrics_readings(url)
            samples.append((min(metric(t, "process_resident_memory_bytes")[0] for t in texts),
                            max(metric(t, "tfpipe_serving_live_servables")[0] for t in texts),
                            max(metric(t, "tfpipe_serving_batch_queues")[0] for t in texts),
                            metric(texts[-1], "tfpipe_serving_model_load_rss_bytes")))
    finally:
        stop.set()
        for t in clients:
            t.join()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert len(outcomes) > 200 and all(outcomes), f"{outcomes.count(False)} of {len(outcomes)} requests failed"
    assert [s[1] for s in samples] == [1.0] * RELOADS  # one version in memory after every reload
    assert all(s[2] <= 1 for s in samples)  # only the serving version's queue (one signature, one shape)
    model_size = float(np.median([b for s in samples for b in s[3]]))
    rss = [s[0] for s in samples]
    assert model_size > 0
    print(f"RSS after each reload (MiB): {[round(r / 2**20, 1) for r in rss]}; one model: {model_size / 2**20:.1f} MiB")
    assert rss[-1] - rss[0] <= model_size, (
        f"RSS grew {(rss[-1] - rss[0]) / 2**20:.1f} MiB over {RELOADS - 1} reloads; "
        f"one model is {model_size / 2**20:.1f} MiB; "
        f"RSS per reload (MiB): {[round(r / 2**20) for r in rss]}")


def test_the_serve_stage_deploys_checks_the_answers_and_reads_back_its_own_serve_json(tmp_path):
    """`tfpipe run`'s serve step on its own: Deployment.deploy writes the configs and serve.json after
    comparing the server's answers with the SavedModel's, and the stage's result() reads that file."""
    from serving_models import save_half

    from tfpipe.serve.config import ServeConfig
    from tfpipe.serve.deploy import Deployment, result
    from tfpipe.stage import ServeOutputs

    save_half(str(tmp_path / "models" / "half" / "1"))
    out = str(tmp_path / "serve")
    deployment = Deployment(ServeConfig(check_rows=5), out, str(tmp_path / "server.log"))
    lines: list[str] = []
    try:
        served = deployment.deploy("half", str(tmp_path / "models" / "half"), 1,
                                   lambda inputs, n: [{"x": float(i)} for i in range(n)] if inputs == {
                                       "x": "DT_FLOAT"} else [], 0.0, lines.append)
    finally:
        deployment.stop()
    assert served["check"]["served"] == {"y": 2.0} and served["check"]["rows"] == 5  # 0.5 * 0 + 2
    assert "REST: 5 rows agree with the in-process SavedModel" in lines
    r = result(out, "rows", "max_batch_size=8")
    assert r.summary == ("half version 1 on the embedded server: REST and gRPC answers match the SavedModel on 5 rows "
                         "(max diff 0.0e+00); batching tuned: max_batch_size=8")
    assert (r.manifest, r.outputs, r.code) == (os.path.join(out, "serve.json"), ServeOutputs(out), 0)
    assert sorted(os.listdir(out)) == ["models.config", "monitoring.config", "serve.json"]


def test_expect_100_continue_gets_its_interim_answer_before_the_body(server):
    """curl sends `Expect: 100-continue` before a body over 1 KiB and waits up to a second for the
    interim answer; an expectation the server does not know is a 417 in TF Serving's JSON error."""
    import socket

    body = json.dumps({"instances": [2.0] * 300}).encode()
    head = (f"POST /v1/models/half/versions/1:predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n"
            "Content-Type: application/json\r\nExpect: 100-continue\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", server.rest_port), timeout=10) as s:
        s.sendall(head)
        assert s.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"  # before any of the body was sent
        s.sendall(body)
        answer = b""
        while b"]}" not in answer:
            answer += s.recv(65536)
    status, _, rest = answer.partition(b"\r\n")
    assert status == b"HTTP/1.1 200 OK" and json.loads(rest.partition(b"\r\n\r\n")[2]) == {"predictions": [3.0] * 300}

    r = requests.post(server.url + "/v1/models/half:predict", data=b'{"instances": [1.0]}', headers={"Expect": "tea"})
    assert r.status_code == 417 and r.json() == {"error": "Unknown Expect: tea"}
