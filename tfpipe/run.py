"""`tfpipe run`: data -> train -> export -> serve -> loadtest in one workdir.

Each step is cached: its fingerprint is its config section, the hashes of its inputs (the
previous steps' manifests, or the raw input files for data) and the tfpipe version. A step
whose fingerprint and output are unchanged is skipped; one that ran reruns everything after
it through the changed hashes. manifest.json records every step (fingerprint, inputs,
outputs, times, status, log) and so the lineage of the model being served.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from tfpipe import __version__
from tfpipe.config import Config
from tfpipe.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USER_ERROR, ConfigError, RunError, user_errors
from tfpipe.files import digest, file_sha256
from tfpipe.manifest import STEPS, read_manifest

NEEDS = {"data": (), "train": ("data",), "export": ("data", "train"), "serve": ("data", "export"),
         "loadtest": ("data", "export", "serve")}
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO_CONFIG = os.path.join(REPO_ROOT, "examples", "penguins.toml")


class StepFailed(Exception):
    """A step raised; carries the step so the run can say where and point at the log."""

    def __init__(self, step: str, error: BaseException):
        super().__init__(f"{step}: {error}")
        self.step, self.error = step, error


@dataclass
class RunRequest:
    config: Config
    config_path: str | None
    workdir: str
    from_step: str | None = None
    only: str | None = None
    force: bool = False
    serve_after: bool = False
    debug: bool = False
    command: list[str] = field(default_factory=lambda: list(sys.argv))


def default_workdir(config: Config, config_path: str | None) -> str:
    if config.run.workdir:
        return config.run.workdir
    stem = os.path.splitext(os.path.basename(config_path or DEMO_CONFIG))[0]
    return os.path.join("runs", stem)


def shown(path: str) -> str:
    """A path as the user would type it: relative under the current directory, else absolute."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# ---- the terminal: one line per step ---------------------------------------------------------------

class Console:
    """The real terminal, kept apart from fds 1 and 2, which point at a step's log while it runs."""

    def __init__(self) -> None:
        sys.stdout.flush()
        self.out = os.fdopen(os.dup(1), "w", buffering=1)
        self.tty = self.out.isatty()
        self._lock = threading.Lock()

    def print(self, text: str = "") -> None:
        with self._lock:
            self.out.write(("\r\033[K" if self.tty else "") + text + "\n")
            self.out.flush()

    @contextlib.contextmanager
    def running(self, step: str, why: str) -> Iterator[None]:
        """'running' with the elapsed seconds ticking on a terminal; one plain line otherwise."""
        started = time.monotonic()
        stop = threading.Event()
        if not self.tty:
            self.print(f"  {step:<9}running  ({why})")
            yield
            return

        def tick() -> None:
            while not stop.wait(0.5):
                with self._lock:
                    self.out.write(f"\r\033[K  {step:<9}running {time.monotonic() - started:6.0f}s  ({why})")
                    self.out.flush()

        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        try:
            yield
        finally:
            stop.set()
            ticker.join()

    def close(self) -> None:
        self.out.close()


@contextlib.contextmanager
def output_into(path: str, enabled: bool) -> Iterator[None]:
    """Send fds 1 and 2 (Python's prints, Keras, Beam, TensorFlow's native logs) to `path`."""
    if not enabled:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)


# ---- the run ---------------------------------------------------------------------------------------

class Run:
    """One `tfpipe run`: decides per step whether it is cached, runs the others, keeps the manifest."""

    def __init__(self, req: RunRequest):
        self.req, self.cfg = req, req.config
        self.workdir = os.path.abspath(req.workdir)
        self.manifest: dict[str, Any] = {}
        self.states: dict[str, str] = {}
        self.server = None
        self._server_ctx = None
        self._server_log = None
        # each step: (forced, log) -> (outputs for the manifest, summary line, exit code)
        self.steps: dict[str, Callable[[bool, Callable[[str], None]], tuple[dict[str, Any], str, int]]] = {
            "data": self.step_data, "train": self.step_train, "export": self.step_export,
            "serve": self.step_serve, "loadtest": self.step_loadtest}
        assert tuple(self.steps) == STEPS

    # paths -------------------------------------------------------------------------------------
    def path(self, *parts: str) -> str:
        return os.path.join(self.workdir, *parts)

    @property
    def model_base(self) -> str:
        return self.path("export", "models", self.cfg.export.name)

    # fingerprints ------------------------------------------------------------------------------
    def config_part(self, step: str) -> dict[str, Any]:
        c = self.cfg
        if step == "data":
            schema = c.data.schema_path
            return {**c.data.result_fingerprint_fields(), "schema_sha256": file_sha256(schema) if schema else None}
        if step == "train":
            return c.train.result_fingerprint_fields()
        if step == "export":
            return c.export.model_dump(exclude={"model", "data", "base", "version", "keep"})
        if step == "serve":
            return c.serve.fingerprint_fields()
        return {**c.loadtest.model_dump(exclude={"target", "model", "data", "out", "version", "label", "payload"}),
                "protocol": c.serve.protocol}

    def input_part(self, step: str) -> dict[str, Any]:
        if step == "data":
            from tfpipe.pipeline.inputs import resolve_inputs

            return {"files": [{"path": p, "size": size, "mtime": mtime}
                              for p, _, _, size, mtime in resolve_inputs(self.cfg.data.input, self.cfg.data.format)]}
        return {need: self.manifest["steps"][need]["outputs"]["sha256"] for need in NEEDS[step]}

    def fingerprint(self, step: str) -> tuple[str, dict[str, Any]]:
        parts = {"config": digest(self.config_part(step)), "inputs": self.input_part(step), "tfpipe": __version__}
        return digest(parts), parts

    def why_run(self, step: str, fp: str, parts: dict[str, Any]) -> str | None:
        """None when the step is cached; otherwise why it runs, in a few words."""
        req = self.req
        if req.force:
            return "--force"
        if req.from_step and STEPS.index(step) >= STEPS.index(req.from_step):
            return f"--from {req.from_step}"
        prev = self.manifest.get("steps", {}).get(step)
        if not prev:
            return "first run"
        status = prev.get("status")
        if status == "running":
            return "the last run stopped during this step"
        if status in ("failed", "interrupted"):
            return f"{status} last time"
        if prev.get("fingerprint") != fp:
            old = prev.get("parts", {})
            if old.get("tfpipe") != parts["tfpipe"]:
                return "tfpipe version changed"
            if old.get("config") != parts["config"]:
                return f"[{step}] config changed"
            if step == "data":
                return "input files changed"
            changed = [k for k, v in parts["inputs"].items() if old.get("inputs", {}).get(k) != v]
            return f"{', '.join(changed) or 'an input'} output changed"
        if file_sha256(prev["outputs"]["manifest"]) != prev["outputs"]["sha256"]:
            return "its output is missing or was changed"
        return None

    # manifest ----------------------------------------------------------------------------------
    def save_manifest(self) -> None:
        self.manifest["updated"] = now()
        tmp = self.path(f".manifest.json.{os.getpid()}")
        with open(tmp, "w") as f:
            json.dump(self.manifest, f, indent=2)
        os.replace(tmp, self.path("manifest.json"))

    # the server --------------------------------------------------------------------------------
    def ensure_server(self):
        """The embedded server on the generated configs, started once per run when a step needs it."""
        if self.server is not None:
            return self.server
        from tfpipe.serve.server import ServerThread

        log_path = self.path("logs", "server.log")
        self._server_log = open(log_path, "a", buffering=1)
        self._server_ctx = ServerThread(self.serve_options(), log=lambda line: self._server_log.write(line + "\n"))
        with output_into(log_path, not self.req.debug):  # TensorFlow's import chatter
            self.server = self._server_ctx.__enter__()
        return self.server

    def serve_options(self):
        from tfpipe.serve.flags import ServeOptions

        s = self.cfg.serve
        paths = {k: self.path("serve", f"{k}.config") for k in ("models", "batching", "monitoring")}
        return ServeOptions(port=s.port, rest_api_port=s.rest_api_port, host=s.host,
                            model_config_file=paths["models"], monitoring_config_file=paths["monitoring"],
                            enable_batching=s.enable_batching,
                            batching_parameters_file=paths["batching"] if s.enable_batching else "",
                            file_system_poll_wait_seconds=1, drain_seconds=5.0, config_dir=self.path("serve"))

    def stop_server(self) -> None:
        if self._server_ctx is not None:
            self._server_ctx.__exit__(None, None, None)
            self._server_ctx = self.server = None
        if self._server_log is not None:
            self._server_log.close()
            self._server_log = None

    # the steps ---------------------------------------------------------------------------------
    def execute(self, console: Console) -> int:
        req = self.req
        os.makedirs(self.path("logs"), exist_ok=True)
        self.manifest = read_manifest(self.workdir)
        stopped = [s for s, v in self.manifest.get("steps", {}).items() if v.get("status") != "done"]
        if stopped:
            console.print(f"resuming: the last run stopped at {stopped[0]} "
                          f"({self.manifest['steps'][stopped[0]]['status']})")
        self.manifest.update({"tfpipe_version": __version__, "workdir": self.workdir,
                              "config_path": os.path.abspath(req.config_path) if req.config_path else None,
                              "config": self.cfg.model_dump(mode="json", by_alias=True)})
        self.manifest.setdefault("steps", {})
        self.manifest["last_run"] = {"command": req.command, "started": now(), "states": self.states}
        selected = [req.only] if req.only else list(STEPS)
        if req.only:
            missing = [n for n in NEEDS[req.only] if self.manifest["steps"].get(n, {}).get("status") != "done"]
            if missing:
                raise RunError(f"--only {req.only} needs the output of {', '.join(missing)}: "
                               f"run without --only first")
        code = 0
        for step in selected:
            try:
                fp, parts = self.fingerprint(step)
            except Exception as e:  # e.g. the data's input files are missing
                self.fail(step, {"started": now(), "reason": "fingerprint"}, time.monotonic(), e, console)
            why = self.why_run(step, fp, parts)
            prev = self.manifest["steps"].get(step, {})
            if why is None:
                self.states[step] = "cached"
                console.print(f"  {step:<9}cached   {0:6.1f}s  {prev.get('summary', '')}")
                continue
            code = max(code, self.run_step(step, fp, parts, why, console))
        self.manifest["last_run"]["ended"] = now()
        self.save_manifest()
        return code

    def run_step(self, step: str, fp: str, parts: dict[str, Any], why: str, console: Console) -> int:
        log_path = self.path("logs", f"{step}.log")
        entry = {"status": "running", "fingerprint": fp, "parts": parts, "started": now(),
                 "log": os.path.relpath(log_path, self.workdir), "reason": why}
        self.manifest["steps"][step] = entry
        self.states[step] = "running"
        self.save_manifest()
        started = time.monotonic()
        with open(log_path, "a") as f:
            f.write(f"\n=== {step} {entry['started']} ({why}) ===\n")
        forced = why.startswith("--")
        try:
            with console.running(step, why), output_into(log_path, not self.req.debug):
                outputs, summary, code = self.steps[step](forced, lambda line: print(line, flush=True))
        except BaseException as e:
            self.fail(step, entry, started, e, console)
        entry.update(status="done", ended=now(), elapsed_s=round(time.monotonic() - started, 2),
                     outputs=outputs, summary=summary, error=None)
        self.states[step] = "done"
        self.save_manifest()
        console.print(f"  {step:<9}done     {entry['elapsed_s']:6.1f}s  {summary}")
        return code

    def fail(self, step: str, entry: dict[str, Any], started: float, e: BaseException, console: Console):
        """Record the failure (or interruption) in the manifest and the step's log, say so, raise StepFailed."""
        log_path = self.path("logs", f"{step}.log")
        interrupted = isinstance(e, KeyboardInterrupt)
        entry.update(status="interrupted" if interrupted else "failed", ended=now(),
                     elapsed_s=round(time.monotonic() - started, 2), log=os.path.relpath(log_path, self.workdir),
                     error=None if interrupted else f"{type(e).__name__}: {e}")
        self.manifest["steps"][step] = entry
        self.states[step] = entry["status"]
        self.save_manifest()
        with open(log_path, "a") as f:
            if isinstance(e, user_errors()):
                f.write(f"error: {e}\n")
            else:
                traceback.print_exception(e, file=f)
        reason = "" if interrupted else (str(e).splitlines() or [type(e).__name__])[0]
        console.print(f"  {step:<9}{entry['status']:<8} {entry['elapsed_s']:6.1f}s  {reason}")
        console.print(f"  log: {shown(log_path)}")
        raise StepFailed(step, e) from e

    def step_data(self, forced: bool, log: Callable[[str], None]):
        from tfpipe.pipeline.job import run

        cfg = self.cfg.data.model_copy(update={"out": self.path("data"), "force": forced})
        run(cfg, log=log)
        m = _load(self.path("data", "data.json"))
        c = m["counts"]
        summary = (f"{c['read']:,} rows -> " + ", ".join(f"{k} {v:,}" for k, v in c["splits"].items())
                   + f"; {c['bad']:,} dead-lettered")
        return self._outputs(self.path("data", "data.json"), path=self.path("data"),
                             fingerprint=m["fingerprint"]), summary, 0

    def step_train(self, forced: bool, log: Callable[[str], None]):
        from tfpipe.train.job import run

        cfg = self.cfg.train.model_copy(update={"data": self.path("data"), "out": self.path("train"),
                                                "force": forced})
        run(cfg, log=log)
        m = _load(self.path("train", "train.json"))
        split = "eval" if "eval" in m["metrics"] else next(iter(m["metrics"]), None)
        metrics = m["metrics"].get(split, {})
        shown = next((k for k in ("accuracy", "auc", "mae", "rmse") if k in metrics), None)
        summary = (f"{m['epochs_run']} epochs" + (f" (resumed after epoch {m['resumed_from_epoch']})"
                                                  if m.get("resumed_from_epoch") else "")
                   + (f", {split} {shown} {metrics[shown]:.3f}" if shown else "")
                   + f", {m['precision']['policy']}, {m.get('examples_per_s', 0):,.0f} examples/s")
        return self._outputs(self.path("train", "train.json"), path=self.path("train"),
                             fingerprint=m["fingerprint"]), summary, 0

    def step_export(self, forced: bool, log: Callable[[str], None]):
        from tfpipe.export.job import run

        cfg = self.cfg.export.model_copy(update={"model": self.path("train"), "data": self.path("data"),
                                                 "base": self.path("export", "models")})
        final = run(cfg, log=log)
        m = _load(os.path.join(final, "assets.extra", "export.json"))
        variants = [v for v in m["variants"] if v["variant"] != "savedmodel"]
        kept = [v["variant"] for v in variants if not v.get("dropped")]
        dropped = [f"{v['variant']} dropped, {v['drop']:.1%} less accurate" for v in variants if v.get("dropped")]
        summary = (f"{m['name']} version {m['version']}: SavedModel" + (f" + TFLite {', '.join(kept)}" if kept else "")
                   + (f" ({'; '.join(dropped)})" if dropped else ""))
        return self._outputs(os.path.join(final, "assets.extra", "export.json"), path=final, name=m["name"],
                             version=m["version"]), summary, 0

    def step_serve(self, forced: bool, log: Callable[[str], None]):
        from tfpipe.serve.tfserving import server_flags, write_configs

        export = self.manifest["steps"]["export"]["outputs"]
        serve_dir = self.path("serve")
        os.makedirs(serve_dir, exist_ok=True)
        self.stop_server()  # a new model version or new settings: start afresh on the new configs
        s = self.cfg.serve
        if s.enable_batching:
            _write_batching(os.path.join(serve_dir, "batching.config"), s)
        elif os.path.exists(os.path.join(serve_dir, "batching.config")):
            os.remove(os.path.join(serve_dir, "batching.config"))
        from tfpipe.serve.flags import ServeOptions

        # models.config names the exported model; written by the same code `tfpipe serve --backend
        # tfserving` uses, so tensorflow_model_server can run these exact files.
        seed = ServeOptions(model_name=export["name"], model_base_path=self.model_base,
                            enable_batching=s.enable_batching,
                            batching_parameters_file=os.path.join(serve_dir, "batching.config")
                            if s.enable_batching else "")
        paths = write_configs(seed, serve_dir)
        opts = self.serve_options()
        server = self.ensure_server()
        log(f"embedded server: gRPC {s.host}:{server.grpc_port}, REST {s.host}:{server.rest_port}")
        check = check_served(server, export["path"], export["name"], self.path("data"), s.check_rows,
                             self.cfg.export.tolerance, log)
        result = {
            "model": export["name"], "version": export["version"], "model_path": export["path"],
            "configs": {k: os.path.relpath(v, self.workdir) for k, v in paths.items()},
            "tensorflow_model_server": ["tensorflow_model_server", "--port=8500", "--rest_api_port=8501",
                                        *server_flags(opts, paths, ports=False)],
            "check": check, "created": now(),
        }
        with open(os.path.join(serve_dir, "serve.json"), "w") as f:
            json.dump(result, f, indent=2)
        summary = (f"{export['name']} version {export['version']} on the embedded server: REST and gRPC answers "
                   f"match the SavedModel on {check['rows']} rows (max diff {check['max_abs_diff']:.1e})")
        return self._outputs(os.path.join(serve_dir, "serve.json"), path=serve_dir), summary, 0

    def step_loadtest(self, forced: bool, log: Callable[[str], None]):
        from tfpipe.loadtest.job import run

        export = self.manifest["steps"]["export"]["outputs"]
        server = self.ensure_server()
        s = self.cfg.serve
        target = (f"http://127.0.0.1:{server.rest_port}" if s.protocol == "rest"
                  else f"grpc://127.0.0.1:{server.grpc_port}")
        out = self.path("loadtest")
        cfg = self.cfg.loadtest.model_copy(update={"target": target, "model": export["name"],
                                                   "data": self.path("data"), "payload": None, "out": out,
                                                   "version": None, "label": None, "model_path": export["path"]})
        code = run(cfg, log=log)  # publishes `out` whole (an interrupted run too: 130)
        if code == EXIT_INTERRUPTED:
            raise KeyboardInterrupt
        r = _load(os.path.join(out, "results.json"))
        best = max(r["steps"], key=lambda st: st["rps"])
        summary = (f"{len(r['steps'])} step(s) over {s.protocol.upper()}, up to {best['rps']:,.0f} req/s, "
                   f"p99 {best['p99_ms']:.2f} ms at that load, {sum(st['errors'] for st in r['steps'])} errors")
        if r["slo_passed"] is not None:
            summary += f"; SLO {r['slo']} " + ("met" if r["slo_passed"] else "MISSED")
        return self._outputs(os.path.join(out, "results.json"), path=out, slo_passed=r["slo_passed"]), summary, code

    def _outputs(self, manifest_path: str, **extra: Any) -> dict[str, Any]:
        return {"manifest": manifest_path, "sha256": file_sha256(manifest_path), **extra}


def _load(path: str) -> dict[str, Any]:
    with open(path) as f:
        return json.load(f)


def _write_batching(path: str, s) -> None:
    from tfpipe.serve.configs import write_text_proto
    from tfpipe.serve.protos import BatchingParameters

    p = BatchingParameters()
    p.max_batch_size.value = s.max_batch_size
    p.batch_timeout_micros.value = s.batch_timeout_micros
    p.max_enqueued_batches.value = s.max_enqueued_batches
    p.num_batch_threads.value = s.num_batch_threads or (os.cpu_count() or 1)
    write_text_proto(path, p)


def check_served(server, model_path: str, name: str, data_dir: str, rows_wanted: int, tolerance: float,
                 log: Callable[[str], None]) -> dict[str, Any]:
    """Predict the same eval rows in-process with the SavedModel and through the server's REST and
    gRPC APIs; the answers must agree within `tolerance` (classes exactly)."""
    import urllib.request

    import grpc
    import numpy as np
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    from tfpipe.loadtest.payloads import grpc_requests, rows_from_data, saved_model_feeds, signature_inputs
    from tfpipe.serve.requests import tensor_to_numpy

    rest = f"http://127.0.0.1:{server.rest_port}"
    inputs = signature_inputs("rest", rest, name, None, None, "serving_default")
    rows = rows_from_data(data_dir, inputs, limit=rows_wanted)

    fn = tf.saved_model.load(model_path).signatures["serving_default"]
    local = {k: v.numpy() for k, v in fn(**saved_model_feeds(fn, rows)).items()}

    body = json.dumps({"instances": rows}).encode()
    req = urllib.request.Request(f"{rest}/v1/models/{name}:predict", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        predictions = json.load(r)["predictions"]
    if len(local) == 1 and not isinstance(predictions[0], dict):  # one output: bare values per row
        predictions = [{next(iter(local)): p} for p in predictions]
    rest_out = {k: np.array([p[k] for p in predictions]) for k in local}

    request = predict_pb2.PredictRequest.FromString(
        grpc_requests(rows, len(rows), inputs, name, None, None, "serving_default")[0])
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)
    grpc_out = {k: tensor_to_numpy(v, k) for k, v in response.outputs.items()}

    worst = 0.0
    for api, served in (("REST", rest_out), ("gRPC", grpc_out)):
        for key, want in local.items():
            got = served[key]
            if want.dtype.kind in "SO":
                want_text = [w.decode() if isinstance(w, bytes) else str(w) for w in want.ravel()]
                got_text = [g.decode() if isinstance(g, bytes) else str(g) for g in np.asarray(got).ravel()]
                if want_text != got_text:
                    raise RunError(f"{api} answered {key}={got_text[:3]}... where the SavedModel gives "
                                   f"{want_text[:3]}...")
                continue
            diff = float(np.max(np.abs(np.asarray(got, np.float64).reshape(want.shape) - want))) if want.size else 0.0
            worst = max(worst, diff)
            if not diff <= tolerance:
                raise RunError(f"{api} output {key} differs from the SavedModel by {diff:.3g} (tolerance {tolerance})")
        log(f"{api}: {len(rows)} rows agree with the in-process SavedModel")
    # 7 significant digits name the same float32 as the row's value, and read better in a curl line.
    instance = {k: float(f"{v:.7g}") if isinstance(v, float) else v for k, v in rows[0].items()}
    return {"rows": len(rows), "outputs": sorted(local), "max_abs_diff": worst, "tolerance": tolerance,
            "apis": ["REST", "gRPC"], "input_dtypes": inputs,
            "example": {"instance": instance, "prediction": {k: _plain(v[0]) for k, v in local.items()}},
            "served": predictions[0]}


def _tf_dtype_names(dtypes: dict[str, str]) -> dict[str, str]:
    """{'x': 'DT_INT64'} -> {'x': 'int64'}: what tf.make_tensor_proto takes as dtype."""
    return {k: v.removeprefix("DT_").lower() for k, v in dtypes.items()}


def _plain(value: Any) -> Any:
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


@contextlib.contextmanager
def workdir_lock(workdir: str) -> Iterator[None]:
    """One `tfpipe run` per workdir at a time; the OS drops the lock when the process dies."""
    os.makedirs(workdir, exist_ok=True)
    f = open(os.path.join(workdir, ".lock"), "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip()
        f.close()
        raise RunError(f"another tfpipe run{' (pid ' + holder + ')' if holder else ''} is using {workdir}") from None
    f.seek(0)
    f.truncate()
    f.write(str(os.getpid()))
    f.flush()
    try:
        yield
    finally:
        f.close()


def run(req: RunRequest) -> int:
    """Run the pipeline; 0 when every step is done (and an SLO, if any, met), 1 when the SLO is
    missed, 2 on a user error, 130 when interrupted."""
    if req.from_step and req.from_step not in STEPS:
        raise ConfigError(f"--from {req.from_step}: steps are {', '.join(STEPS)}")
    if req.only and req.only not in STEPS:
        raise ConfigError(f"--only {req.only}: steps are {', '.join(STEPS)}")
    if req.only and req.from_step:
        raise ConfigError("give --from or --only, not both")
    console = Console()
    try:
        with workdir_lock(os.path.abspath(req.workdir)):
            return _run_locked(Run(req), console)
    finally:
        console.close()


def _run_locked(r: Run, console: Console) -> int:
    req, started = r.req, time.monotonic()
    console.print(f"tfpipe run: {shown(req.config_path) if req.config_path else 'the penguins demo'}"
                  f" -> {shown(r.workdir)}")
    try:
        code = r.execute(console)
    except StepFailed as e:
        r.stop_server()
        _finish_report(r, console)
        if isinstance(e.error, KeyboardInterrupt):
            console.print("interrupted: run the same command again to resume from this step")
            return EXIT_INTERRUPTED
        if req.debug:
            raise e.error from None
        known = isinstance(e.error, user_errors())
        console.print(f"tfpipe run: {e.step} failed" + ("" if known else " (a bug: the traceback is in its log)")
                      + "; fix the cause and run the same command again to resume from this step")
        return EXIT_USER_ERROR if known else EXIT_FAILED
    except BaseException:
        r.stop_server()
        raise
    try:
        _finish_report(r, console)
        console.print(f"done in {time.monotonic() - started:.0f}s"
                      + ("; the load test MISSED its SLO" if code == 1 else ""))
        if req.serve_after:
            serve_forever(r, console)
    finally:
        r.stop_server()
    return code


def _finish_report(r: Run, console: Console) -> None:
    from tfpipe.report import write_run_report

    path = r.path("report.html")
    write_run_report(r.workdir, r.manifest, path)
    console.print(f"report: {shown(path)}")


def serve_forever(r: Run, console: Console) -> None:
    """Keep the embedded server up in the foreground until Ctrl-C or SIGTERM; say how to call it."""
    serve = r.manifest["steps"].get("serve", {})
    if serve.get("status") != "done":
        raise RunError("--serve-after needs a done serve step")
    info = _load(serve["outputs"]["manifest"])
    server = r.ensure_server()
    name, host = info["model"], "127.0.0.1"
    instance = json.dumps({"instances": [info["check"]["example"]["instance"]]})
    console.print(f"serving {name} (Ctrl-C to stop): gRPC {host}:{server.grpc_port}, REST {host}:{server.rest_port}")
    console.print(f"  curl -s http://{host}:{server.rest_port}/v1/models/{name}")
    console.print(f"  curl -s -X POST http://{host}:{server.rest_port}/v1/models/{name}:predict -d '{instance}'")
    console.print("  python - <<'EOF'\n"
                  "import grpc, tensorflow as tf\n"
                  "from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc\n"
                  f"req = predict_pb2.PredictRequest(); req.model_spec.name = {name!r}\n"
                  f"row = {info['check']['example']['instance']!r}\n"
                  f"dtypes = {_tf_dtype_names(info['check']['input_dtypes'])!r}\n"
                  "for k, v in row.items(): req.inputs[k].CopyFrom(tf.make_tensor_proto([v], dtype=dtypes[k]))\n"
                  f"stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel('{host}:{server.grpc_port}'))\n"
                  "print(stub.Predict(req, timeout=10).outputs)\n"
                  "EOF")
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop.wait(1.0):
            pass
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    console.print("stopping: finishing in-flight requests")
