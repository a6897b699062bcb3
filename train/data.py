"""tf.data input: shard files -> parallel interleave of gzip TFRecords -> shuffle -> batch ->
parse the whole batch -> prefetch. Parsing specs come from schema.json and nowhere else."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tfpipe.pipeline.schema import Schema
from tfpipe.train.errors import TrainError

AUTOTUNE = tf.data.AUTOTUNE


def parse_spec(schema: Schema) -> dict[str, Any]:
    """Feature specs for tf.io.parse_example. A missing value is an absent feature: floats
    default to NaN, strings to "", and ints are parsed ragged so absence stays visible."""
    spec: dict[str, Any] = {}
    for c in schema.features:
        if c.type == "float":
            spec[c.name] = tf.io.FixedLenFeature([], tf.float32, default_value=float("nan"))
        elif c.type == "int":
            spec[c.name] = tf.io.RaggedFeature(tf.int64)
        else:
            spec[c.name] = tf.io.FixedLenFeature([], tf.string, default_value="")
    label = schema.label
    spec[label.name] = tf.io.FixedLenFeature([], {"int": tf.int64, "float": tf.float32, "string": tf.string}[label.type])
    return spec


def raw_inputs(parsed: dict[str, Any], schema: Schema) -> dict[str, tf.Tensor]:
    """The model's raw inputs from a parsed batch: ints as float64 with NaN where missing
    (exact up to 2**53), floats as float32 with NaN, strings as they are."""
    out = {}
    for c in schema.features:
        value = parsed[c.name]
        if c.type == "int" and isinstance(value, tf.RaggedTensor):  # a parsed batch
            dense = tf.cast(value.to_tensor(default_value=0, shape=[None, 1])[:, 0], tf.float64)
            present = value.row_lengths() > 0
            out[c.name] = tf.where(present, dense, tf.constant(float("nan"), tf.float64))
        elif c.type == "int":  # one parsed example: 0 or 1 values
            first = tf.cast(tf.concat([value, tf.zeros([1], tf.int64)], 0)[0], tf.float64)
            out[c.name] = tf.where(tf.size(value) > 0, first, tf.constant(float("nan"), tf.float64))
        else:
            out[c.name] = value
    return out


def label_encoder(schema: Schema, scale=None):
    """Maps raw label values to what the loss expects: class index or float target; with
    `scale` (train.losses.LabelScale: mean, std, log), a regression target in standard units, of
    log(1 + y) when `log`, as the trainer learns it."""
    label = schema.label
    if label.task == "regression":
        if scale is None:
            return lambda y: tf.cast(y, tf.float32)

        def encode(y):
            y = tf.cast(y, tf.float64)
            if scale.log:
                y = tf.math.log1p(tf.maximum(y, 0.0))
            return tf.cast((y - scale.mean) / scale.std, tf.float32)
        return encode
    keys = tf.constant(label.classes, dtype=tf.string if label.type == "string" else tf.int64)
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(keys, tf.range(len(label.classes), dtype=tf.int64)), default_value=-1)
    return table.lookup


def make_dataset(
    files: list[str],
    schema: Schema,
    batch_size: int,
    *,
    shuffle: bool,
    seed: int,
    shuffle_buffer: int = 10000,
    deterministic: bool,
    shard: tuple[int, int] | None = None,
    preprocess=None,
    cache: bool = False,
    label_scale=None,
) -> tf.data.Dataset:
    """Batches of (inputs, label). `shard=(n, i)` keeps every n-th file from the i-th, so each
    worker of a multi-worker run reads its own files; `preprocess` maps raw inputs to features.
    `cache` keeps the preprocessed examples in memory after the first pass, so later epochs
    only shuffle and batch (for data that fits). `label_scale` (train.losses.LabelScale) gives a
    regression's labels in standard units (the trainer's); without it, in their own units."""
    if shard is not None:
        n, i = shard
        files = files[i::n]
        if not files:
            raise TrainError(f"worker {i} of {n} has no files to read: rerun tfpipe data with --shards {n} or more")
    spec = parse_spec(schema)
    encode_label = label_encoder(schema, label_scale)
    label = schema.label.name
    options = tf.data.Options()
    options.deterministic = deterministic
    # Files are sharded by hand above (or not at all); tf.distribute must not shard again.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF

    ds = tf.data.Dataset.from_tensor_slices(files)
    if shuffle:
        ds = ds.shuffle(len(files), seed=seed)
    ds = ds.interleave(
        lambda f: tf.data.TFRecordDataset(f, compression_type="GZIP"),
        cycle_length=max(1, min(len(files), 8)), num_parallel_calls=AUTOTUNE, deterministic=deterministic)
    if shuffle and not cache:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)

    def split(parsed):
        return raw_inputs(parsed, schema), encode_label(parsed[label])

    # a whole batch parsed at once, not one example at a time: several times the examples/s
    # (benchmarks/bench_train.py measures the input pipeline)
    ds = ds.batch(batch_size).map(lambda b: split(tf.io.parse_example(b, spec)), num_parallel_calls=AUTOTUNE)
    if preprocess is not None:
        ds = ds.map(lambda x, y: (preprocess(x), y), num_parallel_calls=AUTOTUNE)
    if cache:
        ds = ds.unbatch().cache()
        if shuffle:
            ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
        ds = ds.batch(batch_size)
    return ds.prefetch(AUTOTUNE).with_options(options)
