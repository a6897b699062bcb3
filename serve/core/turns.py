"""Work taken in turns by the connections that wait for it, so that one client's burst is not a
queue every other client waits at the back of.

Each request runs with `PEER` set to the connection it came on (the transports set it: gRPC's
peer, REST's remote address and port). `Turns` is a transport's thread pool: a connection's jobs
run in the order it sent them, the connections take turns, one job each per round (a pool that
is first come, first served makes a job wait for every job queued before it). A job of a
connection that has nothing else waiting starts after at most one job of each other connection
that waits, however many those have queued. The batcher takes its batches' requests in the same
turns (batcher.py).
"""

from __future__ import annotations

import contextvars
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from queue import SimpleQueue
from typing import Any

PEER: contextvars.ContextVar[str] = contextvars.ContextVar("tfpipe_peer", default="")


class Waiting:
    """Jobs waiting, per connection in the order sent, the connections in their turns' order
    (Turns' jobs, and the batcher's requests)."""

    def __init__(self):
        self.jobs: dict[str, deque] = {}
        self.order: deque[str] = deque()
        self.count = 0

    def add(self, peer: str, job) -> None:
        jobs = self.jobs.get(peer)
        if jobs is None:
            jobs = self.jobs[peer] = deque()
            self.order.append(peer)
        jobs.append(job)
        self.count += 1

    def take(self, fits: Callable[[Any], bool] | None = None):
        """The next job in turn: the first connection's in the turns' order whose next job `fits`
        (any, when None), which then waits for the others' turns; the connections before it keep
        their places. None when none fits."""
        for i, peer in enumerate(self.order):
            jobs = self.jobs[peer]
            if fits is not None and not fits(jobs[0]):
                continue
            del self.order[i]
            job = jobs.popleft()
            if jobs:
                self.order.append(peer)
            else:
                del self.jobs[peer]
            self.count -= 1
            return job
        return None

    def firsts(self) -> list:
        """Each connection's next job (its oldest)."""
        return [jobs[0] for jobs in self.jobs.values()]

    def clear(self) -> list:
        """Every job waiting, taken out."""
        left = [job for jobs in self.jobs.values() for job in jobs]
        self.jobs.clear()
        self.order.clear()
        self.count = 0
        return left


# Unbatched model calls a transport runs at once, per core (Turns' call_slots, server.py; by default
# of --max_concurrent_model_calls). With
# one a core, TensorFlow spread each call's ops over its threads and the server spent more CPU a
# request (benchmarks/fair_bounds.py); with no bound, a connection keeping dozens of calls in
# flight slowed every other connection's call as much as its own.
CALLS_PER_CORE = 4


class Turns(Executor):
    """A pool of up to `threads` threads (started as jobs need them) whose `submit`, from any
    thread, queues the job under the submitting context's PEER. `calls`: the same threads' model
    calls (inference.py), in turns of their own and at most `call_slots` at once (CALLS_PER_CORE
    a core): beyond that they only share the cores, so that a connection with many calls in
    flight would slow every other connection's call as much as its own. The other jobs (a large
    request's decoding or inflating, a large answer's building, a config reload) may take every
    thread."""

    def __init__(self, threads: int, call_slots: int | None = None, name: str = "tfpipe-turns"):
        self.threads, self.name = max(1, threads), name
        self.call_slots = self.threads if call_slots is None else max(1, min(call_slots, self.threads))
        # The queues and counts are under one lock; an idle thread sleeps on `_wake`, which is given
        # one token for each thread to wake (any sleeping thread takes it).
        self._lock = threading.Lock()
        self._wake: SimpleQueue = SimpleQueue()
        self._jobs, self._calls = Waiting(), Waiting()
        self._started: list[threading.Thread] = []
        self._idle = 0  # threads asleep on _wake, or about to be, with no token sent to them
        self._calls_running = 0
        self._closed = False
        self.calls = _Calls(self)

    def submit(self, fn, /, *args, **kwargs) -> Future:
        return self._submit(self._jobs, fn, args, kwargs)

    def waiting(self) -> int:
        """Jobs and model calls not yet started."""
        with self._lock:
            return self._jobs.count + self._calls.count

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No more jobs; the ones waiting are cancelled (a job under way finishes)."""
        with self._lock:
            self._closed = True
            left = self._jobs.clear() + self._calls.clear()
            sleeping, self._idle = self._idle, 0
        for _ in range(sleeping):
            self._wake.put(None)
        for future, *_ in left:
            future.cancel()
        if wait:
            for t in list(self._started):
                if t is not threading.current_thread():
                    t.join()

    def _submit(self, waiting: Waiting, fn, args, kwargs) -> Future:
        future: Future = Future()
        wake = False
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            waiting.add(PEER.get(), (future, fn, args, kwargs))
            if waiting is self._calls and self._calls_running >= self.call_slots:
                return future  # a call finishing takes it up
            if self._idle:
                self._idle -= 1
                wake = True
            elif len(self._started) < self.threads:
                t = threading.Thread(target=self._work, name=f"{self.name}_{len(self._started)}", daemon=True)
                self._started.append(t)
                t.start()
        if wake:
            self._wake.put(None)
        return future

    def _next(self) -> tuple[bool, tuple] | None:
        """Under the lock: (is a model call, the job) to run next, or None."""
        if self._calls.count and self._calls_running < self.call_slots:
            self._calls_running += 1
            return True, self._calls.take()
        if self._jobs.count:
            return False, self._jobs.take()
        return None

    def _work(self) -> None:
        call = False
        while True:
            with self._lock:
                if call:
                    self._calls_running -= 1
                    call = False
                got = self._next()
                if got is None:
                    if self._closed:
                        return
                    self._idle += 1
            if got is None:
                self._wake.get()  # a token: a job came (or the pool closed); another thread may take it first
                continue
            call, (future, fn, args, kwargs) = got
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as e:  # noqa: BLE001 (the caller's future carries it)
                    future.set_exception(e)
            del future, fn, args, kwargs, got  # (an idle thread holds nothing of the job)


class _Calls(Executor):
    """Turns.calls: an Executor whose jobs are its Turns' model calls."""

    def __init__(self, turns: Turns):
        self.turns = turns

    def submit(self, fn, /, *args, **kwargs) -> Future:
        return self.turns._submit(self.turns._calls, fn, args, kwargs)

    def waiting(self) -> int:
        with self.turns._lock:
            return self.turns._calls.count

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.turns.shutdown(wait, cancel_futures=cancel_futures)
