"""Request logging: TF Serving's logging_config with tfpipe's `tfrecord` collector. Records
written by a real embedded server for every API, over REST and gRPC, read back as the
official tensorflow.serving.PredictionLog."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
import requests

pytestmark = pytest.mark.xdist_group("request_log")


def _opts(**kw):
    from tfpipe.serve.flags import ServeOptions

    return ServeOptions(host="127.0.0.1", port=-1, rest_api_port=-1, file_system_poll_wait_seconds=0, **kw)


def _logging(prefix: str, rate: float, kind: str = "tfrecord") -> str:
    return (f'logging_config {{ log_collector_config {{ type: "{kind}" filename_prefix: "{prefix}" }} '
            f'sampling_config {{ sampling_rate: {rate} }} }}')


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """A server with copies of TF Serving's half_plus_two (TF1: predict, classify and regress
    signatures): `full` logs every request, `tenth` one in ten, `paced` every request (for the
    replay test alone), `quiet` none."""
    from serving_models import save_half_plus_two_tf1

    from tfpipe.serve.server import ServerThread

    root = tmp_path_factory.mktemp("request_log")
    for name in ("full", "tenth", "paced", "quiet"):
        save_half_plus_two_tf1(str(root / name / "1"))
    models = "".join(f'  config {{ name: "{name}" base_path: "{root / name}" model_platform: "tensorflow" '
                     f'{_logging(root / "logs" / name, rate) if rate else ""} }}\n'
                     for name, rate in (("full", 1.0), ("tenth", 0.1), ("paced", 1.0), ("quiet", None)))
    (root / "models.config").write_text(f"model_config_list {{\n{models}}}")
    (root / "monitoring.config").write_text('prometheus_config { enable: true path: "/monitoring/prometheus/metrics" }')
    opts = _opts(model_config_file=str(root / "models.config"), monitoring_config_file=str(root / "monitoring.config"))
    with ServerThread(opts) as s:
        s.root = root
        s.url = f"http://127.0.0.1:{s.rest_port}"
        channel = grpc.insecure_channel(f"127.0.0.1:{s.grpc_port}")
        from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

        s.stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        s.models = model_service_pb2_grpc.ModelServiceStub(channel)
        yield s
        channel.close()


def _example(x: float):
    import tensorflow as tf

    ex = tf.train.Example()
    ex.features.feature["x"].float_list.value.append(x)
    return ex


def _counter(url: str, path: str, model: str, status: str) -> float:
    """tfpipe_serving_request_log_records_total{model, status} on the server's metrics page (0 if absent)."""
    text = requests.get(f"{url}{path}", timeout=10).text
    line = f'tfpipe_serving_request_log_records_total{{model="{model}",status="{status}"}} '
    return sum(float(x[len(line):]) for x in text.splitlines() if x.startswith(line))


def _records(prefix) -> list:
    from tfpipe.prediction_logs import iter_logs, read_log

    return list(iter_logs(read_log(str(prefix)).records))


def test_every_api_over_rest_and_grpc_is_logged_as_the_prediction_log_of_what_was_sent(logged):
    import tensorflow as tf
    from tensorflow_serving.apis import classification_pb2, inference_pb2, predict_pb2, regression_pb2

    before = len(_records(logged.root / "logs" / "full"))
    t_start = time.time()
    predict = predict_pb2.PredictRequest()
    predict.model_spec.name = "full"
    predict.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([[1.0], [3.0]], np.float32)))
    grpc_predict = logged.stub.Predict(predict, 10)
    classify = classification_pb2.ClassificationRequest()
    classify.model_spec.name, classify.model_spec.signature_name = "full", "classify_x_to_y"
    classify.input.example_list.examples.extend([_example(4.0)])
    grpc_classify = logged.stub.Classify(classify, 10)
    regress = regression_pb2.RegressionRequest()
    regress.model_spec.name, regress.model_spec.signature_name = "full", "regress_x_to_y"
    regress.input.example_list.examples.extend([_example(6.0), _example(8.0)])
    grpc_regress = logged.stub.Regress(regress, 10)
    multi = inference_pb2.MultiInferenceRequest()
    for sig, method in [("classify_x_to_y", "tensorflow/serving/classify"),
                        ("regress_x_to_y2", "tensorflow/serving/regress")]:
        task = multi.tasks.add()
        task.model_spec.name, task.model_spec.signature_name, task.method_name = "full", sig, method
    multi.input.example_list.examples.extend([_example(10.0)])
    logged.stub.MultiInference(multi, 10)
    rest_rows = requests.post(f"{logged.url}/v1/models/full:predict", json={"instances": [[2.0]]}, timeout=10).json()
    rest_cols = requests.post(f"{logged.url}/v1/models/full/versions/1:predict", json={"inputs": {"x": [[5.0]]}},
                              timeout=10).json()
    rest_classify = requests.post(f"{logged.url}/v1/models/full:classify", timeout=10, json={
        "signature_name": "classify_x_to_y", "examples": [{"x": 12.0}]}).json()
    rest_regress = requests.post(f"{logged.url}/v1/models/full:regress", timeout=10, json={
        "signature_name": "regress_x_to_y", "context": {"x2": 1.0}, "examples": [{"x": 14.0}]}).json()
    # a request that fails is answered and not logged
    bad = requests.post(f"{logged.url}/v1/models/full:predict", json={"instances": [["x"]]}, timeout=10)
    assert bad.status_code == 400
    logged.request_logs.flush()

    logs = _records(logged.root / "logs" / "full")[before:]
    got = [(t.protocol, t.api, log.WhichOneof("log_type")) for log, t in logs]
    assert got == [("grpc", "predict", "predict_log"), ("grpc", "classify", "classify_log"),
                   ("grpc", "regress", "regress_log"), ("grpc", "multi_inference", "multi_inference_log"),
                   ("rest", "predict", "predict_log"), ("rest", "predict", "predict_log"),
                   ("rest", "classify", "classify_log"), ("rest", "regress", "regress_log")]
    for log, t in logs:
        meta = log.log_metadata
        assert (meta.model_spec.name, meta.model_spec.version.value) == ("full", 1)
        assert list(meta.saved_model_tags) == ["serve"] and meta.sampling_config.sampling_rate == 1.0
        assert t_start - 1 <= t.start_unix_nanos / 1e9 <= time.time()
        assert meta.timestamp_secs == t.start_unix_nanos // 10**9
        assert 0 < t.latency_nanos < 10 * 10**9
    # gRPC: the very messages sent and received
    assert logs[0][0].predict_log.request == predict and logs[0][0].predict_log.response == grpc_predict
    assert logs[1][0].classify_log.request == classify and logs[1][0].classify_log.response == grpc_classify
    assert logs[2][0].regress_log.request == regress and logs[2][0].regress_log.response == grpc_regress
    assert logs[3][0].multi_inference_log.request == multi
    assert logs[0][0].log_metadata.model_spec.signature_name == "serving_default"
    assert logs[1][0].log_metadata.model_spec.signature_name == "classify_x_to_y"
    # REST: the JSON as the messages TF Serving turns it into, and how the body was laid out
    rows, cols = logs[4][0].predict_log, logs[5][0].predict_log
    assert tf.make_ndarray(rows.request.inputs["x"]).tolist() == [[2.0]]
    assert tf.make_ndarray(rows.response.outputs["y"]).tolist() == rest_rows["predictions"]
    assert (logs[4][1].rest_format, logs[5][1].rest_format) == ("instances", "inputs")
    assert cols.request.model_spec.version.value == 1 and tf.make_ndarray(cols.request.inputs["x"]).tolist() == [[5.0]]
    assert tf.make_ndarray(cols.response.outputs["y"]).tolist() == rest_cols["outputs"]
    rc, rr = logs[6][0].classify_log, logs[7][0].regress_log
    assert rc.request.input.example_list.examples[0] == _example(12.0)
    assert rc.response.result.classifications[0].classes[0].score == pytest.approx(rest_classify["results"][0][0][1])
    x2 = rr.request.input.example_list.examples[0].features.feature
    assert x2["x"].float_list.value[0] == 14.0 and x2["x2"].float_list.value[0] == 1.0  # context merged in
    assert [r.value for r in rr.response.result.regressions] == pytest.approx(rest_regress["results"])


def test_a_sampling_rate_of_a_tenth_logs_about_a_tenth(logged):
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    before = len(_records(logged.root / "logs" / "tenth"))
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "tenth"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([[1.0]], np.float32)))
    n = 400
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: logged.stub.Predict(request, 10), range(n)))
    logged.request_logs.flush()
    got = len(_records(logged.root / "logs" / "tenth")) - before
    # binomial(400, 0.1): mean 40, sd 6; four sd either side
    assert 16 <= got <= 64, got
    assert _counter(logged.url, "/monitoring/prometheus/metrics", "tenth", "written") >= got


def test_a_full_log_queue_drops_records_and_no_request_waits_or_fails(tmp_path):
    """The writer is held (as a stalled disk would hold it): requests still answer at once,
    the records past the queue's room are dropped and counted, the rest are written."""
    from serving_models import save_half

    from tfpipe.serve import request_log
    from tfpipe.serve.server import ServerThread

    save_half(str(tmp_path / "half" / "1"))
    (tmp_path / "monitoring.config").write_text('prometheus_config { enable: true path: "/metrics" }')
    opts = _opts(model_name="half", model_base_path=str(tmp_path / "half"),
                 request_log_prefix=str(tmp_path / "logs" / "half"), request_log_queue_size=4,
                 monitoring_config_file=str(tmp_path / "monitoring.config"))
    gate = threading.Event()
    real_write = request_log.TFRecordCollector._write_batch

    def stalled_write(self, entries):
        gate.wait(30)
        real_write(self, entries)

    request_log.TFRecordCollector._write_batch = stalled_write
    try:
        with ServerThread(opts) as s:
            url = f"http://127.0.0.1:{s.rest_port}"
            times = []
            for i in range(40):
                t0 = time.perf_counter()
                r = requests.post(f"{url}/v1/models/half:predict", json={"instances": [float(i)]}, timeout=10)
                times.append(time.perf_counter() - t0)
                assert r.status_code == 200 and r.json()["predictions"] == [i / 2 + 2]
            assert max(times) < 5
            dropped = _counter(url, "/metrics", "half", "dropped")
            page = requests.get(f"{url}/metrics", timeout=10).text
            assert "tfpipe_serving_request_log_queue_depth 4\n" in page  # full, and nothing blocked on it
            # what the held writer took before it stalled (one gathering of entries), the 4 queued, the rest dropped
            assert 10 <= dropped <= 40 - 4 - 1
            gate.set()
            s.request_logs.flush()
            written = _counter(url, "/metrics", "half", "written")
            assert written + dropped == 40
            assert len(_records(tmp_path / "logs" / "half")) == written
    finally:
        request_log.TFRecordCollector._write_batch = real_write


def _x(log) -> float:
    import tensorflow as tf

    return float(tf.make_ndarray(log.predict_log.request.inputs["x"])[0])


def _send_flushed(server, n: int) -> None:
    """n one-row REST requests (x = 0..n-1), each written out before the next."""
    for i in range(n):
        r = requests.post(f"http://127.0.0.1:{server.rest_port}/v1/models/half:predict", json={"instances": [float(i)]},
                          timeout=10)
        r.raise_for_status()
        server.request_logs.flush()


def test_log_files_rotate_by_size_and_the_oldest_go_past_max_files(tmp_path):
    """Files rotate before they pass --request_log_max_file_bytes (two records of about 200
    bytes each here). By default a process keeps the newest 16 files per prefix, a bound --help
    states; 0 keeps every file."""
    from serving_models import save_half

    from tfpipe.cli import build_parser
    from tfpipe.prediction_logs import log_files
    from tfpipe.serve.flags import ServeOptions, options_from_args
    from tfpipe.serve.request_log import LogBounds
    from tfpipe.serve.server import ServerThread

    parser = build_parser()
    cli = options_from_args(parser.parse_known_args(["serve"])[0])
    assert cli.request_log_max_files == ServeOptions().request_log_max_files == LogBounds().max_files == 16
    assert cli.request_log_max_file_bytes == LogBounds().max_file_bytes == 64 * 2**20
    serve_help = " ".join(parser._subparsers._group_actions[0].choices["serve"].format_help().split())
    assert "(default 16: 1 GiB with the default file size)" in serve_help

    save_half(str(tmp_path / "half" / "1"))
    every = tmp_path / "logs" / "every"
    opts = _opts(model_name="half", model_base_path=str(tmp_path / "half"), request_log_prefix=str(every),
                 request_log_max_file_bytes=500, request_log_max_files=0)
    with ServerThread(opts) as s:
        _send_flushed(s, 36)
    files = log_files(str(every))
    assert len(files) > 16
    assert all(os.path.getsize(f) <= 500 for f in files)
    assert [_x(log) for log, _ in _records(every)] == [float(i) for i in range(36)]

    kept = tmp_path / "logs" / "kept"
    opts = _opts(model_name="half", model_base_path=str(tmp_path / "half"), request_log_prefix=str(kept),
                 request_log_max_file_bytes=500)
    with ServerThread(opts) as s:
        _send_flushed(s, 36)
    assert len(log_files(str(kept))) == 16
    newest = [_x(log) for log, _ in _records(kept)]
    assert 16 <= len(newest) < 36 and newest == [float(i) for i in range(36 - len(newest), 36)]


@contextlib.contextmanager
def _small_disk(path, options: str):
    """A tmpfs mounted at `path` (`options`: its size, inodes) for the block; skips where this
    process may not mount one (not root, no CAP_SYS_ADMIN, no mount command)."""
    path.mkdir()
    try:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True,
                           text=True, timeout=30)
    except OSError as e:
        pytest.skip(f"a small disk to fill is a tmpfs, and this machine cannot mount one: {e}")
    if r.returncode:
        pytest.skip(f"a small disk to fill is a tmpfs, and this process cannot mount one (it needs root or "
                    f"CAP_SYS_ADMIN): {(r.stderr or r.stdout).strip()}")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True, timeout=30).returncode:
            subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def _fill(path) -> None:
    """Write a file at `path` until its disk has no room left."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError as e:
        assert e.errno == errno.ENOSPC, e
    finally:
        os.close(fd)


def test_a_full_disk_fails_log_records_not_requests_and_logging_resumes_when_space_returns(tmp_path, monkeypatch):
    """The log's directory is a 1 MiB tmpfs that a filler file fills while the server runs.
    REST and gRPC requests keep answering; the records that could not be written are counted
    as failed, the server's log says so in one line however often the writer tries again, and
    once the filler is gone new records are written: every record counted as written is read
    back, and none counted as failed is there."""
    import tensorflow as tf
    from serving_models import save_half
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    from tfpipe.serve import request_log
    from tfpipe.serve.server import ServerThread

    monkeypatch.setattr(request_log, "RETRY_SECONDS", 0.2)  # the outage below spans several tries
    save_half(str(tmp_path / "half" / "1"))
    (tmp_path / "monitoring.config").write_text('prometheus_config { enable: true path: "/metrics" }')
    with _small_disk(tmp_path / "disk", "size=1m") as disk:
        prefix = disk / "logs" / "half"
        lines: list[str] = []
        opts = _opts(model_name="half", model_base_path=str(tmp_path / "half"), request_log_prefix=str(prefix),
                     monitoring_config_file=str(tmp_path / "monitoring.config"))
        with ServerThread(opts, log=lines.append) as s, grpc.insecure_channel(f"127.0.0.1:{s.grpc_port}") as channel:
            url = f"http://127.0.0.1:{s.rest_port}"
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            sent = []

            def ask(x: float) -> None:
                """x over REST and x + 0.5 over gRPC, each answered right; then the log is flushed."""
                r = requests.post(f"{url}/v1/models/half:predict", json={"instances": [x]}, timeout=10)
                assert r.status_code == 200 and r.json()["predictions"] == [x / 2 + 2], r.text
                request = predict_pb2.PredictRequest()
                request.model_spec.name = "half"
                request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([x + 0.5], np.float32)))
                y = tf.make_ndarray(stub.Predict(request, 10).outputs["y"])
                assert y.tolist() == [(x + 0.5) / 2 + 2]
                sent.extend([x, x + 0.5])
                s.request_logs.flush()

            def count(status: str) -> float:
                return _counter(url, "/metrics", "half", status)

            for i in range(5):
                ask(float(i))
            assert count("written") == 10 and count("failed") == 0

            _fill(disk / "filler")
            x, deadline = 100.0, time.monotonic() + 30
            while count("failed") == 0:  # the open file's last page may still take a few records
                assert time.monotonic() < deadline, "no record failed on a full disk"
                ask(x)
                x += 1
            written_when_full = count("written")
            until = time.monotonic() + 1.0  # five tries of the writer, with requests all along
            while time.monotonic() < until:
                ask(x)
                x += 1
            assert count("written") == written_when_full
            said = [line for line in lines if "cannot write" in line]
            assert len(said) == 1, said
            assert said[0].startswith(f"request log {prefix}: cannot write (") and "No space left on device" in said[0]
            assert "\n" not in said[0] and not any("writing again" in line for line in lines)

            os.remove(disk / "filler")
            x, deadline = 1000.0, time.monotonic() + 30
            while count("written") == written_when_full:
                assert time.monotonic() < deadline, "logging did not resume once the disk had room"
                ask(x)
                x += 1
            ask(x)
            failed = count("failed")
            resumed = [line for line in lines if "writing again" in line]
            assert resumed == [f"request log {prefix}: writing again; {int(failed)} records failed while it could not"]
            assert count("dropped") == 0 and count("written") + failed == len(sent)
        written = s.metrics.request_logs[("half", "written")]  # after the server closed its files
        logs = _records(prefix)
    got = sorted(_x(log) for log, _ in logs)
    assert len(got) == written == len(sent) - failed
    assert got[:10] == [i + h for i in range(5) for h in (0.0, 0.5)]
    assert got[-2:] == [x, x + 0.5]  # the last requests, after space came back
    assert set(got) <= set(sent) and len(set(got)) == len(got)


def _entry(model: str, x: float, build=None):
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    from tfpipe.serve.request_log import Entry

    def made():
        request = predict_pb2.PredictRequest()
        request.model_spec.name = model
        request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([x], np.float32)))
        return request, predict_pb2.PredictResponse()

    return Entry(model, 1, "serving_default", "predict", "grpc", time.time_ns(), 1000, build or made)


def test_a_log_file_that_cannot_be_opened_or_rotated_is_counted_and_leaves_no_empty_file(tmp_path, monkeypatch):
    """A collector on a tmpfs whose inodes, then blocks, run out. No inode: the new file cannot
    be opened. No block, with every record in a file of its own: the second record of a burst
    closes the first's file, and that close fails. Each time the records are counted as failed,
    no empty file is left, and writing goes on once there is room."""
    from tfpipe.prediction_logs import log_files
    from tfpipe.serve import request_log
    from tfpipe.serve.metrics import Metrics

    monkeypatch.setattr(request_log, "RETRY_SECONDS", 0.05)
    with _small_disk(tmp_path / "disk", "size=256k,nr_inodes=16") as disk:
        prefix = str(disk / "logs" / "m")
        (disk / "logs").mkdir()
        metrics, lines = Metrics(), []
        collector = request_log.TFRecordCollector(prefix, request_log.LogBounds(max_file_bytes=1), metrics,
                                                  lines.append)
        try:
            names = []
            with pytest.raises(OSError) as e:
                while True:
                    (disk / f"inode{len(names)}").touch()
                    names.append(disk / f"inode{len(names)}")
            assert e.value.errno == errno.ENOSPC
            collector.offer(_entry("m", 1.0))
            collector.flush()
            assert metrics.request_logs == {("m", "failed"): 1} and log_files(prefix) == []
            assert len(lines) == 1 and "cannot write (" in lines[0] and "No space left on device" in lines[0]
            names.pop().unlink()  # room for one file
            deadline = time.monotonic() + 10
            while metrics.request_logs[("m", "written")] == 0:
                assert time.monotonic() < deadline, "writing did not go on once a file could be opened"
                collector.offer(_entry("m", 2.0))
                collector.flush()
            assert lines[1:] == [f"request log {prefix}: writing again; "
                                 f"{metrics.request_logs[('m', 'failed')]} records failed while it could not"]
            for n in names:
                n.unlink()

            # Blocks run out. A first entry whose build waits holds the writer, so that the next three
            # arrive together: the first of them opens a file, the second's rotation closes it.
            _fill(disk / "filler")
            gate = threading.Event()

            def held():
                gate.wait(10)
                raise ValueError("a request the log cannot represent")

            failed = metrics.request_logs[("m", "failed")]
            collector.offer(_entry("m", 3.0, held))
            for x in (4.0, 5.0, 6.0):
                collector.offer(_entry("m", x))
            gate.set()
            collector.flush()
            assert metrics.request_logs[("m", "failed")] == failed + 4
            assert any("a predict record of m could not be made (ValueError: a request the log cannot represent)"
                       in line for line in lines)
            assert sum("cannot write" in line for line in lines) == 2
            files = log_files(prefix)
            assert all(os.path.getsize(f) > 0 for f in files)  # the closed file that failed was removed
            os.remove(disk / "filler")
            written = metrics.request_logs[("m", "written")]
            deadline = time.monotonic() + 10
            while metrics.request_logs[("m", "written")] == written:
                assert time.monotonic() < deadline, "writing did not go on once there was room"
                collector.offer(_entry("m", 7.0))
                collector.flush()
        finally:
            collector.close()
        assert len(_records(prefix)) == metrics.request_logs[("m", "written")]
        dropped = metrics.request_logs[("m", "dropped")]
        collector.offer(_entry("m", 8.0))  # a request that took the collector before a reload retired it
        assert metrics.request_logs[("m", "dropped")] == dropped + 1


def test_a_reload_with_an_unknown_collector_is_refused_and_logging_goes_on(logged):
    from google.protobuf import text_format
    from tensorflow_serving.apis import model_management_pb2
    from tensorflow_serving.config import model_server_config_pb2

    config = text_format.Parse((logged.root / "models.config").read_text(),
                               model_server_config_pb2.ModelServerConfig())
    config.model_config_list.config[0].logging_config.log_collector_config.type = "kafka"
    with pytest.raises(grpc.RpcError) as e:
        logged.models.HandleReloadConfigRequest(model_management_pb2.ReloadConfigRequest(config=config), 30)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert "Cannot find LogCollector::Factory for type: kafka" in e.value.details()
    before = len(_records(logged.root / "logs" / "full"))
    requests.post(f"{logged.url}/v1/models/full:predict", json={"instances": [[1.0]]}, timeout=10).raise_for_status()
    logged.request_logs.flush()
    assert len(_records(logged.root / "logs" / "full")) == before + 1


@pytest.mark.parametrize("logging, error", [
    ('log_collector_config { type: "kafka" filename_prefix: "/tmp/x" }',
     "Cannot find LogCollector::Factory for type: kafka"),
    ('log_collector_config { filename_prefix: "/tmp/x" }', "Cannot find LogCollector::Factory for type: "),
    ('log_collector_config { type: "tfrecord" }', "filename_prefix is empty"),
    ('log_collector_config { type: "tfrecord" filename_prefix: "/tmp/x" } sampling_config { sampling_rate: 1.5 }',
     "sampling_rate must be in [0, 1]"),
])
def test_logging_configs_the_server_cannot_use_stop_it_at_start(tmp_path, logging, error):
    from tfpipe.serve.errors import ServeError
    from tfpipe.serve.server import EmbeddedServer

    (tmp_path / "models.config").write_text(
        f'model_config_list {{ config {{ name: "m" base_path: "{tmp_path}" logging_config {{ {logging} }} }} }}')
    with pytest.raises(ServeError, match=f"model config: .*{error.replace('[', '.').replace(']', '.')}"):
        EmbeddedServer(_opts(model_config_file=str(tmp_path / "models.config")), log=lambda _: None)


@pytest.mark.parametrize("per_task, rate, expected", [
    ([], 0.3, 0.3),
    ([{"dc": "", "sampling_rate": 0.9}], 0.3, 0.9),
    ([{"dc": "aa", "sampling_rate": 0.9}], 0.3, 0.3),
    ([{"task_index": 1, "sampling_rate": 0.9}, {"task_index": 0, "sampling_rate": 0.5}], 0.3, 0.5),
])
def test_the_first_per_task_sampling_config_that_matches_this_task_wins(per_task, rate, expected):
    from tensorflow_serving.config import logging_config_pb2

    from tfpipe.serve.request_log import sampling_rate

    config = logging_config_pb2.LoggingConfig()
    config.sampling_config.sampling_rate = rate
    for t in per_task:
        config.sampling_config.per_task_sampling_configs.add(**t)
    assert sampling_rate(config) == expected


def test_a_record_is_a_prediction_log_with_tfpipes_timing_in_a_field_it_does_not_use():
    from tensorflow_serving.apis import prediction_log_pb2

    from tfpipe.prediction_logs import timing, timing_bytes

    log = prediction_log_pb2.PredictionLog()
    log.log_metadata.model_spec.name = "m"
    log.predict_log.request.model_spec.name = "m"
    record = log.SerializeToString() + timing_bytes(1_700_000_000_123_456_789, 1_234_567, "rest", "predict", "inputs")
    parsed = prediction_log_pb2.PredictionLog.FromString(record)
    assert parsed.log_metadata.model_spec.name == "m" and parsed.predict_log.request.model_spec.name == "m"
    t = timing(record)
    assert (t.start_unix_nanos, t.latency_nanos, t.protocol, t.api, t.rest_format) == \
        (1_700_000_000_123_456_789, 1_234_567, "rest", "predict", "inputs")
    assert timing(log.SerializeToString()).start_unix_nanos == 0  # another server's record: no timing
    # a reader that re-serializes the log keeps the timing
    assert timing(parsed.SerializeToString()).latency_nanos == 1_234_567


def test_tensorflow_model_server_is_not_given_a_logging_config_it_would_refuse(tmp_path):
    from tfpipe.serve.errors import ServeError
    from tfpipe.serve.tfserving.launcher import write_configs

    with pytest.raises(ServeError, match="No request-logger-creator provided"):
        write_configs(_opts(model_name="m", model_base_path=str(tmp_path), request_log_prefix=str(tmp_path / "l")),
                      str(tmp_path / "cfg"))


@pytest.mark.long
def test_replay_sends_every_logged_request_at_the_logged_rate_over_its_own_api(logged, tmp_path):
    """60 requests to `paced` over 3 s, paced at 20/s, over every API and both protocols; then
    `tfpipe loadtest --replay` at 2x speed to `quiet`: the same count, at twice the rate, within 5%,
    all answered."""
    import json

    import tensorflow as tf
    from tensorflow_serving.apis import classification_pb2, inference_pb2, predict_pb2, regression_pb2

    from conftest import run_cli

    def grpc_predict():
        r = predict_pb2.PredictRequest()
        r.model_spec.name = "paced"
        r.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([[1.0], [2.0]], np.float32)))
        logged.stub.Predict(r, 10)

    def grpc_classify():
        r = classification_pb2.ClassificationRequest()
        r.model_spec.name, r.model_spec.signature_name = "paced", "classify_x_to_y"
        r.input.example_list.examples.extend([_example(3.0)])
        logged.stub.Classify(r, 10)

    def grpc_regress():
        r = regression_pb2.RegressionRequest()
        r.model_spec.name, r.model_spec.signature_name = "paced", "regress_x_to_y"
        r.input.example_list.examples.extend([_example(4.0)])
        logged.stub.Regress(r, 10)

    def grpc_multi():
        r = inference_pb2.MultiInferenceRequest()
        task = r.tasks.add()
        task.model_spec.name, task.model_spec.signature_name = "paced", "regress_x_to_y"
        task.method_name = "tensorflow/serving/regress"
        r.input.example_list.examples.extend([_example(5.0)])
        logged.stub.MultiInference(r, 10)

    def rest(path, body):
        def call():
            assert requests.post(f"{logged.url}/v1/models/paced:{path}", json=body, timeout=10).status_code == 200
        return call

    calls = [grpc_predict, grpc_classify, grpc_regress, grpc_multi, rest("predict", {"instances": [[1.0], [2.0]]}),
             rest("predict", {"inputs": {"x": [[3.0]]}}),
             rest("classify", {"signature_name": "classify_x_to_y", "examples": [{"x": 6.0}]}),
             rest("regress", {"signature_name": "regress_x_to_y", "context": {"x2": 1.0}, "examples": [{"x": 7.0}]})]
    t0 = time.perf_counter()
    for k in range(60):
        time.sleep(max(0.0, t0 + k / 20 - time.perf_counter()))
        calls[k % len(calls)]()
    logged.request_logs.flush()

    out = tmp_path / "replay"
    res = run_cli("loadtest", "--replay", str(logged.root / "logs" / "paced"), "--target", logged.url,
                  "--grpc-target", f"grpc://127.0.0.1:{logged.grpc_port}", "--model", "quiet", "--speed", "2",
                  "--out", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    replay = json.load(open(out / "results.json"))["replay"]
    assert replay["recorded"]["requests"] == 60
    assert replay["recorded"]["by_api"] == {"predict/grpc": 8, "classify/grpc": 8, "regress/grpc": 8,
                                            "multi_inference/grpc": 8, "predict/rest": 14, "classify/rest": 7,
                                            "regress/rest": 7}
    assert replay["recorded"]["rate"] == pytest.approx(20, rel=0.05)
    assert replay["replayed"]["errors"] == 0, res.stdout
    assert 0.95 <= replay["count_ratio"] <= 1.05 and 0.95 <= replay["rate_ratio"] <= 1.05, replay
    assert "replayed" in res.stdout and "recorded" in res.stdout
    # what `quiet` answered, by API (REST and gRPC alike): every replayed request, over its own API
    answered = {api: n for (model, api, status), n in logged.metrics.requests.items() if model == "quiet"
                and status in ("OK", "200")}
    assert answered == {"predict": 22, "classify": 15, "regress": 15, "multi_inference": 8}, answered
