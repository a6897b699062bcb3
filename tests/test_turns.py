"""Work taken in turns by connection (serve/core/turns.py) and batches made in the same turns
(serve/core/batcher.py): one connection's burst is not a queue the others wait at the back of."""

from __future__ import annotations

import threading
import time
from concurrent.futures import CancelledError

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


@pytest.mark.parametrize("burst, others, order", [
    # a0 holds the only thread while a1..a4 and b1 wait: b1 goes after one more of a's, not after all
    (["a1", "a2", "a3", "a4"], [("b", "b1")], ["a0", "a1", "b1", "a2", "a3", "a4"]),
    # three connections: one job each per round, each connection's jobs in order
    (["a1", "a2", "a3"], [("b", "b1"), ("b", "b2"), ("c", "c1")], ["a0", "a1", "b1", "c1", "a2", "b2", "a3"]),
    # only one connection: its jobs in order
    (["a1", "a2"], [], ["a0", "a1", "a2"]),
])
@pytest.mark.parametrize("calls", [False, True])
def test_jobs_take_turns_by_connection(burst, others, order, calls):
    """The same turns for jobs and for model calls (one thread: the order they start in)."""
    from tfpipe.serve.core.turns import Turns

    turns = Turns(1, 1)
    pool = turns.calls if calls else turns
    release, started, ran = threading.Event(), threading.Event(), []

    def job(name: str, wait: bool = False):
        ran.append(name)
        if wait:
            started.set()
            release.wait(timeout=30)
        return name

    futures = [_as("a", pool.submit, job, "a0", True)]
    assert started.wait(timeout=30)
    futures += [_as("a", pool.submit, job, name) for name in burst]
    futures += [_as(peer, pool.submit, job, name) for peer, name in others]
    assert turns.waiting() == len(futures) - 1
    release.set()
    assert sorted(f.result(timeout=30) for f in futures) == sorted(order)  # every one answered
    assert ran == order
    turns.shutdown()


def test_a_jobs_error_reaches_its_caller_and_a_cancelled_job_does_not_run():
    from tfpipe.serve.core.turns import Turns

    turns = Turns(1)
    release, started, ran = threading.Event(), threading.Event(), []
    first = turns.submit(lambda: started.set() or release.wait(30))
    assert started.wait(timeout=30)
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
    turns.submit(release.clear).result(timeout=30)
    started.clear()
    held = turns.submit(lambda: started.set() or release.wait(30))
    assert started.wait(timeout=30)
    waiting = turns.submit(ran.append, "never")
    turns.shutdown(wait=False)
    release.set()
    held.result(timeout=30)
    with pytest.raises(CancelledError):
        waiting.result(timeout=30)
    assert ran == ["after"]
    with pytest.raises(RuntimeError):
        turns.submit(ran.append, "after shutdown")


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


def test_model_calls_run_at_most_call_slots_at_once_and_other_jobs_beside_them():
    """Calls beyond call_slots wait for one to finish; the other jobs (which may block without
    using a core) still have the other threads."""
    from tfpipe.serve.core.turns import Turns

    turns = Turns(3, call_slots=1)
    release, started, second_ran = threading.Event(), threading.Event(), threading.Event()
    first = _as("a", turns.calls.submit, lambda: started.set() or release.wait(30))
    assert started.wait(timeout=30)
    second = _as("b", turns.calls.submit, second_ran.set)
    assert turns.calls.waiting() == 1  # behind the one call slot
    other = _as("c", turns.submit, lambda: "ran beside the call")
    assert other.result(timeout=30) == "ran beside the call" and not second_ran.is_set()
    release.set()
    first.result(timeout=30)
    second.result(timeout=30)
    assert second_ran.is_set() and turns.waiting() == 0
    turns.shutdown()


@pytest.mark.parametrize("queued, room, taken, left_order", [
    # a's 5 rows do not fit in 4: b's 3 goes, a keeps its place ahead of b's next
    ([("a", 5), ("b", 3), ("b", 1)], 4, [("b", 3), ("b", 1)], ["a"]),
    ([("a", 2), ("b", 2), ("a", 2)], 4, [("a", 2), ("b", 2)], ["a"]),
    ([("a", 9)], 4, [], ["a"]),
])
def test_a_batch_takes_what_fits_in_turn_and_the_rest_keep_their_places(queued, room, taken, left_order):
    from tfpipe.serve.core.turns import Waiting

    waiting, got = Waiting(), []
    for peer, rows in queued:
        waiting.add(peer, (peer, rows))
    while (job := waiting.take(lambda j: sum(r for _, r in got) + j[1] <= room)) is not None:
        got.append(job)
    assert got == taken and list(waiting.order) == left_order
    assert waiting.count == len(queued) - len(taken)


@pytest.mark.parametrize("queued, size, batches", [
    # everything waiting fits: one batch of all of it, whatever the turns' order
    ([("a", 1), ("a", 1), ("b", 2), ("a", 1)], 5, [[("a", 1), ("a", 1), ("a", 1), ("b", 2)]]),
    ([("a", 1), ("b", 1)], 2, [[("a", 1), ("b", 1)]]),
    # more than fits: in turns, then the rest (all of which fit) in the next
    ([("a", 1), ("a", 1), ("a", 1), ("b", 1)], 2, [[("a", 1), ("b", 1)], [("a", 1), ("a", 1)]]),
    ([("a", 3), ("b", 2), ("b", 2)], 4, [[("a", 3)], [("b", 2), ("b", 2)]]),
])
def test_a_batch_queue_gives_its_tasks_in_batches_of_at_most_its_size(queued, size, batches):
    from tfpipe.serve.core.batcher import _Queue, _Task
    from tfpipe.serve.core.batching import BatchOptions

    q = _Queue(None, BatchOptions(max_batch_size=size))
    for peer, rows in queued:
        q.waiting.add(peer, _Task({"x": np.zeros(rows)}, rows, None, deadline=0.0))
        q.rows += rows
    peers = {id(t): peer for peer, jobs in q.waiting.jobs.items() for t in jobs}
    got = []
    while q.waiting.count:
        batch = q.take()
        assert batch.rows == sum(t.rows for t in batch.tasks) <= size
        got.append(sorted((peers[id(t)], t.rows) for t in batch.tasks))
    assert got == [sorted(b) for b in batches] and q.rows == 0 and not q.waiting.order


def test_large_requests_hold_the_lane_in_the_order_they_came():
    """Lane(1): the first holds it; the others wait and take it one after another, in order; a
    waiter cancelled before its turn never holds it, and its place goes to the next."""
    import asyncio

    from tfpipe.serve.core.large_requests import Lane

    lane, held, log = Lane(1), [], []

    async def request(name: str, leave: asyncio.Event):
        async with lane.held():
            held.append(name)
            log.append(("in", name, len(held)))
            await leave.wait()
            held.remove(name)

    async def main():
        leaves = {n: asyncio.Event() for n in "abcd"}
        tasks = {}
        for n in "abcd":
            tasks[n] = asyncio.create_task(request(n, leaves[n]))
            await asyncio.sleep(0)  # each task reaches the lane before the next starts
        assert log == [("in", "a", 1)] and lane.waiting == 3
        tasks["b"].cancel()  # waiting: taken out of the queue
        await asyncio.gather(tasks["b"], return_exceptions=True)
        assert lane.waiting == 2
        for n in "acd":
            leaves[n].set()
        await asyncio.gather(tasks["a"], tasks["c"], tasks["d"])
        assert tasks["b"].cancelled()
    asyncio.run(main())
    assert log == [("in", "a", 1), ("in", "c", 1), ("in", "d", 1)]
    assert lane._held == 0 and lane.waiting == 0


def test_a_large_request_cancelled_as_its_turn_comes_gives_the_lane_on():
    """The place handed to a waiter that is cancelled in the same moment goes on to the next one,
    across event loops (gRPC's and REST's may differ): the lane is never left held by nobody."""
    import asyncio

    from tfpipe.serve.core.large_requests import Lane

    lane = Lane(1)
    entered = []

    async def first(release: asyncio.Event):
        async with lane.held():
            await release.wait()

    async def main():
        release = asyncio.Event()
        holder = asyncio.create_task(first(release))
        await asyncio.sleep(0)
        second = asyncio.create_task(_enter(lane, entered, "second"))
        await asyncio.sleep(0)
        ready = threading.Event()
        other = threading.Thread(target=lambda: asyncio.run(_enter(lane, entered, "other", ready)))
        other.start()
        ready.wait(10)
        deadline = time.monotonic() + 10
        while lane.waiting < 2 and time.monotonic() < deadline:  # the other loop's task reaches the lane
            await asyncio.sleep(0.001)
        assert lane.waiting == 2
        release.set()  # the place is handed to `second`...
        await holder
        second.cancel()  # ...which is cancelled before it runs: the place goes on to `other`
        await asyncio.gather(second, return_exceptions=True)
        await asyncio.get_running_loop().run_in_executor(None, other.join, 10)
        assert not other.is_alive()
    asyncio.run(main())
    assert entered == ["other"] and lane._held == 0 and lane.waiting == 0


async def _enter(lane, entered: list, name: str, ready: threading.Event | None = None):
    if ready is not None:
        ready.set()
    async with lane.held():
        entered.append(name)
