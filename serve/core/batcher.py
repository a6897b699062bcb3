"""Dynamic batching: concurrent requests (Predict, Classify, Regress) merged into one model call.

Semantics follow TF Serving's BasicBatchScheduler as configured by BatchingParameters:
a batch closes when it holds `max_batch_size` rows or its oldest request has waited
`batch_timeout_micros` (and a batch thread is free); it is padded up to the next of
`allowed_batch_sizes` by repeating its first row; `num_batch_threads` batches run at
once; a request that would need a new batch while `max_enqueued_batches` are already
waiting fails at once with UNAVAILABLE rather than queueing without bound. With
`enable_large_batch_splitting`, a request larger than `max_execution_batch_size` rows is
split across batches and its answer put back together.

Queues are per (servable, signature, input shapes): only alike requests merge, and each
queue may have its own parameters (--enable_per_model_batching_parameters). When a version
unloads, `drop` lets its queues go once their last batch has run, so that no queue keeps
an unloaded model alive.

A batch is made when a batch thread takes it, of the waiting requests in turns by connection
(turns.PEER): each connection's requests in the order it sent them, one each per round, so that a
request of a connection with nothing else waiting goes in the next batch however many another
connection has queued (TF Serving fills batches first come, first served). A queue holds at
most `max_enqueued_batches` batches' rows.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from tfpipe.serve.core.batching import BatchOptions
from tfpipe.serve.core.turns import PEER, Waiting
from tfpipe.serve.errors import invalid, precondition, unavailable


@dataclass
class _Task:
    inputs: dict[str, np.ndarray]
    rows: int
    future: Future | asyncio.Future  # an asyncio.Future is settled on its loop (see _settle)
    deadline: float = 0.0  # when it has waited batch_timeout_micros

    def claim(self) -> bool:
        """False when the caller gave up (the REST timeout cancels its future): the task is left out."""
        if isinstance(self.future, asyncio.Future):
            return not self.future.cancelled()
        return self.future.set_running_or_notify_cancel()


@dataclass
class _Batch:
    tasks: list[_Task] = field(default_factory=list)
    rows: int = 0


class _Queue:
    def __init__(self, run, options: BatchOptions):
        self.run = run
        self.options = options
        self.waiting = Waiting()  # its tasks, in turns by connection
        self.rows = 0  # rows waiting
        self.retired = False  # its servable unloaded: removed once empty

    def oldest(self) -> float:
        """The earliest deadline of the tasks waiting (each connection's first is its oldest)."""
        return min(jobs[0].deadline for jobs in self.waiting.jobs.values())

    def ready(self, now: float) -> bool:
        return self.rows >= self.options.execution_size or self.oldest() <= now

    def take(self) -> _Batch:
        """The next batch: the connections in turn, the next task of each that fits, until it is
        full or no waiting task fits."""
        size, batch = self.options.execution_size, _Batch()
        if self.rows <= size:  # every task fits: all of them, whatever the turns' order
            batch.tasks, batch.rows, self.rows = self.waiting.clear(), self.rows, 0
            return batch
        while batch.rows < size:
            task = self.waiting.take(lambda t: batch.rows + t.rows <= size)
            if task is None:
                break
            batch.tasks.append(task)
            batch.rows += task.rows
        self.rows -= batch.rows
        return batch


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
        self._dropped: set = set()  # owners whose servable unloaded (uids are never reused)
        self._threads = [threading.Thread(target=self._work, name=f"tfpipe-batch-{i}", daemon=True)
                         for i in range(options.num_batch_threads)]
        for t in self._threads:
            t.start()

    def depth(self) -> int:
        with self._cv:
            return sum(q.rows for q in self.queues.values())

    def queue_count(self) -> int:
        with self._cv:
            return len(self.queues)

    def submit(self, key: tuple, run, inputs: dict[str, np.ndarray], options: BatchOptions | None = None,
               loop: asyncio.AbstractEventLoop | None = None) -> Future | asyncio.Future:
        """Queue one request (all inputs batched along dimension 0); the future holds its rows
        of the outputs. `key[0]` names the servable (see `drop`). A full queue raises
        UNAVAILABLE here, at once. Called on an event loop's thread with `loop`, it returns an
        asyncio.Future of that loop: a batch's answers then reach the loop in one wake-up, not
        one per request."""
        o = options or self.options
        rows = next(iter(inputs.values())).shape[0]
        if rows > o.max_batch_size:
            raise invalid(f"Task size {rows} is larger than maximum input batch size {o.max_batch_size}")
        step = o.execution_size
        if rows <= step:
            future = loop.create_future() if loop is not None else Future()
            return self._enqueue(key, run, o, [_Task(inputs, rows, future)])[0]
        parts = [_Task({k: v[i:i + step] for k, v in inputs.items()}, min(step, rows - i), Future())
                 for i in range(0, rows, step)]
        joined = _joined(self._enqueue(key, run, o, parts))
        return asyncio.wrap_future(joined, loop=loop) if loop is not None else joined

    def _enqueue(self, key: tuple, run, o: BatchOptions, tasks: list[_Task]) -> list[Future]:
        peer = PEER.get()
        with self._cv:
            if self._closed:
                raise unavailable("The server is shutting down")
            q = self.queues.get(key)
            if q is None:  # a request that resolved the servable before it unloaded still runs
                q = self.queues[key] = _Queue(run, o)
                q.retired = key[0] in self._dropped
            size = o.execution_size
            rows = tasks[0].rows if len(tasks) == 1 else sum(t.rows for t in tasks)
            if q.rows + rows > o.max_enqueued_batches * size:
                raise unavailable("The batch scheduling queue to which this task was submitted is full")
            deadline = time.monotonic() + o.batch_timeout_micros / 1e6
            first = not q.waiting.count
            for task in tasks:
                task.deadline = deadline
                q.waiting.add(peer, task)
            q.rows += rows
            if first or q.rows >= size:
                self._cv.notify()  # a new deadline to wait for, or a full batch to run now
        return [t.future for t in tasks]

    def drop(self, owner) -> None:
        """The servable `owner` (key[0]) unloaded: its queues go once their batches have run."""
        with self._cv:
            self._dropped.add(owner)
            for key, q in list(self.queues.items()):
                if key[0] == owner:
                    q.retired = True
                    if not q.waiting.count:
                        del self.queues[key]

    def _next(self) -> tuple[_Queue, _Batch] | None:
        """Under the lock: wait for a queue that holds a full batch or a task past its deadline,
        and take its next batch (of the queue whose oldest task is oldest); None once closed."""
        while not self._closed:
            now = time.monotonic()
            ready = [(k, q) for k, q in self.queues.items() if q.waiting.count and q.ready(now)]
            if ready:
                key, q = ready[0] if len(ready) == 1 else min(ready, key=lambda kq: kq[1].oldest())  # oldest first
                batch = q.take()
                if q.retired and not q.waiting.count:
                    del self.queues[key]
                return q, batch
            deadlines = [q.oldest() for q in self.queues.values() if q.waiting.count]
            self._cv.wait(timeout=max(0.0, min(deadlines) - now) if deadlines else None)
        return None

    def _work(self) -> None:
        while True:
            with self._cv:
                got = self._next()
            if got is None:
                return
            self._execute(*got)
            del got  # a retired queue (and its servable) goes with the last batch

    def _execute(self, q: _Queue, batch: _Batch) -> None:
        batch.tasks = [t for t in batch.tasks if t.claim()]
        batch.rows = sum(t.rows for t in batch.tasks)
        if not batch.tasks:
            return
        try:
            merged, padded = self._merge(q.options, batch)
            if self.on_batch:
                self.on_batch(batch.rows, padded)
            outputs = q.run(merged)
        except Exception as e:
            _settle([(t.future, None, e) for t in batch.tasks])
            return
        answers, start = [], 0
        for t in batch.tasks:
            try:
                answers.append((t.future, {k: _rows(k, v, start, t.rows, padded) for k, v in outputs.items()}, None))
            except Exception as e:
                answers.append((t.future, None, e))
            start += t.rows
        _settle(answers)

    @staticmethod
    def _merge(options: BatchOptions, batch: _Batch) -> tuple[dict[str, np.ndarray], int]:
        size = batch.rows
        for allowed in options.allowed_batch_sizes:
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
            waiting = [t for q in self.queues.values() for t in q.waiting.clear()]
            self.queues.clear()
            self._cv.notify_all()
        _settle([(t.future, None, unavailable("The server is shutting down")) for t in waiting if t.claim()])


def _settle(answers: list[tuple]) -> None:
    """Set each (future, result, exception): a concurrent Future here; the asyncio Futures of one
    loop together, in one call on that loop (each call_soon_threadsafe wakes the loop through a
    pipe, which cost about a tenth of a REST request's CPU when done once per request)."""
    on_loops: dict = {}
    for future, result, error in answers:
        if isinstance(future, asyncio.Future):
            on_loops.setdefault(future.get_loop(), []).append((future, result, error))
        elif error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
    for loop, items in on_loops.items():
        try:
            loop.call_soon_threadsafe(_settle_on_loop, items)
        except RuntimeError:  # the loop closed: nobody waits for these answers any more
            pass


def _settle_on_loop(items: list[tuple]) -> None:
    for future, result, error in items:
        if future.done():  # cancelled meanwhile (the REST timeout)
            continue
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)


def _rows(name: str, value: np.ndarray, start: int, rows: int, batch: int) -> np.ndarray:
    if value.ndim == 0 or value.shape[0] != batch:
        raise precondition(f"output '{name}' has no batch dimension of size {batch}, so it cannot be "
                           "split between batched requests; disable batching for this model")
    return value[start:start + rows]


def _joined(parts: list[Future]) -> Future:
    """One future for a request split across batches: its parts' rows, concatenated in order."""
    out: Future = Future()
    out.set_running_or_notify_cancel()
    left = [len(parts)]
    lock = threading.Lock()

    def done(_):
        with lock:
            left[0] -= 1
            if left[0]:
                return
        errors = [p.exception() for p in parts if p.exception() is not None]
        if errors:
            out.set_exception(errors[0])
        else:
            results = [p.result() for p in parts]
            out.set_result({k: np.concatenate([r[k] for r in results]) for k in results[0]})

    for p in parts:
        p.add_done_callback(done)
    return out
