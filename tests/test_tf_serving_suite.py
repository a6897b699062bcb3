"""TensorFlow Serving's own test suite, run against `tfpipe serve`.

Ported from the tensorflow/serving repository:
  * model_servers/tensorflow_model_server_test.py (with test_util/
    tensorflow_model_server_test_base.py): each case starts `tfpipe serve` with the command
    line that file gives tensorflow_model_server (`--port`, `--rest_api_port`,
    `--rest_api_timeout_in_ms=5000`, `--grpc_socket_path`, `--grpc_channel_arguments=
    grpc.so_reuseaddr=1`, and the case's own flags), caches servers by their arguments as
    upstream does, and checks upstream's expectations. testPredictBatching is the case that
    file had before session bundles were removed, on the SavedModel;
  * the REST cases of model_servers/http_rest_api_handler_test.cc, over HTTP against a server
    configured as that test's ServerCore (one model, 'specific' version 123, then a config
    reload that adds the label Version_Label).
Models are built by tests/serving_models.py the way TF Serving's testdata generator builds
them (versions 00000123/00000124); the config files below follow TF Serving's testdata.

`TFPIPE_SUITE_WORKERS=2 pytest tests/test_tf_serving_suite.py` runs every case against
`tfpipe serve --workers=2` (each server its own supervisor and two workers, no Unix socket, which
workers cannot share: testPredictUDS then skips); by default each server is one process.

Differences from the upstream command line, for this project's test rules: `--host=127.0.0.1`
(servers listen on loopback only), ports the OS picks, and one Unix socket per server (upstream
points every server at /tmp/tf-serving.sock, which the last one started takes over).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from conftest import ROOT, free_port, spawn_cli, spawn_script
from serve_host import FAILED as FAILED_IN_HOST

# its expensive fixtures (servers, runs) are session-scoped and built once, on one xdist worker: a
# worker may run other files in between, which would tear down and rebuild module-scoped ones
pytestmark = pytest.mark.xdist_group("tf_serving_suite")

RPC_TIMEOUT = 20.0
WORKERS = int(os.environ.get("TFPIPE_SUITE_WORKERS") or 0)  # >1: every server is `tfpipe serve --workers=N`
REST_TIMEOUT_MS = 5000

NOT_APPLICABLE = {
    "testPredictOnTfLite": "runs model.tflite with --prefer_tflite_model, TF Serving's experimental TFLite "
                           "runtime; tfpipe serve accepts that flag and runs the SavedModel with TensorFlow",
    "testPredictWithSignatureDefOnTfLite": "the same TFLite runtime, with a SignatureDef in the .tflite file",
    "test_profiler_service_with_valid_trace_request": "traces through the profiler gRPC service that "
                                                      "tensorflow_model_server registers (--enable_profiler), a "
                                                      "C++ service of TF Serving's own",
    "test_tf_text": "needs TF Serving's checked-in tf_text_regression SavedModel (a binary that cannot be rebuilt "
                    "from source here) and the tensorflow-text ops",
}

# TF Serving's testdata config files (servables/tensorflow/testdata/*.txt).
GOOD_MODEL_CONFIG = """model_config_list: {
  config: {
    name: "half_plus_two",
    base_path: "${TEST_HALF_PLUS_TWO_DIR}",
    model_platform: "tensorflow"
  },
  config: {
    name: "half_plus_three",
    base_path: "${TEST_HALF_PLUS_THREE_DIR}",
    model_platform: "tensorflow"
  }
}
"""
BAD_MODEL_CONFIG = "improperly formatted file"
BATCHING_CONFIG = """max_batch_size { value: 128 }
batch_timeout_micros { value: 0 }
max_enqueued_batches { value: 1000000 }
num_batch_threads { value: 8 }
"""
MONITORING_CONFIG = """prometheus_config: {
  enable: true,
  path: "/monitoring/prometheus/metrics"
}
"""
RELOAD_CONFIG = """
model_config_list: {{
  config: {{
    name: "{name}",
    base_path: "{model_path}",
    model_platform: "tensorflow"
  }}
}}
"""
REST_MODEL = "saved_model_half_plus_two_2_versions"  # http_rest_api_handler_test.cc's kTestModelName
REST_CONFIG = f"""model_config_list {{
  config {{ name: "{REST_MODEL}" base_path: "{{base}}" model_platform: "tensorflow"
           model_version_policy {{ specific {{ versions: 123 }} }} }}
}}
"""


class Server:
    def __init__(self, proc: subprocess.Popen, port: int, rest_port: int, socket_path: str, log: str):
        self.proc, self.socket_path, self.log = proc, socket_path, log
        self.grpc = f"127.0.0.1:{port}"
        self.rest = f"127.0.0.1:{rest_port}"
        self.ready = False

    def wait_ready(self) -> None:
        """WaitForServerReady: a Predict for a missing model answers with 'Servable' once up."""
        import grpc
        from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

        if self.ready:
            return
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "intentionally_missing_model"
        deadline = time.time() + 180
        with grpc.insecure_channel(self.grpc) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            while time.time() < deadline:
                if self.proc.poll() is not None:
                    raise AssertionError(f"the server exited ({self.proc.returncode}):\n{self.output()}")
                if FAILED_IN_HOST in self.output():
                    raise AssertionError(f"the server did not start:\n{self.output()}")
                if WORKERS > 1 and "serving gRPC" not in self.output():  # the supervisor's line: all serve
                    time.sleep(0.2)
                    continue
                try:
                    stub.Predict(request, 1.0)
                except grpc.RpcError as error:
                    if "Servable" in (error.details() or ""):
                        self.ready = True
                        return
                time.sleep(0.2)
        raise AssertionError(f"the server did not become ready:\n{self.output()}")

    def output(self) -> str:
        with open(self.log, errors="replace") as f:
            return f.read()[-4000:]


class Servers:
    """RunServer: one `tfpipe serve` per distinct set of arguments, started on first request."""

    def __init__(self, tmp: str):
        self.tmp = tmp
        self.running: dict[tuple, Server] = {}
        self._count = 0  # servers made: names their logs and sockets
        os.makedirs(os.path.join(tmp, "sockets"), exist_ok=True)

    def run(self, model_name, model_path, model_config_file=None, monitoring_config_file=None,
            batching_parameters_file=None, grpc_channel_arguments="", wait_for_server_ready=True,
            model_config_file_poll_period=None) -> Server:
        key = (model_name, model_path, model_config_file, monitoring_config_file, batching_parameters_file,
               grpc_channel_arguments, model_config_file_poll_period)
        if key not in self.running:
            self.running[key] = self._start(*key)
        server = self.running[key]
        if wait_for_server_ready:
            server.wait_ready()
        return server

    def start_together(self, runs: list[dict]) -> None:
        """Start these servers (RunServer's arguments each, not yet running) in one host process
        (tests/serve_host.py): each is the `tfpipe serve` its command line makes, on its own ports,
        and TensorFlow is imported once for all of them."""
        runs = [r for r in runs if self._key(**r) not in self.running]
        if WORKERS > 1:  # a supervisor each: the host runs single-process servers only
            for r in runs:
                self.running[self._key(**r)] = self._start(*self._key(**r))
            return
        servers = [self._server(**r) for r in runs]
        spec = os.path.join(self.tmp, f"host-{self._count}.json")
        with open(spec, "w") as f:
            json.dump([{"argv": argv, "log": server.log} for server, argv in servers], f)
        with open(spec.removesuffix(".json") + ".log", "w") as out:
            proc = spawn_script(os.path.join(ROOT, "tests", "serve_host.py"), spec, stdout=out,
                                stderr=subprocess.STDOUT)
        for r, (server, _) in zip(runs, servers, strict=True):
            server.proc = proc
            self.running[self._key(**r)] = server

    @staticmethod
    def _key(model_name=None, model_path=None, model_config_file=None, monitoring_config_file=None,
             batching_parameters_file=None, grpc_channel_arguments="", model_config_file_poll_period=None,
             **_) -> tuple:
        return (model_name, model_path, model_config_file, monitoring_config_file, batching_parameters_file,
                grpc_channel_arguments, model_config_file_poll_period)

    def _start(self, *key) -> Server:
        server, argv = self._server(*key)
        with open(server.log, "w") as out:
            server.proc = spawn_cli("serve", *argv, stdout=out, stderr=subprocess.STDOUT)
        return server

    def _server(self, model_name=None, model_path=None, model_config_file=None, monitoring_config_file=None,
                batching_parameters_file=None, grpc_channel_arguments="", model_config_file_poll_period=None,
                **_) -> tuple[Server, list[str]]:
        """A server (no process yet) and its `tfpipe serve` arguments, as RunServer builds them."""
        n = self._count
        self._count += 1
        port, rest_port = free_port(), free_port()
        socket_path = os.path.join(self.tmp, "sockets", f"tf-serving-{n}.sock")
        command = "--host=127.0.0.1"
        command += " --port=" + str(port)
        command += " --rest_api_port=" + str(rest_port)
        command += " --rest_api_timeout_in_ms=" + str(REST_TIMEOUT_MS)
        if WORKERS > 1:
            command += f" --workers={WORKERS}"
        else:
            command += " --grpc_socket_path=" + socket_path
        if model_config_file:
            command += " --model_config_file=" + model_config_file
        elif model_path:
            command += " --model_name=" + model_name
            command += " --model_base_path=" + model_path
        else:
            raise ValueError("Both model_config_file and model_path cannot be empty!")
        if monitoring_config_file:
            command += " --monitoring_config_file=" + monitoring_config_file
        if model_config_file_poll_period is not None:
            command += " --model_config_file_poll_wait_seconds=" + str(model_config_file_poll_period)
        if batching_parameters_file:
            command += " --enable_batching"
            command += " --batching_parameters_file=" + batching_parameters_file
        command += " --grpc_channel_arguments=" + ",".join(a for a in (grpc_channel_arguments, "grpc.so_reuseaddr=1")
                                                            if a)
        log = os.path.join(self.tmp, f"server-{n}.log")
        open(log, "w").close()
        return Server(None, port, rest_port, socket_path, log), shlex.split(command)

    def stop_all(self) -> None:
        procs = list({id(server.proc): server.proc for server in self.running.values()}.values())
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


class Paths:
    """Where the test data lives (the upstream helpers _GetSavedModelBundlePath etc.)."""

    def __init__(self, root: str):
        self.root = root
        self.half_plus_two = os.path.join(root, "saved_model_half_plus_two_cpu")
        self.half_plus_two_tf2 = os.path.join(root, "saved_model_half_plus_two_tf2_cpu")
        self.half_plus_three = os.path.join(root, "saved_model_half_plus_three")
        self.two_versions = os.path.join(root, REST_MODEL)
        self.configs = os.path.join(root, "configs")
        os.makedirs(self.configs, exist_ok=True)
        self.good_config = self._write("good_model_config.conf", GOOD_MODEL_CONFIG.replace(
            "${TEST_HALF_PLUS_TWO_DIR}", self.half_plus_two).replace("${TEST_HALF_PLUS_THREE_DIR}", self.half_plus_three))
        self.bad_config = self._write("bad_model_config.txt", BAD_MODEL_CONFIG)
        self.batching = self._write("batching_config.txt", BATCHING_CONFIG)
        self.monitoring = self._write("monitoring_config.txt", MONITORING_CONFIG)
        self.reload = self._write("model_config.txt",
                                  RELOAD_CONFIG.format(name="half_plus_two", model_path=self.half_plus_two))
        self.reload_zero = self._write("model_config_zero_poll.txt",
                                       RELOAD_CONFIG.format(name="half_plus_two", model_path=self.half_plus_two))
        self.rest = self._write("rest_handler.config", REST_CONFIG.replace("{base}", self.two_versions))

    def _write(self, name: str, text: str) -> str:
        path = os.path.join(self.configs, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def model(self, name: str) -> str:
        return os.path.join(self.root, name)


@pytest.fixture(scope="session")
def paths(tmp_path_factory) -> Paths:
    root = str(tmp_path_factory.mktemp("tf_serving_testdata"))
    built = spawn_script(os.path.join(ROOT, "tests", "serving_models.py"), "testdata", root)
    _, err = built.communicate(timeout=300)
    assert built.returncode == 0, err[-3000:]
    return Paths(root)


@pytest.fixture(scope="session")
def servers(paths, tmp_path_factory):
    """Every long-lived server the cases use, started at once in one process so that they load
    side by side and TensorFlow is imported once; a case that needs a server of its own (one
    that must fail to start, or exit) gets a `tfpipe serve` process."""
    s = Servers(str(tmp_path_factory.mktemp("tf_serving_servers")))
    s.start_together([
        dict(model_name="default", model_path=paths.half_plus_two),
        dict(model_name="default", model_path=paths.half_plus_two_tf2),
        dict(model_config_file=paths.good_config),
        dict(model_config_file=paths.reload, model_config_file_poll_period=1),
        dict(model_config_file=paths.reload_zero, model_config_file_poll_period=0),
        dict(model_name="default", model_path=paths.half_plus_two, grpc_channel_arguments=CHANNEL_ARGS),
        dict(model_name="default", model_path=paths.half_plus_two, monitoring_config_file=paths.monitoring),
        dict(model_name="default", model_path=paths.half_plus_two, batching_parameters_file=paths.batching),
        *(dict(model_name="default", model_path=paths.model(name)) for name in SAVED_MODEL_CASES),
        dict(model_name="default", model_path=paths.model("one_broken_signature")),
        dict(model_config_file=paths.rest),
    ])
    yield s
    s.stop_all()


CHANNEL_ARGS = "grpc.max_connection_age_ms=2000,grpc.lb_policy_name=grpclb"
SAVED_MODEL_CASES = ("tf_saved_model_save", "tf_saved_model_save_multiple_signatures",
                     "keras_sequential_saved_model_save", "keras_distrat_sequential_saved_model_save",
                     "keras3_sequential_saved_model_save")


# ---- the upstream helpers ---------------------------------------------------------------

def _model_version(model_path: str) -> int:
    return int(os.listdir(model_path)[0])


def _stub(address: str):
    import grpc
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    return prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(address))


def _verify_model_spec(spec, name: str, signature_name: str, version: int) -> None:
    assert spec.name == name
    assert spec.signature_name == signature_name
    assert spec.version.value == version


def verify_predict(address: str, expected_output: float, expected_version: int, model_name: str = "default",
                   specify_output: bool = True, batch_input: bool = False,
                   signature_name: str = "serving_default", input_name: str = "x", output_name: str = "y") -> None:
    """VerifyPredictRequest: x = [2.0] (shape [1], or [1, 1] with batch_input), float output."""
    from tensorflow.core.framework import types_pb2
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model_name
    request.model_spec.signature_name = signature_name
    request.inputs[input_name].dtype = types_pb2.DT_FLOAT
    request.inputs[input_name].float_val.append(2.0)
    request.inputs[input_name].tensor_shape.dim.add().size = 1
    if batch_input:
        request.inputs[input_name].tensor_shape.dim.add().size = 1
    if specify_output:
        request.output_filter.append(output_name)
    result = _stub(address).Predict(request, RPC_TIMEOUT)
    assert output_name in result.outputs
    assert result.outputs[output_name].dtype == types_pb2.DT_FLOAT
    assert len(result.outputs[output_name].float_val) == 1
    assert result.outputs[output_name].float_val[0] == expected_output
    _verify_model_spec(result.model_spec, model_name, signature_name, expected_version)


def call_rest(url: str, request) -> tuple[int, dict, dict]:
    """(status, JSON body, headers) of a REST call; a JSON request body makes it a POST."""
    data = json.dumps(request).encode() if request is not None and not isinstance(request, (str, bytes)) else request
    if isinstance(data, str):
        data = data.encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=30) as resp:
            return resp.status, json.loads(resp.read()), dict(resp.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), dict(e.headers)


def _test_predict(servers, paths, model_path: str, batching_parameters_file: str | None = None) -> None:
    server = servers.run("default", model_path, batching_parameters_file=batching_parameters_file)
    version = _model_version(model_path)
    verify_predict(server.grpc, expected_output=3.0, expected_version=version)
    verify_predict(server.grpc, expected_output=3.0, specify_output=False, expected_version=version)


# ---- tensorflow_model_server_test.py ------------------------------------------------------

def test_get_model_status(servers, paths):
    """testGetModelStatus"""
    import grpc
    from tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc

    server = servers.run("default", paths.half_plus_two)
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = "default"
    result = model_service_pb2_grpc.ModelServiceStub(grpc.insecure_channel(server.grpc)).GetModelStatus(
        request, RPC_TIMEOUT)
    assert len(result.model_version_status) == 1
    assert result.model_version_status[0].version == 123
    assert result.model_version_status[0].status.error_code == 0


def test_get_model_metadata(servers, paths):
    """testGetModelMetadata"""
    from tensorflow_serving.apis import get_model_metadata_pb2

    server = servers.run("default", paths.half_plus_two)
    request = get_model_metadata_pb2.GetModelMetadataRequest()
    request.model_spec.name = "default"
    request.metadata_field.append("signature_def")
    result = _stub(server.grpc).GetModelMetadata(request, RPC_TIMEOUT)
    assert result.model_spec.name == "default"
    assert result.model_spec.version.value == _model_version(paths.half_plus_two)
    assert len(result.metadata) == 1 and "signature_def" in result.metadata


# testClassify, testRegress and testMultiInference run on the TF1 model (whose signatures carry the
# classify/regress methods) and, as their Tf2 twins, on the native TF2 one (every method predict).
TF1_AND_TF2 = pytest.mark.parametrize("model", ["half_plus_two", "half_plus_two_tf2"], ids=["tf1", "tf2"])


@TF1_AND_TF2
def test_classify(servers, paths, model):
    """testClassify, testClassifyTf2"""
    from tensorflow_serving.apis import classification_pb2

    model_path = getattr(paths, model)

    server = servers.run("default", model_path)
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = "default"
    request.model_spec.signature_name = "classify_x_to_y"
    request.input.example_list.examples.add().features.feature["x"].float_list.value.extend([2.0])
    result = _stub(server.grpc).Classify(request, RPC_TIMEOUT)
    assert len(result.result.classifications) == 1
    assert len(result.result.classifications[0].classes) == 1
    assert result.result.classifications[0].classes[0].score == 3.0
    _verify_model_spec(result.model_spec, "default", "classify_x_to_y", _model_version(model_path))


@TF1_AND_TF2
def test_regress(servers, paths, model):
    """testRegress, testRegressTf2"""
    from tensorflow_serving.apis import regression_pb2

    model_path = getattr(paths, model)

    server = servers.run("default", model_path)
    request = regression_pb2.RegressionRequest()
    request.model_spec.name = "default"
    request.model_spec.signature_name = "regress_x_to_y"
    request.input.example_list.examples.add().features.feature["x"].float_list.value.extend([2.0])
    result = _stub(server.grpc).Regress(request, RPC_TIMEOUT)
    assert len(result.result.regressions) == 1
    assert result.result.regressions[0].value == 3.0
    _verify_model_spec(result.model_spec, "default", "regress_x_to_y", _model_version(model_path))


@TF1_AND_TF2
def test_multi_inference(servers, paths, model):
    """testMultiInference, testMultiInferenceTf2"""
    from tensorflow_serving.apis import inference_pb2

    model_path = getattr(paths, model)

    server = servers.run("default", model_path)
    request = inference_pb2.MultiInferenceRequest()
    request.tasks.add().model_spec.name = "default"
    request.tasks[0].model_spec.signature_name = "regress_x_to_y"
    request.tasks[0].method_name = "tensorflow/serving/regress"
    request.tasks.add().model_spec.name = "default"
    request.tasks[1].model_spec.signature_name = "classify_x_to_y"
    request.tasks[1].method_name = "tensorflow/serving/classify"
    request.input.example_list.examples.add().features.feature["x"].float_list.value.extend([2.0])
    result = _stub(server.grpc).MultiInference(request, RPC_TIMEOUT)
    assert len(result.results) == 2
    assert result.results[0].regression_result.regressions[0].value == 3.0
    assert result.results[1].classification_result.classifications[0].classes[0].score == 3.0
    for i in range(2):
        _verify_model_spec(result.results[i].model_spec, request.tasks[i].model_spec.name,
                           request.tasks[i].model_spec.signature_name, _model_version(model_path))


def test_predict_saved_model(servers, paths):
    """testPredictSavedModel: x of shape [1] into the signature's [None, 1], with and without
    output_filter"""
    _test_predict(servers, paths, paths.half_plus_two)


def test_predict_batching(servers, paths):
    """testPredictBatching, with TF Serving's batching_config.txt"""
    _test_predict(servers, paths, paths.half_plus_two, batching_parameters_file=paths.batching)


def test_good_model_config(servers, paths):
    """testGoodModelConfig"""
    server = servers.run(None, None, model_config_file=paths.good_config)
    for name, expected, path in (("half_plus_two", 3.0, paths.half_plus_two),
                                 ("half_plus_three", 4.0, paths.half_plus_three)):
        verify_predict(server.grpc, model_name=name, expected_output=expected, expected_version=_model_version(path))
        verify_predict(server.grpc, model_name=name, expected_output=expected, specify_output=False,
                       expected_version=_model_version(path))


def test_half_plus_three_as_tensorflow_1_0_saved_it_regresses_too(servers, paths):
    """Beyond testGoodModelConfig: the regress signature of TF 1.0's half_plus_three, which feeds
    serialized tf.Examples to a scalar placeholder declared DT_FLOAT, answers as TF Serving does."""
    from tensorflow_serving.apis import regression_pb2

    server = servers.run(None, None, model_config_file=paths.good_config)
    request = regression_pb2.RegressionRequest()
    request.model_spec.name = "half_plus_three"
    request.model_spec.signature_name = "tensorflow/serving/regress"
    for x in (2.0, 4.0):
        request.input.example_list.examples.add().features.feature["x"].float_list.value.append(x)
    result = _stub(server.grpc).Regress(request, RPC_TIMEOUT)
    assert [r.value for r in result.result.regressions] == [4.0, 5.0]


def test_a_signature_that_cannot_load_answers_an_error_and_the_rest_serve(servers, paths):
    """A TF1 model whose `needs_hidden` signature cannot be pruned from its graph loads; the load
    log names the signature; calling it is FAILED_PRECONDITION (REST 400) naming why; the good
    signature answers before and after, and the metadata still lists both."""
    import grpc
    from tensorflow.core.framework import types_pb2
    from tensorflow_serving.apis import predict_pb2

    path = paths.model("one_broken_signature")
    server = servers.run("default", path)
    request = predict_pb2.PredictRequest()
    request.model_spec.name, request.model_spec.signature_name = "default", "needs_hidden"
    request.inputs["x"].dtype = types_pb2.DT_FLOAT
    request.inputs["x"].float_val.append(2.0)
    request.inputs["x"].tensor_shape.dim.add().size = 1
    with pytest.raises(grpc.RpcError) as e:
        _stub(server.grpc).Predict(request, RPC_TIMEOUT)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert 'Serving signature "needs_hidden" could not be loaded' in e.value.details()
    assert "placeholder which is not an input" in e.value.details()
    status, body, _ = call_rest(f"http://{server.rest}/v1/models/default:predict",
                                {"signature_name": "needs_hidden", "instances": [2.0]})
    assert status == 400 and "could not be loaded" in body["error"]
    status, body, _ = call_rest(f"http://{server.rest}/v1/models/default:predict", {"instances": [2.0, 3.0]})
    assert status == 200 and body == {"predictions": [4.0, 6.0]}
    status, body, _ = call_rest(f"http://{server.rest}/v1/models/default/metadata", None)
    assert status == 200
    assert set(body["metadata"]["signature_def"]["signature_def"]) == {"serving_default", "needs_hidden"}
    with open(server.log) as f:
        assert "signature 'needs_hidden' of default version 1 could not be loaded" in f.read()


@pytest.mark.skipif(not os.environ.get("TFPIPE_TF_SERVING_TESTDATA"),
                    reason="TFPIPE_TF_SERVING_TESTDATA is not set (a tensorflow/serving checkout's "
                           "tensorflow_serving/servables/tensorflow/testdata, whose SavedModels this repository "
                           "does not carry)")
def test_tf_servings_own_half_plus_three_file_serves_both_signatures():
    """TF Serving's checked-in saved_model_half_plus_three (TensorFlow 1.0.0-rc2), when a checkout
    is at hand: both signatures load and answer 0.5 * x + 3."""
    import numpy as np
    import tensorflow as tf

    from tfpipe.serve.core.examples import finished
    from tfpipe.serve.core.servable import Servable

    path = os.path.join(os.environ["TFPIPE_TF_SERVING_TESTDATA"], "saved_model_half_plus_three", "00000123")
    servable = Servable("half_plus_three", 123, path)
    assert servable.broken == {}
    assert servable.run(servable.signature(""), {"x": np.array([2.0], np.float32)})["y"].tolist() == [4.0]
    ex = tf.train.Example()
    ex.features.feature["x"].float_list.value.append(2.0)
    assert finished(servable.regress("tensorflow/serving/regress", [ex.SerializeToString()]))[1].tolist() == [4.0]


def test_bad_model_config(paths, tmp_path):
    """testBadModelConfig: the server says what failed to parse, on stderr"""
    from conftest import run_cli

    # forked from the CLI host like every other server of the suite (a fresh interpreter spent 6-18 s
    # importing TensorFlow to print one parse error)
    proc = run_cli("serve", "--host=127.0.0.1", f"--port={free_port()}", f"--rest_api_port={free_port()}",
                   f"--rest_api_timeout_in_ms={REST_TIMEOUT_MS}", f"--grpc_socket_path={tmp_path / 'tf-serving.sock'}",
                   f"--model_config_file={paths.bad_config}", "--grpc_channel_arguments=grpc.so_reuseaddr=1",
                   timeout=120)
    assert proc.returncode != 0
    assert proc.stderr.find("Error parsing text-format tensorflow.serving.ModelServerConfig") > -1, proc.stderr


def test_model_config_reload(servers, paths):
    """testModelConfigReload: with a poll period, a rewritten config is picked up"""
    server = servers.run(None, None, model_config_file=paths.reload, model_config_file_poll_period=1)
    verify_predict(server.grpc, model_name="half_plus_two", expected_output=3.0, specify_output=False,
                   expected_version=_model_version(paths.half_plus_two))
    with open(paths.reload, "w") as f:
        f.write(RELOAD_CONFIG.format(name="half_plus_three", model_path=paths.half_plus_three))
    deadline, last = time.time() + 10, None  # upstream sleeps 10 s, then checks
    while time.time() < deadline:
        try:
            verify_predict(server.grpc, model_name="half_plus_three", expected_output=4.0, specify_output=False,
                           expected_version=_model_version(paths.half_plus_three))
            break
        except Exception as e:  # noqa: BLE001 (not reloaded yet)
            last = e
            time.sleep(0.2)
    else:
        raise AssertionError(f"the new config was not served within 10 s: {last}\n{server.output()}")


def test_model_config_reload_with_zero_poll_period(servers, paths):
    """testModelConfigReloadWithZeroPollPeriod: without one, the first config stays"""
    import grpc

    server = servers.run(None, None, model_config_file=paths.reload_zero, model_config_file_poll_period=0)
    verify_predict(server.grpc, model_name="half_plus_two", expected_output=3.0, specify_output=False,
                   expected_version=_model_version(paths.half_plus_two))
    with open(paths.reload_zero, "w") as f:
        f.write(RELOAD_CONFIG.format(name="half_plus_three", model_path=paths.half_plus_three))
    time.sleep(0 + 1)
    verify_predict(server.grpc, model_name="half_plus_two", expected_output=3.0, specify_output=False,
                   expected_version=_model_version(paths.half_plus_two))
    with pytest.raises(grpc.RpcError) as e:  # and the new one was not read
        verify_predict(server.grpc, model_name="half_plus_three", expected_output=4.0, expected_version=123)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_good_grpc_channel_args(servers, paths):
    """testGoodGrpcChannelArgs"""
    server = servers.run("default", paths.half_plus_two, grpc_channel_arguments=CHANNEL_ARGS)
    verify_predict(server.grpc, expected_output=3.0, specify_output=False,
                   expected_version=_model_version(paths.half_plus_three))


def test_classify_rest(servers, paths):
    """testClassifyREST"""
    server = servers.run("default", paths.half_plus_two)
    status, body, _ = call_rest(f"http://{server.rest}/v1/models/default:classify",
                                {"signature_name": "classify_x_to_y", "examples": [{"x": 2.0}]})
    assert (status, body) == (200, {"results": [[["", 3.0]]]})


def test_regress_rest(servers, paths):
    """testRegressREST"""
    server = servers.run("default", paths.half_plus_two)
    status, body, _ = call_rest(f"http://{server.rest}/v1/models/default:regress",
                                {"signature_name": "regress_x_to_y", "examples": [{"x": 2.0}]})
    assert (status, body) == (200, {"results": [3.0]})


def test_predict_rest(servers, paths):
    """testPredictREST: three scalars into the signature's [None, 1]"""
    server = servers.run("default", paths.half_plus_two)
    status, body, _ = call_rest(f"http://{server.rest}/v1/models/default:predict", {"instances": [2.0, 3.0, 4.0]})
    assert (status, body) == (200, {"predictions": [3.0, 3.5, 4.0]})


def test_predict_columnar_rest(servers, paths):
    """testPredictColumnarREST"""
    server = servers.run("default", paths.half_plus_two)
    status, body, _ = call_rest(f"http://{server.rest}/v1/models/default:predict", {"inputs": [2.0, 3.0, 4.0]})
    assert (status, body) == (200, {"outputs": [3.0, 3.5, 4.0]})


def test_get_status_rest(servers, paths):
    """testGetStatusREST"""
    server = servers.run("default", paths.half_plus_two)
    status, body, _ = call_rest(f"http://{server.rest}/v1/models/default", None)
    assert (status, body) == (200, {"model_version_status": [
        {"version": "123", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}]})


def test_get_model_metadata_rest(servers, paths):
    """testGetModelMetadataREST, against half_plus_two_model_metadata.json's content"""
    server = servers.run("default", paths.half_plus_two)
    status, body, _ = call_rest(f"http://{server.rest}/v1/models/default/metadata", None)
    assert status == 200
    assert body == {"model_spec": {"name": "default", "signature_name": "", "version": "123"},
                    "metadata": {"signature_def": {"signature_def": half_plus_two_signatures()}}}


def test_prometheus_endpoint(servers, paths):
    """testPrometheusEndpoint, with TF Serving's monitoring_config.txt"""
    server = servers.run("default", paths.half_plus_two, monitoring_config_file=paths.monitoring)
    with urllib.request.urlopen(f"http://{server.rest}/monitoring/prometheus/metrics", timeout=30) as resp:
        assert "# TYPE" in resp.read().decode("utf-8")


@pytest.mark.long
def test_cases_against_two_worker_processes(paths):
    """The upstream cases' calls against `tfpipe serve --workers 2`, each call on a new connection,
    six rounds: whichever worker the kernel hands a connection to, the answer is TF Serving's
    (testPredictSavedModel's Predict, Classify and Regress over gRPC; predict, columnar predict,
    classify, regress, status and Prometheus over REST)."""
    import signal

    from tensorflow_serving.apis import classification_pb2, regression_pb2

    from conftest import start_cli_server

    proc, grpc_port, rest_port = start_cli_server(
        "--workers=2", "--model_name=default", f"--model_base_path={paths.half_plus_two}",
        f"--monitoring_config_file={paths.monitoring}", f"--rest_api_timeout_in_ms={REST_TIMEOUT_MS}")
    address, rest = f"127.0.0.1:{grpc_port}", f"http://127.0.0.1:{rest_port}"
    version = _model_version(paths.half_plus_two)
    try:
        for _ in range(6):
            verify_predict(address, expected_output=3.0, expected_version=version)
            request = classification_pb2.ClassificationRequest()
            request.model_spec.name, request.model_spec.signature_name = "default", "classify_x_to_y"
            request.input.example_list.examples.add().features.feature["x"].float_list.value.extend([2.0])
            assert _stub(address).Classify(request, RPC_TIMEOUT).result.classifications[0].classes[0].score == 3.0
            request = regression_pb2.RegressionRequest()
            request.model_spec.name, request.model_spec.signature_name = "default", "regress_x_to_y"
            request.input.example_list.examples.add().features.feature["x"].float_list.value.extend([2.0])
            assert _stub(address).Regress(request, RPC_TIMEOUT).result.regressions[0].value == 3.0
            assert call_rest(f"{rest}/v1/models/default:predict", {"instances": [2.0, 3.0, 4.0]})[:2] == (
                200, {"predictions": [3.0, 3.5, 4.0]})
            assert call_rest(f"{rest}/v1/models/default:predict", {"inputs": [2.0, 3.0, 4.0]})[:2] == (
                200, {"outputs": [3.0, 3.5, 4.0]})
            assert call_rest(f"{rest}/v1/models/default:classify", {"signature_name": "classify_x_to_y",
                                                                     "examples": [{"x": 2.0}]})[:2] == (
                200, {"results": [[["", 3.0]]]})
            assert call_rest(f"{rest}/v1/models/default:regress", {"signature_name": "regress_x_to_y",
                                                                    "examples": [{"x": 2.0}]})[:2] == (
                200, {"results": [3.0]})
            assert call_rest(f"{rest}/v1/models/default", None)[:2] == (200, {"model_version_status": [
                {"version": str(version), "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}]})
            with urllib.request.urlopen(f"{rest}/monitoring/prometheus/metrics", timeout=30) as resp:
                assert "# TYPE" in resp.read().decode("utf-8")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0


@pytest.mark.skipif(WORKERS > 1, reason="--workers processes cannot share a Unix socket")
def test_predict_uds(servers, paths):
    """testPredictUDS: gRPC over the Unix socket of --grpc_socket_path"""
    server = servers.run("default", paths.half_plus_two)
    verify_predict(f"unix:{server.socket_path}", expected_output=3.0, specify_output=False,
                   expected_version=_model_version(paths.half_plus_three))


def test_tf_saved_model_save(servers, paths):
    """test_tf_saved_model_save: a tf.function of unknown input shape"""
    base = paths.model("tf_saved_model_save")
    server = servers.run("default", base)
    verify_predict(server.grpc, expected_output=12.0, specify_output=False, expected_version=_model_version(base))


def test_tf_saved_model_save_multiple_signatures(servers, paths):
    """test_tf_saved_model_save_multiple_signatures"""
    base = paths.model("tf_saved_model_save_multiple_signatures")
    server = servers.run("default", base)
    verify_predict(server.grpc, expected_output=2.0, expected_version=_model_version(base),
                   signature_name="custom_signature_key")
    verify_predict(server.grpc, expected_output=1.0, expected_version=_model_version(base))


def test_sequential_keras_saved_model_save(servers, paths):
    """test_sequential_keras_saved_model_save (tf.keras as Keras 2, as upstream wrote it)"""
    base = paths.model("keras_sequential_saved_model_save")
    server = servers.run("default", base)
    verify_predict(server.grpc, batch_input=True, specify_output=False, expected_output=2.0,
                   expected_version=_model_version(base))


def test_distrat_sequential_keras_saved_model_save(servers, paths):
    """test_distrat_sequential_keras_saved_model_save: built under MirroredStrategy on two CPUs"""
    base = paths.model("keras_distrat_sequential_saved_model_save")
    server = servers.run("default", base)
    verify_predict(server.grpc, batch_input=True, specify_output=False, expected_output=2.0,
                   expected_version=_model_version(base))


def test_sequential_keras3_saved_model_save(servers, paths):
    """The Keras case with Keras 3, whose SavedModel names the input `inputs` and the output
    `output_0` (upstream's request names, x and y, are Keras 2's)."""
    base = paths.model("keras3_sequential_saved_model_save")
    server = servers.run("default", base)
    verify_predict(server.grpc, batch_input=True, specify_output=False, expected_output=2.0,
                   expected_version=_model_version(base), input_name="inputs", output_name="output_0")


# Every case of the two upstream files (tensorflow_model_server_test.py at tensorflow/serving's
# head, plus testPredictBatching from before session bundles were removed; the REST handler
# test's TEST_F names).
UPSTREAM_CASES = [
    "testGetModelStatus", "testGetModelMetadata", "testClassify", "testClassifyTf2", "testRegress", "testRegressTf2",
    "testMultiInference", "testMultiInferenceTf2", "testPredictSavedModel", "testPredictBatching",
    "testGoodModelConfig", "testBadModelConfig", "testModelConfigReload", "testModelConfigReloadWithZeroPollPeriod",
    "testGoodGrpcChannelArgs", "testClassifyREST", "testRegressREST", "testPredictREST", "testPredictColumnarREST",
    "testGetStatusREST", "testGetModelMetadataREST", "testPrometheusEndpoint", "testPredictUDS",
    "testPredictOnTfLite", "testPredictWithSignatureDefOnTfLite", "test_tf_saved_model_save",
    "test_tf_saved_model_save_multiple_signatures", "test_sequential_keras_saved_model_save",
    "test_distrat_sequential_keras_saved_model_save", "test_profiler_service_with_valid_trace_request",
    "test_tf_text",
    "kPathRegex", "UnsupportedApiCalls", "PredictModelNameVersionErrors", "PredictRequestErrors", "Predict",
    "Regress", "Classify", "GetStatus", "GetModelMetadata",
]


def test_every_upstream_case_is_ported_or_named_with_a_reason():
    import re

    ported = set()
    for obj in list(globals().values()):
        if callable(obj) and getattr(obj, "__name__", "").startswith("test_") and obj.__doc__:
            ported.update(re.findall(r"\w+", obj.__doc__.split("\n")[0]))
    missing = [c for c in UPSTREAM_CASES if c not in ported and c not in NOT_APPLICABLE]
    assert not missing, missing
    assert not set(NOT_APPLICABLE) & ported and all(len(why) > 40 for why in NOT_APPLICABLE.values())
    assert len(UPSTREAM_CASES) - len(NOT_APPLICABLE) == 36


# ---- http_rest_api_handler_test.cc ----------------------------------------------------------

@pytest.fixture(scope="session")
def rest_server(servers, paths):
    """The handler test's ServerCore: version 123 only, then a reload adding Version_Label."""
    import grpc
    from google.protobuf import text_format
    from tensorflow_serving.apis import model_management_pb2, model_service_pb2_grpc

    server = servers.run(None, None, model_config_file=paths.rest)
    request = model_management_pb2.ReloadConfigRequest()
    text_format.Parse(REST_CONFIG.replace("{base}", paths.two_versions), request.config)
    request.config.model_config_list.config[0].version_labels["Version_Label"] = 123
    response = model_service_pb2_grpc.ModelServiceStub(grpc.insecure_channel(server.grpc)).HandleReloadConfigRequest(
        request, RPC_TIMEOUT)
    assert response.status.error_code == 0, response.status.error_message
    return server


def _process(server: Server, method: str, path: str, body: str | None = None) -> tuple[int, dict, dict]:
    req = urllib.request.Request(f"http://{server.rest}{path}", data=None if body is None else body.encode(),
                                 method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read()), dict(resp.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), dict(e.headers)


def test_rest_path_regex():
    """kPathRegex: /v1/... is the REST API's, other paths are not"""
    from tfpipe.serve.transports.rest_api import _API_PATH

    assert _API_PATH.fullmatch("/v1/models")
    assert not _API_PATH.fullmatch("/statuspage") and not _API_PATH.fullmatch("/index")


UNSUPPORTED_API_CALLS = [
    ("GET", "/v1/foo", "Malformed request"),
    ("POST", "/v1/foo", "Malformed request"),
    ("GET", "/v1/models", "Missing model name"),
    ("GET", "/v1/models/debug/model_name", "Malformed request"),
    ("POST", "/v1/models", "Malformed request"),
    ("GET", "/v1/models/foo:predict", "Malformed request"),
    ("GET", "/v1/models/foo/version/50:predict", "Malformed request"),
    ("POST", "/v1/models/foo/version/50:regress", "Malformed request"),
    ("POST", "/v1/models/foo/versions/HELLO:regress", "Malformed request"),
    ("POST", f"/v1/models/foo/versions/{2**64 - 1}:regress", "Failed to convert version"),
    ("POST", "/v1/models/foo/metadata", "Malformed request"),
    ("POST", "/v1/models/foo/label/some_label:regress", "Malformed request"),
    ("POST", "/v1/models/foo/versions/50/labels/some_label:regress", "Malformed request"),
    ("POST", "/v1/models/foo/versions/some_label:regress", "Malformed request"),
]


@pytest.mark.parametrize("method,path,message", UNSUPPORTED_API_CALLS)
def test_unsupported_api_calls(rest_server, method, path, message):
    """UnsupportedApiCalls: INVALID_ARGUMENT (400) with upstream's message"""
    status, body, _ = _process(rest_server, method, path, "" if method == "POST" else None)
    assert status == 400 and message in body["error"], body


def test_predict_model_name_version_errors(rest_server):
    """PredictModelNameVersionErrors: NOT_FOUND (404)"""
    for path in ("/v1/models/foo:predict", "/v1/models/foo/versions/50:predict", f"/v1/models/{REST_MODEL}99:predict"):
        status, body, _ = _process(rest_server, "POST", path, '{ "instances": [1] }')
        assert status == 404, (path, body)


def test_predict_request_errors(rest_server):
    """PredictRequestErrors"""
    path = f"/v1/models/{REST_MODEL}:predict"
    cases = [
        (path, "", "JSON Parse error: The document is empty"),
        (path, "instances = [1, 2]", "JSON Parse error: Invalid value"),
        (path, '{ "instances": ["x", "y"] }', "not of expected type: float"),
        (f"/v1/models/{REST_MODEL}/labels/Version_Nonexistent:predict", '{ "instances": ["x", "y"] }',
         "Unrecognized servable version label"),
        (path, '{ "signature_name": 100 }', "'signature_name' key must be a string value."),
    ]
    for p, body, message in cases:
        status, answer, _ = _process(rest_server, "POST", p, body)
        assert status == 400 and message in answer["error"], (body, answer)


def _ok_json(server, method: str, path: str, body: str | None, expected: dict) -> None:
    status, answer, headers = _process(server, method, path, body)
    assert status == 200 and answer == expected, (path, body, answer)
    assert headers["Content-Type"].startswith("application/json")


def test_rest_predict(rest_server):
    """Predict: latest, a version, a label, an explicit signature, columnar"""
    base = f"/v1/models/{REST_MODEL}"
    _ok_json(rest_server, "POST", f"{base}:predict", '{"instances": [[1.0, 2.0], [3.0, 4.0]]}',
             {"predictions": [[2.5, 3.0], [3.5, 4.0]]})
    _ok_json(rest_server, "POST", f"{base}/versions/123:predict", '{"instances": [1.0, 2.0]}',
             {"predictions": [2.5, 3.0]})
    _ok_json(rest_server, "POST", f"{base}/labels/Version_Label:predict", '{"instances": [1.0, 2.0]}',
             {"predictions": [2.5, 3.0]})
    _ok_json(rest_server, "POST", f"{base}/versions/123:predict",
             '{"signature_name": "serving_default", "instances": [3.0, 4.0]}', {"predictions": [3.5, 4.0]})
    _ok_json(rest_server, "POST", f"{base}/versions/123:predict",
             '{"signature_name": "serving_default", "inputs": [3.0, 4.0]}', {"outputs": [3.5, 4.0]})


def test_rest_regress(rest_server):
    """Regress: latest, a version, a label"""
    body = '{"signature_name": "regress_x_to_y", "examples": [ { "x": 80.0 } ] }'
    for path in ("", "/versions/123", "/labels/Version_Label"):
        _ok_json(rest_server, "POST", f"/v1/models/{REST_MODEL}{path}:regress", body, {"results": [42]})


def test_rest_classify(rest_server):
    """Classify: latest, a label"""
    _ok_json(rest_server, "POST", f"/v1/models/{REST_MODEL}:classify",
             '{"signature_name": "classify_x_to_y", "examples": [ { "x": 20.0 } ] }', {"results": [[["", 12]]]})
    _ok_json(rest_server, "POST", f"/v1/models/{REST_MODEL}/labels/Version_Label:classify",
             '{"signature_name": "classify_x_to_y", "examples": [ { "x": 10.0 } ] }', {"results": [[["", 7]]]})


def test_rest_get_status(rest_server):
    """GetStatus: all versions, a version, a label"""
    expected = {"model_version_status": [
        {"version": "123", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}]}
    for path in ("", "/versions/123", "/labels/Version_Label"):
        _ok_json(rest_server, "GET", f"/v1/models/{REST_MODEL}{path}", None, expected)


def test_rest_get_model_metadata(rest_server):
    """GetModelMetadata, against saved_model_half_plus_two_2_versions_metadata.json's content"""
    _ok_json(rest_server, "GET", f"/v1/models/{REST_MODEL}/metadata", None,
             {"model_spec": {"name": REST_MODEL, "signature_name": "", "version": "123"},
              "metadata": {"signature_def": {"signature_def": half_plus_two_signatures(classify_x2=True)}}})


# ---- the metadata TF Serving's testdata JSON files hold -------------------------------------

def _tensor(dtype: str, name: str, dims: list[int] | None) -> dict:
    shape = {"dim": [], "unknown_rank": True} if dims is None else \
        {"dim": [{"size": str(d), "name": ""} for d in dims], "unknown_rank": False}
    return {"dtype": dtype, "tensor_shape": shape, "name": name}


def half_plus_two_signatures(classify_x2: bool = False) -> dict:
    """The signature defs of TF Serving's half_plus_two test model, as its REST API prints them."""
    batch = [-1, 1]
    examples = _tensor("DT_STRING", "tf_example:0", None)

    def sig(inputs: dict, outputs: dict, method: str) -> dict:
        return {"inputs": inputs, "outputs": outputs, "method_name": f"tensorflow/serving/{method}", "defaults": {}}

    out = {
        "regress_x2_to_y3": sig({"inputs": _tensor("DT_FLOAT", "x2:0", batch)},
                                {"outputs": _tensor("DT_FLOAT", "y3:0", batch)}, "regress"),
        "serving_default": sig({"x": _tensor("DT_FLOAT", "x:0", batch)}, {"y": _tensor("DT_FLOAT", "y:0", batch)},
                               "predict"),
        "classify_x_to_y": sig({"inputs": examples}, {"scores": _tensor("DT_FLOAT", "y:0", batch)}, "classify"),
        "regress_x_to_y2": sig({"inputs": examples}, {"outputs": _tensor("DT_FLOAT", "y2:0", batch)}, "regress"),
        "regress_x_to_y": sig({"inputs": examples}, {"outputs": _tensor("DT_FLOAT", "y:0", batch)}, "regress"),
    }
    if classify_x2:
        out["classify_x2_to_y3"] = sig({"inputs": _tensor("DT_FLOAT", "x2:0", batch)},
                                       {"scores": _tensor("DT_FLOAT", "y3:0", batch)}, "classify")
    return out
