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
"""

from __future__ import annotations

import contextlib
import gc
import sys
import threading
from collections.abc import Iterator

LARGE_SWITCH_SECONDS = 0.0002

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
