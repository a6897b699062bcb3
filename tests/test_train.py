"""Behaviour of `tfpipe train`: real tf.data and Keras on data the data stage wrote."""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess

import numpy as np
import pytest

from conftest import backup_epoch, free_port, kill_after_epochs, run_cli, spawn_cli
from tfpipe.stage import TrainOutputs


def train(data: str, out, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return run_cli("train", "--data", data, "--out", str(out), *args, timeout=timeout)


def load(out, name="train.json") -> dict:
    return json.load(open(os.path.join(out, name)))


def test_penguins_trains_and_the_saved_model_takes_raw_features(tmp_path, penguins_data):
    import keras
    import tensorflow as tf

    out = tmp_path / "train"
    res = train(penguins_data, out)
    assert res.returncode == 0, res.stderr
    assert "precision float32 (no GPU)" in res.stdout and "wrote" in res.stdout
    m = load(out)
    # 35 eval rows (stratified), the majority class alone 0.44. Two are wrong in most runs: a
    # Gentoo with every measurement missing, and an Adelie/Chinstrap on the border; from run to
    # run (the input order is not fixed) up to three more border rows flip (31 of 35 seen).
    assert m["metrics"]["eval"]["accuracy"] >= 0.85
    # the batch follows the ~270 training rows: about 32 steps an epoch, not one batch of 256
    assert m["precision"]["policy"] == "float32" and m["strategy"]["global_batch"] == 16
    assert "training examples: until early stopping (time limit 600 s), batch size 16" in res.stdout
    assert 0 <= m["input_wait_fraction"] <= 1 and m["examples_per_s"] > 0
    epochs = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert [e["epoch"] for e in epochs] == list(range(1, m["epochs_run"] + 1))
    assert all(np.isfinite(e["loss"]) and "val_accuracy" in e for e in epochs)
    assert len(glob.glob(str(out / "checkpoints" / "epoch-*.weights.h5"))) == m["epochs_run"]

    # The saved model: raw features in (NaN for a missing number), class probabilities out.
    from tfpipe.train.model import numpy_batch
    from tfpipe.pipeline.schema import load_schema

    model = keras.models.load_model(out / "model.keras")
    schema = load_schema(os.path.join(penguins_data, "schema.json"))
    rows = [
        {"island": "Biscoe", "bill_length_mm": 48.0, "bill_depth_mm": 15.0, "flipper_length_mm": 220,
         "body_mass_g": 5400, "sex": "male", "year": 2008},   # a Gentoo
        {"island": "Torgersen", "bill_length_mm": 38.0, "bill_depth_mm": 19.0, "flipper_length_mm": 185,
         "body_mass_g": 3600, "sex": None, "year": 2007},      # an Adelie, sex unknown
        {"island": "Dream", "bill_length_mm": 50.0, "bill_depth_mm": 19.0, "flipper_length_mm": None,
         "body_mass_g": 3800, "sex": "female", "year": 2009},  # a Chinstrap, flipper missing
    ]
    probs = model.predict(numpy_batch(schema, rows), verbose=0)
    assert probs.shape == (3, 3) and np.allclose(probs.sum(axis=1), 1, atol=1e-5)
    assert [schema.label.classes[i] for i in probs.argmax(axis=1)] == ["Gentoo", "Adelie", "Chinstrap"]

    # TensorBoard event files hold the per-epoch scalars.
    events = glob.glob(str(out / "logs" / "train" / "events.out.tfevents.*"))
    assert events
    tags = set()
    for record in tf.data.TFRecordDataset(events):
        event = tf.compat.v1.Event.FromString(record.numpy())
        tags.update(v.tag for v in event.summary.value)
    assert "epoch_loss" in tags and "epoch_accuracy" in tags

    res = train(penguins_data, out)
    assert res.returncode == 0 and "cache hit" in res.stdout


@pytest.mark.long
def test_chicago_taxi_quality(tmp_path, chicago_csv):
    from tfpipe.pipeline.config import DataConfig
    from tfpipe.pipeline.job import run

    data = run(DataConfig(input=[chicago_csv], label="big_tipper", exclude=["tips"], out=str(tmp_path / "d")),
               log=lambda _: None).outputs.path
    res = train(data, tmp_path / "t", "--time-limit", "60")
    assert res.returncode == 0, res.stderr
    m = load(tmp_path / "t")
    # TFX's Keras model reaches about 0.78-0.79 accuracy and 0.93 AUC on this data.
    assert m["metrics"]["test"]["accuracy"] >= 0.78 and m["metrics"]["test"]["auc"] >= 0.92


@pytest.mark.long
def test_kill_diverge_and_resume(tmp_path, penguins_data):
    out = tmp_path / "train"
    common = ["--seed", "3", "--batch-size", "32"]
    # 1. A long run, killed with SIGKILL once a few epochs are backed up.
    proc = spawn_cli("train", "--data", penguins_data, "--out", str(out), "--epochs", "1000", "--patience", "1000",
                     *common, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    killed_at = kill_after_epochs(proc, out, 3)
    assert killed_at >= 3 and not out.exists()
    # A kill can land while the backup is being written: cut its weights file short as such a
    # kill leaves it. The backup before it (kept as .bkp) is the one to resume from.
    backup = tmp_path / ".train.resume" / "backup"
    weights = backup / "latest.weights.h5"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    killed_at = json.loads((backup / "training_metadata.json.bkp").read_text())["epoch"]
    assert killed_at >= 2

    # 2. Resumed with a learning rate that diverges: a clear error, the good epochs are kept.
    res = train(penguins_data, out, "--epochs", "1000", "--learning-rate", "1e38", *common)
    assert res.returncode == 2, res.stderr
    assert "was cut short (the run was killed while writing it): resuming from the one before" in res.stdout
    assert f"resuming from the backup of epoch {killed_at}" in res.stdout
    assert re.search(rf"loss became (nan|inf) at epoch {killed_at + 1}\b", res.stderr), res.stderr
    assert f"the last good epoch ({killed_at}) is kept" in res.stderr and "Traceback" not in res.stderr
    assert backup_epoch(out) == killed_at and not out.exists()

    # 3. Rerun with a sane rate: resumes from the kept epoch and ends like an uninterrupted run.
    res = train(penguins_data, out, "--epochs", "15", "--patience", "15", *common)
    assert res.returncode == 0, res.stderr
    assert f"resuming from the backup of epoch {killed_at}" in res.stdout
    resumed = load(out)
    assert resumed["resumed_from_epoch"] == killed_at
    epochs = [json.loads(line)["epoch"] for line in open(out / "metrics.jsonl")]
    assert epochs == list(range(1, 16))
    ref = tmp_path / "reference"
    res = train(penguins_data, ref, "--epochs", "15", "--patience", "15", *common)
    assert res.returncode == 0
    assert abs(resumed["metrics"]["eval"]["accuracy"] - load(ref)["metrics"]["eval"]["accuracy"]) <= 0.07
    assert resumed["metrics"]["eval"]["accuracy"] >= 0.9


def _weights(path) -> list[np.ndarray]:
    import keras

    import tfpipe.train.model  # noqa: F401  (registers the model's layers, as a user loading model.keras must)

    return [np.asarray(w) for w in keras.models.load_model(path).weights]


@pytest.mark.long
def test_seed_and_deterministic_give_bit_identical_weights(tmp_path, penguins_data):
    args = ["--seed", "11", "--deterministic", "--epochs", "4", "--dropout", "0.1"]
    assert train(penguins_data, tmp_path / "a", *args).returncode == 0
    assert train(penguins_data, tmp_path / "b", *args).returncode == 0
    wa, wb = _weights(tmp_path / "a" / "model.keras"), _weights(tmp_path / "b" / "model.keras")
    assert len(wa) == len(wb) and all(np.array_equal(x, y) for x, y in zip(wa, wb))
    assert train(penguins_data, tmp_path / "c", "--seed", "12", "--deterministic", "--epochs", "4",
                 "--dropout", "0.1").returncode == 0
    assert not all(np.array_equal(x, y) for x, y in zip(wa, _weights(tmp_path / "c" / "model.keras")))


def test_gradient_accumulation_matches_one_big_batch(penguins_data):
    import keras
    import tensorflow as tf

    from tfpipe.train.data import make_dataset
    from tfpipe.train.datadir import load_data_dir
    from tfpipe.train.job import compile_trainer
    from tfpipe.train.model import build_models

    data = load_data_dir(penguins_data)
    preprocessor, _, _ = build_models(data.schema, data.train_stats(), [16], 0.0, seed=0)
    examples = make_dataset(data.files("train"), data.schema, 64, shuffle=False, seed=0, deterministic=True,
                            preprocess=preprocessor).unbatch().take(64).cache()
    list(examples)  # materialise once: both runs see exactly these 64 examples in this order

    def train_with(batch: int, accum: int) -> list[np.ndarray]:
        keras.utils.set_random_seed(0)
        _, trainer, _ = build_models(data.schema, data.train_stats(), [16], 0.0, seed=0)
        compile_trainer(trainer, "multiclass", 0.01, accum, xla=False)
        trainer.fit(examples.batch(batch), epochs=1, verbose=0, shuffle=False)
        return [np.asarray(w) for w in trainer.weights]

    big = train_with(64, 1)      # one update from a batch of 64
    accum = train_with(16, 4)    # four batches of 16, gradients averaged into one update
    start = None
    keras.utils.set_random_seed(0)
    _, fresh, _ = build_models(data.schema, data.train_stats(), [16], 0.0, seed=0)
    start = [np.asarray(w) for w in fresh.weights]
    assert not all(np.allclose(a, s) for a, s in zip(big, start))  # the update did happen
    for a, b in zip(big, accum):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    small = train_with(16, 1)    # four separate updates: not the same
    assert not all(np.allclose(a, b, atol=1e-6) for a, b in zip(big, small))
    del tf


def test_mixed_precision_on_cpu_keeps_a_float32_head(tmp_path, penguins_data):
    import keras

    import tfpipe.train.model  # noqa: F401  (registers the model's layers)

    res = train(penguins_data, tmp_path / "mp", "--precision", "mixed_float16", "--epochs", "3", "--profile")
    assert res.returncode == 0, res.stderr
    assert "mixed_float16 (as requested (on a CPU: runs, but slower than float32))" in res.stdout
    m = load(tmp_path / "mp")
    assert m["precision"] == {"policy": "mixed_float16", "why": "as requested (on a CPU: runs, but slower than float32)",
                              "loss_scaling": True}
    model = keras.models.load_model(tmp_path / "mp" / "model.keras")
    trainer = model.get_layer("trainer")
    assert trainer.get_layer("hidden_0").compute_dtype == "float16"
    assert trainer.get_layer("head").compute_dtype == "float32"
    assert model.output.dtype == "float32"
    # --profile left a profiler trace for TensorBoard's profile plugin.
    traces = glob.glob(str(tmp_path / "mp" / "logs" / "train" / "plugins" / "profile" / "*" / "*.xplane.pb"))
    assert traces and os.path.getsize(traces[0]) > 0


@pytest.mark.parametrize("case", ["missing", "incomplete", "version", "hidden", "corrupt"])
def test_bad_input_exits_2_with_one_line(tmp_path, penguins_data, case):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(penguins_data, data)
    args = []
    expect = ""
    if case == "missing":
        data = tmp_path / "nope"
        expect = f"data directory {data} does not exist"
    elif case == "incomplete":
        os.remove(data / "stats.json")
        expect = "is not a complete tfpipe data output: stats.json is missing"
    elif case == "version":
        schema = json.load(open(data / "schema.json"))
        schema["version"] = 2
        (data / "schema.json").write_text(json.dumps(schema))
        expect = "has schema version 2; this tfpipe reads version 1"
    elif case == "hidden":
        args = ["--hidden", "64,x"]
        expect = "'64,x' is not a comma-separated list of integers"
    elif case == "corrupt":
        shard = sorted(glob.glob(str(data / "train-*.tfrecord.gz")))[0]
        blob = bytearray(open(shard, "rb").read())
        blob[len(blob) // 2: len(blob) // 2 + 40] = bytes(40)
        open(shard, "wb").write(bytes(blob))
        expect = "is corrupt"
    res = train(str(data), tmp_path / "out", *args)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert expect in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 or case == "hidden", res.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.long
def test_two_worker_multiworker_mirrored_strategy(tmp_path, penguins_data):
    # Two real processes on 127.0.0.1, each reading its own shard of the train files
    # (the data fixture writes 2 shards per split), gradients all-reduced every step.
    cluster = {"worker": [f"127.0.0.1:{p}" for p in (free_port(), free_port())]}
    out = tmp_path / "mw"
    procs = []
    for index in range(2):
        env = {**os.environ, "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})}
        procs.append(spawn_cli("train", "--data", penguins_data, "--out", str(out), "--strategy", "multiworker",
                               "--batch-size", "32", "--epochs", "8", "--learning-rate", "0.01", "--seed", "5",
                               env=env))
    try:
        results = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (_, stderr) in zip(procs, results):
        assert p.returncode == 0, stderr
    m = load(out)
    assert m["strategy"]["name"] == "MultiWorkerMirroredStrategy (TF_CONFIG)"
    assert m["strategy"]["workers"] == 2 and m["strategy"]["replicas"] == 2
    assert m["strategy"]["global_batch"] == 64
    # Learnt in 8 epochs (the majority class is 0.44): within three of 35 eval rows of what one
    # worker reaches; the order two workers see the batches in differs from run to run.
    assert m["metrics"]["eval"]["accuracy"] >= 0.9
    epochs = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert epochs and all("val_accuracy" in e for e in epochs)
    assert (out / "model.keras").exists() and glob.glob(str(out / "logs" / "train" / "events.out.tfevents.*"))
    assert not glob.glob(str(tmp_path / ".mw.resume*"))  # the other worker cleaned up after itself


def test_feature_layers_finds_each_features_preprocessing_after_a_save(tmp_path):
    """The contract export relies on: each feature's layers, by kind, found again in model.keras
    (a number: norm; a string of few values: a one-hot lookup; of many: lookup and embedding);
    a feature with no value in training has none."""
    import keras

    from tfpipe.pipeline.schema import Feature, Label, Schema
    from tfpipe.train.model import ONE_HOT_MAX, build_models, feature_layers

    schema = Schema([Feature("x", "float"), Feature("never", "int"), Feature("few", "string"),
                     Feature("many", "string")], Label("y", "int", "binary", [0, 1]))
    number = {"mean": 1.0, "variance": 4.0}
    stats = {"features": {"x": number, "never": {"mean": None, "variance": None},
                          "few": {"top": [("a", 3), ("b", 2)]},
                          "many": {"top": [(f"v{i}", 1) for i in range(ONE_HOT_MAX + 4)]}},
             "label": {}}
    _, _, model = build_models(schema, stats, [4], 0.0, seed=0)
    model.save(tmp_path / "model.keras")
    found = feature_layers(keras.models.load_model(tmp_path / "model.keras"), schema)
    kinds = {name: tuple(k for k in ("norm", "lookup", "embed") if getattr(f, k) is not None)
             for name, f in found.items()}
    assert kinds == {"x": ("norm",), "few": ("lookup",), "many": ("lookup", "embed")}
    assert found["few"].lookup.get_vocabulary()[1:] == ["a", "b"]
    assert found["many"].embed.input_dim == ONE_HOT_MAX + 5  # its values and the out-of-vocabulary index


def test_the_train_result_summarises_its_own_output(penguins_trained):
    """What tfpipe run shows of training, read by the stage itself: the epochs run of the 20
    asked for, the eval accuracy of a model the penguins separate well, the precision."""
    import re

    from tfpipe.train.job import result

    r = result(penguins_trained[1])
    # all 20 epochs (said not converged when the eval loss still fell at the last), or early stopping
    m = re.match(r"(20 epochs(, ended by its 20 epochs while the eval loss still fell \(best at epoch \d+\): not "
                 r"converged, --epochs \(train\.epochs\) gives it longer)?|\d+ of 20 epochs \(early stopping[^)]*\)), "
                 r"eval accuracy ([01]\.\d{3}) \(95% CI ([01]\.\d{3})-([01]\.\d{3}), 35 rows\), float32, "
                 r"[\d,]+ examples/s$", r.summary)
    assert m, r.summary
    # 35 eval rows: two to five wrong from run to run (see test_penguins_trains_...)
    assert float(m.group(3)) >= 0.85, r.summary
    assert float(m.group(4)) < float(m.group(3)) <= float(m.group(5)), r.summary  # its Wilson interval
    assert r.outputs.path == penguins_trained[1] and r.manifest.endswith("train.json")
    assert isinstance(r.outputs, TrainOutputs) and len(r.outputs.fingerprint) == 64



@pytest.mark.parametrize("cut, has_previous, resumes_at", [
    (None, True, 5),              # a whole backup: left as it is
    ("weights", True, 4),         # weights cut short: the one before
    ("metadata", True, 4),        # metadata cut short: the one before
    ("weights", False, None),     # nothing earlier: start over
])
def test_a_backup_cut_short_gives_way_to_the_one_before(tmp_path, cut, has_previous, resumes_at):
    import h5py

    from tfpipe.train.resume import repair_backup

    backup = tmp_path / "backup"
    backup.mkdir()

    def write(suffix: str, epoch: int) -> None:
        with h5py.File(backup / f"latest.weights.h5{suffix}", "w") as f:
            f["w"] = np.full(64, epoch, dtype=np.float32)
        (backup / f"training_metadata.json{suffix}").write_text(json.dumps({"epoch": epoch, "batch": 0}))

    if has_previous:
        write(".bkp", 4)
    write("", 5)
    if cut:
        path = backup / ("latest.weights.h5" if cut == "weights" else "training_metadata.json")
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    said: list[str] = []
    repair_backup(str(backup), said.append)
    if resumes_at is None:
        assert not backup.exists() and "training starts over" in said[0]
    else:
        assert json.loads((backup / "training_metadata.json").read_text())["epoch"] == resumes_at
        with h5py.File(backup / "latest.weights.h5", "r") as f:
            assert f["w"][0] == resumes_at
        assert len(said) == (resumes_at != 5)


def test_an_ensemble_trains_each_member_on_its_own_error_and_answers_their_mean(tmp_path):
    """--ensemble K: K networks side by side in the trainer, (batch, K) in standard units; the
    loss gives each member the gradient of its own error, not that of their mean; the saved
    model, reloaded, and export's device model (TFLite) answer the members' mean in the label's
    units; a classification label refuses an ensemble."""
    import keras
    import tensorflow as tf

    from tfpipe.export.tflite import device_model
    from tfpipe.pipeline.schema import Feature, Label, Schema
    from tfpipe.train.errors import TrainError
    from tfpipe.train.losses import make_loss
    from tfpipe.train.model import TRAINER, build_models

    schema = Schema([Feature("x", "float")], Label("y", "float", "regression"))
    stats = {"features": {"x": {"mean": 0.0, "variance": 1.0}}, "label": {"mean": 100.0, "std": 10.0}}
    preprocessor, trainer, model = build_models(schema, stats, [8], 0.0, seed=0, scaling="standard", ensemble=3)
    x = np.array([-1.0, 0.0, 0.5, 2.0], np.float32)
    features = preprocessor({"x": x})
    members = np.asarray(trainer(features))
    assert members.shape == (4, 3) and len({tuple(np.round(c, 5)) for c in members.T}) == 3  # three networks
    np.testing.assert_allclose(np.asarray(model({"x": x})), members.mean(-1) * 10.0 + 100.0, rtol=1e-5)

    y = np.array([1.0, -1.0, 0.0, 2.0], np.float32)  # in standard units
    with tf.GradientTape() as tape:
        loss = make_loss("regression")(y, trainer(features))
    bias = [trainer.get_layer(f"head_{k}").bias for k in range(3)]
    grads = [float(g[0]) for g in tape.gradient(loss, bias)]
    # d/db_k of the members' mean squared error: 2 (pred_k - y) summed over the batch, over 4 x 3
    np.testing.assert_allclose(grads, [2 * (members[:, k] - y).sum() / 12 for k in range(3)], rtol=1e-4)
    assert float(loss) == pytest.approx(((members - y[:, None]) ** 2).mean(), rel=1e-5)

    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    np.testing.assert_allclose(np.asarray(loaded({"x": x})), np.asarray(model({"x": x})), rtol=1e-6)
    assert loaded.get_layer(TRAINER).output.shape[-1] == 3
    lite, _ = device_model(loaded, schema)
    np.testing.assert_allclose(np.asarray(lite({"x": x})), np.asarray(model({"x": x})), rtol=1e-5)

    with pytest.raises(TrainError, match="for regression"):
        build_models(Schema([Feature("x", "float")], Label("y", "int", "binary", [0, 1])), stats, [8], 0.0,
                     seed=0, scaling="standard", ensemble=3)
