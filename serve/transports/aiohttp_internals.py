"""Every private aiohttp API the server uses, in one place.

The drain needs two facts about a REST connection that aiohttp's public API does not give: whether
it waits for its next request, and how many requests it has parsed and not yet handled (pipelined
behind the one being answered). Both live on aiohttp's RequestHandler, the protocol object of a
connection. An aiohttp release may rename either: `check()` says which one changed and what
depends on it, and tests/test_aiohttp_internals.py runs it, with each piece's behaviour, on the
installed aiohttp. pyproject.toml pins the releases these were read from (aiohttp < 4).
"""

from __future__ import annotations

from aiohttp import web_protocol


class InternalsChanged(RuntimeError):
    """A private aiohttp API the server relies on is gone or different."""


def waiting_for_request(connection: web_protocol.RequestHandler) -> bool:
    """Whether a connection is idle: it has answered everything it parsed and waits for the next
    request (aiohttp's own test, in its keep-alive timer: a pending `_waiter`)."""
    waiter = connection._waiter
    return waiter is not None and not waiter.done()


def queued_requests(connection: web_protocol.RequestHandler) -> int:
    """Requests a connection has parsed and not yet handled: pipelined behind the one it answers."""
    return len(connection._messages)


def check() -> None:
    """InternalsChanged naming the first private API that is not as this module expects."""
    import aiohttp

    slots = set()
    for cls in web_protocol.RequestHandler.__mro__:
        slots.update(getattr(cls, "__slots__", ()))
    for name, used_by in (("_waiter", "the drain's test of an idle REST connection (waiting_for_request)"),
                          ("_messages", "the drain's count of pipelined REST requests (queued_requests)")):
        if name not in slots:
            raise InternalsChanged(f"aiohttp {aiohttp.__version__}: web_protocol.RequestHandler.{name} is gone; "
                                   f"{used_by} needs it (serve/transports/aiohttp_internals.py)")
