"""The preprocessing layers a tabular model holds and is saved with (registered with Keras, so that
`keras.models.load_model` of a model.keras finds them once this module is imported): a number's
imputation, normalisation and quantile bins (`ImputeNormalize`, `quantile_knots`), a few whole
numbers read as categories (`IntLevels`, `int_levels`), and a regression's last layer back to the
label's units (`Denormalize`). model.py builds the model of them."""

from __future__ import annotations

import math
from typing import Any

import keras
import numpy as np
from keras import layers, ops


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
        if len(z.shape) == 2:  # an ensemble's members, one a column (see model.py's _members): their mean
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
