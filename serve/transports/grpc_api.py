"""TF Serving's gRPC services (tensorflow.serving.PredictionService and ModelService),
with the messages from tensorflow-serving-api, so the official stubs work unchanged.

The server parses the request bytes itself (`add_services`), so that bytes that are no
request are INVALID_ARGUMENT. The services run on grpc.aio, on the server's event loop beside
REST. A Predict is decoded on the loop and waits for its batch there, settled with the batch's
other answers in one loop wake-up; what blocks (a model call without batching, Classify, Regress,
MultiInference, a config reload) goes to the `--grpc_max_threads` pool. grpcio's
thread-pool server, with one blocked thread per call and so one thread wake-up per answer,
cost about a third more CPU per batched Predict (docs/benchmarks.md, Serving).
"""

from __future__ import annotations

import asyncio
import functools
import time
from concurrent.futures import Executor

import grpc
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    inference_pb2,
    model_management_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

from tfpipe.serve.codecs.tensor_proto import (
    classification_result,
    declared_shape,
    input_examples,
    model_spec,
    one_value_inputs,
    predict_inputs,
    regression_result,
    tensor_proto,
)
from tfpipe.serve.core.inference import OFF_LOOP_BYTES, Inference
from tfpipe.serve.core.large_requests import large_request, large_turn
from tfpipe.serve.core.turns import PEER
from tfpipe.serve.codecs.model_info import metadata_response, spec_of, status_response
from tfpipe.serve.errors import ServingError, capped, invalid
from tfpipe.serve.metrics import Metrics
from tfpipe.serve.request_log import RequestLogs
from tfpipe.serve.transports.grpc_calls import fail, request_of


async def _answer(metrics: Metrics, api: str, name: str, context, handler):
    """Await one call's coroutine `handler()`; a ServingError becomes its status code."""
    t0 = time.perf_counter()
    try:
        response = await handler()
    except ServingError as e:
        metrics.request(name, api, e.code.name, time.perf_counter() - t0)
        fail(context, e.code, e.message)
        return None
    except Exception as e:  # a bug, not bad input: INTERNAL, and the server keeps serving
        metrics.request(name, api, "INTERNAL", time.perf_counter() - t0)
        fail(context, grpc.StatusCode.INTERNAL, capped(f"{type(e).__name__}: {e}"))
        return None
    metrics.request(name, api, "OK", time.perf_counter() - t0)
    return response


class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
    """`tensor_content`: Predict answers carry numbers as tensor_content bytes
    (--enable_serialization_as_tensor_content) rather than typed value fields. `executor`:
    the --grpc_max_threads pool for what blocks."""

    def __init__(self, inference: Inference, metrics: Metrics, executor: Executor, tensor_content: bool = False,
                 logs: RequestLogs | None = None):
        self.inference, self.metrics, self.executor = inference, metrics, executor
        self.tensor_content, self.logs = tensor_content, logs

    def _log(self, started: tuple[int, int], name: str, version: int, signature: str, api: str, request,
             response) -> None:
        if self.logs is not None:
            self.logs.record(name, version, signature, api, "grpc", started, lambda: (request, response))

    async def Predict(self, request, context):
        started = time.time_ns(), time.perf_counter_ns()

        async def run():
            spec = spec_of(request.model_spec)
            small = request.ByteSize() <= OFF_LOOP_BYTES
            fast = one_value_inputs(request.inputs) if small else None
            if fast:  # the common request (one value an input), read in the pass that would count it
                rows, large, decode = 1, False, (lambda _: fast)
            else:
                rows, elements = declared_shape(request)
                # Large: many bytes, or many elements declared (a small request that TensorFlow's
                # fill-out makes large; 8 bytes an element, a number's or a string's reference in numpy)
                large = not small or elements * 8 > OFF_LOOP_BYTES
                decode = lambda _: predict_inputs(request)  # noqa: E731
            if not large:
                return await self._predicted(request, context, started, spec, decode, rows, False)
            async with large_turn():
                return await self._predicted(request, context, started, spec, decode, rows, True)
        return await _answer(self.metrics, "predict", request.model_spec.name, context, run)

    async def _predicted(self, request, context, started: tuple[int, int], spec, decode, rows: int | None,
                         large: bool):
        """A Predict's answer: the request `decode`d (off the loop when `large`) and run; the
        response built on the loop, or serialized off it when the answer is large."""
        p = await self.inference.predict(spec, request.model_spec.signature_name, decode, request.output_filter,
                                         self.executor, client=self._client(context), decode_off_loop=large,
                                         rows=rows)

        def answer() -> predict_pb2.PredictResponse:
            response = predict_pb2.PredictResponse()
            model_spec(response.model_spec, spec.name, p.servable.version, p.signature.name)
            for k, v in p.outputs.items():
                tensor_proto(v, self.tensor_content, into=response.outputs[k])
            return response
        if not p.large_answer():
            response = answer()
            self._log(started, spec.name, p.servable.version, p.signature.name, "predict", request, response)
            return response

        def serialized() -> tuple[predict_pb2.PredictResponse, bytes]:
            response = answer()
            return response, response.SerializeToString()
        with large_request():
            response, wire = await asyncio.get_running_loop().run_in_executor(self.executor, serialized)
        self._log(started, spec.name, p.servable.version, p.signature.name, "predict", request, response)
        return wire

    async def Classify(self, request, context):
        return await self._on_examples("classify", request, context, self.inference.classify,
                                       lambda classes, scores: classification_pb2.ClassificationResponse(
                                           result=classification_result(classes, scores)))

    async def Regress(self, request, context):
        return await self._on_examples("regress", request, context, self.inference.regress,
                                       lambda values: regression_pb2.RegressionResponse(
                                           result=regression_result(values)))

    def _client(self, context) -> str | None:
        """The call's --canary_key metadata value, when a canary is on."""
        canary = self.inference.canary
        if canary is None:
            return None
        for key, value in context.invocation_metadata() or ():
            if key == canary.options.key:
                return value if isinstance(value, str) else None
        return None

    async def _on_examples(self, api: str, request, context, call, respond):
        """Classify or Regress: `call` (the core's classify or regress) on the request's examples,
        then `respond(*what it returned after the servable and signature)`, the response message."""
        started = time.time_ns(), time.perf_counter_ns()

        client = self._client(context)

        async def run():
            spec = spec_of(request.model_spec)
            large = request.ByteSize() > OFF_LOOP_BYTES  # many examples: read off the loop, and the answer built there
            servable, sig, _, *result = await call(spec, request.model_spec.signature_name,
                                                   lambda: input_examples(request.input), client, self.executor,
                                                   decode_off_loop=large)

            def answer():
                response = respond(*result)
                model_spec(response.model_spec, spec.name, servable.version, sig.name)
                return response
            if large:
                response = await asyncio.get_running_loop().run_in_executor(self.executor, answer)
            else:
                response = answer()
            self._log(started, spec.name, servable.version, sig.name, api, request, response)
            return response
        return await _answer(self.metrics, api, request.model_spec.name, context, run)

    async def MultiInference(self, request, context):
        started = time.time_ns(), time.perf_counter_ns()

        async def run():
            if not request.tasks:
                raise invalid("Tasks is empty")
            servable, results = await self.inference.multi_inference(
                lambda: [(spec_of(t.model_spec, named=False), t.model_spec.signature_name, t.method_name)
                         for t in request.tasks],
                lambda: input_examples(request.input), self.executor,
                decode_off_loop=request.ByteSize() > OFF_LOOP_BYTES)
            response = inference_pb2.MultiInferenceResponse()
            for task, result in zip(request.tasks, results, strict=True):
                out = response.results.add()
                if result[0] == "classify":
                    out.classification_result.CopyFrom(classification_result(*result[1:]))
                else:
                    out.regression_result.CopyFrom(regression_result(result[1]))
                model_spec(out.model_spec, task.model_spec.name, servable.version, task.model_spec.signature_name)
            self._log(started, servable.name, servable.version, request.tasks[0].model_spec.signature_name,
                      "multi_inference", request, response)
            return response
        name = request.tasks[0].model_spec.name if request.tasks else ""
        return await _answer(self.metrics, "multi_inference", name, context, run)

    async def GetModelMetadata(self, request, context):
        async def run():  # no model call: answered on the loop
            return metadata_response(self.inference.manager, request)
        return await _answer(self.metrics, "metadata", request.model_spec.name, context, run)


class ModelService(model_service_pb2_grpc.ModelServiceServicer):
    """`reload(config)`: applies a ReloadConfigRequest's config, blocking until its models load."""

    def __init__(self, inference: Inference, metrics: Metrics, executor: Executor, reload, log=print):
        self.inference, self.metrics, self.executor, self.reload, self.log = inference, metrics, executor, reload, log

    async def GetModelStatus(self, request, context):
        async def run():
            return status_response(self.inference.manager, request)
        return await _answer(self.metrics, "model_status", request.model_spec.name, context, run)

    async def HandleReloadConfigRequest(self, request, context):
        def reload():  # on a --grpc_max_threads thread: it waits for the new models to load
            self.reload(request.config)
            self.log(f"reloaded model config: {[c.name for c in request.config.model_config_list.config]}")

        async def run():
            if request.config.WhichOneof("config") is None:
                raise invalid("ReloadConfigRequest has no config")
            await asyncio.get_running_loop().run_in_executor(self.executor, reload)
            response = model_management_pb2.ReloadConfigResponse()
            response.status.error_code = 0
            return response
        return await _answer(self.metrics, "reload_config", "", context, run)


# Each method's request and response messages and its name in the metrics.
_METHODS = {
    "tensorflow.serving.PredictionService": {
        "Predict": (predict_pb2.PredictRequest, predict_pb2.PredictResponse, "predict"),
        "Classify": (classification_pb2.ClassificationRequest, classification_pb2.ClassificationResponse, "classify"),
        "Regress": (regression_pb2.RegressionRequest, regression_pb2.RegressionResponse, "regress"),
        "MultiInference": (inference_pb2.MultiInferenceRequest, inference_pb2.MultiInferenceResponse,
                           "multi_inference"),
        "GetModelMetadata": (get_model_metadata_pb2.GetModelMetadataRequest,
                             get_model_metadata_pb2.GetModelMetadataResponse, "metadata"),
    },
    "tensorflow.serving.ModelService": {
        "GetModelStatus": (get_model_status_pb2.GetModelStatusRequest, get_model_status_pb2.GetModelStatusResponse,
                           "model_status"),
        "HandleReloadConfigRequest": (model_management_pb2.ReloadConfigRequest,
                                      model_management_pb2.ReloadConfigResponse, "reload_config"),
    },
}


def add_services(server, metrics: Metrics, prediction: PredictionService, model: ModelService,
                 max_in_flight: int, max_request_bytes: int) -> None:
    """Both services on `server`, as the generated add_*Servicer_to_server would add them except
    that the request bytes come to this code to parse: bytes that are not the method's request
    (random, cut short, bit-flipped) are INVALID_ARGUMENT naming the message type. grpcio's own
    deserializer answers them UNKNOWN ("Unexpected <class DecodeError>") before any code of ours runs.
    `max_in_flight` (--grpc_max_calls_in_flight; 0: no bound): a call that comes while as many are
    being answered is RESOURCE_EXHAUSTED at once. `max_request_bytes`: the bound of a compressed
    request's inflated bytes (grpc_calls.request_of; grpc core bounds the bytes received)."""
    for service, servicer in (("tensorflow.serving.PredictionService", prediction),
                              ("tensorflow.serving.ModelService", model)):
        handlers = {name: grpc.unary_unary_rpc_method_handler(
                        _parsed(getattr(servicer, name), request, api, metrics, max_in_flight,
                                max_request_bytes, servicer.executor),
                        request_deserializer=None,  # bytes in
                        response_serializer=functools.partial(_serialized, response))
                    for name, (request, response, api) in _METHODS[service].items()}
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))


def _serialized(response_type, response) -> bytes:
    """A handler's answer as bytes: its message serialized, or the bytes a handler serialized off
    the loop for a large one."""
    return response if type(response) is bytes else response_type.SerializeToString(response)


def _parsed(method, request_type, api: str, metrics: Metrics, max_in_flight: int, max_request_bytes: int,
            executor: Executor):
    """`method` (a servicer's coroutine) called on the request read from the call's bytes (see
    grpc_calls.request_of), unless `max_in_flight` calls are being answered already."""

    async def handler(raw: bytes, context):
        if max_in_flight and metrics.grpc_in_flight >= max_in_flight:
            metrics.request("", api, "RESOURCE_EXHAUSTED", 0.0)
            fail(context, grpc.StatusCode.RESOURCE_EXHAUSTED,
                 f"Too many calls in flight: this server answers {max_in_flight} at once "
                 "(--grpc_max_calls_in_flight); try again later")
            return None
        PEER.set(context.peer())  # (this call's task: its work takes its connection's turns)
        request = await request_of(request_type, raw, context, max_request_bytes, executor)
        if request is None:  # refused as it was read: INVALID_ARGUMENT, or RESOURCE_EXHAUSTED (inflated too far)
            metrics.request("", api, context.code().name, 0.0)
            return None
        metrics.grpc_in_flight += 1  # what a drain cut short would count
        try:
            return await method(request, context)
        finally:
            metrics.grpc_in_flight -= 1
    return handler
