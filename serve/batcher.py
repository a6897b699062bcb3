"""Dynamic batching: concurrent requests (Predict, Classify, Regress) merged into one model call.

Semantics follow TF Serving's BasicBatchScheduler as configured by BatchingParameters:
a batch closes when it holds `max_batch_size` rows or its oldest request has waited
`batch_timeout_micros` (and a batch thread is free); it is padded up to the next of
`allowed_batch_sizes` by repeating its first row; `num_batch_threads` batches run at
once; a request that would need a new batch while `max_enqueued_batches` are already
waiting fails at once with UNAVAILABLE rather than queueing without bound.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from serve.errors import invalid, precondition, unavailable


@dataclass
class BatchOptions:
    max_batch_size: int = 1000
    batch_timeout_micros: int = 0
    max_enqueued_batches: int = 10
    num_batch_threads: int = os.cpu_count() or 1
    allowed_batch_sizes: list[int] = field(default_factory=list)

    @classmethod
    def from_proto(cls, p) -> BatchOptions:
        o = cls()
        for name in ("max_batch_size", "batch_timeout_micros", "max_enqueued_batches", "num_batch_threads"):
            if p.HasField(name):
                setattr(o, name, int(getattr(p, name).value))
        o.allowed_batch_sizes = sorted(int(x) for x in p.allowed_batch_sizes)
        o.check()
        return o

    def check(self) -> None:
        if self.max_batch_size < 1 or self.num_batch_threads < 1 or self.max_enqueued_batches < 1:
            raise ValueError("max_batch_size, num_batch_threads and max_enqueued_batches must be >= 1")
        if self.allowed_batch_sizes and self.allowed_batch_sizes[-1] != self.max_batch_size:
            # TF Serving's own rule: the last allowed size must equal max_batch_size.
            raise ValueError(f"the last entry of allowed_batch_sizes ({self.allowed_batch_sizes[-1]}) must "
                             f"equal max_batch_size ({self.max_batch_size})")


@dataclass
class _Task:
    inputs: dict[str, np.ndarray]
    rows: int
    future: Future


@dataclass
class _Batch:
    deadline: float
    tasks: list[_Task] = field(default_factory=list)
    rows: int = 0


class _Queue:
    """One queue per (servable, signature, input shapes): only alike requests can be merged."""

    def __init__(self, run):
        self.run = run
        self.batches: deque[_Batch] = deque()


class BatchScheduler:
    """`submit` from any thread (gRPC handler threads, the REST event loop) returns a
    concurrent.futures.Future; `num_batch_threads` threads take the batches that are ready
    and run them, as TF Serving's batch threads do."""

    def __init__(self, options: BatchOptions, on_batch=None):
        self.options = options
        self.queues: dict[tuple, _Queue] = {}
        self.on_batch = on_batch  # metrics hook: (rows, padded_rows)
        self._cv = threading.Condition()
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"tfpipe-batch-{i}", daemon=True)
                         for i in range(options.num_batch_threads)]
        for t in self._threads:
            t.start()

    def depth(self) -> int:
        with self._cv:
            return sum(b.rows for q in self.queues.values() for b in q.batches)

    def submit(self, key: tuple, run, inputs: dict[str, np.ndarray]) -> Future:
        """Queue one request (all inputs batched along dimension 0); the future holds its rows
        of the outputs. A full queue raises UNAVAILABLE here, at once."""
        o = self.options
        rows = next(iter(inputs.values())).shape[0]
        if rows > o.max_batch_size:
            raise invalid(f"Task size {rows} is larger than maximum input batch size {o.max_batch_size}")
        task = _Task(inputs, rows, Future())
        with self._cv:
            if self._closed:
                raise unavailable("The server is shutting down")
            q = self.queues.get(key)
            if q is None:
                q = self.queues[key] = _Queue(run)
            batch = q.batches[-1] if q.batches else None
            if batch is None or batch.rows + rows > o.max_batch_size:
                if len(q.batches) >= o.max_enqueued_batches:
                    raise unavailable("The batch scheduling queue to which this task was submitted is full")
                batch = _Batch(deadline=time.monotonic() + o.batch_timeout_micros / 1e6)
                q.batches.append(batch)
                new_batch = True
            else:
                new_batch = False
            batch.tasks.append(task)
            batch.rows += rows
            # Wake a batch thread when this batch can run now, or when its deadline is new.
            if new_batch or batch.rows >= o.max_batch_size:
                self._cv.notify()
        return task.future

    def _next(self) -> tuple[_Queue, _Batch] | None:
        """Under the lock: wait for the oldest batch that is full, past its deadline or followed
        by another; None once closed."""
        while not self._closed:
            now = time.monotonic()
            ready = [q for q in self.queues.values() if q.batches and
                     (q.batches[0].rows >= self.options.max_batch_size or q.batches[0].deadline <= now
                      or len(q.batches) > 1)]
            if ready:
                q = min(ready, key=lambda q: q.batches[0].deadline)  # oldest first across queues
                return q, q.batches.popleft()
            deadlines = [q.batches[0].deadline for q in self.queues.values() if q.batches]
            self._cv.wait(timeout=max(0.0, min(deadlines) - now) if deadlines else None)
        return None

    def _work(self) -> None:
        while True:
            with self._cv:
                got = self._next()
            if got is None:
                return
            self._execute(*got)

    def _execute(self, q: _Queue, batch: _Batch) -> None:
        # A task whose caller gave up (the REST timeout cancels its future) is left out.
        batch.tasks = [t for t in batch.tasks if t.future.set_running_or_notify_cancel()]
        batch.rows = sum(t.rows for t in batch.tasks)
        if not batch.tasks:
            return
        try:
            merged, padded = self._merge(batch)
            if self.on_batch:
                self.on_batch(batch.rows, padded)
            outputs = q.run(merged)
        except Exception as e:
            for t in batch.tasks:
                t.future.set_exception(e)
            return
        start = 0
        for t in batch.tasks:
            try:
                t.future.set_result({k: _rows(k, v, start, t.rows, padded) for k, v in outputs.items()})
            except Exception as e:
                t.future.set_exception(e)
            start += t.rows

    def _merge(self, batch: _Batch) -> tuple[dict[str, np.ndarray], int]:
        size = batch.rows
        for allowed in self.options.allowed_batch_sizes:
            if allowed >= size:
                size = allowed
                break
        merged = {}
        for name in batch.tasks[0].inputs:
            parts = [t.inputs[name] for t in batch.tasks]
            if size > batch.rows:  # TF Serving pads with copies of the first row
                first = parts[0][:1]
                parts.append(np.repeat(first, size - batch.rows, axis=0))
            merged[name] = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return merged, size

    def close(self) -> None:
        """Stop the batch threads; requests still queued fail with UNAVAILABLE."""
        with self._cv:
            self._closed = True
            waiting = [t for q in self.queues.values() for b in q.batches for t in b.tasks]
            self.queues.clear()
            self._cv.notify_all()
        for t in waiting:
            if t.future.set_running_or_notify_cancel():
                t.future.set_exception(unavailable("The server is shutting down"))


def _rows(name: str, value: np.ndarray, start: int, rows: int, batch: int) -> np.ndarray:
    if value.ndim == 0 or value.shape[0] != batch:
        raise precondition(f"output '{name}' has no batch dimension of size {batch}, so it cannot be "
                           "split between batched requests; disable batching for this model")
    return value[start:start + rows]
