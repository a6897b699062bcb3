"""The served model against a trivial baseline on the same rows: the majority class of the
training split (classification) or its mean label (regression). A model no better than that
learned nothing a user can use, so the export refuses to publish it unless told to."""

from __future__ import annotations

from typing import Any

import numpy as np

from tfpipe.export.errors import ExportError
from tfpipe.intervals import interval_record, interval_text


def trivial_baseline(task: str, classes: list[Any] | None, train_label: dict[str, Any],
                     labels: np.ndarray) -> dict[str, Any]:
    """The trivial predictor's metric on `labels` (class indices, or the label's values), and
    what it predicts. `train_label` is the training split's label statistics (stats.json)."""
    labels = np.asarray(labels)
    if task == "regression":
        mean = float(train_label.get("mean") or 0.0)
        error = labels.astype(np.float64) - mean
        return {"predicts": f"the training mean, {mean:.6g}", "rmse": _rmse(error),
                "mae": float(np.mean(np.abs(error))) if len(error) else 0.0}
    distribution = train_label.get("distribution") or {}
    by_text = {str(c): i for i, c in enumerate(classes or [])}
    counts = {by_text[k]: n for k, n in distribution.items() if k in by_text}
    majority = max(sorted(counts), key=lambda i: counts[i]) if counts else 0
    accuracy = float(np.mean(labels == majority)) if len(labels) else 0.0
    return {"predicts": f"the majority class, {classes[majority]!r}" if classes else "class 0",
            "accuracy": accuracy}


def metric_format(metric: str):
    """How a summary line writes a value of `metric`: accuracy to 3 places, an RMSE to 4 figures
    (whole, with thousands' commas, from 1,000)."""
    if metric == "accuracy":
        return lambda v: f"{v:.3f}"
    return lambda v: f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"


def _rmse(error: np.ndarray) -> float:
    return float(np.sqrt(np.mean(error ** 2))) if len(error) else 0.0


PER_ROW = "_per_row"  # model_quality's per-row parts, for the paired tests (not kept in JSON)


def model_quality(pred: np.ndarray, labels: np.ndarray, task: str, per_row: bool = False) -> dict[str, Any]:
    """A model's metric from its own outputs: accuracy from class probabilities (binary: the
    probability of the second class, one column), or RMSE and MAE of its predictions. With
    `per_row`, each row's part of it under PER_ROW: whether it was right, or its squared error."""
    labels = np.asarray(labels)
    pred = np.asarray(pred, np.float64).reshape(len(labels), -1) if len(labels) else np.zeros((0, 1))
    if task == "regression":
        error = pred[:, 0] - labels.astype(np.float64)
        out, part = {"rmse": _rmse(error), "mae": float(np.mean(np.abs(error))) if len(error) else 0.0}, error ** 2
    else:
        classes = (pred[:, 0] >= 0.5).astype(np.int64) if task == "binary" else pred.argmax(axis=1)
        part = classes == labels
        out = {"accuracy": float(np.mean(part)) if len(labels) else 0.0}
    return {**out, PER_ROW: part} if per_row else out


def better_than_baseline(quality: dict[str, float], baseline: dict[str, Any]) -> bool:
    if "rmse" in quality:
        return quality["rmse"] < baseline["rmse"]
    return quality["accuracy"] > baseline["accuracy"]


def test_record(label, train_label: dict[str, Any], split: str, served: np.ndarray, labels: np.ndarray,
                allow_weak: bool | None, log) -> dict[str, Any]:
    """The SavedModel's own metric on `split` (`served`: its answers) beside the trivial
    baseline's, said in the log; a model no better than the baseline is not published unless
    `allow_weak`. `label`: the schema's label; `train_label`: its training statistics."""
    quality = model_quality(served, labels, label.task, per_row=True)
    metric = "rmse" if label.task == "regression" else "accuracy"
    test = {"split": split, "rows": int(len(labels)), **{k: v for k, v in quality.items() if k != PER_ROW},
            "interval": interval_record(metric, quality[PER_ROW]),
            "baseline": trivial_baseline(label.task, label.classes, train_label, labels)}
    log(f"  {split} {metric} {test[metric]:.4g}{interval_text(test['interval'], metric_format(metric))} on "
        f"{test['rows']:,} rows; {test['baseline']['predicts']} gives {test['baseline'][metric]:.4g}")
    check_baseline(test, allow_weak, log)
    return test


def check_baseline(test: dict[str, Any], allow_weak: bool | None, log) -> None:
    """Refuse to publish a model no better than the trivial baseline (`test`: split, rows, the
    model's metric and `baseline`), unless `allow_weak`, which publishes it with a warning.
    None: the caller decides (with a version served, the export's gate holds such a model)."""
    baseline = test["baseline"]
    if allow_weak is None or better_than_baseline(test, baseline):
        return
    metric = "rmse" if "rmse" in test else "accuracy"
    what = (f"the model's {metric} on the {test['split']} split ({test['rows']:,} rows) is {test[metric]:.4g}, "
            f"no better than {baseline['predicts']} ({baseline[metric]:.4g})")
    if allow_weak:
        log(f"  warning: {what}; published anyway (allow_weak)")
        return
    raise ExportError(f"{what}: nothing was published. More rows, more epochs (--set train.epochs=N) or more "
                      "informative columns may help; to publish it anyway: --allow-weak (tfpipe export) or "
                      "--set export.allow_weak=true (tfpipe run)")
