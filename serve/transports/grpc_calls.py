"""What both gRPC transports (the serving APIs, grpc_api.py, and the health service, health.py) do
with a call before and after their own code: parse its bytes, and fail it."""

from __future__ import annotations

import grpc


def fail(context, code: grpc.StatusCode, message: str) -> None:
    """The call's status, for a handler that then returns None: grpc.aio sends the code and no
    response. Not context.abort: grpc.aio keeps its exception with the call's state, and the
    exception's traceback the handler's frames, so a failed request stayed in memory after its
    answer, however large."""
    context.set_code(code)
    context.set_details(message)


def parsed_request(request_type, raw: bytes, context):
    """The request of type `request_type` parsed from a call's bytes; None, with the call's status
    set to INVALID_ARGUMENT naming the type, for bytes that are no such message. For handlers
    added with `request_deserializer=None` (grpc_api.add_services, health.add_health)."""
    try:
        return request_type.FromString(raw)
    except Exception:  # noqa: BLE001 (whatever the parser raises, it is about the client's bytes)
        fail(context, grpc.StatusCode.INVALID_ARGUMENT,
             f"Error parsing message with type '{request_type.DESCRIPTOR.full_name}'")
        return None
