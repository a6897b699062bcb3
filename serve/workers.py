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

This module is the supervisor; a worker's side of the group is serve/worker_group.py (a worker
imports that, never this), and the merge of the workers' Prometheus pages serve/prometheus.py.

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

import dataclasses
import json
import os
import queue
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable

from tfpipe.children import module_argv
from tfpipe.files import clean_stale
from tfpipe.machine import cores
from tfpipe.serve.errors import ServeError
from tfpipe.serve.flags import ServeOptions
from tfpipe.serve.worker_group import (DEBUG_ENV, GROUP_ENV, GROUP_PREFIX, READY_FD_ENV, STATE_FILE, WORKER_ENV,
                                       retire_metrics, write_shared_json)

# A worker is given up on at its (MAX_RESTARTS + 1)th exit in a row, exits in a row being those
# with less than STABLE_S of serving between them; it is started again after 0, then
# RESTART_BACKOFF_S, 2 * RESTART_BACKOFF_S, ... seconds.
MAX_RESTARTS, STABLE_S, RESTART_BACKOFF_S = 3, 60.0, 1.0
STOP_MARGIN_S = 30.0  # past --drain_seconds, how long a worker has to finish its drain before it is killed
PORT_LINE = re.compile(r"Exporting HTTP/REST API at|Running gRPC ModelServer at")  # printed once, for all


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
        self.opts, self.n = opts, opts.workers
        said = threading.Lock()  # print writes a line and its newline apart: the workers' threads take turns

        def one_line(text: str) -> None:
            with said:
                log(text)
        self.log = one_line
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
            proc = subprocess.Popen(module_argv("tfpipe.serve.worker_main", self.spec), env=env,
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
        write_shared_json(os.path.join(self.dir, STATE_FILE), {"workers": [
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


