"""The embedded server: TF Serving's gRPC API on grpcio's thread-pool server, its REST API on
an asyncio loop whose model calls go to worker threads, models loaded and swapped by the
ModelManager."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import grpc
from aiohttp import web
from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

from serve.batcher import BatchOptions, BatchScheduler
from serve.configs import batching_parameters, model_server_config, monitoring_config
from serve.errors import ServeError
from serve.flags import ServeOptions
from serve.grpc_api import ModelService, PredictionService
from serve.inference import Inference
from serve.manager import ModelManager
from serve.metrics import Metrics
from serve.rest_api import RestApi


class EmbeddedServer:
    """Build from ServeOptions, `await start()`, `await stop()`. A negative port picks a free one
    (tfpipe's extension, for tests); a REST port of 0 disables REST, as in TF Serving."""

    def __init__(self, opts: ServeOptions, log: Callable[[str], None] = print):
        self.opts, self.log = opts, log
        self.config = model_server_config(opts)
        self.batch_options = None
        if opts.enable_batching:
            try:
                self.batch_options = BatchOptions.from_proto(batching_parameters(opts))
            except ValueError as e:
                raise ServeError(f"--batching_parameters_file: {e}") from None
        else:
            batching_parameters(opts)  # rejects a batching file given without --enable_batching
        monitoring = monitoring_config(opts)
        self.metrics_path = (monitoring.prometheus_config.path
                             if monitoring and monitoring.prometheus_config.enable else None)
        self.metrics = Metrics()
        self.manager = ModelManager(self.config, warmup=opts.enable_model_warmup, log=log)
        self.grpc_port = self.rest_port = None
        self._runner = None
        self._tasks: list[asyncio.Task] = []

    async def start(self) -> None:
        o = self.opts
        loop = asyncio.get_running_loop()
        # Like tensorflow_model_server: the initial versions are loaded before the ports open.
        await loop.run_in_executor(None, self.manager.start, o.file_system_poll_wait_seconds)
        if not any(self.manager.loaded().values()):
            self.log("warning: no model version is AVAILABLE yet; requests get 404 until one loads")
        self.batcher = BatchScheduler(self.batch_options, on_batch=self.metrics.batch) if self.batch_options else None
        self._executors = [ThreadPoolExecutor(max(1, o.grpc_max_threads), thread_name_prefix="tfpipe-grpc"),
                           ThreadPoolExecutor(max(1, o.rest_api_num_threads), thread_name_prefix="tfpipe-rest")]
        grpc_inference = Inference(self.manager, self.batcher)
        self.grpc = grpc.server(self._executors[0],
                                options=[("grpc.max_receive_message_length", o.max_request_bytes),
                                         ("grpc.max_send_message_length", -1)])
        prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
            PredictionService(grpc_inference, self.metrics), self.grpc)
        model_service_pb2_grpc.add_ModelServiceServicer_to_server(
            ModelService(grpc_inference, self.metrics, self.log), self.grpc)
        try:
            self.grpc_port = self.grpc.add_insecure_port(f"{o.host}:{max(o.port, 0)}")
        except RuntimeError:
            self.grpc_port = 0
        if not self.grpc_port:
            raise ServeError(f"cannot bind the gRPC port {o.host}:{o.port} (in use?)")
        self.grpc.start()
        self.log(f"Running gRPC ModelServer at {o.host}:{self.grpc_port} ...")
        if o.rest_api_port:
            rest = RestApi(Inference(self.manager, self.batcher, self._executors[1]), self.metrics,
                           o.rest_api_timeout_in_ms, o.max_request_bytes, self.metrics_path)
            self._runner = web.AppRunner(rest.app, access_log=None, handle_signals=False,
                                         shutdown_timeout=o.drain_seconds)
            await self._runner.setup()
            site = web.TCPSite(self._runner, o.host, max(o.rest_api_port, 0))
            try:
                await site.start()
            except OSError as e:
                self.grpc.stop(0)
                raise ServeError(f"cannot bind the REST port {o.host}:{o.rest_api_port}: {e.strerror}") from None
            self.rest_port = self._runner.addresses[0][1]
            self.log(f"Exporting HTTP/REST API at:{o.host}:{self.rest_port} ...")
            if self.metrics_path:
                self.log(f"Prometheus metrics at {self.metrics_path}")
        if o.model_config_file and o.model_config_file_poll_wait_seconds > 0:
            self._tasks.append(asyncio.create_task(self._watch_config(o.model_config_file_poll_wait_seconds)))

    async def _watch_config(self, seconds: int) -> None:
        last = self.config
        while True:
            await asyncio.sleep(seconds)
            try:
                config = model_server_config(self.opts)
                if config != last:
                    await asyncio.get_running_loop().run_in_executor(None, self.manager.set_config, config)
                    last = config
                    self.log(f"model config reloaded from {self.opts.model_config_file}")
            except Exception as e:  # keep serving the last good config
                self.log(f"model config not reloaded: {getattr(e, 'message', None) or e}")

    async def stop(self, grace: float | None = None) -> None:
        """Stop accepting, let in-flight requests finish (up to `grace` seconds), release everything."""
        grace = self.opts.drain_seconds if grace is None else grace
        for t in self._tasks:
            t.cancel()
        stopped = self.grpc.stop(grace)  # a threading.Event, set once in-flight calls are done
        waits = [asyncio.get_running_loop().run_in_executor(None, stopped.wait)]
        if self._runner is not None:
            waits.append(self._runner.cleanup())
        await asyncio.gather(*waits, return_exceptions=True)
        self.manager.stop()
        if self.batcher:
            self.batcher.close()
        for ex in self._executors:
            ex.shutdown(wait=False, cancel_futures=True)


def run_embedded(opts: ServeOptions, log: Callable[[str], None] = print) -> int:
    """Serve until SIGTERM or SIGINT, then drain and exit 0."""
    import tensorflow as tf

    if opts.tensorflow_intra_op_parallelism:
        tf.config.threading.set_intra_op_parallelism_threads(opts.tensorflow_intra_op_parallelism)
    if opts.tensorflow_inter_op_parallelism:
        tf.config.threading.set_inter_op_parallelism_threads(opts.tensorflow_inter_op_parallelism)

    async def main() -> None:
        server = EmbeddedServer(opts, log)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await server.start()
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
