"""Work taken in turns by the connections that wait for it, so that one client's burst is not a
queue every other client waits at the back of.

Each request runs with `PEER` set to the connection it came on (the transports set it: gRPC's
peer, REST's remote address and port). `Turns` stands in front of a thread pool: a connection's
jobs run in the order it sent them, the connections take turns, one job each per round, and at
most `slots` jobs are on the pool at once (the pool's own queue is first come, first served). A
job of a connection that has nothing else waiting starts after at most one job of each other
connection that waits, however many those have queued. The batcher takes its batches' requests
in the same turns (batcher.py).
"""

from __future__ import annotations

import contextvars
import threading
from collections import deque
from concurrent.futures import Executor, Future

PEER: contextvars.ContextVar[str] = contextvars.ContextVar("tfpipe_peer", default="")


class Turns(Executor):
    """An Executor over `pool` (of `slots` threads): `submit` from any thread, keyed by the
    submitting context's PEER. `calls`: the same pool's model calls (inference.py), in turns of
    their own and at most `call_slots` at once (one per core): more at once only share the cores,
    so that a connection with many calls in flight slowed every other one's call as much as its
    own. The other jobs (a large request's decoding, Classify waiting for its batch, a config
    reload) may block without using a core: they keep every thread."""

    def __init__(self, pool: Executor, slots: int, call_slots: int | None = None):
        self.pool, self.slots = pool, max(1, slots)
        self.calls = self if call_slots is None else Turns(pool, min(self.slots, call_slots))
        self._lock = threading.Lock()
        self._waiting: dict[str, deque] = {}  # per connection, its jobs in order
        self._order: deque[str] = deque()  # the connections with jobs waiting, in their turn's order
        self._running = 0

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future: Future = Future()
        peer = PEER.get()
        with self._lock:
            jobs = self._waiting.get(peer)
            if jobs is None:
                jobs = self._waiting[peer] = deque()
                self._order.append(peer)
            jobs.append((future, fn, args, kwargs))
            ready = self._take()
        self._start(ready)
        return future

    def waiting(self) -> int:
        """Jobs not yet handed to the pool."""
        with self._lock:
            return sum(map(len, self._waiting.values()))

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """The jobs still waiting cancelled (its model calls' too), then the pool shut down."""
        for turns in {self, self.calls}:
            with turns._lock:
                left = [job for jobs in turns._waiting.values() for job in jobs]
                turns._waiting.clear()
                turns._order.clear()
            for future, *_ in left:
                future.cancel()
        self.pool.shutdown(wait=wait, cancel_futures=cancel_futures)

    def _take(self) -> list[tuple]:
        """Under the lock: the jobs that may go to the pool now, each connection's next in turn."""
        ready = []
        while self._running < self.slots and self._order:
            peer = self._order.popleft()
            jobs = self._waiting[peer]
            ready.append(jobs.popleft())
            if jobs:
                self._order.append(peer)  # its next job waits for the others' turns
            else:
                del self._waiting[peer]
            self._running += 1
        return ready

    def _start(self, ready: list[tuple]) -> None:
        for job in ready:
            try:
                self.pool.submit(self._run, *job)
            except RuntimeError as e:  # the pool shut down: the job fails as the pool's own would
                with self._lock:
                    self._running -= 1
                if job[0].set_running_or_notify_cancel():
                    job[0].set_exception(e)

    def _run(self, future: Future, fn, args, kwargs) -> None:
        try:
            if future.set_running_or_notify_cancel():
                try:
                    result = fn(*args, **kwargs)
                except BaseException as e:  # noqa: BLE001 (the caller's future carries it)
                    future.set_exception(e)
                else:
                    future.set_result(result)
        finally:
            with self._lock:
                self._running -= 1
                ready = self._take()
            self._start(ready)
