"""The SavedModel's signatures, the way TF Serving wants them.

serving_default: raw features as named tensors with a batch dimension (dtypes from
schema.json) -> named outputs. predict_examples: serialized tf.train.Example strings ->
the same outputs, for Example-based clients and batch scoring (a missing value is simply
an absent feature there).
"""

from __future__ import annotations

import keras
import tensorflow as tf

from pipeline.schema import Schema
from train.data import parse_spec, raw_inputs

TF_DTYPES = {"int": tf.int64, "float": tf.float32, "string": tf.string}


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
        spec = {c.name: tf.TensorSpec([None], TF_DTYPES[c.type], name=c.name) for c in schema.features}
        self.serve = tf.function(self._serve_raw, input_signature=[spec])
        self.serve_examples = tf.function(
            self._serve_examples, input_signature=[tf.TensorSpec([None], tf.string, name="examples")])

    def signatures(self) -> dict:
        return {"serving_default": self.serve.get_concrete_function(),
                "predict_examples": self.serve_examples.get_concrete_function()}

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
