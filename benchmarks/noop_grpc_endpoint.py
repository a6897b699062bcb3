"""A TF-Serving-shaped gRPC endpoint for benchmarking load generators.

    python benchmarks/noop_grpc_endpoint.py PORT [DELAY_MS] [--aio]

Implements PredictionService.GetModelMetadata (model "noop", serving_default taking a float
"x") and PredictionService.Predict, which holds each call DELAY_MS (0 by default) and answers
one float. On grpcio's thread-pool server, or with --aio on grpc.aio (the stack `tfpipe serve`
runs its gRPC APIs on). Prints one line once it listens; stops on SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from concurrent import futures

import grpc
from tensorflow.core.framework import tensor_pb2, types_pb2
from tensorflow_serving.apis import get_model_metadata_pb2, predict_pb2, prediction_service_pb2_grpc


def metadata_response() -> get_model_metadata_pb2.GetModelMetadataResponse:
    sigs = get_model_metadata_pb2.SignatureDefMap()
    sig = sigs.signature_def["serving_default"]
    sig.inputs["x"].name = "x:0"
    sig.inputs["x"].dtype = types_pb2.DT_FLOAT
    sig.inputs["x"].tensor_shape.dim.add().size = -1
    sig.outputs["y"].name = "y:0"
    sig.outputs["y"].dtype = types_pb2.DT_FLOAT
    sig.method_name = "tensorflow/serving/predict"
    resp = get_model_metadata_pb2.GetModelMetadataResponse()
    resp.model_spec.name = "noop"
    resp.model_spec.version.value = 1
    resp.metadata["signature_def"].Pack(sigs)
    return resp


class Noop(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, delay_s: float):
        self.delay_s = delay_s
        self.meta = metadata_response()
        answer = predict_pb2.PredictResponse()
        answer.model_spec.name = "noop"
        y = answer.outputs["y"]
        y.CopyFrom(tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[0.0]))
        y.tensor_shape.dim.add().size = 1
        self.answer = answer

    def GetModelMetadata(self, request, context):
        return self.meta

    def Predict(self, request, context):
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.answer


class AioNoop(Noop):
    async def GetModelMetadata(self, request, context):
        return self.meta

    async def Predict(self, request, context):
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return self.answer


async def serve_aio(port: int, delay: float) -> None:
    server = grpc.aio.server()
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(AioNoop(delay), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print(f"noop gRPC endpoint (grpc.aio) at 127.0.0.1:{port}", flush=True)
    await stop.wait()
    await server.stop(0)


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--aio"]
    port, delay = int(args[0]), (float(args[1]) / 1000 if len(args) > 1 else 0.0)
    if "--aio" in sys.argv[1:]:
        asyncio.run(serve_aio(port, delay))
        return
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(Noop(delay), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    signal.signal(signal.SIGTERM, lambda *_: server.stop(0))
    print(f"noop gRPC endpoint at 127.0.0.1:{port}", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
