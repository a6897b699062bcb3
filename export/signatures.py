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


def serving_dtype(feature, keep: dict[str, tf.DType] | None = None) -> tf.DType:
    """The serving_default input dtype of a schema feature. An int64 tensor cannot say that
    a value is missing, so an int feature that was missing in the data (nullable) is taken as
    float64 with NaN for missing, the way the model reads it; the others keep int64.

    `keep`: the input dtypes of the version served now, by column. An int feature keeps the served
    version's int64 or float64 (both reach the model as float64), so that a day whose rows happen to
    miss a value, or miss none, does not change what the served version's clients send."""
    if keep and feature.type == "int" and keep.get(feature.name) in (tf.int64, tf.float64):
        return keep[feature.name]
    if feature.type == "int" and feature.nullable:
        return tf.float64
    return TF_DTYPES[feature.type]


def input_renames(schema: Schema) -> dict[str, str]:
    """The inputs whose graph name differs from their column's name: graph name -> column."""
    return {g: c for c, g in schema.graph_names().items() if g != c}


def boolean_spellings(schema: Schema, train_stats: dict) -> dict[str, dict[str, str]]:
    """The string features whose training values are booleans (True/False, true/false, TRUE/FALSE:
    how pandas, JSON and spreadsheets write them): feature -> {"true": the training data's own
    spelling of it, "false": likewise}. serving_default reads such a feature's values whatever their
    case, so that REST's JSON `true`, which the server reads as "true", is the model's "True"."""
    out = {}
    for c in schema.features:
        if c.type != "string" or c.kind:
            continue
        seen = [str(v) for v, _ in train_stats["features"].get(c.name, {}).get("top", []) if v != ""]
        lowered = {v.lower(): v for v in seen}
        if seen and len(lowered) == len(seen) and set(lowered) <= {"true", "false"}:
            out[c.name] = lowered
    return out


class ServingModule(tf.Module):
    """Wraps the end-to-end Keras model with TF Serving signatures. `spellings`: see
    boolean_spellings."""

    def __init__(self, model: keras.Model, schema: Schema, keep: dict[str, tf.DType] | None = None,
                 spellings: dict[str, dict[str, str]] | None = None):
        super().__init__()
        self.model = model
        self._schema = schema
        self._spellings = spellings or {}
        label = schema.label
        self._classes = None
        if label.task != "regression":
            self._classes = tf.constant([str(c) for c in label.classes])
        # TensorFlow names a signature's inputs after their specs, which must be graph names;
        # `finish_signatures` gives the inputs their columns' own names back once it is saved.
        names = schema.graph_names()
        self.dtypes = {c.name: serving_dtype(c, keep) for c in schema.features}  # see serving_dtype's `keep`
        spec = {c.name: tf.TensorSpec([None], self.dtypes[c.name], name=names[c.name]) for c in schema.features}
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
            if c.name in self._spellings:
                x = _respelled(x, self._spellings[c.name])
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


def _respelled(x, spellings: dict[str, str]):
    """`x` with each value that is one of `spellings`' keys in any case in its spelling."""
    lower = tf.strings.lower(x)
    for value, spelling in spellings.items():
        x = tf.where(tf.equal(lower, value), tf.constant(spelling), x)
    return x


def finish_signatures(saved_model_dir: str, methods: dict[str, str], renames: dict[str, str],
                      signature: str = "serving_default") -> None:
    """Rewrite saved_model.pb where TF2's saver has no option: the signatures' method names
    (`methods`: signature -> method), and the input keys of `signature` (`renames`: graph name
    -> the column's own name, which TensorFlow does not take as a spec name, such as 'wind
    speed'). An input is renamed in the SignatureDef, which TF Serving and TF1-style loaders
    read, and among the keyword arguments of the signature function, which tf.saved_model.load
    calls it with; the tensors and their order stay as saved."""
    path = os.path.join(saved_model_dir, "saved_model.pb")
    proto = saved_model_pb2.SavedModel()
    with open(path, "rb") as f:
        proto.ParseFromString(f.read())
    for graph in proto.meta_graphs:
        for key, method in methods.items():
            if key in graph.signature_def:
                graph.signature_def[key].method_name = method
        if not renames or signature not in graph.signature_def:
            continue
        inputs = graph.signature_def[signature].inputs
        for old, new in renames.items():
            info = inputs[old]
            inputs[new].CopyFrom(info)
            del inputs[old]
        wrapper = _signature_function(graph, signature)
        for node in graph.object_graph_def.nodes:
            bare = node.bare_concrete_function
            if node.WhichOneof("kind") == "bare_concrete_function" and bare.concrete_function_name == wrapper:
                keywords = [renames.get(k, k) for k in bare.argument_keywords]
                del bare.argument_keywords[:]
                bare.argument_keywords.extend(keywords)
    with open(path, "wb") as f:
        f.write(proto.SerializeToString())


def _signature_function(graph, signature: str) -> str:
    """The concrete function the object graph's signature map holds for `signature`."""
    nodes = graph.object_graph_def.nodes
    root = nodes[0]
    signatures = next(c.node_id for c in root.children if c.local_name == "signatures")
    node = next(c.node_id for c in nodes[signatures].children if c.local_name == signature)
    return nodes[node].bare_concrete_function.concrete_function_name
