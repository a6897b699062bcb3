"""The embedded server: TF Serving's gRPC API on grpc.aio (TCP port and/or Unix socket,
optionally TLS or ALTS, optionally the standard health service) and its REST API on aiohttp,
both on one asyncio loop whose model calls go to batch or worker threads, models loaded and
swapped by the ModelManager.

As tensorflow_model_server does, the server loads the configured models before it opens
its ports, and refuses to start when a model's versions all fail to load.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import os
import signal
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import grpc
from aiohttp import web
from tensorflow_serving.config import model_server_config_pb2

from tfpipe.serve.batcher import BatchOptions, BatchScheduler
from tfpipe.serve.configs import channel_arguments, model_server_config, monitoring_config, session_bundle_config, \
    ssl_config
from tfpipe.serve.errors import ServeError, ServingError
from tfpipe.serve.flags import ServeOptions, ignored_flag_notes
from tfpipe.serve.grpc_api import ModelService, PredictionService, add_services
from tfpipe.serve.inference import Inference
from tfpipe.serve.manager import ManagerOptions, ModelManager
from tfpipe.serve.metrics import Metrics
from tfpipe.serve.request_log import LogBounds, RequestLogs
from tfpipe.serve.rest_api import RestApi
from tfpipe.serve.servable import LIVE, Servable, ServableSettings
from tfpipe.serve.workers import Group, worker_identity

MAX_MESSAGE_BYTES = 2**31 - 1  # tensorflow_model_server's gRPC message limit (SetMaxMessageSize)
HEALTH_SERVICES = ("ModelService", "PredictionService")  # the names TF Serving reports SERVING


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
                                       allow_unavailable_labels=opts.allow_version_labels_for_unavailable_models),
                log=log, on_unload=self._unloaded, on_config=self.request_logs.update)
        except ServingError as e:
            self.request_logs.close()
            raise ServeError(f"model config: {e.message}") from None
        self.metrics.known_model = self.manager.serves
        self.batcher = BatchScheduler(self.batch_options, on_batch=self.metrics.batch) if self.batch_options else None
        self._executors = [ThreadPoolExecutor(max(1, opts.grpc_max_threads), thread_name_prefix="tfpipe-grpc"),
                           ThreadPoolExecutor(max(1, opts.rest_api_num_threads), thread_name_prefix="tfpipe-rest")]
        self.inference = Inference(self.manager, self.batcher, self._executors[1],
                                   per_model_batching=settings.per_model_batching)
        self.grpc = self.health = self.group = None
        self.grpc_port = self.rest_port = None
        self._runner = None
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
        await self._start_grpc()
        if o.rest_api_port:
            if o.rest_api_port == o.port and o.port > 0:
                self.log("server_options.http_port cannot be same as grpc_port. Please use a different port for "
                         "HTTP/REST API. Skipped exporting HTTP/REST API.")
            else:
                await self._start_rest()
        if o.model_config_file and o.model_config_file_poll_wait_seconds > 0:
            self._tasks.append(asyncio.create_task(self._watch_config(o.model_config_file_poll_wait_seconds)))

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
        options = dict([("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES), *self.channel_args])
        self.grpc = grpc.aio.server(options=list(options.items()))
        add_services(self.grpc, self.metrics,
                     PredictionService(self.inference, self.metrics, self._executors[0],
                                       o.enable_serialization_as_tensor_content, self.request_logs),
                     ModelService(self.inference, self.metrics, self._executors[0], self._reload, self.log))
        if o.enable_grpc_healthcheck_service:
            from grpc_health.v1 import health, health_pb2, health_pb2_grpc

            self.health = health.aio.HealthServicer()
            health_pb2_grpc.add_HealthServicer_to_server(self.health, self.grpc)
            for service in ("", *HEALTH_SERVICES):
                await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        creds = self._credentials()
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

    def metrics_text(self) -> str:
        """This process's Prometheus page."""
        batcher, manager = self.inference.batcher, self.manager
        return self.metrics.render(manager.loaded(), batcher.depth() if batcher else 0,
                                   batcher.queue_count() if batcher else 0, manager.load_sizes(), len(LIVE))

    async def _start_rest(self) -> None:
        o = self.opts
        scrape = self.metrics_text if self.group is None else self.group.scrape  # a group's scrape shows all
        rest = RestApi(self.inference, self.metrics, o.rest_api_timeout_in_ms, o.max_request_bytes,
                       self.metrics_path, cors=o.rest_api_enable_cors_support, logs=self.request_logs,
                       render_metrics=scrape, read_timeout=o.rest_read_timeout_seconds)
        self._runner = web.ServerRunner(rest.server, handle_signals=False, shutdown_timeout=o.drain_seconds)
        await self._runner.setup()
        # A worker of --workers N shares the port with the others (grpcio sets SO_REUSEPORT itself).
        site = web.TCPSite(self._runner, o.host, max(o.rest_api_port, 0),
                           reuse_port=worker_identity() is not None or None)
        try:
            await site.start()
        except OSError as e:
            await self.grpc.stop(0)
            raise ServeError(f"cannot bind the REST port {o.host}:{o.rest_api_port}: {e.strerror}") from None
        self.rest_port = self._runner.addresses[0][1]
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
        """Stop accepting, let in-flight requests finish (up to `grace` seconds), release everything."""
        grace = self.opts.drain_seconds if grace is None else grace
        for t in self._tasks:
            t.cancel()
        if self.health is not None:
            await self.health.enter_graceful_shutdown()
        waits = []
        if self.grpc is not None:
            waits.append(self.grpc.stop(grace))  # done once in-flight calls finish, or after `grace`
        if self._runner is not None:
            waits.append(self._runner.cleanup())
        await asyncio.gather(*waits, return_exceptions=True)
        self._release()

    def _release(self) -> None:
        if self.group is not None:
            self.group.close()
        self.manager.stop()
        self.request_logs.close()
        if self.batcher:
            self.batcher.close()
        for ex in self._executors:
            ex.shutdown(wait=False, cancel_futures=True)


M_MMAP_THRESHOLD = -3  # mallopt's parameter number (glibc malloc.h)


def tune_malloc(nbytes: int = 128 * 1024) -> None:
    """Keep glibc serving blocks over `nbytes` (its own starting threshold) from mmap, so that
    freed ones go straight back to the OS; by default glibc raises the threshold as large
    blocks are freed, after which they come from the heap and stay resident. An explicit
    MALLOC_MMAP_THRESHOLD_ wins. The number of arenas is left to glibc (eight per core):
    MALLOC_ARENA_MAX=2 keeps RSS flatter across hot reloads and costs throughput (docs/benchmarks.md)."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return
    try:
        ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, nbytes)
    except (OSError, AttributeError):  # not glibc
        pass


def run_embedded(opts: ServeOptions, log: Callable[[str], None] = print) -> int:
    """Serve until SIGTERM or SIGINT, then drain and exit 0."""
    from tfpipe.serve import runtime

    tune_malloc()

    async def main() -> None:
        server = EmbeddedServer(opts, log)
        runtime.apply(server.bundle, log)
        # TensorFlow and Keras leave ~330k long-lived objects; a full garbage collection that
        # walks them stalls every thread for ~200 ms (REST p99.9 at 32 clients was 4x p99).
        # Frozen, they are never walked; the models loaded later stay collectable.
        # TFPIPE_GC_FREEZE=0 leaves them unfrozen (benchmarks/bench_serve.py shows the difference).
        if os.environ.get("TFPIPE_GC_FREEZE", "1") != "0":
            gc.collect()
            gc.freeze()
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
        await stop.wait()
        log("shutting down: no new connections; finishing in-flight requests")
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
