"""The pure pieces between a user's table and its model, each on its own table: graph names for
any column name, the one-line error of a failed step, defaults that follow the data's size,
the trivial baseline, and the export gate's noise bound. They run in milliseconds."""

from __future__ import annotations

import datetime
import re

import numpy as np
import pytest

# ---- column names inside TensorFlow graphs -----------------------------------------------------------

_TF_SCOPE = re.compile(r"^[A-Za-z0-9.][A-Za-z0-9_.\\/>-]*$")  # what TensorFlow takes as a scope name


@pytest.mark.parametrize("names, expected", [
    (["bill_length_mm", "Sepal.Length", "x-1"], ["bill_length_mm", "Sepal.Length", "x-1"]),  # taken as they are
    (["wind speed"], ["wind_speed"]),
    (["humidité"], ["humidite"]),
    (["norm_température moyenne"], ["norm_temperature_moyenne"]),
    (["a b", "a_b"], ["a_b_2", "a_b"]),  # a name TensorFlow takes keeps it; the other gets a suffix
    (["a b", "a/b", "a:b"], ["a_b", "a_b_2", "a_b_3"]),
    (["", "日本", "_x", "-x"], ["column", "column_2", "x", "c-x"]),
    (["from", "class", "lambda", "None"], ["from_", "class_", "lambda_", "None_"]),  # Python keywords
    (["from", "from_"], ["from__2", "from_"]),
])
def test_every_column_name_has_a_unique_graph_name(names, expected):
    from tfpipe.pipeline.schema import graph_names

    got = graph_names(names)
    assert [got[n] for n in names] == expected
    assert all(_TF_SCOPE.match(g) for g in got.values())
    assert len(set(got.values())) == len(names)


# ---- a failed step in one line -------------------------------------------------------------------------

def _keras_error() -> Exception:
    return ValueError("in user code:\n\n    File \"x.py\", line 3, in call\n        return f(x)\n\n"
                      "    \x1b[1mValueError: 'norm_wind speed' is not a valid scope name\x1b[0m\n")


@pytest.mark.parametrize("error, expected", [
    (_keras_error(), "ValueError: 'norm_wind speed' is not a valid scope name"),
    (RuntimeError("one line"), "RuntimeError: one line"),
    (RuntimeError("first\nsecond"), "RuntimeError: first"),
    (RuntimeError(""), "RuntimeError"),
])
def test_a_failed_step_says_its_error_in_one_plain_line(error, expected):
    from tfpipe.console import error_line

    assert error_line(error) == expected


def test_a_user_error_keeps_its_own_first_line():
    from tfpipe.errors import UserError
    from tfpipe.console import error_line

    assert error_line(UserError("label column 'y' not found:\n  columns: a, b")) == "label column 'y' not found:"


# ---- a regression's target in standard units ------------------------------------------------------------

def test_a_log_target_is_answered_in_the_labels_units():
    from tfpipe.train.layers import Denormalize

    z = np.array([-1.0, 0.0, 2.0], np.float32)
    got = np.asarray(Denormalize(12.0, 0.4, log=True)(z), np.float64)
    np.testing.assert_allclose(got, np.expm1(z.astype(np.float64) * 0.4 + 12.0), rtol=1e-5)


@pytest.mark.parametrize("quantiles, log1p, skewed", [
    ({"0.01": 61_000, "0.5": 160_000, "0.99": 450_000}, True, True),    # house prices: a long upper tail
    ({"0.01": 70, "0.5": 425, "0.99": 2_400}, True, True),              # salaries
    ({"0.01": 300_000, "0.5": 500_000, "0.99": 700_000}, True, False),  # symmetric
    ({"0.01": 61_000, "0.5": 160_000, "0.99": 450_000}, False, False),  # below 0 somewhere: no log
])
def test_a_skewed_label_is_learnt_in_log_scale(quantiles, log1p, skewed):
    from tfpipe.train.losses import label_scale, skewed_label

    label = {"mean": 180_000.0, "std": 80_000.0, "quantiles": {k: float(v) for k, v in quantiles.items()},
             "log1p": {"mean": 12.0, "variance": 0.16} if log1p else None}
    assert skewed_label(label) is skewed
    scale = label_scale({"label": label})
    assert scale.log is skewed and (scale.mean, scale.std) == ((12.0, 0.4) if skewed else (180_000.0, 80_000.0))
    assert not label_scale({"label": label}, "standard").log
    assert not label_scale({"label": label}, "auto", ensemble=5).log  # an ensemble learns the label's own scale
    assert label_scale({"label": label}, "log", ensemble=5).log is bool(log1p)


@pytest.mark.parametrize("mean, std", [
    (500_000.0, 200_000.0),   # prices: beyond float16's 65504
    (0.3, 0.01),
    (1e6, 10.0),              # a large mean with a small spread
    (-2000.0, 5.0),
    (3.0, 1.0),
    (1.4e9, 1e-3),            # a timestamp-like label
])
def test_denormalize_gives_the_labels_units_with_every_constant_exact_in_float16(mean, std):
    import numpy as np

    from tfpipe.train.layers import Denormalize

    layer = Denormalize(mean, std)
    z = np.array([-3.0, -0.5, 0.0, 1.25, 4.0], np.float32)
    got = np.asarray(layer(z), np.float64)
    want = z.astype(np.float64) * std + mean
    # float32 arithmetic: a few units in the last place of the answer
    assert np.all(np.abs(got - want) <= 4e-7 * np.maximum(1.0, np.abs(want))), (got, want)
    constants = layer._shrink + layer._scales + layer._terms + layer._steps
    assert all(float(np.float16(c)) == c and abs(c) <= 65504 for c in constants)


def test_a_regressions_labels_are_standardised_for_the_trainer_only():
    import numpy as np

    from tfpipe.pipeline.schema import Feature, Label, Schema
    from tfpipe.train.data import label_encoder
    from tfpipe.train.losses import LabelScale

    schema = Schema([Feature("x", "float")], Label("price", "float", "regression"))
    y = np.array([300_000.0, 500_000.0, 900_000.0], np.float32)
    assert np.allclose(label_encoder(schema, LabelScale(500_000.0, 200_000.0))(y).numpy(), [-1.0, 0.0, 2.0])
    logged = label_encoder(schema, LabelScale(13.0, 0.5, log=True))(y).numpy()
    assert np.allclose(logged, (np.log1p(y.astype(np.float64)) - 13.0) / 0.5, atol=1e-6)
    assert np.allclose(label_encoder(schema)(y).numpy(), y)


@pytest.mark.parametrize("true, pred, scale, mae, rmse", [
    ([0.0, 0.0, 0.0], [1.0, -1.0, 2.0], (0.0, 1.0, False), 4 / 3, (6 / 3) ** 0.5),
    ([0.0, 0.0, 0.0], [1.0, -1.0, 2.0], (0.0, 100_000.0, False), 4e5 / 3, 1e5 * (6 / 3) ** 0.5),  # -> label's units
    # learnt as log(1 + y) with mean 0 and std 1: labels exp(0) - 1 = 0, predictions e - 1, 1/e - 1, e^2 - 1
    ([0.0, 0.0, 0.0], [1.0, -1.0, 2.0], (0.0, 1.0, True),
     (np.e - 1 + 1 - 1 / np.e + np.e ** 2 - 1) / 3, (((np.e - 1) ** 2 + (1 / np.e - 1) ** 2 + (np.e ** 2 - 1) ** 2) / 3) ** 0.5),
])
def test_regression_metrics_are_per_example_and_in_the_labels_units(true, pred, scale, mae, rmse):
    import numpy as np

    from tfpipe.train.losses import LabelScale, loss_and_metrics

    _, (m_mae, m_rmse) = loss_and_metrics("regression", LabelScale(*scale))
    # in two batches of unequal size: a per-batch mean would weigh the single row as much as the pair
    for sl in (slice(0, 2), slice(2, 3)):
        m_mae.update_state(np.array(true[sl], np.float32), np.array(pred[sl], np.float32))
        m_rmse.update_state(np.array(true[sl], np.float32), np.array(pred[sl], np.float32))
    assert float(m_mae.result()) == pytest.approx(mae, rel=1e-6)
    assert float(m_rmse.result()) == pytest.approx(rmse, rel=1e-6)


# ---- defaults that follow the data's size -----------------------------------------------------------------

from tfpipe.train.config import UNTIL_STOPPED  # noqa: E402

@pytest.mark.parametrize("examples, given, batch, epochs, patience, min_epochs", [
    # without --epochs, until early stopping; the patience and warm-up follow a nominal count: 112
    # epochs for 182 images of three shapes (9 steps an epoch, not 1), 67 for a 300-row table, ...
    (139, {}, 16, UNTIL_STOPPED, 11, 34),
    (240, {}, 16, UNTIL_STOPPED, 6, 20),
    (1_588, {}, 32, UNTIL_STOPPED, 5, 6),
    (40_000, {}, 256, UNTIL_STOPPED, 5, 2),
    (275, {"epochs": 40, "patience": 8}, 16, 40, 8, 17),   # what the user set stays
    (275, {"epochs": 10}, 16, 10, 5, 5),                    # at most half the epochs warm up
    (275, {"batch_size": 256}, 256, UNTIL_STOPPED, 20, 100),  # one step an epoch: the most (200) nominal
    (275, {"batch_size": 64, "epochs": 9, "patience": 3, "min_epochs": 0}, 64, 9, 3, 0),
])
def test_batch_size_epochs_and_patience_follow_the_training_splits_size(examples, given, batch, epochs, patience,
                                                                        min_epochs):
    from tfpipe.train.config import TrainConfig

    config, note = TrainConfig(**given).sized(examples)
    assert (config.batch_size, config.epochs, config.patience, config.min_epochs) == (batch, epochs, patience,
                                                                                       min_epochs)
    assert (note == "") == (len(given) == 4)
    assert config.ensemble is None  # not a regression: no ensemble chosen


@pytest.mark.parametrize("examples, given, ensemble", [
    (218, {}, 5),                  # Hitters' labelled players
    (999, {}, 5),
    (1_000, {}, 1),
    (2_300, {}, 1),                # Ames: one network, as before
    (218, {"ensemble": 1}, 1),     # what the user set stays
    (40_000, {"ensemble": 3}, 3),
])
def test_a_small_regression_trains_an_ensemble(examples, given, ensemble):
    from tfpipe.train.config import TrainConfig

    config, note = TrainConfig(**given).sized(examples, regression=True)
    assert config.ensemble == ensemble
    assert ("ensemble" in note) == ("ensemble" not in given)


@pytest.mark.parametrize("examples, regression, given, hidden, said", [
    (3_999, True, {}, [64, 32], False),
    (4_000, True, {}, [256, 128], True),       # births' 5,833 training days underfit with 64,32
    (40_000, False, {}, [64, 32], False),      # classification keeps the narrow layers
    (200, False, {}, [64, 32], False),
    (5_000, True, {"hidden": [8]}, [8], False),  # what the user set stays
])
def test_a_large_regression_gets_wider_hidden_layers(examples, regression, given, hidden, said):
    from tfpipe.train.config import TrainConfig

    config, note = TrainConfig(**given).sized(examples, regression=regression)
    assert config.hidden == hidden
    assert ("hidden 256,128" in note) == said, note


# ---- the trivial baseline -------------------------------------------------------------------------------

@pytest.mark.parametrize("task, classes, train_label, labels, expected", [
    ("multiclass", ["circle", "square", "triangle"], {"distribution": {"circle": 40, "square": 50, "triangle": 49}},
     [1, 1, 0, 2], {"accuracy": 0.5}),
    ("binary", [0, 1], {"distribution": {"0": 70, "1": 30}}, [0, 1, 1, 1], {"accuracy": 0.25}),
    ("regression", None, {"mean": 10.0}, [8.0, 12.0], {"rmse": 2.0, "mae": 2.0}),
])
def test_the_trivial_baseline_predicts_the_majority_class_or_the_mean(task, classes, train_label, labels, expected):
    import numpy as np

    from tfpipe.export.baseline import trivial_baseline

    got = trivial_baseline(task, classes, train_label, np.array(labels))
    for key, value in expected.items():
        assert got[key] == pytest.approx(value)


@pytest.mark.parametrize("test, allow_weak, refused", [
    ({"accuracy": 0.41, "baseline": {"accuracy": 0.41, "predicts": "the majority class"}}, False, True),
    ({"accuracy": 0.42, "baseline": {"accuracy": 0.41, "predicts": "the majority class"}}, False, False),
    ({"rmse": 5.0, "baseline": {"rmse": 5.0, "predicts": "the training mean"}}, False, True),
    ({"rmse": 4.0, "baseline": {"rmse": 5.0, "predicts": "the training mean"}}, False, False),
    ({"accuracy": 0.30, "baseline": {"accuracy": 0.41, "predicts": "the majority class"}}, True, False),
])
def test_a_model_no_better_than_the_baseline_is_not_published(test, allow_weak, refused):
    from tfpipe.export.baseline import check_baseline
    from tfpipe.export.errors import ExportError

    test = {"split": "test", "rows": 40, **test}
    warnings = []
    if refused:
        with pytest.raises(ExportError, match="no better than .*--set export.allow_weak=true"):
            check_baseline(test, allow_weak, warnings.append)
    else:
        check_baseline(test, allow_weak, warnings.append)
        assert bool(warnings) == allow_weak


# ---- the export gate's noise bound ------------------------------------------------------------------------

def _flips(n: int, worse: int, better: int = 0):
    import numpy as np

    saved = np.ones(n, bool)
    saved[:better] = False
    variant = saved.copy()
    variant[better:better + worse] = False
    variant[:better] = True
    return saved, variant


@pytest.mark.parametrize("n, worse, better, significant", [
    (96, 1, 0, False),     # one row of 96 flipped: a 1-point drop, and chance alone does that
    (96, 4, 0, False),     # p = 1/16
    (96, 5, 0, True),      # p = 1/32
    (1000, 12, 10, False),  # disagreements both ways
    (1000, 40, 5, True),
])
def test_an_accuracy_drop_counts_only_beyond_the_noise_of_the_rows_it_was_measured_on(n, worse, better, significant):
    from tfpipe.export.tflite import drop_beyond_noise

    saved, variant = _flips(n, worse, better)
    assert (drop_beyond_noise(saved, variant, "classification") < 0.05) is significant


@pytest.mark.parametrize("n, shift, significant", [
    (200, None, False),  # errors of the same size: another draw
    (200, 1.0, True),    # every error a whole unit larger
    (4, 0.3, False),     # a rise, but four rows cannot tell it from chance
])
def test_an_rmse_rise_counts_only_beyond_the_noise_of_the_paired_errors(n, shift, significant):
    import numpy as np

    from tfpipe.export.tflite import drop_beyond_noise

    rng = np.random.default_rng(0)
    error = rng.normal(0, 1, n)
    other = rng.normal(0, 1, n) if shift is None else error + shift + rng.normal(0, 0.5, n)
    saved, variant = error ** 2, other ** 2
    assert (drop_beyond_noise(saved, variant, "regression") < 0.05) is significant


# ---- the serve step's check, relative to the answers' size ------------------------------------------------

@pytest.mark.parametrize("want, got, passes", [
    (500_000.0, 500_000.03125, True),   # one float32 step at 500,000
    (500_000.0, 500_010.0, False),
    (0.5, 0.500001, True),
    (0.5, 0.51, False),
])
def test_the_served_answer_check_is_relative_to_each_values_size(want, got, passes):
    import numpy as np

    from tfpipe.serve.deploy import CheckFailed, compare

    args = ("REST", {"y": np.array([want], np.float64)}, {"y": np.array([got])}, 1e-5)
    if passes:
        assert compare(*args) == pytest.approx(abs(got - want))
    else:
        with pytest.raises(CheckFailed):
            compare(*args)


# ---- dates: one set of rules in the data stage and in the model's graph ------------------------------------

DATE_TEXTS = [
    "2024-01-01", "2024-01-01 00:34:11", "2024-01-01T00:34:11Z", "2024-01-01T00:34", "2024-01-01T10:00Z",
    "2024-03-01T05:30+05:30", "2024-03-01T05:30:15.123-0800", "2024-01-01T10:00:00+0130", " 2024-05-05 ",
    "1969-12-31T23:59:59", "1900-02-28", "2400-02-29", "2024-02-29",
    # not dates: the data stage's bad rows, refused by the model (an empty value is missing to both)
    "", "hello", "2024-13-01", "2024-02-30", "2023-02-29", "2024-01-01T24:00:00", "2024-1-1", "01/02/2024",
]


def test_the_graph_parses_dates_exactly_as_the_data_stage_does():
    import numpy as np
    import tensorflow as tf

    from tfpipe.pipeline.dates import parse_seconds
    from tfpipe.train.kinds import ParseDate

    rng = np.random.default_rng(0)
    texts = DATE_TEXTS + [f"{y:04d}-{m:02d}-{d:02d}T{h:02d}:{mi:02d}:{s:02d}" for y, m, d, h, mi, s in
                          zip(rng.integers(1800, 2200, 300), rng.integers(1, 13, 300), rng.integers(1, 29, 300),
                              rng.integers(0, 24, 300), rng.integers(0, 60, 300), rng.integers(0, 60, 300))]
    readable = [t for t in texts if parse_seconds(t) is not None or not t.strip()]
    got = ParseDate(column="when")(tf.constant(readable)).numpy()
    for text, seconds in zip(readable, got, strict=True):
        want = parse_seconds(text)
        assert (np.isnan(seconds) if want is None else seconds == want), (text, want, seconds)
    not_dates = [t for t in texts if t not in readable]
    assert len(not_dates) == 7
    for text in not_dates:  # with valid dates beside it, the call fails naming the input and the value
        with pytest.raises(tf.errors.InvalidArgumentError, match=rf'(?s)the input `when` holds a value that is not an '
                                                                 rf'ISO-8601 date.*{re.escape(text)}'):
            ParseDate(column="when")(tf.constant(["2024-01-01", text]))


@pytest.mark.parametrize("text, seconds", [
    ("1970-01-01", 0.0),
    ("2024-01-01T00:34:11Z", 1704069251.0),
    ("2024-01-01 05:30+05:30", 1704067200.0),
    ("1969-12-31T23:59:59", -1.0),
])
def test_dates_are_seconds_since_the_epoch_in_utc(text, seconds):
    from tfpipe.pipeline.dates import parse_seconds

    assert parse_seconds(text) == seconds


def test_date_features_give_hour_weekday_and_month_where_training_varied():
    import numpy as np

    from tfpipe.pipeline.dates import parse_seconds
    from tfpipe.train.kinds import DateFeatures

    layer = DateFeatures(1.7e9, 1e8, ["hour", "weekday", "month"])
    out = np.asarray(layer(np.array([parse_seconds("2024-01-01T13:00:00"), np.nan])))  # a Monday in January
    assert out.shape == (2, 2 + 24 + 7 + 12)
    assert list(np.flatnonzero(out[0, 2:])) == [13, 24 + 0, 24 + 7 + 0]
    assert out[1, 1] == 1.0 and not out[1, 2:].any()  # missing: flagged, no calendar part


def test_the_data_stage_counts_a_date_columns_calendar_parts():
    import numpy as np

    from tfpipe.pipeline.validation import Column
    from tfpipe.pipeline.stats import DateStats

    stats = DateStats()
    values = np.array(["2024-01-01", "2024-01-02", "2024-02-03", ""], dtype=object)
    stats.add(Column(values, values != ""))
    out = stats.result()
    assert (out["count"], out["missing"], out["hours"], out["weekdays"], out["months"]) == (3, 1, [0], [0, 1, 5], [1, 2])


# ---- free text: the data stage's words are the model's ------------------------------------------------------

@pytest.mark.parametrize("text", [
    "Great and EXCELLENT!", "terrible, awful... (really)", "it's a 10/10 - would buy", "  spaces\tand\nlines  ",
    "Été brûlant", "e-mail: a@b.c", "",
])
def test_the_data_stage_splits_text_into_the_words_textvectorization_looks_up(text):
    import keras

    from tfpipe.pipeline.text import words

    layer = keras.layers.TextVectorization(output_mode="int")
    layer.adapt([text or "x"])
    vocabulary = set(layer.get_vocabulary()[2:])  # after the padding and OOV tokens
    assert set(words(text)) == (vocabulary if text else set())


# ---- what a column holds -------------------------------------------------------------------------------------

def _column(values, textual=True):
    from tfpipe.pipeline.schema_inference import infer_schema

    rows = [{"c": v, "y": str(i % 2) if textual else i % 2} for i, v in enumerate(values)]
    return infer_schema(["c", "y"], rows, "y", textual=textual).features[0]


@pytest.mark.parametrize("values, textual, type_, kind", [
    ([f"2024-01-{d:02d}" for d in range(1, 29)], True, "string", "date"),
    ([f"2024-01-01 {h:02d}:00:00" for h in range(24)], True, "string", "date"),
    ([f"this is review number {i}, and it was fine" for i in range(40)], True, "string", "text"),
    (["red", "green", "blue"] * 10, True, "string", None),                       # a category
    (["very good", "good", "bad", "very bad"] * 10, True, "string", None),      # few values, several words
    ([f"Mazda RX{i}" for i in range(40)], True, "string", None),                # names: two words, not text
    ([str(i * 7 % 40) for i in range(40)], True, "int", None),
])
def test_a_column_is_a_date_or_free_text_only_when_its_values_say_so(values, textual, type_, kind):
    feature = _column(values, textual)
    assert (feature.type, feature.kind) == (type_, kind)


def test_parquet_dates_and_timestamps_are_date_features():
    import datetime

    feature = _column([datetime.datetime(2024, 1, 1, h) for h in range(24)], textual=False)
    assert (feature.type, feature.kind) == ("string", "date")
    feature = _column([datetime.date(2024, 1, d) for d in range(1, 29)], textual=False)
    assert feature.kind == "date"


@pytest.mark.parametrize("value, text", [
    (datetime.datetime(2024, 1, 1, 0, 34, 11), "2024-01-01T00:34:11"),
    (datetime.date(2024, 1, 1), "2024-01-01"),
    (datetime.datetime(2024, 1, 1, 1, 0, tzinfo=datetime.timezone(
        datetime.timedelta(hours=1))), "2024-01-01T00:00:00Z"),
])
def test_a_date_value_is_stored_as_iso_text_without_quotes(value, text):
    from tfpipe.pipeline.dates import iso_text

    assert iso_text(value) == text


# ---- heavy-tailed numbers in log scale ------------------------------------------------------------------------

def _numeric(values):
    import numpy as np

    from tfpipe.pipeline.validation import Column
    from tfpipe.pipeline.stats import NumericStats

    stats = NumericStats()
    for part in np.array_split(np.asarray(values, np.float64), 3):
        piece = NumericStats()
        piece.add(Column(part, np.ones(len(part), bool)))
        stats.merge(piece)
    return stats.result()


@pytest.mark.parametrize("values, heavy", [
    (np.random.default_rng(0).lognormal(3, 1.5, 5000), True),     # spending
    (np.random.default_rng(1).poisson(np.random.default_rng(5).lognormal(
        0, 1.5, 5000)), True),                                                       # counts: mostly 0-2, a few 100s
    (np.random.default_rng(2).normal(500_000, 90_000, 5000), False),  # prices, symmetric
    (np.random.default_rng(3).uniform(0, 100, 5000), False),
    (np.random.default_rng(4).lognormal(3, 1.5, 5000) - 50, False),  # below 0: no log
])
def test_a_heavy_tailed_column_is_taken_in_log_scale(values, heavy):
    import numpy as np

    from tfpipe.train.model import heavy_tailed

    stats = _numeric(values)
    assert heavy_tailed(stats) is heavy
    if stats["log1p"]:  # merged from three parts, as Beam merges work units
        assert stats["log1p"]["mean"] == pytest.approx(np.log1p(values).mean())
        assert stats["log1p"]["variance"] == pytest.approx(np.log1p(values).var())


def test_log_scaling_normalises_log1p_with_its_own_moments():
    import numpy as np

    from tfpipe.train.layers import ImputeNormalize

    x = np.array([0.0, 9.0, 99.0, np.nan, -1.0], np.float32)
    out = np.asarray(ImputeNormalize(2.0, 4.0, True, clip=5.0, log1p=True)(x))
    want = (np.log1p([0.0, 9.0, 99.0]) - 2.0) / 2.0
    np.testing.assert_allclose(out[:3, 0], want, rtol=1e-5)
    assert list(out[3]) == [0.0, 1.0] and out[4, 0] == pytest.approx(-1.0)  # missing; a negative as 0


@pytest.mark.parametrize("stats, log1p, knots", [
    # min, quantiles and max in z = (x - 10) / 2, sorted, whatever order stats.json lists them in
    ({"min": 0.0, "max": 30.0, "quantiles": {"0.5": 10.0, "0.1": 4.0, "0.9": 20.0}}, False, [-5.0, -3.0, 0.0, 5.0, 10.0]),
    # a count: repeated quantiles are one knot, and so are knots closer than MIN_BIN
    ({"min": 0.0, "max": 3.0, "quantiles": {"0.1": 0.0, "0.5": 0.0, "0.9": 1.0, "0.99": 1.001}}, False,
     [-5.0, -4.5, -3.5]),
    ({"min": 4.0, "max": 4.0, "quantiles": {"0.5": 4.0}}, False, None),  # constant: no bins
    # log scale: the knots of log(1 + x), negatives as 0
    ({"min": -1.0, "max": np.e ** 4 - 1, "quantiles": {"0.5": np.e ** 2 - 1}}, True, [-5.0, -4.0, -3.0]),
])
def test_quantile_bins_are_cut_at_the_training_quantiles_in_z(stats, log1p, knots):
    from tfpipe.train.layers import quantile_knots

    got = quantile_knots(stats, 10.0, 4.0, log1p)
    assert got == (None if knots is None else pytest.approx(knots))


def test_quantile_bins_say_where_a_value_falls_among_the_training_values():
    from tfpipe.train.layers import ImputeNormalize

    layer = ImputeNormalize(10.0, 4.0, True, clip=5.0, knots=[-5.0, -3.0, 0.0, 5.0])  # x at 0, 4, 10, 20
    x = np.array([-100.0, 0.0, 2.0, 4.0, 7.0, 15.0, 20.0, 1e9, np.nan], np.float32)
    want = [[0, 0, 0], [0, 0, 0], [0.5, 0, 0], [1, 0, 0], [1, 0.5, 0], [1, 1, 0.5], [1, 1, 1], [1, 1, 1], [0, 0, 0]]
    out = np.asarray(layer(x))
    assert out.shape == (9, 4) and layer.width == 4
    np.testing.assert_allclose(out[:, :3], want, atol=1e-6)
    assert list(out[:, 3]) == [0.0] * 8 + [1.0]
    again = ImputeNormalize.from_config(layer.get_config())
    np.testing.assert_array_equal(np.asarray(again(x)), out)


# ---- the load test's rows come from the whole split ---------------------------------------------------------

@pytest.mark.parametrize("records, limit, expected", [
    (100, 10, [0, 11, 22, 33, 44, 55, 66, 77, 88, 99]),   # a file sorted by x: the rows spread over it
    (5, 10, [0, 1, 2, 3, 4]),                               # fewer than asked: all of them
])
def test_load_test_rows_spread_over_a_split_stored_in_order(tmp_path, records, limit, expected):
    import json

    import tensorflow as tf

    from tfpipe.loadtest.payloads import rows_from_data

    name = "eval-00000-of-00001.tfrecord.gz"
    with tf.io.TFRecordWriter(str(tmp_path / name), options="GZIP") as w:
        for i in range(records):
            w.write(tf.train.Example(features=tf.train.Features(feature={
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=[float(i)]))})).SerializeToString())
    (tmp_path / "data.json").write_text(json.dumps(
        {"outputs": {"splits": {"eval": [{"file": name, "records": records, "bytes": 1}]}}}))
    rows = rows_from_data(str(tmp_path), {"x": "DT_FLOAT"}, limit)
    assert [int(r["x"]) for r in rows] == expected


@pytest.mark.parametrize("change", [{"scaling": "standard"}, {"scaling": "log"}, {"target": "log"},
                                    {"target": "standard"}])
def test_a_killed_run_resumes_only_with_the_same_feature_and_target_scaling(change):
    """The backup's weights were learnt on inputs and labels in a given scale: another scale is
    another model, started afresh rather than resumed."""
    from tfpipe.train.config import TrainConfig

    assert TrainConfig(**change).resume_fields() != TrainConfig().resume_fields()


def test_the_month_of_a_day_is_the_same_in_the_data_stage_the_graph_and_the_calendar():
    import tensorflow as tf

    from tfpipe.pipeline.dates import months_of_days
    from tfpipe.train.kinds import _month

    days = np.random.default_rng(0).integers(-700_000, 700_000, 2000)
    want = [(datetime.date(1970, 1, 1) + datetime.timedelta(days=int(d))).month for d in days]
    assert months_of_days(days).tolist() == want
    assert _month(tf.constant(days, tf.int64)).numpy().tolist() == want


# ---- a few whole numbers read as categories too ------------------------------------------------------

def _even(low: float, high: float) -> dict[str, float]:
    """The quantiles stats.json holds for numbers evenly spread over [low, high]."""
    return {f"{q:g}": round(low + q * (high - low)) for q in (0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99)}


@pytest.mark.parametrize("stats, expected", [
    ({"min": 1.0, "max": 366.0, "count": 5_810, "quantiles": _even(1, 366)}, (1, 366)),  # births' days: 15.9 rows each
    ({"min": 1.0, "max": 366.0, "count": 2_000, "quantiles": _even(1, 366)}, None),  # 5.5 rows a day: too few
    ({"min": 1.0, "max": 7.0, "count": 56, "quantiles": {"0.1": 1.0, "0.5": 4.0, "0.9": 7.0}}, (1, 7)),
    ({"min": 2007.0, "max": 2009.0, "count": 270, "quantiles": {"0.25": 2007.0, "0.75": 2009.0}}, (2007, 2009)),
    ({"min": 0.0, "max": 64.0, "count": 3_000, "quantiles": {"0.5": 0.0, "0.99": 12.0}}, None),  # a count
    ({"min": 0.0, "max": 2.0, "count": 2_344, "quantiles": {"0.25": 0.0, "0.5": 0.0, "0.99": 1.0}}, None),  # half baths
    ({"min": 0.0, "max": 1.0, "count": 10_000, "quantiles": _even(0, 1)}, None),  # two values: the number says all
    ({"min": 1.0, "max": 401.0, "count": 100_000, "quantiles": _even(1, 401)}, None),  # over 400: a quantity
    ({"min": 2.0**24, "max": 2.0**24 + 5, "count": 100, "quantiles": _even(2**24, 2**24 + 5)}, None),  # beyond float32
    ({"min": 1.0, "max": 7.0, "count": 56}, None),  # no quantiles: no way to tell
    ({"min": None, "max": None, "count": 0}, None),
])
def test_which_integer_columns_are_read_as_levels_too(stats, expected):
    from tfpipe.train.layers import int_levels

    assert int_levels(stats) == expected


def test_int_levels_map_each_whole_number_and_send_the_rest_to_zero():
    from tfpipe.train.layers import IntLevels

    x = np.array([1, 2, 7, 0, 8, np.nan, 3.5, -1, 6], np.float64)
    assert np.asarray(IntLevels(1, 7)(x)).tolist() == [1, 2, 7, 0, 0, 0, 0, 0, 6]
    assert IntLevels(1, 7).depth == 8
    assert np.asarray(IntLevels(1969, 1988)(np.array([1969.0, 1988.0, 1989.0], np.float32))).tolist() == [1, 20, 0]


def test_a_model_with_levels_saves_loads_and_its_device_and_block_models_answer_the_same(tmp_path):
    """An int column of a few values gets IntLevels and an embedding after its quantile bins; the
    saved model reloads with them, and export's block model (the SavedModel's signatures) and device
    model (TFLite) read them back in the trained order."""
    import keras

    from tfpipe.export.tflite import block_model, device_model
    from tfpipe.pipeline.schema import Feature, Label, Schema
    from tfpipe.train.model import build_models, feature_layers

    schema = Schema([Feature("day", "int"), Feature("x", "float"), Feature("shop", "string")],
                    Label("y", "float", "regression"))
    quantiles = {f"{q:g}": v for q, v in zip((0.01, 0.25, 0.5, 0.75, 0.99), (1.0, 2.0, 4.0, 6.0, 7.0))}
    stats = {"features": {"day": {"mean": 4.0, "variance": 4.0, "min": 1.0, "max": 7.0, "count": 700,
                                  "quantiles": quantiles},
                          "x": {"mean": 0.0, "variance": 1.0, "min": -2.0, "max": 2.0, "count": 700},
                          "shop": {"top": [["a", 400], ["b", 300]]}},
             "label": {"mean": 10.0, "std": 2.0}}
    _, _, model = build_models(schema, stats, [8], 0.0, seed=0)
    found = feature_layers(model, schema)
    assert found["day"].levels is not None and found["day"].level_embed is not None
    assert found["x"].levels is None  # a float column is a quantity
    rows = {"day": np.array([1, 3, 7, 9, np.nan], np.float64), "x": np.array([0.5, -1, 2, 0, 1], np.float32),
            "shop": np.array(["a", "b", "c", "a", "b"], object)}
    want = np.asarray(model(rows))
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    np.testing.assert_allclose(np.asarray(loaded(rows)), want, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(block_model(loaded, schema)(rows)), want, rtol=0, atol=1e-5)
    lite, vocabularies = device_model(loaded, schema)
    device = {"day": rows["day"].astype(np.float32), "x": rows["x"],
              "shop": np.array([vocabularies["shop"].index(v) + 1 if v in vocabularies["shop"] else 0
                                for v in rows["shop"]], np.int32)}
    np.testing.assert_allclose(np.asarray(lite(device)), want, rtol=0, atol=1e-5)
    width = model.get_layer("preprocessor").output.shape[-1]
    assert width == found["day"].norm.width + 5 + found["x"].norm.width + 3  # day's bins and embedding, x, shop
