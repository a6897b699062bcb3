"""Errors carry a gRPC status code; REST maps it to HTTP the way TF Serving's http_server does."""

from __future__ import annotations

import grpc

from tfpipe import UserError

_HTTP = {
    grpc.StatusCode.CANCELLED: 499, grpc.StatusCode.UNKNOWN: 500, grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504, grpc.StatusCode.NOT_FOUND: 404, grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403, grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400, grpc.StatusCode.ABORTED: 409, grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501, grpc.StatusCode.INTERNAL: 500, grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500, grpc.StatusCode.UNAUTHENTICATED: 401,
}


# What a client's text may take of an error message. gRPC sends the message in the grpc-message
# header, percent-encoding every byte outside printable ASCII, and clients refuse headers over 8 KiB
# (grpcio's default max_metadata_size) with RESOURCE_EXHAUSTED instead of the status: a message of
# MAX_MESSAGE_BYTES stays under that however it is encoded.
QUOTED_CHARS = 256  # a name, label, path or key from the request, as quoted in an error
MAX_MESSAGE_BYTES = 2048  # a whole error message, in UTF-8
ELLIPSIS = "..."


def quoted(text) -> str:
    """Text from a request as an error quotes it: cut at QUOTED_CHARS characters, with an ellipsis."""
    text = text if isinstance(text, str) else str(text)
    return text if len(text) <= QUOTED_CHARS else text[:QUOTED_CHARS] + ELLIPSIS


def capped(message: str) -> str:
    """An error message within MAX_MESSAGE_BYTES of UTF-8, cut with an ellipsis when longer."""
    if len(message) * 4 <= MAX_MESSAGE_BYTES:  # short enough in any encoding: the common case
        return message
    raw = message.encode("utf-8", "replace")
    if len(raw) <= MAX_MESSAGE_BYTES:
        return message
    return raw[:MAX_MESSAGE_BYTES - len(ELLIPSIS)].decode("utf-8", "ignore") + ELLIPSIS


class ServingError(Exception):
    """A request failed; `code` is the gRPC status TF Serving would answer with. The message is
    capped (see MAX_MESSAGE_BYTES)."""

    def __init__(self, code: grpc.StatusCode, message: str):
        message = capped(message)
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def http_status(self) -> int:
        return _HTTP.get(self.code, 500)


_CODES = {c.value[0]: c for c in grpc.StatusCode}


def with_code(code: int, message: str) -> ServingError:
    """An error with a status given by its number (TensorFlow's error codes are gRPC's)."""
    return ServingError(_CODES.get(code, grpc.StatusCode.UNKNOWN), message)


def invalid(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.INVALID_ARGUMENT, message)


def not_found(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.NOT_FOUND, message)


def precondition(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.FAILED_PRECONDITION, message)


def unavailable(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.UNAVAILABLE, message)


def unknown(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.UNKNOWN, message)


def unimplemented(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.UNIMPLEMENTED, message)


class ServeError(UserError):
    """A user error starting `tfpipe serve` (bad flag, unreadable config, missing binary): exit 2."""
