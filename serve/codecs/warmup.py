"""Warmup: a version's assets.extra/tf_serving_warmup_requests replayed as it loads, as TF
Serving replays them. The records are TF Serving's PredictionLogs, read with the codecs that read
a gRPC request; the model manager is given `replay` by the server that assembles it, so that the
core reads no request format of its own."""

from __future__ import annotations

import os

import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2

from tfpipe.prediction_logs import WARMUP_FILE
from tfpipe.serve.codecs.tensor_proto import input_examples, predict_inputs
from tfpipe.serve.core.examples import finished
from tfpipe.serve.core.servable import CLASSIFY, Servable
from tfpipe.serve.errors import precondition

MAX_WARMUP_RECORDS = 1000  # what TF Serving reads at most


def replay(servable: Servable) -> int:
    """Replay the version's warmup records (each `warmup_iterations` times); any failure fails the
    load. Returns the number of records."""
    path = os.path.join(servable.path, WARMUP_FILE)
    if not os.path.exists(path):
        return 0
    n = 0
    for record in tf.data.TFRecordDataset(path).take(MAX_WARMUP_RECORDS):
        log = prediction_log_pb2.PredictionLog.FromString(record.numpy())
        kind = log.WhichOneof("log_type")
        for _ in range(max(1, servable.settings.warmup_iterations)):
            if kind == "predict_log":
                req = log.predict_log.request
                sig = servable.signature(req.model_spec.signature_name)
                servable.run(sig, servable.check_inputs(sig, predict_inputs(req, bounded=False)))
            elif kind == "classify_log":
                req = log.classify_log.request
                finished(servable.classify(req.model_spec.signature_name, input_examples(req.input)))
            elif kind == "regress_log":
                req = log.regress_log.request
                finished(servable.regress(req.model_spec.signature_name, input_examples(req.input)))
            elif kind == "multi_inference_log":
                req = log.multi_inference_log.request
                examples = input_examples(req.input)
                for task in req.tasks:
                    finished((servable.classify if task.method_name == CLASSIFY else servable.regress)(
                        task.model_spec.signature_name, examples))
            else:
                raise precondition(f"warmup record {n}: unsupported log type {kind}")
        n += 1
    return n
