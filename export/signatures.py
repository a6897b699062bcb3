"""The SavedModel's signatures, the way TF Serving wants them.

serving_default: raw features as named tensors with a batch dimension (dtypes from
schema.json; an int feature that can be missing is float64, NaN = missing) -> named
outputs. predict_examples: serialized tf.train.Example strings -> the same outputs, for
Example-based clients and batch scoring (a missing value is simply an absent feature
there). classification (or regression): serialized Examples under TF Serving's
conventional input name `inputs` -> `classes` and `scores` (or `outputs`), with the
classify (regress) method name, so TF Serving's Classify / Regress / MultiInference APIs
and REST :classify / :regress work on the model too.
"""

from __future__ import annotations

import os

import keras
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from tfpipe.pipeline.schema import Schema
from tfpipe.train.data import parse_spec, raw_inputs

TF_DTYPES = {"int": tf.int64, "float": tf.float32, "string": tf.string}


def serving_dtype(feature) -> tf.DType:
    """The serving_default input dtype of a schema feature. An int64 tensor cannot say that
    a value is missing, so an int feature that was missing in the data (nullable) is taken as
    float64 with NaN for missing, the way the model reads it; the others keep int64."""
    if feature.type == "int" and feature.nullable:
        return tf.float64
    return TF_DTYPES[feature.type]


class ServingModule(tf.Module):
    """Wraps the end-to-end Keras model with TF Serving signatures."""

    def __init__(self, model: keras.Model, schema: Schema):
        super().__init__()
        self.model = model
        self._schema = schema
        label = schema.label
        self._classes = None
        if label.task != "regression":
            self._classes = tf.constant([str(c) for c in label.classes])
        spec = {c.name: tf.TensorSpec([None], serving_dtype(c), name=c.name) for c in schema.features}
        self.serve = tf.function(self._serve_raw, input_signature=[spec])
        self.serve_examples = tf.function(
            self._serve_examples, input_signature=[tf.TensorSpec([None], tf.string, name="examples")])

        self.serve_inputs = tf.function(
            self._classify if self._classes is not None else self._regress,
            input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])

    @property
    def example_signature(self) -> str:
        return "regression" if self._classes is None else "classification"

    def signatures(self) -> dict:
        return {"serving_default": self.serve.get_concrete_function(),
                "predict_examples": self.serve_examples.get_concrete_function(),
                self.example_signature: self.serve_inputs.get_concrete_function()}

    def method_names(self) -> dict[str, str]:
        """tf.saved_model.save marks every signature as predict; these two are not."""
        kind = "regress" if self._classes is None else "classify"
        return {self.example_signature: f"tensorflow/serving/{kind}"}

    def _classify(self, inputs):
        out = self._serve_examples(inputs)
        scores = out["probabilities"]
        classes = tf.tile(self._classes[tf.newaxis, :], [tf.shape(scores)[0], 1])
        return {"classes": classes, "scores": scores}

    def _regress(self, inputs):
        return {"outputs": tf.reshape(self._serve_examples(inputs)["predictions"], [-1])}

    def _serve_raw(self, features):
        inputs = {}
        for c in self._schema.features:
            x = features[c.name]
            # The model takes ints as float64 so that NaN can mark a missing value.
            inputs[c.name] = tf.cast(x, tf.float64) if c.type == "int" else x
        return self._outputs(self.model(inputs, training=False))

    def _serve_examples(self, serialized):
        spec = {k: v for k, v in parse_spec(self._schema).items() if k != self._schema.label.name}
        return self._outputs(self.model(raw_inputs(tf.io.parse_example(serialized, spec), self._schema),
                                        training=False))

    def _outputs(self, pred):
        task = self._schema.label.task
        if task == "regression":
            return {"predictions": tf.cast(pred, tf.float32)}
        if task == "binary":
            probabilities = tf.stack([1.0 - pred, pred], axis=-1)
        else:
            probabilities = pred
        class_ids = tf.argmax(probabilities, axis=-1)
        return {"probabilities": tf.cast(probabilities, tf.float32), "class_ids": class_ids,
                "classes": tf.gather(self._classes, class_ids)}


def set_method_names(saved_model_dir: str, methods: dict[str, str]) -> None:
    """Rewrite signature method names in saved_model.pb (TF2's saver has no option for it)."""
    path = os.path.join(saved_model_dir, "saved_model.pb")
    proto = saved_model_pb2.SavedModel()
    with open(path, "rb") as f:
        proto.ParseFromString(f.read())
    for graph in proto.meta_graphs:
        for key, method in methods.items():
            if key in graph.signature_def:
                graph.signature_def[key].method_name = method
    with open(path, "wb") as f:
        f.write(proto.SerializeToString())
