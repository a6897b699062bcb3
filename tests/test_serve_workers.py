"""`tfpipe serve --workers N`: N processes on the same ports (SO_REUSEPORT), one Prometheus page for
all of them, workers started again when they die and given up when they keep dying, readiness as
the workers announce it, SIGTERM draining every worker; and the pure pieces (the metrics merge, the
checks)."""

from __future__ import annotations

import os
import re
import signal
import threading
import time

import psutil
import pytest
import requests

from conftest import start_cli_server

pytestmark = pytest.mark.xdist_group("serve_workers")


def _workers(proc) -> list[psutil.Process]:
    """The supervisor's worker processes: both up, since it prints its ports only once they serve."""
    workers = psutil.Process(proc.pid).children()
    assert len(workers) == 2, workers
    return workers


def _ready_pids(proc, after: int = 0) -> dict[int, int]:
    """Each worker's pid, as the supervisor last said it was ready ("worker i (pid P) ready")."""
    pids = {}
    for line in proc.output.lines[after:]:
        m = re.search(r"worker (\d+) \(pid (\d+)\) ready$", line)
        if m:
            pids[int(m[1])] = int(m[2])
    return pids


def _scrape(rest_port: int) -> str:
    return requests.get(f"http://127.0.0.1:{rest_port}/monitoring/prometheus/metrics", timeout=30).text


def _sample(page: str, series: str) -> float | None:
    """The value of one series (`name{labels}` as printed) on a Prometheus page."""
    m = re.search(rf"^{re.escape(series)} (\S+)$", page, re.M)
    return float(m[1]) if m else None


def _worker_states(page: str) -> dict[str, float]:
    """The page's worker states: how many in each, and each worker's readiness and restarts."""
    series = r"tfpipe_serving_workers\{[^}]*\}|tfpipe_serving_worker_(?:ready|restarts_total)\{[^}]*\}"
    return {m[1]: float(m[2]) for m in re.finditer(rf"^({series}) (\S+)$", page, re.M)}


def _requests_total(page: str) -> float:
    """The requests a page counts, every model, API and status together."""
    return sum(float(m[1]) for m in re.finditer(r"^tfpipe_serving_requests_total\{[^}]*\} (\S+)$", page, re.M))


def _file(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:  # not written yet
        return ""


def _answer_on_fresh_connections(rest_port: int, n: int) -> None:
    """n predicts, each on a connection of its own: the kernel deals them out to the workers."""
    for _ in range(n):
        with requests.Session() as s:
            assert s.post(f"http://127.0.0.1:{rest_port}/v1/models/half:predict", json={"instances": [2.0]},
                          timeout=30).json() == {"predictions": [3.0]}


def _health(grpc_port: int, *services: str) -> dict[str, str]:
    """The health service's answer for each name, on a fresh connection."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return {s: health_pb2.HealthCheckResponse.ServingStatus.Name(
                    stub.Check(health_pb2.HealthCheckRequest(service=s), timeout=30).status) for s in services}


@pytest.mark.parametrize("pages, want", [
    # counters and histograms sum; a model's versions are the same everywhere: the largest
    (["# TYPE a_total counter\ntfpipe_serving_requests_total{model=\"m\"} 3\ntfpipe_serving_loaded_versions 1\n",
      "tfpipe_serving_requests_total{model=\"m\"} 4\ntfpipe_serving_loaded_versions 1\n"],
     "# TYPE a_total counter\ntfpipe_serving_requests_total{model=\"m\"} 7\ntfpipe_serving_loaded_versions 1\n"),
    (["tfpipe_serving_batch_size_bucket{le=\"4\"} 2\ntfpipe_serving_batch_size_sum 5.5\n",
      "tfpipe_serving_batch_size_bucket{le=\"4\"} 1\ntfpipe_serving_batch_size_sum 0.25\n"],
     "tfpipe_serving_batch_size_bucket{le=\"4\"} 3\ntfpipe_serving_batch_size_sum 5.75\n"),
    # a series only one worker has (another model, another status) is kept as it is
    (["tfpipe_serving_requests_total{model=\"m\",status=\"OK\"} 2\n",
      "tfpipe_serving_requests_total{model=\"m\",status=\"NOT_FOUND\"} 1\nprocess_resident_memory_bytes 10\n"],
     "tfpipe_serving_requests_total{model=\"m\",status=\"OK\"} 2\n"
     "tfpipe_serving_requests_total{model=\"m\",status=\"NOT_FOUND\"} 1\nprocess_resident_memory_bytes 10\n"),
    # shadow traffic's counters and histogram sum; the candidate's version is the same everywhere
    (["tfpipe_serving_shadow_requests_total{model=\"m\",outcome=\"mirrored\"} 3\n"
      "tfpipe_serving_shadow_errors_total{model=\"m\",status=\"INTERNAL\"} 1\n"
      "tfpipe_serving_shadow_class_rows_total{model=\"m\"} 30\n"
      "tfpipe_serving_shadow_flipped_rows_total{model=\"m\"} 6\n"
      "tfpipe_serving_shadow_latency_seconds_bucket{model=\"m\",le=\"0.5\"} 3\n"
      "tfpipe_serving_shadow_candidate_version{model=\"m\"} 2\n",
      "tfpipe_serving_shadow_requests_total{model=\"m\",outcome=\"mirrored\"} 4\n"
      "tfpipe_serving_shadow_errors_total{model=\"m\",status=\"INTERNAL\"} 2\n"
      "tfpipe_serving_shadow_class_rows_total{model=\"m\"} 40\n"
      "tfpipe_serving_shadow_flipped_rows_total{model=\"m\"} 1\n"
      "tfpipe_serving_shadow_latency_seconds_bucket{model=\"m\",le=\"0.5\"} 4\n"
      "tfpipe_serving_shadow_candidate_version{model=\"m\"} 2\n"],
     "tfpipe_serving_shadow_requests_total{model=\"m\",outcome=\"mirrored\"} 7\n"
     "tfpipe_serving_shadow_errors_total{model=\"m\",status=\"INTERNAL\"} 3\n"
     "tfpipe_serving_shadow_class_rows_total{model=\"m\"} 70\ntfpipe_serving_shadow_flipped_rows_total{model=\"m\"} 7\n"
     "tfpipe_serving_shadow_latency_seconds_bucket{model=\"m\",le=\"0.5\"} 7\n"
     "tfpipe_serving_shadow_candidate_version{model=\"m\"} 2\n"),
])
def test_worker_metrics_merge_into_one_page(pages, want):
    from tfpipe.serve.prometheus import merge_prometheus

    assert merge_prometheus(pages) == want


PAGE = ("# HELP tfpipe_serving_requests_total Requests.\n# TYPE tfpipe_serving_requests_total counter\n"
        "tfpipe_serving_requests_total{model=\"m\"} 3\n"
        "# TYPE tfpipe_serving_batch_queue_depth gauge\ntfpipe_serving_batch_queue_depth 5\n"
        "# TYPE tfpipe_serving_batch_size histogram\ntfpipe_serving_batch_size_bucket{le=\"4\"} 2\n"
        "tfpipe_serving_batch_size_count 2\n# TYPE process_resident_memory_bytes gauge\n"
        "process_resident_memory_bytes 10\n")


def test_an_exited_workers_counters_stay_in_the_totals_and_its_gauges_go(tmp_path):
    """Two exits of worker 0 and one of worker 1: their counters and histograms add up in the
    retired page, which a scrape adds to the live workers'; queue depths and memory are dropped,
    and each exited worker's own page is gone (a starting worker shows no memory row)."""
    from tfpipe.serve.prometheus import counters_of
    from tfpipe.serve.worker_group import RETIRED_FILE, metrics_path, retire_metrics

    assert counters_of(PAGE) == ("# HELP tfpipe_serving_requests_total Requests.\n"
                                 "# TYPE tfpipe_serving_requests_total counter\n"
                                 "tfpipe_serving_requests_total{model=\"m\"} 3\n"
                                 "# TYPE tfpipe_serving_batch_size histogram\n"
                                 "tfpipe_serving_batch_size_bucket{le=\"4\"} 2\ntfpipe_serving_batch_size_count 2\n")
    for i in (0, 1, 0):
        (tmp_path / f"worker-{i}.prom").write_text(PAGE)
        retire_metrics(str(tmp_path), i)
        assert not (tmp_path / f"worker-{i}.prom").exists()
    retire_metrics(str(tmp_path), 1)  # no page (it exited before it wrote one): nothing changes
    retired = (tmp_path / RETIRED_FILE).read_text()
    assert 'tfpipe_serving_requests_total{model="m"} 9\n' in retired and "_count 6\n" in retired, retired
    assert "queue_depth" not in retired and "resident" not in retired, retired
    assert metrics_path(str(tmp_path), 3) == str(tmp_path / "worker-3.prom")


@pytest.mark.parametrize("flags, message", [
    ({"workers": 0}, "at least 1"),  # the supervisor's own check: the command line resolves 0 first
    ({"workers": -1}, "at least 1"),
    ({"workers": 2, "grpc_socket_path": "/tmp/x.sock"}, "Unix socket"),
])
def test_worker_options_that_cannot_work_are_refused(flags, message):
    from tfpipe.serve.errors import ServeError
    from tfpipe.serve.flags import ServeOptions
    from tfpipe.serve.workers import check

    with pytest.raises(ServeError, match=message):
        check(ServeOptions(**flags))


@pytest.mark.parametrize("flags, cores, want", [
    ({"workers": 0}, 8, 8),  # auto: one per core
    ({"workers": 0}, 1, 1),
    ({"workers": 3}, 8, 3),  # given: as given, whatever else is on
    ({"workers": 3, "enable_batching": True}, 8, 3),
    ({"workers": 0, "enable_batching": True}, 8, 1),  # batches fill per process: one unless asked
    ({"workers": 0, "grpc_socket_path": "/tmp/x.sock"}, 8, 1),  # a Unix socket is not shared
])
def test_the_worker_count_by_default_and_as_given(flags, cores, want):
    from tfpipe.serve.flags import ServeOptions
    from tfpipe.serve.workers import worker_count

    assert worker_count(ServeOptions(**flags), available=cores)[0] == want


@pytest.mark.parametrize("flags, cores, want", [
    ({"workers": 2}, 8, (4, 4)),  # TensorFlow's pools: a share of the cores each
    ({"workers": 3}, 2, (1, 1)),
    ({"workers": 2, "tensorflow_intra_op_parallelism": 6}, 8, (6, 0)),  # the command line's own setting wins
    ({"workers": 2, "tensorflow_session_parallelism": 5}, 8, (0, 0)),
])
def test_each_worker_gets_a_share_of_tensorflows_threads(flags, cores, want):
    from tfpipe.serve.flags import ServeOptions
    from tfpipe.serve.workers import worker_options

    child = worker_options(ServeOptions(port=8500, rest_api_port=8501, **flags), available=cores)
    assert (child.tensorflow_intra_op_parallelism, child.tensorflow_inter_op_parallelism, child.workers) == (*want, 1)


@pytest.mark.parametrize("exits, delay", [(1, 0.0), (2, 1.0), (3, 2.0), (4, None), (5, None)])
def test_a_worker_is_started_again_after_a_growing_backoff_then_given_up(exits, delay):
    from tfpipe.serve.workers import restart_delay

    assert restart_delay(exits) == delay


def test_the_workers_states_as_prometheus_shows_them():
    from tfpipe.serve.worker_group import worker_state_lines

    states = [{"worker": 0, "pid": 10, "state": "ready", "restarts": 0},
              {"worker": 1, "pid": 11, "state": "failed", "restarts": 3},
              {"worker": 2, "pid": None, "state": "starting", "restarts": 1}]
    samples = [line for line in worker_state_lines(states, 4) if not line.startswith("#")]
    assert samples == [  # worker 3 not written yet: starting
        'tfpipe_serving_workers{state="ready"} 1', 'tfpipe_serving_workers{state="starting"} 2',
        'tfpipe_serving_workers{state="failed"} 1',
        'tfpipe_serving_worker_ready{worker="0"} 1', 'tfpipe_serving_worker_ready{worker="1"} 0',
        'tfpipe_serving_worker_ready{worker="2"} 0', 'tfpipe_serving_worker_ready{worker="3"} 0',
        'tfpipe_serving_worker_restarts_total{worker="0"} 0', 'tfpipe_serving_worker_restarts_total{worker="1"} 3',
        'tfpipe_serving_worker_restarts_total{worker="2"} 1', 'tfpipe_serving_worker_restarts_total{worker="3"} 0']


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """Two workers serving `half` (y = x / 2 + 2) and `slow` (y = x + 1, some tenths of a second a
    batch), with batching, request logging, the health service and Prometheus: the server the tests
    below share, in their order (the last one stops it)."""
    from draining import BATCHING
    from serving_models import save_half, save_slow

    root = tmp_path_factory.mktemp("pair")
    save_half(str(root / "half" / "1"))
    save_slow(str(root / "slow" / "1"), seconds=0.3)
    (root / "models.config").write_text("model_config_list { " + " ".join(
        f'config {{ name: "{m}" base_path: "{root / m}" model_platform: "tensorflow" }}' for m in ("half", "slow"))
        + " }")
    (root / "monitoring.config").write_text("prometheus_config { enable: true }")
    (root / "batching.config").write_text(BATCHING)
    proc, grpc_port, rest_port = start_cli_server(
        "--workers=2", f"--model_config_file={root / 'models.config'}", "--file_system_poll_wait_seconds=0",
        f"--monitoring_config_file={root / 'monitoring.config'}", "--enable_grpc_healthcheck_service",
        "--enable_batching", f"--batching_parameters_file={root / 'batching.config'}",
        f"--request_log_prefix={root / 'logs' / 'all'}", "--rest_api_timeout_in_ms=60000")
    yield proc, grpc_port, rest_port
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=90)


def test_two_workers_share_the_ports_and_count_together(pair):
    """Two workers serve one REST and one gRPC port: 60 requests on fresh connections are spread
    over both (each worker holds some of the 50 REST connections), one scrape counts all 60, and
    shows both workers ready."""
    import grpc
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    proc, grpc_port, rest_port = pair
    series = 'tfpipe_serving_requests_total{model="half",api="predict",status="OK"}'
    before = _sample(_scrape(rest_port), series) or 0
    workers = _workers(proc)
    url = f"http://127.0.0.1:{rest_port}/v1/models/half:predict"
    sessions = [requests.Session() for _ in range(50)]  # a connection each: the kernel picks a worker for each
    try:
        for i, s in enumerate(sessions):
            r = s.post(url, json={"instances": [float(i)]}, timeout=30)
            assert r.status_code == 200 and r.json() == {"predictions": [0.5 * i + 2.0]}
        held = [len(_established(w, rest_port)) for w in workers]
    finally:
        for s in sessions:
            s.close()
    assert sum(held) == 50 and min(held) > 0, held  # both answered some (all on one: once in 2**49 runs)
    for i in range(10):
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            req = predict_pb2.PredictRequest()
            req.model_spec.name = "half"
            req.inputs["x"].dtype, req.inputs["x"].float_val[:] = 1, [float(i)]
            req.inputs["x"].tensor_shape.dim.add().size = 1
            out = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(req, timeout=30)
            assert list(out.outputs["y"].float_val) == [0.5 * i + 2.0]
    deadline = time.time() + 30
    while True:  # the other worker's metrics reach a scrape within half a second
        page = _scrape(rest_port)
        if (_sample(page, series) or 0) - before >= 60 or time.time() > deadline:
            break
        time.sleep(0.1)
    assert _sample(page, series) - before == 60, page  # 50 REST + 10 gRPC Predict, whichever worker answered
    assert _worker_states(page) == {
        'tfpipe_serving_workers{state="ready"}': 2, 'tfpipe_serving_workers{state="starting"}': 0,
        'tfpipe_serving_workers{state="failed"}': 0, 'tfpipe_serving_worker_ready{worker="0"}': 1,
        'tfpipe_serving_worker_ready{worker="1"}': 1, 'tfpipe_serving_worker_restarts_total{worker="0"}': 0,
        'tfpipe_serving_worker_restarts_total{worker="1"}': 0}, page
    rss = re.findall(r'tfpipe_serving_worker_resident_memory_bytes\{worker="(\d)"\} (\d+)', page)
    assert sorted(w for w, _ in rss) == ["0", "1"] and all(int(n) > 50e6 for _, n in rss)
    total = int(re.search(r"^process_resident_memory_bytes (\d+)$", page, re.M)[1])
    assert total == sum(int(n) for _, n in rss) or abs(total - sum(int(n) for _, n in rss)) < 50e6
    assert _health(grpc_port, "", "ModelService", "PredictionService", "tfpipe.worker.0", "tfpipe.worker.1") \
        == dict.fromkeys(("", "ModelService", "PredictionService", "tfpipe.worker.0", "tfpipe.worker.1"), "SERVING")


@pytest.mark.long
def test_a_killed_worker_is_started_again(pair):
    """SIGKILL one of two workers: while its replacement starts, the metrics show it starting and the
    health service NOT_SERVING for the server (the other worker answering); the supervisor says when
    the replacement is ready (what this test waits for: the worker's own readiness message, sent
    once its ports are bound and its models AVAILABLE), the metrics and health agree, and it serves."""
    proc, grpc_port, rest_port = pair
    pids = _ready_pids(proc)
    victim, other = 0, 1
    group = psutil.Process(pids[victim]).environ()["TFPIPE_SERVE_WORKERS_DIR"]
    counted = _requests_total(_scrape(rest_port)) + 40
    _answer_on_fresh_connections(rest_port, 40)  # both workers count some (all on one: 1 in 2**39 runs)
    deadline = time.monotonic() + 30
    # until each worker's own snapshot (written every 0.5 s) holds what it answered: what a worker
    # killed now leaves behind
    while sum(_requests_total(_file(os.path.join(group, f"worker-{i}.prom"))) for i in (victim, other)) < counted:
        assert time.monotonic() < deadline, "the workers' snapshots did not catch up"
        time.sleep(0.05)  # polls the files the workers write, with a deadline
    mark = proc.output.mark()
    psutil.Process(pids[victim]).kill()
    proc.output.wait_for(rf"worker {victim} \(pid {pids[victim]}\) exited with signal SIGKILL: starting it again$",
                         after=mark, timeout=60)
    # TensorFlow's import alone keeps the replacement from serving for seconds: it is starting now
    page = _scrape(rest_port)
    assert _sample(page, f'tfpipe_serving_worker_resident_memory_bytes{{worker="{victim}"}}') is None, page
    assert _requests_total(page) >= counted  # the dead worker's requests stay counted
    states = _worker_states(page)
    assert (states[f'tfpipe_serving_worker_ready{{worker="{victim}"}}'],
            states['tfpipe_serving_workers{state="starting"}'],
            states[f'tfpipe_serving_worker_restarts_total{{worker="{victim}"}}']) == (0, 1, 1), states
    assert _health(grpc_port, "", f"tfpipe.worker.{victim}", f"tfpipe.worker.{other}", "PredictionService") == {
        "": "NOT_SERVING", f"tfpipe.worker.{victim}": "NOT_SERVING", f"tfpipe.worker.{other}": "SERVING",
        "PredictionService": "SERVING"}
    (ready,) = proc.output.wait_for(rf"worker {victim} \(pid (\d+)\) ready$", after=mark, timeout=240)
    new = psutil.Process(int(ready[1]))
    deadline = time.monotonic() + 30
    while _sample(page := _scrape(rest_port), f'tfpipe_serving_worker_resident_memory_bytes{{worker="{victim}"}}') \
            is None:  # the new worker's first page, written within 0.5 s of its start
        assert time.monotonic() < deadline, "the new worker's metrics did not reach the page"
        time.sleep(0.05)  # polls the page the test reads next, with a deadline
    assert _requests_total(page) >= counted  # its fresh counts add to the dead one's, not replace them
    states = _worker_states(page)
    assert (states[f'tfpipe_serving_worker_ready{{worker="{victim}"}}'],
            states['tfpipe_serving_workers{state="ready"}']) == (1, 2), states
    assert _health(grpc_port, "", f"tfpipe.worker.{victim}") == {"": "SERVING", f"tfpipe.worker.{victim}": "SERVING"}
    sessions = [requests.Session() for _ in range(40)]  # connections reach both workers, the new one among them
    try:
        answers = [s.post(f"http://127.0.0.1:{rest_port}/v1/models/half:predict", json={"instances": [2.0]},
                          timeout=30).json() for s in sessions]
        held = len(_established(new, rest_port))
    finally:
        for s in sessions:
            s.close()
    assert answers == [{"predictions": [3.0]}] * 40 and held > 0, (answers, held)  # the new worker took some


@pytest.mark.long
def test_sigterm_lets_every_workers_in_flight_requests_finish(pair):
    """SIGTERM to the supervisor with requests in flight on both APIs in both workers (slow batched
    calls, REST bodies still coming in, large requests being read, keep-alive and pipelining
    connections): every request sent before the signal is answered OK, then every worker and the
    supervisor exit 0."""
    from draining import DrainLoad

    proc, grpc_port, rest_port = pair
    workers = _workers(proc)
    load = DrainLoad(grpc_port, rest_port, "slow", grpc_callers=8)
    load.start()
    # 16 connections, a worker picked for each: both hold some (all on one: 1 in 32,768 runs)
    held = [len(_established(w, rest_port)) + len(_established(w, grpc_port)) for w in workers]
    mark = proc.output.mark()
    load.signal(proc)
    proc.output.wait_for(r"^\[worker \d\] shutting down", after=mark, count=2)
    load.release.set()  # the uploads' last bytes come while the workers drain
    code = load.finish(proc)
    assert load.lost() == []
    assert code == 0
    assert min(held) > 0, held
    kinds = {kind: sum(k == kind and o == "OK" for k, _, _, o in load.results) for kind in ("upload", "large")}
    assert kinds == {"upload": 3, "large": 3} and load.in_flight().get("grpc", 0) >= 1, (kinds, load.in_flight())
    assert not [line for line in proc.output.lines if "cut off" in line or "killed" in line]
    assert not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)


def _half_predict(port: int, name: str, x: float):
    """A gRPC Predict of a half model (y = x / 2 + b) on a fresh connection: the kernel picks a
    worker per connection."""
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return _half_call(channel, name, x)


def _half_call(channel, name: str, x: float):
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    req = predict_pb2.PredictRequest()
    req.model_spec.name = name
    req.inputs["x"].dtype, req.inputs["x"].float_val[:] = 1, [x]
    req.inputs["x"].tensor_shape.dim.add().size = 1
    return prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(req, timeout=30)


def _established(worker, port: int) -> list:
    """The client connections `worker` (a psutil.Process) holds on its listening `port`."""
    import psutil

    return [c for c in worker.net_connections(kind="tcp") if c.status == psutil.CONN_ESTABLISHED
            and c.laddr.port == port]


def _predict_on(channel, name: str) -> float:
    """Predict x=2 of model `name` on an open channel: y."""
    return _half_call(channel, name, 2.0).outputs["y"].float_val[0]


def _predict(port: int, x: float):
    """Model half's (version that answered, y)."""
    out = _half_predict(port, "half", x)
    return out.model_spec.version.value, out.outputs["y"].float_val[0]


def _status(port: int) -> list[tuple[int, str]]:
    import grpc
    from tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        req = get_model_status_pb2.GetModelStatusRequest()
        req.model_spec.name = "half"
        out = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(req, timeout=30)
        return sorted((v.version, get_model_status_pb2.ModelVersionStatus.State.Name(v.state))
                      for v in out.model_version_status)


@pytest.mark.long
def test_two_workers_move_to_a_new_version_together_and_log_every_request_once(tmp_path):
    """Version 2 published under a served base path: every worker loads it and drops version 1
    (status agrees whichever worker answers); after that, no answer comes from version 1. Each
    request, whichever worker took it, is in the request log exactly once."""
    from serving_models import publish, save_half

    from tfpipe.prediction_logs import iter_logs, read_log

    save_half(str(tmp_path / "half" / "1"), b=2.0)
    prefix = str(tmp_path / "logs" / "half")
    proc, grpc_port, _ = start_cli_server("--workers=2", "--model_name=half", f"--model_base_path={tmp_path / 'half'}",
                                          "--file_system_poll_wait_seconds=1", f"--request_log_prefix={prefix}")
    sent = []
    try:
        for i in range(20):
            sent.append(float(i))
            assert _predict(grpc_port, float(i)) == (1, 0.5 * i + 2.0)
        save_half(str(tmp_path / "v2"), b=3.0)
        publish(str(tmp_path / "v2"), str(tmp_path / "half" / "2"))
        def switched(states) -> bool:  # version 2 serves, version 1 is gone (END, or no longer listed)
            return dict(states).get(2) == "AVAILABLE" and dict(states).get(1, "END") == "END"

        deadline = time.time() + 60
        # The switch: every worker has moved. A connection reaches either worker, so a worker still
        # loading version 2 goes unseen by n calls one time in 2**n: with 8, a lagging worker on a busy
        # machine was missed (the check below then found it); with 32, one in four billion.
        while time.time() < deadline:
            if all(switched(_status(grpc_port)) for _ in range(32)):
                break
            time.sleep(0.3)
        states = {tuple(_status(grpc_port)) for _ in range(12)}
        assert len(states) == 1 and switched(next(iter(states))), states  # status agrees across workers
        for i in range(20, 50):
            sent.append(float(i))
            assert _predict(grpc_port, float(i)) == (2, 0.5 * i + 3.0)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0
    logged = sorted(lg.predict_log.request.inputs["x"].float_val[0]
                    for lg, _ in iter_logs(read_log(prefix).records) if lg.WhichOneof("log_type") == "predict_log")
    assert logged == sorted(sent)  # none lost, none twice, across both workers' files


def _predict_model(port: int, name: str) -> tuple[str, float] | tuple[str, str]:
    """Predict x=2 of model `name`: ("ok", y) or (status code name, details)."""
    import grpc

    try:
        return "ok", _half_predict(port, name, 2.0).outputs["y"].float_val[0]
    except grpc.RpcError as e:
        return e.code().name, e.details()


@pytest.mark.long
def test_a_reloaded_model_config_reaches_every_worker_before_the_answer(tmp_path):
    """HandleReloadConfigRequest reaches one worker; once it answers OK, the model it adds serves from
    every worker (16 fresh connections, none NOT_FOUND), and a worker killed afterwards comes back
    with the reloaded config, not the command line's, before it opens its ports."""
    import grpc
    from serving_models import save_half
    from tensorflow_serving.apis import model_management_pb2, model_service_pb2_grpc
    from tensorflow_serving.config import model_server_config_pb2

    save_half(str(tmp_path / "half" / "1"), b=2.0)
    save_half(str(tmp_path / "other" / "1"), b=5.0)
    (tmp_path / "models.config").write_text(
        f'model_config_list {{ config {{ name: "half" base_path: "{tmp_path / "half"}" model_platform: '
        '"tensorflow" } }')
    proc, grpc_port, _ = start_cli_server("--workers=2", f"--model_config_file={tmp_path / 'models.config'}",
                                          "--file_system_poll_wait_seconds=1")
    try:
        assert {_predict_model(grpc_port, "other")[0] for _ in range(8)} == {"NOT_FOUND"}
        config = model_server_config_pb2.ModelServerConfig()
        for name in ("half", "other"):
            config.model_config_list.config.add(name=name, base_path=str(tmp_path / name),
                                                model_platform="tensorflow")
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            reply = model_service_pb2_grpc.ModelServiceStub(channel).HandleReloadConfigRequest(
                model_management_pb2.ReloadConfigRequest(config=config), timeout=120)
        assert reply.status.error_code == 0
        assert [_predict_model(grpc_port, "other") for _ in range(16)] == [("ok", 6.0)] * 16

        (victim, pid), mark = min(_ready_pids(proc).items()), proc.output.mark()
        psutil.Process(pid).kill()
        (ready,) = proc.output.wait_for(rf"worker {victim} \(pid (\d+)\) ready$", after=mark, timeout=240)
        new = psutil.Process(int(ready[1]))  # its replacement, which has said it serves
        # 24 connections held open, one answered Predict each: the new worker holds some of them (each
        # connection goes to either worker, so all 24 to the old one would come once in 2**24 runs)
        channels = [grpc.insecure_channel(f"127.0.0.1:{grpc_port}", options=[("grpc.use_local_subchannel_pool", 1)])
                    for _ in range(24)]  # a connection each: channels to one address share one otherwise
        try:
            answers = [_predict_on(channel, "other") for channel in channels]
            held = _established(new, grpc_port)
        finally:
            for channel in channels:
                channel.close()
        assert answers == [6.0] * 24 and held, "the new worker answered none of 24 connections"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0


def _kill_until_given_up(proc, index: int, pid: int, seen: set[int]) -> None:
    """Kill worker `index` (pid `pid`, serving), then each process the supervisor starts in its place
    as soon as it appears, until the supervisor gives up on it."""
    mark = proc.output.mark()
    psutil.Process(pid).kill()
    seen.add(pid)
    sup, deadline = psutil.Process(proc.pid), time.time() + 120
    while not any(re.search(rf"worker {index} \(pid \d+\) .*giving up on it", line)
                  for line in proc.output.lines[mark:]):
        for child in sup.children():
            if child.pid not in seen:
                seen.add(child.pid)
                child.kill()
        assert time.time() < deadline and proc.poll() is None, proc.output.lines[mark:]
        time.sleep(0.02)  # polls the supervisor's children for the next replacement


def _held_by(worker, port: int, connect) -> object:
    """A client connection (from `connect()`, which opens one and answers a request on it) that
    `worker` holds: the kernel picks a worker for each, so a few tries find one."""
    for _ in range(40):
        client = connect()
        if _established(worker, port):
            return client
        client.close()
    raise AssertionError(f"none of 40 connections reached worker {worker.pid}")


@pytest.mark.long
def test_a_worker_that_keeps_crashing_is_given_up_while_the_other_serves(tmp_path):
    """Worker 0 crashes again and again (killed while serving, then each replacement as it starts):
    it is started again after a growing backoff, then given up on at its 4th exit in a row, said in
    the log; worker 1 answers on its connections throughout; the metrics show one ready and one
    failed worker, the health service NOT_SERVING for the server and SERVING for worker 1. Only when
    worker 1 has gone the same way does the supervisor exit, 1, saying that no worker is left."""
    import grpc
    from serving_models import save_half

    save_half(str(tmp_path / "half" / "1"))
    (tmp_path / "monitoring.config").write_text("prometheus_config { enable: true }")
    proc, grpc_port, rest_port = start_cli_server(
        "--workers=2", "--model_name=half", f"--model_base_path={tmp_path / 'half'}",
        "--file_system_poll_wait_seconds=0", "--enable_grpc_healthcheck_service",
        f"--monitoring_config_file={tmp_path / 'monitoring.config'}")
    try:
        pids = _ready_pids(proc)
        healthy = psutil.Process(pids[1])

        def rest_connection():
            s = requests.Session()
            s.post(f"http://127.0.0.1:{rest_port}/v1/models/half:predict", json={"instances": [1.0]}, timeout=30)
            return s

        def grpc_connection():
            channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}", options=[("grpc.use_local_subchannel_pool", 1)])
            _predict_on(channel, "half")
            return channel

        session, channel = _held_by(healthy, rest_port, rest_connection), _held_by(healthy, grpc_port, grpc_connection)
        answers, failures, done = [], [], threading.Event()

        def use_them():  # worker 1's connections, all along
            while not done.is_set():
                try:
                    r = session.post(f"http://127.0.0.1:{rest_port}/v1/models/half:predict", json={"instances": [2.0]},
                                     timeout=30)
                    answers.append((r.status_code, r.json(), _predict_on(channel, "half")))
                except (requests.RequestException, grpc.RpcError) as e:
                    failures.append(repr(e))
        user = threading.Thread(target=use_them)
        user.start()
        seen = set(pids.values())
        try:
            _kill_until_given_up(proc, 0, pids[0], seen)
        finally:
            done.set()
            user.join(timeout=60)
        assert not failures and answers and set(map(str, answers)) == {str((200, {"predictions": [3.0]}, 3.0))}, \
            (failures[:3], len(answers))
        log = "\n".join(proc.output.lines)
        for line in ["worker 0 (pid {}) exited with signal SIGKILL: starting it again",
                     "exited with signal SIGKILL: starting it again in 1 s (2nd exit in a row)",
                     "exited with signal SIGKILL: starting it again in 2 s (3rd exit in a row)",
                     "exited with signal SIGKILL, its 4th exit in a row without serving 60 s: giving up on it; "
                     "1 of 2 workers left"]:
            assert line.format(pids[0]) in log, log
        states = _worker_states(_scrape(rest_port))
        assert (states['tfpipe_serving_workers{state="ready"}'], states['tfpipe_serving_workers{state="failed"}'],
                states['tfpipe_serving_worker_ready{worker="0"}'], states['tfpipe_serving_worker_ready{worker="1"}'],
                states['tfpipe_serving_worker_restarts_total{worker="0"}']) == (1, 1, 0, 1, 3), states
        assert _health(grpc_port, "", "tfpipe.worker.0", "tfpipe.worker.1", "PredictionService") == {
            "": "NOT_SERVING", "tfpipe.worker.0": "NOT_SERVING", "tfpipe.worker.1": "SERVING",
            "PredictionService": "SERVING"}
        assert proc.poll() is None  # one worker left: the server goes on
        session.close()
        channel.close()

        mark = proc.output.mark()
        _kill_until_given_up(proc, 1, pids[1], seen)
        proc.output.wait_for(r"giving up on it; 0 of 2 workers left$", after=mark, timeout=60)
        proc.output.wait_for(r"^no worker left: stopping \(exit code 1\)$", after=mark, timeout=60)
        assert proc.wait(timeout=60) == 1
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_group_directory_left_by_a_killed_supervisor_is_removed_by_the_next(tmp_path, monkeypatch):
    """A supervisor killed with SIGKILL leaves its group's directory (tfpipe-serve-workers-PID-...) in
    the temporary directory; the next supervisor to start removes it, and keeps the one of a
    supervisor still running (here: this process)."""
    import subprocess
    import sys
    import tempfile

    from tfpipe.serve.flags import ServeOptions
    from tfpipe.serve.worker_group import GROUP_PREFIX
    from tfpipe.serve.workers import Supervisor

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f"{GROUP_PREFIX}{int(gone.stdout)}-abc"
    live = tmp_path / f"{GROUP_PREFIX}{os.getpid()}-def"
    for folder in (stale, live):
        (folder / "metrics").mkdir(parents=True)
    supervisor = Supervisor(ServeOptions(workers=2, port=0, rest_api_port=0), log=lambda _: None)
    assert not stale.exists() and live.exists()
    assert supervisor.dir.startswith(str(tmp_path / f"{GROUP_PREFIX}{os.getpid()}-"))
