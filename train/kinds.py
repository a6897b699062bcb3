"""Preprocessing of the string features that are not categories: dates and free text.

Both take the raw string a client sends (the value as it is in the user's file), so the
served model parses dates and splits text itself:

  date: ParseDate (ISO-8601 text -> seconds since the epoch, NaN when missing or not a date)
        -> DateFeatures (the seconds normalised, a missing flag, and one-hot hour, weekday and
        month where the training split's dates vary in them)
  text: TextVectorization with the data stage's vocabulary and document frequencies (TF-IDF),
        scaled to unit length
"""

from __future__ import annotations

import math
from typing import Any

import keras
import tensorflow as tf
from keras import layers

from tfpipe.pipeline.dates import ISO_PATTERN

# The form ParseDate brings every valid date to: YYYY-MM-DDTHH:MM:SS+HH:MM (or -HH:MM).
_NORMALISE = (
    (r"^(\d{4}-\d{2}-\d{2})$", r"\1T00:00:00Z"),                              # a date alone
    (r"^(\d{4}-\d{2}-\d{2}) ", r"\1T"),                                       # space for T
    (r"^(.{10}T\d{2}:\d{2})(Z|[+-]\d{2}:?\d{2})?$", r"\1:00\2"),              # no seconds
    (r"^(.{19})\.\d+", r"\1"),                                                # fraction dropped
    (r"^(.{19})$", r"\1Z"),                                                   # no zone: UTC
    (r"^(.{19}[+-]\d{2})(\d{2})$", r"\1:\2"),                                 # +HHMM as +HH:MM
    (r"^(.{19})Z$", r"\1+00:00"),                                              # Z as +00:00
)


@keras.saving.register_keras_serializable(package="tfpipe")
class ParseDate(layers.Layer):
    """ISO-8601 text -> float64 seconds since 1970-01-01T00:00:00Z (a time without an offset is
    UTC; a fraction of a second is dropped), by the rules of `pipeline.dates`; NaN for an empty
    value (missing). Any other value that is not a date (`hello`, `25/12/1988`, a day the month
    does not have) fails the call with InvalidArgumentError naming `column`: the data stage
    dead-letters such a row, so no model learned from one, and a server answers it 400
    (INVALID_ARGUMENT) rather than a guess."""

    def __init__(self, column: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.column = column

    def get_config(self):
        return {**super().get_config(), "column": self.column}

    def call(self, x):
        s = tf.strings.strip(x)
        ok = tf.strings.regex_full_match(s, ISO_PATTERN)
        empty = tf.equal(s, "")
        for pattern, replacement in _NORMALISE:
            s = tf.strings.regex_replace(s, pattern, replacement)
        s = tf.where(ok, s, "1970-01-01T00:00:00+00:00")

        def num(start, length):
            return tf.strings.to_number(tf.strings.substr(s, start, length), tf.int64)

        year, month, day = num(0, 4), num(5, 2), num(8, 2)
        hour, minute, second = num(11, 2), num(14, 2), num(17, 2)
        sign = tf.where(tf.strings.substr(s, 19, 1) == "-", tf.constant(-1, tf.int64), 1)
        offset = sign * (num(20, 2) * 3600 + num(23, 2) * 60)
        first = days_from_civil(year, month, tf.ones_like(day))
        length = days_from_civil(year + month // 12, month % 12 + 1, tf.ones_like(day)) - first  # days in the month
        ok &= (month >= 1) & (month <= 12) & (day >= 1) & (day <= length) & (hour <= 23) & (minute <= 59) & (second <= 59)
        seconds = (first + day - 1) * 86400 + hour * 3600 + minute * 60 + second - offset
        bad = ~ok & ~empty
        what = (f"the input `{self.column or self.name}` holds a value that is not an ISO-8601 date or time "
                "(YYYY-MM-DD, YYYY-MM-DD HH:MM[:SS], with an optional offset), as the training data held; send an "
                "empty value for a missing one:")
        check = tf.debugging.Assert(~tf.reduce_any(bad), [what, tf.boolean_mask(x, bad)[:3]], summarize=3)
        with tf.control_dependencies([check]):
            return tf.where(ok, tf.cast(seconds, tf.float64), tf.constant(math.nan, tf.float64))

    def compute_output_shape(self, input_shape):
        return input_shape


def days_from_civil(year, month, day):
    """Days since 1970-01-01, in int64 tensor arithmetic (pipeline.dates.days_from_civil)."""
    y = year - tf.cast(month <= 2, tf.int64)
    era = tf.math.floordiv(y, 400)
    yoe = y - era * 400
    mp = tf.where(month > 2, month - 3, month + 9)
    doy = tf.math.floordiv(153 * mp + 2, 5) + day - 1
    doe = yoe * 365 + tf.math.floordiv(yoe, 4) - tf.math.floordiv(yoe, 100) + doy
    return era * 146097 + doe - 719468


def _month(days):
    """Month 1-12 of a day since the epoch (the inverse of days_from_civil)."""
    z = days + 719468
    era = tf.math.floordiv(z, 146097)
    doe = z - era * 146097
    yoe = tf.math.floordiv(doe - tf.math.floordiv(doe, 1460) + tf.math.floordiv(doe, 36524)
                           - tf.math.floordiv(doe, 146096), 365)
    doy = doe - (365 * yoe + tf.math.floordiv(yoe, 4) - tf.math.floordiv(yoe, 100))
    mp = tf.math.floordiv(5 * doy + 2, 153)
    return tf.where(mp < 10, mp + 3, mp - 9)


@keras.saving.register_keras_serializable(package="tfpipe")
class DateFeatures(layers.Layer):
    """Seconds since the epoch -> [z, missing, hour one-hot, weekday one-hot, month one-hot]: z is
    the seconds normalised by the training split's mean and std and clipped to +-`clip` (0 when
    missing); each one-hot part is there only when `parts` names it (where training varied), and
    is all zeros for a missing date."""

    def __init__(self, mean: float, std: float, parts: list[str], clip: float = 5.0, **kwargs):
        super().__init__(**kwargs)
        self.mean, self.std, self.parts, self.clip = float(mean), float(std) or 1.0, list(parts), float(clip)

    def call(self, seconds):
        seconds = tf.cast(seconds, tf.float64)
        missing = tf.math.is_nan(seconds)
        filled = tf.where(missing, tf.constant(self.mean, tf.float64), seconds)
        z = tf.clip_by_value((filled - self.mean) / self.std, -self.clip, self.clip)
        columns = [tf.cast(z, tf.float32)[:, None], tf.cast(missing, tf.float32)[:, None]]
        present = tf.cast(~missing, tf.float32)[:, None]
        days = tf.cast(tf.math.floor(filled / 86400.0), tf.int64)
        values = {"hour": (tf.cast(tf.math.floor((filled - tf.cast(days, tf.float64) * 86400.0) / 3600.0), tf.int64), 24),
                  "weekday": (tf.math.floormod(days + 3, 7), 7),
                  "month": (_month(days) - 1, 12)}
        for part in self.parts:
            index, depth = values[part]
            columns.append(tf.one_hot(index, depth, dtype=tf.float32) * present)
        return tf.concat(columns, axis=-1)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], 2 + sum({"hour": 24, "weekday": 7, "month": 12}[p] for p in self.parts))

    def get_config(self):
        return {**super().get_config(), "mean": self.mean, "std": self.std, "parts": self.parts, "clip": self.clip}


def date_parts(stats: dict[str, Any]) -> list[str]:
    """The calendar parts in which the training split's dates vary."""
    return [part for part, key in (("hour", "hours"), ("weekday", "weekdays"), ("month", "months"))
            if len(stats.get(key) or []) > 1]


def date_layers(x, stats: dict[str, Any], name: str, column: str | None = None):
    """A date feature's preprocessing on the string input `x`; `name` is its graph name, `column`
    its own (the one a client sends, named when a value is not a date)."""
    seconds = ParseDate(column=column, name=f"parse_{name}")(x)
    std = stats.get("std") or 1.0
    return DateFeatures(stats["mean"], std, date_parts(stats), dtype="float32", name=f"date_{name}")(seconds)


def text_layers(x, stats: dict[str, Any], name: str):
    """A free-text feature's preprocessing on the string input `x`: TF-IDF over the training
    split's most frequent words (`stats`: the data stage's TextStats), at unit length. None when
    the training split has no word."""
    top = [(str(w), df) for w, df in stats.get("top") or [] if str(w)]
    if not top:
        return None
    documents = max(1, int(stats.get("documents") or stats.get("count") or 1))
    vocabulary = [w for w, _ in top]
    idf = [math.log(1.0 + documents / (1.0 + df)) for _, df in top]
    vectorize = layers.TextVectorization(vocabulary=vocabulary, idf_weights=idf, output_mode="tf_idf",
                                         name=f"text_{name}")
    return layers.UnitNormalization(axis=-1, dtype="float32", name=f"unit_{name}")(vectorize(x))
