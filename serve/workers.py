"""`tfpipe serve --workers N`: N processes serving the same ports, so that the server uses every core.

Why processes that each hold the models: the model itself is a small part of a request's CPU
with batching (docs/benchmarks.md, serving); the rest is request handling in Python, under one
interpreter lock per process. A front end handing
requests to one model process would pay a serialization and a hand-off per request, of the same
order as the work it spreads. So each worker is a whole embedded server: its own models, batch
queues and request log files, bound to the same gRPC and REST ports with SO_REUSEPORT (grpcio
sets it on its ports; aiohttp is asked for it), and the kernel deals the connections out.

What is shared, and how:
- the ports, by SO_REUSEPORT;
- Prometheus: each worker writes its metrics every half second into a directory of the group, and
  the worker a scrape reaches adds the others' to its own (counters, histograms, queue depths and
  memory summed; each worker's resident memory also shown with a `worker` label). When a worker
  exits, the supervisor keeps its counters and histograms as its last snapshot had them (added to
  those of workers gone before, so that the group's totals do not fall back by a dead worker's
  counts, as Prometheus expects of a counter) and drops the rest of its page: a dead worker's queue
  depths, memory and models are not shown;
- model versions: each worker polls the base paths itself, so all of them move to a new version
  within one poll of each other;
- request logs: each worker writes files of its own (their names hold the process id);
- a model config sent with HandleReloadConfigRequest: the worker that receives it applies it, writes
  it to the group's directory and answers once every other worker has applied it too (each watches
  that file, and a worker started again after a crash applies the latest one at start).

The supervisor (this module's `run_workers`) picks free ports for -1, starts the workers as fresh
interpreters (`python -m tfpipe.serve.worker_main`: TensorFlow is not fork-safe), forwards their
output, and on SIGTERM or SIGINT passes the signal on and waits for every worker to drain.

A worker's states, as the supervisor keeps them in the group's `workers.json` (read by the workers
for their health service and metrics):
- starting: started (or waiting to be started again), not serving yet;
- ready: it said so on its readiness pipe (`announce_ready`: a JSON line written once its ports are
  bound and its models AVAILABLE). Its output is no readiness signal: the supervisor never parses it;
- failed: given up on after MAX_RESTARTS + 1 exits in a row without STABLE_S of serving in between.
A worker that exits is started again after a backoff (none for its first exit in a row, then
RESTART_BACKOFF_S doubling). The others serve meanwhile; the supervisor exits (1) only when no
worker is left. Before the group has first served, a worker's exit stops the start, as a model
that does not load stops tensorflow_model_server's.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

from tfpipe.files import clean_stale, read_json, write_atomic
from tfpipe.machine import cores
from tfpipe.serve.errors import ServeError, precondition, unavailable
from tfpipe.serve.flags import ServeOptions

WORKER_ENV = "TFPIPE_SERVE_WORKER"  # "i/N" in a worker's environment
GROUP_ENV = "TFPIPE_SERVE_WORKERS_DIR"  # the group's shared directory
GROUP_PREFIX = "tfpipe-serve-workers-"  # then the supervisor's pid: a group whose supervisor is gone is removed
DEBUG_ENV = "TFPIPE_SERVE_DEBUG"  # "1": the workers keep TensorFlow's native stderr lines (--debug)
READY_FD_ENV = "TFPIPE_SERVE_READY_FD"  # the write end of the worker's readiness pipe
SNAPSHOT_SECONDS = 0.5
CONFIG_POLL_S = 0.1  # how often a worker looks for a model config another worker received
CONFIG_WAIT_S = 600.0  # how long a reload waits for the other workers to load the new models
# A worker is given up on at its (MAX_RESTARTS + 1)th exit in a row, exits in a row being those
# with less than STABLE_S of serving between them; it is started again after 0, then
# RESTART_BACKOFF_S, 2 * RESTART_BACKOFF_S, ... seconds.
MAX_RESTARTS, STABLE_S, RESTART_BACKOFF_S = 3, 60.0, 1.0
STOP_MARGIN_S = 30.0  # past --drain_seconds, how long a worker has to finish its drain before it is killed
STATES = ("ready", "starting", "failed")
STATE_FILE = "workers.json"
RETIRED_FILE = "retired.prom"  # the counters and histograms of the workers that exited
PORT_LINE = re.compile(r"Exporting HTTP/REST API at|Running gRPC ModelServer at")  # printed once, for all

# Samples a scrape sums over the workers; every other sample (a model's versions, a version's
# load size) is the same in every worker once they have all moved, and the largest is shown.
SUMMED = ("tfpipe_serving_requests_total", "tfpipe_serving_request_latency_seconds", "tfpipe_serving_batch_size",
          "tfpipe_serving_batch_padding_rows_total", "tfpipe_serving_batch_queue_depth",
          "tfpipe_serving_batch_queues", "tfpipe_serving_request_log_records_total",
          "tfpipe_serving_request_log_queue_depth", "tfpipe_serving_live_servables", "process_resident_memory_bytes",
          "tfpipe_serving_shadow_requests_total", "tfpipe_serving_shadow_errors_total",
          "tfpipe_serving_shadow_class_rows_total", "tfpipe_serving_shadow_flipped_rows_total",
          "tfpipe_serving_shadow_latency_seconds", "tfpipe_serving_canary_requests_total")
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$")


def worker_identity() -> tuple[int, int] | None:
    """(index, count) in a worker of a group, else None."""
    text = os.environ.get(WORKER_ENV, "")
    if not text:
        return None
    i, _, n = text.partition("/")
    return int(i), int(n)


def merge_prometheus(texts: list[str]) -> str:
    """Prometheus text pages of the workers as one: samples with the same name and labels summed
    for SUMMED metrics (and their _bucket/_sum/_count), the largest otherwise; comments and the
    order of the first page kept."""
    order: list[str] = []
    values: dict[str, float] = {}
    comments: dict[str, list[str]] = {}
    for text in texts:
        for pending, line, m in _samples(text):
            key = line.rsplit(" ", 1)[0]
            value = float(m[3])
            if key not in values:
                order.append(key)
                comments[key] = pending
                values[key] = value
            elif _family(m[1]) in SUMMED:  # a histogram's series sum as it does
                values[key] += value
            else:
                values[key] = max(values[key], value)
    out = []
    for key in order:
        out += [c for c in comments[key] if c]
        v = values[key]
        out.append(f"{key} {int(v) if v.is_integer() else repr(v)}")
    return "\n".join(out) + "\n"


def counters_of(page: str) -> str:
    """The samples of a Prometheus page's counters and histograms (by its # TYPE lines), with their
    comments."""
    kept = {m[1] for m in re.finditer(r"^# TYPE (\S+) (?:counter|histogram)$", page, re.M)}
    out: list[str] = []
    for pending, line, m in _samples(page):
        if m[1] in kept or _family(m[1]) in kept:
            out += pending + [line]
    return "\n".join(out) + "\n" if out else ""


def _samples(page: str):
    """Each sample of a Prometheus text page: (the comment lines before it, its line, SAMPLE's match)."""
    pending: list[str] = []
    for line in page.splitlines():
        if not line or line.startswith("#"):
            pending.append(line)
            continue
        m = SAMPLE.match(line)
        if m is not None:
            yield pending, line, m
            pending = []


def _family(name: str) -> str:
    """The metric a sample belongs to: a histogram's _bucket, _sum and _count series are its own."""
    return re.sub(r"_(bucket|sum|count)$", "", name)


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
        _replace_file(retired, merge_prometheus([before, counted]) if before else counted)
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
        _write_json(self._config_path, {
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
        _write_json(self._ack_path(self.index), {"generation": generation, "error": error})

    def _ack_path(self, i: int) -> str:
        return os.path.join(self.dir, f"worker-{i}.config.json")

    # ---- metrics ---------------------------------------------------------------------------

    def _write_loop(self) -> None:
        while not self._stop.wait(SNAPSHOT_SECONDS):
            self.write()

    def write(self) -> None:
        _replace_file(metrics_path(self.dir, self.index), self.render())

    def scrape(self) -> str:
        """This worker's metrics now, with the others' latest (at most SNAPSHOT_SECONDS old)."""
        own = self.render()
        pages, rss = [own], {self.index: _rss_of(own)}
        for i in range(self.count):
            if i == self.index:
                continue
            try:
                with open(metrics_path(self.dir, i)) as f:
                    page = f.read()
            except OSError:  # not written yet (starting) or gone (exited)
                continue
            pages.append(page)
            rss[i] = _rss_of(page)
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


def _replace_file(path: str, text: str) -> None:
    """Write `path` whole, atomically, as the other workers may read it at any moment; nothing when
    the group's directory went with the supervisor (not made again)."""
    if not os.path.isdir(os.path.dirname(path)):
        return
    try:
        write_atomic(path, text, durable=False)
    except OSError:  # the directory went meanwhile
        pass


def _write_json(path: str, value: dict) -> None:
    _replace_file(path, json.dumps(value))


def _rss_of(page: str) -> int:
    m = re.search(r"^process_resident_memory_bytes (\d+)$", page, re.M)
    return int(m[1]) if m else 0


# ---- the supervisor ---------------------------------------------------------------------------

def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host if host not in ("", "0.0.0.0") else "127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In a worker before exec: SIGTERM when the supervisor dies, even by SIGKILL (PR_SET_PDEATHSIG)."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def worker_count(opts: ServeOptions, available: int | None = None) -> tuple[int, str]:
    """How many workers --workers asks for (0: auto), and why, in a few words."""
    available = cores() if available is None else available
    if opts.workers < 0:
        raise ServeError(f"--workers {opts.workers}: at least 1 (or 0, one per core)")
    if opts.workers > 0:
        return opts.workers, "--workers"
    if opts.grpc_socket_path:
        return 1, "--grpc_socket_path: a Unix socket cannot be shared between processes"
    if opts.enable_batching:
        return 1, ("--enable_batching: each process would batch 1/N of the requests; give --workers N with "
                   "max_batch_size divided by N, or let tfpipe tune choose")
    return available, f"one per core, {available} here"


def check(opts: ServeOptions) -> None:
    if opts.workers < 1:
        raise ServeError(f"--workers {opts.workers}: at least 1")
    if opts.workers > 1 and opts.grpc_socket_path:
        raise ServeError("--workers > 1 shares TCP ports between processes; a Unix socket "
                         f"(--grpc_socket_path {opts.grpc_socket_path}) cannot be shared: leave it out")


def worker_options(opts: ServeOptions, available: int | None = None) -> ServeOptions:
    """The options every worker gets: the same ports (free ones chosen for -1), one process each,
    and unless the command line sets TensorFlow's threads, a 1/N share of the cores for its
    intra-op and inter-op pools (TensorFlow would give each worker a pool as large as the machine)."""
    port = free_port(opts.host) if opts.port < 0 else opts.port
    rest = free_port(opts.host) if opts.rest_api_port < 0 else opts.rest_api_port
    child = dataclasses.replace(opts, port=port, rest_api_port=rest, workers=1)
    if not (opts.tensorflow_intra_op_parallelism or opts.tensorflow_inter_op_parallelism
            or opts.tensorflow_session_parallelism or opts.tensorflow_session_config_file):
        share = max(1, (cores() if available is None else available) // opts.workers)
        child = dataclasses.replace(child, tensorflow_intra_op_parallelism=share, tensorflow_inter_op_parallelism=share)
    return child


@dataclasses.dataclass
class Worker:
    """The supervisor's record of worker `index`: its current process and state."""
    index: int
    proc: subprocess.Popen | None = None
    state: str = "starting"
    restarts: int = 0  # times started again after an exit
    exits: int = 0  # exits in a row (see MAX_RESTARTS)
    ready_at: float | None = None  # monotonic time it last became ready
    start_at: float | None = None  # monotonic time to start it again (after its backoff)


def restart_delay(exits_in_a_row: int) -> float | None:
    """Seconds before a worker is started again after its n-th exit in a row; None: give up on it."""
    if exits_in_a_row > MAX_RESTARTS:
        return None
    return 0.0 if exits_in_a_row <= 1 else RESTART_BACKOFF_S * 2 ** (exits_in_a_row - 2)


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"


def _nth(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


class Supervisor:
    def __init__(self, opts: ServeOptions, log: Callable[[str], None]):
        check(opts)
        self.opts, self.log, self.n = opts, log, opts.workers
        self.child = worker_options(opts)
        clean_stale(tempfile.gettempdir(), GROUP_PREFIX)  # the groups of supervisors killed before their stop
        self.dir = tempfile.mkdtemp(prefix=f"{GROUP_PREFIX}{os.getpid()}-")
        self.spec = self.child.to_json()
        self.workers = [Worker(i) for i in range(self.n)]
        self.events: queue.Queue = queue.Queue()  # (kind "ready" | "exit", worker index, process)
        self.stopping = threading.Event()

    # ---- processes ---------------------------------------------------------------------------

    def start_worker(self, i: int) -> None:
        """Start worker i. Only from the main thread: PR_SET_PDEATHSIG signals a worker when the
        thread that started it ends."""
        ready_read, ready_write = os.pipe()
        env = {**os.environ, WORKER_ENV: f"{i}/{self.n}", GROUP_ENV: self.dir, READY_FD_ENV: str(ready_write)}
        try:
            proc = subprocess.Popen([sys.executable, "-m", "tfpipe.serve.worker_main", self.spec], env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    text=True, preexec_fn=_die_with_parent, pass_fds=(ready_write,))
        finally:
            os.close(ready_write)  # the worker holds the only write end: end of file when it exits
        w = self.workers[i]
        w.proc, w.state, w.ready_at, w.start_at = proc, "starting", None, None
        threading.Thread(target=self._forward, args=(i, proc), name=f"tfpipe-worker-{i}-output", daemon=True).start()
        threading.Thread(target=self._watch, args=(i, proc, ready_read), name=f"tfpipe-worker-{i}-ready",
                         daemon=True).start()
        self.write_states()

    def _forward(self, i: int, proc: subprocess.Popen) -> None:
        """A worker's output, prefixed; its port lines are kept back: the supervisor prints them
        once, as TF Serving words them, when every worker serves (what clients and tools wait for)."""
        for line in proc.stdout:
            line = line.rstrip("\n")
            if not PORT_LINE.search(line):
                self.log(f"[worker {i}] {line}")

    def _watch(self, i: int, proc: subprocess.Popen, ready_read: int) -> None:
        """The worker's readiness pipe, to its end (the worker's exit): events for the main thread."""
        with open(ready_read, encoding="utf-8", errors="replace") as pipe:
            for line in pipe:
                try:
                    message = json.loads(line)
                except ValueError:
                    continue
                if message.get("event") == "ready":
                    self.events.put(("ready", i, proc))
        proc.wait()
        self.events.put(("exit", i, proc))

    def write_states(self) -> None:
        _write_json(os.path.join(self.dir, STATE_FILE), {"workers": [
            {"worker": w.index, "pid": w.proc.pid if w.proc else None, "state": w.state, "restarts": w.restarts}
            for w in self.workers]})

    # ---- running -----------------------------------------------------------------------------

    def run(self) -> int:
        for i in range(self.n):
            self.start_worker(i)
        try:
            code = self._start()
            if code is not None or self.stopping.is_set():
                return code or 0
            o = self.child
            if o.port:
                self.log(f"Running gRPC ModelServer at {o.host}:{o.port} ...")
            if o.rest_api_port:
                self.log(f"Exporting HTTP/REST API at:{o.host}:{o.rest_api_port} ...")
            self.log(f"{self.n} workers (pids {', '.join(str(w.proc.pid) for w in self.workers)}) serving "
                     + (f"gRPC {o.host}:{o.port}" if o.port else "")
                     + (f", REST {o.host}:{o.rest_api_port}" if o.rest_api_port else ""))
            return self._serve()
        finally:
            self.stop()
            import shutil

            shutil.rmtree(self.dir, ignore_errors=True)

    def _next_event(self, timeout: float):
        try:
            kind, i, proc = self.events.get(timeout=timeout)
        except queue.Empty:
            return None
        return (kind, self.workers[i]) if proc is self.workers[i].proc else None  # else: a process gone before

    def _start(self) -> int | None:
        """Until every worker is ready: None, or the exit code when one exited before (the start stops)."""
        while not self.stopping.is_set() and not all(w.state == "ready" for w in self.workers):
            event = self._next_event(0.2)
            if event is None:
                continue
            kind, w = event
            if kind == "ready":
                self._ready(w)
                continue
            code = w.proc.returncode
            self.log(f"worker {w.index} exited with {_exit_text(code)} before it served: stopping")
            return code if code and code > 0 else 1
        return None

    def _ready(self, w: Worker) -> None:
        w.state, w.ready_at = "ready", time.monotonic()
        self.write_states()
        self.log(f"worker {w.index} (pid {w.proc.pid}) ready")

    def _serve(self) -> int:
        """Until SIGTERM/SIGINT (0), or until no worker is left (1): workers that exit start again."""
        while not self.stopping.is_set():
            now = time.monotonic()
            for w in self.workers:
                if w.start_at is not None and now >= w.start_at:
                    self.start_worker(w.index)
            waits = [w.start_at - now for w in self.workers if w.start_at is not None]
            event = self._next_event(max(0.01, min([0.2, *waits])))
            if event is None or self.stopping.is_set():
                continue
            kind, w = event
            if kind == "ready":
                self._ready(w)
            elif not self._exited(w):
                self.log("no worker left: stopping (exit code 1)")
                return 1
        return 0

    def _exited(self, w: Worker) -> bool:
        """Worker w's process ended on its own: start it again after its backoff, or give up on it.
        False when no worker is left."""
        now, pid, code = time.monotonic(), w.proc.pid, w.proc.returncode
        retire_metrics(self.dir, w.index)
        if w.ready_at is not None and now - w.ready_at >= STABLE_S:
            w.exits = 0  # it had served long enough: not a crash loop
        w.exits += 1
        delay = restart_delay(w.exits)
        if delay is None:
            w.state = "failed"
            self.write_states()
            left = sum(x.state != "failed" for x in self.workers)
            self.log(f"worker {w.index} (pid {pid}) exited with {_exit_text(code)}, its {_nth(w.exits)} exit in a "
                     f"row without serving {STABLE_S:.0f} s: giving up on it; {left} of {self.n} workers left")
            return left > 0
        w.state, w.start_at, w.restarts = "starting", now + delay, w.restarts + 1
        self.write_states()
        self.log(f"worker {w.index} (pid {pid}) exited with {_exit_text(code)}: starting it again"
                 + (f" in {delay:g} s ({_nth(w.exits)} exit in a row)" if delay else ""))
        return True

    def stop(self) -> None:
        """SIGTERM to every worker (each drains its in-flight requests for up to --drain_seconds),
        then wait for them all; one still running STOP_MARGIN_S later is killed, and said so."""
        self.stopping.set()
        live = [w for w in self.workers if w.proc is not None and w.proc.poll() is None]
        for w in live:
            w.proc.send_signal(signal.SIGTERM)
        limit = self.opts.drain_seconds + STOP_MARGIN_S
        deadline = time.monotonic() + limit
        for w in live:
            try:
                w.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()
                self.log(f"worker {w.index} (pid {w.proc.pid}) had not stopped {limit:g} s after SIGTERM "
                         f"(--drain_seconds {self.opts.drain_seconds:g} + {STOP_MARGIN_S:g}): killed")


def run_workers(opts: ServeOptions, log: Callable[[str], None] = print, debug: bool = False) -> int:
    """Serve with opts.workers processes until SIGTERM or SIGINT; 0 once every worker has drained,
    1 when no worker is left. `debug`: the workers keep TensorFlow's native stderr lines."""
    if debug:
        os.environ[DEBUG_ENV] = "1"
    sup = Supervisor(opts, log)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sup.stopping.set())
    code = sup.run()
    if code == 0:
        log("stopped")
    return code


def options_from_spec(spec: str) -> ServeOptions:
    """A worker's ServeOptions from the JSON the supervisor gives it (`ServeOptions.to_json`)."""
    return ServeOptions.from_json(spec)
