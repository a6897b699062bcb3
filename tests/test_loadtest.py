"""Behaviour of `tfpipe loadtest` through the CLI: real locust, real servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import csv
import json
import re
import threading

import pytest

from conftest import free_port, run_cli
from tfpipe.stage import LoadtestOutputs

# its expensive fixtures (servers, runs) are session-scoped and built once, on one xdist worker: a
# worker may run other files in between, which would tear down and rebuild module-scoped ones
pytestmark = pytest.mark.xdist_group("loadtest")


@pytest.fixture(scope="session")
def half_server(tmp_path_factory):
    from tfpipe.serve.flags import ServeOptions
    from tfpipe.serve.server import ServerThread
    from serving_models import save_half

    root = tmp_path_factory.mktemp("loadtest")
    save_half(str(root / "half" / "1"))
    opts = ServeOptions(host="127.0.0.1", port=-1, rest_api_port=-1, model_name="half",
                        model_base_path=str(root / "half"), file_system_poll_wait_seconds=0)
    with ServerThread(opts) as s:
        yield s, root


class Delayed:
    """A TF-Serving-shaped REST endpoint's port, and how many predictions it has answered."""

    def __init__(self):
        self.port, self.answered, self.changed = 0, 0, threading.Condition()

    def wait_for(self, answered: int, timeout: float) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: self.answered >= answered, timeout)


@pytest.fixture(scope="session")
def delayed_endpoint():
    """A TF-Serving-shaped REST endpoint that answers after exactly 20 ms."""
    from aiohttp import web

    delayed = Delayed()

    async def metadata(_):
        return web.json_response({"metadata": {"signature_def": {"signature_def": {
            "serving_default": {"inputs": {"x": {"dtype": "DT_FLOAT"}}}}}}})

    async def predict(_):
        await asyncio.sleep(0.020)
        with delayed.changed:
            delayed.answered += 1
            delayed.changed.notify_all()
        return web.json_response({"predictions": [0.0]})

    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_get("/v1/models/slow/metadata", metadata)
    app.router.add_post("/v1/models/slow:predict", predict)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    delayed.port = runner.addresses[0][1]
    yield delayed
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


@pytest.mark.parametrize("steps, want", [
    ([(100, None), (300, None), (250, None)], 2),  # no SLO: the fastest step
    ([(100, True), (300, False), (250, True)], 3),  # the fastest that met it
    ([(100, True), (90, True)], 1),  # more load, fewer answers: past the knee
    ([(100, False), (300, False)], None),  # every step missed the SLO
])
def test_the_knee_is_the_fastest_step_within_the_slo(steps, want):
    from tfpipe.loadtest.job import knee_of

    knee = knee_of([{"step": i + 1, "rps": rps, "slo_ok": ok} for i, (rps, ok) in enumerate(steps)])
    assert (knee["step"] if knee else None) == want


def test_rest_sweep_with_slo_pass_and_results(tmp_path, half_server):
    server, root = half_server
    (tmp_path / "body.json").write_text(json.dumps({"instances": [1.0, 2.0]}))
    out = tmp_path / "out"
    res = run_cli("loadtest", "--target", f"http://127.0.0.1:{server.rest_port}", "--model", "half",
                  "--payload", str(tmp_path / "body.json"), "--sweep", "1,4", "--duration", "1s", "--warmup", "0.2s",
                  "--slo", "p99<2s,errors<1%", "--out", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["slo_passed"] is True and [s["users"] for s in results["steps"]] == [1, 4]
    for step in results["steps"]:
        assert step["errors"] == 0 and step["requests"] > 20
        assert sum(step["histogram"]["counts"]) == step["requests"]  # every answer is in the histogram
        assert 0 < step["p50_ms"] <= step["p99_ms"] <= step["max_ms"]
    # which step is the knee is knee_of's choice (tested above on made-up steps); here both met the
    # SLO, and the knee reported is one of them with its own figures
    knee = results["knee"]
    assert knee == {k: results["steps"][knee["step"] - 1][k] for k in ("step", "rps", "p99_ms")}
    from tfpipe.loadtest.job import result

    r = result(str(out))  # what tfpipe run shows and keeps of it
    assert re.match(r"2 step\(s\) over REST, up to [\d,]+ req/s, p99 [\d.]+ ms at that load, 0 errors; "
                    r"SLO p99<2s,errors<1% met$", r.summary), r.summary
    assert r.outputs == LoadtestOutputs(str(out), True)
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [r["users"] for r in rows] == ["1", "4"]
    assert "knee" in res.stdout and "SLO p99<2s,errors<1%: met" in res.stdout
    # The report is one well-formed, self-contained file: charts as inline SVG, nothing fetched.
    report = (out / "report.html").read_text()
    from html.parser import HTMLParser

    class Check(HTMLParser):
        def __init__(self):
            super().__init__()
            self.stack, self.svgs, self.external = [], 0, []

        def handle_starttag(self, tag, attrs):
            if tag not in ("meta", "br", "circle", "line", "polyline"):
                self.stack.append(tag)
            self.svgs += tag == "svg"
            self.external += [v for k, v in attrs if k in ("src", "href") and v and "://" in v]

        def handle_endtag(self, tag):
            if tag in ("circle", "line", "polyline"):
                return
            assert self.stack and self.stack.pop() == tag, (tag, self.stack)

    check = Check()
    check.feed(report)
    assert not check.stack and check.svgs >= 3 and not check.external
    assert "<script" not in report and "Latency vs throughput" in report


def test_grpc_open_model_and_a_missed_slo_exits_1(tmp_path, half_server):
    server, _ = half_server
    (tmp_path / "body.json").write_text(json.dumps({"instances": [{"x": 1.0}]}))
    res = run_cli("loadtest", "--target", f"grpc://127.0.0.1:{server.grpc_port}", "--model", "half",
                  "--payload", str(tmp_path / "body.json"), "--rate", "50", "--duration", "2s", "--warmup", "0.5s",
                  "--slo", "p50<1us", "--out", str(tmp_path / "out"))
    assert res.returncode == 1, res.stdout + res.stderr
    step = json.loads((tmp_path / "out" / "results.json").read_text())["steps"][0]
    assert step["rate"] == 50 and step["errors"] == 0
    assert 70 <= step["requests"] <= 130  # the schedule held ~50 requests/s for 2 s
    assert step["slo_failures"] and "MISSED" in res.stdout


def test_the_generator_reads_tf_servings_messages_without_tensorflows_runtime():
    """The gRPC users' messages load as plain protobuf modules in the generator's process (no
    TensorFlow runtime, seconds of CPU in every step's process); asking that process for
    TensorFlow itself fails, naming why; where TensorFlow is imported, nothing changes."""
    import subprocess
    import sys

    code = """
import sys
from tfpipe.loadtest.serving_protos import without_tensorflow_runtime
assert without_tensorflow_runtime()
from tensorflow_serving.apis import (classification_pb2, inference_pb2, predict_pb2, prediction_service_pb2_grpc,
                                     regression_pb2)
request = predict_pb2.PredictRequest()
request.model_spec.name = "m"
request.inputs["x"].dtype = 1
request.inputs["x"].float_val.append(2.5)
example = classification_pb2.ClassificationRequest()
example.input.example_list.examples.add().features.feature["x"].float_list.value.append(1.0)
assert predict_pb2.PredictRequest.FromString(request.SerializeToString()).inputs["x"].float_val == [2.5]
assert classification_pb2.ClassificationRequest.FromString(example.SerializeToString()) == example
try:
    import tensorflow as tf
    tf.constant(1)
except AttributeError as e:
    print("refused:", e)
print(sorted(m for m in sys.modules if m.startswith("tensorflow.") and m.split(".")[1] != "core"))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    refused, loaded = out.stdout.splitlines()
    assert refused == ("refused: tensorflow.constant: this process loaded only TensorFlow's protobuf messages "
                       "(tfpipe.loadtest.serving_protos), not its runtime")
    assert loaded == "[]"  # tensorflow.python, the runtime, never came in
    import tensorflow as tf

    from tfpipe.loadtest.serving_protos import without_tensorflow_runtime

    assert without_tensorflow_runtime() is False and sys.modules["tensorflow"] is tf


def test_percentiles_match_an_injected_delay(tmp_path, delayed_endpoint):
    (tmp_path / "body.json").write_text(json.dumps({"instances": [1.0]}))
    res = run_cli("loadtest", "--target", f"http://127.0.0.1:{delayed_endpoint.port}", "--model", "slow",
                  "--payload", str(tmp_path / "body.json"), "--users", "2", "--duration", "2s", "--warmup", "0.5s",
                  "--out", str(tmp_path / "out"))
    assert res.returncode == 0, res.stdout + res.stderr
    step = json.loads((tmp_path / "out" / "results.json").read_text())["steps"][0]
    # p50 sits just above the 20 ms sleep; timings are kept at 10 us resolution at this
    # size (locust's own stats would round them to whole milliseconds).
    assert 20.0 <= step["p50_ms"] <= 24.0, step
    keys = step["histogram"]["us"]
    assert len(keys) > 10 and any(k % 1000 for k in keys)


def test_the_rest_users_http_client_reads_every_framing_and_times_the_answer():
    """loadtest/http_client.py against a raw HTTP/1.1 server: Content-Length, chunked and
    close-delimited answers, an error status, keep-alive across requests, a reconnect after
    the server closes, a malformed answer as an error; an answer held 30 ms is timed at
    30 ms and a bit, from the kernel's receive timestamps."""
    from tfpipe.loadtest.http_client import HttpError, TimedConnection, build_request

    answers = {
        b"/length": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
        b"/chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n4;x=1\r\ndefg\r\n0\r\n\r\n",
        b"/busy": b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 2\r\n\r\n{}",
        b"/close": b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nto the end",
        b"/garbage": b"SSH-2.0-OpenSSH\r\n\r\n",
    }
    connections = []

    async def handle(reader, writer):
        connections.append(1)
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:  # the client closed the connection
                writer.close()
                return
            path = head.split(b" ")[1]
            length = int(next(x.split(b":")[1] for x in head.split(b"\r\n") if x.lower().startswith(b"content-length")))
            await reader.readexactly(length)
            if path == b"/slow":
                await asyncio.sleep(0.030)
                path = b"/length"
            writer.write(answers[path])
            await writer.drain()
            if path in (b"/close", b"/garbage"):
                writer.close()
                return

    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", 0))
    port = server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    address = f"http://127.0.0.1:{port}"
    try:
        conn = TimedConnection(address, timeout=5)

        def post(path):
            return conn.request(build_request(address, "POST", path, b'{"instances": [1.0]}'))

        assert post("/length")[:2] == (200, 5)
        assert post("/chunked")[:2] == (200, 7)
        assert post("/busy")[:2] == (503, 2)
        assert len(connections) == 1  # one keep-alive connection so far
        assert post("/close")[:2] == (200, 10)
        assert post("/length")[:2] == (200, 5) and len(connections) == 2  # reopened
        assert conn.kernel_times  # Linux: answers timed by the kernel's receive timestamps
        status, size, seconds, _ = post("/slow")
        assert (status, size) == (200, 5) and 0.030 <= seconds < 0.060, seconds
        with pytest.raises(HttpError, match="not an HTTP/1.x answer"):
            post("/garbage")
        assert post("/length")[:2] == (200, 5)  # and the next request gets a fresh connection
        conn.close()
    finally:
        async def shut():  # on the loop's own thread: asyncio's Server is not thread-safe
            server.close()
            await server.wait_closed()

        asyncio.run_coroutine_threadsafe(shut(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


@pytest.mark.parametrize("args,message", [
    (["--target", "http://127.0.0.1:9", "--model", "half"], "cannot reach"),
    (["--target", "ftp://x", "--model", "half"], "--target must be"),
    (["--model", "nope"], "Servable not found"),
    (["--model", "half", "--signature", "nope"], "has no signature"),
    (["--model", "half", "--slo", "p99<fast"], "cannot parse SLO"),
    (["--model", "half", "--bad-body"], "rejects the payload"),
    (["--model", "half", "--expect-workers", "2"], "--expect-workers needs --master-bind"),
    (["--model", "half", "--workers", "0"], "--workers 0 leaves nobody"),
    (["--model", "half", "--master-bind", "0.0.0.0"], "--master-bind takes HOST:PORT"),
    (["--model", "half", "--out-holds-other-files"], "is not a tfpipe loadtest output"),
])
def test_bad_input_exits_2_before_any_load(tmp_path, half_server, args, message):
    server, _ = half_server
    body = {"instances": ["not a number"]} if "--bad-body" in args else {"instances": [1.0]}
    if "--out-holds-other-files" in args:  # --out is replaced whole: a stranger's directory is refused
        (tmp_path / "out").mkdir()
        (tmp_path / "out" / "notes.txt").write_text("mine")
    args = [a for a in args if a not in ("--bad-body", "--out-holds-other-files")]
    (tmp_path / "body.json").write_text(json.dumps(body))
    if "--target" not in args:
        args = ["--target", f"http://127.0.0.1:{server.rest_port}", *args]
    res = run_cli("loadtest", *args, "--payload", str(tmp_path / "body.json"), "--out", str(tmp_path / "out"))
    assert res.returncode == 2, res.stdout + res.stderr
    assert message in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "results.json").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.tmp-")] == []


@pytest.mark.long
def test_workers_here_and_from_another_machine_merge_into_one_result(tmp_path, half_server):
    """A master with one local worker process waits for a worker started the way another
    machine would (`tfpipe loadtest --worker --master HOST:PORT`); both run each step of the
    sweep, the worker reconnecting between steps, and the merged counts are the sum of
    what each worker reported."""
    import subprocess

    from conftest import spawn_cli

    server, _ = half_server
    (tmp_path / "body.json").write_text(json.dumps({"instances": [1.0]}))
    port = free_port()
    # forked from the CLI host, as the master is (a fresh interpreter only added its imports' seconds)
    worker = spawn_cli("loadtest", "--worker", "--master", f"127.0.0.1:{port}", "--workers", "1",
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        res = run_cli("loadtest", "--target", f"http://127.0.0.1:{server.rest_port}", "--model", "half",
                      "--payload", str(tmp_path / "body.json"), "--sweep", "2,4", "--workers", "1",
                      "--expect-workers", "1", "--master-bind", f"127.0.0.1:{port}", "--duration", "2s",
                      "--warmup", "1s", "--out", str(tmp_path / "out"))
        out, _ = worker.communicate(timeout=60)
    finally:
        worker.kill()
    assert res.returncode == 0, res.stdout + res.stderr
    assert worker.returncode == 0 and "the master ended the run" in out, out
    steps = json.loads((tmp_path / "out" / "results.json").read_text())["steps"]
    assert [s["users"] for s in steps] == [2, 4]
    for step in steps:
        assert step["errors"] == 0 and step["requests"] > 50 and step["workers"] == 2
        assert len(step["per_worker"]) == 2 and min(step["per_worker"].values()) > 0
        assert sum(step["per_worker"].values()) == step["requests"]
        # The merged histogram holds every answer the workers reported, second by second.
        assert sum(step["histogram"]["counts"]) == step["requests"] == sum(p["answered"] for p in step["series"])
        assert len(step["series"]) == 2


@pytest.mark.long
def test_baseline_web_ui_and_a_report_that_renders(tmp_path, half_server):
    """--model-path measures the SavedModel in-process first; --web serves locust's own UI and
    stats while a step runs; the report renders in headless Chromium without errors."""
    import time
    import urllib.request

    from browser import render
    from conftest import spawn_cli

    server, root = half_server
    (tmp_path / "body.json").write_text(json.dumps({"instances": [{"x": 1.0}, {"x": 3.0}]}))
    web_port = free_port()
    out = tmp_path / "out"
    # forked from the CLI host (a fresh interpreter only added its imports' seconds)
    proc = spawn_cli("loadtest", "--target", f"http://127.0.0.1:{server.rest_port}", "--model", "half",
                     "--payload", str(tmp_path / "body.json"), "--users", "2", "--duration", "3s", "--warmup", "0.5s",
                     "--model-path", str(root / "half"), "--web", "--web-port", str(web_port), "--out", str(out))
    seen = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None and not seen:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{web_port}/stats/requests", timeout=2) as r:
                stats = json.load(r)
            seen = next((s for s in stats["stats"] if s["name"] == "predict" and s["num_requests"] > 0), None)
        except OSError:
            time.sleep(0.1)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stdout + stderr
    assert seen is not None, "locust's web UI never showed the predict requests"
    results = json.loads((out / "results.json").read_text())
    base = results["baseline"]
    assert base["path"] == str(root / "half" / "1") and base["calls"] >= 20 and 0 < base["p50_ms"] <= base["p99_ms"]
    step = results["steps"][0]
    assert step["overhead_p50_ms"] == pytest.approx(step["p50_ms"] - base["p50_ms"], abs=1e-3)
    assert "in-process SavedModel baseline" in stdout and "serving overhead" in stdout

    page = render(str(out / "report.html"))
    assert page["errors"] == []
    assert page["svgs"] >= 3 and page["empty_svgs"] == 0
    assert "In-process SavedModel" in page["text"] and "Latency vs throughput" in page["text"]


def test_sigint_stops_cleanly_and_writes_the_partial_report(tmp_path, delayed_endpoint):
    """Ctrl-C in the first of two 60-second steps, once it has measured a second or more: the
    command exits 130 at once with the measured part of step 1 in results.json and the report."""
    import signal
    import time

    from conftest import spawn_cli

    (tmp_path / "body.json").write_text(json.dumps({"instances": [1.0]}))
    out = tmp_path / "out"
    before = delayed_endpoint.answered
    proc = spawn_cli("loadtest", "--target", f"http://127.0.0.1:{delayed_endpoint.port}", "--model", "slow",
                     "--payload", str(tmp_path / "body.json"), "--sweep", "1,2", "--duration", "60s",
                     "--warmup", "0.5s", "--out", str(out))
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    # one user, one answer every 20 ms and a bit: 120 answers are the warmup and over a second measured
    assert delayed_endpoint.wait_for(before + 120, timeout=60), "the load test's answers never came"
    started = time.monotonic()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130, proc.stderr.read()
    assert time.monotonic() - started < 30  # it stopped; it did not run the 60 s step out
    reader.join(timeout=10)
    results = json.loads((out / "results.json").read_text())
    assert results["interrupted"] is True
    assert [s["step"] for s in results["steps"]] == [1]  # step 2 never started
    step = results["steps"][0]
    assert step["requests"] > 0 and step["errors"] == 0 and 1 <= step["elapsed_s"] < 60
    assert sum(step["histogram"]["counts"]) == step["requests"]
    assert "Interrupted" in (out / "report.html").read_text()
    assert "partial: interrupted" in "".join(lines)
