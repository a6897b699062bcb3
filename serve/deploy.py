"""The serve step of `tfpipe run`: TF Serving configs for the exported model in one directory, the
embedded server started on them, and a check that its REST and gRPC answers match the SavedModel
run in-process. The same files run under tensorflow_model_server (the command is in serve.json)."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import threading
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from tfpipe.files import write_json
from tfpipe.versions import candidate_model, candidate_path
from tfpipe.serve.config import ServeConfig
from tfpipe.serve.errors import ServeError
from tfpipe.stage import ServeOutputs, StageResult

# {input name: TensorFlow dtype name, e.g. 'DT_FLOAT'} -> that many rows of {input: python value}
RowSource = Callable[[dict[str, str], int], list[dict[str, Any]]]


class CheckFailed(ServeError):
    """The served answers differ from the SavedModel's (a user error: exit 2, one line)."""


def write_batching(path: str, cfg: ServeConfig) -> str:
    """batching.config (TF Serving's BatchingParameters text proto) from the [serve] section."""
    from tfpipe.serve.tfserving.configs import write_text_proto

    return write_text_proto(path, cfg.batch_options().to_proto())


class Deployment:
    """The embedded server on the configs in `config_dir`: started when first needed, restarted by
    `deploy`, its log lines appended to `log_path`."""

    def __init__(self, cfg: ServeConfig, config_dir: str, log_path: str):
        self.cfg, self.config_dir, self.log_path = cfg, config_dir, log_path
        self.server = None
        self._ctx = None
        self._log = None

    def reconfigure(self, cfg: ServeConfig) -> None:
        """Serve with `cfg` from the next `deploy` on (tfpipe run, once tune has chosen the batching)."""
        self.cfg = cfg

    def options(self):
        from tfpipe.serve.flags import ServeOptions

        c = self.cfg
        paths = {k: os.path.join(self.config_dir, f"{k}.config") for k in ("models", "batching", "monitoring")}
        return ServeOptions(port=c.port, rest_api_port=c.rest_api_port, host=c.host,
                            model_config_file=paths["models"], monitoring_config_file=paths["monitoring"],
                            enable_batching=c.batching_on(),
                            batching_parameters_file=paths["batching"] if c.batching_on() else "",
                            drain_seconds=c.drain_seconds, config_dir=self.config_dir)

    def start(self):
        """The running server (started on the configs written by `deploy`, once)."""
        if self.server is not None:
            return self.server
        from tfpipe.serve.server import ServerThread

        os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
        self._log = open(self.log_path, "a", buffering=1)
        ctx = ServerThread(self.options(), log=lambda line: self._log.write(line + "\n"))
        try:
            self.server = ctx.__enter__()
        except BaseException:  # e.g. a port in use: nothing is left open for the next try
            self._log.close()
            self._log = None
            raise
        self._ctx = ctx
        return self.server

    def stop(self) -> None:
        if self._ctx is not None:
            self._ctx.__exit__(None, None, None)
            self._ctx = self.server = None
        if self._log is not None:
            self._log.close()
            self._log = None

    @contextlib.contextmanager
    def logging_requests(self, model: str, prefix: str, rate: float = 1.0):
        """Log `model`'s requests to the tfrecord collector at `prefix` while the block runs (as a
        logging_config in the model's config would), then write out what is queued and stop.
        The generated models.config stays free of logging_config: real tensorflow_model_server
        has no collector for it."""
        from tensorflow_serving.config import model_server_config_pb2

        server = self.start()
        config = model_server_config_pb2.ModelServerConfig()
        c = config.model_config_list.config.add(name=model)
        c.logging_config.log_collector_config.type = "tfrecord"
        c.logging_config.log_collector_config.filename_prefix = prefix
        c.logging_config.sampling_config.sampling_rate = rate
        server.request_logs.update(config)
        try:
            yield
        finally:
            server.request_logs.update(model_server_config_pb2.ModelServerConfig())  # writes the queue, closes

    def deploy(self, name: str, base_path: str, version: int, rows: RowSource, tolerance: float,
               log: Callable[[str], None], notes: dict[str, Any] | None = None,
               candidate: int | None = None) -> dict[str, Any]:
        """Write the configs for model `name` at `base_path`, (re)start the server on them, check it
        against that version's SavedModel on `rows`, write serve.json (with `notes`); return its content.
        `candidate`: a version in BASE/NAME/candidates/ to serve beside it as NAME-candidate (checked too)."""
        from tfpipe.serve.flags import ServeOptions
        from tfpipe.serve.tfserving.launcher import server_flags, write_configs

        os.makedirs(self.config_dir, exist_ok=True)
        self.stop()  # a new model version or new settings: start afresh on the new configs
        c = self.cfg
        batching = os.path.join(self.config_dir, "batching.config")
        if c.batching_on():
            write_batching(batching, c)
        elif os.path.exists(batching):
            os.remove(batching)
        # Written by the code `tfpipe serve --backend tfserving` uses: tensorflow_model_server runs these files.
        seed = ServeOptions(model_name=name, model_base_path=base_path, enable_batching=c.batching_on(),
                            batching_parameters_file=batching if c.batching_on() else "")
        paths = write_configs(seed, self.config_dir)
        if candidate is not None:
            from tfpipe.serve.tfserving.configs import add_candidate

            add_candidate(paths["models"], name, base_path, candidate)
        server = self.start()
        log(f"embedded server: gRPC {c.host}:{server.grpc_port}, REST {c.host}:{server.rest_port}")
        model_path = os.path.join(base_path, str(version))
        check = check_served(server, model_path, name, rows, c.check_rows, tolerance, log)
        if candidate is not None:
            notes = {**(notes or {}), "candidate": {
                "model": candidate_model(name), "version": candidate,
                "check": check_served(server, candidate_path(base_path, candidate), candidate_model(name), rows,
                                      c.check_rows, tolerance, log)}}
        result = {
            "model": name, "version": version, "model_path": model_path, "configs": paths,
            # the ports this deployment's server listened on (fixed ones: --set serve.port=8500 ...)
            "tensorflow_model_server": ["tensorflow_model_server", f"--port={server.grpc_port}",
                                        f"--rest_api_port={server.rest_port}",
                                        *server_flags(self.options(), paths, ports=False)],
            "check": check, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"), **(notes or {}),
        }
        write_json(os.path.join(self.config_dir, "serve.json"), result)
        return result

    def serve_forever(self, info: dict[str, Any], say: Callable[[str], None]) -> None:
        """Keep the server up in the foreground until Ctrl-C or SIGTERM, after saying how to call it
        (`info`: the content of serve.json)."""
        server = self.start()
        name, host = info["model"], "127.0.0.1"
        example = info["check"]["example"]["instance"]
        say(f"serving {name} (Ctrl-C to stop): gRPC {host}:{server.grpc_port}, REST {host}:{server.rest_port}")
        say(f"  curl -s http://{host}:{server.rest_port}/v1/models/{name}")
        say(f"  curl -s -X POST http://{host}:{server.rest_port}/v1/models/{name}:predict "
            f"-d '{json.dumps({'instances': [example]})}'")
        say(grpc_snippet(name, f"{host}:{server.grpc_port}", example, info["check"]["input_dtypes"]))
        stop = threading.Event()
        previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            while not stop.wait(1.0):
                pass
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        say("stopping: finishing in-flight requests")


def grpc_snippet(name: str, address: str, row: dict[str, Any], dtypes: dict[str, str]) -> str:
    """A shell here-document that calls Predict on `row` with the official stubs."""
    make = {k: v.removeprefix("DT_").lower() for k, v in dtypes.items()}  # what tf.make_tensor_proto takes
    values = ", ".join(f"{k!r}: " + (f"base64.b64decode({v['b64']!r})" if isinstance(v, dict) and "b64" in v else repr(v))
                       for k, v in row.items())
    return ("  python - <<'EOF'\n"
            "import base64, grpc, tensorflow as tf\n"
            "from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc\n"
            f"req = predict_pb2.PredictRequest(); req.model_spec.name = {name!r}\n"
            f"row = {{{values}}}\n"
            f"dtypes = {make!r}\n"
            "for k, v in row.items(): req.inputs[k].CopyFrom(tf.make_tensor_proto([v], dtype=dtypes[k]))\n"
            f"stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel('{address}'))\n"
            "print(stub.Predict(req, timeout=10).outputs)\n"
            "EOF")


def check_served(server, model_path: str, name: str, rows: RowSource, rows_wanted: int, tolerance: float,
                 log: Callable[[str], None]) -> dict[str, Any]:
    """Predict the same rows in-process with the SavedModel and through the server's REST and gRPC
    APIs; the answers must agree within `tolerance` (strings exactly)."""
    import urllib.request

    import grpc
    import numpy as np
    import tensorflow as tf
    from tensorflow.core.framework import types_pb2
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    from tfpipe.serve.codecs.tensor_proto import tensor_proto, tensor_to_numpy

    fn = tf.saved_model.load(model_path).signatures["serving_default"]
    # The inputs as a client names them: the SignatureDef's keys (tf.function's structured
    # signature turns a name such as 'Sepal.Length' into a Python identifier).
    dtypes = signature_inputs(model_path, "serving_default")
    inputs = {k: types_pb2.DataType.Name(dtype.as_datatype_enum) for k, dtype in dtypes.items()}
    batch = rows(inputs, rows_wanted)
    if not batch:
        raise CheckFailed("no rows to check the served model on")
    columns = {k: np.array([r[k].encode() if isinstance(r[k], str) else r[k] for r in batch],
                           dtype=object if dtype == tf.string else dtype.as_numpy_dtype)
               for k, dtype in dtypes.items()}
    local = {k: v.numpy() for k, v in fn(**{k: tf.constant(v, dtypes[k]) for k, v in columns.items()}).items()}

    rest = f"http://127.0.0.1:{server.rest_port}"
    # encoded images as {"b64": ...}, TF Serving's JSON for binary strings
    instances = [{k: {"b64": base64.b64encode(v).decode("ascii")} if isinstance(v, bytes) else v for k, v in r.items()}
                 for r in batch]
    req = urllib.request.Request(f"{rest}/v1/models/{name}:predict", data=json.dumps({"instances": instances}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        predictions = json.load(r)["predictions"]
    if len(local) == 1 and not isinstance(predictions[0], dict):  # one output: bare values per row
        predictions = [{next(iter(local)): p} for p in predictions]
    rest_out = {k: np.array([p[k] for p in predictions]) for k in local}

    request = predict_pb2.PredictRequest()
    request.model_spec.name, request.model_spec.signature_name = name, "serving_default"
    for k, v in columns.items():
        request.inputs[k].CopyFrom(tensor_proto(v))
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)
    grpc_out = {k: tensor_to_numpy(v, k) for k, v in response.outputs.items()}

    worst = 0.0
    for api, served in (("REST", rest_out), ("gRPC", grpc_out)):
        worst = max(worst, compare(api, local, served, tolerance))
        log(f"{api}: {len(batch)} rows agree with the in-process SavedModel")
    # 7 significant digits name the same float32 as the row's value, and read better in a curl line.
    instance = {k: float(f"{v:.7g}") if isinstance(v, float) else v for k, v in instances[0].items()}
    return {"rows": len(batch), "outputs": sorted(local), "max_abs_diff": worst, "tolerance": tolerance,
            "apis": ["REST", "gRPC"], "input_dtypes": inputs,
            "example": {"instance": instance, "prediction": {k: plain(v[0]) for k, v in local.items()}},
            "served": predictions[0]}


def signature_inputs(model_path: str, signature: str) -> dict[str, Any]:
    """The input names and dtypes of a SavedModel's signature, from its SignatureDef."""
    import tensorflow as tf
    from tensorflow.core.protobuf import saved_model_pb2

    from tfpipe.serve.core.saved_model import meta_graph

    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(model_path, "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    sig = meta_graph(proto, ("serve",)).signature_def[signature]
    return {k: tf.as_dtype(v.dtype) for k, v in sig.inputs.items()}


def compare(api: str, want: dict[str, Any], got: dict[str, Any], tolerance: float) -> float:
    """The largest absolute difference between `got` and `want` over their numeric outputs; raises
    CheckFailed when an output is missing, a string differs or a number is off by more than `tolerance`."""
    import numpy as np

    worst = 0.0
    for key, w in want.items():
        if key not in got:
            raise CheckFailed(f"{api} answered no output {key!r} (it gave {', '.join(sorted(got)) or 'none'})")
        g = np.asarray(got[key])
        if w.dtype.kind in "SO":
            w_text = [x.decode() if isinstance(x, bytes) else str(x) for x in w.ravel()]
            g_text = [x.decode() if isinstance(x, bytes) else str(x) for x in g.ravel()]
            if w_text != g_text:
                raise CheckFailed(f"{api} answered {key}={g_text[:3]}... where the SavedModel gives {w_text[:3]}...")
            continue
        if g.size != w.size:
            raise CheckFailed(f"{api} output {key} has {g.size} values where the SavedModel gives {w.size}")
        gap = np.abs(g.astype(np.float64).reshape(w.shape) - w)
        diff = float(np.max(gap)) if w.size else 0.0
        worst = max(worst, diff)
        # relative to each value's size: a regression may answer 500,000, exact in float32 to 0.03
        if w.size and not np.all(gap <= tolerance * np.maximum(1.0, np.abs(w))):
            raise CheckFailed(f"{api} output {key} differs from the SavedModel by {diff:.3g} (tolerance {tolerance}"
                              " of each value's size, at least 1)")
    return worst


def plain(value: Any) -> Any:
    """A numpy value as JSON would hold it (bytes decoded)."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def result(out: str, noun: str, tuned: str = "") -> StageResult:
    """The serve step's output for `tfpipe run`: the version served and how its REST and gRPC answers
    compared with the SavedModel's on `noun` (rows or images), in one line; `tuned` names the batching
    `tfpipe tune` chose."""
    path = os.path.join(out, "serve.json")
    with open(path) as f:
        served = json.load(f)
    check = served["check"]
    summary = (f"{served['model']} version {served['version']} on the embedded server: REST and gRPC answers match "
               f"the SavedModel on {check['rows']} {noun} (max diff {check['max_abs_diff']:.1e})"
               + (f"; batching tuned: {tuned}" if tuned else ""))
    candidate = served.get("candidate")
    if candidate:
        summary += (f"; version {candidate['version']} beside it as {candidate['model']} (matches its SavedModel "
                    f"too), for the serving gate")
    return StageResult(path, summary, ServeOutputs(out))
