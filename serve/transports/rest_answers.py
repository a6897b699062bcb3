"""How the REST API writes an answer: JSON with TF Serving's `{"error": ...}` for a failure, and a
large answer's text written in pieces, encoded on a REST thread and sent a chunk at a time, so
that no one call holds Python's GIL (and every other connection) for the whole of it."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from aiohttp import payload, web

from tfpipe.serve.codecs.rest_json import dumps
from tfpipe.serve.errors import capped

# A large answer is encoded, and written to its connection, in chunks of about this many bytes.
ANSWER_CHUNK_BYTES = 1 << 20


def json_response(body, status: int = 200) -> web.Response:
    return json_text_response(dumps(body), status)


def text_in_pieces(body, items: int = 1024) -> Iterator[str]:
    """The text of `dumps(body)` in pieces, every list of more than `items` items written `items`
    at a time: one json.dumps call holds Python's GIL until it returns, so a large answer written in
    one call would keep the loop (every other connection) waiting for all of it."""
    if isinstance(body, dict):
        yield "{"
        for i, (k, v) in enumerate(body.items()):
            yield (", " if i else "") + dumps(k) + ": "
            yield from text_in_pieces(v, items)
        yield "}"
    elif isinstance(body, list) and len(body) > items:
        yield "["
        for i in range(0, len(body), items):
            yield (", " if i else "") + dumps(body[i:i + items])[1:-1]
        yield "]"
    else:
        yield dumps(body)


def encoded(pieces: Iterable[str]) -> list[bytes]:
    """Text pieces as UTF-8 chunks of about ANSWER_CHUNK_BYTES each (on a REST thread)."""
    chunks, held, size = [], [], 0
    for piece in pieces:
        held.append(piece)
        size += len(piece)
        if size >= ANSWER_CHUNK_BYTES:
            chunks.append("".join(held).encode("utf-8"))
            held, size = [], 0
    if held or not chunks:
        chunks.append("".join(held).encode("utf-8"))
    return chunks


class Chunks(payload.Payload):
    """An answer already encoded, in chunks: written a chunk at a time, each waiting for the
    connection to take it, rather than as one write that copies the whole answer on the loop."""

    def __init__(self, chunks: list[bytes]):
        super().__init__(chunks, content_type="application/json; charset=utf-8")
        self._size = sum(map(len, chunks))

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return b"".join(self._value).decode(encoding, errors)

    async def write(self, writer) -> None:
        await self.write_with_length(writer, None)

    async def write_with_length(self, writer, content_length: int | None) -> None:
        left = self._size if content_length is None else content_length
        for chunk in self._value:
            if left <= 0:
                break
            await writer.write(chunk[:left] if len(chunk) > left else chunk)
            left -= len(chunk)


def json_chunks(chunks: list[bytes]) -> web.Response:
    return web.Response(body=Chunks(chunks))


def json_text_response(text: str, status: int = 200) -> web.Response:
    return web.Response(text=text, status=status, content_type="application/json")


def error_response(status: int, message: str) -> web.Response:
    return json_response({"error": capped(message)}, status)
