"""Dynamic batching: concurrent predict requests merged into one model call.

Semantics follow TF Serving's BasicBatchScheduler as configured by BatchingParameters:
a batch closes when it holds `max_batch_size` rows or its oldest request has waited
`batch_timeout_micros` (and a batch thread is free); it is padded up to the next of
`allowed_batch_sizes` by repeating its first row; `num_batch_threads` batches run at
once; a request that would need a new batch while `max_enqueued_batches` are already
waiting fails at once with UNAVAILABLE rather than queueing without bound.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
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
    future: asyncio.Future


@dataclass
class _Batch:
    deadline: float
    tasks: list[_Task] = field(default_factory=list)
    rows: int = 0


class _Queue:
    """One queue per (servable, signature, input shapes): only alike requests can be merged."""

    def __init__(self, scheduler: BatchScheduler, run):
        self.scheduler, self.run = scheduler, run
        self.batches: deque[_Batch] = deque()


class BatchScheduler:
    def __init__(self, options: BatchOptions, on_batch=None):
        self.options = options
        self.executor = ThreadPoolExecutor(options.num_batch_threads, thread_name_prefix="tfpipe-batch")
        self.idle = options.num_batch_threads
        self.queues: dict[tuple, _Queue] = {}
        self.on_batch = on_batch  # metrics hook: (rows, padded_rows)
        self._timer: asyncio.TimerHandle | None = None

    def depth(self) -> int:
        return sum(b.rows for q in self.queues.values() for b in q.batches)

    async def submit(self, key: tuple, run, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Queue one request (all inputs batched along dimension 0) and wait for its rows."""
        o = self.options
        rows = next(iter(inputs.values())).shape[0]
        if rows > o.max_batch_size:
            raise invalid(f"Task size {rows} is larger than maximum input batch size {o.max_batch_size}")
        q = self.queues.get(key)
        if q is None:
            q = self.queues[key] = _Queue(self, run)
        loop = asyncio.get_running_loop()
        batch = q.batches[-1] if q.batches else None
        if batch is None or batch.rows + rows > o.max_batch_size:
            if len(q.batches) >= o.max_enqueued_batches:
                raise unavailable("The batch scheduling queue to which this task was submitted is full")
            batch = _Batch(deadline=time.monotonic() + o.batch_timeout_micros / 1e6)
            q.batches.append(batch)
            self._arm(loop, batch.deadline)
        task = _Task(inputs, rows, loop.create_future())
        batch.tasks.append(task)
        batch.rows += rows
        self._dispatch(loop)
        return await task.future

    def _arm(self, loop, deadline: float) -> None:
        loop.call_at(loop.time() + max(0.0, deadline - time.monotonic()), self._dispatch, loop)

    def _dispatch(self, loop) -> None:
        """Start every batch that is full or past its deadline while a batch thread is free."""
        now = time.monotonic()
        while self.idle > 0:
            ready = [q for q in self.queues.values() if q.batches and
                     (q.batches[0].rows >= self.options.max_batch_size or q.batches[0].deadline <= now
                      or len(q.batches) > 1)]
            if not ready:
                return
            q = min(ready, key=lambda q: q.batches[0].deadline)  # oldest first across queues
            batch = q.batches.popleft()
            self.idle -= 1
            loop.create_task(self._execute(loop, q, batch))

    async def _execute(self, loop, q: _Queue, batch: _Batch) -> None:
        try:
            merged, padded = self._merge(batch)
            if self.on_batch:
                self.on_batch(batch.rows, padded)
            try:
                outputs = await loop.run_in_executor(self.executor, q.run, merged)
            except Exception as e:
                for t in batch.tasks:
                    if not t.future.done():
                        t.future.set_exception(e)
                return
            start = 0
            for t in batch.tasks:
                try:
                    part = {k: _rows(k, v, start, t.rows, padded) for k, v in outputs.items()}
                except Exception as e:
                    part = None
                    if not t.future.done():
                        t.future.set_exception(e)
                if part is not None and not t.future.done():
                    t.future.set_result(part)
                start += t.rows
        finally:
            self.idle += 1
            self._dispatch(loop)

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
        self.executor.shutdown(wait=False, cancel_futures=True)


def _rows(name: str, value: np.ndarray, start: int, rows: int, batch: int) -> np.ndarray:
    if value.ndim == 0 or value.shape[0] != batch:
        raise precondition(f"output '{name}' has no batch dimension of size {batch}, so it cannot be "
                           "split between batched requests; disable batching for this model")
    return value[start:start + rows]
