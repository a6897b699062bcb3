"""`tfpipe predict` on Apache Flink and Apache Spark, in the predict environment engines/setup.sh
--predict makes (Beam 2.62 and TensorFlow 2.20), with a model the main environment trained and
exported (TensorFlow 2.21), against FnApiRunner's predictions in the main environment: the same
rows, classes exact and probabilities within float32 rounding, the same dead-letter rows and
counts; after a work unit failed once and was retried; from the main environment with
--environment; and with PROCESS workers that load the model in processes of their own."""

from __future__ import annotations

import collections
import json
import os
import subprocess

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import REFERENCE, tfpipe

PREDICT_ENV = os.environ.get("TFPIPE_ENGINE_PREDICT_ENV", "")
MODEL = os.environ.get("TFPIPE_ENGINE_MODEL", "")
PREDICT_ARGS = os.environ.get("TFPIPE_ENGINE_PREDICT_ARGS", "").split()
FLINK = ["--runner", "FlinkRunner", "--flink_master=[local]", "--parallelism=2"]
SPARK = ["--runner", "SparkRunner", "--spark_master_url=local[2]"]


def tfpipe_predict(*args: str, python: str | None = None, **options) -> subprocess.CompletedProcess:
    """`tfpipe predict ARGS` as a user of the predict environment runs it (or `python`'s)."""
    return tfpipe("predict", "--model", MODEL, *PREDICT_ARGS, *args,
                  python=python or os.path.join(PREDICT_ENV, "bin", "python"), **options)


def predictions(out: str) -> tuple[pa.Table, collections.Counter, dict]:
    """A predict output's rows (every file, sorted by their input columns), its dead-letter lines
    as a multiset, and predict.json."""
    with open(os.path.join(out, "predict.json")) as f:
        manifest = json.load(f)
    table = pa.concat_tables(pq.read_table(os.path.join(out, name)) for name in manifest["outputs"]["files"])
    answers = {"prediction", "model", "model_version"} | {c for c in table.column_names if c.startswith("probability")}
    table = table.sort_by([(c, "ascending") for c in table.column_names if c not in answers])
    dead = collections.Counter()
    for name in manifest["outputs"]["deadletter"]:
        with open(os.path.join(out, name), encoding="utf-8") as f:
            dead.update(f.read().splitlines())
    return table, dead, manifest


def assert_same_predictions(got_dir: str, want_dir: str) -> dict:
    got, got_dead, manifest = predictions(got_dir)
    want, want_dead, reference = predictions(want_dir)
    assert got.column_names == want.column_names and got.num_rows == want.num_rows
    for name in want.column_names:
        a, b = got.column(name).to_numpy(zero_copy_only=False), want.column(name).to_numpy(zero_copy_only=False)
        if name.startswith("probability"):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-6, err_msg=name)  # float32 rounding
        else:
            assert got.column(name).equals(want.column(name)), f"column {name} differs"
    assert manifest["counts"] == reference["counts"]
    assert got_dead == want_dead, "dead-letter rows differ"
    # the comparison compared something: both classes predicted, and bad rows dead-lettered
    assert len(set(want.column("prediction").to_pylist())) == 2 and sum(want_dead.values()) > 0
    return manifest


@pytest.fixture(scope="session")
def taxi(inputs) -> str:
    assert os.path.isdir(MODEL) and os.path.isdir(PREDICT_ENV), "run the engine tests with tests_engines/run.sh"
    return os.path.join(inputs, "taxi.csv")


@pytest.mark.parametrize("engine", [FLINK, SPARK], ids=["flink", "spark"])
def test_predictions_on_an_engine_with_tensorflow_2_20_match_fnapirunner_with_2_21(engine, taxi, tmp_path):
    out = tmp_path / "predict"
    res = tfpipe_predict("--input", taxi, "--out", str(out), *engine)
    manifest = assert_same_predictions(str(out), os.path.join(REFERENCE, "predict"))
    assert manifest["beam"]["runner"] == engine[1] and manifest["beam"]["version"] == "2.62.0"
    assert manifest["tensorflow_version"].startswith("2.20.")
    with open(os.path.join(REFERENCE, "predict", "predict.json")) as f:
        assert json.load(f)["tensorflow_version"].startswith("2.21.")
    assert manifest["beam"]["units"] >= 2 and "2 workers" in res.stdout


def test_a_unit_that_fails_once_is_retried_and_the_predictions_are_exact(taxi, tmp_path):
    """Work unit 1 fails after writing its predictions file, on its first attempt only; Spark
    retries the task, and the output holds each row once."""
    marker = tmp_path / "failed-once"
    out = tmp_path / "predict"
    tfpipe_predict("--input", taxi, "--out", str(out), "--runner", "SparkRunner", "--spark_master_url=local[2,3]",
                   env={"TFPIPE_TEST_FAIL_ONCE": f"1:{marker}"})
    assert marker.exists(), "work unit 1 never failed: the retry was not tested"
    assert_same_predictions(str(out), os.path.join(REFERENCE, "predict"))


def test_predict_from_the_main_environment_runs_in_the_environment_it_names(taxi, tmp_path):
    """The main environment's tfpipe (TensorFlow 2.21, Beam 2.77) with --environment: the job runs
    in the predict environment, on Flink there; a user error there comes back as one line."""
    out = tmp_path / "predict"
    main = os.path.join(os.path.dirname(os.environ["TFPIPE_MAIN_TFPIPE"]), "python")
    res = tfpipe_predict("--input", taxi, "--out", str(out), "--environment", PREDICT_ENV, *FLINK, python=main)
    manifest = assert_same_predictions(str(out), os.path.join(REFERENCE, "predict"))
    assert manifest["beam"]["version"] == "2.62.0" and "dead-lettered" in res.stdout
    short = tmp_path / "short.csv"
    with open(taxi) as f:
        short.write_text("".join(",".join(line.split(",")[:3]) + "\n" for line in f.readlines()[:50]))
    bad = subprocess.run([main, "-m", "tfpipe.cli", "predict", "--model", MODEL, "--input", str(short),
                          "--out", str(tmp_path / "never"), "--environment", PREDICT_ENV, *FLINK],
                         capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    errors = [line for line in bad.stderr.splitlines() if line.startswith("tfpipe predict:")]
    assert bad.returncode == 2 and len(errors) == 1 and "lacks" in errors[0], bad.stderr[-2000:]
    assert not (tmp_path / "never").exists()


def test_process_workers_load_the_model_in_the_predict_environment(taxi, tmp_path):
    """PROCESS workers, as a cluster's would be: Beam's boot program starts the predict
    environment's Python (TensorFlow 2.20, tfpipe installed there) in processes of their own,
    which load the model themselves."""
    config = json.dumps({"command": os.environ["TFPIPE_ENGINE_BOOT"],
                         "env": {"PATH": os.path.join(PREDICT_ENV, "bin") + os.pathsep + "/usr/bin:/bin",
                                 "RUN_PYTHON_SDK_IN_DEFAULT_ENVIRONMENT": "1"}})
    out = tmp_path / "predict"
    tfpipe_predict("--input", taxi, "--out", str(out), *FLINK, "--environment_type=PROCESS",
                   f"--environment_config={config}", cwd=str(tmp_path))
    assert_same_predictions(str(out), os.path.join(REFERENCE, "predict"))
