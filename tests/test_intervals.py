"""The confidence intervals printed beside every test metric (tfpipe/intervals.py)."""

from __future__ import annotations

import numpy as np
import pytest

from tfpipe.intervals import interval_record, interval_text, rmse_interval, wilson


@pytest.mark.parametrize("correct,n", [(5, 10), (0, 10), (10, 10), (32, 34), (9000, 10000), (1, 3)])
def test_wilson_intervals_match_statsmodels(correct, n):
    from statsmodels.stats.proportion import proportion_confint

    assert wilson(correct, n) == pytest.approx(proportion_confint(correct, n, alpha=0.05, method="wilson"), abs=1e-12)


def test_no_rows_no_interval():
    assert wilson(0, 0) is None and rmse_interval([4.0]) is None
    assert interval_record("accuracy", np.zeros(0, bool)) is None and interval_text(None) == ""


def test_the_rmse_interval_holds_the_rmse_narrows_with_rows_and_repeats():
    rng = np.random.default_rng(1)
    few, many = rng.normal(0, 2, 30) ** 2, rng.normal(0, 2, 3000) ** 2
    a, b = rmse_interval(few), rmse_interval(many)
    assert a[0] < np.sqrt(few.mean()) < a[1] and b[0] < np.sqrt(many.mean()) < b[1]
    assert b[1] - b[0] < (a[1] - a[0]) / 5  # 100x the rows: about a tenth of the width
    assert 1.9 < b[0] < 2.0 < b[1] < 2.1  # around the true 2
    assert rmse_interval(few) == a  # a fixed seed: the same rows, the same interval


def test_the_text_a_summary_line_prints():
    record = interval_record("accuracy", np.array([True] * 32 + [False] * 2))
    assert record["method"] == "Wilson score"
    assert interval_text(record) == " (95% CI 0.809-0.984)"
    assert interval_text(record, rows=34) == " (95% CI 0.809-0.984, 34 rows)"
