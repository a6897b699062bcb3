"""How the server's process behaves while any large request is answered (`large_request()`): one
whose work, in Python, takes long enough to keep the loop and every other request's thread
waiting for the interpreter lock.

- Python's garbage collector is off, and as it was after the last: a large JSON body's millions
  of objects (acyclic, freed by their counts) would set off full collections that walk them all,
  each holding the GIL for as long as the walk takes.
- The GIL changes hands every LARGE_SWITCH_SECONDS rather than every 5 ms (Python's default
  switch interval). A small request needs the lock several times on its way through (the loop,
  a worker thread, TensorFlow's call and its return): behind a thread that keeps it busy, each
  of those waits out a whole interval. The interval matters only while a thread waits for the
  lock, so a server without a large request in flight runs as before.

What is large is the caller's to say: a request body or answer over OFF_LOOP_BYTES (inference.py),
or a request that runs as several model calls (--max_call_rows).

A transport answers a large request in `large_turn()`: at most `at_once(n)` of them (by default
LARGE_AT_ONCE, half the cores) are decoded, run and encoded at once in a process, the others waiting their turn, first
come first served, without holding a thread. Each is seconds of CPU; at once they would take every
core from the small requests, and hold as many parsed documents in memory, for no more large
requests answered a second than one after another.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys
import threading
from collections import deque
from collections.abc import AsyncIterator, Iterator

from tfpipe.machine import cores

LARGE_SWITCH_SECONDS = 0.0002
LARGE_AT_ONCE = max(1, cores() // 2)

_lock = threading.Lock()
_in_flight = 0  # large requests being answered
_gc_was_enabled = False  # the collector's state when the first of them came in
_switch_was = 0.005  # the switch interval then


@contextlib.contextmanager
def large_request() -> Iterator[None]:
    """The process as the module's docstring says, from the first large request in flight until
    the last is answered (nesting and overlapping from any thread or task)."""
    global _in_flight, _gc_was_enabled, _switch_was
    with _lock:
        if _in_flight == 0:
            _gc_was_enabled, _switch_was = gc.isenabled(), sys.getswitchinterval()
            gc.disable()
            sys.setswitchinterval(LARGE_SWITCH_SECONDS)
        _in_flight += 1
    try:
        yield
    finally:
        with _lock:
            _in_flight -= 1
            if _in_flight == 0:
                sys.setswitchinterval(_switch_was)
                if _gc_was_enabled:
                    gc.enable()


class Lane:
    """At most `width` holders at once, from tasks of any event loop; the others wait in the order
    they came, each on a future of its own loop (no thread held)."""

    def __init__(self, width: int):
        self.width = width
        self._lock = threading.Lock()
        self._held = 0
        self._waiting: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = deque()

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._held < self.width and not self._waiting:
                self._held, turn = self._held + 1, None
            else:
                turn = loop.create_future()
                self._waiting.append((loop, turn))
        if turn is not None:
            try:
                await turn
            except asyncio.CancelledError:
                with self._lock:
                    waiting = (loop, turn) in self._waiting
                    if waiting:
                        self._waiting.remove((loop, turn))
                if not waiting and turn.done() and not turn.cancelled():
                    self._give_on()  # handed the place as it was cancelled (a cancelled turn is given on by _hand)
                raise
        try:
            yield
        finally:
            self._give_on()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def _give_on(self) -> None:
        """A holder leaves: its place goes to the first waiting, else is free."""
        with self._lock:
            if not self._waiting:
                self._held -= 1
                return
            loop, turn = self._waiting.popleft()
        try:
            loop.call_soon_threadsafe(self._hand, turn)
        except RuntimeError:  # its loop is closed: the place goes on to the next
            self._give_on()

    def _hand(self, turn: asyncio.Future) -> None:
        if turn.done():  # cancelled while the place came to it
            self._give_on()
        else:
            turn.set_result(None)


_lane = Lane(LARGE_AT_ONCE)


def at_once(n: int) -> None:
    """How many large requests are answered at once in this process (--large_requests_at_once;
    0: LARGE_AT_ONCE). Set as the server starts, before any request."""
    _lane.width = n if n > 0 else LARGE_AT_ONCE


@contextlib.asynccontextmanager
async def large_turn() -> AsyncIterator[None]:
    """A large request's answering, in its turn (see the module's docstring) and as a large request."""
    async with _lane.held():
        with large_request():
            yield
