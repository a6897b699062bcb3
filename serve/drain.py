"""The drain's socket-level part: a listening socket made to start no new connection, so that a
stopping server answers what its kernel queued and resets no connection whose client already
sent (EmbeddedServer.stop in serve/server.py accepts what was queued, until nothing new comes for
HANDSHAKE_WAIT, then closes); and the probes of what a REST connection has received and not yet
answered (`pending`, `unread_bytes`), by which the drain closes only connections with nothing left."""

from __future__ import annotations

import ctypes
import fcntl
import socket
import struct
import sys
import termios

from tfpipe.serve.transports.aiohttp_internals import queued_requests

SO_ATTACH_FILTER = 26  # Linux's socket option number (asm-generic/socket.h)
HANDSHAKE_WAIT = 0.05  # s: the drain accepts until no connection has been queued for this long


# A classic BPF program for a TCP listener, whose filter sees each segment from its TCP header on:
# drop a segment with the SYN flag (byte 13, bit 0x02), keep any other.
_DROP_SYN = (
    (0x30, 0, 0, 13),          # BPF_LD | BPF_B | BPF_ABS: A = the flags byte
    (0x45, 0, 1, 0x02),        # BPF_JMP | BPF_JSET | BPF_K: SYN set? next; else skip one
    (0x06, 0, 0, 0),           # BPF_RET: drop
    (0x06, 0, 0, 0xFFFFFFFF),  # BPF_RET: keep the whole segment
)


def refuse_new_connections(sock) -> None:
    """Drop every SYN that comes to the listening socket `sock` from now on, so that the kernel
    starts no new connection for it: what is queued can be accepted and answered before it closes,
    and the close then resets no connection whose client has already sent its request. Only SYNs:
    a handshake the kernel answered just before (SYN-ACK sent) still gets its client's ACK and
    completes, to be accepted before the close, where dropping every segment left it half-open
    with its request unread, and reset at the close. A client whose SYN is dropped sends it again a
    second later and is refused (the socket is closed by then) or, in a worker group, taken by
    another worker. Where the kernel refuses the filter (not Linux), nothing changes."""
    program = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *op) for op in _DROP_SYN))
    fprog = struct.pack("HL", len(_DROP_SYN), ctypes.addressof(program))  # struct sock_fprog
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
    except OSError:
        pass


def pending(connection) -> bool:
    """Whether a connection has received more than the request it is answering: requests parsed
    behind it, or bytes not yet read (the drain answers them before the connection closes)."""
    return queued_requests(connection) > 0 or unread_bytes(connection.transport) > 0


def unread_bytes(transport) -> int:
    """Bytes a connection has received that nobody has read yet (0 for a closed one)."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        return 0
    try:
        return int.from_bytes(fcntl.ioctl(sock.fileno(), termios.FIONREAD, bytes(4)), sys.byteorder)
    except OSError:
        return 0
