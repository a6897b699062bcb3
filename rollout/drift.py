"""The new data against the data the served version was made from: has what the model sees changed
between the days? Reported beside the verdict, not a gate (a changed world is a reason to retrain,
not to refuse the retrained model).

The reference is the split the served version kept (`assets.extra/test_data/`: its records and
the statistics of its whole data snapshot), the sample is the new data's training split. Each
feature's distance is the one `tfpipe skew` uses (L-infinity over categories, Jensen-Shannon over
the served version's training quantile bins). Unlike served traffic against a whole training
split, both sides here are samples, the reference a small one (a test split), so the noise bound
is a two-sample one: the distance that two samples of these sizes drawn from one distribution
(the two pooled) stay under at the stated confidence. A feature moved when its distance is over
`tfpipe skew`'s default threshold and beyond that bound.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

DRAWS = 2000
SEED = 20261


def two_sample_bound(a: np.ndarray, b: np.ndarray, measure: str, confidence: float) -> float | None:
    """The `confidence` quantile of the distance between two samples of a's and b's sizes drawn from
    their pooled distribution (counts per bin or category); None when a side is empty."""
    na, nb = int(a.sum()), int(b.sum())
    if na <= 0 or nb <= 0:
        return None
    pooled = (a + b) / (na + nb)
    rng = np.random.default_rng(SEED)
    draws = max(DRAWS, int(np.ceil(20 / (1 - confidence))))  # at least 20 draws beyond the quantile
    fa = rng.multinomial(na, pooled, size=draws) / na
    fb = rng.multinomial(nb, pooled, size=draws) / nb
    if measure == "l_infinity":
        d = np.abs(fa - fb).max(axis=1)
    else:
        d = js_pairs(fa, fb)
    return float(np.quantile(d, confidence))


def js_pairs(fa: np.ndarray, fb: np.ndarray) -> np.ndarray:
    """The Jensen-Shannon divergence (bits) of each row of `fa` with the same row of `fb` (both
    normalised), as skew.measure.js_divergence computes it for one pair."""
    m = (fa + fb) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        ka = np.where(fa > 0, fa * np.log2(fa / m), 0.0).sum(axis=1)
        kb = np.where(fb > 0, fb * np.log2(fb / m), 0.0).sum(axis=1)
    return np.clip((ka + kb) / 2, 0.0, 1.0)


def compare(kind: str, ref: np.ndarray, new: np.ndarray, ref_stats: dict[str, Any]) -> dict[str, Any]:
    """One feature's histograms (numeric: on the served version's training quantile bins; else per
    category), their distance and measure."""
    from tfpipe.skew.measure import bin_counts, js_divergence, quantile_edges

    if kind == "string":
        seen = sorted(set(ref.tolist()) | set(new.tolist()), key=str)
        rc, nc = Counter(ref.tolist()), Counter(new.tolist())
        a = np.array([rc.get(v, 0) for v in seen], np.float64)
        b = np.array([nc.get(v, 0) for v in seen], np.float64)
        measure = "l_infinity"
        distance = float(np.abs(a / a.sum() - b / b.sum()).max()) if a.sum() and b.sum() else None
    else:
        edges = quantile_edges(ref_stats.get("quantiles") or {})
        a = bin_counts(ref.astype(np.float64), edges).astype(np.float64)
        b = bin_counts(new.astype(np.float64), edges).astype(np.float64)
        measure = "jensen_shannon"
        distance = js_divergence(a, b) if a.sum() and b.sum() else None
    return {"a": a, "b": b, "measure": measure, "distance": distance}


def new_data_against_served(data_path: str, served_dir: str) -> dict[str, Any] | None:
    """Per feature of the tabular data both have (same name and type): the distance, its two-sample
    noise bound and the verdict; None when the served version kept no split or the data are images."""
    from tfpipe.export.judge import judged_split, stored_test_data
    from tfpipe.skew.columns import read_split
    from tfpipe.skew.config import DEFAULT_CONFIDENCE, SkewConfig, parse_thresholds
    from tfpipe.skew.job import feature_confidence
    from tfpipe.train.datadir import load_data_dir

    previous = stored_test_data(served_dir)
    new = load_data_dir(data_path)
    if previous is None or previous.images or new.images:
        return None
    split = judged_split(previous)
    reference = read_split(previous.files(split), previous.schema)
    sample = read_split(new.files("train"), new.schema)
    kinds = {c.name: c.type for c in previous.schema.features}
    common = [c for c in new.schema.features if kinds.get(c.name) == c.type]
    threshold, _ = parse_thresholds(SkewConfig().threshold)
    each = feature_confidence(DEFAULT_CONFIDENCE, max(1, len(common)))
    ref_stats = previous.train_stats()["features"]
    features = []
    for c in common:
        r, n = reference.columns[c.name], sample.columns[c.name]
        found = compare(c.type, r.values[r.present], n.values[n.present], ref_stats.get(c.name) or {})
        bound = two_sample_bound(found["a"], found["b"], found["measure"], each)
        d = found["distance"]
        verdict = ("moved" if d is not None and d > threshold and (bound is None or d > bound)
                   else "within noise" if d is not None and d > threshold else "ok")
        features.append({"name": c.name, "measure": found["measure"], "distance": d, "noise_bound": bound,
                         "verdict": verdict})
    return {"reference": f"the served version's {split} split ({reference.rows:,} rows)",
            "sample": f"the new training split ({sample.rows:,} rows)", "threshold": threshold,
            "confidence": DEFAULT_CONFIDENCE, "features": features,
            "drifted": [f["name"] for f in features if f["verdict"] == "moved"],
            "only_new": sorted({c.name for c in new.schema.features} - set(kinds)),
            "only_served": sorted(set(kinds) - {c.name for c in new.schema.features})}


def drift_line(report: dict[str, Any] | None) -> str:
    if report is None:
        return "the served version kept no data to compare the new data with"
    if not report["drifted"]:
        return f"the new data against the served version's: no feature moved beyond its noise ({report['reference']})"
    return (f"the new data against the served version's: {', '.join(report['drifted'])} moved beyond the noise "
            f"({report['reference']}; reported, not a gate)")
