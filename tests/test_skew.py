"""`tfpipe skew`'s pieces on tables: the distances, the bins, the thresholds, and the rows it reads
out of each kind of logged request. The end-to-end checks (eval traffic passes inside `tfpipe run`,
shifted traffic fails naming the feature) are in test_run.py, on the run's served model."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest


@pytest.mark.parametrize("p, q, want", [
    ([1, 2, 3], [1, 2, 3], 0.0),
    ([10, 20, 30], [1, 2, 3], 0.0),          # counts are normalised
    ([1, 0], [0, 1], 1.0),                   # nothing in common: one bit
    ([1, 1], [1, 0], 1.5 - 0.75 * math.log2(3)),  # 0.311..., worked by hand
])
def test_jensen_shannon_divergence_in_bits(p, q, want):
    from tfpipe.skew.measure import js_divergence

    assert js_divergence(p, q) == pytest.approx(want, abs=1e-12)
    assert js_divergence(q, p) == pytest.approx(want, abs=1e-12)  # symmetric


@pytest.mark.parametrize("p, q", [([1, 2], [1, 2, 3]), ([0, 0], [1, 1])])
def test_jensen_shannon_refuses_what_is_not_two_distributions(p, q):
    from tfpipe.skew.measure import js_divergence

    with pytest.raises(ValueError):
        js_divergence(p, q)


@pytest.mark.parametrize("p, q, distance, where", [
    ({"a": 5, "b": 5}, {"a": 5, "b": 5}, 0.0, None),
    ({"a": 5, "b": 5}, {"a": 9, "b": 1}, 0.4, "a"),
    ({"a": 1}, {"b": 3}, 1.0, "a"),  # ties: the first value in order
    ({"a": 8, "b": 2}, {"a": 8, "b": 1, "c": 1}, 0.1, "b"),
])
def test_l_infinity_names_the_value_that_moved_most(p, q, distance, where):
    from tfpipe.skew.measure import linf

    d, w = linf(Counter(p), Counter(q))
    assert d == pytest.approx(distance) and w == where


@pytest.mark.parametrize("quantiles, values, edges, counts", [
    ({"0.25": 1.0, "0.5": 2.0, "0.75": 3.0}, [0.5, 1.0, 1.5, 2.5, 3.0, 9.0], [1, 2, 3], [1, 2, 1, 2]),
    ({"0.25": 5.0, "0.5": 5.0, "0.75": 7.0}, [4.0, 5.0, 6.0, 7.0], [5, 7], [1, 2, 1]),  # a repeated quantile
    ({"0.5": None}, [1.0, 2.0], [], [2]),  # a feature with no values in training: one bin
])
def test_train_quantiles_become_bins_with_open_outer_ends(quantiles, values, edges, counts):
    from tfpipe.skew.measure import bin_counts, bin_labels, quantile_edges

    e = quantile_edges(quantiles)
    assert e.tolist() == edges
    assert bin_counts(np.array(values), e).tolist() == counts
    assert len(bin_labels(e)) == len(counts)


def test_numeric_comparison_counts_values_beyond_the_training_range():
    from tfpipe.skew.measure import compare_numeric

    stats = {"min": 0.0, "max": 10.0, "quantiles": {"0.5": 5.0}}
    train = np.array([1.0, 2.0, 8.0, 9.0])
    same = compare_numeric(train, train.copy(), stats)
    assert same["distance"] == 0.0 and same["out_of_range"]["fraction"] == 0.0
    moved = compare_numeric(train, np.array([-1.0, 12.0, 13.0, 14.0, 3.0]), stats)
    assert moved["out_of_range"] == {"below_min": 1, "above_max": 3, "train_min": 0.0, "train_max": 10.0,
                                     "fraction": 0.8}
    assert moved["serving_histogram"] == [2, 3]
    up = compare_numeric(train, np.array([6.0, 7.0, 12.0]), stats)
    assert up["serving_histogram"] == [0, 3] and up["distance"] == pytest.approx(1.5 - 0.75 * math.log2(3))
    assert compare_numeric(train, np.zeros(0), stats)["distance"] is None  # never sent: no distribution


def test_categorical_comparison_lists_values_training_never_saw():
    from tfpipe.skew.measure import compare_categorical

    r = compare_categorical(["x"] * 6 + ["y"] * 4, ["x"] * 5 + ["z"] * 5)
    assert r["distance"] == pytest.approx(0.5) and r["most_changed"] == "z"
    assert r["new_categories"] == {"values": [["z", 5]], "distinct": 1, "fraction": 0.5}
    assert [v for v, _, _ in r["values"]] == ["x", "z", "y"]


@pytest.mark.parametrize("items, default, per_feature", [
    ([], 0.1, {}),
    (["0.2"], 0.2, {}),
    (["fare=0.3", "0.05"], 0.05, {"fare": 0.3}),
    (["a=b=0.4"], 0.1, {"a=b": 0.4}),  # the last '=' splits
])
def test_thresholds_default_and_per_feature(items, default, per_feature):
    from tfpipe.skew.config import parse_thresholds

    assert parse_thresholds(items) == (default, per_feature)


@pytest.mark.parametrize("item", ["1.5", "-0.1", "fare=", "=0.2", "fare=high"])
def test_bad_thresholds_are_refused_with_the_item(item):
    from tfpipe.skew.config import parse_thresholds

    with pytest.raises(ValueError, match="threshold"):
        parse_thresholds([item])


@pytest.mark.parametrize("missing_train, n_train, missing_serving, n_serving, rise", [
    (0, 100, 0, 50, 0.0),
    (10, 100, 25, 50, 0.4),
    (50, 100, 0, 50, 0.0),  # fewer missing in serving is no rise
    (0, 100, 0, 0, 0.0),
])
def test_missing_rise(missing_train, n_train, missing_serving, n_serving, rise):
    from tfpipe.skew.measure import missing_rise

    assert missing_rise(missing_train, n_train, missing_serving, n_serving) == pytest.approx(rise)


# ---- the noise bound: how far chance alone moves a sample of the traffic's size ----------------------

@pytest.mark.parametrize("p, n, confidence", [(0.5, 34, 0.99), (0.3, 50, 0.99), (0.5, 400, 0.95), (0.1, 1000, 0.99)])
def test_l_infinity_noise_bound_matches_the_binomial_by_hand(p, n, confidence):
    """Two categories: the L-infinity distance of a sample is |k/n - p| with k ~ Binomial(n, p), so
    the bound must be that distance's exact quantile, here summed from scipy's binomial pmf."""
    from scipy.stats import binom

    from tfpipe.skew.measure import noise_bound

    k = np.arange(n + 1)
    d, w = np.abs(k / n - p), binom.pmf(k, n, p)
    order = np.argsort(d)
    exact = d[order][np.searchsorted(np.cumsum(w[order]), confidence)]
    got = noise_bound([p * 1000, (1 - p) * 1000], n, "l_infinity", confidence)
    assert abs(got - exact) <= 1.5 / n + 1e-9  # within about one step of the sample's 1/n grid


@pytest.mark.parametrize("n", [34, 200, 5000])
def test_jensen_shannon_noise_bound_shrinks_with_the_sample_and_holds_its_confidence(n):
    """Samples drawn anew (another seed than the bound's) stay under the bound about as often as
    its confidence says, and the bound falls like 1/n (the divergence of a sample is ~ chi2/n)."""
    from tfpipe.skew.measure import js_divergence, noise_bound

    train = np.array([1, 4, 5, 15, 25, 25, 15, 5, 4, 1], dtype=float)
    bound = noise_bound(train, n, "jensen_shannon", 0.99)
    rng = np.random.default_rng(7)
    under = np.mean([js_divergence(train, rng.multinomial(n, train / train.sum()) + 0.0) <= bound
                     for _ in range(1000)])
    assert 0.975 <= under <= 1.0
    if n == 5000:
        assert bound < noise_bound(train, 200, "jensen_shannon", 0.99) / 10


@pytest.mark.parametrize("codes, want", [
    ([np.arange(100)], 100.0),                              # every row distinct
    ([np.tile(np.arange(34), 500)], 34.0),                  # 34 rows sent 500 times each: 34
    ([np.array([0, 0, 1, 1]), np.array([0, 1, 0, 1])], 4.0),  # distinct as whole rows
    ([np.array([0, 0, 0, 1])], 1.6),                        # 3 and 1: 16 / 10
    ([np.zeros(0, dtype=int)], 0.0),
])
def test_effective_rows_count_a_repeated_row_once(codes, want):
    from tfpipe.skew.measure import effective_rows

    assert effective_rows(codes) == pytest.approx(want)


def test_missing_noise_bound_is_zero_when_training_never_misses():
    from tfpipe.skew.measure import missing_noise_bound

    assert missing_noise_bound(0.0, 50, 0.99) == 0.0
    assert 0.05 < missing_noise_bound(0.1, 50, 0.99) < 0.2  # Binomial(50, 0.1): 99th percentile 11/50 - 0.1
    assert missing_noise_bound(0.1, 0, 0.99) is None


def _column(values):
    from tfpipe.pipeline.validation import Column

    values = np.array(values, dtype=object if isinstance(values[0], str) else np.float64)
    present = values != "" if values.dtype == object else ~np.isnan(values)
    return Column(values, present)


@pytest.mark.parametrize("serving, n_eff, verdict", [
    # training: red 40%, green 30%, blue 30%. 34 rows at 56% red: 0.16 over the 0.1 threshold, within
    # the noise of 34 rows (about 0.22 at 99%)
    (["red"] * 19 + ["green"] * 8 + ["blue"] * 7, None, "within noise"),
    # the same shares as 3,400 rows that are 34 rows sent 100 times: still 34 rows' worth of evidence
    ((["red"] * 19 + ["green"] * 8 + ["blue"] * 7) * 100, 34.0, "within noise"),
    # 3,400 distinct rows with those shares: skew
    ((["red"] * 19 + ["green"] * 8 + ["blue"] * 7) * 100, None, "skewed"),
    # 50 rows with red's share moved by 0.5 (90%): skew
    (["red"] * 45 + ["green"] * 3 + ["blue"] * 2, None, "skewed"),
    (["red"] * 4 + ["green"] * 3 + ["blue"] * 3, None, "ok"),
])
def test_categorical_verdict_weighs_the_distance_against_the_noise(serving, n_eff, verdict):
    from tfpipe.skew.job import feature_verdict

    train = _column(["red"] * 400 + ["green"] * 300 + ["blue"] * 300)
    f = feature_verdict("color", "string", train, _column(serving), {}, {}, 0.1, n_eff, 0.99)
    assert f["verdict"] == verdict and f["flagged"] == (verdict == "skewed")
    assert f["noise_bound"] is not None and f["measure"] == "l_infinity"
    if verdict == "within noise":
        assert f["distance"] > 0.1 and f["distance"] <= f["noise_bound"] and not f["reasons"]
        assert "within the noise of 34 rows" in f["within_noise"][0]
    if verdict == "skewed":
        assert f["distance"] > f["noise_bound"] and "beyond the noise bound" in f["reasons"][0]


def test_numeric_verdict_flags_a_shift_that_a_small_sample_cannot_explain():
    from tfpipe.skew.job import feature_verdict

    rng = np.random.default_rng(3)
    train_values = rng.normal(50, 10, 2000)
    stats = {"min": float(train_values.min()), "max": float(train_values.max()),
             "quantiles": {str(q): float(np.quantile(train_values, q)) for q in (0.01, 0.05, 0.1, 0.25, 0.5, 0.75,
                                                                              0.9, 0.95, 0.99)}}
    same = feature_verdict("x", "float", _column(train_values), _column(rng.normal(50, 10, 30)), stats, {}, 0.1)
    assert not same["flagged"] and same["noise_bound"] > 0.05  # 30 rows on 10 bins are noisy
    moved = feature_verdict("x", "float", _column(train_values), _column(rng.normal(80, 10, 30)), stats, {}, 0.1)
    assert moved["verdict"] == "skewed" and moved["distance"] > moved["noise_bound"]


# ---- the rows of each kind of logged request -------------------------------------------------------

SCHEMA = {"version": 1, "label": {"name": "y", "type": "string", "task": "binary", "classes": ["no", "yes"]},
          "features": [{"name": "city", "type": "string", "nullable": True},
                       {"name": "miles", "type": "float", "nullable": True},
                       {"name": "riders", "type": "int", "nullable": True}],
          "key": None, "excluded": []}


def _example(**features):
    from tensorflow.core.example import example_pb2

    ex = example_pb2.Example()
    for k, v in features.items():
        f = ex.features.feature[k]
        if isinstance(v, str):
            f.bytes_list.value.append(v.encode())
        elif isinstance(v, float):
            f.float_list.value.append(v)
        else:
            f.int64_list.value.append(v)
    return ex


def test_rows_come_out_of_tensors_examples_context_and_serialized_examples():
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    from tfpipe.pipeline.schema import Schema
    from tfpipe.skew.columns import read_traffic

    schema = Schema.from_json(SCHEMA)
    logs = []
    # Predict with named tensors: a NaN and an empty string are missing values; 'extra' is no feature
    lg = prediction_log_pb2.PredictionLog()
    inputs = lg.predict_log.request.inputs
    inputs["city"].CopyFrom(tf.make_tensor_proto([b"a", b""]))
    inputs["miles"].CopyFrom(tf.make_tensor_proto(np.array([1.5, np.nan], np.float32)))
    inputs["riders"].CopyFrom(tf.make_tensor_proto(np.array([2, 3], np.int64)))
    inputs["extra"].CopyFrom(tf.make_tensor_proto([1, 2]))
    logs.append(lg)
    # Classify with a context: the context fills in what an example lacks; the label is no unknown input
    lg = prediction_log_pb2.PredictionLog()
    with_context = lg.classify_log.request.input.example_list_with_context
    with_context.context.CopyFrom(_example(city="ctx"))
    with_context.examples.add().CopyFrom(_example(miles=4.0, y="yes"))
    with_context.examples.add().CopyFrom(_example(city="b", riders=7))
    logs.append(lg)
    # Regress with a plain list; a number sent as text for an int feature still reads, a word does not
    lg = prediction_log_pb2.PredictionLog()
    lg.regress_log.request.input.example_list.examples.add().CopyFrom(_example(riders="5", miles=2.0))
    lg.regress_log.request.input.example_list.examples.add().CopyFrom(_example(riders="many"))
    logs.append(lg)
    # Predict on a signature taking serialized Examples
    lg = prediction_log_pb2.PredictionLog()
    lg.predict_log.request.inputs["examples"].CopyFrom(
        tf.make_tensor_proto([_example(city="c", miles=8.0).SerializeToString()]))
    logs.append(lg)
    # A record with nothing in it
    logs.append(prediction_log_pb2.PredictionLog())
    for lg in logs:
        lg.log_metadata.model_spec.name = "m"

    from tfpipe.prediction_logs import RequestTiming

    traffic = read_traffic([(lg, RequestTiming(protocol="grpc")) for lg in logs], schema, "m")
    assert traffic.requests == 5 and traffic.rows == 7
    city, miles, riders = (traffic.columns[n] for n in ("city", "miles", "riders"))
    assert city.values[city.present].tolist() == ["a", "ctx", "b", "c"]
    assert city.present.tolist() == [True, False, True, True, False, False, True]
    assert miles.values[miles.present].tolist() == [1.5, 4.0, 2.0, 8.0]
    assert riders.values[riders.present].tolist() == [2.0, 3.0, 7.0, 5.0]
    assert traffic.unknown_inputs == Counter({"extra": 2})
    assert traffic.unreadable == Counter({"riders": 1})
    assert traffic.by_api == Counter({"predict/grpc": 2, "classify/grpc": 1, "regress/grpc": 1, "unknown/grpc": 1})
    assert traffic.skipped == Counter({"an empty record": 1})


@pytest.mark.parametrize("args, message", [
    (["--logs", "{tmp}/nothing/here"], "no request log files at"),
    (["--logs", "{tmp}/x", "--threshold", "beak=0.2"], "--threshold names beak, not a feature of"),
    (["--logs", "{tmp}/x", "--threshold", "2"], "distances run from 0 to 1"),
    (["--logs", "{tmp}/x", "--out", "{data}"], "is not a tfpipe skew output"),
    (["--threshold", "0.1"], "no request log: pass --logs PREFIX"),
])
def test_bad_input_exits_2_with_one_line(penguins_data, tmp_path, args, message):
    from conftest import run_cli

    args = [a.format(tmp=tmp_path, data=penguins_data) for a in args]
    res = run_cli("skew", "--data", penguins_data, "--out", str(tmp_path / "skew"), *args)
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tfpipe skew: error:") and message in lines[0], res.stderr


@pytest.mark.parametrize("edges, integer, labels", [
    ([2007.0, 2008.0, 2009.0], True, ["<=2006", "2007", "2008", ">=2009"]),  # a year: one per bin, no "2007-2008"
    ([2.5, 5.0, 9.0], True, ["<=2", "3-4", "5-8", ">=9"]),                   # edges between whole numbers
    ([0.5, 1.25], False, ["<0.5", "0.5-1.25", ">=1.25"]),
    ([], True, ["all"]),
])
def test_bin_labels_of_integer_features_name_the_whole_numbers_they_hold(edges, integer, labels):
    from tfpipe.skew.measure import bin_labels

    assert bin_labels(np.array(edges), integer) == labels


@pytest.mark.parametrize("confidence, features, each", [(0.99, 1, 0.99), (0.99, 18, 1 - 0.01 / 18), (0.95, 5, 0.99)])
def test_the_confidence_holds_for_all_features_together(confidence, features, each):
    from tfpipe.skew.job import feature_confidence

    assert feature_confidence(confidence, features) == pytest.approx(each)


@pytest.mark.parametrize("train_present, flagged", [(1, False), (600, True)])
def test_a_feature_never_sent_is_skewed_only_when_training_had_it_often_enough(train_present, flagged):
    """The Chicago taxi sample has pickup_census_tract in 1 training row of 12,002: traffic without
    it is not skew; a feature training had in half its rows and the traffic never sends is."""
    from tfpipe.skew.job import feature_verdict

    values = np.full(1200, np.nan)
    values[:train_present] = 17031081401.0
    train = _column(values)
    serving = _column(np.full(300, np.nan))
    stats = {"min": 17031081401.0, "max": 17031081401.0, "quantiles": {"0.5": 17031081401.0}}
    f = feature_verdict("tract", "int", train, serving, stats, {}, 0.1, 45.0, 0.999)
    assert f["flagged"] is flagged
    assert ("never sent: missing from every request" in f["reasons"]) is flagged
