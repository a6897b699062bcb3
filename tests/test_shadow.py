"""Shadow traffic (`tfpipe serve --shadow`): real servers on 127.0.0.1 mirror requests to a model's
newest candidate (BASE/NAME/candidates/N); clients get only the served version's answers, and the
candidate's answers, errors and latency are recorded in Prometheus and in the report files that
`tfpipe shadow DIR` merges. And the pure pieces: the comparison, the histograms, the merge."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import statistics
import threading
import time

import numpy as np
import pytest
import requests
from conftest import run_cli, start_cli_server
from reloading import publish_and_wait

pytestmark = pytest.mark.xdist_group("shadow")

MONITORING = 'prometheus_config { enable: true path: "/monitoring/prometheus/metrics" }'
SETTLE_S = 60.0  # how long a server may take to do what a test waits for (a base-path poll and a load)


# ---- helpers ---------------------------------------------------------------------------------------

def _serve(tmp_path, *flags: str):
    """`tfpipe serve` with Prometheus on, and the given flags."""
    mon = tmp_path / "monitoring.config"
    mon.write_text(MONITORING)
    return start_cli_server(f"--monitoring_config_file={mon}", *flags)


def _stop(proc) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=90)


def _scrape(rest_port: int) -> str:
    return requests.get(f"http://127.0.0.1:{rest_port}/monitoring/prometheus/metrics", timeout=30).text


def _total(page: str, name: str, **labels: str) -> float:
    """The sum of a metric's series whose labels include `labels`."""
    total = 0.0
    for m in re.finditer(rf"^{re.escape(name)}(?:\{{([^}}]*)\}})? (\S+)$", page, re.M):
        have = dict(re.findall(r'(\w+)="([^"]*)"', m[1] or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m[2])
    return total


def _drawn(rest_port: int, model: str, **labels: str) -> float:
    """Requests drawn for shadow traffic that are settled: mirrored (the candidate answered) or skipped."""
    return _total(_scrape(rest_port), "tfpipe_serving_shadow_requests_total", model=model, **labels)


def _wait(what: str, check, timeout: float = SETTLE_S):
    """Poll `check()` until it returns a true value (returned); AssertionError naming `what` if not in time."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s (last: {value!r})")
        time.sleep(0.05)


def _paced(rest_port: int, model: str, send, n: int) -> list:
    """`send()` n times, each after the previous one's mirrored call has settled (so that none finds
    the candidate's calls in flight at their bound); the answers."""
    before = _drawn(rest_port, model)
    answers = []
    for i in range(n):
        answers.append(send())
        _wait(f"mirrored call {i + 1} of {model}", lambda i=i: _drawn(rest_port, model) >= before + i + 1)
    return answers


def _rest(rest_port: int, path: str, body: dict, session=None) -> dict:
    r = (session or requests).post(f"http://127.0.0.1:{rest_port}/v1/models/{path}", data=json.dumps(body),
                                   timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def _grpc_predict(grpc_port: int, model: str, x: list[float]):
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    req = predict_pb2.PredictRequest()
    req.model_spec.name = model
    req.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array(x, np.float32)))
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        resp = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(req, timeout=30)
    return resp.model_spec.version.value, tf.make_ndarray(resp.outputs["y"]).tolist()


def _report(directory) -> dict:
    res = run_cli("shadow", str(directory), "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _record(report: dict, model: str, api: str = "predict", signature: str = "serving_default",
            candidate: int | None = None) -> dict:
    found = [r for r in report["models"][model]["records"] if r["api"] == api and r["signature"] == signature
             and candidate in (None, r["candidate_version"])]
    assert len(found) == 1, report["models"][model]["records"]
    return found[0]


def _publish(make, final) -> None:
    """Build a model beside `final`, then rename it into place (as an exporter publishes)."""
    staging = f"{final}.staging"
    make(staging)
    os.makedirs(os.path.dirname(final), exist_ok=True)
    os.rename(staging, final)


# ---- 1. the answers clients get, and what is recorded -------------------------------------------

def test_clients_get_only_the_served_answers_and_the_candidate_is_recorded(tmp_path):
    """half version 1 (y = 0.5x + 2) served, version 2 (b=3) a candidate, --shadow=1: REST and gRPC
    Predicts and a Regress answer 3.0 for x=2 from version 1; the candidate answered 4.0 on every one
    of them (relative difference 1/3), without an error; a request naming a version is not mirrored;
    status shows version 1 only."""
    from serving_models import save_half

    base, reports = tmp_path / "half", tmp_path / "reports"
    save_half(str(base / "1"), b=2.0)
    save_half(str(base / "candidates" / "2"), b=3.0)
    proc, grpc_port, rest_port = _serve(tmp_path, "--model_name=half", f"--model_base_path={base}", "--shadow=1",
                                        f"--shadow_report_dir={reports}")
    try:
        proc.output.wait_for(r"loaded half candidate 2 for shadow traffic")
        with requests.Session() as s:
            answers = _paced(rest_port, "half", lambda: _rest(rest_port, "half:predict", {"instances": [2.0]}, s), 10)
            assert answers == [{"predictions": [3.0]}] * 10
            answers = _paced(rest_port, "half", lambda: _rest(rest_port, "half:predict", {"inputs": [2.0] * 3}, s), 1)
            assert answers == [{"outputs": [3.0] * 3}]
            body = {"signature_name": "regress_x", "examples": [{"x": 2.0}]}
            assert _paced(rest_port, "half", lambda: _rest(rest_port, "half:regress", body, s), 1) == \
                [{"results": [3.0]}]
            assert _rest(rest_port, "half/versions/1:predict", {"instances": [2.0]}, s) == {"predictions": [3.0]}
        assert _paced(rest_port, "half", lambda: _grpc_predict(grpc_port, "half", [2.0]), 5) == [(1, [3.0])] * 5
        status = requests.get(f"http://127.0.0.1:{rest_port}/v1/models/half", timeout=30).json()
        assert [v["version"] for v in status["model_version_status"]] == ["1"]
        page = _scrape(rest_port)
        assert _total(page, "tfpipe_serving_shadow_requests_total", api="predict", outcome="mirrored") == 16
        assert _total(page, "tfpipe_serving_shadow_requests_total", outcome="skipped") == 0
        assert _total(page, "tfpipe_serving_shadow_latency_seconds_count", api="predict") == 16
        assert _total(page, "tfpipe_serving_shadow_errors_total") == 0
        assert 'tfpipe_serving_shadow_candidate_version{model="half"} 2' in page
    finally:
        _stop(proc)
    report = _report(reports)
    r = _record(report, "half")
    assert (r["served_version"], r["candidate_version"], r["mirrored"], r["skipped"], r["errors"]) == (1, 2, 16, 0, {})
    s = r["summary"]
    assert (s["rows"], s["float_rows"], s["class_rows"]) == (18, 18, 0)
    for q in ("rel_diff_median", "rel_diff_p90", "rel_diff_p99", "rel_diff_max"):
        assert s[q] == pytest.approx(1 / 3), (q, s)
    assert s["served_latency_p99"] > 0 and s["candidate_latency_p99"] > 0
    assert r["worst"] == [{"flipped": False, "rel_diff": pytest.approx(1 / 3), "inputs": {"x": 2.0},
                           "served": {"y": 3.0}, "candidate": {"y": 4.0}}]
    regress = _record(report, "half", api="regress", signature="regress_x")
    assert regress["mirrored"] == 1 and regress["summary"]["rel_diff_max"] == pytest.approx(1 / 3)
    assert regress["worst"][0]["inputs"] == {"x": [2.0]} and regress["worst"][0]["candidate"] == {"outputs": 4.0}
    text = run_cli("shadow", str(reports)).stdout
    assert "candidate 2 vs served 1, predict serving_default: 16 request(s) mirrored, 0 skipped, 0 candidate error(s)" \
        in text, text
    assert "relative difference median 0.3333, p90 0.3333, p99 0.3333, max 0.3333" in text, text


# ---- 2. classes that flip, per slice ----------------------------------------------------------------

def test_flipped_classes_are_counted_per_slice(tmp_path):
    """A threshold classifier served at t=5, its candidate at t=7: of x = 0..9 the rows 6 and 7 flip
    from "big" to "small", 20%, by Predict (classes and class_ids) and by Classify (the top class);
    --shadow_slice=island splits them (even x on island a, odd on b) into counts that add up. Batching
    is on: the served calls go through the batch queue, the candidate's do not."""
    from draining import BATCHING
    from serving_models import save_threshold

    base, reports = tmp_path / "thr", tmp_path / "reports"
    save_threshold(str(base / "1"), 5.0)
    save_threshold(str(base / "candidates" / "2"), 7.0)
    (tmp_path / "batching.config").write_text(BATCHING)
    proc, grpc_port, rest_port = _serve(tmp_path, "--model_name=thr", f"--model_base_path={base}", "--shadow=1",
                                        "--shadow_slice=island", f"--shadow_report_dir={reports}",
                                        "--enable_batching",
                                        f"--batching_parameters_file={tmp_path / 'batching.config'}")
    rows = [{"x": float(x), "island": "a" if x % 2 == 0 else "b"} for x in range(10)]
    try:
        proc.output.wait_for(r"loaded thr candidate 2 for shadow traffic")
        answers = _paced(rest_port, "thr", lambda: _rest(rest_port, "thr:predict", {"instances": rows}), 3)
        for answer in answers:
            assert [p["classes"] for p in answer["predictions"]] == ["small"] * 6 + ["big"] * 4
        body = {"signature_name": "classification", "examples": rows}
        (answer,) = _paced(rest_port, "thr", lambda: _rest(rest_port, "thr:classify", body), 1)
        assert [max(r, key=lambda p: p[1])[0] for r in answer["results"]] == ["small"] * 6 + ["big"] * 4
        page = _scrape(rest_port)
        assert _total(page, "tfpipe_serving_batch_size_count") == 4  # the served calls only
        assert _total(page, "tfpipe_serving_shadow_flipped_rows_total", api="predict") == 6
        assert _total(page, "tfpipe_serving_shadow_class_rows_total", api="predict") == 30
        assert _total(page, "tfpipe_serving_shadow_flipped_rows_total", api="classify") == 2
    finally:
        _stop(proc)
    report = _report(reports)
    for api, signature, requests_, flipped in (("predict", "serving_default", 3, 6),
                                               ("classify", "classification", 1, 2)):
        r = _record(report, "thr", api=api, signature=signature)
        s = r["summary"]
        assert (r["mirrored"], r["errors"], s["class_rows"], s["flipped"]) == (requests_, {}, 10 * requests_, flipped)
        assert s["flipped_share"] == pytest.approx(0.2)
        slices = r["slice_summaries"]
        assert sorted(slices) == ["a", "b"]
        assert sum(a["rows"] for a in slices.values()) == s["rows"] == 10 * requests_
        assert sum(a["flipped"] for a in slices.values()) == flipped
        assert slices["a"]["flipped"] == slices["b"]["flipped"] == flipped // 2  # x=6 on a, x=7 on b
        worst = r["worst"]
        assert worst and all(w["flipped"] for w in worst[:2]), worst
        assert {json.dumps(w["inputs"], sort_keys=True) for w in worst if w["flipped"]} == {
            json.dumps({"x": [6.0], "island": ["a"]} if api == "classify" else {"x": 6.0, "island": "a"},
                       sort_keys=True),
            json.dumps({"x": [7.0], "island": ["b"]} if api == "classify" else {"x": 7.0, "island": "b"},
                       sort_keys=True)}
        assert {w["served"]["classes"] for w in worst if w["flipped"]} == {"big"}
        assert {w["candidate"]["classes"] for w in worst if w["flipped"]} == {"small"}
    text = run_cli("shadow", str(reports)).stdout
    assert "class flipped in 6 of 30 (20.00%)" in text and "per island:" in text, text


# ---- 3. a failing and a slow candidate do not touch the clients ----------------------------------------

def _failing(x):
    import tensorflow as tf

    with tf.control_dependencies([tf.debugging.assert_non_negative(x, message="x must not be negative")]):
        return {"y": 0.5 * x + 3.0}


def _config(root, names) -> str:
    path = root / "models.config"
    path.write_text("model_config_list { " + " ".join(
        f'config {{ name: "{n}" base_path: "{root / n}" model_platform: "tensorflow" }}' for n in names) + " }")
    return str(path)


def _latencies(session, rest_port: int, n: int) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        answer = _rest(rest_port, "slow:predict", {"instances": [float(i)]}, session)
        out.append(time.perf_counter() - t0)
        assert answer == {"predictions": [0.5 * i + 2.0]}
    return out


def _p99(times: list[float]) -> float:
    return sorted(times)[max(0, math.ceil(0.99 * len(times)) - 1)]


def test_a_failing_and_a_slow_candidate_cost_the_clients_nothing(tmp_path):
    """Three served half models, each with a bad candidate: one that raises on negative inputs, one
    without the output `y`, one that takes a tenth of a second a call. Every client request is
    answered OK by the served version; the candidate's errors are counted by status with their
    reason; the slow one's requests are all settled, mirrored or skipped. Client-side REST latency with the
    shadow, against a server without it, in alternating rounds: p99 within 5x the plain server's, or
    below half a call of the slow candidate. The second bound is what no waiting means: a request
    that waited for the candidate would take a whole call of it, so fewer than 1% of them can have;
    the first alone fails now and then on a 2-core machine shared with other work. (The slow
    candidate sleeps: what a candidate's CPU costs the served model, docs/second-day.md's
    benchmark measures.)"""
    from serving_models import save_half, save_predict, save_slow

    reports = tmp_path / "reports"
    for name in ("bad", "lacks", "slow"):
        save_half(str(tmp_path / name / "1"), b=2.0)
    save_predict(str(tmp_path / "bad" / "candidates" / "2"), _failing)
    save_predict(str(tmp_path / "lacks" / "candidates" / "2"), lambda x: {"z": x})
    save_slow(str(tmp_path / "slow" / "candidates" / "2"), seconds=0.1)
    config = _config(tmp_path, ("bad", "lacks", "slow"))
    plain, _, plain_port = _serve(tmp_path, f"--model_config_file={config}")
    proc, _, rest_port = _serve(tmp_path, f"--model_config_file={config}", "--shadow=1",
                                f"--shadow_report_dir={reports}")
    try:
        for name in ("bad", "lacks", "slow"):
            proc.output.wait_for(rf"loaded {name} candidate 2 for shadow traffic")
        for x in (1.0, -1.0):
            assert _paced(rest_port, "bad", lambda x=x: _rest(rest_port, "bad:predict", {"instances": [x]}), 3) == \
                [{"predictions": [0.5 * x + 2.0]}] * 3
        assert _paced(rest_port, "lacks", lambda: _rest(rest_port, "lacks:predict", {"instances": [2.0]}), 3) == \
            [{"predictions": [3.0]}] * 3
        times: dict[str, list[float]] = {"plain": [], "shadow": []}
        with requests.Session() as a, requests.Session() as b:
            _latencies(a, plain_port, 20)  # both warm
            _latencies(b, rest_port, 20)
            for _ in range(3):
                times["plain"] += _latencies(a, plain_port, 100)
                times["shadow"] += _latencies(b, rest_port, 100)
        drawn = _drawn(rest_port, "slow")
    finally:
        _stop(plain)
        _stop(proc)
    report = _report(reports)
    slow = _record(report, "slow")
    p99 = {k: _p99(v) for k, v in times.items()}
    medians = {k: statistics.median(v) for k, v in times.items()}
    candidate = slow["summary"]["candidate_latency_p50"]
    assert p99["shadow"] < max(5 * p99["plain"], candidate / 2), (p99, medians, candidate)
    bad = _record(report, "bad")
    assert (bad["mirrored"], bad["errors"], bad["summary"]["rows"]) == (6, {"INVALID_ARGUMENT": 3}, 3)
    assert any("x must not be negative" in reason for reason in bad["error_reasons"]), bad["error_reasons"]
    lacks = _record(report, "lacks")
    assert (lacks["mirrored"], lacks["errors"]) == (3, {"MISSING_OUTPUT": 3})
    assert lacks["error_reasons"] == {"the candidate has no output 'y'": 3}
    assert slow["mirrored"] + slow["skipped"] == 320 and slow["errors"] == {}, slow
    assert drawn >= slow["skipped"]
    assert slow["summary"]["candidate_latency_p50"] > 10 * slow["summary"]["served_latency_p50"]


# ---- 4. promotion while shadowing ---------------------------------------------------------------------

def test_a_newer_candidate_replaces_the_shadowed_one_and_promotion_stops_shadowing(tmp_path):
    """Candidate 2 shadowed; candidate 3 published: it replaces 2. Promoted (tfpipe.versions.promote)
    while a client predicts without pause: version 3 serves, no request fails, candidate 3 is unloaded
    and candidate 2 (older than the version served now) is not shadowed: nothing is mirrored once
    version 3 serves; the unloaded candidate's memory is freed at once."""
    from serving_models import save_half

    from tfpipe import versions

    base, reports = tmp_path / "half", tmp_path / "reports"
    save_half(str(base / "1"), b=2.0)
    save_half(str(base / "candidates" / "2"), b=3.0)
    proc, _, rest_port = _serve(tmp_path, "--model_name=half", f"--model_base_path={base}", "--shadow=1",
                                f"--shadow_report_dir={reports}")
    url = f"http://127.0.0.1:{rest_port}"
    try:
        proc.output.wait_for(r"loaded half candidate 2 for shadow traffic")
        mark = proc.output.mark()
        _publish(lambda p: save_half(p, b=4.0), str(base / "candidates" / "3"))
        proc.output.wait_for(r"loaded half candidate 3 for shadow traffic", after=mark)
        proc.output.wait_for(r"unloaded half candidate 2", after=mark)
        assert _paced(rest_port, "half", lambda: _rest(rest_port, "half:predict", {"instances": [2.0]}), 3) == \
            [{"predictions": [3.0]}] * 3
        results: list = []
        stop = threading.Event()

        def client():
            with requests.Session() as s:
                while not stop.is_set():
                    try:
                        r = s.post(f"{url}/v1/models/half:predict", json={"instances": [2.0]}, timeout=30)
                        results.append(r.json()["predictions"][0] if r.status_code == 200 else r.text)
                    except Exception as e:  # noqa: BLE001 (a failed request is counted, not passed over)
                        results.append(repr(e))
        thread = threading.Thread(target=client, daemon=True)
        thread.start()
        mark = proc.output.mark()
        versions.promote(str(base))
        # freed: nothing (the shadow's thread, waiting for more) holds the unloaded candidate
        proc.output.wait_for(r"unloaded half candidate 3 \(.*freed: True\)", after=mark)
        _wait("version 3 serving alone", lambda: [(s["version"], s["state"]) for s in requests.get(
            f"{url}/v1/models/half", timeout=30).json()["model_version_status"]] == [("3", "AVAILABLE"), ("1", "END")])
        _wait("answers from version 3", lambda: results and results[-1] == 5.0)
        stop.set()
        thread.join(timeout=60)
        assert results and set(results) <= {3.0, 5.0}, [r for r in results if r not in (3.0, 5.0)][:5]
        with requests.Session() as s:
            for _ in range(10):
                assert _rest(rest_port, "half:predict", {"instances": [2.0]}, s) == {"predictions": [5.0]}
        assert "tfpipe_serving_shadow_candidate_version{" not in _scrape(rest_port)
        assert not [line for line in proc.output.lines[mark:] if line.startswith("loaded half candidate")]
    finally:
        _stop(proc)
    records = _report(reports)["models"]["half"]["records"]
    assert {(r["served_version"], r["candidate_version"]) for r in records} <= {(1, 2), (1, 3)}
    assert _record(_report(reports), "half", candidate=3)["mirrored"] >= 3


# ---- 5. two workers, one report ------------------------------------------------------------------------

@pytest.mark.long
def test_two_workers_reports_add_up(tmp_path):
    """--workers 2 --shadow=1 --shadow_report_dir: each worker writes its own file; `tfpipe shadow`
    adds them up to the requests sent (both workers answered some), as the merged Prometheus page does."""
    from serving_models import save_half

    base, reports = tmp_path / "half", tmp_path / "reports"
    save_half(str(base / "1"), b=2.0)
    save_half(str(base / "candidates" / "2"), b=3.0)
    proc, _, rest_port = _serve(tmp_path, "--workers=2", "--model_name=half", f"--model_base_path={base}",
                                "--shadow=1", f"--shadow_report_dir={reports}")
    sent = 24
    try:
        for i in (0, 1):
            proc.output.wait_for(rf"\[worker {i}\] loaded half candidate 2 for shadow traffic")

        def fresh():  # a connection of its own: the kernel gives it to either worker
            with requests.Session() as s:
                return _rest(rest_port, "half:predict", {"instances": [2.0]}, s)
        assert _paced(rest_port, "half", fresh, sent) == [{"predictions": [3.0]}] * sent
        # a scrape adds the other worker's counts as it last wrote them (every half second)
        _wait("the merged page counting every mirrored request", lambda: _total(
            _scrape(rest_port), "tfpipe_serving_shadow_requests_total", outcome="mirrored") == sent)
    finally:
        _stop(proc)
    files = sorted(os.listdir(reports))
    assert len(files) == 2 and all(re.fullmatch(r"shadow-half-\d+\.json", f) for f in files), files
    per_file = [sum(r["mirrored"] for r in json.load(open(reports / f))["records"]) for f in files]
    assert sum(per_file) == sent and min(per_file) > 0, per_file  # all on one worker: once in 2**23 runs
    report = _report(reports)
    assert report["files"] == 2 and len(report["models"]["half"]["pids"]) == 2
    r = _record(report, "half")
    assert (r["mirrored"], r["skipped"], r["summary"]["rows"]) == (sent, 0, sent)


# ---- 6. the flags ----------------------------------------------------------------------------------------

def test_a_share_outside_0_to_1_is_refused():
    res = run_cli("serve", "--shadow=1.5", "--model_base_path=/nonexistent")
    assert res.returncode == 2
    assert "argument --shadow: expected a share of requests from 0 to 1 (0: off, 1: every request), got 1.5" \
        in res.stderr, res.stderr
    from tfpipe.serve.errors import ServeError
    from tfpipe.serve.flags import ServeOptions
    from tfpipe.serve.server import EmbeddedServer

    with pytest.raises(ServeError, match=r"--shadow=-0.1: the share of requests mirrored to a candidate must be"):
        EmbeddedServer(ServeOptions(model_base_path="/nonexistent", shadow=-0.1), log=lambda _: None)


def test_without_candidates_shadow_says_so_once_and_a_broken_candidate_is_tried_once(tmp_path):
    """--shadow with no candidates/ folder: one log line, however many polls. A candidate that does
    not load: one log line, not tried again at the next polls, tried again once its directory changes;
    the served version answers throughout. A candidate the history says a canary rolled back is
    unloaded."""
    from serving_models import save_half

    from tfpipe import versions

    for name in ("half", "other"):
        save_half(str(tmp_path / name / "1"), b=2.0)
    save_half(str(tmp_path / "spare"), b=2.0)
    config = _config(tmp_path, ("half", "other"))
    proc, _, rest_port = _serve(tmp_path, f"--model_config_file={config}", "--shadow=0.5")
    url = f"http://127.0.0.1:{rest_port}"
    nothing = r"--shadow=0.5: no model's base path has a candidates/ folder .*: nothing is mirrored"
    failed = r"candidate 3 of half failed to load: .*not shadowed, nor loaded again until its directory changes"

    def polls_later(version: int) -> None:  # a new version of `other` loaded: a whole poll ran since
        publish_and_wait(str(tmp_path / "spare"), str(tmp_path / "other"), version, url, "other")

    try:
        proc.output.wait_for(nothing)
        polls_later(2)
        polls_later(3)
        assert len([line for line in proc.output.lines if re.search(nothing, line)]) == 1
        broken = tmp_path / "half" / "candidates" / "3"
        _publish(lambda p: os.makedirs(p) or open(os.path.join(p, "saved_model.pb"), "wb").write(b"not a model"),
                 str(broken))
        proc.output.wait_for(failed)
        polls_later(4)
        polls_later(5)
        assert len([line for line in proc.output.lines if re.search(failed, line)]) == 1
        (broken / "touched").write_text("a change")  # the directory's mtime moves: tried again
        proc.output.wait_for(failed, count=2)
        assert _rest(rest_port, "half:predict", {"instances": [2.0]}) == {"predictions": [3.0]}
        assert "tfpipe_serving_shadow_candidate_version{" not in _scrape(rest_port)
        # a candidate that the history says a canary rolled back (another server's, here recorded by
        # hand while this one shadows it) is unloaded at the next poll, and not loaded again
        _publish(lambda p: save_half(p, b=3.0), str(tmp_path / "other" / "candidates" / "9"))
        proc.output.wait_for(r"loaded other candidate 9 for shadow traffic")
        versions.record(str(tmp_path / "other"), versions.CANARY_ROLLED_BACK, 9, "canary: by another server")
        proc.output.wait_for(r"unloaded other candidate 9")
        polls_later(6)
        assert len([line for line in proc.output.lines if "loaded other candidate 9 for" in line]) == 1
    finally:
        _stop(proc)


# ---- the pure pieces ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("served, candidate, want", [
    ({"y": [3.0, 0.0]}, {"y": [4.0, 0.0]}, (None, [1 / 3, 0.0])),
    ({"y": [0.0]}, {"y": [1e-3]}, (None, [1e9])),  # |s| below 1e-12 counts as 1e-12
    ({"y": [np.nan, 1.0]}, {"y": [np.nan, np.nan]}, (None, [0.0, math.inf])),
    ({"c": [b"a", b"b"], "p": [[0.5, 0.5], [1.0, 3.0]]}, {"c": [b"a", b"c"], "p": [[0.5, 0.5], [1.0, 1.5]]},
     ([False, True], [0.0, 0.5])),  # a row's largest difference over its values
    ({"id": [[1], [2]]}, {"id": [[1], [3]]}, ([False, True], None)),
])
def test_outputs_compare_row_by_row(served, candidate, want):
    from tfpipe.serve.core.shadow import compare

    flips, rel = compare({k: np.array(v) for k, v in served.items()}, {k: np.array(v) for k, v in candidate.items()})
    assert (None if flips is None else flips.tolist()) == want[0]
    assert (None if rel is None else rel.tolist()) == (None if want[1] is None else pytest.approx(want[1]))


@pytest.mark.parametrize("candidate, status, reason", [
    ({}, "MISSING_OUTPUT", "the candidate has no output 'y'"),
    ({"y": np.zeros((2, 1), np.float32)}, "SHAPE_MISMATCH", "output 'y': the candidate's shape is [2, 1], the "
                                                            "served version's [2]"),
    ({"y": np.array([b"a", b"b"], object)}, "DTYPE_MISMATCH", "output 'y': the candidate's dtype is object, the "
                                                              "served version's float32"),
])
def test_outputs_that_cannot_compare_are_the_candidates_errors(candidate, status, reason):
    from tfpipe.serve.core.shadow import Mismatch, compare

    with pytest.raises(Mismatch) as e:
        compare({"y": np.zeros(2, np.float32)}, candidate)
    assert (e.value.status, e.value.reason) == (status, reason)


def test_histograms_and_records_merge_as_one_would_have_counted():
    """Two processes' records of the same key add up to what one process counting all would hold:
    counts, histograms (quantiles within a bucket, 12%, and exact at the ends), worst rows."""
    from tfpipe.serve.shadow_report import Record, difference_histogram

    values = [10 ** (k / 7) for k in range(-30, 10)]
    one, parts = difference_histogram(), [difference_histogram(), difference_histogram()]
    for i, v in enumerate(values):
        one.add(v)
        parts[i % 2].add(v)
    merged = difference_histogram()
    for p in parts:
        merged.merge(p)
    got, want = merged.to_json(), one.to_json()
    assert got.pop("sum") == pytest.approx(want.pop("sum")) and got == want
    exact = sorted(values)
    for q in (0.5, 0.9, 0.99):
        want = exact[math.ceil(q * len(exact)) - 1]
        assert want <= merged.quantile(q) <= want * 10 ** (1 / 20) * 1.0001
    assert merged.quantile(1.0) == max(values) and merged.quantile(0.0) == min(values)

    a, b = Record(1, 2, "predict", "serving_default"), Record(1, 2, "predict", "serving_default")
    a.mirrored, b.mirrored, b.skipped = 3, 4, 1
    a.error("INVALID_ARGUMENT", "x")
    b.error("INVALID_ARGUMENT", "x")
    a.offer([{"flipped": False, "rel_diff": 0.5, "inputs": {"x": 1}, "served": {}, "candidate": {}}])
    b.offer([{"flipped": True, "rel_diff": None, "inputs": {"x": 2}, "served": {}, "candidate": {}},
             {"flipped": False, "rel_diff": 0.5, "inputs": {"x": 1}, "served": {}, "candidate": {}}])
    restored = Record.from_json(json.loads(json.dumps(a.to_json())))
    restored.merge(Record.from_json(json.loads(json.dumps(b.to_json()))))
    assert (restored.mirrored, restored.skipped, restored.errors) == (7, 1, {"INVALID_ARGUMENT": 2})
    assert restored.error_reasons == {"x": 2}
    assert [w["inputs"] for w in restored.worst] == [{"x": 2}, {"x": 1}]  # flipped first; the same row once


# ---- 5. requests that share one call of the candidate, and the bound on those waiting ---------------

class _Candidates:
    """The manager's two answers the shadow asks for, with a real candidate Servable."""

    def __init__(self, name: str, candidate):
        self.name, self.candidate_servable = name, candidate

    def candidate(self, name: str):
        return self.candidate_servable if name == self.name else None

    def shadowed(self) -> dict:
        return {self.name: self.candidate_servable.version}


def _served_calls(served, xs) -> list:
    sig = served.signature("serving_default")
    out = []
    for x in xs:
        inputs = served.check_inputs(sig, {"x": np.array([x], np.float32)})
        out.append((inputs, served.run(sig, inputs)))
    return out


def test_pending_requests_share_one_call_and_beyond_the_bound_are_skipped(tmp_path):
    """Twenty Predicts handed to the shadow at once, four rows allowed to wait, a window of a second:
    the first four are answered by one call of the candidate (one latency for all, every row
    compared), the other sixteen skipped. A shared call that fails (one row negative) answers its
    requests alone: the error is that request's, the others compare."""
    from serving_models import save_half, save_predict

    from tfpipe.serve.core.servable import Servable
    from tfpipe.serve.core.shadow import Shadow
    from tfpipe.serve.metrics import Metrics

    save_half(str(tmp_path / "1"), b=2.0)
    save_half(str(tmp_path / "2"), b=3.0)
    save_predict(str(tmp_path / "3"), _failing)
    served = Servable("half", 1, str(tmp_path / "1"))
    for candidate, xs, want in ((2, [float(i) for i in range(20)], (4, 16, {}, 4)),
                                (3, [1.0, -1.0, 2.0], (3, 0, {"INVALID_ARGUMENT": 1}, 2))):
        shadow = Shadow(_Candidates("half", Servable("half", candidate, str(tmp_path / str(candidate)))), 1.0, "",
                        "", Metrics(), log=print, window=1.0, max_pending_rows=4)
        try:
            for inputs, outputs in _served_calls(served, xs):
                shadow.predict(served, "serving_default", inputs, outputs, 0.001)
            assert shadow.settled(60)
        finally:
            shadow.close()
        (r,) = shadow.recorder.snapshot("half")[0]
        assert (r["mirrored"], r["skipped"], r["errors"], r["agreement"]["rows"]) == want, r
        if candidate == 2:  # one call: one latency for the four
            assert r["candidate_latency"]["n"] == 4 and r["candidate_latency"]["min"] == r["candidate_latency"]["max"]
            assert r["worst"][0]["rel_diff"] > 0
