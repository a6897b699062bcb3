"""tfpipe.loadtest.protocol: the step spec and the generator's messages."""

from __future__ import annotations

import json

import pytest

from tfpipe.loadtest.generate import parse_args
from tfpipe.loadtest.protocol import Progress, StepSpec, Waiting, decode, encode

REST = dict(kind="rest", address="http://127.0.0.1:1", users=2, warmup=1.0, duration=2.0, max_requests=10,
            path="/v1/models/m:predict", bodies=['{"instances": [1.0]}'])


@pytest.mark.parametrize("message", [Progress(1.5, 120), Waiting(1, 3, "10.0.0.5:5557"), Progress(0.0, 0)])
def test_messages_round_trip_through_one_json_line(message):
    line = encode(message)
    assert "\n" not in line and json.loads(line)["type"] in ("progress", "waiting")
    assert decode(line) == message


@pytest.mark.parametrize("line", ["", "PROGRESS 1.0 2", "not json", '{"type": "other"}', '{"type": "progress"}',
                                  '{"type": "waiting", "ready": 1}', "[1, 2]", '{"elapsed_s": 1, "answered": 2}'])
def test_anything_else_on_stdout_is_not_a_message(line):
    assert decode(line) is None


def test_a_step_spec_survives_json_and_a_worker_gets_only_its_part():
    spec = StepSpec(**REST, rate=50.0, workers=2, master_bind="0.0.0.0", master_port=5557, web_port=8089)
    assert StepSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    worker = spec.for_worker(share=0.5, token="t1")
    assert (worker.share, worker.token, worker.rate) == (0.5, "t1", 50.0)
    assert (worker.master_bind, worker.master_port, worker.web_port) == (None, None, None)


@pytest.mark.parametrize("change,message", [
    ({"kind": "soap"}, "kind must be rest, grpc or replay"),
    ({"bodies": []}, "needs its payloads"),
    ({"kind": "grpc"}, "needs its payloads"),  # gRPC takes requests, not bodies
    ({"kind": "replay"}, "needs its payloads"),  # replay takes logged requests
])
def test_a_step_spec_refuses_what_cannot_run(change, message):
    with pytest.raises(ValueError, match=message):
        StepSpec(**{**REST, **change})


def test_unknown_spec_fields_are_named():
    with pytest.raises(ValueError, match="unknown step spec field.*colour"):
        StepSpec.from_json({**REST, "colour": "red"})


@pytest.mark.parametrize("argv,expected", [
    (["step", "s.json", "r.json"], {"command": "step", "spec": "s.json", "result": "r.json"}),
    (["worker", "10.0.0.5:5557"], {"command": "worker", "master": "10.0.0.5:5557", "once": False}),
    (["worker", "h:1", "--once"], {"command": "worker", "master": "h:1", "once": True}),
])
def test_the_generators_command_line(argv, expected):
    assert vars(parse_args(argv)) == expected


def test_replay_rebuilds_rest_bodies_as_the_client_laid_them_out_and_refuses_an_empty_log():
    import numpy as np
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    from tfpipe.loadtest.errors import LoadtestError
    from tfpipe.loadtest.replay import build_items, predict_json

    req = predict_pb2.PredictRequest()
    req.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([1.5, 2.5], np.float32)))
    req.inputs["name"].CopyFrom(tf.make_tensor_proto([b"a", b"\xff"]))
    req.inputs["image_bytes"].CopyFrom(tf.make_tensor_proto([b"ok", b"ok"]))
    rows = predict_json(req, "serving_default", "instances")
    assert rows == {"signature_name": "serving_default", "instances": [
        {"x": 1.5, "name": "a", "image_bytes": {"b64": "b2s="}},
        {"x": 2.5, "name": {"b64": "/w=="}, "image_bytes": {"b64": "b2s="}}]}
    cols = predict_json(req, "", "inputs")
    assert cols == {"inputs": {"x": [1.5, 2.5], "name": ["a", {"b64": "/w=="}],
                               "image_bytes": [{"b64": "b2s="}, {"b64": "b2s="}]}}
    with pytest.raises(LoadtestError, match="no request to replay"):
        build_items([], None)
