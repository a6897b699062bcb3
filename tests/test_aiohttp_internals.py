"""The private aiohttp APIs the server relies on (serve/transports/aiohttp_internals.py), on the
installed aiohttp: present, and saying what the drain reads them for, on a real connection."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web, web_protocol

from tfpipe.serve.transports import aiohttp_internals
from tfpipe.serve.drain import pending

PIPELINED = 3


def test_every_private_api_is_as_the_server_expects():
    aiohttp_internals.check()  # raises InternalsChanged naming the API otherwise


def test_a_changed_api_is_named_with_what_uses_it(monkeypatch):
    """What an aiohttp release that renamed the queue of parsed requests would meet."""
    slots = tuple(s for s in web_protocol.RequestHandler.__slots__ if s != "_messages")
    monkeypatch.setattr(web_protocol.RequestHandler, "__slots__", slots)
    with pytest.raises(aiohttp_internals.InternalsChanged, match=r"RequestHandler\._messages.*pipelined"):
        aiohttp_internals.check()


def test_a_connection_shows_its_pipelined_requests_then_waits_for_the_next():
    """Three requests written at once: while the first is handled, the other two are queued behind
    it and the connection is busy; once all three are answered, it is idle with nothing pending."""

    async def scenario():
        seen: list[tuple[int, bool, bool]] = []  # (queued, idle, pending) as each request is handled

        async def handle(request: web.BaseRequest) -> web.Response:
            protocol = request.protocol
            deadline = asyncio.get_running_loop().time() + 10
            if not seen:  # the first: wait until the other two have been parsed behind it
                while aiohttp_internals.queued_requests(protocol) < PIPELINED - 1:
                    assert asyncio.get_running_loop().time() < deadline, "the pipelined requests never came"
                    await asyncio.sleep(0.005)  # polls the connection's own queue, with a deadline
            seen.append((aiohttp_internals.queued_requests(protocol),
                         aiohttp_internals.waiting_for_request(protocol), pending(protocol)))
            return web.Response(text=request.path)

        server = web.Server(handle, access_log=None)
        listener = await asyncio.get_running_loop().create_server(server, "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"".join(f"GET /{i} HTTP/1.1\r\nHost: x\r\n\r\n".encode() for i in range(PIPELINED)))
        await writer.drain()
        for i in range(PIPELINED):
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            assert await asyncio.wait_for(reader.readexactly(length), 10) == f"/{i}".encode()
        (connection,) = server.connections
        deadline = asyncio.get_running_loop().time() + 10
        while not aiohttp_internals.waiting_for_request(connection):  # it gets there after its last answer
            assert asyncio.get_running_loop().time() < deadline, "the connection did not go idle"
            await asyncio.sleep(0.005)
        idle = (aiohttp_internals.queued_requests(connection), pending(connection))
        writer.close()
        await server.shutdown(1)
        listener.close()
        await listener.wait_closed()
        return seen, idle

    seen, idle = asyncio.run(scenario())
    assert seen == [(2, False, True), (1, False, True), (0, False, False)]
    assert idle == (0, False)
