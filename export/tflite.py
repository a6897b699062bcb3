"""TFLite variants of the model, each measured with the LiteRT interpreter.

The boundary: string lookups cannot become builtin TFLite ops, so a device app turns each
string feature into its vocabulary index itself (vocabularies.json: index = position + 1,
0 for a value not in the list, exactly as the StringLookup layers do). Everything else
stays in the .tflite file: imputation of missing numbers (pass NaN), normalisation (whose
constants survive float16, see train.model.ImputeNormalize), embeddings or one-hot, the dense layers and the
head. Numbers go in as float32.
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from keras import layers

from pipeline.schema import Schema

VARIANTS = ("float32", "float16", "dynamic", "int8")


def device_model(model: keras.Model, schema: Schema) -> tuple[keras.Model, dict[str, list[str]]]:
    """The trained model from vocabulary indices and raw numbers, sharing the trained layers."""
    pre, trainer = model.get_layer("preprocessor"), model.get_layer("trainer")
    inputs, parts, vocabularies = {}, [], {}
    for c in schema.features:
        if c.type in ("int", "float"):
            x = inputs[c.name] = keras.Input(shape=(), dtype="float32", name=c.name)
            parts.append(pre.get_layer(f"norm_{c.name}")(x))
            continue
        try:
            lookup = pre.get_layer(f"lookup_{c.name}")
        except ValueError:
            continue  # a string feature the model does not use (no vocabulary)
        vocabularies[c.name] = [str(v) for v in lookup.get_vocabulary()[1:]]  # [0] is the OOV token
        x = inputs[c.name] = keras.Input(shape=(), dtype="int32", name=c.name)
        if lookup.output_mode == "one_hot":
            parts.append(layers.CategoryEncoding(lookup.vocabulary_size(), output_mode="one_hot", dtype="float32")(x))
        else:
            parts.append(pre.get_layer(f"embed_{c.name}")(x))
    features = layers.Concatenate(dtype="float32")(parts) if len(parts) > 1 else parts[0]
    return keras.Model(inputs, trainer(features), name="device_model"), vocabularies


def device_inputs(raw: dict[str, np.ndarray], schema: Schema, vocabularies: dict[str, list[str]]) -> dict[str, np.ndarray]:
    """What a device app feeds the .tflite model, from raw feature values (NaN = missing)."""
    out = {}
    for c in schema.features:
        if c.type in ("int", "float"):
            out[c.name] = raw[c.name].astype(np.float32)
        elif c.name in vocabularies:
            index = {v: i + 1 for i, v in enumerate(vocabularies[c.name])}
            values = [v.decode() if isinstance(v, bytes) else str(v) for v in raw[c.name]]
            out[c.name] = np.array([index.get(v, 0) for v in values], dtype=np.int32)
    return out


def convert_all(lite_model: keras.Model, variants: list[str], representative: dict[str, np.ndarray]) -> dict[str, bytes]:
    """Convert through a SavedModel (the converter does not take Keras 3 models directly)."""
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        lite_model.export(os.path.join(tmp, "sm"), verbose=False)
        for variant in variants:
            conv = tf.lite.TFLiteConverter.from_saved_model(os.path.join(tmp, "sm"))
            if variant != "float32":
                conv.optimizations = [tf.lite.Optimize.DEFAULT]
            if variant == "float16":
                conv.target_spec.supported_types = [tf.float16]
            elif variant == "int8":
                conv.representative_dataset = _calibration(representative)
            out[variant] = conv.convert()
    return out


def _calibration(inputs: dict[str, np.ndarray], rows: int = 200):
    """int8 calibration rows from the train split. NaN (a missing number) is fed as the
    column's mean, so activation ranges stay finite; the model imputes it the same way."""
    n = len(next(iter(inputs.values())))
    means = {k: float(np.nanmean(v)) if v.dtype == np.float32 and not np.isnan(v).all() else 0.0
             for k, v in inputs.items()}

    def gen():
        for i in range(min(n, rows)):
            row = {}
            for k, v in inputs.items():
                x = v[i:i + 1]
                if x.dtype == np.float32 and np.isnan(x).any():
                    x = np.array([means[k]], dtype=np.float32)
                row[k] = x
            yield row

    return gen


def measure(predict_one, predict_all, inputs: dict[str, np.ndarray], labels: np.ndarray, task: str,
            latency_rows: int = 200) -> dict[str, Any]:
    """Quality on all rows and single-example latency (median and p99) on the first ones."""
    pred = predict_all(inputs)
    quality = _quality(pred, labels, task)
    n = len(labels)
    times = []
    for i in range(min(n, latency_rows) + 5):
        row = {k: v[i % n: i % n + 1] for k, v in inputs.items()}
        t0 = time.perf_counter()
        predict_one(row)
        if i >= 5:  # the first calls warm caches
            times.append(time.perf_counter() - t0)
    return {**quality, "latency_ms_p50": round(float(np.median(times)) * 1e3, 4),
            "latency_ms_p99": round(float(np.percentile(times, 99)) * 1e3, 4)}


def _quality(pred: np.ndarray, labels: np.ndarray, task: str) -> dict[str, float]:
    pred = np.asarray(pred).reshape(len(labels), -1)
    if task == "regression":
        return {"rmse": float(np.sqrt(np.mean((pred[:, 0] - labels) ** 2)))}
    classes = (pred[:, 0] >= 0.5).astype(np.int64) if task == "binary" else pred.argmax(axis=1)
    return {"accuracy": float(np.mean(classes == labels))}


def litert_runner(model_bytes: bytes):
    """(predict_one, predict_all) over the LiteRT interpreter's serving signature."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=model_bytes)
    runner = interpreter.get_signature_runner("serving_default")
    output = None

    def one(row):
        nonlocal output
        result = runner(**row)
        if output is None:
            output = next(iter(result))
        return result[output]

    def all_rows(inputs):
        n = len(next(iter(inputs.values())))
        return np.concatenate([one({k: v[i:i + 1] for k, v in inputs.items()}) for i in range(n)])

    return one, all_rows
