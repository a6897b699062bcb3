"""Confidence intervals for the metrics tfpipe prints: a metric on a few dozen test rows is an
estimate, and the same rows' model scored again can move by more than the figure's last digits
suggest. Numpy only, so that every stage may import it."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

LEVEL = 0.95
_Z = {0.9: 1.6448536269514722, 0.95: 1.959963984540054, 0.99: 2.5758293035489004}
BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED = 2000, 0


def wilson(correct: int, n: int, level: float = LEVEL) -> tuple[float, float] | None:
    """The Wilson score interval of a share (`correct` of `n`, e.g. an accuracy): right at 0 and 1
    and on a few rows, where the normal approximation is not. None without rows."""
    if n <= 0:
        return None
    z = _Z[level]
    p = correct / n
    center = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, center - half), min(1.0, center + half)


def rmse_interval(squared_errors, level: float = LEVEL, resamples: int = BOOTSTRAP_RESAMPLES,
                  seed: int = BOOTSTRAP_SEED) -> tuple[float, float] | None:
    """A percentile bootstrap interval of the RMSE from each row's squared error (the rows
    resampled with replacement, a fixed seed: the same rows give the same interval). None with
    fewer than two rows."""
    sq = np.asarray(squared_errors, np.float64)
    n = len(sq)
    if n < 2:
        return None
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    chunk = max(1, (1 << 22) // n)  # at most ~4M indices (32 MB) at once
    for start in range(0, resamples, chunk):
        k = min(chunk, resamples - start)
        means[start:start + k] = sq[rng.integers(0, n, size=(k, n))].mean(axis=1)
    lo, hi = np.quantile(np.sqrt(means), [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def interval_record(metric: str, part, level: float = LEVEL) -> dict[str, Any] | None:
    """The interval of `metric` ("accuracy" from each row's right or wrong, "rmse" from each row's
    squared error) as export.json keeps it; None when the rows cannot give one."""
    part = np.asarray(part)
    if metric == "accuracy":
        found, method = wilson(int(part.sum()), len(part), level), "Wilson score"
    else:
        found, method = rmse_interval(part, level), f"bootstrap, {BOOTSTRAP_RESAMPLES} resamples"
    if found is None:
        return None
    return {"level": level, "low": found[0], "high": found[1], "method": method}


def interval_text(interval: dict[str, Any] | None, fmt=lambda v: f"{v:.3f}", rows: int | None = None) -> str:
    """' (95% CI 0.81-0.98)', or with `rows` ' (95% CI 0.81-0.98, 34 rows)', for a summary line;
    '' without an interval."""
    if not interval:
        return ""
    return (f" ({interval['level']:.0%} CI {fmt(interval['low'])}-{fmt(interval['high'])}"
            + (f", {rows:,} rows)" if rows is not None else ")"))
