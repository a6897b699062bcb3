"""The REST user's HTTP/1.1 client: one keep-alive connection, requests prebuilt as bytes,
and each answer timed from the moment its request is handed to the kernel to the moment
the kernel received the answer's last bytes (SO_TIMESTAMPNS), so that the time a
greenlet waits for the gevent hub to wake it is not counted as the server's.

Against a server that holds every request 5 ms, locust's FastHttpSession reads about 0.5 ms
above a blocking socket client; this client reads within 0.1 ms of it (the comparison is
benchmarks/bench_loadtest.py). Plain `http://` gets kernel timestamps; `https://`, or a
system without them, is timed with perf_counter around the same calls.
"""

from __future__ import annotations

import select
import socket
import ssl
import struct
import time
from urllib.parse import urlparse

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux's value where Python lacks the name
_ANCILLARY = socket.CMSG_SPACE(16) if hasattr(socket, "CMSG_SPACE") else 0
MAX_HEADER_BYTES = 64 * 1024


class HttpError(Exception):
    """A response that is not HTTP/1.x, or a connection closed mid-answer."""


def build_request(address: str, method: str, path: str, body: bytes,
                  content_type: str = "application/json") -> bytes:
    u = urlparse(address)
    head = (f"{method} {path} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: keep-alive\r\n\r\n")
    return head.encode("latin-1") + body


class TimedConnection:
    def __init__(self, address: str, timeout: float = 30.0):
        u = urlparse(address)
        self.host, self.tls = u.hostname, u.scheme == "https"
        self.port = u.port or (443 if self.tls else 80)
        self.timeout = timeout
        self.sock: socket.socket | None = None
        self.kernel_times = False
        self._buffer = b""
        self._last_ns = 0  # the kernel's receive time of the latest bytes read

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self._buffer = b""

    def _connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.kernel_times = False
        if self.tls:
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=self.host)
        elif _ANCILLARY and hasattr(sock, "recvmsg"):
            try:
                sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
                self.kernel_times = True
            except OSError:
                pass
        self.sock = sock

    def request(self, raw: bytes) -> tuple[int, int, float, float]:
        """Send one prebuilt request; (status, body bytes, seconds, perf_counter at send).
        Raises OSError or HttpError; the connection is closed then and reopened next time."""
        # Servers close idle keep-alive connections after a timeout of their own (tfpipe serve:
        # --rest_read_timeout_seconds), however short: a kept connection is checked before each use
        # (a select with no wait, outside the timed exchange).
        if self.sock is not None and self._closed_by_peer():
            self.close()
        if self.sock is None:
            self._connect()
        try:
            return self._exchange(raw)
        except BaseException:
            self.close()
            raise

    def _exchange(self, raw: bytes) -> tuple[int, int, float, float]:
        sent_ns, sent = time.time_ns(), time.perf_counter()
        self.sock.sendall(raw)
        self._last_ns = 0
        head = self._read_until(b"\r\n\r\n")
        status, length, chunked, close = _parse_head(head)
        if chunked:
            size = self._read_chunked()
        elif length is not None:
            self._read_exactly(length)
            size = length
        else:  # delimited by the server closing the connection
            size = len(self._buffer) + self._read_to_end()
            close = True
        done = time.perf_counter()
        seconds = done - sent
        if self.kernel_times and self._last_ns:
            kernel = (self._last_ns - sent_ns) / 1e9
            # The kernel's clock is the wall clock: trust it only where it agrees with the
            # monotonic one (no clock step in between).
            if 0 <= kernel <= seconds + 1e-4:
                seconds = kernel
        if close:
            self.close()
        return status, size, seconds, sent

    def _closed_by_peer(self) -> bool:
        """Whether the server has closed the idle connection: it sends nothing unasked, so anything
        to read (its close, or a TLS close_notify) means the connection is done."""
        try:
            return bool(select.select([self.sock], [], [], 0)[0])
        except (OSError, ValueError):
            return True

    def _recv(self) -> bytes:
        if self.kernel_times:
            data, ancillary, _, _ = self.sock.recvmsg(65536, _ANCILLARY)
            for level, kind, value in ancillary:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(value) >= 16:
                    sec, nsec = struct.unpack("qq", value[:16])
                    self._last_ns = sec * 1_000_000_000 + nsec
        else:
            data = self.sock.recv(65536)
        return data

    def _more(self) -> None:
        data = self._recv()
        if not data:
            raise HttpError("connection closed by the server before the answer was complete")
        self._buffer += data

    def _read_until(self, mark: bytes) -> bytes:
        while True:
            at = self._buffer.find(mark)
            if at >= 0:
                out, self._buffer = self._buffer[:at], self._buffer[at + len(mark):]
                return out
            if len(self._buffer) > MAX_HEADER_BYTES:
                raise HttpError(f"no end of headers in the first {MAX_HEADER_BYTES} bytes of the answer")
            self._more()

    def _read_exactly(self, n: int) -> bytes:
        while len(self._buffer) < n:
            self._more()
        out, self._buffer = self._buffer[:n], self._buffer[n:]
        return out

    def _read_chunked(self) -> int:
        size = 0
        while True:
            line = self._read_until(b"\r\n")
            try:
                n = int(line.split(b";")[0].strip(), 16)
            except ValueError:
                raise HttpError(f"bad chunk size line {line[:40]!r}") from None
            if n == 0:
                while self._read_until(b"\r\n"):  # trailers, up to the empty line
                    pass
                return size
            self._read_exactly(n)
            self._read_exactly(2)
            size += n

    def _read_to_end(self) -> int:
        n = 0
        while True:
            data = self._recv()
            if not data:
                return n
            n += len(data)


def _parse_head(head: bytes) -> tuple[int, int | None, bool, bool]:
    """(status, Content-Length or None, chunked, connection closes after this answer)."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise HttpError(f"not an HTTP/1.x answer: {lines[0][:60]!r}")
    status, length, chunked = int(parts[1]), None, False
    close = parts[0] == b"HTTP/1.0"
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name, value = name.strip().lower(), value.strip().lower()
        if name == b"content-length":
            try:
                length = int(value)
            except ValueError:
                raise HttpError(f"bad Content-Length {value[:20]!r}") from None
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value
        elif name == b"connection":
            close = value == b"close" or (close and value != b"keep-alive")
    if status in (204, 304) or 100 <= status < 200:
        length = 0
    return status, length, chunked, close
