"""`tfpipe skew`: do the features of logged requests look like the data the model was trained on?

Reads the request log (tfpipe.prediction_logs), turns each request's named tensors or
tf.Examples into feature columns, computes their statistics with the data stage's own combiner
(SplitStatsFn), and compares each feature with the training split: L-infinity distance over
category frequencies, Jensen-Shannon divergence over the training quantile bins for numbers, and
the rise in the fraction of missing values. A feature over its threshold fails the check (exit 1).
Writes skew.json and skew.html into --out, published whole.
"""

from __future__ import annotations

import html
import json
import math
import os
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import numpy as np

from tfpipe.files import publish, write_json
from tfpipe.skew.config import DEFAULT_CONFIDENCE, SkewConfig, parse_thresholds
from tfpipe.skew.errors import SkewError
from tfpipe.skew.measure import (NOISE_DRAWS, compare_categorical, compare_numeric, effective_rows,
                                 missing_noise_bound, missing_rise, noise_bound)
from tfpipe.stage import SkewOutputs, StageResult

TOP_K = 10


def check_inputs(cfg: SkewConfig):
    """The data dir and the log's files, checked before TensorFlow is imported."""
    from tfpipe.train.datadir import load_data_dir
    from tfpipe.train.errors import TrainError

    if not cfg.logs:
        raise SkewError("no request log: pass --logs PREFIX (the filename_prefix the server logged to)")
    try:
        data = load_data_dir(cfg.data)
    except TrainError as e:
        raise SkewError(str(e)) from None
    if data.images:
        raise SkewError(f"{cfg.data} holds images: tfpipe skew compares tabular features "
                        "(named tensors and tf.Examples of a tfpipe data directory of rows)")
    out = cfg.out
    if os.path.exists(out) and (not os.path.isdir(out) or (os.listdir(out)
                                                          and not os.path.exists(os.path.join(out, "skew.json")))):
        raise SkewError(f"--out {out} exists and is not a tfpipe skew output (no skew.json); it would be replaced "
                        "whole: choose another --out or remove it")
    default, per_feature = parse_thresholds(cfg.threshold)
    names = {c.name for c in data.schema.features}
    unknown = sorted(set(per_feature) - names)
    if unknown:
        raise SkewError(f"--threshold names {', '.join(unknown)}, not a feature of {cfg.data} "
                        f"(features: {', '.join(sorted(names))})")
    return data


def run(cfg: SkewConfig, log: Callable[[str], None] = print) -> StageResult:
    """The check, published into cfg.out; the result's code: 0 when every feature is within its
    threshold, 1 when one is not."""
    from tfpipe.pipeline.stats import SplitStatsFn
    from tfpipe.skew.columns import read_split, read_traffic

    data = check_inputs(cfg)
    default, per_feature = parse_thresholds(cfg.threshold)
    read, logs, models = _read_logs(cfg, log)
    model = cfg.model
    schema = data.schema
    traffic = read_traffic(logs, schema, model)
    if not traffic.rows:
        why = "; ".join(f"{k}: {v}" for k, v in traffic.skipped.items()) or "no requests"
        raise SkewError(f"the logged requests hold no rows with the features of {cfg.data} ({why})")
    log(f"{traffic.requests:,} requests, {traffic.rows:,} rows ("
        + ", ".join(f"{k} {v:,}" for k, v in sorted(traffic.by_api.items())) + ")")
    train = read_split(data.files("train"), schema)
    log(f"training split: {train.rows:,} rows")

    with open(os.path.join(data.path, "schema.json")) as f:
        schema_json = json.load(f)
    combiner = SplitStatsFn(schema_json, TOP_K)
    acc = combiner.add_input(combiner.create_accumulator(), traffic.columns)
    serving_stats = combiner.extract_output(acc)["features"]
    train_stats = data.train_stats()["features"]

    n_eff = effective_rows([_codes(traffic.columns[c.name]) for c in schema.features])
    each = feature_confidence(cfg.confidence, len(schema.features))
    log(f"{n_eff:,.0f} effective rows (identical rows sent again count once): the noise bounds are what "
        f"samples of that size drawn from training reach at {cfg.confidence:.0%} for the {len(schema.features)} "
        f"features together ({each:.3%} each)")
    every = len(schema.features) <= BOUND_EVERY_FEATURE
    if not every:
        log(f"{len(schema.features)} features: a noise bound is drawn only for those over their threshold, where it "
            "decides the verdict")
    features = []
    for c in schema.features:
        threshold = per_feature.get(c.name, default)
        features.append(feature_verdict(c.name, c.type, train.columns[c.name], traffic.columns[c.name],
                                        train_stats[c.name], serving_stats[c.name], threshold, n_eff, each,
                                        every_bound=every))
    flagged = [f["name"] for f in features if f["flagged"]]
    noisy = [f["name"] for f in features if f["verdict"] == "within noise"]
    checked = {
        "stage": "skew", "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "data": os.path.abspath(data.path), "logs": cfg.logs, "model": model or next(iter(models), None),
        "log": {"files": len(read.files), "records": len(read.records), "truncated": read.truncated,
                "max_records": cfg.max_records},
        "traffic": {"requests": traffic.requests, "rows": traffic.rows, "by_api": dict(traffic.by_api),
                    "by_model": dict(models), "unknown_inputs": dict(traffic.unknown_inputs),
                    "unreadable": dict(traffic.unreadable), "skipped": dict(traffic.skipped)},
        "train": {"rows": train.rows},
        "thresholds": {"default": default, "per_feature": per_feature},
        "noise": {"effective_rows": n_eff, "confidence": cfg.confidence, "feature_confidence": each,
                  "draws": NOISE_DRAWS,
                  "method": "the confidence quantile of the distance between training and multinomial samples of "
                            "effective_rows drawn from it (per feature: its share of rows with a value)"},
        "features": features, "flagged": flagged, "within_noise": noisy, "passed": not flagged,
    }
    for line in summary_lines(checked):
        log(line)
    _publish(checked, cfg.out)
    log(f"wrote {os.path.join(cfg.out, 'skew.json')} and skew.html")
    return result(cfg.out, 1 if flagged else 0)


def _read_logs(cfg: SkewConfig, log: Callable[[str], None]):
    """(the read log, its PredictionLogs, requests per model), checked against --model."""
    from tfpipe.prediction_logs import iter_logs, read_log

    read = read_log(cfg.logs, limit=cfg.max_records)
    if not read.files:
        raise SkewError(f"no request log files at {cfg.logs} (looked for {cfg.logs}-*.tfrecord; a prefix ending "
                        "in / reads the directory's *.tfrecord)")
    log(f"read {len(read.records):,} logged requests from {len(read.files)} file(s)"
        + (f"; {len(read.truncated)} cut short by a stop mid-write (records before the cut kept)"
           if read.truncated else "")
        + (f"; stopped at --max-records {cfg.max_records:,}" if len(read.records) >= cfg.max_records else ""))
    logs = list(iter_logs(read.records))
    models = Counter(lg.log_metadata.model_spec.name for lg, _ in logs)  # requests per model
    if cfg.model is None and len(models) > 1:
        raise SkewError(f"the log holds requests to {len(models)} models ({', '.join(sorted(models))}): "
                        "pick one with --model")
    if cfg.model is not None and cfg.model not in models:
        raise SkewError(f"the log holds no request to model {cfg.model!r} "
                        f"(it has {', '.join(sorted(models)) or 'none'})")
    return read, logs, models


def _publish(result: dict, out: str) -> None:
    """skew.json and skew.html into `out`, atomically."""
    with publish(out) as tmp:
        write_json(os.path.join(tmp, "skew.json"), result)
        write_html(result, os.path.join(tmp, "skew.html"))


def feature_confidence(confidence: float, features: int) -> float:
    """Each feature's confidence such that the check as a whole holds `confidence` (Bonferroni):
    with 18 features each at 99%, chance alone would flag one of them in about 1 run of 6."""
    return 1.0 - (1.0 - confidence) / max(1, features)


def _codes(col) -> np.ndarray:
    """A column as integer codes, equal values equal codes, -1 for missing (for effective_rows)."""
    codes = np.full(len(col.present), -1, dtype=np.int64)
    if col.present.any():
        codes[col.present] = np.unique(col.values[col.present], return_inverse=True)[1].reshape(-1)
    return codes


# Up to this many features every feature gets its noise bound; beyond, only those whose distance is
# over the threshold (at a Bonferroni-corrected confidence a bound takes 600,000 draws for 300
# features: drawn for every feature, they were most of a wide table's skew check).
BOUND_EVERY_FEATURE = 50


def feature_verdict(name: str, type_: str, train_col, serving_col, train_stats: dict, serving_stats: dict,
                    threshold: float, n_eff: float | None = None,
                    confidence: float = DEFAULT_CONFIDENCE, every_bound: bool = True) -> dict[str, Any]:
    """One feature's comparison and verdict: skewed when a distance is over its threshold and beyond
    its noise bound, "within noise" when it is over the threshold only. `every_bound` False: a bound
    is drawn only where it decides the verdict (a distance, or a rise of missing values, over the
    threshold); else None."""
    t_values, s_values = train_col.values[train_col.present], serving_col.values[serving_col.present]
    if type_ == "string":
        kind, cmp = "categorical", compare_categorical(t_values.tolist(), s_values.tolist())
        train_counts = np.array(list(Counter(t_values.tolist()).values()), dtype=np.float64)
    else:
        kind, cmp = "numeric", compare_numeric(t_values.astype(np.float64), s_values.astype(np.float64), train_stats,
                                               integer=type_ == "int")
        train_counts = np.asarray(cmp["train_histogram"], dtype=np.float64)
    n_train, n_serving = len(train_col.present), len(serving_col.present)
    n_eff = float(n_serving) if n_eff is None else n_eff
    train_missing = (n_train - len(t_values)) / max(n_train, 1)
    rise = missing_rise(n_train - len(t_values), n_train, n_serving - len(s_values), n_serving)
    present_rows = n_eff * len(s_values) / n_serving if n_serving else 0.0
    # enough draws that at least 20 fall beyond the confidence quantile
    draws = max(NOISE_DRAWS, math.ceil(20 / (1 - confidence)))
    bound = (noise_bound(train_counts, present_rows, cmp["measure"], confidence, draws)
             if cmp["distance"] is not None and (every_bound or cmp["distance"] > threshold) else None)
    missing_bound = (missing_noise_bound(train_missing, n_eff, confidence, draws)
                     if n_serving and (every_bound or rise > threshold) else None)
    reasons, within_noise = [], []
    what = "L-infinity" if kind == "categorical" else "Jensen-Shannon divergence"
    # "never sent" counts as "missing" does: beyond the threshold and the noise (a column with a
    # value in one training row of 12,000 is not skewed for having none in the traffic)
    if not len(s_values) and len(t_values) and rise > threshold and (missing_bound is None or rise > missing_bound):
        reasons.append("never sent: missing from every request")
    elif cmp["distance"] is not None and cmp["distance"] > threshold:
        if bound is not None and cmp["distance"] <= bound:
            within_noise.append(f"{what} {cmp['distance']:.3f} over {threshold:g} but within the noise of "
                                f"{present_rows:,.0f} rows ({bound:.3f} at {confidence:.0%})")
        else:
            where = f" (most changed: {cmp['most_changed']!r})" if kind == "categorical" else ""
            beyond = "" if bound is None else f" and beyond the noise bound {bound:.3f}"
            reasons.append(f"{what} {cmp['distance']:.3f} over {threshold:g}{beyond}{where}")
    if rise > threshold and len(s_values):
        text = (f"missing in {(n_serving - len(s_values)) / n_serving:.1%} of rows (training "
                f"{train_missing:.1%})")
        if missing_bound is not None and rise <= missing_bound:
            within_noise.append(f"{text}, within the noise of {n_eff:,.0f} rows ({missing_bound:.3f})")
        else:
            reasons.append(text)
    notes = []
    if not len(t_values) and len(s_values):
        notes.append(f"training has no value of it; the traffic has {len(s_values):,}")
    if kind == "categorical" and cmp["new_categories"]["distinct"]:
        nc = cmp["new_categories"]
        notes.append(f"{nc['distinct']} value(s) never seen in training, {nc['fraction']:.1%} of rows: "
                     + ", ".join(repr(v) for v, _ in nc["values"][:5]))
    if kind == "numeric" and cmp["out_of_range"]["fraction"] > 0:
        o = cmp["out_of_range"]
        notes.append(f"{o['fraction']:.1%} of values outside the training range [{o['train_min']:g}, "
                     f"{o['train_max']:g}]")
    verdict = "skewed" if reasons else "within noise" if within_noise else "ok"
    return {"name": name, "type": type_, "kind": kind, "threshold": threshold, **cmp,
            "noise_bound": bound, "effective_rows": present_rows,
            "missing": {"train_fraction": train_missing,
                        "serving_fraction": (n_serving - len(s_values)) / max(n_serving, 1), "rise": rise,
                        "noise_bound": missing_bound},
            "train_stats": train_stats, "serving_stats": serving_stats,
            "verdict": verdict, "flagged": bool(reasons), "reasons": reasons, "within_noise": within_noise,
            "notes": notes}


def summary_lines(result: dict[str, Any]) -> list[str]:
    lines = [f"{'feature':<24} {'kind':<12} {'distance':>9} {'noise':>7} {'threshold':>9} {'missing':>8}  verdict"]
    for f in result["features"]:
        verdict = verdict_text(f)
        if f["notes"]:
            verdict += " (" + "; ".join(f["notes"]) + ")"
        lines.append(f"{f['name']:<24} {f['kind']:<12} {_num(f['distance']):>9} {_num(f.get('noise_bound'), 3):>7} "
                     f"{f['threshold']:>9g} {f['missing']['serving_fraction']:>8.1%}  {verdict}")
    flagged, noisy = result["flagged"], result["within_noise"]
    rows = (f"{result['traffic']['rows']:,} rows of traffic ({result['noise']['effective_rows']:,.0f} effective) "
            f"against {result['train']['rows']:,} training rows")
    if flagged:
        lines.append(f"skew: {len(flagged)} of {len(result['features'])} features over their threshold and beyond "
                     f"the noise: {', '.join(flagged)}")
    elif noisy:
        lines.append(f"skew: no feature skewed; {', '.join(noisy)} over the threshold but within the noise of "
                     f"{rows}")
    else:
        lines.append(f"skew: every feature within its threshold ({len(result['features'])} features, {rows})")
    return lines


def _num(v: float | None, digits: int = 4) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def verdict_text(f: dict[str, Any]) -> str:
    if f["flagged"]:
        return "SKEWED: " + "; ".join(f["reasons"])
    if f.get("verdict") == "within noise":  # skew.json of an older tfpipe has no verdict
        return "within noise: " + "; ".join(f["within_noise"])
    return "ok"


def skew_section(result: dict[str, Any]) -> str:
    """The verdict, the feature table and train/serving histograms (flagged features first), as an
    HTML fragment (also in `tfpipe run`'s report)."""
    from tfpipe.loadtest.report import paired_bar_chart, table_html

    t, noisy = result["traffic"], result.get("within_noise", [])
    verdict = (f'<p class="bad"><b>Skewed: {html.escape(", ".join(result["flagged"]))}</b></p>' if result["flagged"]
               else f'<p class="ok"><b>No feature skewed: {html.escape(", ".join(noisy))} over the threshold but '
                    'within the noise of a sample this size.</b></p>' if noisy
               else '<p class="ok"><b>Every feature within its threshold.</b></p>')
    rows = [[f["name"], f["kind"], _num(f["distance"]), _num(f.get("noise_bound"), 3), f"{f['threshold']:g}",
             f"{f['missing']['train_fraction']:.1%}", f"{f['missing']['serving_fraction']:.1%}",
             verdict_text(f), "; ".join(f["notes"])]
            for f in result["features"]]
    noise = result.get("noise", {})
    charts = []
    for f in sorted(result["features"], key=lambda f: (not f["flagged"], f["name"])):
        if f["kind"] == "numeric":
            tt, st = sum(f["train_histogram"]) or 1, sum(f["serving_histogram"]) or 1
            labels = f["bins"]
            train = [c / tt for c in f["train_histogram"]]
            serving = [c / st for c in f["serving_histogram"]]
        else:
            labels = [str(v) for v, _, _ in f["values"]]
            train = [p for _, p, _ in f["values"]]
            serving = [q for _, _, q in f["values"]]
        bound = f" (noise {f['noise_bound']:.3f})" if f.get("noise_bound") is not None else ""
        charts.append(paired_bar_chart(f"{f['name']}: {_num(f['distance'], 3)}{bound}" + (" skewed" if f["flagged"] else ""),
                                       "fraction of rows", labels,
                                       [("training", "#1f77b4", train), ("served", "#d62728", serving)]))
    extra = []
    if t["unknown_inputs"]:
        extra.append("Inputs that are not features of the data: "
                     + ", ".join(f"{html.escape(k)} ({v:,})" for k, v in t["unknown_inputs"].items()) + ".")
    if t["skipped"]:
        extra.append("Requests without rows: " + ", ".join(f"{html.escape(k)} ({v:,})" for k, v in t["skipped"].items())
                     + ".")
    return (f"{verdict}<p>{t['requests']:,} logged requests to {html.escape(str(result['model']))} "
            f"({html.escape(', '.join(f'{k} {v:,}' for k, v in sorted(t['by_api'].items())))}), {t['rows']:,} rows, "
            f"against {result['train']['rows']:,} training rows. Categorical features: L-infinity distance over "
            "value frequencies; numeric features: Jensen-Shannon divergence (bits) over the training quantile bins. "
            "A feature also fails when its fraction of missing values rises by more than its threshold. "
            f"The noise bound is the distance that {noise.get('confidence', DEFAULT_CONFIDENCE):.0%} of samples of "
            f"the traffic's size ({noise.get('effective_rows', t['rows']):,.0f} effective rows: a row sent again "
            "counts once) drawn from the training split stay under; a distance within it is chance, not skew.</p>"
            + "".join(f"<p>{e}</p>" for e in extra)
            + table_html(["feature", "kind", "distance", "noise bound", "threshold", "missing (train)",
                          "missing (served)", "verdict", "notes"], rows)
            + f"<div>{''.join(charts)}</div>")


def write_html(result: dict[str, Any], path: str) -> None:
    from tfpipe.loadtest.report import STYLE

    doc = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>tfpipe skew: {html.escape(str(result['model']))}</title>
<style>{STYLE}</style>
</head><body>
<h1>tfpipe skew</h1>
<p>Requests logged at <code>{html.escape(result['logs'])}</code> against the training split of
<code>{html.escape(result['data'])}</code>.</p>
{skew_section(result)}
</body></html>
"""
    with open(path, "w") as f:
        f.write(doc)


def result(out: str, code: int = 0) -> StageResult:
    """The skew check's verdict for `tfpipe run`, in one line."""
    path = os.path.join(out, "skew.json")
    with open(path) as f:
        r = json.load(f)
    t, noisy = r["traffic"], r["within_noise"]
    summary = (f"{t['requests']:,} logged requests, {t['rows']:,} rows ({r['noise']['effective_rows']:,.0f} "
               f"effective) against {r['train']['rows']:,} training rows: "
               + (f"SKEWED: {', '.join(r['flagged'])}" if r["flagged"] else
                  f"no feature skewed ({', '.join(noisy)} within the noise)" if noisy else
                  "every feature within its threshold"))
    return StageResult(path, summary, SkewOutputs(out, r["passed"]), code)


def skipped(out: str, why: str) -> StageResult:
    """A skew.json that says why no check ran (image data), for `tfpipe run`."""
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "skew.json")
    write_json(path, {"stage": "skew", "skipped": why})
    return StageResult(path, f"skipped: {why}", SkewOutputs(out, None))
