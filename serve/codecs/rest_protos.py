"""A REST request and its answer as the TF Serving messages they stand for, for the request log
(TF Serving turns REST's JSON into the same messages before it runs and logs them)."""

from __future__ import annotations

from tfpipe.serve.codecs.model_info import fill_spec
from tfpipe.serve.codecs.tensor_proto import model_spec, tensor_proto


def predict_protos(spec, signature_name: str, inputs: dict, version: int, used: str, outputs: dict):
    """The PredictRequest and PredictResponse a REST :predict stands for (TF Serving turns its
    JSON into the same messages before it runs and logs them). Numbers go in tensor_content,
    the cheapest form to build: this runs on the log's writer thread, beside requests."""
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    fill_spec(request.model_spec, spec)
    request.model_spec.signature_name = signature_name
    for k, v in inputs.items():
        request.inputs[k].CopyFrom(tensor_proto(v, content=True))
    response = predict_pb2.PredictResponse()
    model_spec(response.model_spec, spec.name, version, used)
    for k, v in outputs.items():
        response.outputs[k].CopyFrom(tensor_proto(v, content=True))
    return request, response


def example_protos(api: str, spec, signature_name: str, examples: list[bytes], version: int, used: str, result):
    """The Classification/RegressionRequest and response of a REST :classify or :regress
    (the examples with their context already merged in)."""
    from tensorflow_serving.apis import classification_pb2, regression_pb2

    module = classification_pb2 if api == "classify" else regression_pb2
    request = module.ClassificationRequest() if api == "classify" else module.RegressionRequest()
    fill_spec(request.model_spec, spec)
    request.model_spec.signature_name = signature_name
    for raw in examples:
        request.input.example_list.examples.add().ParseFromString(raw)
    response = module.ClassificationResponse() if api == "classify" else module.RegressionResponse()
    response.result.CopyFrom(result)
    model_spec(response.model_spec, spec.name, version, used)
    return request, response
