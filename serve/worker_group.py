"""A worker's side of `tfpipe serve --workers N` (serve/workers.py, the supervisor, says how the
group works): which worker this process is, the group's shared directory (each worker's metrics
snapshot, the retired workers' counters, the supervisor's states of the workers, a reloaded model
config and each worker's answer to it), the readiness announcement, and the options a worker is
started with. A worker imports this module, never the supervisor's."""

from __future__ import annotations

import base64
import json
import os
import threading
import time
from collections.abc import Callable

from tfpipe.files import read_json, write_atomic
from tfpipe.serve.errors import ServeError, precondition, unavailable
from tfpipe.serve.flags import ServeOptions
from tfpipe.serve.prometheus import counters_of, merge_prometheus, rss_of


WORKER_ENV = "TFPIPE_SERVE_WORKER"  # "i/N" in a worker's environment


GROUP_ENV = "TFPIPE_SERVE_WORKERS_DIR"  # the group's shared directory


GROUP_PREFIX = "tfpipe-serve-workers-"  # then the supervisor's pid: a group whose supervisor is gone is removed


DEBUG_ENV = "TFPIPE_SERVE_DEBUG"  # "1": the workers keep TensorFlow's native stderr lines (--debug)


READY_FD_ENV = "TFPIPE_SERVE_READY_FD"  # the write end of the worker's readiness pipe


SNAPSHOT_SECONDS = 0.5


CONFIG_POLL_S = 0.1  # how often a worker looks for a model config another worker received


CONFIG_WAIT_S = 600.0  # how long a reload waits for the other workers to load the new models


STATES = ("ready", "starting", "failed")


STATE_FILE = "workers.json"


RETIRED_FILE = "retired.prom"  # the counters and histograms of the workers that exited


def worker_identity() -> tuple[int, int] | None:
    """(index, count) in a worker of a group, else None."""
    text = os.environ.get(WORKER_ENV, "")
    if not text:
        return None
    i, _, n = text.partition("/")
    return int(i), int(n)


def metrics_path(group_dir: str, i: int) -> str:
    """Where worker i writes its metrics for the others."""
    return os.path.join(group_dir, f"worker-{i}.prom")


def retire_metrics(group_dir: str, i: int) -> None:
    """Worker i has exited (the supervisor calls this before starting it again): its counters and
    histograms are added to the retired ones, and its page goes."""
    path = metrics_path(group_dir, i)
    try:
        with open(path) as f:
            page = f.read()
    except OSError:  # it never wrote one
        return
    retired = os.path.join(group_dir, RETIRED_FILE)
    try:
        with open(retired) as f:
            before = f.read()
    except OSError:
        before = ""
    counted = counters_of(page)
    if counted:
        write_shared(retired, merge_prometheus([before, counted]) if before else counted)
    try:
        os.remove(path)
    except OSError:
        pass


class Group:
    """A worker's view of its group: writes its own metrics for the others and merges theirs into a
    scrape; shares a reloaded model config (`share_config`) and applies the ones the others
    received with `apply(serialized ModelServerConfig)`, which raises on a config it refuses."""

    def __init__(self, render: Callable[[], str], apply: Callable[[bytes], None] | None = None):
        ident = worker_identity()
        if ident is None:
            raise ServeError(f"{WORKER_ENV} is not set: not a worker of a group")
        self.index, self.count = ident
        self.dir = os.environ[GROUP_ENV]
        self.render, self.apply = render, apply
        self._applied = 0  # the generation of the shared config this worker last applied
        self._config_path = os.path.join(self.dir, "model_config.json")  # the latest reloaded config
        self._config_lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._write_loop, name="tfpipe-worker-metrics", daemon=True)]
        if apply is not None:
            self._threads.append(threading.Thread(target=self._config_loop, name="tfpipe-worker-config", daemon=True))
        for t in self._threads:
            t.start()

    # ---- model configs ---------------------------------------------------------------------

    def share_config(self, config: bytes, wait_s: float = CONFIG_WAIT_S) -> None:
        """This worker has applied `config`: hand it to the others and wait until each has applied
        it. Raises FAILED_PRECONDITION naming the workers that refused it, UNAVAILABLE naming those
        that did not finish in `wait_s`."""
        with self._config_lock:
            generation = self._applied = time.time_ns()
        write_shared_json(self._config_path, {
            "generation": generation, "from": self.index, "config": base64.b64encode(config).decode("ascii")})
        self._ack(generation, "")
        deadline = time.monotonic() + wait_s
        while True:
            acks = {i: read_json(self._ack_path(i)) for i in range(self.count) if i != self.index}
            errors = [f"worker {i}: {a['error']}" for i, a in acks.items()
                      if a and a["generation"] == generation and a["error"]]
            if errors:
                raise precondition("the new model config was applied by this worker but refused by "
                                   + "; ".join(errors))
            waiting = [i for i, a in acks.items() if not a or a["generation"] < generation]
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise unavailable(f"worker(s) {', '.join(map(str, waiting))} did not apply the new model config "
                                  f"within {wait_s:g} s")
            time.sleep(CONFIG_POLL_S)

    def _config_loop(self) -> None:
        while not self._stop.wait(CONFIG_POLL_S):
            self.catch_up()

    def catch_up(self) -> None:
        """Apply the group's model config when another worker received a newer one (a worker
        started again after a crash calls this before it opens its ports)."""
        with self._config_lock:
            shared = read_json(self._config_path)
            if not shared or shared["generation"] <= self._applied:
                return
            self._applied = shared["generation"]
            try:
                self.apply(base64.b64decode(shared["config"]))
                error = ""
            except Exception as e:  # noqa: BLE001 (the worker that received it reports the refusal)
                error = getattr(e, "message", None) or str(e)
            self._ack(shared["generation"], error)

    def _ack(self, generation: int, error: str) -> None:
        write_shared_json(self._ack_path(self.index), {"generation": generation, "error": error})

    def _ack_path(self, i: int) -> str:
        return os.path.join(self.dir, f"worker-{i}.config.json")

    # ---- metrics ---------------------------------------------------------------------------

    def _write_loop(self) -> None:
        while not self._stop.wait(SNAPSHOT_SECONDS):
            self.write()

    def write(self) -> None:
        write_shared(metrics_path(self.dir, self.index), self.render())

    def scrape(self) -> str:
        """This worker's metrics now, with the others' latest (at most SNAPSHOT_SECONDS old)."""
        own = self.render()
        pages, rss = [own], {self.index: rss_of(own)}
        for i in range(self.count):
            if i == self.index:
                continue
            try:
                with open(metrics_path(self.dir, i)) as f:
                    page = f.read()
            except OSError:  # not written yet (starting) or gone (exited)
                continue
            pages.append(page)
            rss[i] = rss_of(page)
        try:
            with open(os.path.join(self.dir, RETIRED_FILE)) as f:
                pages.append(f.read())  # the counts of workers that exited
        except OSError:
            pass
        lines = worker_state_lines(self.workers(), self.count)
        lines += ["# HELP tfpipe_serving_worker_resident_memory_bytes Resident memory of each worker (the unlabelled "
                  "process_resident_memory_bytes is their sum).",
                  "# TYPE tfpipe_serving_worker_resident_memory_bytes gauge"]
        lines += [f'tfpipe_serving_worker_resident_memory_bytes{{worker="{i}"}} {n}' for i, n in sorted(rss.items())]
        return merge_prometheus(pages) + "\n".join(lines) + "\n"

    # ---- the workers' states, as the supervisor writes them ----------------------------------

    def workers(self) -> list[dict]:
        """Each worker's {"worker", "pid", "state", "restarts"}; [] before the supervisor wrote any."""
        return (read_json(os.path.join(self.dir, STATE_FILE)) or {}).get("workers", [])

    def health(self) -> dict[str, bool]:
        """Whether each health name serves (see tfpipe.serve.transports.health): "" while every worker is ready,
        "tfpipe.worker.<i>" while worker i is."""
        workers = self.workers()
        ready = {w["worker"]: w["state"] == "ready" for w in workers}
        out = {f"tfpipe.worker.{i}": ready.get(i, False) for i in range(self.count)}
        out[""] = len(workers) == self.count and all(ready.values())
        return out

    def close(self) -> None:
        self._stop.set()


def worker_state_lines(workers: list[dict], count: int) -> list[str]:
    """The Prometheus lines of the workers' states: how many are in each, and each one's readiness
    and restarts."""
    by = {w["worker"]: w for w in workers}
    lines = ["# HELP tfpipe_serving_workers Worker processes (tfpipe serve --workers) by state: ready (serving), "
             "starting (started or to be started again, not serving yet), failed (given up after crashing "
             "repeatedly).", "# TYPE tfpipe_serving_workers gauge"]
    lines += [f'tfpipe_serving_workers{{state="{state}"}} '
              f'{sum(by.get(i, {}).get("state", "starting") == state for i in range(count))}' for state in STATES]
    lines += ["# HELP tfpipe_serving_worker_ready Whether each worker serves (1) or not (0).",
              "# TYPE tfpipe_serving_worker_ready gauge"]
    lines += [f'tfpipe_serving_worker_ready{{worker="{i}"}} {int(by.get(i, {}).get("state") == "ready")}'
              for i in range(count)]
    lines += ["# HELP tfpipe_serving_worker_restarts_total Times each worker was started again after it exited.",
              "# TYPE tfpipe_serving_worker_restarts_total counter"]
    lines += [f'tfpipe_serving_worker_restarts_total{{worker="{i}"}} {by.get(i, {}).get("restarts", 0)}'
              for i in range(count)]
    return lines


def announce_ready(grpc_port: int | None, rest_port: int | None) -> None:
    """In a worker whose ports are bound and models AVAILABLE: tell the supervisor, on the pipe it
    gave (READY_FD_ENV). Nothing outside a group."""
    fd = os.environ.get(READY_FD_ENV)
    if fd:
        message = {"event": "ready", "pid": os.getpid(), "grpc_port": grpc_port, "rest_port": rest_port}
        try:
            os.write(int(fd), (json.dumps(message) + "\n").encode())
        except OSError:  # the supervisor is gone: this worker goes too (PR_SET_PDEATHSIG)
            pass


def write_shared(path: str, text: str) -> None:
    """Write `path` whole, atomically, as the other workers may read it at any moment; nothing when
    the group's directory went with the supervisor (not made again)."""
    if not os.path.isdir(os.path.dirname(path)):
        return
    try:
        write_atomic(path, text, durable=False)
    except OSError:  # the directory went meanwhile
        pass


def write_shared_json(path: str, value: dict) -> None:
    write_shared(path, json.dumps(value))


def options_from_spec(spec: str) -> ServeOptions:
    """A worker's ServeOptions from the JSON the supervisor gives it (`ServeOptions.to_json`)."""
    return ServeOptions.from_json(spec)
