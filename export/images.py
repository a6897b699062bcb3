"""Exporting an image model: SavedModel signatures, warmup records, the reload check and the
TFLite variants.

Signatures (each answers `probabilities`, `classes` and `class_ids`):
  serving_default  `image_bytes`: encoded JPEG/PNG/BMP/GIF strings, a batch of them ({"b64": ...}
                   over REST, a DT_STRING tensor over gRPC, as TF Serving's ResNet example sends);
                   decoded and resized by the function training used (train.images.decode_pixels)
  predict_pixels   `pixels`: uint8 [batch, height, width, 3], already decoded and resized
  classification   `inputs`: serialized tf.train.Examples with `image/encoded`, for the Classify
                   and MultiInference APIs (`classes` and `scores`)

The TFLite variants take the uint8 pixels: a device app decodes the image itself.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tfpipe.files import write_json
from tfpipe.export.errors import ExportError
from tfpipe.prediction_logs import WARMUP_FILE
from tfpipe.train.images import decode_batch, inference_model

BYTES_INPUT, PIXELS_INPUT = "image_bytes", "pixels"
MEASURED_IMAGES = 2000  # test images the reload check and the variants are measured on (memory: decoded pixels)
CHUNK = 256  # images per call when a whole split is predicted
SIGNATURES = ("serving_default", "predict_pixels", "classification")


class ImageServingModule(tf.Module):
    def __init__(self, model: keras.Model, classes: list[str]):
        super().__init__()
        self.model = inference_model(model)  # without the augmentation layers
        self._classes = tf.constant(classes)
        height, width = model.input.shape[1:3]
        self.size = (int(height), int(width))
        self.serve_bytes = tf.function(self._serve_bytes,
                                       input_signature=[tf.TensorSpec([None], tf.string, name=BYTES_INPUT)])
        self.serve_pixels = tf.function(
            self._serve_pixels, input_signature=[tf.TensorSpec([None, *self.size, 3], tf.uint8, name=PIXELS_INPUT)])
        self.serve_inputs = tf.function(self._classify, input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])

    def signatures(self) -> dict:
        return {"serving_default": self.serve_bytes.get_concrete_function(),
                "predict_pixels": self.serve_pixels.get_concrete_function(),
                "classification": self.serve_inputs.get_concrete_function()}

    @staticmethod
    def method_names() -> dict[str, str]:
        return {"classification": "tensorflow/serving/classify"}

    def _serve_bytes(self, image_bytes):
        return self._serve_pixels(decode_batch(image_bytes, self.size))

    def _serve_pixels(self, pixels):
        probabilities = tf.cast(self.model(pixels, training=False), tf.float32)
        class_ids = tf.argmax(probabilities, axis=-1)
        return {"probabilities": probabilities, "class_ids": class_ids, "classes": tf.gather(self._classes, class_ids)}

    def _classify(self, inputs):
        parsed = tf.io.parse_example(inputs, {"image/encoded": tf.io.FixedLenFeature([], tf.string)})
        scores = self._serve_bytes(parsed["image/encoded"])["probabilities"]
        return {"classes": tf.tile(self._classes[tf.newaxis, :], [tf.shape(scores)[0], 1]), "scores": scores}


def split_images(data, split: str, limit: int = 100000, formats: list[str] | None = None
                 ) -> tuple[list[bytes], np.ndarray]:
    """The encoded images and class ids of a split, in file order (their formats appended to
    `formats` when given)."""
    encoded, labels = [], []
    for record in tf.data.TFRecordDataset(data.files(split), compression_type="GZIP").take(limit):
        feature = tf.train.Example.FromString(record.numpy()).features.feature
        encoded.append(feature["image/encoded"].bytes_list.value[0])
        labels.append(feature["image/class/label"].int64_list.value[0])
        if formats is not None:
            formats.append(feature["image/format"].bytes_list.value[0].decode())
    return encoded, np.array(labels, dtype=np.int64)


def export_images(tmp: str, model: keras.Model, data, config, log) -> dict[str, Any]:
    """Write the SavedModel into `tmp` and everything beside it; returns what export.json records."""
    from tfpipe.export.baseline import test_record
    from tfpipe.export.signatures import finish_signatures

    module = ImageServingModule(model, data.schema.label.classes)
    tf.saved_model.save(module, tmp, signatures=module.signatures())
    finish_signatures(tmp, module.method_names(), {})
    warm = write_warmup(tmp, config, data)
    split = "test" if data.count("test") else "eval"
    formats: list[str] = []
    encoded, labels = split_images(data, split, MEASURED_IMAGES, formats)
    pixels = np.concatenate([decode_batch(tf.constant(encoded[i:i + CHUNK]), module.size).numpy()
                             for i in range(0, len(encoded), CHUNK)])
    loaded = tf.saved_model.load(tmp)
    check = check_reload(loaded, model, encoded, pixels, split, config.tolerance)
    served = predict_all(loaded.signatures["serving_default"], encoded)
    test = test_record(data.schema.label, {"distribution": data.train_stats().get("classes", {})}, split, served,
                       labels, config.allow_weak, log)
    table = tflite_variants(tmp, loaded, model, data, encoded, pixels, labels, module.size, config, log) \
        if config.variants_for("multiclass") else []
    write_samples(tmp, loaded, data, split, encoded, labels, formats)
    return {"signatures": list(SIGNATURES), "warmup_records": warm, "reload_check": check, "test": test,
            "variants": table,
            "image": {"size": list(module.size), "classes": data.schema.label.classes,
                      "inputs": {"serving_default": BYTES_INPUT, "predict_pixels": PIXELS_INPUT}}}


def predict_all(fn, images, **kwargs) -> np.ndarray:
    """A signature's probabilities for many images (encoded bytes or pixels), CHUNK at a time."""
    key = BYTES_INPUT if isinstance(images, list) else PIXELS_INPUT
    return np.concatenate([fn(**{key: tf.constant(images[i:i + CHUNK])})["probabilities"].numpy()
                           for i in range(0, len(images), CHUNK)])


def write_samples(tmp: str, loaded, data, split: str, encoded: list[bytes], labels: np.ndarray, formats: list[str],
                  n: int = 24) -> None:
    """assets.extra/samples.json, for the run report: test images (inline as base64) with the class
    the SavedModel gives them; the misclassified ones first (up to a third), then images spread
    evenly over the split."""
    import base64

    if not encoded:
        return
    probabilities = predict_all(loaded.signatures["serving_default"], encoded)
    predicted = probabilities.argmax(axis=1)
    wrong = [int(i) for i in np.flatnonzero(predicted != labels)[: n // 3]]
    spread = [int(i) for i in np.linspace(0, len(encoded) - 1, min(n, len(encoded))).round() if int(i) not in wrong]
    classes = data.schema.label.classes
    images = []
    for i in (wrong + spread)[:n]:
        images.append({"index": i, "format": formats[i],
                       "b64": base64.b64encode(encoded[i]).decode(), "label": classes[int(labels[i])],
                       "predicted": classes[int(predicted[i])], "probability": round(float(probabilities[i].max()), 4)})
    write_json(os.path.join(tmp, "assets.extra", "samples.json"), {"split": split, "images": images})


def write_warmup(tmp: str, config, data) -> int:
    """assets.extra/tf_serving_warmup_requests: Predict requests, each with one real encoded image."""
    from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

    if not config.warmup_records:
        return 0
    split = "eval" if data.count("eval") else "train"
    encoded, _ = split_images(data, split, config.warmup_records)
    path = os.path.join(tmp, WARMUP_FILE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.io.TFRecordWriter(path) as writer:
        for image in encoded:
            request = predict_pb2.PredictRequest(
                model_spec=model_pb2.ModelSpec(name=config.name, signature_name="serving_default"))
            request.inputs[BYTES_INPUT].CopyFrom(tf.make_tensor_proto([image], dtype=tf.string))
            record = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(record.SerializeToString())
    return len(encoded)


def check_reload(loaded, model: keras.Model, encoded: list[bytes], pixels: np.ndarray, split: str,
                 tolerance: float) -> dict[str, Any]:
    """Both signatures of the SavedModel read back from disk must give the Keras model's answers."""
    expected = np.concatenate([np.asarray(model(pixels[i:i + CHUNK], training=False))
                               for i in range(0, len(pixels), CHUNK)])
    by_bytes = predict_all(loaded.signatures["serving_default"], encoded)
    by_pixels = predict_all(loaded.signatures["predict_pixels"], pixels)
    diff = max(float(np.max(np.abs(by_bytes - expected))), float(np.max(np.abs(by_pixels - expected))))
    if not diff <= tolerance:
        raise ExportError(f"the reloaded SavedModel differs from the Keras model by {diff:.3g} "
                          f"(> {tolerance:g}) on the {split} split; nothing was published")
    return {"split": split, "rows": len(encoded), "max_abs_diff": diff}


def convert_images(model: keras.Model, variants: list[str], calibration: np.ndarray) -> dict[str, bytes]:
    """TFLite variants of the pixel model (uint8 [1, H, W, 3] in, float32 probabilities out).
    int8 is full-integer: weights per output channel, activations calibrated on training
    images; the uint8 input stays uint8, only the probabilities come out as float."""
    from tfpipe.export.tflite import converter, strip_tensor_names

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        saved = os.path.join(tmp, "sm")
        inference_model(model).export(saved, verbose=False)
        for variant in variants:
            conv = converter(saved, variant)
            if variant == "int8":
                def representative():
                    for image in calibration:
                        yield [image[np.newaxis]]

                conv.representative_dataset = representative
            out[variant] = strip_tensor_names(conv.convert())
    return out


def tflite_variants(tmp: str, loaded, model: keras.Model, data, encoded: list[bytes], pixels: np.ndarray,
                    labels: np.ndarray, size: tuple[int, int], config, log) -> list[dict[str, Any]]:
    """Each TFLite variant measured beside the SavedModel on the same images: accuracy, size and
    single-image latency; a variant that loses more than --max-accuracy-drop fails the export
    (or is left out with --allow-drop)."""
    from tfpipe.export.tflite import litert_runner, measure, record_variants

    serve = loaded.signatures["serving_default"]
    saved = measure(lambda row: serve(**{BYTES_INPUT: tf.constant(row["encoded"])}),
                    lambda inputs: predict_all(serve, list(inputs["encoded"])),
                    {"encoded": np.array(encoded, dtype=object)}, labels, "multiclass")
    size_saved = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(tmp) for f in fs
                     if "assets.extra" not in r)
    table = [{"variant": "savedmodel", "bytes": size_saved, **saved, "drop": 0.0}]
    calibration, _ = split_images(data, "train", 200)
    converted = convert_images(model, config.variants_for("multiclass"), decode_batch(tf.constant(calibration), size).numpy())
    folder = os.path.join(tmp, "assets.extra", "tflite")
    os.makedirs(folder, exist_ok=True)

    def quality(blob: bytes) -> dict[str, Any]:
        one, every = litert_runner(blob)
        return measure(one, every, {PIXELS_INPUT: pixels}, labels, "multiclass")

    return record_variants(table, converted, quality, "accuracy", folder, config, log)
