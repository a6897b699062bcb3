"""Small SavedModels for the serving tests, built with plain TensorFlow (not tfpipe's exporter),
so the server is proven on any SavedModel laid out for TF Serving."""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

from export.signatures import set_method_names


class Half(tf.Module):
    """TF Serving's half_plus_two: one float input `x`, one output `y`; plus a regress
    signature over tf.Examples with a float feature `x`, as TF Serving's test model has."""

    def __init__(self, b: float):
        super().__init__()
        self.a, self.b = tf.Variable(0.5), tf.Variable(b)
        self.predict = tf.function(lambda x: {"y": self.a * x + self.b},
                                   input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
        self.regress = tf.function(self._regress, input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])

    def _regress(self, inputs):
        x = tf.io.parse_example(inputs, {"x": tf.io.FixedLenFeature([], tf.float32)})["x"]
        return {"outputs": self.a * x + self.b}


class Multi(tf.Module):
    """Several named inputs and outputs of several dtypes and shapes."""

    def __init__(self):
        super().__init__()
        self.predict = tf.function(self._predict, input_signature=[{
            "a": tf.TensorSpec([None, 2], tf.float32, name="a"),
            "b": tf.TensorSpec([None], tf.int64, name="b"),
            "tag": tf.TensorSpec([None], tf.string, name="tag")}])

    def _predict(self, inputs):
        return {"sum": tf.reduce_sum(inputs["a"], axis=1) + tf.cast(inputs["b"], tf.float32),
                "double": inputs["a"] * 2.0,
                "tag_bytes": tf.strings.join([inputs["tag"], "!"]),
                "upper": tf.strings.upper(inputs["tag"])}


class Slow(tf.Module):
    """y = x + 1 after a busy loop: one call takes tens of milliseconds, so queues fill."""

    def __init__(self, steps: int):
        super().__init__()
        self.steps = steps
        self.predict = tf.function(self._predict, input_signature=[tf.TensorSpec([None], tf.float32, name="x")])

    def _predict(self, x):
        i = tf.constant(0)
        acc = tf.constant(0.0)
        i, acc = tf.while_loop(lambda i, acc: i < self.steps, lambda i, acc: (i + 1, acc + 1e-9), [i, acc])
        return {"y": x + 1.0 + acc * 0.0}


def save_half(path: str, b: float = 2.0, warmup: int = 0) -> str:
    m = Half(b)
    tf.saved_model.save(m, path, signatures={"serving_default": m.predict, "regress_x": m.regress})
    set_method_names(path, {"regress_x": "tensorflow/serving/regress"})
    if warmup:
        os.makedirs(os.path.join(path, "assets.extra"), exist_ok=True)
        with tf.io.TFRecordWriter(os.path.join(path, "assets.extra", "tf_serving_warmup_requests")) as w:
            for i in range(warmup):
                req = predict_pb2.PredictRequest()
                req.model_spec.name = "half"
                req.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([float(i)], np.float32)))
                w.write(prediction_log_pb2.PredictionLog(
                    predict_log=prediction_log_pb2.PredictLog(request=req)).SerializeToString())
    return path


def save_multi(path: str) -> str:
    m = Multi()
    tf.saved_model.save(m, path, signatures={"serving_default": m.predict})
    return path


def save_slow(path: str, steps: int = 20000) -> str:
    m = Slow(steps)
    tf.saved_model.save(m, path, signatures={"serving_default": m.predict})
    return path


def publish(tmp_dir: str, final: str) -> None:
    """What an exporter does: write beside, then rename into the polled base path."""
    os.rename(tmp_dir, final)
