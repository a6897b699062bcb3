"""The embedded server: TF Serving's gRPC API on grpc.aio (TCP port and/or Unix socket,
optionally TLS or ALTS, optionally the standard health service) and its REST API on aiohttp,
both on one asyncio loop whose model calls go to batch or worker threads, models loaded and
swapped by the ModelManager.

As tensorflow_model_server does, the server loads the configured models before it opens
its ports, and refuses to start when a model's versions all fail to load.

On SIGTERM it drains (`EmbeddedServer.stop`): it stops accepting, answers every request it has
received, for up to --drain_seconds, then exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import select
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable

import grpc
from tensorflow_serving.config import model_server_config_pb2

from tfpipe.files import clean_stale
from tfpipe.machine import cores
from tfpipe.serve.codecs import warmup
from tfpipe.serve.core.batcher import BatchScheduler
from tfpipe.serve.core.batching import BatchOptions
from tfpipe.serve.core.inference import Inference
from tfpipe.serve.core.manager import ManagerOptions, ModelManager
from tfpipe.serve.core.servable import LIVE, Servable, ServableSettings
from tfpipe.serve.core.canary import Canary, CanaryOptions
from tfpipe.serve.core.shadow import Shadow, check_options
from tfpipe.serve.core import large_requests
from tfpipe.serve.core.turns import CALLS_PER_CORE, Turns
from tfpipe.serve.drain import HANDSHAKE_WAIT, refuse_new_connections, unread_bytes
from tfpipe.serve.errors import ServeError, ServingError
from tfpipe.serve.flags import ServeOptions, ignored_flag_notes
from tfpipe.serve.metrics import Metrics
from tfpipe.serve.process_tuning import freeze_import_time_objects, tune_malloc
from tfpipe.serve.request_log import LogBounds, RequestLogs
from tfpipe.serve.tfserving.configs import (
    channel_arguments,
    model_server_config,
    monitoring_config,
    session_bundle_config,
    ssl_config,
)
from tfpipe.serve.transports.aiohttp_internals import waiting_for_request
from tfpipe.serve.transports.grpc_api import ModelService, PredictionService, add_services
from tfpipe.serve.transports.health import NOT_SERVING, SERVING, Health, add_health
from tfpipe.serve.transports.rest_api import RestApi
from tfpipe.serve.worker_group import Group, announce_ready, worker_identity

MAX_MESSAGE_BYTES = 2**31 - 1  # tensorflow_model_server's gRPC message limit (SetMaxMessageSize)
HEALTH_SERVICES = ("ModelService", "PredictionService")  # the names TF Serving reports SERVING
# A method no service has: the drain's probe through the server's own queue of calls (see stop)
PROBE_METHOD = "/tfpipe.serve.Drain/Probe"
PROBE_PREFIX = "tfpipe-drain-"  # then the server's pid
GROUP_HEALTH_POLL_S = 0.2  # how often a worker of a group takes the workers' states into its health
PENDING_CALLS = 20_000  # calls grpc core may hold for the loop (see _start_grpc)


class EmbeddedServer:
    """Build from ServeOptions, `await start()`, `await stop()`. A negative port picks a free one
    (tfpipe's extension, for tests); a port of 0 disables that listener, as in TF Serving."""

    def __init__(self, opts: ServeOptions, log: Callable[[str], None] = print):
        self.opts, self.log = opts, log
        for note in ignored_flag_notes(opts):
            log(note)
        if opts.port == 0 and not opts.grpc_socket_path:
            raise ServeError("At least one of server_options.grpc_port or server_options.grpc_socket_path must be "
                             "set (--port=0 turns TCP gRPC off: give --grpc_socket_path)")
        check_options(opts.shadow, opts.shadow_report_dir)
        canary_options = CanaryOptions.of(opts)
        for flag in sorted(f for f in opts.given if f.startswith("canary_")):
            if not opts.canary:
                log(f"--{flag} is ignored without --canary")
        for flag in ("shadow_slice", "shadow_report_dir"):
            if getattr(opts, flag) and not opts.shadow:
                log(f"--{flag} is ignored without --shadow")
        self.config = model_server_config(opts, log)
        self.bundle = session_bundle_config(opts)
        self.batch_options = None
        if self.bundle.HasField("batching_parameters"):
            try:
                self.batch_options = BatchOptions.from_proto(self.bundle.batching_parameters)
            except ValueError as e:
                raise ServeError(f"batching parameters: {e}") from None
        self.ssl = ssl_config(opts)  # refuses --ssl_config_file with --use_alts_credentials, as TF Serving
        self.channel_args = channel_arguments(opts.grpc_channel_arguments)
        monitoring = monitoring_config(opts)
        self.metrics_path = (monitoring.prometheus_config.path
                             if monitoring and monitoring.prometheus_config.enable else None)
        self.metrics = Metrics()
        settings = ServableSettings(
            tags=tuple(self.bundle.saved_model_tags) or ("serve",),
            method_name_check=opts.enable_signature_method_name_check,
            warmup=self.bundle.enable_model_warmup,
            warmup_iterations=self.bundle.model_warmup_options.num_request_iterations.value or 1,
            per_model_batching=self.bundle.enable_per_model_batching_params)
        self.request_logs = RequestLogs(
            LogBounds(queue_size=opts.request_log_queue_size, max_file_bytes=opts.request_log_max_file_bytes,
                      max_file_seconds=opts.request_log_max_file_seconds, max_files=opts.request_log_max_files),
            self.metrics, tags=settings.tags, log=log)
        try:
            self.manager = ModelManager(
                self.config, make_servable=lambda name, version, path: Servable(name, version, path, settings),
                options=ManagerOptions(load_threads=opts.num_load_threads, unload_threads=opts.num_unload_threads,
                                       max_load_retries=opts.max_num_load_retries,
                                       retry_interval_seconds=opts.load_retry_interval_micros / 1e6,
                                       allow_unavailable_labels=opts.allow_version_labels_for_unavailable_models,
                                       candidates=opts.shadow > 0 or opts.canary > 0),
                log=log, on_unload=self._unloaded, on_config=self.request_logs.update, warm=warmup.replay)
        except ServingError as e:
            self.request_logs.close()
            raise ServeError(f"model config: {e.message}") from None
        self.metrics.known_model = self.manager.serves
        self.shadow = None
        if opts.shadow > 0:
            self.shadow = Shadow(self.manager, opts.shadow, opts.shadow_slice, opts.shadow_report_dir, self.metrics,
                                 log)
            self.manager.on_poll.append(self.shadow.polled)
        self.canary = None
        if opts.canary > 0:
            self.canary = Canary(self.manager, canary_options, self.metrics, log)
            self.manager.on_poll.append(self.canary.polled)
        self.batcher = BatchScheduler(self.batch_options, on_batch=self.metrics.batch) if self.batch_options else None
        large_requests.at_once(opts.large_requests_at_once)
        calls = opts.max_concurrent_model_calls if opts.max_concurrent_model_calls > 0 else CALLS_PER_CORE * cores()
        self._executors = [Turns(opts.grpc_max_threads, calls, name="tfpipe-grpc"),
                           Turns(opts.rest_api_num_threads, calls, name="tfpipe-rest")]
        self.inference = Inference(self.manager, self.batcher, self._executors[1],
                                   per_model_batching=settings.per_model_batching, shadow=self.shadow,
                                   canary=self.canary, call_rows=max(0, opts.max_call_rows))
        self.grpc = self.health = self.group = None
        self.grpc_port = self.rest_port = None
        self._rest: RestApi | None = None
        self._listener: asyncio.Server | None = None  # the REST port's
        self._probe_dir = self._probe = None  # the drain's probe: a Unix socket (see _add_probe_port)
        self._grpc_stopping: asyncio.Future | None = None
        self._stopped = False
        self._tasks: list[asyncio.Task] = []

    def _unloaded(self, servable: Servable) -> None:
        self.inference.forget(servable)

    async def start(self) -> None:
        o = self.opts
        loop = asyncio.get_running_loop()
        # Like tensorflow_model_server: the models load before the ports open.
        try:
            await loop.run_in_executor(None, self.manager.start, o.file_system_poll_wait_seconds, self.config)
        except ServingError as e:
            self._release()
            raise ServeError(f"Failed to start server. Error: {e.code.name}: {e.message}") from None
        if worker_identity() is not None:  # one of --workers N: a worker started again catches up first
            self.group = Group(self.metrics_text, apply=self._apply_shared_config)
            await loop.run_in_executor(None, self.group.catch_up)
        try:
            await self._start_grpc()
            if o.rest_api_port:
                if o.rest_api_port == o.port and o.port > 0:
                    self.log("server_options.http_port cannot be same as grpc_port. Please use a different port "
                             "for HTTP/REST API. Skipped exporting HTTP/REST API.")
                else:
                    await self._start_rest()
        except BaseException:
            if self._probe_dir is not None:
                shutil.rmtree(self._probe_dir, ignore_errors=True)
            raise
        if o.model_config_file and o.model_config_file_poll_wait_seconds > 0:
            self._tasks.append(asyncio.create_task(self._watch_config(o.model_config_file_poll_wait_seconds)))
        if self.group is not None and self.health is not None:
            self._tasks.append(asyncio.create_task(self._follow_group()))

    def _credentials(self):
        if self.opts.use_alts_credentials:
            return grpc.alts_server_credentials()
        if self.ssl is None:
            return None
        if self.ssl.client_verify and not self.ssl.custom_ca:
            raise ServeError(f"--ssl_config_file {self.opts.ssl_config_file}: client_verify needs custom_ca, the "
                             "CA certificate(s) that client certificates are checked against")
        return grpc.ssl_server_credentials([(self.ssl.server_key.encode(), self.ssl.server_cert.encode())],
                                           root_certificates=self.ssl.custom_ca.encode() or None,
                                           require_client_auth=self.ssl.client_verify)

    def _reload(self, config) -> None:
        """HandleReloadConfigRequest: apply `config`; in a group, every worker applies it before the answer."""
        if not self.opts.model_config_reload:
            raise ServingError(grpc.StatusCode.PERMISSION_DENIED,
                               "this server's models are not reloaded over gRPC (--model_config_reload=false)")
        self.manager.set_config(config)
        if self.group is not None:
            self.group.share_config(config.SerializeToString())

    def _apply_shared_config(self, serialized: bytes) -> None:
        """A config another worker of the group received."""
        config = model_server_config_pb2.ModelServerConfig.FromString(serialized)
        self.manager.set_config(config)
        self.log(f"reloaded model config (received by another worker): "
                 f"{[c.name for c in config.model_config_list.config]}")

    async def _start_grpc(self) -> None:
        o = self.opts
        # A request's bound is --max_request_bytes on both transports (TF Serving's is 2 GiB): grpc
        # core checks the bytes received, and leaves a compressed message to inflate to the handler,
        # which checks the bound as it inflates, off the loop (grpc_calls.request_of).
        received = o.max_request_bytes if o.max_request_bytes > 0 else MAX_MESSAGE_BYTES
        # Calls the loop has not taken up yet wait in grpc core's queue; past its bounds (1,000, then
        # up to 3,000, by default) core cancels them: a good client's call CANCELLED in a burst.
        # Overload is answered here instead, RESOURCE_EXHAUSTED past --grpc_max_calls_in_flight, and
        # core's queue is let hold a burst of the calls the loop then takes up or refuses.
        in_flight = max(0, o.grpc_max_calls_in_flight)
        pending = [("grpc.server.max_pending_requests", max(PENDING_CALLS, 2 * in_flight)),
                   ("grpc.server.max_pending_requests_hard_limit", max(3 * PENDING_CALLS // 2, 3 * in_flight))]
        # The loop reads calls in the order they come: a connection that may open any number of calls
        # at once puts every one of them ahead of another connection's next call. With a bound per
        # connection the client queues the rest itself. Core's overload protection counts calls that
        # are answered but not yet freed against the bound and refuses new ones (UNAVAILABLE) that a
        # client sent within it: off, the bound is HTTP/2's own.
        streams = [("grpc.max_concurrent_streams", o.grpc_max_concurrent_streams),
                   ("grpc.http.overload_protection", 0)] if o.grpc_max_concurrent_streams > 0 else []
        options = dict([("grpc.max_receive_message_length", received), ("grpc.per_message_decompression", 0),
                        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES), *pending, *streams,
                        *self.channel_args])
        self.grpc = grpc.aio.server(options=list(options.items()))
        add_services(self.grpc, self.metrics,
                     PredictionService(self.inference, self.metrics, self._executors[0],
                                       o.enable_serialization_as_tensor_content, self.request_logs),
                     ModelService(self.inference, self.metrics, self._executors[0], self._reload, self.log),
                     in_flight, received)
        if o.enable_grpc_healthcheck_service:
            self.health = Health(dict.fromkeys(HEALTH_SERVICES, SERVING) | self._group_health(),
                                 refresh=self._group_health if self.group is not None else None)
            add_health(self.grpc, self.health, received, self._executors[0])
        creds = self._credentials()
        self._add_probe_port(open_port=creds is None and o.port != 0)
        add = (lambda address: self.grpc.add_secure_port(address, creds)) if creds else self.grpc.add_insecure_port
        if o.port:
            try:
                self.grpc_port = add(f"{o.host}:{max(o.port, 0)}")
            except RuntimeError:
                self.grpc_port = 0
            if not self.grpc_port:
                raise ServeError(f"cannot bind the gRPC port {o.host}:{o.port} (in use?"
                                 + (" ALTS credentials work only on Google Cloud VMs)" if o.use_alts_credentials
                                    else ")"))
        if o.grpc_socket_path:
            try:
                bound = add(f"unix:{o.grpc_socket_path}")
            except RuntimeError:
                bound = 0
            if not bound:
                raise ServeError(f"cannot listen on the gRPC Unix socket {o.grpc_socket_path}")
        await self.grpc.start()
        if o.port:
            self.log(f"Running gRPC ModelServer at {o.host}:{self.grpc_port} ...")
        if o.grpc_socket_path:
            self.log(f"Running gRPC ModelServer at UNIX socket {o.grpc_socket_path} ...")

    def _add_probe_port(self, open_port: bool) -> None:
        """The drain's probe comes in on a Unix socket of its own: it works whatever credentials the
        TCP port asks for, and in a group it reaches this worker, not whichever shares the port.
        The socket serves every service without credentials. So when a TCP port without
        credentials is open (`open_port`), it is an abstract socket (Linux: no file, gone with the
        process however it ends), which any local user may reach as they may reach that port.
        Otherwise (TLS, ALTS, or only --grpc_socket_path) it is a file in a directory only this
        user may open (mkdtemp's 0700): a worker's in the group's directory, which the supervisor
        removes, a process's own in the temporary directory, removed at its stop or, if the
        process was killed, by the next such server to start."""
        if open_port and sys.platform.startswith("linux"):
            address = f"unix-abstract:{PROBE_PREFIX}{os.getpid()}-{secrets.token_hex(8)}"
        else:
            if self.group is None:  # the probe directories of servers killed before their stop
                clean_stale(tempfile.gettempdir(), PROBE_PREFIX)
            parent = self.group.dir if self.group is not None else None
            self._probe_dir = tempfile.mkdtemp(prefix=f"{PROBE_PREFIX}{os.getpid()}-", dir=parent)
            if len(self._probe_dir) > 90:  # a Unix socket's path has room for about 100 bytes
                shutil.rmtree(self._probe_dir, ignore_errors=True)
                self._probe_dir = tempfile.mkdtemp(prefix=f"{PROBE_PREFIX}{os.getpid()}-", dir="/tmp")
            address = f"unix:{self._probe_dir}/probe"
        try:
            self._probe = address if self.grpc.add_insecure_port(address) else None
        except RuntimeError:
            self._probe = None

    def _group_health(self) -> dict[str, int]:
        """The health names a group adds ("" and each worker's), else "" SERVING."""
        if self.group is None:
            return {"": SERVING}
        return {name: SERVING if up else NOT_SERVING for name, up in self.group.health().items()}

    async def _follow_group(self) -> None:
        while True:
            await asyncio.sleep(GROUP_HEALTH_POLL_S)
            self.health.set(self._group_health())

    @contextlib.contextmanager
    def shadowing(self, name: str, version: int, report_dir: str, timeout: float = 300.0):
        """Shadow traffic switched on while the block runs, every request of model `name` that names
        no version mirrored to its candidate `version` (loaded for it, unloaded after), the report
        written to `report_dir` at the end (tfpipe run's rollout step, on its in-process server; a
        server started with --shadow or --canary has its own). Yields the Shadow; RuntimeError when
        the candidate does not load within `timeout` seconds."""
        if self.shadow is not None or self.canary is not None:
            raise RuntimeError("this server already runs shadow traffic or a canary")
        shadow = Shadow(self.manager, 1.0, "", report_dir, self.metrics, self.log)
        self.manager.candidates_on(True)
        try:
            self.manager.poll()
            if not self.manager.wait_candidate(name, version, timeout):
                raise RuntimeError(f"candidate {version} of {name} did not load for shadow traffic (see the server log)")
            self.manager.on_poll.append(shadow.polled)
            self.shadow = self.inference.shadow = shadow
            yield shadow
        finally:
            self.shadow = self.inference.shadow = None
            with contextlib.suppress(ValueError):
                self.manager.on_poll.remove(shadow.polled)
            shadow.close()  # the calls in flight finish, the report is written
            self.manager.candidates_on(False)

    def metrics_text(self) -> str:
        """This process's Prometheus page."""
        batcher, manager = self.inference.batcher, self.manager
        return self.metrics.render(manager.loaded(), batcher.depth() if batcher else 0,
                                   batcher.queue_count() if batcher else 0, manager.load_sizes(), len(LIVE),
                                   manager.shadowed() if self.shadow is not None else None)

    async def _start_rest(self) -> None:
        o = self.opts
        scrape = self.metrics_text if self.group is None else self.group.scrape  # a group's scrape shows all
        self._rest = RestApi(self.inference, self.metrics, o.rest_api_timeout_in_ms, o.max_request_bytes,
                             self.metrics_path, cors=o.rest_api_enable_cors_support, logs=self.request_logs,
                             render_metrics=scrape, read_timeout=o.rest_read_timeout_seconds)
        # aiohttp's low-level server on asyncio's own listener (as aiohttp's TCPSite would make it), so
        # that the drain can take what the kernel has queued for it before it closes (see stop).
        # A worker of --workers N shares the port with the others (grpcio sets SO_REUSEPORT itself).
        try:
            self._listener = await asyncio.get_running_loop().create_server(
                self._rest.server, o.host, max(o.rest_api_port, 0), backlog=128,
                reuse_port=worker_identity() is not None or None)
        except OSError as e:
            await self.grpc.stop(0)
            raise ServeError(f"cannot bind the REST port {o.host}:{o.rest_api_port}: {e.strerror}") from None
        self.rest_port = self._listener.sockets[0].getsockname()[1]
        self.log(f"Exporting HTTP/REST API at:{o.host}:{self.rest_port} ...")
        if self.metrics_path:
            self.log(f"Prometheus metrics at {self.metrics_path}")

    async def _watch_config(self, seconds: int) -> None:
        """Re-read --model_config_file; a file that does not parse, or a config that cannot be
        applied, is logged and the last good one keeps serving (as TF Serving)."""
        last = self.config
        while True:
            await asyncio.sleep(seconds)
            try:
                config = model_server_config(self.opts)
                if config != last:
                    last = config
                    await asyncio.get_running_loop().run_in_executor(None, self.manager.set_config, config)
                    self.log(f"model config reloaded from {self.opts.model_config_file}")
            except (ServeError, ServingError) as e:
                self.log(f"model config not reloaded: {getattr(e, 'message', None) or e}")

    async def stop(self, grace: float | None = None) -> None:
        """Drain: stop accepting, answer every request already received, then release everything.

        Received means: a REST connection the kernel had queued for accept(), a request whose bytes
        had come in on an open connection, a gRPC call grpc core held, whether or not this code had
        taken it yet. What is still open `grace` seconds (--drain_seconds) after the start is cut off,
        and one log line says how many requests that was."""
        if self._stopped:
            return
        self._stopped = True
        grace = self.opts.drain_seconds if grace is None else grace
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        for t in self._tasks:
            t.cancel()
        if self.health is not None:
            self.health.drain()  # NOT_SERVING; Watch streams are sent it and end
        if self._rest is not None:
            self._rest.give_up_bodies()  # answers say Connection: close; bodies never sent are not waited for
        await asyncio.gather(self._drain_rest(deadline), self._drain_grpc(deadline))
        rest_open = len(self._rest.server.connections) if self._rest is not None else 0
        grpc_done = self._grpc_stopping is None or self._grpc_stopping.done()
        grpc_open = self.metrics.grpc_in_flight  # calls in a handler; 0 with answers still being sent
        if rest_open or grpc_open or not grpc_done:
            held = [f"{rest_open} REST", f"{grpc_open} gRPC" if grpc_open or grpc_done else "gRPC answers being sent"]
            self.log(f"drain: {rest_open + grpc_open} request(s) still open after --drain_seconds {grace:g} "
                     f"({', '.join(held)}): cut off")
        if self._rest is not None:
            await self._rest.server.shutdown(0.1)  # what is left: cancelled, its connection closed
        if self._grpc_stopping is not None:
            if not self._grpc_stopping.done():
                await self.grpc.stop(0)
            await asyncio.gather(self._grpc_stopping, return_exceptions=True)
        elif self.grpc is not None:
            await self.grpc.stop(0)
        self._release()

    async def _drain_rest(self, deadline: float) -> None:
        """Close the REST listener once asyncio has accepted what the kernel queued for it (closing
        it would reset those connections), then close each connection once it is idle, until none is
        left. A connection answering a request closes after its answer (it says Connection: close):
        aiohttp's own close() would drop the rest of a request body still coming in, and the request
        would never be answered. An idle one is closed once the bytes it received are read: a request
        in them is answered, not reset."""
        if self._listener is None:
            return
        loop = asyncio.get_running_loop()
        for sock in self._listener.sockets:
            refuse_new_connections(sock)
        listening = [s.fileno() for s in self._listener.sockets]
        # The loop accepts what is queued (up to the backlog a turn); a handshake answered before the
        # filter completes within a round trip: wait until none has been queued for HANDSHAKE_WAIT.
        quiet_since = loop.time()
        while loop.time() - quiet_since < HANDSHAKE_WAIT and loop.time() < deadline:
            if select.select(listening, [], [], 0)[0]:
                quiet_since = loop.time()
                await asyncio.sleep(0)
            else:
                await asyncio.sleep(0.005)
        self._listener.close()
        turn = 0
        while self._rest.server.connections and loop.time() < deadline:
            for conn in self._rest.server.connections:
                if waiting_for_request(conn) and unread_bytes(conn.transport) == 0:
                    conn.force_close()
            turn += 1
            await asyncio.sleep(0 if turn < 10 else 0.01)

    async def _drain_grpc(self, deadline: float) -> None:
        """Stop gRPC once it has taken every call grpc core held, then wait for the calls to finish.
        grpc core's shutdown cancels each call it received that no handler has taken yet (the client
        sees CANCELLED); under load there can be many, queued behind a busy event loop. Core queues
        such calls in arrival order and our services are generic handlers, as the probe's method
        is: once the probe, sent now, is taken, so is every call that came before it."""
        if self.grpc is None:
            return
        loop = asyncio.get_running_loop()
        if self._probe is not None and loop.time() < deadline:
            try:
                async with grpc.aio.insecure_channel(self._probe) as channel:
                    await channel.unary_unary(PROBE_METHOD)(b"", timeout=max(0.01, deadline - loop.time()))
            except grpc.aio.AioRpcError:  # UNIMPLEMENTED: taken; DEADLINE_EXCEEDED: the drain's time is up
                pass
        # grpc's own cut-off comes after the drain's, so that stop() counts what is open before it cancels
        self._grpc_stopping = asyncio.ensure_future(self.grpc.stop(max(0.0, deadline - loop.time()) + 5.0))
        await asyncio.wait([self._grpc_stopping], timeout=max(0.0, deadline - loop.time()))

    def _release(self) -> None:
        if self._listener is not None:
            self._listener.close()
        if self._probe_dir is not None:
            shutil.rmtree(self._probe_dir, ignore_errors=True)
        if self.group is not None:
            self.group.close()
        if self.shadow is not None:
            self.shadow.close()  # its last reports
        if self.canary is not None:
            self.canary.close()
        self.manager.stop()
        self.request_logs.close()
        if self.batcher:
            self.batcher.close()
        for ex in self._executors:
            ex.shutdown(wait=False, cancel_futures=True)


def run_embedded(opts: ServeOptions, log: Callable[[str], None] = print) -> int:
    """Serve until SIGTERM or SIGINT, then drain and exit 0."""
    from tfpipe.serve import runtime

    tune_malloc()

    async def main() -> None:
        server = EmbeddedServer(opts, log)
        runtime.apply(server.bundle, log)
        freeze_import_time_objects()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        starting = asyncio.create_task(server.start())
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait([starting, stopping], return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():  # stopped while the models were still loading
            log("shutting down before any model became available")
            server._release()
            starting.cancel()
            return
        stopping.cancel()
        starting.result()  # a start-up error propagates
        announce_ready(server.grpc_port, server.rest_port)  # to the supervisor, in a worker of a group
        await stop.wait()
        log(f"shutting down: no new connections; answering the requests in flight (up to --drain_seconds "
            f"{opts.drain_seconds:g})")
        await server.stop()
        log("stopped")

    asyncio.run(main())
    return 0


class ServerThread:
    """An EmbeddedServer on its own loop in a background thread (tests and benchmarks):
    `with ServerThread(opts) as s: ... s.grpc_port, s.rest_port`."""

    def __init__(self, opts: ServeOptions, log: Callable[[str], None] = lambda _: None):
        self.opts, self.log = opts, log
        self.server: EmbeddedServer | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def __enter__(self) -> EmbeddedServer:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="tfpipe-serve", daemon=True)
        self.thread.start()
        self._ready.wait()
        if self._error:
            raise self._error
        return self.server

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.server = EmbeddedServer(self.opts, self.log)
            self.loop.run_until_complete(self.server.start())
        except BaseException as e:
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        self.loop.run_forever()

    def __exit__(self, *exc) -> None:
        if self.server is not None and not self._error:
            asyncio.run_coroutine_threadsafe(self.server.stop(2.0), self.loop).result(timeout=30)
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
