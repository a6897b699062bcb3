"""Per-split feature statistics as a Beam CombineFn over batches of columns.

Numeric features: count, missing, exact mean and variance, min, max and approximate quantiles;
string features: value counts, bounded so memory does not grow with the number of distinct
values. The label: the class distribution for classification, numeric stats otherwise.

Every statistic is a function of the multiset of values a split holds, not of how the runner
cut it into batches and work units nor of the order it merges them in: the same input gives
byte-identical stats.json on any runner, at any parallelism and shard count. Sums are exact
(integers, rounded once at the end), the quantile sketch is a histogram whose resolution is
decided by the data alone, and a table of values that outgrows its bound keeps the values a
hash picks, not those that happened to come first.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections import Counter
from typing import Any, Iterable

import apache_beam as beam
import numpy as np

from tfpipe.pipeline.dates import months_of_days, parse_seconds
from tfpipe.pipeline.validation import Column
from tfpipe.pipeline.text import words
from tfpipe.pipeline.schema import Schema

QUANTILES = (0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99)

# ---- exact sums ----------------------------------------------------------------------------------

# Every finite double is an integer multiple of 2**-1074; a mantissa of 53 bits at that place
# needs 52 more, so sum * 2**SCALE is an integer for any finite values.
SCALE = 1126
_BINCOUNT_ROWS = 1 << 25  # float64 bincounts of 27-bit integers stay exact below 2**53


def exact_sum(values: np.ndarray) -> int:
    """The exact sum of float64 values times 2**SCALE, as an integer."""
    x = np.asarray(values, dtype=np.float64).ravel()
    fraction, exponent = np.frexp(x)
    mantissa = (fraction * 2.0**53).astype(np.int64)  # exact: |fraction| < 1 has 53 bits
    keep = mantissa != 0
    mantissa, exponent = mantissa[keep], exponent[keep]
    total = 0
    for start in range(0, len(mantissa), _BINCOUNT_ROWS):
        m, e = mantissa[start:start + _BINCOUNT_ROWS], exponent[start:start + _BINCOUNT_ROWS]
        high = m >> 26
        low = m - (high << 26)  # 0 <= low < 2**26, |high| < 2**27
        base = int(e.min())
        highs = np.bincount(e - base, weights=high)
        lows = np.bincount(e - base, weights=low)
        for i in np.flatnonzero((highs != 0) | (lows != 0)).tolist():
            # value = mantissa * 2**(e - 53); times 2**SCALE: mantissa * 2**(e + 1073), e >= -1073
            total += ((int(highs[i]) << 26) + int(lows[i])) << (base + i + SCALE - 53)
    return total


def exact_sum_of_squares(values: np.ndarray) -> int:
    """The exact sum of the squares of float64 values times 2**(2 * SCALE), as an integer.

    Each square is the exact sum of three doubles (Veltkamp's split into 26-bit halves, whose
    products are exact); magnitudes where that split could overflow or underflow are squared
    as Python integers instead."""
    x = np.asarray(values, dtype=np.float64).ravel()
    size = np.abs(x)
    plain = (size == 0) | ((size >= 2.0**-400) & (size <= 2.0**500))
    y = x[plain]
    t = y * 134217729.0  # 2**27 + 1
    high = t - (t - y)
    low = y - high
    total = (exact_sum(high * high) + exact_sum(2.0 * high * low) + exact_sum(low * low)) << SCALE
    for v in x[~plain].tolist():
        n, d = v.as_integer_ratio()
        total += (n * n << 2 * SCALE) // (d * d)
    return total


def log1p(values: np.ndarray) -> np.ndarray:
    """log(1 + x) by the C library, one value at a time: numpy's vectorised log1p may round the
    last bit differently from one numpy release or processor to another, and these moments
    must be the same wherever the job runs."""
    return np.fromiter(map(math.log1p, values.tolist()), dtype=np.float64, count=len(values))


class Moments:
    """Count, mean and variance from exact sums: the same result however the values were batched
    and in whatever order the parts were merged (the correctly rounded mean and variance)."""

    def __init__(self) -> None:
        self.count, self.sum, self.sum_sq = 0, 0, 0  # sums scaled by 2**SCALE and 2**(2 * SCALE)

    def add(self, values: np.ndarray) -> None:
        if len(values):
            self.count += len(values)
            self.sum += exact_sum(values)
            self.sum_sq += exact_sum_of_squares(values)

    def merge(self, other: "Moments") -> None:
        self.count += other.count
        self.sum += other.sum
        self.sum_sq += other.sum_sq

    @property
    def mean(self) -> float:
        return self.sum / (self.count << SCALE) if self.count else 0.0

    @property
    def variance(self) -> float:
        n = self.count
        try:
            return (n * self.sum_sq - self.sum * self.sum) / (n * n << 2 * SCALE) if n else 0.0
        except OverflowError:  # values near the largest double: a spread past it
            return math.inf

    def result(self) -> dict[str, float] | None:
        return {"mean": self.mean, "variance": self.variance} if self.count else None


# ---- quantiles -----------------------------------------------------------------------------------

_SIGN = np.int64(0x7FFFFFFFFFFFFFFF)


def _ordered(values: np.ndarray) -> np.ndarray:
    """Integers in the order of the float64 values: bit patterns, negatives reflected below zero."""
    bits = (np.asarray(values, dtype=np.float64) + 0.0).view(np.int64)  # + 0.0: -0.0 becomes 0.0
    return np.where(bits < 0, -(bits & _SIGN) - 1, bits)


class QuantileSketch:
    """A histogram over the values' bit patterns, each bin with its count and its smallest and
    largest value: a value's bin is its ordered bit pattern shifted right by `shift`, so bins
    are contiguous ranges, a bin spans the same relative width at every magnitude, and one more
    shift merges neighbouring bins exactly. `shift` is the least that keeps at most `bins` bins,
    which depends only on the values seen: adding or merging in any grouping or order ends in
    the same histogram. With few distinct values (fewer than `bins`) every bin holds one value
    and the quantiles are exact; the relative width of a bin is 2**(shift - 52).

    A quantile is the value at rank ceil(q * n), as numpy's inverted_cdf: exact at a bin's
    first and last rank (its smallest and largest value), interpolated by rank inside it.
    """

    def __init__(self, bins: int = 4096):
        self.bins = bins
        self.shift = 0
        self.keys = np.zeros(0, np.int64)
        self.counts = np.zeros(0, np.int64)
        self.lows = np.zeros(0)
        self.highs = np.zeros(0)

    @property
    def count(self) -> int:
        return int(self.counts.sum())

    def add(self, values: np.ndarray) -> None:
        values = np.asarray(values, dtype=np.float64)
        if len(values):
            self._absorb(self.shift, _ordered(values) >> self.shift, np.ones(len(values), np.int64), values, values)

    def merge(self, other: "QuantileSketch") -> None:
        if len(other.keys):
            self._absorb(other.shift, other.keys, other.counts, other.lows, other.highs)

    def _absorb(self, shift: int, keys, counts, lows, highs) -> None:
        if shift > self.shift:
            self.keys >>= shift - self.shift
            self.shift = shift
        keys = keys >> (self.shift - shift)
        self._set(np.concatenate([self.keys, keys]), np.concatenate([self.counts, counts]),
                  np.concatenate([self.lows, lows]), np.concatenate([self.highs, highs]))
        while len(self.keys) > self.bins:
            self.shift += 1
            self._set(self.keys >> 1, self.counts, self.lows, self.highs)

    def _set(self, keys, counts, lows, highs) -> None:
        """Bins of equal key added up (their counts) and spanned (their smallest and largest value)."""
        order = np.argsort(keys, kind="stable")
        keys = keys[order]
        starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]])) if len(keys) else np.zeros(0, int)
        self.keys = keys[starts]
        self.counts = np.add.reduceat(counts[order], starts) if len(keys) else counts[:0]
        self.lows = np.minimum.reduceat(lows[order], starts) if len(keys) else lows[:0]
        self.highs = np.maximum.reduceat(highs[order], starts) if len(keys) else highs[:0]

    def quantiles(self, qs: tuple[float, ...]) -> list[float | None]:
        if not len(self.keys):
            return [None] * len(qs)
        cum = np.cumsum(self.counts)
        total = int(cum[-1])
        out = []
        for q in qs:
            rank = max(1, math.ceil(q * total))  # 1-based rank of the answer
            i = int(np.searchsorted(cum, rank, side="left"))
            first = int(cum[i] - self.counts[i]) + 1  # the bin's first rank
            last = int(cum[i])
            low, high = float(self.lows[i]), float(self.highs[i])
            if rank == first or low == high:
                out.append(low)
            elif rank == last:
                out.append(high)
            else:
                out.append(low + (high - low) * ((rank - first) / (last - first)))
        return out


class NumericStats:
    def __init__(self) -> None:
        self.moments = Moments()
        self.missing = 0
        self.min = np.inf
        self.max = -np.inf
        self.sketch = QuantileSketch()
        # log(1 + x) moments, for a column that never goes below 0: what a heavy-tailed
        # column (spending, counts, durations) is normalised by in the model
        self.log1p = Moments()

    @property
    def count(self) -> int:
        return self.moments.count

    def add(self, col: Column) -> None:
        values = col.values[col.present].astype(np.float64)
        self.missing += int(len(col.present) - len(values))
        if len(values):
            self.moments.add(values)
            self.min = min(self.min, float(values.min()))
            self.max = max(self.max, float(values.max()))
            self.sketch.add(values)
            if self.min >= 0:
                self.log1p.add(log1p(values))

    def merge(self, other: "NumericStats") -> None:
        self.missing += other.missing
        if other.count:
            self.moments.merge(other.moments)
            self.min = min(self.min, other.min)
            self.max = max(self.max, other.max)
            self.sketch.merge(other.sketch)
            self.log1p.merge(other.log1p)

    def result(self) -> dict[str, Any]:
        empty = self.count == 0
        variance = None if empty else self.moments.variance
        return {
            "kind": "numeric",
            "count": self.count,
            "missing": self.missing,
            "mean": None if empty else self.moments.mean,
            "variance": variance,
            "std": None if empty else float(np.sqrt(variance)),
            "min": None if empty else self.min,
            "max": None if empty else self.max,
            "quantiles": dict(zip((f"{q:g}" for q in QUANTILES), self.sketch.quantiles(QUANTILES))),
            "log1p": self.log1p.result() if not empty and self.min >= 0 else None,
        }


@functools.lru_cache(maxsize=1 << 18)
def _level(value) -> int:
    """A value's sampling level: the trailing zero bits of a stable hash of its text, so that a
    value is at level L or above with probability 2**-L, the same in every process and release."""
    h = int.from_bytes(hashlib.blake2b(str(value).encode("utf-8"), digest_size=8).digest(), "little")
    return (h & -h).bit_length() - 1 if h else 64


class StringStats:
    """Value counts, exact while the split has at most `table` distinct values (by default
    twice the bound, and at least 2**17). Past that the table keeps the values whose hash level
    reaches the least level that fits, each with its exact count: which values are kept depends
    on the values alone, not on the order they came in, and `unique_is_lower_bound` says so."""

    def __init__(self, bound: int, table: int | None = None) -> None:
        self.count = 0
        self.missing = 0
        self.counts: Counter = Counter()
        self.bound = bound
        self.table = table or max(2 * bound, 1 << 17)
        self.level = 0  # values below this hash level are not counted

    def add(self, col: Column) -> None:
        values = col.values[col.present]
        self.missing += int(len(col.present) - len(values))
        self.count += len(values)
        self._count(values.tolist())

    def _count(self, values: Iterable) -> None:
        if self.level:
            values = [v for v in values if _level(v) >= self.level]
        self.counts.update(values)
        self._fit()

    def merge(self, other: "StringStats") -> None:
        self.count += other.count
        self.missing += other.missing
        if other.level > self.level:
            self._raise(other.level)
        self.counts.update(other.counts if other.level >= self.level else
                           {v: c for v, c in other.counts.items() if _level(v) >= self.level})
        self._fit()

    def _fit(self) -> None:
        level = self.level
        while len(self.counts) > self.table:
            level += 1
            kept = sum(1 for v in self.counts if _level(v) >= level)
            if kept <= self.table:
                break
        if level != self.level:
            self._raise(level)

    def _raise(self, level: int) -> None:
        self.level = level
        self.counts = Counter({v: c for v, c in self.counts.items() if _level(v) >= level})

    def result(self, top_k: int) -> dict[str, Any]:
        top = sorted(self.counts.items(), key=lambda kv: (-kv[1], str(kv[0])))
        return {
            "kind": "categorical",
            "count": self.count,
            "missing": self.missing,
            "unique": len(self.counts),
            "unique_is_lower_bound": self.level > 0,
            "top": [[v, c] for v, c in top[:top_k]],
        }


class DateStats:
    """A date column: numeric statistics of its seconds since the epoch, and which hours,
    weekdays and months occur (the model adds each of them as a feature only where it varies)."""

    def __init__(self) -> None:
        self.seconds = NumericStats()
        self.hours: set[int] = set()
        self.weekdays: set[int] = set()
        self.months: set[int] = set()

    def add(self, col: Column) -> None:
        values = col.values[col.present]
        seconds = np.array([parse_seconds(str(v)) for v in values], dtype=np.float64)
        self.seconds.add(Column(seconds, np.ones(len(seconds), bool)))
        self.seconds.missing += int(len(col.present) - len(values))
        if len(seconds):
            days = np.floor(seconds / 86400).astype(np.int64)
            self.hours.update(((seconds - days * 86400) // 3600).astype(np.int64).tolist())
            self.weekdays.update(((days + 3) % 7).tolist())  # 1970-01-01 was a Thursday: Monday is 0
            self.months.update(months_of_days(days).tolist())

    def merge(self, other: "DateStats") -> None:
        self.seconds.merge(other.seconds)
        self.hours |= other.hours
        self.weekdays |= other.weekdays
        self.months |= other.months

    def result(self) -> dict[str, Any]:
        return {**self.seconds.result(), "kind": "date", "hours": sorted(self.hours),
                "weekdays": sorted(self.weekdays), "months": sorted(self.months)}


class TextStats(StringStats):
    """A free-text column: in how many rows each word occurs (its document frequency), bounded
    like a category's values; the vocabulary and idf weights the model is built with."""

    def add(self, col: Column) -> None:
        values = col.values[col.present]
        self.missing += int(len(col.present) - len(values))
        self.count += len(values)
        self._count(word for text in values.tolist() for word in set(words(str(text))))

    def result(self, top_k: int) -> dict[str, Any]:
        return {**super().result(top_k), "kind": "text", "documents": self.count}


class SplitStatsFn(beam.CombineFn):
    """Combines batches of columns of one split into that split's statistics."""

    def __init__(self, schema_json: dict[str, Any], top_k: int):
        self.schema_json = schema_json
        self.top_k = top_k

    def _schema(self) -> Schema:
        s = getattr(self, "_cached", None)
        if s is None:
            s = self._cached = Schema.from_json(self.schema_json)
        return s

    def create_accumulator(self) -> dict[str, Any]:
        schema = self._schema()
        bound = max(self.top_k, 10000)
        acc: dict[str, Any] = {"rows": 0}
        for c in schema.columns:
            is_class = c.name == schema.label.name and schema.label.task != "regression"
            if c.kind == "date":
                acc[c.name] = DateStats()
            elif c.kind == "text":
                acc[c.name] = TextStats(bound)
            else:
                acc[c.name] = StringStats(bound) if c.type == "string" or is_class else NumericStats()
        return acc

    def add_input(self, acc: dict[str, Any], columns: dict[str, Column]) -> dict[str, Any]:
        n = 0
        for name, col in columns.items():
            acc[name].add(col)
            n = len(col.present)
        acc["rows"] += n
        return acc

    def merge_accumulators(self, accs) -> dict[str, Any]:
        accs = iter(accs)
        first = next(accs)
        for other in accs:
            first["rows"] += other["rows"]
            for name, value in other.items():
                if name != "rows":
                    first[name].merge(value)
        return first

    def extract_output(self, acc: dict[str, Any]) -> dict[str, Any]:
        schema = self._schema()
        out: dict[str, Any] = {"rows": acc["rows"], "features": {}}
        for c in schema.features:
            stats = acc[c.name]
            out["features"][c.name] = stats.result(self.top_k) if isinstance(stats, StringStats) else stats.result()  # text too
        label = acc[schema.label.name]
        if isinstance(label, StringStats):
            dist = label.result(len(label.counts))
            out["label"] = {"name": schema.label.name, "kind": "classes",
                            "distribution": {str(v): c for v, c in dist["top"]}}
        else:
            out["label"] = {"name": schema.label.name, **label.result()}
        return out
