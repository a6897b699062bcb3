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
import os
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import numpy as np

from tfpipe.files import publish_dir, temp_dir, write_json
from tfpipe.skew.config import SkewConfig, parse_thresholds
from tfpipe.skew.errors import SkewError
from tfpipe.skew.measure import compare_categorical, compare_numeric, missing_rise

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


def run(cfg: SkewConfig, log: Callable[[str], None] = print) -> int:
    """0 when every feature is within its threshold, 1 when one is not."""
    from tfpipe.pipeline.stats import SplitStatsFn
    from tfpipe.prediction_logs import iter_logs, read_log
    from tfpipe.skew.columns import read_split, read_traffic

    data = check_inputs(cfg)
    default, per_feature = parse_thresholds(cfg.threshold)
    read = read_log(cfg.logs, limit=cfg.max_records)
    if not read.files:
        raise SkewError(f"no request log files at {cfg.logs} (looked for {cfg.logs}-*.tfrecord; a prefix ending "
                        "in / reads the directory's *.tfrecord)")
    log(f"read {len(read.records):,} logged requests from {len(read.files)} file(s)"
        + (f"; {len(read.truncated)} cut short by a stop mid-write (records before the cut kept)"
           if read.truncated else "")
        + (f"; stopped at --max-records {cfg.max_records:,}" if len(read.records) >= cfg.max_records else ""))
    schema = data.schema
    logs = list(iter_logs(read.records))
    models = Counter(lg.log_metadata.model_spec.name for lg, _ in logs)  # requests per model
    model = cfg.model
    if model is None and len(models) > 1:
        raise SkewError(f"the log holds requests to {len(models)} models ({', '.join(sorted(models))}): "
                        "pick one with --model")
    if model is not None and model not in models:
        raise SkewError(f"the log holds no request to model {model!r} "
                        f"(it has {', '.join(sorted(models)) or 'none'})")
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

    features = []
    for c in schema.features:
        threshold = per_feature.get(c.name, default)
        features.append(_feature(c.name, c.type, train.columns[c.name], traffic.columns[c.name], train_stats[c.name],
                                 serving_stats[c.name], threshold))
    flagged = [f["name"] for f in features if f["flagged"]]
    result = {
        "stage": "skew", "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "data": os.path.abspath(data.path), "logs": cfg.logs, "model": model or next(iter(models), None),
        "log": {"files": len(read.files), "records": len(read.records), "truncated": read.truncated,
                "max_records": cfg.max_records},
        "traffic": {"requests": traffic.requests, "rows": traffic.rows, "by_api": dict(traffic.by_api),
                    "by_model": dict(models), "unknown_inputs": dict(traffic.unknown_inputs),
                    "unreadable": dict(traffic.unreadable), "skipped": dict(traffic.skipped)},
        "train": {"rows": train.rows},
        "thresholds": {"default": default, "per_feature": per_feature},
        "features": features, "flagged": flagged, "passed": not flagged,
    }
    for line in summary_lines(result):
        log(line)
    tmp = temp_dir(cfg.out)
    try:
        write_json(os.path.join(tmp, "skew.json"), result)
        write_html(result, os.path.join(tmp, "skew.html"))
        publish_dir(tmp, cfg.out)
    except BaseException:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"wrote {os.path.join(cfg.out, 'skew.json')} and skew.html")
    return 1 if flagged else 0


def _feature(name: str, type_: str, train_col, serving_col, train_stats: dict, serving_stats: dict,
             threshold: float) -> dict[str, Any]:
    t_values, s_values = train_col.values[train_col.present], serving_col.values[serving_col.present]
    if type_ == "string":
        kind, cmp = "categorical", compare_categorical(t_values.tolist(), s_values.tolist())
    else:
        kind, cmp = "numeric", compare_numeric(t_values.astype(np.float64), s_values.astype(np.float64), train_stats)
    n_train, n_serving = len(train_col.present), len(serving_col.present)
    rise = missing_rise(n_train - len(t_values), n_train, n_serving - len(s_values), n_serving)
    reasons = []
    if not len(s_values) and len(t_values):
        reasons.append("never sent: missing from every request")
    elif cmp["distance"] is not None and cmp["distance"] > threshold:
        what = "L-infinity" if kind == "categorical" else "Jensen-Shannon divergence"
        where = f" (most changed: {cmp['most_changed']!r})" if kind == "categorical" else ""
        reasons.append(f"{what} {cmp['distance']:.3f} over {threshold:g}{where}")
    if rise > threshold and len(s_values):
        reasons.append(f"missing in {(n_serving - len(s_values)) / n_serving:.1%} of rows "
                       f"(training {(n_train - len(t_values)) / max(n_train, 1):.1%})")
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
    return {"name": name, "type": type_, "kind": kind, "threshold": threshold, **cmp,
            "missing": {"train_fraction": (n_train - len(t_values)) / max(n_train, 1),
                        "serving_fraction": (n_serving - len(s_values)) / max(n_serving, 1), "rise": rise},
            "train_stats": train_stats, "serving_stats": serving_stats,
            "flagged": bool(reasons), "reasons": reasons, "notes": notes}


def summary_lines(result: dict[str, Any]) -> list[str]:
    lines = [f"{'feature':<24} {'kind':<12} {'distance':>9} {'threshold':>9} {'missing':>8}  verdict"]
    for f in result["features"]:
        d = "-" if f["distance"] is None else f"{f['distance']:.4f}"
        verdict = "SKEWED: " + "; ".join(f["reasons"]) if f["flagged"] else "ok"
        if f["notes"]:
            verdict += " (" + "; ".join(f["notes"]) + ")"
        lines.append(f"{f['name']:<24} {f['kind']:<12} {d:>9} {f['threshold']:>9g} "
                     f"{f['missing']['serving_fraction']:>8.1%}  {verdict}")
    flagged = result["flagged"]
    lines.append(f"skew: {len(flagged)} of {len(result['features'])} features over their threshold: "
                 + ", ".join(flagged) if flagged else
                 f"skew: every feature within its threshold ({len(result['features'])} features, "
                 f"{result['traffic']['rows']:,} rows of traffic against {result['train']['rows']:,} training rows)")
    return lines


def skew_section(result: dict[str, Any]) -> str:
    """The verdict, the feature table and train/serving histograms (flagged features first), as an
    HTML fragment (also in `tfpipe run`'s report)."""
    from tfpipe.loadtest.report import paired_bar_chart, table_html

    t = result["traffic"]
    verdict = (f'<p class="bad"><b>Skewed: {html.escape(", ".join(result["flagged"]))}</b></p>' if result["flagged"]
               else '<p class="ok"><b>Every feature within its threshold.</b></p>')
    rows = [[f["name"], f["kind"], "-" if f["distance"] is None else f"{f['distance']:.4f}", f"{f['threshold']:g}",
             f"{f['missing']['train_fraction']:.1%}", f"{f['missing']['serving_fraction']:.1%}",
             "SKEWED: " + "; ".join(f["reasons"]) if f["flagged"] else "ok", "; ".join(f["notes"])]
            for f in result["features"]]
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
        d = "-" if f["distance"] is None else f"{f['distance']:.3f}"
        charts.append(paired_bar_chart(f"{f['name']}: {d}" + (" (skewed)" if f["flagged"] else ""),
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
            "A feature also fails when its fraction of missing values rises by more than its threshold.</p>"
            + "".join(f"<p>{e}</p>" for e in extra)
            + table_html(["feature", "kind", "distance", "threshold", "missing (train)", "missing (served)", "verdict",
                          "notes"], rows)
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
