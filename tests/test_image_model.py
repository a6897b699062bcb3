"""Images after the data stage: training, export, serving and load tests on scikit-learn's
handwritten digits (the image demo's data), each stage through the CLI as a user runs it.

The digits go through `tfpipe data` and `tfpipe train` once for every worker (`built_once`);
the exported model is served by `tfpipe serve` and called the way TF Serving's own ResNet
clients call it (resnet_client.py: base64 JPEG over REST; resnet_client_grpc.py: a string
tensor through the official stubs)."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import requests
from PIL import Image

from conftest import built_once, kill_after_epochs, run_cli, spawn_cli, start_cli_server
from tfpipe.loadtest.payloads import json_row
from tfpipe.train.config import TrainConfig
from tfpipe.train.datadir import ImageLabel, ImageSchema
from tfpipe.train.devices import cpu_features

EPOCHS = 5
# The tests on the shared digits run stay on one worker: a second worker asking for the run while
# it is being built would wait for it, idle, for half a minute.
DIGITS = pytest.mark.xdist_group("digits")


@pytest.fixture(scope="session")
def digits(tmp_path_factory) -> dict[str, str]:
    """{workdir, data, train, base, stdout}: examples/digits.toml as shipped, made shorter (5
    epochs, TFLite float32 and int8 only, one 1 s load step), through `tfpipe run`; the other
    tests use its stages' outputs."""
    from conftest import ROOT

    def build(folder: Path) -> dict[str, str]:
        text = (Path(ROOT) / "examples" / "digits.toml").read_text()
        shorter = (text.replace("epochs = 30", f"epochs = {EPOCHS}").replace('sweep = "1,4,8"', 'sweep = "1"')
                   .replace('duration = "4s"', 'duration = "1s"').replace('warmup = "1s"', 'warmup = "0s"')
                   .replace('name = "digits"', 'name = "digits"\ntflite = "float32,int8"'))
        assert len(set(shorter.splitlines()) - set(text.splitlines())) == 5  # each replacement took
        (folder / "digits.toml").write_text(shorter)
        workdir = folder / "run"
        proc = spawn_cli("run", "--config", str(folder / "digits.toml"), "--workdir", str(workdir), env=_env(folder))
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, out + err
        return {"workdir": str(workdir), "data": str(workdir / "data"), "train": str(workdir / "train"),
                "base": str(workdir / "export" / "models"), "config": str(folder / "digits.toml"), "stdout": out}

    return built_once(tmp_path_factory, "digits", build)


def _env(folder: Path) -> dict[str, str]:
    return {**os.environ, "TFPIPE_CACHE": str(folder / "cache")}


def _json(path) -> dict:
    with open(path) as f:
        return json.load(f)


def _test_images(data: str) -> tuple[list[bytes], np.ndarray]:
    import tensorflow as tf

    encoded, labels = [], []
    for record in tf.data.TFRecordDataset(sorted(str(p) for p in Path(data).glob("test-*.tfrecord.gz")), "GZIP"):
        ex = tf.train.Example.FromString(record.numpy())
        encoded.append(ex.features.feature["image/encoded"].bytes_list.value[0])
        labels.append(ex.features.feature["image/class/label"].int64_list.value[0])
    return encoded, np.array(labels)


@pytest.mark.long
@DIGITS
def test_digits_are_written_as_png_class_folders_once(digits):
    data = _json(Path(digits["data"]) / "data.json")
    assert data["kind"] == "images" and data["counts"]["read"] == 1797 and data["counts"]["bad"] == 0
    folder = Path(data["inputs"][0]["written_to"])
    assert sorted(p.name for p in folder.iterdir()) == [str(d) for d in range(10)]
    assert sum(1 for _ in folder.glob("*/*.png")) == 1797
    with Image.open(folder / "0" / "0000.png") as image:
        assert image.size == (8, 8) and image.mode == "L"


@pytest.mark.long
@DIGITS
def test_image_training_reports_what_it_trained(digits):
    t = _json(Path(digits["train"]) / "train.json")
    assert t["image"]["size"] == [8, 8] and t["image"]["model"] == "cnn" and t["image"]["augment"] == []
    assert t["image"]["classes"] == [str(d) for d in range(10)]
    assert t["epochs_run"] == EPOCHS and t["metrics"]["test"]["accuracy"] >= 0.85
    assert 0 <= t["input_wait_fraction"] < 1 and t["examples_per_s"] > 0
    assert "avx2" in t["devices"]["cpu"]["features"] or t["devices"]["cpu"]["model"] is not None


@pytest.mark.long
@DIGITS
def test_export_has_both_signatures_warmup_images_and_an_int8_variant_within_the_gate(digits):
    import tensorflow as tf
    from ai_edge_litert.interpreter import Interpreter
    from tensorflow_serving.apis import prediction_log_pb2

    version = Path(digits["base"]) / "digits" / "1"
    e = _json(version / "assets.extra" / "export.json")
    assert e["signatures"] == ["serving_default", "predict_pixels", "classification"]
    assert e["reload_check"]["max_abs_diff"] <= 1e-5 and e["reload_check"]["split"] == "test"
    rows = {v["variant"]: v for v in e["variants"]}
    assert set(rows) == {"savedmodel", "float32", "int8"}
    assert rows["int8"]["drop"] <= e["config"]["max_accuracy_drop"]  # the gate export enforces
    assert rows["int8"]["ratio_bytes_vs_float32"] <= 0.3

    interpreter = Interpreter(model_path=str(version / "assets.extra" / "tflite" / "int8.tflite"))
    (given,) = interpreter.get_input_details()
    assert given["dtype"] == np.uint8 and list(given["shape"]) == [1, 8, 8, 3]

    warm = list(tf.data.TFRecordDataset(str(version / "assets.extra" / "tf_serving_warmup_requests")))
    assert len(warm) == e["warmup_records"] == 100
    request = prediction_log_pb2.PredictionLog.FromString(warm[0].numpy()).predict_log.request
    image = tf.make_ndarray(request.inputs["image_bytes"])[0]
    assert Image.open(io.BytesIO(image)).size == (8, 8)

    samples = _json(version / "assets.extra" / "samples.json")
    assert samples["split"] == "test" and 0 < len(samples["images"]) <= 24
    assert all(s["predicted"] in e["image"]["classes"] for s in samples["images"])


@pytest.mark.long
@DIGITS
def test_signatures_answer_and_resnet_style_clients_get_the_in_process_class(digits):
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    base = Path(digits["base"]) / "digits"
    model = tf.saved_model.load(str(base / "1"))
    encoded, labels = _test_images(digits["data"])
    # As TF Serving's ResNet example sends: JPEG files. Ours are PNGs: re-encode a few as JPEG too.
    images = encoded[:12]
    for png in encoded[12:16]:
        out = io.BytesIO()
        Image.open(io.BytesIO(png)).convert("RGB").save(out, format="JPEG", quality=95)
        images.append(out.getvalue())
    local = model.signatures["serving_default"](image_bytes=tf.constant(images))
    want = [c.decode() for c in local["classes"].numpy()]
    assert np.mean(local["class_ids"].numpy()[:12] == labels[:12]) >= 0.75

    pixels = tf.io.decode_png(encoded[0], channels=3)[tf.newaxis]
    by_pixels = model.signatures["predict_pixels"](pixels=pixels)
    assert by_pixels["classes"].numpy()[0].decode() == want[0]

    proc, grpc_port, rest_port = start_cli_server("--model_name=digits", f"--model_base_path={base}")
    try:
        url = f"http://127.0.0.1:{rest_port}/v1/models/digits:predict"
        for image, expected in zip(images, want):  # resnet_client.py: one base64 image per request
            body = {"instances": [{"b64": base64.b64encode(image).decode("utf-8")}]}
            answer = requests.post(url, json=body, timeout=30)
            assert answer.status_code == 200, answer.text
            assert answer.json()["predictions"][0]["classes"] == expected

        stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(f"127.0.0.1:{grpc_port}"))
        request = predict_pb2.PredictRequest()  # resnet_client_grpc.py's request, all images at once
        request.model_spec.name, request.model_spec.signature_name = "digits", "serving_default"
        request.inputs["image_bytes"].CopyFrom(tf.make_tensor_proto(images, shape=[len(images)]))
        result = stub.Predict(request, timeout=30)
        assert [c.decode() for c in tf.make_ndarray(result.outputs["classes"])] == want
        np.testing.assert_allclose(tf.make_ndarray(result.outputs["probabilities"]),
                                   local["probabilities"].numpy(), atol=1e-5)

        request = predict_pb2.PredictRequest()  # the pixel signature: a uint8 tensor
        request.model_spec.name, request.model_spec.signature_name = "digits", "predict_pixels"
        request.inputs["pixels"].CopyFrom(tf.make_tensor_proto(pixels.numpy()))
        assert tf.make_ndarray(stub.Predict(request, timeout=30).outputs["classes"])[0].decode() == want[0]

        classify = requests.post(f"http://127.0.0.1:{rest_port}/v1/models/digits:classify", timeout=30, json={
            "signature_name": "classification",
            "examples": [{"image/encoded": {"b64": base64.b64encode(images[0]).decode()}}]})
        assert classify.status_code == 200, classify.text
        top = max(classify.json()["results"][0], key=lambda pair: pair[1])
        assert top[0] == want[0]

        # Not an image, and not base64: 400 with the reason, and the server keeps serving.
        bad = requests.post(url, json={"instances": [{"b64": base64.b64encode(b"not an image").decode()}]}, timeout=30)
        assert bad.status_code == 400 and "Unknown image file format" in bad.json()["error"], bad.text
        bad = requests.post(url, json={"instances": [{"b64": "%%%"}]}, timeout=30)
        assert bad.status_code == 400
        again = requests.post(url, json={"instances": [{"b64": base64.b64encode(images[0]).decode()}]}, timeout=30)
        assert again.status_code == 200 and again.json()["predictions"][0]["classes"] == want[0]

        for target in (f"grpc://127.0.0.1:{grpc_port}",):  # REST image payloads: the digits run's load test
            res = run_cli("loadtest", "--target", target, "--model", "digits", "--data", digits["data"],
                          "--users", "2", "--duration", "2s", "--warmup", "0s", "--max-requests", "300",
                          "--out", str(base.parent / f"load-{target.split(':')[0]}"))
            assert res.returncode == 0, res.stdout + res.stderr
            results = _json(base.parent / f"load-{target.split(':')[0]}" / "results.json")
            step = results["steps"][0]
            assert step["requests"] > 0 and step["errors"] == 0, step
    finally:
        proc.terminate()
        proc.wait(timeout=60)


@pytest.mark.long
@DIGITS
def test_image_training_resumes_after_sigkill(digits, tmp_path):
    out = tmp_path / "train"
    args = ["train", "--data", digits["data"], "--out", str(out), "--filters", "8", "--augment", "flip,crop,rotation",
            "--batch-size", "128", "--seed", "5"]
    proc = spawn_cli(*args, "--epochs", "1000", "--patience", "1000", stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
    killed_at = kill_after_epochs(proc, out, 2)
    assert killed_at >= 2 and not out.exists()
    res = run_cli(*args, "--epochs", str(killed_at + 1), "--patience", "100")
    assert res.returncode == 0, res.stderr
    assert f"resuming from the backup of epoch {killed_at}" in res.stdout
    t = _json(out / "train.json")
    assert t["resumed_from_epoch"] == killed_at
    assert [json.loads(line)["epoch"] for line in open(out / "metrics.jsonl")] == list(range(1, killed_at + 2))


@pytest.mark.long
@DIGITS
def test_a_keras_applications_model_needs_32_pixels(digits, tmp_path):
    res = run_cli("train", "--data", digits["data"], "--out", str(tmp_path / "t"), "--model", "mobilenet_v3_small")
    assert res.returncode == 2 and "needs images of at least 32x32" in res.stderr and "--image-size" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


# ---- the pure pieces ---------------------------------------------------------------------------

CPUINFO = """processor\t: 0
model name\t: Some CPU @ 2.0GHz
flags\t\t: fpu sse2 avx2 fma avx512f avx512_bf16 amx_tile
processor\t: 1
model name\t: Some CPU @ 2.0GHz
flags\t\t: fpu sse2 avx2 fma avx512f avx512_bf16 amx_tile
"""


@pytest.mark.parametrize("text, model, features", [
    (CPUINFO, "Some CPU @ 2.0GHz", ["avx2", "fma", "avx512f", "avx512_bf16", "amx_tile"]),
    ("model name\t: Old\nflags\t: sse2 avx2\n", "Old", ["avx2"]),
    ("processor\t: 0\n", None, []),
], ids=["avx512-bf16", "avx2-only", "no-flags"])
def test_cpu_features_read_from_cpuinfo(tmp_path, text, model, features):
    (tmp_path / "cpuinfo").write_text(text)
    assert cpu_features(str(tmp_path / "cpuinfo")) == {"model": model, "features": features}
    assert cpu_features(str(tmp_path / "missing")) == {"model": None, "features": []}


STATS = {"height": {"quantiles": [10, 20, 30, 40, 50]}, "width": {"quantiles": [5, 6, 7, 8, 9]}}


@pytest.mark.parametrize("requested, resize, model, expected", [
    (None, None, "cnn", (30, 7)),  # the median training image
    (None, (64, 48), "cnn", (64, 48)),  # what the data stage resized to
    ((96, 96), (64, 48), "resnet50", (96, 96)),  # asked for
    (None, None, "mobilenet_v3_small", "needs images of at least 32x32"),
    ((16, 64), None, "efficientnet_v2_b0", "needs images of at least 32x32"),
])
def test_image_size_comes_from_the_flag_the_resize_or_the_median(requested, resize, model, expected):
    from tfpipe.train.errors import TrainError
    from tfpipe.train.images import image_size

    schema = ImageSchema({}, ImageLabel("image/class/label", ["a", "b"]), resize)
    if isinstance(expected, str):
        with pytest.raises(TrainError, match=expected):
            image_size(requested, schema, STATS, model)
    else:
        assert image_size(requested, schema, STATS, model) == expected


@pytest.mark.parametrize("given, kept, error", [
    ("flip,crop", ["flip", "crop"], None),
    (" rotation , flip ", ["rotation", "flip"], None),
    ("none", [], None),
    ("", [], None),
    ("flip,blur", None, "unknown augmentation 'blur'"),
])
def test_augment_option(given, kept, error):
    if error:
        with pytest.raises(ValueError, match=error):
            TrainConfig(augment=given)
    else:
        assert TrainConfig(augment=given).augmentations == kept


@pytest.mark.parametrize("row, expected", [
    ({"image_bytes": b"\x89PNG"}, {"image_bytes": {"b64": "iVBORw=="}}),
    ({"x": 1.5, "s": "text"}, {"x": 1.5, "s": "text"}),
])
def test_rest_instances_carry_bytes_as_b64(row, expected):
    assert json_row(row) == expected


def test_decoding_is_the_same_for_training_and_serving():
    """The trainer's pipeline and the bytes signature call one function: a PNG, the same pixels
    as a lossless BMP, and a GIF of them decode to the same uint8 array, resized the same way."""
    import tensorflow as tf

    from tfpipe.train.images import decode_batch, decode_pixels

    pixels = (np.arange(12 * 10 * 3) % 256).astype(np.uint8).reshape(12, 10, 3)
    encoded = []
    for fmt in ("PNG", "BMP"):
        out = io.BytesIO()
        Image.fromarray(pixels).save(out, format=fmt)
        encoded.append(out.getvalue())
    one = decode_pixels(tf.constant(encoded[0]), (12, 10)).numpy()
    np.testing.assert_array_equal(one, pixels)  # same size: decoded as it is
    batch = decode_batch(tf.constant(encoded), (6, 5)).numpy()
    assert batch.shape == (2, 6, 5, 3) and batch.dtype == np.uint8
    np.testing.assert_array_equal(batch[0], batch[1])


@pytest.mark.long
@DIGITS
def test_the_digits_demo_runs_end_to_end_and_its_report_shows_predictions(digits):
    out, workdir = digits["stdout"], Path(digits["workdir"])
    assert "1,797 images -> train" in out and "REST and gRPC answers match the SavedModel" in out
    steps = _json(workdir / "manifest.json")["steps"]
    assert all(s["status"] == "done" for s in steps.values()) and len(steps) == 7
    assert steps["skew"]["summary"] == "skipped: image data (skew compares tabular features)"
    report = (workdir / "report.html").read_text()
    assert "Sample test images" in report and report.count('src="data:image/png;base64,') == 24
    assert "Images per class" in report
    load = _json(workdir / "loadtest" / "results.json")
    assert load["steps"][0]["requests"] > 0 and load["steps"][0]["errors"] == 0

    again = spawn_cli("run", "--config", digits["config"], "--workdir", str(workdir),
                      env=_env(Path(digits["config"]).parent))
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, out + err
    assert out.count("cached") == 7, out  # the image listing's fingerprint is stable
    show = run_cli("show", "--workdir", str(workdir))
    assert show.returncode == 0 and "sklearn://digits (written to" in show.stdout, show.stdout + show.stderr


@pytest.mark.long
def test_a_model_with_augmentation_exports_and_converts(tmp_path):
    """The served and converted model leave out the random layers (Keras's draw random numbers
    at inference too, which TFLite cannot run) and answer as the trained model does."""
    import keras
    import tensorflow as tf

    from tfpipe.export.images import ImageServingModule, convert_images
    from tfpipe.export.tflite import litert_runner
    from tfpipe.train.images import build_image_model

    model = build_image_model((16, 16), ["a", "b"], {}, model="cnn", filters=[4], dropout=0.3,
                              augment=["flip", "crop", "rotation"], seed=0)
    pixels = np.random.default_rng(0).integers(0, 256, (3, 16, 16, 3), dtype=np.uint8)
    model.save(tmp_path / "model.keras")
    model = keras.models.load_model(tmp_path / "model.keras")
    module = ImageServingModule(model, ["a", "b"])
    tf.saved_model.save(module, str(tmp_path / "sm"), signatures=module.signatures())
    served = tf.saved_model.load(str(tmp_path / "sm")).signatures["predict_pixels"](pixels=tf.constant(pixels))
    expected = np.asarray(model(pixels, training=False))
    np.testing.assert_allclose(served["probabilities"].numpy(), expected, atol=1e-6)
    one, _ = litert_runner(convert_images(model, ["float32"], pixels)["float32"])
    np.testing.assert_allclose(one({"pixels": pixels[:1]}), expected[:1], atol=1e-5)


def test_the_inference_model_leaves_out_exactly_the_augmentation_layers():
    """The contract export relies on for images: every layer --augment adds, and no other, is dropped."""
    import keras

    from tfpipe.train.images import build_image_model, inference_model, is_augmentation

    model = build_image_model((16, 16), ["a", "b"], {}, model="cnn", filters=[4], dropout=0.3,
                              augment=["flip", "crop", "rotation"], seed=0)
    randoms = (keras.layers.RandomFlip, keras.layers.RandomZoom, keras.layers.RandomRotation)
    kept = [layer.name for layer in inference_model(model).layers if not isinstance(layer, keras.layers.InputLayer)]
    trained = [layer.name for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]
    assert sorted(set(trained) - set(kept)) == sorted(layer.name for layer in model.layers
                                                      if isinstance(layer, randoms))
    assert len(set(trained) - set(kept)) == 3 and not any(is_augmentation(model.get_layer(n)) for n in kept)


@pytest.mark.long
@DIGITS
def test_predict_scores_an_image_folder_as_the_served_model_does(digits, tmp_path):
    """tfpipe predict on a folder of class folders of images (with a truncated PNG and a text file
    among them, which are dead-lettered with their reasons): every file is predicted or
    dead-lettered, and the classes and probabilities are the SavedModel's serving_default's."""
    import pandas as pd
    import tensorflow as tf

    encoded, labels = _test_images(digits["data"])
    folder = tmp_path / "new"
    for i, (png, label) in enumerate(zip(encoded[:40], labels[:40])):
        (folder / str(label)).mkdir(parents=True, exist_ok=True)
        (folder / str(label) / f"{i:03d}.png").write_bytes(png)
    (folder / "cut.png").write_bytes(encoded[0][: len(encoded[0]) // 2])
    (folder / "notes.txt").write_text("not an image")
    res = run_cli("predict", "--workdir", digits["workdir"], "--input", str(folder), "--out", str(tmp_path / "o"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "42 images read -> 40 predicted, 2 dead-lettered" in res.stdout, res.stdout
    dead = [json.loads(line) for line in (tmp_path / "o" / "deadletter").glob("*.jsonl")
            for line in line.read_text().splitlines()]
    assert sorted(d["source"] for d in dead) == ["cut.png", "notes.txt"]
    assert any("truncated png" in d["reason"] for d in dead) and any("unsupported format" in d["reason"] for d in dead)
    got = pd.read_parquet(tmp_path / "o" / "predictions").sort_values("path")
    assert list(got.columns[:2]) == ["path", "label"]
    model = tf.saved_model.load(os.path.join(digits["base"], "digits", "1"))
    images = [(folder / p).read_bytes() for p in got["path"]]
    local = model.signatures["serving_default"](image_bytes=tf.constant(images))
    assert got["prediction"].tolist() == [c.decode() for c in local["classes"].numpy()]
    probabilities = got[[f"probability_{c}" for c in range(10)]].to_numpy()
    np.testing.assert_allclose(probabilities, local["probabilities"].numpy(), rtol=0, atol=1e-6)
    assert (got["label"] == got["path"].str.split("/").str[0]).all()
