"""The baseline bench_serve.py compares against: a PredictionService written the obvious way
with grpcio, one thread, no batching.

    python benchmarks/plain_grpc_server.py MODEL_VERSION_DIR PORT
    python benchmarks/plain_grpc_server.py echo PORT     (answers an empty response: the gRPC floor)
"""

from __future__ import annotations

import os
import sys
from concurrent import futures

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import grpc  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc  # noqa: E402


class Plain(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, path: str):
        self.fn = tf.saved_model.load(path).signatures["serving_default"] if path != "echo" else None

    def Predict(self, request, context):
        if self.fn is None:
            return predict_pb2.PredictResponse()
        inputs = {k: tf.constant(tf.make_ndarray(v)) for k, v in request.inputs.items()}
        outputs = self.fn(**inputs)
        response = predict_pb2.PredictResponse()
        response.model_spec.CopyFrom(request.model_spec)
        for k, v in outputs.items():
            response.outputs[k].CopyFrom(tf.make_tensor_proto(v.numpy()))
        return response


def main() -> None:
    path, port = sys.argv[1], int(sys.argv[2])
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(Plain(path), server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print(f"plain gRPC server at 127.0.0.1:{bound}", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
