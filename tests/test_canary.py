"""Canary (`tfpipe serve --canary`): a real server on 127.0.0.1 answers a share of the requests that
name no version with each model's newest candidate, promotes a good one and rolls back at once one
that answers NaN, fails, disagrees or is slow, while every client request is answered. And the
pure pieces: the sticky draw, the options' checks, the verdict."""

from __future__ import annotations

import json
import math
import re
import threading
import time

import numpy as np
import pytest
import requests
from conftest import start_cli_server
from test_shadow import MONITORING, _config, _failing, _scrape, _stop, _total

from tfpipe import versions

pytestmark = pytest.mark.xdist_group("shadow")

MODELS = ("good", "nan", "bad", "slow", "thr")
DECISION = {"good": "PROMOTED", "nan": "ROLLED BACK", "bad": "ROLLED BACK", "slow": "ROLLED BACK",
            "thr": "ROLLED BACK"}
DECIDED = re.compile(r"candidate 2 (PROMOTED|ROLLED BACK|passed, but)")
WHY = {"nan": "holds NaN or infinity", "bad": "x must not be negative", "slow": "p99",
       "thr": "class flipped"}


def _plus_one(x):
    return {"y": x + 1.0}


def _models(root) -> str:
    """Five served models, each with a candidate 2: `good` the same half_plus_two; `nan` one that
    answers NaN; `bad` one that fails on negative inputs (the load sends -1); `slow` the same x+1
    after a quarter of a second; `thr` a threshold classifier at 7 over one at 5 (x = 0..9: 20% of the rows
    flip)."""
    from serving_models import save_half, save_predict, save_slow, save_threshold

    save_half(str(root / "good" / "1"), b=2.0)
    save_half(str(root / "good" / "candidates" / "2"), b=2.0)
    save_half(str(root / "nan" / "1"), b=2.0)
    save_half(str(root / "nan" / "candidates" / "2"), b=math.nan)
    save_half(str(root / "bad" / "1"), b=2.0)
    save_predict(str(root / "bad" / "candidates" / "2"), _failing)
    save_predict(str(root / "slow" / "1"), _plus_one)
    save_slow(str(root / "slow" / "candidates" / "2"), seconds=0.25)
    save_threshold(str(root / "thr" / "1"), 5.0)
    save_threshold(str(root / "thr" / "candidates" / "2"), 7.0)
    return _config(root, MODELS)


BODIES = {"good": {"instances": [2.0]}, "nan": {"instances": [2.0]}, "bad": {"instances": [-1.0]},
          "slow": {"instances": [2.0]},
          "thr": {"instances": [{"x": float(x), "island": "a"} for x in range(10)]}}


def _answered_right(name: str, text: str) -> bool:
    """Whether a client got version 1's answer to BODIES[name], or the candidate's where it is a
    good one (the same for `good` and `slow`; `thr`'s flips x = 6 and 7 until rolled back)."""
    answer = json.loads(text)
    if name == "thr":
        classes = [p["classes"] for p in answer["predictions"]]
        return classes in (["small"] * 6 + ["big"] * 4, ["small"] * 8 + ["big"] * 2)
    return answer == {"predictions": [{"good": 3.0, "nan": 3.0, "bad": 1.5, "slow": 3.0}[name]]}


class _Load:
    """Clients on threads of their own, one per model: REST Predicts one after another (every
    other one with a client key), every answer kept, until stopped; a model's client stops once
    `decided(name)` (its canary's decision is out: what follows would test nothing new)."""

    def __init__(self, rest_port: int, decided):
        self.rest_port, self.answers, self.decided = rest_port, [], decided
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(name,), daemon=True) for name in MODELS]

    def _run(self, name: str) -> None:
        with requests.Session() as s:
            i = 0
            while not self._stop.is_set() and not (i % 10 == 9 and self.decided(name)):
                headers = {"X-Canary-Key": f"client-{i % 50}"} if i % 2 else {}
                r = s.post(f"http://127.0.0.1:{self.rest_port}/v1/models/{name}:predict",
                           data=json.dumps(BODIES[name]), headers=headers, timeout=60)
                self.answers.append((name, r.status_code, r.text))
                i += 1

    def __enter__(self) -> _Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=120)


def _grpc_version(grpc_port: int, name: str, key: str | None = None) -> int:
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    req = predict_pb2.PredictRequest()
    req.model_spec.name = name
    req.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([2.0], np.float32)))
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        resp = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
            req, timeout=30, metadata=[("x-canary-key", key)] if key else None)
    assert tf.make_ndarray(resp.outputs["y"]).tolist() == [3.0]
    return resp.model_spec.version.value


@pytest.mark.long
def test_canaries_are_promoted_or_rolled_back_while_every_client_is_answered(tmp_path):
    """--canary=0.5 over five models under a steady client load: the good candidate is promoted
    after 100 canary requests and serves every request that names no version; the one answering
    NaN and the one failing are rolled back at once (the request it failed answered by version 1),
    the disagreeing one and the slow one at their verdict; each decision is in the model's history
    with its reason, the rolled-back candidates stay in candidates/; every client request got
    version 1's answer or the same answer from the good candidate, never an error. Before the
    load, a gRPC client key always lands on the same version, and different keys land on both.
    --canary_max_p99_rise=5 keeps the good (identical) candidate clear of a noisy machine's tail;
    the slow one is tens of times slower."""
    config = _models(tmp_path)
    mon = tmp_path / "monitoring.config"
    mon.write_text(MONITORING)
    proc, grpc_port, rest_port = start_cli_server(
        f"--model_config_file={config}", f"--monitoring_config_file={mon}", "--canary=0.5",
        "--canary_requests=100", "--canary_max_p99_rise=5")
    try:
        for name in MODELS:
            proc.output.wait_for(rf"loaded {name} candidate 2 for shadow traffic")
        sides = {}
        for k in range(6):
            seen = {_grpc_version(grpc_port, "good", f"key-{k}") for _ in range(3)}
            assert len(seen) == 1, (k, seen)  # sticky
            sides[k] = seen.pop()
        assert set(sides.values()) == {1, 2}, sides

        def decided(name: str) -> bool:
            return any(line.startswith(f"canary: {name} candidate 2 ") and DECIDED.search(line)
                       for line in proc.output.lines)

        with _Load(rest_port, decided) as load:
            for name in MODELS:
                (m,) = proc.output.wait_for(rf"canary: {name} candidate 2 {DECISION[name]}[^\n]*", timeout=180)
                assert WHY.get(name, "none failed") in m[0], m[0]
            deadline = time.monotonic() + 60
            while _grpc_version(grpc_port, "good") != 2:
                assert time.monotonic() < deadline, "the promoted candidate does not serve"
                time.sleep(0.05)
        page = _scrape(rest_port)
    finally:
        _stop(proc)
    assert load.answers, "the load sent nothing"
    for name, status, text in load.answers:
        assert status == 200, (name, status, text)
        assert _answered_right(name, text), (name, text)
    assert versions.served(str(tmp_path / "good")) == 2
    promoted = [e for e in versions.history(str(tmp_path / "good")) if e["event"] == "promoted"]
    assert [e["version"] for e in promoted] == [2] and promoted[0]["canary"]["requests"] >= 100
    for name in ("nan", "bad", "slow", "thr"):
        base = str(tmp_path / name)
        assert versions.served(base) == 1 and versions.candidates(base) == [2], name
        (event,) = [e for e in versions.history(base) if e["event"] == versions.CANARY_ROLLED_BACK]
        assert event["version"] == 2 and WHY[name] in event["reason"], event
    assert _total(page, "tfpipe_serving_canary_requests_total", model="nan", outcome="fallback") >= 1
    assert _total(page, "tfpipe_serving_canary_requests_total", model="good", outcome="candidate") >= 100


# ---- the pure pieces ------------------------------------------------------------------------------

def _canary(share: float, **kw):
    from tfpipe.serve.core.canary import Canary, CanaryOptions
    from tfpipe.serve.metrics import Metrics

    return Canary(None, CanaryOptions(share=share, **kw), Metrics(), log=lambda _: None, draw=lambda: 0.5)


@pytest.mark.parametrize("share,expected", [(0.0, 0.0), (0.25, 0.25), (0.5, 0.5), (1.0, 1.0)])
def test_a_client_key_always_lands_on_the_same_side_and_keys_split_by_the_share(share, expected):
    c = _canary(share)
    keys = [f"client-{i}" for i in range(4000)]
    first = [c.goes(k) for k in keys]
    assert first == [c.goes(k) for k in keys]
    assert abs(sum(first) / len(keys) - expected) < 0.03


@pytest.mark.parametrize("share,drawn", [(0.4, False), (0.6, True)])
def test_a_request_without_a_key_is_drawn(share, drawn):
    assert _canary(share).goes(None) is drawn  # the draw is 0.5


@pytest.mark.parametrize("flag,value,message", [
    ("canary", 1.5, "must be within 0 and 1"), ("canary_requests", 0, "after at least 1 request"),
    ("canary_max_p99_rise", -1.0, "must be 0 or more"), ("canary_max_disagreement", math.nan, "must be 0 or more")])
def test_bad_canary_options_are_refused_with_the_flag(flag, value, message):
    from tfpipe.serve.core.canary import CanaryOptions
    from tfpipe.serve.errors import ServeError
    from tfpipe.serve.flags import ServeOptions

    with pytest.raises(ServeError, match=rf"--{flag}=.*{message}"):
        CanaryOptions.of(ServeOptions(**{flag: value}))


def test_the_verdict_names_the_bound_that_failed():
    from tfpipe.serve.core.canary import _Trial

    c = _canary(1.0, max_p99_rise=0.5, max_disagreement=0.1)
    t = _Trial(2)
    assert c.verdict(t) == "none of its answers could be compared with the served version's"
    t.agreement.add(100, 5, None)
    for _ in range(100):
        t.candidate_latency.add(0.001)
        t.served_latency.add(0.001)
    assert c.verdict(t) is None
    t.agreement.add(100, 30, None)
    assert c.verdict(t) == "class flipped in 35 of 200 rows (17.5%), beyond --canary_max_disagreement=0.1"
    for _ in range(10):
        t.candidate_latency.add(0.01)
    assert "p99" in c.verdict(t) and "--canary_max_p99_rise=0.5" in c.verdict(t)


@pytest.mark.parametrize("layout,expected", [
    ({"numeric": [1, 2], "candidates": [3]}, [3]),
    ({"numeric": [1, 2], "candidates": [3], "rolled_back": [3]}, None),
    ({"numeric": [4], "candidates": [3]}, None),  # older than the version served
    ({"numeric": [1], "candidates": []}, None),
])
def test_with_tensorflow_model_server_a_canary_is_a_candidate_model_in_a_config_the_protos_read(
        tmp_path, layout, expected):
    """`--backend tfserving --canary`: tensorflow_model_server splits no traffic, so the generated
    models.config serves the candidate the embedded server would canary as NAME-candidate (a
    `specific` policy on BASE/NAME/candidates), for a client or router to send the share to."""
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    from tfpipe.serve.flags import ServeOptions
    from tfpipe.serve.tfserving.launcher import write_configs

    base = tmp_path / "taxi"
    for v in layout["numeric"]:
        (base / str(v)).mkdir(parents=True)
    for v in layout["candidates"]:
        (base / versions.CANDIDATES / str(v)).mkdir(parents=True)
    for v in layout.get("rolled_back", []):
        versions.record(str(base), versions.CANARY_ROLLED_BACK, v, "canary: test")
    paths = write_configs(ServeOptions(model_name="taxi", model_base_path=str(base), canary=0.1),
                          str(tmp_path / "cfg"))
    parsed = text_format.Parse(open(paths["models"]).read(), model_server_config_pb2.ModelServerConfig())
    entries = {c.name: c for c in parsed.model_config_list.config}
    assert entries["taxi"].base_path == str(base)
    if expected is None:
        assert sorted(entries) == ["taxi"]
    else:
        c = entries["taxi-candidate"]
        assert (c.base_path, list(c.model_version_policy.specific.versions)) == (
            f"{base}/{versions.CANDIDATES}", expected)
