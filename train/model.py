"""A Keras 3 model built from schema.json and stats.json, preprocessing inside.

Three models share layers:
  preprocessor: raw features -> one float32 vector (imputation, normalisation, lookups)
  trainer:      vector -> prediction (the dense part; XLA-compilable, under the dtype policy)
  model:        raw features -> prediction, trainer(preprocessor(x)); this is what is saved
Training maps the preprocessor over the tf.data pipeline, where string lookups run on the
CPU in parallel, and compiles only the trainer; the saved model still takes raw features,
so serving cannot skew from training.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np
from keras import layers

from tfpipe.pipeline.schema import Schema
from tfpipe.train.errors import TrainError
from tfpipe.train.kinds import date_layers, text_layers  # also registers their layers for load_model
from tfpipe.train.layers import Denormalize, ImputeNormalize, IntLevels, Z_CLIP, int_levels, quantile_knots
from tfpipe.train.losses import label_scale, long_right_tail  # (registers the losses and metrics too)

# A model's inputs are keyed by the columns' own names and its Input tensors named by their graph
# names (pipeline/schema.py's graph_names: 'wind speed' -> 'wind_speed', 'from' -> 'from_') on
# purpose; Keras warns at every build and load of such a model, which a user cannot act on.
warnings.filterwarnings("ignore", message="When providing `inputs` as a dict, all keys in the dict must match",
                        category=UserWarning)

ONE_HOT_MAX = 16  # string features with at most this many values are one-hot, else embedded
PREPROCESSOR, TRAINER = "preprocessor", "trainer"  # the two halves of a tabular model, by layer name
DENORMALIZE = "denormalize"  # a regression model's last layer: the trainer's standard units to the label's


def input_dtype(type_: str) -> str:
    return {"int": "float64", "float": "float32", "string": "string"}[type_]


def embedding_dim(n: int) -> int:
    return int(min(32, max(2, round(1.6 * n ** 0.56))))


def layer_name(kind: str, feature: str) -> str:
    """The name of a feature's preprocessing layer of `kind` ("norm", "lookup", "embed", "levels",
    "level_embed"): the
    contract by which `feature_layers` (and through it the TFLite export) finds it again.
    `feature` is the feature's graph name (`Schema.graph_names`), which TensorFlow takes."""
    return f"{kind}_{feature}"


@dataclass(frozen=True)
class FeatureLayers:
    """One feature's preprocessing layers in a tabular model: `norm` for a number (and `levels`
    with `level_embed` for a few whole numbers); `lookup`, and `embed` unless the lookup is
    one-hot, for a string."""

    norm: ImputeNormalize | None = None
    lookup: layers.StringLookup | None = None
    embed: layers.Embedding | None = None
    levels: IntLevels | None = None  # an int column read as categories too: its levels ...
    level_embed: layers.Embedding | None = None  # ... and their embedding, after `norm`'s columns


def feature_layers(model: keras.Model, schema: Schema) -> dict[str, FeatureLayers]:
    """The preprocessing layers of each feature `model` (from build_models, or loaded from
    model.keras) uses; a feature without a value in training has none and is left out."""
    by_name = {layer.name: layer for layer in model.get_layer(PREPROCESSOR).layers}
    names = schema.graph_names()
    out = {}
    for c in schema.features:
        found = {kind: by_name.get(layer_name(kind, names[c.name]))
                 for kind in ("norm", "lookup", "embed", "levels", "level_embed")}
        if any(found.values()):
            out[c.name] = FeatureLayers(**found)
    return out


# A column is heavy-tailed when its upper spread (median to the 99th percentile) is this many
# times its lower spread (1st percentile to median), and it never goes below 0.
HEAVY_TAIL = 5.0


def heavy_tailed(stats: dict[str, Any]) -> bool:
    """Whether a number's training statistics call for log scaling (ImputeNormalize's log1p)."""
    return long_right_tail(stats, HEAVY_TAIL)


def build_models(schema: Schema, train_stats: dict[str, Any], hidden: list[int], dropout: float,
                 seed: int, scaling: str = "auto", target: str = "auto",
                 ensemble: int = 1) -> tuple[keras.Model, keras.Model, keras.Model]:
    """(preprocessor, trainer, model) for the schema, initialised from training statistics;
    `scaling`: "auto" gives each number quantile bins (ImputeNormalize's knots), "log" its z in
    log scale when heavy-tailed, else by mean and std, "standard" its z by mean and std alone;
    `target`, a regression label's scale (see label_scale); `ensemble`, a regression's networks
    side by side (see _members)."""
    # The inputs are keyed by the column's own name; the graph holds its graph name.
    names = schema.graph_names()
    inputs = {c.name: keras.Input(shape=(), dtype=input_dtype(c.type), name=names[c.name]) for c in schema.features}
    parts = []
    for c in schema.features:
        s = train_stats["features"][c.name]
        x = inputs[c.name]
        name = names[c.name]
        if c.kind in ("date", "text"):
            part = _kind_layers(c.kind, x, s, name, c.name)
            if part is not None:
                parts.append(part)
            continue
        if c.type in ("int", "float"):
            if s["mean"] is None:
                continue  # no value in the training split: nothing to learn from
            log = scaling in ("auto", "log") and heavy_tailed(s)
            mean, var = (s["log1p"]["mean"], s["log1p"]["variance"]) if log else (s["mean"], s["variance"])
            knots = quantile_knots(s, mean, var or 1.0, log) if scaling == "auto" else None
            parts.append(ImputeNormalize(mean, var or 1.0, c.nullable, clip=Z_CLIP, log1p=log, knots=knots,
                                         dtype="float32", name=layer_name("norm", name))(x))
            span = int_levels(s) if c.type == "int" else None
            if span is not None:
                levels = IntLevels(*span, name=layer_name("levels", name))
                parts.append(layers.Embedding(
                    levels.depth, embedding_dim(levels.depth), dtype="float32",
                    embeddings_initializer=keras.initializers.RandomUniform(-0.05, 0.05, seed=seed),
                    name=layer_name("level_embed", name))(levels(x)))
        else:
            vocab = [str(v) for v, _ in s["top"] if v != ""]
            if not vocab:
                continue  # never seen a value: nothing to learn from
            if len(vocab) + 1 <= ONE_HOT_MAX:
                lookup = layers.StringLookup(vocabulary=vocab, num_oov_indices=1, output_mode="one_hot",
                                             dtype="float32", name=layer_name("lookup", name))
                parts.append(lookup(x))
            else:
                lookup = layers.StringLookup(vocabulary=vocab, num_oov_indices=1, name=layer_name("lookup", name))
                embed = layers.Embedding(len(vocab) + 1, embedding_dim(len(vocab) + 1), dtype="float32",
                                         embeddings_initializer=keras.initializers.RandomUniform(-0.05, 0.05, seed=seed),
                                         name=layer_name("embed", name))
                parts.append(embed(lookup(x)))
    if not parts:
        raise TrainError("no feature has a value in the training split: nothing to train on")
    features = layers.Concatenate(dtype="float32", name="features")(parts) if len(parts) > 1 else parts[0]
    preprocessor = keras.Model(inputs, features, name=PREPROCESSOR)

    width = preprocessor.output.shape[-1]
    vec = keras.Input(shape=(width,), dtype="float32", name="features")
    task = schema.label.task
    if ensemble > 1:
        if task != "regression":
            raise TrainError(f"an ensemble of {ensemble} networks is for regression; this label is {task}")
        trainer = keras.Model(vec, _members(vec, hidden, dropout, seed, ensemble), name=TRAINER)
    else:
        trainer = keras.Model(vec, _head(_hidden(vec, hidden, dropout, seed), task, schema, seed), name=TRAINER)
    prediction = trainer(preprocessor(inputs))
    if task == "regression":
        scale = label_scale(train_stats, target, ensemble)
        prediction = Denormalize(scale.mean, scale.std, scale.log, dtype="float32", name=DENORMALIZE)(prediction)
    model = keras.Model(inputs, prediction, name="tfpipe_model")
    return preprocessor, trainer, model


def _hidden(h, hidden: list[int], dropout: float, seed: int, prefix: str = ""):
    for i, units in enumerate(hidden):
        h = layers.Dense(units, activation="relu", name=f"{prefix}hidden_{i}",
                         kernel_initializer=keras.initializers.GlorotUniform(seed=seed + i))(h)
        if dropout:
            h = layers.Dropout(dropout, seed=seed + 100 + i, name=f"{prefix}dropout_{i}")(h)
    return h


def _members(vec, hidden: list[int], dropout: float, seed: int, ensemble: int):
    """A regression's `ensemble` networks side by side on the same features: (batch, ensemble),
    each column one member's prediction in standard units. Each member has its own weights
    and initialisation (seeds 10,000 apart), and the loss, which broadcasts the label over the
    columns, trains each on its own error; Denormalize answers their mean."""
    heads = []
    for k in range(ensemble):
        h = _hidden(vec, hidden, dropout, seed + 10000 * k, prefix=f"member{k}_")
        heads.append(layers.Dense(1, dtype="float32", name=f"head_{k}",
                                  kernel_initializer=keras.initializers.GlorotUniform(seed=seed + 10000 * k + 1000))(h))
    return layers.Concatenate(dtype="float32", name="prediction")(heads)


def _head(h, task: str, schema: Schema, seed: int):
    head_init = keras.initializers.GlorotUniform(seed=seed + 1000)
    # The head runs in float32 whatever the policy: softmax/sigmoid and the loss need the range.
    if task == "binary":
        out = layers.Dense(1, activation="sigmoid", dtype="float32", kernel_initializer=head_init, name="head")(h)
        out = layers.Reshape((), dtype="float32", name="probability")(out)
    elif task == "multiclass":
        out = layers.Dense(len(schema.label.classes), activation="softmax", dtype="float32",
                           kernel_initializer=head_init, name="head")(h)
    else:
        # The trainer predicts the label in standard units (see Denormalize).
        out = layers.Dense(1, dtype="float32", kernel_initializer=head_init, name="head")(h)
        out = layers.Reshape((), dtype="float32", name="prediction")(out)
    return out


def _kind_layers(kind: str, x, stats: dict[str, Any], name: str, column: str | None = None):
    """A date's or a free text's preprocessing (train/kinds.py); None when the training split
    has no value of it. `name`: its graph name; `column`: its own."""
    if kind == "date":
        return date_layers(x, stats, name, column) if stats.get("mean") is not None else None
    return text_layers(x, stats, name)


def numpy_batch(schema: Schema, rows: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """Raw rows (dicts, None for missing) as the model's input arrays."""
    out = {}
    for c in schema.features:
        values = [r.get(c.name) for r in rows]
        if c.type == "string":
            out[c.name] = np.array(["" if v is None else str(v) for v in values], dtype=object)
        else:
            out[c.name] = np.array([np.nan if v is None else v for v in values], dtype=input_dtype(c.type))
    return out
