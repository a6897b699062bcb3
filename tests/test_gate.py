"""The offline gate's statistics (export/gate.py): thresholds, per-row parts and metrics, the
paired tests (McNemar, bootstrap) and compare()'s checks on all rows and on slices."""

from __future__ import annotations

import json
import math
import re
import tracemalloc

import numpy as np
import pytest

from tfpipe.export.gate import (Check, Threshold, check_thresholds, compare, metrics, noise_rule, parse_threshold,
                                per_row, verdict, worse_p_value)

NOISE_FAIL = "worse beyond the noise at 95% confidence"


@pytest.mark.parametrize("text, metric, op, value, against", [
    ("accuracy>=0.8", "accuracy", ">=", 0.8, "value"),
    ("  RMSE <= 1200 ", "rmse", "<=", 1200.0, "value"),
    ("mae<3.5e2", "mae", "<", 350.0, "value"),
    ("accuracy > .75", "accuracy", ">", 0.75, "value"),
    ("accuracy >= baseline", "accuracy", ">=", 0.0, "absolute"),
    ("accuracy>=baseline-0.01", "accuracy", ">=", -0.01, "absolute"),
    ("mae <= BASELINE + 2", "mae", "<=", 2.0, "absolute"),
    ("rmse<=baseline+5%", "rmse", "<=", 0.05, "relative"),
    ("Accuracy > baseline - 2.5 %", "accuracy", ">", -0.025, "relative"),
])
def test_thresholds_parse(text, metric, op, value, against):
    t = parse_threshold(text)
    assert (t.metric, t.op, t.against, t.text) == (metric, op, against, text.strip())
    assert t.value == pytest.approx(value)


@pytest.mark.parametrize("text, message", [
    ("f1>=0.8", "unknown metric 'f1' in 'f1>=0.8': accuracy, rmse, mae"),
    ("", "empty threshold"),
    (">=0.8", "no metric at the start of '>=0.8'"),
    ("accuracy 0.8", "no comparison in 'accuracy 0.8'"),
    ("accuracy=>0.8", "unknown comparison '=>' in 'accuracy=>0.8'"),
    ("accuracy==0.8", "unknown comparison '=='"),
    ("accuracy>=", "nothing to compare with in 'accuracy>='"),
    ("accuracy>=high", "cannot read 'high'"),
    ("accuracy>=80%", "cannot read '80%'"),
    ("rmse<=baseline*1.05", "cannot read 'baseline*1.05'"),
    ("rmse<=baseline+-5", "cannot read 'baseline+-5'"),
    ("accuracy>=1e999", "'1e999' in 'accuracy>=1e999' is not a finite number"),
])
def test_bad_thresholds_say_what_is_wrong_in_one_line(text, message):
    with pytest.raises(ValueError, match=re.escape(message)) as caught:
        parse_threshold(text)
    said = str(caught.value)
    assert "\n" not in said
    if "metric" not in message:  # the metric's message lists the metrics; the others the forms
        assert "METRIC OP NUMBER" in said and "rmse<=baseline+5%" in said


@pytest.mark.parametrize("text, candidate, baseline, holds", [
    ("accuracy>=0.8", 0.8, None, True),
    ("accuracy>=0.8", 0.79, None, False),
    ("accuracy>0.8", 0.8, None, False),
    ("accuracy>=0.8", 0.85, 0.99, True),  # a value threshold ignores the baseline
    ("rmse<1200", 1199.9, None, True),
    ("rmse<=1200", 1200.1, None, False),
    ("accuracy>=0.8", math.nan, None, False),
    ("accuracy>=baseline", 0.9, 0.9, True),
    ("accuracy>=baseline", 0.89, 0.9, False),
    ("accuracy>baseline", 0.9, 0.9, False),
    ("accuracy>=baseline-0.01", 0.90, 0.91, True),
    ("accuracy>=baseline-0.01", 0.899, 0.91, False),
    ("accuracy>baseline-0.01", 0.90, 0.91, False),
    ("mae<baseline+2", 11.9, 10.0, True),
    ("mae<baseline+2", 12.0, 10.0, False),
    ("rmse<=baseline+5%", 105.0, 100.0, True),
    ("rmse<=baseline+5%", 105.1, 100.0, False),
    ("rmse<baseline+5%", 105.0, 100.0, False),
    ("rmse<=baseline-10%", 90.0, 100.0, True),
    ("rmse<=baseline+10%", 0.165, 0.15, True),  # 0.15 + 10% of 0.15 is 0.16499999999999998 in floating point
    ("rmse<baseline+10%", 0.165, 0.15, False),
    ("rmse<=baseline-10%", 90.1, 100.0, False),
    ("mae<=baseline+10%", -9.0, -10.0, True),  # a negative baseline: the change is relative to |baseline|
    ("mae<=baseline+10%", -8.9, -10.0, False),
    ("mae>=baseline-10%", -11.0, -10.0, True),
    ("mae>=baseline-10%", -11.1, -10.0, False),
    ("rmse<=baseline+5%", 0.0, 0.0, True),
    ("rmse<=baseline+5%", 0.001, 0.0, False),
    ("accuracy>=baseline+0.5", 0.1, None, True),  # no baseline: a change threshold holds
    ("rmse<=baseline+5%", 1e9, None, True),
])
def test_threshold_holds(text, candidate, baseline, holds):
    assert parse_threshold(text).holds(candidate, baseline) is holds


@pytest.mark.parametrize("texts, task, wrong", [
    (["accuracy>=0.8", "accuracy>=baseline"], "binary", None),
    (["accuracy>=0.8"], "multiclass", None),
    (["rmse<=1200", "mae<=baseline+5%"], "regression", None),
    (["accuracy>=0.8", "rmse<=1200"], "binary", "threshold 'rmse<=1200' does not fit a binary model"),
    (["mae<1"], "multiclass", "threshold 'mae<1' does not fit a multiclass model, whose metrics are: accuracy"),
    (["accuracy>=0.8"], "regression", "threshold 'accuracy>=0.8' does not fit a regression model"),
    ([], "ranking", "unknown task 'ranking'"),
])
def test_thresholds_must_fit_the_task(texts, task, wrong):
    thresholds = [parse_threshold(t) for t in texts]
    if wrong is None:
        check_thresholds(thresholds, task)
    else:
        with pytest.raises(ValueError, match=re.escape(wrong)):
            check_thresholds(thresholds, task)


@pytest.mark.parametrize("task, predictions, labels, expected", [
    ("binary", np.array(["yes", "no", "yes"]), np.array(["yes", "yes", "yes"]), [True, False, True]),
    ("multiclass", np.array(["Adelie", "Gentoo", None], dtype=object), np.array(["Adelie", "Chinstrap", "Gentoo"]),
     [True, False, False]),
    ("multiclass", np.array([0, 1, 2]), np.array([0, 2, 2]), [True, False, True]),
    ("binary", np.array(["1", "0"]), np.array([1, 0]), [False, False]),  # text is not a number
    ("regression", np.array([1.0, 2.5, -1.0]), np.array([0, 2, 1]), [1.0, 0.25, 4.0]),
    ("regression", np.array([[3.0], [4.0]]), np.array([1.0, 4.0]), [4.0, 0.0]),  # a (rows, 1) model output
])
def test_per_row(task, predictions, labels, expected):
    part = per_row(task, predictions, labels)
    assert part.dtype == (np.float64 if task == "regression" else bool)
    assert part.tolist() == expected


@pytest.mark.parametrize("task, predictions, labels, expected", [
    ("binary", ["a", "b", "a"], ["a", "a", "a"], {"accuracy": 2 / 3}),
    ("regression", [1.0, 2.5, -1.0], [0.0, 2.0, 1.0], {"rmse": math.sqrt(5.25 / 3), "mae": 3.5 / 3}),
    ("multiclass", np.array([], dtype=str), np.array([], dtype=str), {"accuracy": math.nan}),
    ("regression", np.zeros(0), np.zeros(0), {"rmse": math.nan, "mae": math.nan}),
])
def test_metrics(task, predictions, labels, expected):
    got = metrics(task, np.asarray(predictions), np.asarray(labels))
    assert got.keys() == expected.keys()
    for k, v in expected.items():
        assert (math.isnan(got[k]) and math.isnan(v)) or got[k] == pytest.approx(v)


def test_mismatched_lengths_are_refused():
    with pytest.raises(ValueError, match="3 predictions for 2 labels"):
        per_row("binary", np.array([1, 2, 3]), np.array([1, 2]))


def _mcnemar_rows(b: int, c: int) -> tuple[np.ndarray, np.ndarray]:
    """(candidate right, baseline right): b rows only the baseline has right, c only the
    candidate, plus rows both have right or wrong (which must not count)."""
    candidate = [False] * b + [True] * c + [True] * 7 + [False] * 3
    baseline = [True] * b + [False] * c + [True] * 7 + [False] * 3
    return np.array(candidate), np.array(baseline)


@pytest.mark.parametrize("b, c", [(8, 1), (1, 8), (5, 5), (10, 0), (0, 10), (3, 0), (0, 0), (30, 12)])
def test_mcnemar_is_the_exact_binomial_tail(b, c):
    n = b + c
    expected = sum(math.comb(n, k) for k in range(b, n + 1)) / 2 ** n if n else 1.0
    candidate, baseline = _mcnemar_rows(b, c)
    assert worse_p_value("multiclass", candidate, baseline) == pytest.approx(expected, rel=1e-9)


def _errors(rows: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, 1.0, rows)


@pytest.mark.parametrize("scale, resamples, check", [
    (2.0, 2000, lambda p: p < 0.01),  # errors twice as large: worse beyond any doubt
    (2.0, 99, lambda p: p == 1 / 100),  # no resample has it better: (0 + 1) / (99 + 1)
    (1.0, 2000, lambda p: p == 1.0),  # the same errors: never worse (p ~ 1)
    (0.5, 2000, lambda p: p == 1.0),  # smaller errors
])
def test_bootstrap_p_value(scale, resamples, check):
    e = _errors(500)
    p = worse_p_value("regression", (scale * e) ** 2, e ** 2, seed=3, resamples=resamples)
    assert check(p), p


def test_bootstrap_is_deterministic_for_a_seed():
    baseline, candidate = _errors(400, 1) ** 2, _errors(400, 2) ** 2  # same spread: p somewhere in the middle
    p = worse_p_value("regression", candidate, baseline, seed=7)
    assert 0.01 < p < 0.99
    assert worse_p_value("regression", candidate, baseline, seed=7) == p
    assert worse_p_value("regression", candidate, baseline, seed=8) != p


@pytest.mark.parametrize("task", ["binary", "regression"])
def test_no_rows_is_no_evidence(task):
    assert worse_p_value(task, np.zeros(0), np.zeros(0)) == 1.0


def test_bootstrap_memory_stays_bounded():
    """20,000 rows x 2,000 resamples drawn at once would be 320 MB of indices (and as much of
    each model's errors); in chunks it stays a few tens of MB."""
    e = _errors(20_000)
    candidate, baseline = (1.05 * e) ** 2, e ** 2
    tracemalloc.start()
    try:
        p = worse_p_value("regression", candidate, baseline, resamples=2000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert 0 < p <= 1
    assert peak < 64 * 2 ** 20, f"{peak / 2 ** 20:.0f} MB"


def _classes(rows: int, accuracy: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(labels, predictions right on the first `accuracy` share of rows, wrong on the rest)."""
    labels = np.random.default_rng(seed).choice(np.array(["Adelie", "Chinstrap", "Gentoo"]), rows)
    predictions = labels.copy()
    wrong = np.arange(rows) >= round(accuracy * rows)
    predictions[wrong] = np.where(labels[wrong] == "Adelie", "Gentoo", "Adelie")
    return labels, predictions


def _spoil(labels: np.ndarray, predictions: np.ndarray, rows: np.ndarray) -> np.ndarray:
    spoilt = predictions.copy()
    spoilt[rows] = np.where(labels[rows] == "Chinstrap", "Gentoo", "Chinstrap")
    return spoilt


def test_a_candidate_equal_to_the_baseline_passes():
    labels, baseline = _classes(400, 0.9)
    checks = compare("new test split", "multiclass", labels, baseline.copy(), baseline, [])
    assert [(c.slice, c.metric, c.rows, c.p_value, c.passed) for c in checks] == [(None, "accuracy", 400, 1.0, True)]
    assert verdict(checks) == (True, [])


def test_a_candidate_wrong_on_30_percent_more_rows_fails_the_noise_rule():
    labels, baseline = _classes(400, 0.9)
    candidate = _spoil(labels, baseline, np.random.default_rng(1).choice(400, 120, replace=False))
    ok, lines = verdict(compare("new test split", "multiclass", labels, candidate, baseline, []))
    assert not ok and len(lines) == 1
    assert lines[0].startswith("new test split (400 rows): accuracy ") and lines[0].endswith(NOISE_FAIL)


@pytest.mark.parametrize("column, missing, dtype", [
    ("island", None, object), ("island", float("nan"), object), ("island", "", str),
    ("year", float("nan"), float),  # a number column: NaN is its missing value
])
def test_slices_judge_each_value_on_its_own(column, missing, dtype):
    """Three values of 150 rows, one of 5 (skipped), 20 rows without a value; the candidate is
    wrong on 40% of one value's rows and equal to the baseline on the others."""
    values = {"island": ["Torgersen", "Biscoe", "Dream", "Tiny"], "year": [2009.0, 2007.0, 2008.0, 2010.0]}[column]
    column_values = np.array([values[0]] * 150 + [values[1]] * 150 + [values[2]] * 150 + [values[3]] * 5
                             + [missing] * 20, dtype=dtype)
    labels, baseline = _classes(len(column_values), 0.95, seed=2)
    candidate = _spoil(labels, baseline, np.arange(300, 360))
    checks = compare("new test split", "multiclass", labels, candidate, baseline, [],
                     slices={column: column_values}, min_slice_rows=10)
    by_slice = {c.slice: c for c in checks}
    degraded = f"{column}={values[2]}"
    expected = [None, f"{column}={values[1]}", degraded, f"{column}={values[0]}", f"{column}=(missing)"]
    assert [c.slice for c in checks] == expected  # sorted by value, the missing last, the tiny one skipped
    assert [s for s, c in by_slice.items() if s and not c.passed] == [degraded]
    assert by_slice[degraded].rows == 150 and by_slice[f"{column}=(missing)"].rows == 20
    assert f"new test split, {degraded} (150 rows): accuracy" in verdict(checks)[1][-1]


def test_regression_checks_rmse_and_thresholds():
    rng = np.random.default_rng(4)
    labels = rng.normal(100.0, 20.0, 400)
    baseline = labels + rng.normal(0.0, 5.0, 400)
    worse = labels + rng.normal(0.0, 10.0, 400)
    thresholds = [parse_threshold(t) for t in ("rmse<=baseline+5%", "mae<=100")]
    for candidate, passed in ((baseline.copy(), [True, True, True]), (worse, [False, False, True])):
        checks = compare("new test split", "regression", labels, candidate, baseline, thresholds)
        assert [c.metric for c in checks] == ["rmse", "rmse", "mae"]
        assert [c.passed for c in checks] == passed
        assert checks[0].rule == noise_rule(0.95) and checks[1].rule == "rmse<=baseline+5%"
        assert checks[1].baseline == pytest.approx(metrics("regression", baseline, labels)["rmse"])


@pytest.mark.parametrize("text, passed", [
    ("accuracy>=0.9", True),
    ("accuracy>0.94", False),
    ("accuracy>=baseline", False),
    ("accuracy>=baseline-0.02", True),
    ("accuracy>=baseline-1%", False),  # 0.94 against 0.95 - 1% of 0.95 = 0.9405
    ("accuracy>=baseline-2%", True),  # 0.931
])
def test_thresholds_in_compare(text, passed):
    """The candidate is wrong on 4 more of 400 rows: 0.94 against 0.95, within the noise
    (p = 1/16), so only the threshold can fail."""
    labels, baseline = _classes(400, 0.95)
    candidate = _spoil(labels, baseline, np.arange(4))
    noise, check = compare("previous test split", "binary", labels, candidate, baseline, [parse_threshold(text)])
    assert noise.passed and noise.p_value == pytest.approx(1 / 16)
    assert (check.candidate, check.baseline, check.p_value, check.rule) == (0.94, 0.95, None, text)
    assert check.passed is passed
    ok, lines = verdict([noise, check])
    assert ok is passed
    line = f"previous test split (400 rows): accuracy 0.940 vs 0.950 served: fails {text}"
    assert lines == ([] if passed else [line])


def test_without_a_baseline_only_value_thresholds_are_checked():
    labels, candidate = _classes(200, 0.85)
    thresholds = [parse_threshold(t) for t in ("accuracy>=0.9", "accuracy>=baseline")]
    checks = compare("new test split", "binary", labels, candidate, None, thresholds, slices={"s": ["a"] * 200})
    assert [(c.slice, c.rule, c.baseline, c.p_value, c.passed) for c in checks] == [
        (None, "accuracy>=0.9", None, None, False), ("s=a", "accuracy>=0.9", None, None, False)]
    assert checks[0].text() == "new test split (200 rows): accuracy 0.850: fails accuracy>=0.9"


@pytest.mark.parametrize("kwargs, message", [
    ({"thresholds": [parse_threshold("rmse<=1")]}, "does not fit a binary model"),
    ({"baseline": np.array(["a"] * 3)}, "baseline: 3 values for 4 labelled rows"),
    ({"slices": {"island": ["x"] * 5}}, "island: 5 values for 4 labelled rows"),
    ({"confidence": 95}, "confidence must be between 0 and 1"),
])
def test_compare_refuses_what_does_not_fit(kwargs, message):
    args = {"labels": np.array(["a"] * 4), "candidate": np.array(["a"] * 4), "baseline": None, "thresholds": [],
            **kwargs}
    with pytest.raises(ValueError, match=re.escape(message)):
        compare("new test split", "binary", **args)


def test_a_check_reads_as_one_line_and_as_json():
    check = Check("new test split", "island=Dream", 45, "accuracy", 41 / 45, 43 / 45, 0.03, noise_rule(0.95), False)
    assert check.text() == ("new test split, island=Dream (45 rows): accuracy 0.911 vs 0.956 served, p=0.03: "
                            "worse beyond the noise at 95% confidence")
    check.passed = True
    assert check.text().endswith(": not worse beyond the noise at 95% confidence")
    empty = Check("new test split", None, 0, "rmse", math.nan, None, None, "rmse<=10", False)
    assert json.loads(json.dumps(empty.as_json(), allow_nan=False))["candidate"] is None
    assert Check.__dataclass_fields__.keys() == empty.as_json().keys()
    assert isinstance(parse_threshold("rmse<=10"), Threshold)
