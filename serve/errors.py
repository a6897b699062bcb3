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


class ServingError(Exception):
    """A request failed; `code` is the gRPC status TF Serving would answer with."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def http_status(self) -> int:
        return _HTTP.get(self.code, 500)


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
