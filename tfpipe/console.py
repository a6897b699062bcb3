"""`tfpipe run`'s terminal: one line per step (ticking while it runs on a terminal), each step's
own output (Python's prints, Keras, Beam, TensorFlow's native logs) sent to its log file instead,
paths shown as a user types them, and an error said in one line."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time
from collections.abc import Iterator

from tfpipe import UserError


def shown(path: str) -> str:
    """A path as the user would type it: relative under the current directory, else absolute."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


class Console:
    """The real terminal, kept apart from fds 1 and 2, which point at a step's log while it runs."""

    def __init__(self) -> None:
        sys.stdout.flush()
        self.out = os.fdopen(os.dup(1), "w", buffering=1)
        self.tty = self.out.isatty()
        self._lock = threading.Lock()

    def print(self, text: str = "") -> None:
        with self._lock:
            self.out.write(("\r\033[K" if self.tty else "") + text + "\n")
            self.out.flush()

    @contextlib.contextmanager
    def running(self, step: str, why: str) -> Iterator[None]:
        """'running' with the elapsed seconds ticking on a terminal; one plain line otherwise."""
        started = time.monotonic()
        stop = threading.Event()
        if not self.tty:
            self.print(f"  {step:<9}running  ({why})")
            yield
            return

        def tick() -> None:
            while not stop.wait(0.5):
                with self._lock:
                    self.out.write(f"\r\033[K  {step:<9}running {time.monotonic() - started:6.0f}s  ({why})")
                    self.out.flush()

        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        try:
            yield
        finally:
            stop.set()
            ticker.join()

    def close(self) -> None:
        self.out.close()


@contextlib.contextmanager
def output_into(path: str, enabled: bool) -> Iterator[None]:
    """Send fds 1 and 2 (Python's prints, Keras, Beam, TensorFlow's native logs) to `path`."""
    if not enabled:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def plain_text(text: str) -> str:
    """`text` without terminal colour codes (Keras colours the errors it re-raises)."""
    return _ANSI.sub("", text)


def error_line(e: BaseException) -> str:
    """One line that says what went wrong: a user error's first line; for anything else, the
    line that names the error. TensorFlow's and Keras's messages open with a heading such as
    'in user code:' and end with the error itself, so a heading gives way to the last line."""
    lines = [line.strip() for line in plain_text(str(e)).splitlines() if line.strip()]
    if not lines:
        return type(e).__name__
    if isinstance(e, UserError) or not lines[0].endswith(":") or len(lines) == 1:
        line = lines[0]
    else:
        line = lines[-1]
    if isinstance(e, UserError) or re.match(r"[\w.]+(Error|Exception): ", line):
        return line
    return f"{type(e).__name__}: {line}"
