"""Wide tables (hundreds of columns): the pieces whose cost grew with the columns."""

from __future__ import annotations

import numpy as np
import pytest


def _column(values):
    from tfpipe.skew.columns import Column

    values = np.asarray(values)
    return Column(values, np.ones(len(values), dtype=bool))


@pytest.mark.parametrize("serving_mean,bounded", [(50.0, False), (80.0, True)])
def test_with_many_features_a_bound_is_drawn_only_where_it_decides_the_verdict(serving_mean, bounded):
    """every_bound=False (tables over BOUND_EVERY_FEATURE features): a feature under its threshold
    gets no noise bound and stays ok; one over it is judged against its bound as before."""
    from tfpipe.skew.job import feature_verdict

    rng = np.random.default_rng(3)
    train = rng.normal(50, 10, 2000)
    stats = {"min": float(train.min()), "max": float(train.max()),
             "quantiles": {str(q): float(np.quantile(train, q)) for q in (0.1, 0.25, 0.5, 0.75, 0.9)}}
    serving = _column(rng.normal(serving_mean, 10, 400))
    lazy = feature_verdict("x", "float", _column(train), serving, stats, {}, 0.1, every_bound=False)
    full = feature_verdict("x", "float", _column(train), serving, stats, {}, 0.1)
    assert (lazy["noise_bound"] is not None) == bounded and full["noise_bound"] is not None
    assert lazy["verdict"] == full["verdict"] == ("skewed" if bounded else "ok")
    if bounded:
        assert lazy["noise_bound"] == full["noise_bound"]


def test_the_block_model_answers_as_the_trained_model_does(penguins_trained):
    """What the SavedModel's signatures call (export.tflite.block_model): every number's
    normalisation as one NumericBlock, the strings through their trained lookups; penguins'
    test rows (nullable ints, floats, two string columns) give the trained model's answers. A
    schema with a date or text column keeps the trained model (None)."""
    import dataclasses
    import os

    import keras

    from tfpipe.export.job import _labelled_rows
    from tfpipe.export.tflite import NUMERIC_BLOCK, block_model
    from tfpipe.train.datadir import load_data_dir

    data_dir, train_dir = penguins_trained
    data = load_data_dir(data_dir)
    model = keras.models.load_model(os.path.join(train_dir, "model.keras"))
    block = block_model(model, data.schema)
    assert block is not None and block.get_layer(NUMERIC_BLOCK) is not None
    raw, _ = _labelled_rows(data, "test")
    np.testing.assert_allclose(np.asarray(block(raw, training=False)), np.asarray(model(raw, training=False)),
                               rtol=0, atol=1e-6)
    dated = dataclasses.replace(data.schema, features=[dataclasses.replace(data.schema.features[0], kind="date"),
                                                       *data.schema.features[1:]])
    assert block_model(model, dated) is None


@pytest.mark.parametrize("tflite,allow_drop,fails", [("auto", False, False), ("float32,int8", False, True),
                                                     ("float32,int8", True, False)])
def test_a_variant_that_loses_beyond_the_noise_is_dropped_on_a_default_export(tmp_path, tflite, allow_drop, fails):
    """int8 wrong on 20 of 100 rows the SavedModel gets right: with the default variants it is
    left out with a notice and the rest is written; named with --tflite it fails the export,
    unless --allow-drop."""
    from tfpipe.export.baseline import PER_ROW
    from tfpipe.export.config import ExportConfig
    from tfpipe.export.errors import ExportError
    from tfpipe.export.tflite import record_variants

    right = np.ones(100, bool)
    worse = right.copy()
    worse[:20] = False
    answers = {b"f32": right, b"i8": worse}

    def quality(blob):
        part = answers[blob]
        return {"accuracy": float(part.mean()), PER_ROW: part, "latency_ms_p50": 0.1, "latency_ms_p99": 0.2}

    table = [{"variant": "savedmodel", "accuracy": 1.0, PER_ROW: right, "bytes": 4096, "drop": 0.0,
              "latency_ms_p50": 0.1, "latency_ms_p99": 0.2}]
    log: list[str] = []
    config = ExportConfig(tflite=tflite, allow_drop=allow_drop)
    if fails:
        with pytest.raises(ExportError, match="int8: accuracy 1.0000 -> 0.8000"):
            record_variants(table, {"float32": b"f32", "int8": b"i8"}, quality, "accuracy", str(tmp_path), config,
                            log.append)
        return
    rows = record_variants(table, {"float32": b"f32", "int8": b"i8"}, quality, "accuracy", str(tmp_path), config,
                           log.append)
    assert [r["variant"] for r in rows if r.get("dropped")] == ["int8"]
    assert (tmp_path / "float32.tflite").exists() and not (tmp_path / "int8.tflite").exists()
    assert any(line.startswith("  dropping int8: accuracy 1.0000 -> 0.8000") for line in log), log
