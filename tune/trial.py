"""One trial of `tfpipe tune`: the server started with a candidate's batching.config, the load
test run at each load level until one misses the SLO, the server stopped."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

from tfpipe.children import module_argv
from tfpipe.files import write_json
from tfpipe.loadtest.config import LoadtestConfig, parse_duration
from tfpipe.loadtest.errors import LoadtestError
from tfpipe.serve.flags import ServeOptions
from tfpipe.tune.config import TuneConfig
from tfpipe.tune.errors import TuneError
from tfpipe.tune.search import Candidate

PORT_RETRIES = 3
_PORT_LINE = re.compile(r"(gRPC ModelServer|HTTP/REST API) at:?\s*[\w.]+:(\d+)")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the server's process before exec: SIGTERM when tfpipe tune dies, even by SIGKILL, so
    that no trial server outlives the tune that started it (Linux's PR_SET_PDEATHSIG)."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux/glibc: Server.stop still runs on a normal exit
        pass


def serve_command(cfg: TuneConfig, batching_file: str, config_dir: str, port: int, rest_port: int,
                  workers: int = 1) -> list[str]:
    """`tfpipe serve` for one trial: the user's model and flags, batching on with this trial's file
    (in each of `workers` processes). With --backend tfserving or docker, tfpipe serve writes the
    configs and execs the real server."""
    opts = ServeOptions(backend=cfg.backend, host="127.0.0.1", port=port, rest_api_port=rest_port,
                        model_name=cfg.model_name, model_base_path=os.path.abspath(cfg.model_base_path),
                        enable_batching=True, batching_parameters_file=os.path.abspath(batching_file),
                        config_dir=os.path.abspath(config_dir), workers=workers)
    return module_argv("tfpipe.cli", "serve", *opts.to_argv(), *cfg.serve_args)


class Server:
    """A trial's server process, its output in `log_path`."""

    def __init__(self, cfg: TuneConfig, batching_file: str, trial_dir: str, workers: int = 1):
        self.cfg, self.batching_file, self.dir, self.workers = cfg, batching_file, trial_dir, workers
        self.log_path = os.path.join(trial_dir, "server.log")
        self.proc: subprocess.Popen | None = None
        self.port = self.rest_port = 0
        self.started_s = 0.0

    def start(self) -> None:
        """Start it and wait until the model answers its status as AVAILABLE. The embedded server
        picks free ports itself (-1) and prints them; for real TF Serving they are chosen here,
        and chosen again when another process took one before the server bound it."""
        embedded = self.cfg.backend == "embedded"
        for attempt in range(1 if embedded else PORT_RETRIES):
            self.port, self.rest_port = (-1, -1) if embedded else (_port(), _port())
            cmd = serve_command(self.cfg, self.batching_file, os.path.join(self.dir, "serve-config"), self.port,
                                self.rest_port, self.workers)
            t0 = time.perf_counter()
            with open(self.log_path, "a") as log:
                log.write("$ " + " ".join(cmd) + "\n")
                log.flush()
                self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             start_new_session=True, preexec_fn=_die_with_parent,
                                             env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"})
            if self._wait_ready(parse_duration(self.cfg.start_timeout)):
                self.started_s = time.perf_counter() - t0
                return
            out = self.output()
            self.stop()
            if "in use" not in out or attempt == PORT_RETRIES - 1 or embedded:
                tail = "\n".join(out.strip().splitlines()[-8:])
                raise TuneError(f"the server did not come up with model {self.cfg.model_name!r} "
                                f"(log: {self.log_path}):\n{tail}")

    def output(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def _wait_ready(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            if self.rest_port < 0:  # the embedded server prints the ports it took, as TF Serving does
                found = dict(_PORT_LINE.findall(self.output()))
                if len(found) < 2:
                    time.sleep(0.1)
                    continue
                self.port, self.rest_port = int(found["gRPC ModelServer"]), int(found["HTTP/REST API"])
            url = f"http://127.0.0.1:{self.rest_port}/v1/models/{self.cfg.model_name}"
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    states = [v.get("state") for v in json.load(r).get("model_version_status", [])]
                if "AVAILABLE" in states:
                    return True
            except (urllib.error.URLError, OSError, ValueError):
                pass
            time.sleep(0.2)
        return False

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def level_config(cfg: TuneConfig, server: Server, level: float, out: str) -> LoadtestConfig:
    target = (f"grpc://127.0.0.1:{server.port}" if cfg.protocol == "grpc"
              else f"http://127.0.0.1:{server.rest_port}")
    load = {"rate": level, "users": 8} if cfg.rate else {"users": int(level)}
    return LoadtestConfig(target=target, model=cfg.model_name, data=cfg.data, payload=cfg.payload,
                          warmup_records=cfg.warmup_records,
                          batch_size=cfg.batch_size, duration=cfg.duration, warmup=cfg.warmup, slo=cfg.slo, out=out,
                          **load)


def score(levels: list[dict]) -> tuple[float, dict | None]:
    """The highest throughput of a level that met the SLO with no errors, and that level."""
    ok = [lv for lv in levels if lv["slo_ok"] is not False and lv["errors"] == 0]
    best = max(ok, key=lambda lv: lv["rps"], default=None)
    return (best["rps"] if best else 0.0), best


def run_trial(cfg: TuneConfig, candidate: Candidate, trial_dir: str) -> dict:
    """Measure one candidate: its batching.config, the server's start, and each load level (lowest
    first, stopping after the first that misses the SLO). Returns the trial's record."""
    from tfpipe.loadtest.job import run as loadtest
    from tfpipe.serve.tfserving.configs import write_text_proto

    shutil.rmtree(trial_dir, ignore_errors=True)  # what a killed tune left of this trial
    os.makedirs(trial_dir)
    batching_file = write_text_proto(os.path.join(trial_dir, "batching.config"), candidate.to_proto())
    levels, failed = [], None
    with Server(cfg, batching_file, trial_dir, candidate.workers) as server:
        for i, level in enumerate(cfg.load_levels()):
            out = os.path.join(trial_dir, f"level-{i + 1}")
            try:
                loadtest(level_config(cfg, server, level, out), log=lambda _line: None)
            except LoadtestError as e:
                if server.proc.poll() is None:
                    raise TuneError(f"the load test of trial {os.path.basename(trial_dir)} failed: {e}") from None
            if server.proc.poll() is not None:  # e.g. out of memory with this candidate's batches
                failed = (f"the server exited ({server.proc.returncode}) under {level:g} "
                          f"{'requests/s' if cfg.rate else 'clients'}; its log: {server.log_path}")
                break
            with open(os.path.join(out, "results.json")) as f:
                step = json.load(f)["steps"][0]
            levels.append({"level": level, "rps": step["rps"], "requests": step["requests"], "errors": step["errors"],
                           **{q: step[q] for q in ("p50_ms", "p90_ms", "p99_ms")},
                           "slo_ok": step["slo_ok"], "slo_failures": step["slo_failures"],
                           "generator_bound": step.get("generator_bound", False)})
            if levels[-1]["slo_ok"] is False or levels[-1]["errors"]:
                break  # more load only adds latency from here
    value, best = score(levels) if not failed else (0.0, None)
    record = {"candidate": candidate.to_json(), "score_rps": round(value, 2),
              "best_level": best["level"] if best else None, "levels": levels,
              "server_start_s": round(server.started_s, 2), "failed": failed}
    write_json(os.path.join(trial_dir, "trial.json"), record)
    return record
