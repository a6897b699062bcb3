"""Behaviour of `tfpipe export` (SavedModel half): real TensorFlow, real TF Serving protos."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import time

import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import raw_records, run_cli, spawn_cli
from tfpipe import versions
from tfpipe.stage import ExportOutputs


def export(trained, base, *args) -> subprocess.CompletedProcess:
    """A SavedModel-only export (the TFLite variants have their own test)."""
    data, train = trained
    return run_cli("export", "--model", train, "--data", data, "--base", str(base), "--name", "penguins",
                   "--tflite", "", *args)


def _copy_of(first_export: str, base) -> None:
    shutil.copytree(os.path.join(first_export, "penguins"), os.path.join(base, "penguins"), symlinks=True)


def test_export_signatures_and_warmup(penguins_trained, first_export):
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    from tfpipe.export.job import result

    data, _ = penguins_trained
    v1 = Path(first_export) / "penguins" / "1"  # the first export into an empty base path
    r = result(str(v1))  # what tfpipe run shows and keeps of it
    assert r.summary.startswith("penguins version 1: SavedModel")
    assert r.outputs == ExportOutputs(str(v1), "penguins", 1, candidate=1, decision="published") and r.code == 0
    loaded = tf.saved_model.load(str(v1))
    assert set(loaded.signatures) == {"serving_default", "predict_examples", "classification"}
    from tensorflow.core.protobuf import saved_model_pb2

    graph = saved_model_pb2.SavedModel.FromString((v1 / "saved_model.pb").read_bytes()).meta_graphs[0]
    assert graph.signature_def["classification"].method_name == "tensorflow/serving/classify"
    assert graph.signature_def["serving_default"].method_name == "tensorflow/serving/predict"

    # Raw features in, named outputs out. An int that the data has missing values of is taken
    # as float64, so NaN can say missing (an int64 tensor cannot); year never is, so it is int64.
    inputs = graph.signature_def["serving_default"].inputs
    assert {k: tf.as_dtype(inputs[k].dtype).name for k in ("flipper_length_mm", "body_mass_g", "year")} == {
        "flipper_length_mm": "float64", "body_mass_g": "float64", "year": "int64"}
    raw = loaded.signatures["serving_default"](
        island=tf.constant(["Biscoe", "Torgersen"]), bill_length_mm=tf.constant([48.0, 38.0]),
        bill_depth_mm=tf.constant([15.0, 19.0]), flipper_length_mm=tf.constant([220, 185], tf.float64),
        body_mass_g=tf.constant([5400, 3600], tf.float64), sex=tf.constant(["male", ""]),
        year=tf.constant([2008, 2007], tf.int64))
    assert [c.decode() for c in raw["classes"].numpy()] == ["Gentoo", "Adelie"]
    assert raw["probabilities"].shape == (2, 3) and raw["class_ids"].numpy().tolist() == [2, 0]

    # A missing int sent as NaN is what an absent feature is in a tf.Example: the same answer.
    gentoo = tf.train.Example()
    for k, v in {"island": b"Biscoe", "sex": b"male"}.items():
        gentoo.features.feature[k].bytes_list.value.append(v)
    for k, v in {"bill_length_mm": 48.0, "bill_depth_mm": 15.0}.items():
        gentoo.features.feature[k].float_list.value.append(v)
    for k, v in {"flipper_length_mm": 220, "year": 2008}.items():  # no body_mass_g
        gentoo.features.feature[k].int64_list.value.append(v)
    missing = loaded.signatures["serving_default"](
        island=tf.constant(["Biscoe"]), bill_length_mm=tf.constant([48.0]), bill_depth_mm=tf.constant([15.0]),
        flipper_length_mm=tf.constant([220.0], tf.float64), body_mass_g=tf.constant([float("nan")], tf.float64),
        sex=tf.constant(["male"]), year=tf.constant([2008], tf.int64))["probabilities"].numpy()
    absent = loaded.signatures["predict_examples"](
        examples=tf.constant([gentoo.SerializeToString()]))["probabilities"].numpy()
    assert np.all(np.isfinite(missing)) and np.allclose(missing, absent, atol=1e-6)

    # Serialized tf.Examples in (the test split as the data stage wrote it): the same answers
    # as the raw signature on the same rows, and right on most of them.
    records = raw_records(data, "test")
    by_example = loaded.signatures["predict_examples"](examples=tf.constant(records))
    labels = [tf.train.Example.FromString(r).features.feature["species"].bytes_list.value[0].decode()
              for r in records]
    got = [c.decode() for c in by_example["classes"].numpy()]
    assert np.mean([a == b for a, b in zip(got, labels)]) >= 0.9

    # Warmup records: PredictionLogs whose requests the model answers.
    warm = str(v1 / "assets.extra" / "tf_serving_warmup_requests")
    logs = [prediction_log_pb2.PredictionLog.FromString(r.numpy()) for r in tf.data.TFRecordDataset(warm)]
    assert 0 < len(logs) <= 100
    for log in logs[:5]:
        request = log.predict_log.request
        assert request.model_spec.name == "penguins" and request.model_spec.signature_name == "serving_default"
        inputs = {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
        out = loaded.signatures["serving_default"](**{k: tf.constant(v) for k, v in inputs.items()})
        assert out["probabilities"].shape == (1, 3)

    meta = json.load(open(v1 / "assets.extra" / "export.json"))
    assert meta["version"] == 1 and meta["reload_check"]["max_abs_diff"] <= 1e-5
    assert meta["lineage"]["data_fingerprint"] == json.load(open(os.path.join(data, "data.json")))["fingerprint"]


def test_a_killed_export_leaves_no_numeric_version_and_the_next_export_is_the_next_one(tmp_path, penguins_trained,
                                                                                       first_export):
    """Killed while it writes beside version 1, an export leaves nothing a server polling the base
    path would load; the next export is version 2, judged against 1 (the same model: promoted),
    and --keep 1 keeps 1, what a rollback returns to. Versions are never reused, even after the
    newest is gone."""
    from tfpipe.export.inputs import choose_version

    data, train = penguins_trained
    _copy_of(first_export, tmp_path)
    model = str(tmp_path / "penguins")
    proc = spawn_cli("export", "--model", train, "--data", data, "--base", str(tmp_path), "--name", "penguins",
                     "--tflite", "", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not glob.glob(str(tmp_path / "penguins" / ".*.tmp-*")) and time.time() < deadline:
        assert proc.poll() is None
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert versions.numeric_versions(model) == [1]
    res = export(penguins_trained, tmp_path, "--keep", "1")
    assert res.returncode == 0, res.stderr
    assert versions.numeric_versions(model) == [1, 2] and versions.served(model) == 2
    assert not [n for n in os.listdir(model) if ".tmp-" in n]
    assert versions.history(model)[-1]["event"] == "promoted"
    assert json.load(open(tmp_path / "penguins" / "2" / "assets.extra" / "export.json"))["baseline"] == 1
    os.rename(tmp_path / "penguins" / "2", tmp_path / "gone")
    assert choose_version(model, None) == 3


def test_tflite_variants_are_measured_beside_the_saved_model(tmp_path, penguins_trained):
    import tensorflow as tf
    from ai_edge_litert.interpreter import Interpreter

    data, train = penguins_trained
    base = ["--model", train, "--data", data, "--base", str(tmp_path), "--name", "penguins"]
    # A generous threshold: every variant ships, each measured beside the SavedModel.
    res = run_cli("export", *base, "--max-accuracy-drop", "0.2")
    assert res.returncode == 0, res.stderr
    assert "variant" in res.stdout and "int8" in res.stdout
    folder = tmp_path / "penguins" / "1" / "assets.extra" / "tflite"
    meta = json.load(open(tmp_path / "penguins" / "1" / "assets.extra" / "export.json"))
    rows = {r["variant"]: r for r in meta["variants"]}
    assert set(rows) == {"savedmodel", "float32", "float16", "dynamic", "int8"}
    for name in ("float32", "float16", "dynamic", "int8"):
        blob = (folder / f"{name}.tflite").read_bytes()
        assert rows[name]["bytes"] == len(blob) and rows[name]["accuracy"] >= 0.8
        assert rows[name]["latency_ms_p50"] > 0 and rows[name]["latency_ms_p99"] >= rows[name]["latency_ms_p50"]
    # What a device app does: vocabulary indices for strings, NaN for a missing number.
    vocab = json.load(open(folder / "vocabularies.json"))["vocabularies"]
    runner = Interpreter(model_path=str(folder / "float32.tflite")).get_signature_runner("serving_default")
    row = {"island": vocab["island"].index("Biscoe") + 1, "bill_length_mm": 48.0, "bill_depth_mm": 15.0,
           "flipper_length_mm": 220.0, "body_mass_g": 5400.0, "sex": vocab["sex"].index("male") + 1,
           "year": float("nan")}
    feed = {k: np.array([v], dtype=np.int32 if k in vocab else np.float32) for k, v in row.items()}
    probs = next(iter(runner(**feed).values()))[0]
    assert int(np.argmax(probs)) == 2  # Gentoo, as the SavedModel says for this bird
    del tf

    # int8 answers like float32 on every test row. (Two converter traps made it answer
    # otherwise: raw numbers quantized with one scale, and ONE_HOT's unscaled on/off values.)
    from tfpipe.export.job import _labelled_rows
    from tfpipe.export.tflite import device_inputs, litert_runner
    from tfpipe.train.datadir import load_data_dir

    penguins = load_data_dir(data)
    raw, _ = _labelled_rows(penguins, "test")
    feed = device_inputs(raw, penguins.schema, vocab)
    f32, i8 = (litert_runner((folder / f"{name}.tflite").read_bytes())[1](feed) for name in ("float32", "int8"))
    assert f32.shape == i8.shape == (len(raw["island"]), 3)
    assert np.abs(f32 - i8).max() < 0.1, np.abs(f32 - i8).max()
    assert rows["int8"]["bytes"] < rows["dynamic"]["bytes"] < rows["float16"]["bytes"] < rows["float32"]["bytes"]


@pytest.mark.long
def test_a_variant_that_loses_accuracy_fails_the_export_unless_allowed(tmp_path, penguins_trained, first_export):
    """No tolerance for loss: a variant that drops accuracy fails the export with the table, and
    nothing is published; --allow-drop ships the rest and records the dropped one. (The rule
    itself, on made-up answers: tests/test_wide.py; here, through the CLI on a real model.)"""
    data, train = penguins_trained
    _copy_of(first_export, tmp_path)  # version 1 served: the next is 2
    base = ["--model", train, "--data", data, "--base", str(tmp_path), "--name", "penguins"]
    res = run_cli("export", *base, "--max-accuracy-drop", "0", "--tflite", "float32,int8")
    if res.returncode == 0:  # int8 happened to lose nothing on this small test split
        assert json.load(open(tmp_path / "penguins" / "2" / "assets.extra" / "export.json"))["variants"]
    else:
        assert res.returncode == 2 and "lose more accuracy than --max-accuracy-drop 0" in res.stderr
        assert "variant" in res.stdout  # the table that shows why
        assert not (tmp_path / "penguins" / "2").exists()
        res = run_cli("export", *base, "--max-accuracy-drop", "0", "--tflite", "float32,int8", "--allow-drop")
        assert res.returncode == 0, res.stderr
        meta = json.load(open(tmp_path / "penguins" / "2" / "assets.extra" / "export.json"))
        assert any(r.get("dropped") for r in meta["variants"])
        assert not (tmp_path / "penguins" / "2" / "assets.extra" / "tflite" / "int8.tflite").exists()


@pytest.mark.parametrize("case", ["no_train", "incomplete", "version", "base", "variant"])
def test_bad_input_exits_2_with_one_line(tmp_path, penguins_trained, first_export, case):
    data, train = penguins_trained
    args = ["--model", train, "--data", data, "--base", str(tmp_path / "models"), "--name", "penguins"]
    if case == "no_train":
        args[1] = str(tmp_path / "nope")
        expect = "does not exist"
    elif case == "incomplete":
        os.makedirs(tmp_path / "half")
        args[1] = str(tmp_path / "half")
        expect = "is not a complete tfpipe train output: model.keras is missing"
    elif case == "version":
        _copy_of(first_export, tmp_path / "models")  # version 1 exists
        args += ["--version", "1"]
        expect = "version 1 already exists"
    elif case == "base":
        (tmp_path / "file").write_text("not a directory")
        args[5] = str(tmp_path / "file")
        expect = "cannot create"
    else:
        args += ["--tflite", "float32,int4"]
        expect = "unknown TFLite variant 'int4'; allowed: float32, float16, dynamic, int8"
    res = run_cli("export", *args, *([] if case == "variant" else ["--tflite", ""]))
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert expect in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_numeric_block_computes_exactly_what_each_feature_layer_does():
    """The TFLite numeric block runs every feature's normalisation as one vector chain; each
    column must equal its own layer: timestamps, tiny and huge spreads, NaN, clipping."""
    from tfpipe.export.tflite import NumericBlock
    from tfpipe.train.layers import ImputeNormalize

    norms = [ImputeNormalize(1.4085e9, 8.5e14, False, clip=5.0), ImputeNormalize(11.8, 142.0, True, clip=5.0),
             ImputeNormalize(-87.65, 0.0009, True, clip=5.0), ImputeNormalize(0.0, 1.0, False),  # saved unclipped
             ImputeNormalize(2.1, 1.3, True, clip=5.0, log1p=True)]  # a heavy tail, in log scale
    rng = np.random.default_rng(0)
    columns = [np.float32(1.4e9 + rng.normal(0, 3e7, 64)), np.float32(rng.exponential(12, 64)),
               np.float32(-87.65 + rng.normal(0, 0.05, 64)), np.float32(rng.normal(0, 50, 64)),
               np.float32(np.exp(rng.normal(2, 1.5, 64)))]
    columns[1][:4] = [np.nan, 700.0, 0.0, 12.0]
    columns[2][5] = np.nan
    columns[4][:2] = [np.nan, -3.0]
    got = np.asarray(NumericBlock(norms)(columns))
    each = [np.asarray(n(c)) for n, c in zip(norms, columns)]
    want_z = np.stack([e[:, 0] for e in each], axis=1)
    want_flags = np.stack([e[:, 1] for e in each if e.shape[1] == 2], axis=1)
    assert got.shape == (64, 5 + 3)
    np.testing.assert_array_equal(got[:, :5], want_z)
    np.testing.assert_array_equal(got[:, 5:], want_flags)
    np.testing.assert_allclose(got[2:, 4], np.clip((np.log1p(columns[4][2:]) - 2.1) / np.sqrt(1.3), -5, 5), atol=1e-3)
    assert got[:, :3].max() <= 5.0 and got[:, :3].min() >= -5.0 and got[1, 1] == 5.0  # the 700 fare
    assert np.abs(got[:, 3]).max() > 5.0  # no bound where the layer had none
    assert got[0, 1] == 0.0 and got[0, 5] == 1.0 and got[5, 6] == 1.0  # missing: imputed and flagged


def test_numeric_block_gives_each_feature_its_quantile_bins_as_its_own_layer_does():
    """Features with quantile bins beside plain ones: every column of the block is the one its
    feature's layer makes, in the order device_model reads them back (`columns`)."""
    from tfpipe.export.tflite import NumericBlock
    from tfpipe.train.layers import ImputeNormalize, quantile_knots

    money = {"min": 0.0, "max": 9e4, "quantiles": {"0.01": 1.0, "0.25": 20.0, "0.5": 60.0, "0.75": 300.0, "0.99": 8e3}}
    norms = [ImputeNormalize(1.4085e9, 8.5e14, False, clip=5.0),
             ImputeNormalize(3.2, 2.9, True, clip=5.0, log1p=True, knots=quantile_knots(money, 3.2, 2.9, True)),
             ImputeNormalize(11.8, 142.0, True, clip=5.0),
             ImputeNormalize(0.5, 0.25, False, clip=5.0, knots=[-1.0, 1.0])]  # a 0/1 column: one bin
    rng = np.random.default_rng(1)
    columns = [np.float32(1.4e9 + rng.normal(0, 3e7, 64)), np.float32(rng.lognormal(4, 2, 64)),
               np.float32(rng.exponential(12, 64)), np.float32(rng.integers(0, 2, 64))]
    columns[1][:3] = [np.nan, -5.0, 1e6]  # missing, below the minimum, beyond the maximum
    columns[2][4] = np.nan
    block = NumericBlock(norms)
    got = np.asarray(block(columns))
    assert got.shape == (64, block.width) and block.width == 1 + 6 + 1 + 1 + 2
    for i, (norm, column) in enumerate(zip(norms, columns)):
        np.testing.assert_array_equal(got[:, block.columns(i)], np.asarray(norm(column)))
    bins = got[:, block.columns(1)[:-1]]
    assert (bins >= 0).all() and (bins <= 1).all()
    assert list(got[0, block.columns(1)]) == [0.0] * 6 + [1.0]  # missing: no bin, flagged
    assert bins[1].sum() == 0.0 and bins[2].sum() == 6.0  # below and beyond the training range
    np.testing.assert_array_equal(got[:, block.columns(3)][:, 0], columns[3])
