"""The distances `tfpipe skew` uses, the ones TFDV uses for training/serving skew: L-infinity over
category frequencies, and Jensen-Shannon divergence over histograms of numeric values. Pure numpy,
so the table-driven tests need no TensorFlow.

Numeric values are binned on the training split's quantiles from stats.json (0.01 ... 0.99): ten
bins that hold 1, 4, 5, 15, 25, 25, 15, 5, 4 and 1 percent of the training values, fewer where a
quantile repeats (a feature with few distinct values). Open-ended outer bins take values beyond
the training range, so a shifted feature moves mass into them.

Quantile bins also keep one outlier from hiding or faking skew. The Chicago taxi `fare` column has
one $700 fare among fares mostly under $45: ten equal-width bins over the training range put 11,967
of its 11,976 training fares in the first bin, where no shift of ordinary fares can show, and bins
over each sample's own range, as per-dataset histograms are drawn, read the eval split as 0.247
away from training. The training quantile bins give 0.002 (its noise bound: 0.003).

A distance alone does not tell skew from chance: 34 rows drawn from a training split of three
categories (44/20/36%) are, by L-infinity, 0.09 away from it half the time and over 0.23 one time
in a hundred. `noise_bound` gives the distance that such samples stay under at a stated confidence:
the served rows' distance counts as skew only when it is over its threshold *and* beyond that bound.
The bound is the training distribution's own sampling distribution (a parametric bootstrap:
multinomial draws of the traffic's size over the training categories or quantile bins), so it needs
no traffic beyond the counts. Repeated requests carry no new rows: a load test that sends a 34-row
eval split 16,000 times is a sample of 34, and `effective_rows` says so (Kish's effective sample size
over identical rows).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from typing import Any

import numpy as np


NOISE_DRAWS = 2000  # bootstrap samples per bound: its 99th percentile moves by about 1% between seeds
NOISE_SEED = 20260  # fixed, so that the same log and data give the same verdict


def js_divergence(p: Iterable[float], q: Iterable[float]) -> float:
    """Jensen-Shannon divergence of two histograms (counts or frequencies), in bits: 0 for the
    same shape, 1 for histograms with no bin in common."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    if p.shape != q.shape:
        raise ValueError(f"histograms of {len(p)} and {len(q)} bins")
    if p.sum() <= 0 or q.sum() <= 0:
        raise ValueError("an empty histogram has no distribution")
    return float(js_divergence_rows(p / p.sum(), (q / q.sum())[None, :])[0])


def linf(p: Counter, q: Counter) -> tuple[float, Any]:
    """L-infinity distance between two frequency tables (counts are normalised), and the value
    whose frequency differs most."""
    tp, tq = sum(p.values()), sum(q.values())
    if tp <= 0 or tq <= 0:
        raise ValueError("an empty table has no distribution")
    worst, where = 0.0, None
    for v in sorted(set(p) | set(q), key=str):
        d = abs(p.get(v, 0) / tp - q.get(v, 0) / tq)
        if d > worst:
            worst, where = d, v
    return worst, where


def quantile_edges(quantiles: dict[str, float | None] | list[float | None]) -> np.ndarray:
    """Bin edges from stats.json's quantiles: sorted, each once, None (no values) dropped."""
    values = quantiles.values() if isinstance(quantiles, dict) else quantiles
    return np.unique(np.array([v for v in values if v is not None], dtype=np.float64))


def bin_counts(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Counts in the len(edges)+1 bins (-inf, e0), [e0, e1), ..., [e_last, inf)."""
    return np.bincount(np.searchsorted(edges, np.asarray(values, dtype=np.float64), side="right"),
                       minlength=len(edges) + 1)


def bin_labels(edges: np.ndarray, integer: bool = False) -> list[str]:
    """Labels of the len(edges)+1 bins; for an integer feature, the whole numbers each bin holds
    (the bin [2007, 2008) is "2007", [5, 9) is "5-8")."""
    if not len(edges):
        return ["all"]
    if integer:
        lows = [math.ceil(e) for e in edges]  # the first whole number at or over each edge

        def span(lo: int, hi: int) -> str:
            return str(lo) if lo == hi else f"{lo}-{hi}" if lo < hi else "none"

        return ([f"<={lows[0] - 1}"] + [span(a, b - 1) for a, b in zip(lows[:-1], lows[1:])]
                + [f">={lows[-1]}"])
    fmt = lambda v: f"{v:.4g}"  # noqa: E731
    return ([f"<{fmt(edges[0])}"] + [f"{fmt(a)}-{fmt(b)}" for a, b in zip(edges[:-1], edges[1:])]
            + [f">={fmt(edges[-1])}"])


def missing_rise(train_missing: int, train_total: int, serving_missing: int, serving_total: int) -> float:
    """How much larger the fraction of missing values is in serving than in training (0 when smaller)."""
    if serving_total <= 0:
        return 0.0
    train = train_missing / train_total if train_total else 0.0
    return max(0.0, serving_missing / serving_total - train)


def compare_numeric(train: np.ndarray, serving: np.ndarray, train_stats: dict[str, Any],
                    integer: bool = False) -> dict[str, Any]:
    """Histograms of present values on the train quantile bins, their JS divergence, and the
    serving values beyond the training range (`integer`: the bins labelled by whole numbers)."""
    edges = quantile_edges(train_stats.get("quantiles") or {})
    tc, sc = bin_counts(train, edges), bin_counts(serving, edges)
    lo, hi = train_stats.get("min"), train_stats.get("max")
    below = int(np.sum(serving < lo)) if lo is not None else 0
    above = int(np.sum(serving > hi)) if hi is not None else 0
    return {
        "distance": js_divergence(tc, sc) if tc.sum() and sc.sum() else None,
        "measure": "jensen_shannon",
        "bins": bin_labels(edges, integer),
        "train_histogram": tc.tolist(),
        "serving_histogram": sc.tolist(),
        "out_of_range": {"below_min": below, "above_max": above, "train_min": lo, "train_max": hi,
                         "fraction": (below + above) / len(serving) if len(serving) else 0.0},
    }


def compare_categorical(train: Iterable[Any], serving: Iterable[Any], top: int = 12) -> dict[str, Any]:
    """Frequency tables of present values, their L-infinity distance, and serving values the
    training split never had."""
    tc, sc = Counter(train), Counter(serving)
    distance, where = linf(tc, sc) if tc and sc else (None, None)
    new = Counter({v: c for v, c in sc.items() if v not in tc})
    tt, st = sum(tc.values()) or 1, sum(sc.values()) or 1
    shown = sorted(set(tc) | set(sc), key=lambda v: (-max(tc[v] / tt, sc[v] / st), str(v)))[:top]
    return {
        "distance": distance,
        "measure": "l_infinity",
        "most_changed": where,
        "values": [[v, tc[v] / tt, sc[v] / st] for v in shown],
        "new_categories": {"values": [[v, c] for v, c in new.most_common(10)], "distinct": len(new),
                           "fraction": sum(new.values()) / st if sc else 0.0},
    }


def js_divergence_rows(p: np.ndarray, f: np.ndarray) -> np.ndarray:
    """js_divergence of the distribution `p` (K,) against each row of `f` (B, K), both normalised."""
    m = (p[None, :] + f) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        kp = np.where(p[None, :] > 0, p[None, :] * np.log2(p[None, :] / m), 0.0).sum(axis=1)
        kf = np.where(f > 0, f * np.log2(f / m), 0.0).sum(axis=1)
    return np.clip((kp + kf) / 2, 0.0, 1.0)


def effective_rows(codes: list[np.ndarray]) -> float:
    """Kish's effective sample size of rows given as per-feature integer codes (equal codes, equal
    values): (sum of w)^2 / sum of w^2 over the multiplicities w of distinct rows. n distinct rows
    give n; 34 rows sent 500 times each give 34."""
    if not codes or not len(codes[0]):
        return 0.0
    rows = np.stack([np.asarray(c, dtype=np.int64) for c in codes], axis=1)
    _, w = np.unique(rows, axis=0, return_counts=True)
    w = w.astype(np.float64)
    return float(w.sum() ** 2 / np.sum(w ** 2))


def noise_bound(train_counts: np.ndarray, n: float, measure: str, confidence: float,
                draws: int = NOISE_DRAWS, seed: int = NOISE_SEED) -> float | None:
    """The `confidence` quantile of the distance between the training distribution (counts per
    category or bin) and samples of `n` rows drawn from it: how far chance alone moves a sample of
    that size. `measure` is l_infinity or jensen_shannon. None when there is nothing to draw."""
    counts = np.asarray(train_counts, dtype=np.float64)
    k, size = len(counts), int(round(n))
    if size <= 0 or counts.sum() <= 0:
        return None
    p = counts / counts.sum()
    rng = np.random.default_rng(seed)
    chunk = max(1, 2_000_000 // max(k, 1))  # at most ~16 MB of draws at a time
    out = []
    for start in range(0, draws, chunk):
        f = rng.multinomial(size, p, size=min(chunk, draws - start)) / size
        if measure == "l_infinity":
            out.append(np.abs(f - p[None, :]).max(axis=1))
        elif measure == "jensen_shannon":
            out.append(js_divergence_rows(p, f))
        else:
            raise ValueError(f"unknown measure {measure!r}")
    return float(np.quantile(np.concatenate(out), confidence))


def missing_noise_bound(train_fraction: float, n: float, confidence: float, draws: int = NOISE_DRAWS,
                        seed: int = NOISE_SEED) -> float | None:
    """The `confidence` quantile of the rise in the missing fraction of `n` rows drawn from training
    (0 when training has no missing values: then any missing value is news)."""
    size = int(round(n))
    if size <= 0:
        return None
    rng = np.random.default_rng(seed + 1)
    return float(max(0.0, np.quantile(rng.binomial(size, train_fraction, size=draws) / size - train_fraction,
                                      confidence)))
