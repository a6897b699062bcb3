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

import math
import warnings
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np
from keras import layers, ops

from tfpipe.pipeline.schema import Schema
from tfpipe.train.errors import TrainError
from tfpipe.train.kinds import date_layers, text_layers  # also registers their layers for load_model

# A model's inputs are keyed by the columns' own names and its Input tensors named by their graph
# names (pipeline/schema.py's graph_names: 'wind speed' -> 'wind_speed', 'from' -> 'from_') on
# purpose; Keras warns at every build and load of such a model, which a user cannot act on.
warnings.filterwarnings("ignore", message="When providing `inputs` as a dict, all keys in the dict must match",
                        category=UserWarning)

ONE_HOT_MAX = 16  # string features with at most this many values are one-hot, else embedded
PREPROCESSOR, TRAINER = "preprocessor", "trainer"  # the two halves of a tabular model, by layer name
DENORMALIZE = "denormalize"  # a regression model's last layer: the trainer's standard units to the label's
Z_CLIP = 5.0  # normalised numbers are clipped to +-5 standard deviations
# An integer column whose training values span at most LEVELS_SPAN consecutive whole numbers, with at
# least ROWS_PER_LEVEL training rows a number on average, is also read as a category (IntLevels and
# an embedding), beside its quantile bins: a day of the year, of the month or of the week, a month,
# a year. A bin spans many such numbers, and one number can differ from its neighbours (a holiday's
# births; measured in docs/benchmarks.md, "Real tables: the second gallery").
LEVELS_SPAN, ROWS_PER_LEVEL = 400, 8
# Quantile bins narrower than this (in standard deviations of the normalised number) are merged
# with the next: a bin's 1/width stays a float16 constant, and ties of a discrete column's
# quantiles make no empty bins.
MIN_BIN = 0.01


def float16_terms(value: float, n: int = 3) -> list[float]:
    """`value` as a sum of `n` float16 numbers, each exact in half precision (|value| <= 1
    keeps them in float16's range); the sum is exact to about 33 bits."""
    terms = []
    for _ in range(n):
        term = float(np.float16(value))
        terms.append(term)
        value -= term
    return terms


@keras.saving.register_keras_serializable(package="tfpipe")
class ImputeNormalize(layers.Layer):
    """(x - mean) / std, with NaN (missing) imputed as the mean, i.e. 0; adds a 0/1 'was
    missing' column when the feature is nullable, so the model can tell an imputed value
    from a real one. With `clip`, z is limited to +-clip: a value far outside what training
    saw (a fare of 700 where the mean is 12, an ID-like number) cannot swamp the layers
    after it, and an int8 TFLite model gets a fixed, fine-grained range for its features.

    Every constant is exact in float16, so a float16 TFLite conversion (which stores
    constants in half precision) keeps features like Unix timestamps (~1.4e9, beyond
    float16's 65504) intact: x is scaled by powers of two (exact), the scaled mean is
    subtracted as a sum of float16 residuals, and 1/std is a product of float16 factors.
    The arithmetic itself is float32.

    With `log1p`, x is first taken as log(1 + x) (negatives as 0), and `mean` and `variance` are
    those of log(1 + x) in training: a heavy-tailed column (spending, counts, durations: most
    values small, a few huge) is then spread out where its values are, rather than crushed
    into a sliver of z by the few huge ones.

    With `knots` (z at the training split's minimum, quantiles and maximum, increasing: see
    quantile_knots), z is not the output: each bin between two knots gives a column,
    (z - low) / (high - low) held to [0, 1], the piecewise-linear encoding of Gorishniy et
    al. (2022): 0 below the bin, 1 above it. The network then sees where a value falls among
    the training values, in as many pieces as there are bins, whatever the column's
    distribution; a value beyond the training range reads as the nearest end of it (no
    extrapolation past what training saw, as trees do)."""

    def __init__(self, mean: float, variance: float, flag_missing: bool, clip: float | None = None,
                 log1p: bool = False, knots: list[float] | None = None, **kwargs):
        super().__init__(**kwargs)
        self.mean = float(mean)
        self.variance = float(variance)
        self.flag_missing = bool(flag_missing)
        self.clip = float(clip) if clip else None  # None in models saved before clipping existed
        self.log1p = bool(log1p)
        self.knots = [float(k) for k in knots] if knots and len(knots) > 1 else None
        std = math.sqrt(max(self.variance, 1e-12))
        self._exponent = max(0, math.ceil(math.log2(max(abs(self.mean), std, 1.0))))
        self._terms = float16_terms(self.mean / 2.0 ** self._exponent)
        # 1/std of the scaled values is >= 1 (the exponent covers std); split it into exact
        # powers of two and a float16 remainder, none beyond float16's range.
        inverse = 2.0 ** self._exponent / std
        self._factors = []
        while inverse > 2.0 ** 15:
            self._factors.append(2.0 ** 15)
            inverse /= 2.0 ** 15
        self._factors.append(float(np.float16(inverse)))

    def constants(self) -> tuple[list[float], list[float], list[float]]:
        """z = ((x * steps...) - terms...) * factors...: the chain `call` computes, every
        constant exact in float16 (export.tflite runs several features' chains as one)."""
        steps = [2.0 ** -14] * (self._exponent // 14) + [2.0 ** -(self._exponent % 14)]
        return steps, list(self._terms), list(self._factors)

    def call(self, x):
        x = ops.cast(x, "float32")
        missing = ops.isnan(x)
        if self.log1p:
            x = ops.log(1.0 + ops.maximum(ops.where(missing, 0.0, x), 0.0))
        z = x
        steps, terms, factors = self.constants()
        for step in steps:
            z = z * step
        for term in terms:
            z = z - term
        for factor in factors:
            z = z * factor
        if self.knots:
            low, inverse = self.bins()
            z = ops.expand_dims(ops.where(missing, 0.0, z), -1)
            columns = ops.clip((z - low) * inverse, 0.0, 1.0)
            columns = ops.where(ops.expand_dims(missing, -1), 0.0, columns)
            if self.flag_missing:
                columns = ops.concatenate([columns, ops.expand_dims(ops.cast(missing, "float32"), -1)], axis=-1)
            return columns
        z = ops.where(missing, 0.0, z)
        if self.clip:
            z = ops.clip(z, -self.clip, self.clip)
        columns = [z]
        if self.flag_missing:
            columns.append(ops.cast(missing, "float32"))
        return ops.stack(columns, axis=-1)

    def bins(self) -> tuple[np.ndarray, np.ndarray]:
        """Each bin's low knot and 1/width, as float32 vectors (empty without knots)."""
        k = np.array(self.knots or [], dtype=np.float64)
        return k[:-1].astype(np.float32), (1.0 / np.diff(k)).astype(np.float32)

    @property
    def width(self) -> int:
        """Output columns: one z (or one per bin), and the 'was missing' flag if nullable."""
        return (len(self.knots) - 1 if self.knots else 1) + self.flag_missing

    def compute_output_shape(self, input_shape):
        return (*input_shape, self.width)

    def get_config(self):
        return {**super().get_config(), "mean": self.mean, "variance": self.variance,
                "flag_missing": self.flag_missing, "clip": self.clip, "log1p": self.log1p, "knots": self.knots}


@keras.saving.register_keras_serializable(package="tfpipe")
class IntLevels(layers.Layer):
    """A whole number in [low, high] -> its level, 1 + (x - low); 0 for a missing value (NaN), a
    number outside the range and a fraction: int32, for an Embedding of high - low + 2 rows. The
    arithmetic is float32, exact for the ranges `int_levels` allows (within 2**24), so a TFLite
    model, which takes numbers as float32, computes the same levels."""

    def __init__(self, low: int, high: int, **kwargs):
        super().__init__(**kwargs)
        self.low, self.high = int(low), int(high)

    @property
    def depth(self) -> int:
        return self.high - self.low + 2

    def call(self, x):
        x = ops.cast(x, "float32")
        valid = (x >= float(self.low)) & (x <= float(self.high)) & ops.equal(ops.floor(x), x)  # NaN: False
        return ops.cast(ops.where(valid, x - float(self.low - 1), 0.0), "int32")

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "low": self.low, "high": self.high}


def int_levels(stats: dict[str, Any]) -> tuple[int, int] | None:
    """(low, high) when an int column's training values are few enough consecutive whole numbers,
    each seen often enough, to be read as categories too (see LEVELS_SPAN); else None. Each number
    is seen often enough when they are about evenly spread: every quantile within a tenth of the
    range (or half a number) of where an even spread puts it. A count (mostly 0, a few large) is not."""
    low, high, count = stats.get("min"), stats.get("max"), stats.get("count") or 0
    if low is None or high is None or abs(low) >= 2**24 or abs(high) >= 2**24:
        return None
    span = int(high) - int(low) + 1
    if span < 3 or span > LEVELS_SPAN or count < ROWS_PER_LEVEL * span:
        return None
    quantiles = stats.get("quantiles") or {}
    if not quantiles:
        return None
    slack = max(0.5, 0.1 * (high - low))
    if any(v is None or abs(v - (low + float(q) * (high - low))) > slack for q, v in quantiles.items()):
        return None
    return int(low), int(high)


def quantile_knots(stats: dict[str, Any], mean: float, variance: float, log1p: bool) -> list[float] | None:
    """The knots of a number's quantile bins, in the z of ImputeNormalize(mean, variance, log1p):
    the training split's minimum, its quantiles (stats.json: 1st to 99th percentile) and its
    maximum, with knots closer than MIN_BIN to the last one kept left out. None when fewer
    than two remain (a constant column)."""
    values = [stats.get("min")] + [v for _, v in sorted((stats.get("quantiles") or {}).items(),
                                                        key=lambda kv: float(kv[0]))] + [stats.get("max")]
    values = np.array([v for v in values if v is not None], dtype=np.float64)
    if log1p:
        values = np.log1p(np.maximum(values, 0.0))
    z = np.sort((values - mean) / math.sqrt(max(variance, 1e-12)))
    knots: list[float] = []
    for v in z:
        if not knots or v - knots[-1] >= MIN_BIN:
            knots.append(float(v))
    return knots if len(knots) > 1 else None


@keras.saving.register_keras_serializable(package="tfpipe")
class Denormalize(layers.Layer):
    """A regression's prediction from standard units back to the label's: z * std + mean (then
    exp(.) - 1 with `log`, for a label learnt as log(1 + y)). Given an ensemble's predictions,
    (batch, members), it answers their mean in standard units, so taken back the same way.

    The network learns the label standardised (mean 0, variance 1 over the training split), so
    its weights and loss are of order 1 whatever the label's size; this layer, after the
    trainer, makes the saved model answer in the label's units. Every constant is exact in
    float16 (a float16 TFLite variant stores constants in half precision, whose largest value
    is 65504; a price of 500,000 would be inf): z * (std / 2**e) as a sum of two products by
    float16 numbers, plus mean / 2**e as float16 terms, all times 2**e in exact powers of two."""

    def __init__(self, mean: float, std: float, log: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.mean, self.std, self.log = float(mean), float(std), bool(log)
        self._exponent = max(0, math.ceil(math.log2(max(abs(self.mean), self.std, 1.0))))
        ratio = self.std / 2.0 ** self._exponent  # in (0, 1]
        self._shrink = []
        while ratio < 2.0 ** -14:  # below float16's normal range: take exact powers of two out
            self._shrink.append(2.0 ** -14)
            ratio /= 2.0 ** -14
        self._scales = float16_terms(ratio, 2)  # z * ratio as z * a + z * b: 22 bits of std
        self._terms = float16_terms(self.mean / 2.0 ** self._exponent)
        self._steps = [2.0 ** 14] * (self._exponent // 14) + [2.0 ** (self._exponent % 14)]

    def call(self, z):
        z = ops.cast(z, "float32")
        if len(z.shape) == 2:  # an ensemble's members, one a column (see _members): their mean
            z = ops.mean(z, axis=-1)
        for factor in self._shrink:
            z = z * factor
        y = z * self._scales[0]
        for scale in self._scales[1:]:
            y = y + z * scale
        for term in self._terms:
            y = y + term
        for step in self._steps:
            y = y * step
        # exp(y) - 1 rather than expm1, which TFLite's builtin ops lack
        return ops.exp(y) - 1.0 if self.log else y

    def compute_output_shape(self, input_shape):
        return input_shape[:1]

    def get_config(self):
        return {**super().get_config(), "mean": self.mean, "std": self.std, "log": self.log}


# A regression label is learnt in log scale when it never goes below 0 and its upper spread
# (median to 99th percentile) is at least this many times its lower one: prices, salaries, counts.
LABEL_SKEW = 2.0


@dataclass(frozen=True)
class LabelScale:
    """How a regression's trainer sees the label: (y - mean) / std, of log(1 + y) when `log`."""

    mean: float
    std: float
    log: bool = False

    def to_label(self, z):
        """The trainer's units back to the label's (Keras ops): z * std + mean, then exp(.) - 1."""
        y = z * self.std + self.mean
        return ops.exp(y) - 1.0 if self.log else y


def long_right_tail(stats: dict[str, Any], ratio: float) -> bool:
    """Whether a number's statistics (stats.json) show it never below 0 (they hold its log1p
    moments) with an upper spread, median to 99th percentile, at least `ratio` times its lower
    one, 1st percentile to median."""
    q = stats.get("quantiles") or {}
    low, mid, high = q.get("0.01"), q.get("0.5"), q.get("0.99")
    if not stats.get("log1p") or None in (low, mid, high) or high <= mid:
        return False
    return (high - mid) >= ratio * (mid - low)


def skewed_label(label: dict[str, Any]) -> bool:
    """Whether a regression label's training statistics call for a log-scale target."""
    return long_right_tail(label, LABEL_SKEW)


def label_scale(train_stats: dict[str, Any], target: str = "auto", ensemble: int = 1) -> LabelScale:
    """A regression label's scale over the training split: its mean and std (std 1 when it does
    not vary), or those of log(1 + y) for a skewed label learnt by one network (`target` auto)
    or when told (log). An ensemble (see _members) learns a skewed label in its own scale too:
    the log target's answer, exp of a mean log, falls below the mean that a squared error
    rewards, and the ensemble's mean steadies what the label's scale leaves noisier in one
    network."""
    label = train_stats["label"]
    log = target == "log" or (target == "auto" and ensemble == 1 and skewed_label(label))
    if log and label.get("log1p"):
        moments = label["log1p"]
        return LabelScale(float(moments["mean"]), math.sqrt(moments["variance"]) or 1.0, True)
    return LabelScale(float(label.get("mean") or 0.0), float(label.get("std") or 1.0))


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


class _EachMember:
    """A regression loss that takes an ensemble's (batch, members) predictions (see _members)
    with the (batch,) label: the label is broadcast over the members and their losses averaged,
    so each member learns from its own error (the loss of their mean would train them as one
    network). One network's (batch,) predictions are taken as they are."""

    def call(self, y_true, y_pred):
        if len(y_pred.shape) == len(y_true.shape) + 1 and y_pred.shape[-1] != 1:
            y_true = ops.expand_dims(y_true, -1)
        return super().call(y_true, y_pred)


@keras.saving.register_keras_serializable(package="tfpipe")
class SquaredError(_EachMember, keras.losses.MeanSquaredError):
    """Mean squared error, of one network or each member of an ensemble (see _EachMember)."""


def make_loss(task: str, reduction: str | None = "sum_over_batch_size") -> keras.losses.Loss:
    """The task's loss; a regression's, mean squared error, of one network or of each member of
    an ensemble (see _EachMember)."""
    cls = {"binary": keras.losses.BinaryCrossentropy, "multiclass": keras.losses.SparseCategoricalCrossentropy,
           "regression": SquaredError}[task]
    return cls(reduction=reduction)


def members_mean(y_pred):
    """A regression trainer's prediction: an ensemble's (batch, members) as their mean (what the
    model answers, see Denormalize), a single network's as it is."""
    return ops.mean(y_pred, axis=-1) if len(y_pred.shape) == 2 else y_pred


@keras.saving.register_keras_serializable(package="tfpipe")
class ScaledMAE(keras.metrics.Mean):
    """Mean absolute error per example in the label's units, of a trainer that predicts the label
    in standard units (`scale`'s mean and std, of log(1 + y) when `log`)."""

    def __init__(self, std: float = 1.0, mean: float = 0.0, log: bool = False, name: str = "mae", **kwargs):
        super().__init__(name=name, **kwargs)
        self.scale = LabelScale(float(mean), float(std), bool(log))

    def update_state(self, y_true, y_pred, sample_weight=None):
        t, p = (self.scale.to_label(ops.cast(v, "float32")) for v in (y_true, members_mean(y_pred)))
        return super().update_state(ops.abs(t - p), sample_weight=sample_weight)

    def get_config(self):
        return {**super().get_config(), "std": self.scale.std, "mean": self.scale.mean, "log": self.scale.log}


@keras.saving.register_keras_serializable(package="tfpipe")
class ScaledRMSE(keras.metrics.RootMeanSquaredError):
    """RMSE in the label's units, of a trainer that predicts it in standard units (see ScaledMAE)."""

    def __init__(self, std: float = 1.0, mean: float = 0.0, log: bool = False, name: str = "rmse", **kwargs):
        super().__init__(name=name, **kwargs)
        self.scale = LabelScale(float(mean), float(std), bool(log))

    def update_state(self, y_true, y_pred, sample_weight=None):
        t, p = (self.scale.to_label(ops.cast(v, "float32")) for v in (y_true, members_mean(y_pred)))
        return super().update_state(t, p, sample_weight=sample_weight)

    def get_config(self):
        return {**super().get_config(), "std": self.scale.std, "mean": self.scale.mean, "log": self.scale.log}


def loss_and_metrics(task: str, scale: LabelScale | None = None):
    """The loss and the metrics reported for a task. A regression's trainer learns the label in
    standard units (`scale`, see label_scale): the loss stays in those units, MAE and RMSE are
    given in the label's. MAE is taken per example: Keras's MeanAbsoluteError reduces 1-D
    predictions over their last axis, the batch, first, and reported about half the true MAE on
    a table of house prices."""
    if task == "binary":
        metrics = [keras.metrics.BinaryAccuracy(name="accuracy"), keras.metrics.AUC(name="auc")]
    elif task == "multiclass":
        metrics = [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
    else:
        scale = scale or LabelScale(0.0, 1.0)
        metrics = [ScaledMAE(scale.std, scale.mean, scale.log), ScaledRMSE(scale.std, scale.mean, scale.log)]
    return make_loss(task), metrics


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
