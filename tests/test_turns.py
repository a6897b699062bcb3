"""Work taken in turns by connection (serve/core/turns.py) and batches made in the same turns
(serve/core/batcher.py): one connection's burst is not a queue the others wait at the back of."""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError, ThreadPoolExecutor

import numpy as np
import pytest


def _as(peer: str, fn, *args):
    """fn(*args) with PEER set to `peer`, as a transport sets it for a request's task."""
    from tfpipe.serve.core.turns import PEER

    token = PEER.set(peer)
    try:
        return fn(*args)
    finally:
        PEER.reset(token)


@pytest.mark.parametrize("burst, others, slots, order", [
    # a0 holds the only slot while a1..a4 and b1 wait: b1 goes after one more of a's, not after all
    (["a1", "a2", "a3", "a4"], [("b", "b1")], 1, ["a0", "a1", "b1", "a2", "a3", "a4"]),
    # three connections: one job each per round, each connection's jobs in order
    (["a1", "a2", "a3"], [("b", "b1"), ("b", "b2"), ("c", "c1")], 1, ["a0", "a1", "b1", "c1", "a2", "b2", "a3"]),
    # two slots: a0 and a1 start at once, then the turns as above
    (["a1", "a2", "a3"], [("b", "b1")], 2, ["a0", "a1", "a2", "b1", "a3"]),
])
def test_jobs_take_turns_by_connection(burst, others, slots, order):
    """`order`: the order in which the jobs are handed to the pool (the pool's threads then start
    them as they come free)."""
    from tfpipe.serve.core.turns import Turns

    handed, lock = [], threading.Lock()

    class Pool(ThreadPoolExecutor):
        def submit(self, fn, /, *args, **kwargs):  # Turns hands it (_run, future, job, job's args, kwargs)
            with lock:
                handed.append(args[2][0])
            return super().submit(fn, *args, **kwargs)

    turns = Turns(Pool(slots), slots)
    release = threading.Event()

    def job(name: str, wait: bool = False):
        if wait:
            release.wait(timeout=30)
        return name

    futures = [_as("a", turns.submit, job, "a0", True)]
    if slots > 1:
        futures.append(_as("a", turns.submit, job, burst.pop(0), True))
    futures += [_as("a", turns.submit, job, name) for name in burst]
    futures += [_as(peer, turns.submit, job, name) for peer, name in others]
    assert turns.waiting() == len(futures) - slots and handed == order[:slots]
    release.set()
    assert sorted(f.result(timeout=30) for f in futures) == sorted(order)  # every one answered
    assert handed == order
    turns.shutdown()


def test_a_jobs_error_reaches_its_caller_and_a_cancelled_job_does_not_run():
    from tfpipe.serve.core.turns import Turns

    turns = Turns(ThreadPoolExecutor(1), 1)
    release, ran = threading.Event(), []
    first = turns.submit(release.wait, 30)
    failing = turns.submit(lambda: 1 / 0)
    cancelled = turns.submit(ran.append, "cancelled")
    after = turns.submit(ran.append, "after")
    assert cancelled.cancel()
    release.set()
    assert first.result(timeout=30) is True
    with pytest.raises(ZeroDivisionError):
        failing.result(timeout=30)
    after.result(timeout=30)
    assert ran == ["after"]
    blocker = turns.submit(release.clear)
    blocker.result(timeout=30)
    held = turns.submit(release.wait, 30)
    waiting = turns.submit(ran.append, "never")
    turns.shutdown(wait=False)
    release.set()
    held.result(timeout=30)
    with pytest.raises(CancelledError):
        waiting.result(timeout=30)
    assert ran == ["after"]


def test_batches_are_made_of_the_connections_requests_in_turns():
    """Connection a queues six one-row requests while a batch runs, then b sends one: b's is in the
    next batch (max_batch_size 2), beside a's next, not behind all of a's."""
    from tfpipe.serve.core.batcher import BatchScheduler
    from tfpipe.serve.core.batching import BatchOptions

    release, started, batches = threading.Event(), threading.Event(), []

    def run(merged):
        batches.append(merged["x"].tolist())
        if len(batches) == 1:
            started.set()
            release.wait(timeout=30)
        return {"y": merged["x"] * 10}

    scheduler = BatchScheduler(BatchOptions(max_batch_size=2, batch_timeout_micros=0, num_batch_threads=1,
                                            max_enqueued_batches=10))
    try:
        first = _as("a", scheduler.submit, ("m",), run, {"x": np.array([0.0])})
        assert started.wait(timeout=30)  # the first batch is running (and held)
        a = [_as("a", scheduler.submit, ("m",), run, {"x": np.array([float(i)])}) for i in range(1, 7)]
        b = _as("b", scheduler.submit, ("m",), run, {"x": np.array([100.0])})
        release.set()
        assert b.result(timeout=30)["y"].tolist() == [1000.0]
        assert [f.result(timeout=30)["y"].tolist() for f in [first, *a]] == [[i * 10.0] for i in range(7)]
        assert batches == [[0.0], [1.0, 100.0], [2.0, 3.0], [4.0, 5.0], [6.0]]
    finally:
        scheduler.close()


@pytest.mark.parametrize("waiting, new, refused", [(19, 1, False), (20, 1, True), (18, 3, True), (0, 21, True)])
def test_a_queue_holds_at_most_max_enqueued_batches_of_rows(waiting, new, refused):
    """max_enqueued_batches (10) batches of 2 rows (max_execution_batch_size): 20 rows wait at most."""
    from tfpipe.serve.core.batcher import BatchScheduler
    from tfpipe.serve.core.batching import BatchOptions
    from tfpipe.serve.errors import ServingError

    release, started = threading.Event(), threading.Event()

    def run(merged):
        started.set()
        release.wait(timeout=30)
        return {"y": merged["x"]}

    options = BatchOptions(max_batch_size=64, batch_timeout_micros=0, num_batch_threads=1, max_enqueued_batches=10,
                           enable_large_batch_splitting=True, max_execution_batch_size=2)
    scheduler = BatchScheduler(options)
    try:
        held = scheduler.submit(("m",), run, {"x": np.zeros(1)})
        assert started.wait(timeout=30)
        queued = [scheduler.submit(("m",), run, {"x": np.zeros(1)}) for _ in range(waiting)]
        assert scheduler.depth() == waiting
        if refused:
            with pytest.raises(ServingError) as e:
                scheduler.submit(("m",), run, {"x": np.zeros(new)})
            assert e.value.code.name == "UNAVAILABLE" and "queue" in e.value.message
        else:
            queued.append(scheduler.submit(("m",), run, {"x": np.zeros(new)}))
        release.set()
        assert all(f.result(timeout=30)["y"].shape[0] >= 1 for f in [held, *queued])
    finally:
        release.set()
        scheduler.close()


def test_model_calls_take_turns_of_their_own_at_most_call_slots_at_once():
    """A Turns' `calls` share its pool but run at most call_slots at once: other jobs (which may
    block without using a core) still have the other threads."""
    from tfpipe.serve.core.turns import Turns

    turns = Turns(ThreadPoolExecutor(3), 3, call_slots=1)
    release, blocked = threading.Event(), threading.Event()
    first = _as("a", turns.calls.submit, release.wait, 30)
    second = _as("b", turns.calls.submit, blocked.set)
    assert turns.calls.waiting() == 1  # behind the one call slot
    other = _as("c", turns.submit, lambda: "ran beside the call")
    assert other.result(timeout=30) == "ran beside the call" and not blocked.is_set()
    release.set()
    first.result(timeout=30)
    second.result(timeout=30)
    assert blocked.is_set()
    held = turns.calls.submit(release.clear)
    held.result(timeout=30)
    stuck = turns.calls.submit(release.wait, 30)
    never = turns.calls.submit(blocked.clear)
    turns.shutdown(wait=False)
    release.set()
    stuck.result(timeout=30)
    with pytest.raises(CancelledError):
        never.result(timeout=30)
