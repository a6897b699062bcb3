"""The statistics of the offline gate: may a retrained model (the candidate) replace the model
now served (the baseline)? Both answer the same labelled rows; the gate compares their metric on
all rows and on each slice (one value of one column), and passes a candidate only if it is not
worse beyond the sampling noise of that many rows and meets every threshold the user set.

Pure numpy and scipy: the caller runs the two models and drops the rows without a label."""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

TASKS = ("binary", "multiclass", "regression")
METRICS = ("accuracy", "rmse", "mae")
OPS = (">=", "<=", ">", "<")
FORMS = ("METRIC OP NUMBER or METRIC OP baseline[+|-NUMBER[%]], METRIC: accuracy, rmse, mae, OP: >=, <=, >, < "
         "(e.g. accuracy>=0.8, accuracy>=baseline-0.01, rmse<=baseline+5%)")
MISSING = "(missing)"  # the slice of the rows whose slice column has no value
CHUNK = 1 << 20  # row indices drawn at once by the bootstrap: its memory is O(max(rows, CHUNK))

_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?"
_VALUE = re.compile(rf"[+-]?{_NUMBER}")
_CHANGE = re.compile(rf"baseline(?:([+-])({_NUMBER})(%?))?")


@dataclass(frozen=True)
class Threshold:
    """One rule the candidate's metric must meet: `metric op value` (against "value"), or its
    change from the baseline's metric on the same rows: candidate - baseline (against "absolute")
    or (candidate - baseline) / |baseline| (against "relative"). `text`: as the user wrote it."""

    metric: str
    op: str
    value: float
    against: str
    text: str

    def bound(self, baseline: float | None) -> float:
        """The number the candidate's metric is compared with (a change threshold needs `baseline`)."""
        if self.against == "value":
            return self.value
        if baseline is None:
            raise ValueError(f"{self.text!r} needs the baseline's {self.metric}")
        return baseline + self.value * (abs(baseline) if self.against == "relative" else 1.0)

    def holds(self, candidate: float, baseline: float | None) -> bool:
        """Whether the candidate's metric meets it. A change threshold holds when there is no
        baseline (nothing to change from); a NaN metric meets nothing. Two numbers within 1e-9
        (relative) of each other count as equal, so that rmse<=baseline+10% holds for 0.165
        against 0.15, whose bound 0.15 + 10% of 0.15 is 0.16499999999999998 in floating point."""
        if self.against != "value" and baseline is None:
            return True
        bound = self.bound(baseline)
        tolerance = 1e-9 * max(1.0, abs(bound))
        return {">=": candidate >= bound - tolerance, ">": candidate > bound + tolerance,
                "<=": candidate <= bound + tolerance, "<": candidate < bound - tolerance}[self.op]


def parse_threshold(text: str) -> Threshold:
    """`METRIC OP NUMBER`, `METRIC OP baseline`, `METRIC OP baseline(+|-)NUMBER` or
    `METRIC OP baseline(+|-)NUMBER%`; spaces around and inside the parts after the metric, any
    case. Anything else: a ValueError of one line saying what is wrong and what is accepted."""
    text = text.strip()
    if not text:
        raise ValueError(f"empty threshold; accepted: {FORMS}")
    name = re.match(r"[a-z_][a-z0-9_]*", text, re.IGNORECASE)
    if not name:
        raise ValueError(f"no metric at the start of {text!r}; accepted: {FORMS}")
    metric, rest = name.group().lower(), re.sub(r"\s+", "", text[name.end():]).lower()
    if metric not in METRICS:
        raise ValueError(f"unknown metric {name.group()!r} in {text!r}: {', '.join(METRICS)}")
    op = re.match(r"[<>=!]*", rest).group()
    if op not in OPS:
        raise ValueError(f"{f'unknown comparison {op!r}' if op else 'no comparison'} in {text!r}; accepted: {FORMS}")
    value, against = _right_side(rest[len(op):], text)
    return Threshold(metric, op, value, against, text)


def _right_side(rhs: str, text: str) -> tuple[float, str]:
    """(value, against) of what follows the comparison."""
    if not rhs:
        raise ValueError(f"nothing to compare with in {text!r}; accepted: {FORMS}")
    if _VALUE.fullmatch(rhs):
        number, against = float(rhs), "value"
    elif change := _CHANGE.fullmatch(rhs):
        sign, digits, percent = change.groups()
        magnitude = float(digits) / (100.0 if percent else 1.0) if digits else 0.0
        number, against = -magnitude if sign == "-" else magnitude, "relative" if percent else "absolute"
    else:
        raise ValueError(f"cannot read {rhs!r} in {text!r}; accepted: {FORMS}")
    if not math.isfinite(number):
        raise ValueError(f"{rhs!r} in {text!r} is not a finite number; accepted: {FORMS}")
    return number, against


def check_thresholds(thresholds: list[Threshold], task: str) -> None:
    """A ValueError naming the first threshold whose metric the task has not: accuracy is for
    classification (binary, multiclass), rmse and mae for regression."""
    fits = _task_metrics(task)
    for t in thresholds:
        if t.metric not in fits:
            raise ValueError(f"threshold {t.text!r} does not fit a {task} model, whose metrics are: {', '.join(fits)}")


def _task_metrics(task: str) -> tuple[str, ...]:
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}: {', '.join(TASKS)}")
    return ("rmse", "mae") if task == "regression" else ("accuracy",)


def _column(values: Any, what: str) -> np.ndarray:
    """`values` as one value per row (a (rows, 1) array is taken as its one column)."""
    values = np.asarray(values)
    if values.ndim == 2 and values.shape[1] == 1:
        values = values[:, 0]
    if values.ndim != 1:
        raise ValueError(f"{what}: one value per row expected, got shape {values.shape}")
    return values


def per_row(task: str, predictions: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Each row's part of the metric: whether the predicted class equals the label (bool;
    classes of any comparable dtype), or the squared error (regression, float64)."""
    _task_metrics(task)
    predictions, labels = _column(predictions, "predictions"), _column(labels, "labels")
    if len(predictions) != len(labels):
        raise ValueError(f"{len(predictions)} predictions for {len(labels)} labels")
    if task == "regression":
        return (predictions.astype(np.float64) - labels.astype(np.float64)) ** 2
    right = np.asarray(predictions == labels)
    if right.shape != labels.shape:  # a comparison numpy would not make elementwise
        right = np.asarray(predictions.astype(object) == labels.astype(object))
    return right.astype(bool)


def metrics(task: str, predictions: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """{"accuracy"} (classification) or {"rmse", "mae"} (regression); NaN on zero rows, where
    there is nothing to measure (and so no threshold holds)."""
    return _summary(task, per_row(task, predictions, labels))


def _summary(task: str, part: np.ndarray) -> dict[str, float]:
    """metrics() from the rows' parts (per_row)."""
    if task != "regression":
        return {"accuracy": float(np.mean(part)) if len(part) else math.nan}
    if not len(part):
        return {"rmse": math.nan, "mae": math.nan}
    return {"rmse": float(np.sqrt(np.mean(part))), "mae": float(np.mean(np.sqrt(part)))}


def worse_p_value(task: str, candidate_part: np.ndarray, baseline_part: np.ndarray, seed: int = 0,
                  resamples: int = 2000) -> float:
    """The one-sided p-value of "the candidate is no worse than the baseline" on the same rows,
    from each row's part of the metric (per_row): small when the candidate is worse beyond the
    sampling noise of this many rows. 1.0 on zero rows.

    Classification, McNemar's exact test: of the rows the two disagree on, b have the baseline
    right and the candidate wrong, c the other way round; p = P(Binomial(b + c, 1/2) >= b).
    Regression, a paired bootstrap of rmse(candidate) - rmse(baseline) (see _bootstrap)."""
    _task_metrics(task)
    candidate_part, baseline_part = _column(candidate_part, "candidate"), _column(baseline_part, "baseline")
    if len(candidate_part) != len(baseline_part):
        raise ValueError(f"{len(candidate_part)} candidate rows against {len(baseline_part)} baseline rows")
    if not len(candidate_part):
        return 1.0
    if task != "regression":
        from scipy import stats

        candidate_part, baseline_part = candidate_part.astype(bool), baseline_part.astype(bool)
        b = int(np.sum(baseline_part & ~candidate_part))
        c = int(np.sum(candidate_part & ~baseline_part))
        return float(stats.binom.sf(b - 1, b + c, 0.5)) if b + c else 1.0
    return _bootstrap(np.asarray(candidate_part, np.float64), np.asarray(baseline_part, np.float64), seed, resamples)


def _bootstrap(candidate: np.ndarray, baseline: np.ndarray, seed: int, resamples: int) -> float:
    """(count + 1) / (resamples + 1), count: the resamples of the rows (drawn with replacement,
    the same rows for both models) on which the candidate's RMSE is no higher than the baseline's.
    `candidate`, `baseline`: squared errors. The draws come CHUNK indices at a time (at least one
    resample), so memory stays bounded whatever rows x resamples; the same seed, the same p."""
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, not {resamples}")
    rows = len(candidate)
    rng = np.random.default_rng(seed)
    per_chunk = max(1, CHUNK // rows)
    count = 0
    for start in range(0, resamples, per_chunk):
        index = rng.integers(0, rows, size=(min(per_chunk, resamples - start), rows))
        difference = (np.sqrt(np.take(candidate, index).sum(axis=1) / rows)
                      - np.sqrt(np.take(baseline, index).sum(axis=1) / rows))
        count += int(np.sum(difference <= 0))
    return (count + 1) / (resamples + 1)


@dataclass
class Check:
    """One judgement of the gate on some rows: the noise rule (p_value set) or a threshold."""

    data: str  # which rows: "new test split", "previous test split", ...
    slice: str | None  # None for all of them, else "column=value"
    rows: int
    metric: str
    candidate: float
    baseline: float | None
    p_value: float | None
    rule: str  # noise_rule(confidence), or the threshold's text
    passed: bool

    def as_json(self) -> dict[str, Any]:
        """Its fields, a NaN metric (no rows) as None."""
        return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in asdict(self).items()}

    def text(self) -> str:
        """One line for a user, e.g. "new test split, island=Dream (45 rows): accuracy 0.911 vs
        0.956 served, p=0.03: worse beyond the noise at 95% confidence"."""
        where = f"{self.data}, {self.slice}" if self.slice else self.data
        what = f"{self.metric} {_number(self.metric, self.candidate)}"
        if self.baseline is not None:
            what += f" vs {_number(self.metric, self.baseline)} served"
        if self.p_value is not None:
            judged = self.rule if self.passed else self.rule.removeprefix("not ")
            return f"{where} ({_rows(self.rows)}): {what}, p={self.p_value:.2g}: {judged}"
        return f"{where} ({_rows(self.rows)}): {what}: {'meets' if self.passed else 'fails'} {self.rule}"


def _number(metric: str, x: float) -> str:
    if metric == "accuracy" or not math.isfinite(x):
        return f"{x:.3f}"
    return f"{x:.0f}" if abs(x) >= 1000 else f"{x:.4g}"


def _rows(n: int) -> str:
    return "1 row" if n == 1 else f"{n:,} rows"


def noise_rule(confidence: float) -> str:
    """The rule text of the noise check; its failure reads the same without the "not "."""
    return f"not worse beyond the noise at {confidence * 100:g}% confidence"


def compare(data: str, task: str, labels: Any, candidate: Any, baseline: Any, thresholds: list[Threshold],
            confidence: float = 0.95, slices: dict[str, Any] | None = None, min_slice_rows: int = 10,
            seed: int = 0) -> list[Check]:
    """The gate's checks of the candidate's answers against the baseline's (None: no baseline)
    on the rows `data` names (`labels`: theirs, same length): on all rows, then for each column
    of `slices` (name -> one value per row) on each of its values with at least `min_slice_rows`
    rows, sorted, then its missing values (None, NaN, "") as the slice "(missing)"; smaller
    slices are skipped. On each: the noise rule on accuracy (regression: rmse) when there is a
    baseline, passed if worse_p_value(...) >= 1 - confidence; then one check per threshold
    (change thresholds only with a baseline)."""
    check_thresholds(thresholds, task)
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be between 0 and 1, not {confidence}")
    labels, candidate = _column(labels, "labels"), _column(candidate, "candidate")
    baseline = None if baseline is None else _column(baseline, "baseline")
    for what, values in (("candidate", candidate), ("baseline", baseline), *(slices or {}).items()):
        if values is not None and len(values) != len(labels):
            raise ValueError(f"{what}: {len(values)} values for {len(labels)} labelled rows")

    def judge(where: str | None, rows: np.ndarray | slice) -> list[Check]:
        return _checks(data, where, task, labels[rows], candidate[rows], None if baseline is None else baseline[rows],
                       thresholds, confidence, seed)

    checks = judge(None, slice(None))
    for column, values in (slices or {}).items():
        for value, rows in _groups(_column(values, f"slice column {column!r}")):
            if len(rows) >= min_slice_rows:
                checks += judge(f"{column}={value}", rows)
    return checks


def _checks(data: str, where: str | None, task: str, labels: np.ndarray, candidate: np.ndarray,
            baseline: np.ndarray | None, thresholds: list[Threshold], confidence: float, seed: int) -> list[Check]:
    """compare()'s checks on one set of rows."""
    mine = per_row(task, candidate, labels)
    ours = _summary(task, mine)
    theirs = None if baseline is None else per_row(task, baseline, labels)
    summary = None if theirs is None else _summary(task, theirs)
    checks = []
    if theirs is not None:
        primary = _task_metrics(task)[0]
        p = worse_p_value(task, mine, theirs, seed)
        checks.append(Check(data, where, len(labels), primary, ours[primary], summary[primary], p,
                            noise_rule(confidence), p >= 1.0 - confidence))
    for t in thresholds:
        if summary is None and t.against != "value":
            continue
        base = None if summary is None else summary[t.metric]
        checks.append(Check(data, where, len(labels), t.metric, ours[t.metric], base, None, t.text,
                            t.holds(ours[t.metric], base)))
    return checks


def _groups(values: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """(value as text, its row indices) for each distinct value, sorted (values numpy cannot
    order, such as numbers mixed with text, by their text), then (MISSING, rows without one)."""
    missing = _missing(values)
    present = np.flatnonzero(~missing)
    try:
        keys, inverse, counts = np.unique(values[present], return_inverse=True, return_counts=True)
    except TypeError:
        text = np.array([str(v) for v in values[present]], dtype=str)
        keys, inverse, counts = np.unique(text, return_inverse=True, return_counts=True)
    rows = np.split(present[np.argsort(inverse.ravel(), kind="stable")], np.cumsum(counts)[:-1])
    groups = [(str(k.item() if isinstance(k, np.generic) else k), r) for k, r in zip(keys, rows)]
    return groups + ([(MISSING, np.flatnonzero(missing))] if missing.any() else [])


def _missing(values: np.ndarray) -> np.ndarray:
    """Which values are missing: None, NaN, NaT or the empty string."""
    kind = values.dtype.kind
    if kind in "fc":
        return np.isnan(values)
    if kind in "US":
        return np.char.str_len(values) == 0
    if kind in "mM":
        return np.isnat(values)
    if kind == "O":
        return np.array([v is None or (isinstance(v, (str, bytes)) and not v)
                         or (isinstance(v, (float, np.floating)) and math.isnan(v)) for v in values], dtype=bool)
    return np.zeros(len(values), dtype=bool)


def verdict(checks: list[Check]) -> tuple[bool, list[str]]:
    """(whether every check passed, the line of each one that did not)."""
    failed = [c.text() for c in checks if not c.passed]
    return not failed, failed
