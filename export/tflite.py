"""TFLite variants of the model, each measured with the LiteRT interpreter.

The boundary: string lookups cannot become builtin TFLite ops, so a device app turns each
string feature into its vocabulary index itself (vocabularies.json: index = position + 1,
0 for a value not in the list, exactly as the StringLookup layers do). Everything else
stays in the .tflite file: imputation of missing numbers (pass NaN), normalisation and
clipping (whose constants survive float16, see train.layers.ImputeNormalize), embeddings or
one-hot, the dense layers and the head. Numbers go in as float32.
"""

from __future__ import annotations

import os
import tempfile
import time
import warnings
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from keras import layers, ops

from tfpipe.export.baseline import PER_ROW, model_quality
from tfpipe.export.errors import ExportError
from tfpipe.export.signatures import finish_signatures
from tfpipe.pipeline.schema import Schema
from tfpipe.train.model import DENORMALIZE, TRAINER, feature_layers, input_dtype

VARIANTS = ("float32", "float16", "dynamic", "int8")
NUMERIC_BLOCK = "numeric_block"
# a regression trainer's last Dense and its reshape, in TFLite's tensor names (trainer_1/head_1/MatMul)
REGRESSION_HEAD = ("/head", "/prediction")


class NumericBlock(layers.Layer):
    """The ImputeNormalize layers of every numeric feature as one chain of vector ops.

    Per feature the chain is about ten ops; fifteen features made 135 ops in the TFLite file
    and a third of the int8 file's size. Here it is ~12 ops over a [batch, n] vector: each
    constant becomes a vector, padded with 1 (multiply) or 0 (subtract), which leaves
    every feature's arithmetic, and so its result, exactly as its own layer computes it.
    Output: the clipped z-scores of the features without quantile bins, then every bin
    column of those with them (ImputeNormalize's knots, from one gather of z), then the
    'was missing' flags of the nullable features; `columns(i)` says which are feature i's."""

    def __init__(self, norms: list, **kwargs):
        super().__init__(**kwargs)
        chains = [n.constants() for n in norms]

        def vectors(lists: list[list[float]], pad: float) -> list[np.ndarray]:
            return [np.array([c[i] if i < len(c) else pad for c in lists], dtype=np.float32)
                    for i in range(max(len(c) for c in lists))]

        self.steps = vectors([c[0] for c in chains], 1.0)
        self.terms = vectors([c[1] for c in chains], 0.0)
        self.factors = vectors([c[2] for c in chains], 1.0)
        # Per-feature bounds (a model saved before clipping existed has none).
        self.bound = (np.array([n.clip or np.inf for n in norms], dtype=np.float32)
                      if any(n.clip for n in norms) else None)
        self.flags = [i for i, n in enumerate(norms) if n.flag_missing]
        knots = [getattr(n, "knots", None) for n in norms]  # None in models saved before bins existed
        self.plain = [i for i, k in enumerate(knots) if not k]
        self.bin_feature = np.array([i for i, k in enumerate(knots) if k for _ in k[1:]], dtype=np.int32)
        bins = [n.bins() for n, k in zip(norms, knots) if k]
        self.bin_low = np.concatenate([b[0] for b in bins]) if bins else np.zeros(0, np.float32)
        self.bin_inverse = np.concatenate([b[1] for b in bins]) if bins else np.zeros(0, np.float32)
        self.width = len(self.plain) + len(self.bin_feature) + len(self.flags)
        # the features taken in log scale first (ImputeNormalize's log1p)
        self.logs = [bool(getattr(n, "log1p", False)) for n in norms]

    def call(self, columns):
        # log(1 + x) column by column, before the stack: a NaN (missing) stays NaN, the rest is
        # what ImputeNormalize computes; done on the stack, int8 conversion quantized the raw stack
        # for it (one scale for volumes of 1e9 and counts of 3)
        columns = [ops.cast(c, "float32") for c in columns]
        x = ops.stack([ops.log(1.0 + ops.maximum(c, 0.0)) if log else c for c, log in zip(columns, self.logs)],
                      axis=-1)
        missing = ops.isnan(x)
        z = x
        for step in self.steps:
            z = z * step
        for term in self.terms:
            z = z - term
        for factor in self.factors:
            z = z * factor
        z = ops.where(missing, 0.0, z)
        parts = []
        if self.plain:
            plain = z if len(self.plain) == len(self.logs) else ops.take(z, self.plain, axis=1)
            if self.bound is not None:
                bound = self.bound[self.plain]
                plain = ops.minimum(ops.maximum(plain, -bound), bound)
            parts.append(plain)
        if len(self.bin_feature):
            binned = ops.clip((ops.take(z, self.bin_feature, axis=1) - self.bin_low) * self.bin_inverse, 0.0, 1.0)
            parts.append(ops.where(ops.take(missing, self.bin_feature, axis=1), 0.0, binned))
        if self.flags:
            parts.append(ops.cast(ops.take(missing, self.flags, axis=1), "float32"))
        return ops.concatenate(parts, axis=-1) if len(parts) > 1 else parts[0]

    def columns(self, i: int) -> list[int]:
        """Feature i's output columns, in its own layer's order: its z or bins, then its flag."""
        if i in self.plain:
            own = [self.plain.index(i)]
        else:
            own = [len(self.plain) + int(j) for j in np.flatnonzero(self.bin_feature == i)]
        if i in self.flags:
            own.append(len(self.plain) + len(self.bin_feature) + self.flags.index(i))
        return own

    def compute_output_shape(self, input_shape):
        return (input_shape[0][0], self.width)


class OneHot(layers.Layer):
    """One-hot as rows of the identity matrix. TFLite's ONE_HOT op keeps its on/off
    values' int8 scale where its output has another, so in an int8 model 'off' read as
    other than 0 and 1; a gather from a constant table keeps the scale."""

    def __init__(self, depth: int, **kwargs):
        super().__init__(**kwargs)
        self.identity = np.eye(depth, dtype=np.float32)

    def call(self, index):
        return ops.take(self.identity, index, axis=0)

    def compute_output_shape(self, input_shape):
        return (*input_shape, len(self.identity))


class Reorder(layers.Layer):
    """Columns in a given order (one gather)."""

    def __init__(self, order: list[int], **kwargs):
        super().__init__(**kwargs)
        self.order = np.array(order, dtype=np.int32)

    def call(self, x):
        return ops.take(x, self.order, axis=1)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], len(self.order))


def device_model(model: keras.Model, schema: Schema) -> tuple[keras.Model, dict[str, list[str]]]:
    """The trained model from vocabulary indices and raw numbers, sharing the trained layers.
    The numbers go through one NumericBlock (the block export quantization keeps float)."""
    used = feature_layers(model, schema)
    names = schema.graph_names()  # inputs keyed by column, named in the graph by graph name
    inputs, vocabularies, others = {}, {}, []
    for c in schema.features:
        found = used.get(c.name)  # None: the model does not use it (no value in training)
        if c.type in ("int", "float"):
            inputs[c.name] = keras.Input(shape=(), dtype="float32", name=names[c.name])  # taken, used or not
            if found is not None and found.levels is not None:  # a few whole numbers: categories too
                others.append((c.name, found.level_embed(found.levels(inputs[c.name]))))
            continue
        if found is None:
            continue
        vocabularies[c.name] = [str(v) for v in found.lookup.get_vocabulary()[1:]]  # [0] is the OOV token
        x = inputs[c.name] = keras.Input(shape=(), dtype="int32", name=names[c.name])
        if found.embed is None:  # a one-hot lookup
            others.append((c.name, OneHot(found.lookup.vocabulary_size(), name=f"one_hot_{names[c.name]}")(x)))
        else:
            others.append((c.name, found.embed(x)))
    return _assembled(model, schema, used, inputs, others, "device_model"), vocabularies


def block_model(model: keras.Model, schema: Schema) -> keras.Model | None:
    """The trained model on the same raw inputs, every number's normalisation run as one
    NumericBlock (each column exactly its own layer's arithmetic) and each string through its
    trained lookup and embedding: what the SavedModel's signatures call. Per numeric column the
    trained model runs a chain of small ops, a table of hundreds of them as many chains a call.
    None when a feature takes another path (a date or a text column): the model serves as trained."""
    if any(c.kind in ("date", "text") for c in schema.features):
        return None
    used = feature_layers(model, schema)
    names = schema.graph_names()
    inputs = {c.name: keras.Input(shape=(), dtype=input_dtype(c.type), name=names[c.name]) for c in schema.features}
    others = []
    for c in schema.features:
        found = used.get(c.name)
        if found is None:
            continue
        if c.type in ("int", "float"):
            if found.levels is not None:  # a few whole numbers: categories too
                others.append((c.name, found.level_embed(found.levels(inputs[c.name]))))
            continue
        x = found.lookup(inputs[c.name])  # a one-hot lookup's output is the one-hot vector
        others.append((c.name, x if found.embed is None else found.embed(x)))
    return _assembled(model, schema, used, inputs, others, "block_model")


def _assembled(model: keras.Model, schema: Schema, used: dict, inputs: dict, others: list[tuple[str, Any]],
               name: str) -> keras.Model:
    """`model`'s trainer (and a regression's denormalisation) on [one NumericBlock of the numeric
    features the model uses (`used`: its feature_layers), then `others` (string features, and the
    levels of integer ones: name, tensor)], their columns moved into the order the trainer learned."""
    trainer = model.get_layer(TRAINER)
    numeric = [(c.name, used[c.name].norm) for c in schema.features
               if c.type in ("int", "float") and c.name in used]
    parts, position, width = [], {}, 0
    if numeric:
        block = NumericBlock([n for _, n in numeric], name=NUMERIC_BLOCK)
        parts.append(block([inputs[n] for n, _ in numeric]))
        for i, (n, _) in enumerate(numeric):
            position[n] = block.columns(i)
        width = block.width
    for n, tensor in others:  # after a number's own columns, its levels' embedding (the trained order)
        position[n] = position.get(n, []) + list(range(width, width + tensor.shape[-1]))
        width += tensor.shape[-1]
        parts.append(tensor)
    order = [i for c in schema.features for i in position.get(c.name, [])]
    features = layers.Concatenate(dtype="float32")(parts) if len(parts) > 1 else parts[0]
    if order != sorted(order):
        features = Reorder(order, name="trained_order")(features)
    out = trainer(features)
    if any(layer.name == DENORMALIZE for layer in model.layers):  # a regression: back to the label's units
        out = model.get_layer(DENORMALIZE)(out)
    return keras.Model(inputs, out, name=name)


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


def convert_all(lite_model: keras.Model, variants: list[str], representative: dict[str, np.ndarray],
                renames: dict[str, str] | None = None) -> dict[str, bytes]:
    """Convert through a SavedModel (the converter does not take Keras 3 models directly), whose
    serving signature takes the inputs by their columns' names (`renames`: graph name -> column).

    int8 is full-integer with two choices made from measurements on the Chicago taxi model:
    - The numeric block stays float (TFLite's selective quantization, through the public
      QuantizationDebugger): quantized, the stacked raw numbers share one int8 scale set by
      the largest (Unix timestamps, ~1.4e9), so every other number read as 0. Its output,
      quantile-bin columns in [0, 1], clipped z-scores and 0/1 flags, is quantized where it
      meets the strings' columns.
    - A regression's head and Denormalize stay float too: quantized, the prediction is held
      to the range the calibration rows reached, and the largest labels (the most expensive
      houses) were clamped to it, 100,000 under on a Texas housing table.
    - Dense weights get one scale per tensor, not per output channel: the per-channel
      scale and zero-point tables were 9 of 68 KB, and accuracy was the same.
    Tensor names (debug information) are stripped from every variant; the signature and
    its input and output names stay."""
    out = {}
    regression = any(layer.name == DENORMALIZE for layer in lite_model.layers)
    with tempfile.TemporaryDirectory() as tmp:
        saved = os.path.join(tmp, "sm")
        lite_model.export(saved, verbose=False)
        if renames:
            finish_signatures(saved, {}, renames)
        float_names: list[str] = []
        for variant in variants:
            conv = converter(saved, variant)
            if variant != "int8":
                blob = conv.convert()
                if variant == "float32":
                    float_names = _tensor_names(blob)
                out[variant] = strip_tensor_names(blob)
                continue
            if not float_names:
                float_names = _tensor_names(tf.lite.TFLiteConverter.from_saved_model(saved).convert())
            conv.representative_dataset = _calibration(representative)
            # One scale per weight tensor rather than per output channel: a smaller int8 model at the
            # same test accuracy, where the two were compared (the Chicago taxi model). The converter
            # has no public switch for it.
            conv._experimental_disable_per_channel = True
            keep_float = [n for n in float_names if NUMERIC_BLOCK in n or DENORMALIZE in n
                          or (regression and TRAINER in n and any(h in n for h in REGRESSION_HEAD))]
            with warnings.catch_warnings():  # it builds a tf.lite.Interpreter we never run (LiteRT does)
                warnings.filterwarnings("ignore", message=".*tf.lite.Interpreter is deprecated")
                debugger = tf.lite.experimental.QuantizationDebugger(
                    converter=conv, debug_dataset=_calibration(representative),
                    debug_options=tf.lite.experimental.QuantizationDebugOptions(denylisted_nodes=keep_float))
            out[variant] = strip_tensor_names(debugger.get_nondebug_quantized_model())
    return {v: out[v] for v in variants}


def converter(saved_model: str, variant: str) -> tf.lite.TFLiteConverter:
    """A converter for one variant: float32 as it is, float16 weights, or quantized (dynamic
    range; int8 once the caller gives it a representative dataset)."""
    conv = tf.lite.TFLiteConverter.from_saved_model(saved_model)
    if variant != "float32":
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
    if variant == "float16":
        conv.target_spec.supported_types = [tf.float16]
    return conv


def _tensor_names(blob: bytes) -> list[str]:
    from ai_edge_litert.interpreter import Interpreter

    return [t["name"] for t in Interpreter(model_content=blob).get_tensor_details()]


def strip_tensor_names(blob: bytes) -> bytes:
    """The model without the names of its inner tensors (TFLite's strip_strings, but the
    signature, which apps call by input and output name, is kept)."""
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model_from_bytearray(bytearray(blob))
    kept = {(s.subgraphIndex, m.tensorIndex) for s in model.signatureDefs or [] for m in [*s.inputs, *s.outputs]}
    for g, graph in enumerate(model.subgraphs):
        for t, tensor in enumerate(graph.tensors):
            if (g, t) not in kept:
                tensor.name = None
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


# int8 calibration rows from the train split: the activation ranges are what they reach, and a
# value beyond them is clamped, so a regression's largest labels need rows that reach them (200
# rows held the largest prices of a Texas housing table 100,000 under).
CALIBRATION_ROWS = 3000


def _calibration(inputs: dict[str, np.ndarray], rows: int = CALIBRATION_ROWS):
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
    quality = model_quality(pred, labels, task, per_row=True)
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


def drop_beyond_noise(saved: np.ndarray, variant: np.ndarray, task: str) -> float:
    """The one-sided p-value of "the variant is no worse than the SavedModel" on the same rows;
    a small value says its drop is beyond what the test split's size can tell apart from chance.

    Classification, McNemar's exact test: of the rows the two models disagree on, the variant
    gets b wrong and c right; with no real difference b is Binomial(b + c, 1/2).
    Regression, a paired t-test on the rows' squared errors (variant minus SavedModel)."""
    from scipy import stats

    if task != "regression":
        b = int(np.sum(saved & ~variant))
        c = int(np.sum(~saved & variant))
        return float(stats.binom.sf(b - 1, b + c, 0.5)) if b + c else 1.0
    d = np.asarray(variant, np.float64) - np.asarray(saved, np.float64)
    if len(d) < 2:
        return 1.0
    spread = float(np.std(d, ddof=1))
    if spread == 0.0:
        return 0.0 if d.mean() > 0 else 1.0
    return float(stats.t.sf(d.mean() / (spread / np.sqrt(len(d))), len(d) - 1))


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


def record_variants(table: list[dict[str, Any]], converted: dict[str, bytes], quality, metric: str, folder: str,
                    config, log) -> list[dict[str, Any]]:
    """Measure each converted variant (`quality(blob)`: its metric and latencies) against the
    SavedModel's row that starts `table`, write the ones kept into `folder`, print the table;
    a variant that loses more than --max-accuracy-drop (regression: whose RMSE rises more than
    --max-rmse-rise), beyond the test split's noise, is left out with a notice when the variants
    are tflite's default (auto) or with --allow-drop; named ones fail the export without it: the
    SavedModel is what a server serves, and a device build that was asked for must not go
    missing silently."""
    saved = table[0]
    per_row = saved.pop(PER_ROW)
    task = "regression" if metric == "rmse" else "classification"
    limit, flag = ((config.max_rmse_rise, "--max-rmse-rise") if task == "regression"
                   else (config.max_accuracy_drop, "--max-accuracy-drop"))
    failed, drop = [], config.allow_drop or config.tflite == "auto"
    for variant, blob in converted.items():
        row = {"variant": variant, "bytes": len(blob), **quality(blob)}
        if metric == "accuracy":
            row["drop"] = round(saved["accuracy"] - row["accuracy"], 6)
        else:
            row["drop"] = round((row["rmse"] - saved["rmse"]) / max(saved["rmse"], 1e-12), 6)
        row["p_value"] = round(drop_beyond_noise(per_row, row.pop(PER_ROW), task), 6)
        row["ratio_bytes_vs_float32"] = round(len(blob) / len(converted.get("float32", blob)), 4)
        # A drop counts when it is both over the limit and beyond the test split's sampling noise.
        if row["drop"] > limit and row["p_value"] < 1 - config.drop_confidence:
            failed.append(row)
            if drop:
                log(f"  dropping {variant}: {_drop_text(row, saved, metric)}, beyond {flag} {limit:g}; the "
                    "SavedModel and the other variants are published")
                table.append({**row, "dropped": True})
                continue
        with open(os.path.join(folder, f"{variant}.tflite"), "wb") as f:
            f.write(blob)
        table.append(row)
    for line in format_table(table, metric):
        log(line)
    if failed and not drop:
        names = "; ".join(f"{r['variant']}: {_drop_text(r, saved, metric)}" for r in failed)
        raise ExportError(f"TFLite variant(s) lose more {metric} than {flag} {limit:g} "
                          f"beyond the test split's noise at {config.drop_confidence:.0%} confidence ({names}); "
                          "nothing was published. To publish without them: --allow-drop (tfpipe export) or "
                          "--set export.allow_drop=true (tfpipe run)")
    return table


def _drop_text(row: dict[str, Any], saved: dict[str, Any], metric: str) -> str:
    """'accuracy 0.9500 -> 0.9000 (p=0.03)': both values, so the direction needs no sign."""
    rise = f", {row['drop']:+.1%} relative" if metric == "rmse" else ""
    return f"{metric} {saved[metric]:.4f} -> {row[metric]:.4f}{rise} (p={row['p_value']:.3g})"


def format_table(table: list[dict[str, Any]], metric: str) -> list[str]:
    # drop: accuracy lost, or the RMSE's relative rise; positive is worse either way
    lines = [f"  {'variant':11s} {'size':>10s} {metric:>9s} {'drop':>8s} {'p50 ms':>8s} {'p99 ms':>8s}"]
    for r in table:
        lines.append(f"  {r['variant']:11s} {r['bytes'] / 1024:>8.1f}KB {r[metric]:>9.4f} {r['drop']:>+8.4f} "
                     f"{r['latency_ms_p50']:>8.3f} {r['latency_ms_p99']:>8.3f}" + ("  dropped" if r.get("dropped") else ""))
    return lines
