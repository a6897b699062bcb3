"""What both gRPC transports (the serving APIs, grpc_api.py, and the health service, health.py) do
with a call before and after their own code: read its bytes (inflating a compressed one), parse
them, and fail it."""

from __future__ import annotations

import asyncio
import zlib
from concurrent.futures import Executor

import grpc

from tfpipe.serve.core.inference import OFF_LOOP_BYTES
from tfpipe.serve.core.large_requests import large_turn

# Per-message compression is left to this code (grpc.per_message_decompression=0, server.py): grpc
# core inflates a message in one go on the thread that holds the GIL, up to the message bound
# (a stall every connection shares), and grpcio does not tell a handler which encoding a message
# came in. The bytes tell: no serialized message begins as a gzip stream does (0x1f would be field
# 3 of wire type 7, which does not exist); a zlib stream's two-byte header carries a checksum, and
# bytes that pass it but do not inflate are read as the message they may also be.
GZIP, DEFLATE = 31, 15  # zlib's window bits for each of grpc's encodings
INFLATE_STEP = 4 * 1024 * 1024  # bytes inflated at a time off the loop (the bound is checked between)


def fail(context, code: grpc.StatusCode, message: str) -> None:
    """The call's status, for a handler that then returns None: grpc.aio sends the code and no
    response. Not context.abort: grpc.aio keeps its exception with the call's state, and the
    exception's traceback the handler's frames, so a failed request stayed in memory after its
    answer, however large."""
    context.set_code(code)
    context.set_details(message)


def parsed_request(request_type, raw: bytes, context):
    """The request of type `request_type` parsed from a call's bytes; None, with the call's status
    set to INVALID_ARGUMENT naming the type, for bytes that are no such message."""
    try:
        return request_type.FromString(raw)
    except Exception:  # noqa: BLE001 (whatever the parser raises, it is about the client's bytes)
        return _unparsable(request_type, context)


def _unparsable(request_type, context) -> None:
    fail(context, grpc.StatusCode.INVALID_ARGUMENT,
         f"Error parsing message with type '{request_type.DESCRIPTOR.full_name}'")


def compression(raw: bytes) -> int:
    """zlib's window bits for a message compressed as grpc compresses (GZIP, DEFLATE); 0 for a plain one."""
    if raw[:2] == b"\x1f\x8b":
        return GZIP
    if len(raw) >= 2 and raw[0] & 0x0F == 8 and raw[0] >> 4 <= 7 and (raw[0] << 8 | raw[1]) % 31 == 0:
        return DEFLATE
    return 0


class _TooLarge(Exception):
    pass


def _inflate(inflater, head: bytes, limit: int) -> bytes:
    """The message `inflater` has begun (`head`, what it gave so far), at most `limit` bytes in all:
    _TooLarge past it, zlib.error for a stream cut short or followed by other bytes."""
    parts, size = [head], len(head)
    while size <= limit and not inflater.eof:
        tail = inflater.unconsumed_tail
        chunk = inflater.decompress(tail, min(INFLATE_STEP, limit - size + 1))  # (0 would mean no bound)
        if not chunk and not tail:
            raise zlib.error("the compressed message ends before its stream does")
        size += len(chunk)
        parts.append(chunk)
    if size > limit:
        raise _TooLarge()
    if inflater.unused_data:
        raise zlib.error("bytes follow the end of the compressed stream")
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _inflated_request(request_type, inflater, head: bytes, limit: int):
    return request_type.FromString(_inflate(inflater, head, limit))


async def request_of(request_type, raw: bytes, context, limit: int, executor: Executor):
    """The request of type `request_type` that a call's bytes carry, inflated first when the client
    compressed it, to at most `limit` bytes (--max_request_bytes; RESOURCE_EXHAUSTED past it, as
    grpc answers a message over its bound): on the loop up to OFF_LOOP_BYTES, beyond them inflated
    and parsed on `executor` in a large request's turn. None, with the call's status set, for
    bytes that are no such request or too many."""
    wbits = compression(raw)
    if not wbits:
        return parsed_request(request_type, raw, context)
    first = min(OFF_LOOP_BYTES, limit)  # what the loop inflates
    inflater = zlib.decompressobj(wbits)
    try:
        head = inflater.decompress(raw, first + 1)
        if inflater.eof or len(head) <= first or first == limit:  # whole, cut short, or over the bound
            body = _inflate(inflater, head, limit)
        else:
            async with large_turn():  # a bomb inflates on a thread, one large request at a time
                return await asyncio.get_running_loop().run_in_executor(
                    executor, _inflated_request, request_type, inflater, head, limit)
    except _TooLarge:
        fail(context, grpc.StatusCode.RESOURCE_EXHAUSTED, f"Decompressed message larger than max ({limit} bytes)")
        return None
    except zlib.error as e:
        if wbits == DEFLATE:  # bytes that only began as a zlib header does
            return parsed_request(request_type, raw, context)
        fail(context, grpc.StatusCode.INVALID_ARGUMENT, f"Error decompressing the message (gzip): {e}")
        return None
    except Exception:  # noqa: BLE001 (the parser's, off the loop: about the client's bytes)
        return _unparsable(request_type, context)
    return parsed_request(request_type, body, context)
