"""The standard gRPC health service, `grpc.health.v1.Health` (--enable_grpc_healthcheck_service).

What each name answers:
- "" is the whole server: SERVING while it takes requests; with `--workers N`, only while every
  worker is ready (one starting again after a crash, or given up after crashing repeatedly, makes
  it NOT_SERVING), so that a load balancer or a Kubernetes gRPC probe sees a degraded server;
- "ModelService" and "PredictionService" (the names TF Serving registers): whether this process
  answers those calls;
- "tfpipe.worker.<i>" (with `--workers N` only): whether worker i serves.
Once a drain begins every name is NOT_SERVING for good, and each Watch stream is sent that and then
ended, so that watchers do not hold the drain open.

Our own servicer rather than grpcio-health-checking's: it is added as a generic handler, so its
calls wait in the same queue of grpc core's as the serving APIs' (what the drain relies on: see
EmbeddedServer.stop), and its Watch streams end with the drain.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor

import grpc
from grpc_health.v1 import health_pb2

from tfpipe.serve.transports.grpc_calls import request_of

SERVING, NOT_SERVING, SERVICE_UNKNOWN = (health_pb2.HealthCheckResponse.SERVING,
                                         health_pb2.HealthCheckResponse.NOT_SERVING,
                                         health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)
SERVICE = "grpc.health.v1.Health"


class Health:
    """`refresh()`, if given, returns statuses that Check takes in before it answers (a group's
    workers' states, so that a Check agrees with the supervisor's latest word); Watch streams see
    what `set` is given."""

    def __init__(self, statuses: dict[str, int], refresh: Callable[[], dict[str, int]] | None = None):
        self._status = dict(statuses)
        self._refresh = refresh
        self._draining = False
        self._changed: asyncio.Future | None = None

    def status(self, service: str) -> int | None:
        return self._status.get(service)

    def set(self, statuses: dict[str, int]) -> None:
        """New statuses (on the server's loop); none changes once the drain began."""
        if self._draining or all(self._status.get(k) == v for k, v in statuses.items()):
            return
        self._status.update(statuses)
        self._wake()

    def drain(self) -> None:
        """Every name NOT_SERVING from now on; Watch streams send it and end."""
        self._status = dict.fromkeys(self._status, NOT_SERVING)
        self._draining = True
        self._wake()

    def _wake(self) -> None:
        if self._changed is not None and not self._changed.done():
            self._changed.set_result(None)
        self._changed = None

    async def Check(self, request, context):
        if self._refresh is not None:
            self.set(self._refresh())
        status = self._status.get(request.service)
        if status is None:  # the health protocol's answer for a name the server does not know
            context.set_code(grpc.StatusCode.NOT_FOUND)
            context.set_details(f"unknown service {request.service[:256]!r}")
            return None
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(self, request, context):
        last = None
        while True:
            status = self._status.get(request.service, SERVICE_UNKNOWN)
            if status != last:
                await context.write(health_pb2.HealthCheckResponse(status=status))
                last = status
            if self._draining:
                return
            if self._changed is None:
                self._changed = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._changed)


def add_health(server, health: Health, max_request_bytes: int, executor: Executor) -> None:
    """`health` on a grpc.aio server, as a generic handler (see the module's docstring). The request
    bytes come to this code to read, as on the serving APIs (grpc_calls.request_of, within
    `max_request_bytes`, a large compressed one inflated on `executor`): bytes that are no
    HealthCheckRequest are INVALID_ARGUMENT, not grpcio's UNKNOWN."""

    def parsing(method):
        async def handler(raw: bytes, context):
            request = await request_of(health_pb2.HealthCheckRequest, raw, context, max_request_bytes, executor)
            return None if request is None else await method(request, context)
        return handler

    handlers = {
        "Check": grpc.unary_unary_rpc_method_handler(
            parsing(health.Check), request_deserializer=None,
            response_serializer=health_pb2.HealthCheckResponse.SerializeToString),
        "Watch": grpc.unary_stream_rpc_method_handler(
            parsing(health.Watch), request_deserializer=None,
            response_serializer=health_pb2.HealthCheckResponse.SerializeToString),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
