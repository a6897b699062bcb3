"""`tfpipe serve --workers N`: N processes on the same ports (SO_REUSEPORT), one Prometheus page for
all of them, SIGTERM draining every worker; and the pure pieces (the metrics merge, the checks)."""

from __future__ import annotations

import re
import signal
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
])
def test_worker_metrics_merge_into_one_page(pages, want):
    from tfpipe.serve.workers import merge_prometheus

    assert merge_prometheus(pages) == want


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


def test_two_workers_share_the_ports_count_together_and_drain_on_sigterm(tmp_path):
    """Two workers serve one REST and one gRPC port: 60 requests on fresh connections are spread
    over both (each worker holds some of the 50 REST connections), one scrape counts all 60, and
    SIGTERM to the supervisor stops every worker and exits 0."""
    import grpc
    from serving_models import save_half
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    save_half(str(tmp_path / "half" / "1"))
    (tmp_path / "monitoring.config").write_text("prometheus_config { enable: true }")
    proc, grpc_port, rest_port = start_cli_server(
        "--workers=2", "--model_name=half", f"--model_base_path={tmp_path / 'half'}",
        f"--monitoring_config_file={tmp_path / 'monitoring.config'}", "--file_system_poll_wait_seconds=0")
    try:
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
        time.sleep(1.2)  # the other worker's metrics are at most half a second old
        page = requests.get(f"http://127.0.0.1:{rest_port}/monitoring/prometheus/metrics", timeout=30).text
        rest_ok = re.search(r'tfpipe_serving_requests_total\{model="half",api="predict",status="OK"\} (\d+)', page)
        assert rest_ok and int(rest_ok[1]) == 60, page  # 50 REST + 10 gRPC Predict, whichever worker answered
        assert "tfpipe_serving_workers 2" in page
        rss = re.findall(r'tfpipe_serving_worker_resident_memory_bytes\{worker="(\d)"\} (\d+)', page)
        assert sorted(w for w, _ in rss) == ["0", "1"] and all(int(n) > 50e6 for _, n in rss)
        total = int(re.search(r"^process_resident_memory_bytes (\d+)$", page, re.M)[1])
        assert total == sum(int(n) for _, n in rss) or abs(total - sum(int(n) for _, n in rss)) < 50e6
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=90)
    assert code == 0
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
        while time.time() < deadline:  # the switch: every worker (whichever a connection reaches) has moved
            if all(switched(_status(grpc_port)) for _ in range(8)):
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

        old = {w.pid for w in _workers(proc)}
        psutil.Process(min(old)).kill()
        deadline, new = time.time() + 120, None
        while new is None and time.time() < deadline:  # the replacement, once it listens on the gRPC port
            for c in psutil.Process(proc.pid).children():
                try:
                    if c.pid not in old and any(s.status == psutil.CONN_LISTEN and s.laddr.port == grpc_port
                                                for s in c.net_connections(kind="tcp")):
                        new = c
                except psutil.NoSuchProcess:
                    pass
            time.sleep(0.2)
        assert new is not None, "no worker took the killed one's place"
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


def test_a_killed_worker_is_started_again(tmp_path):
    """SIGKILL one of two workers: the supervisor starts another in its place, which serves."""
    from serving_models import save_half

    save_half(str(tmp_path / "half" / "1"))
    proc, _, rest_port = start_cli_server("--workers=2", "--model_name=half", f"--model_base_path={tmp_path / 'half'}",
                                          "--file_system_poll_wait_seconds=0")
    try:
        sup = psutil.Process(proc.pid)
        workers = _workers(proc)
        victim = workers[0]
        victim.kill()
        deadline = time.time() + 90
        while time.time() < deadline:
            alive = []
            for c in sup.children():
                try:
                    if c.pid != victim.pid and c.status() != psutil.STATUS_ZOMBIE:
                        alive.append(c)
                except psutil.NoSuchProcess:
                    pass
            if len(alive) == 2:
                break
            time.sleep(0.3)
        assert len(alive) == 2, alive
        (new,) = [c for c in alive if c.pid not in {w.pid for w in workers}]
        # A worker opens its ports once its models are loaded (as tensorflow_model_server does):
        # wait for the new one's REST listener, which takes TensorFlow's import and the model load
        # (seconds to tens of seconds on a busy machine), rather than for a fixed time.
        while not any(c.status == psutil.CONN_LISTEN and c.laddr.port == rest_port
                      for c in new.net_connections(kind="tcp")):
            assert time.time() < deadline + 60, "the new worker never listened on the REST port"
            time.sleep(0.2)
        sessions = [requests.Session() for _ in range(40)]  # connections reach both workers, the new one among them
        try:
            answered = 0
            for s in sessions:
                try:
                    r = s.post(f"http://127.0.0.1:{rest_port}/v1/models/half:predict", json={"instances": [2.0]},
                               timeout=30)
                    answered += r.status_code == 200
                except requests.ConnectionError:
                    pass
            held = len(_established(new, rest_port))
        finally:
            for s in sessions:
                s.close()
        assert answered == 40 and held > 0, (answered, held)  # the new worker took some of them
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0


def test_sigterm_lets_every_workers_in_flight_requests_finish(tmp_path):
    """Slow calls in flight on both workers (12 new connections: all on one worker 1 time in 2,048)
    when the supervisor gets SIGTERM: every one is answered 200, then the supervisor exits 0."""
    import threading

    from serving_models import save_slow

    save_slow(str(tmp_path / "slow" / "1"), steps=100000)  # over half a second per call
    proc, _, rest_port = start_cli_server("--workers=2", "--model_name=slow", f"--model_base_path={tmp_path / 'slow'}",
                                          "--file_system_poll_wait_seconds=0", "--enable_model_warmup=false")
    answers: list[int] = []

    def call():
        with requests.Session() as s:
            answers.append(s.post(f"http://127.0.0.1:{rest_port}/v1/models/slow:predict", json={"instances": [1.0]},
                                  timeout=60).status_code)

    workers = _workers(proc)
    before = [w.cpu_times().user + w.cpu_times().system for w in workers]
    callers = [threading.Thread(target=call) for _ in range(12)]
    for t in callers:
        t.start()
    time.sleep(0.8)  # the calls are running in the workers: both are busy
    busy = [w.cpu_times().user + w.cpu_times().system - b for w, b in zip(workers, before)]
    proc.send_signal(signal.SIGTERM)
    for t in callers:
        t.join(timeout=90)
    assert proc.wait(timeout=90) == 0
    assert answers == [200] * 12
    assert len(busy) == 2 and min(busy) > 0.1, busy
