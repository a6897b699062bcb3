"""Image models: the input pipeline and the Keras models for labelled images.

One function turns an encoded image into the model's pixels, `decode_pixels`: decode (JPEG, PNG,
BMP or the first frame of a GIF, as RGB), resize to the model's size, round to uint8. The
trainer's tf.data pipeline maps it over the records; the exported SavedModel's bytes
signature calls the same function, so a served image is the pixels training saw.

The saved model takes those uint8 pixels, [batch, height, width, 3]. Inside it:
  augmentation (training only) -> rescale to [0, 1] and normalise with the training split's
  per-channel mean and std (stats.json) -> the network -> softmax over the classes.
Augmentation is a layer of the model, so it runs where the model runs (on the accelerator
when there is one) and not in the input pipeline; at inference it passes pixels through.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf
from keras import layers

from tfpipe.train.config import AUGMENTATIONS
from tfpipe.train.errors import TrainError

AUTOTUNE = tf.data.AUTOTUNE
MODELS = ("cnn", "mobilenet_v3_small", "efficientnet_v2_b0", "resnet50")
APPLICATIONS_MIN_SIZE = 32  # keras.applications networks downsample 32x
AUGMENT_PREFIX = "augment_"  # the names of the augmentation layers: see is_augmentation


def decode_pixels(encoded: tf.Tensor, size: tuple[int, int]) -> tf.Tensor:
    """One encoded image (a scalar string) -> uint8 [height, width, 3]."""
    image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
    image.set_shape([None, None, 3])
    resized = tf.image.resize(image, size, method="bilinear", antialias=True)
    return tf.cast(tf.clip_by_value(tf.round(resized), 0.0, 255.0), tf.uint8)


def decode_batch(encoded: tf.Tensor, size: tuple[int, int]) -> tf.Tensor:
    """A batch of encoded images (a string vector) -> uint8 [batch, height, width, 3]."""
    return tf.map_fn(lambda e: decode_pixels(e, size), encoded,
                     fn_output_signature=tf.TensorSpec([size[0], size[1], 3], tf.uint8))


def image_size(requested: tuple[int, int] | None, schema, train_stats: dict[str, Any], model: str) -> tuple[int, int]:
    """The model's input size: the one asked for, else what the data stage resized to, else the
    median height and width of the training images (at least 32x32 for keras.applications)."""
    if requested:
        size = tuple(requested)
    elif schema.resize:
        size = tuple(schema.resize)
    else:
        mid = len(train_stats["height"]["quantiles"]) // 2
        size = (int(round(train_stats["height"]["quantiles"][mid])), int(round(train_stats["width"]["quantiles"][mid])))
    if model != "cnn" and min(size) < APPLICATIONS_MIN_SIZE:
        raise TrainError(f"--model {model} needs images of at least {APPLICATIONS_MIN_SIZE}x{APPLICATIONS_MIN_SIZE}; "
                         f"the input size is {size[0]}x{size[1]}: pass --image-size, e.g. 64x64")
    return size


def image_dataset(files: list[str], size: tuple[int, int], batch_size: int, *, shuffle: bool, seed: int,
                  shuffle_buffer: int = 10000, deterministic: bool, shard: tuple[int, int] | None = None,
                  cache: bool = False) -> tf.data.Dataset:
    """Batches of (uint8 pixels, class id): records read in parallel, decoded and resized in
    parallel, cached in memory after the first pass when `cache`, shuffled, batched, prefetched."""
    if shard is not None:
        n, i = shard
        files = files[i::n]
        if not files:
            raise TrainError(f"worker {i} of {n} has no files to read: rerun tfpipe data with --shards {n} or more")
    spec = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
            "image/class/label": tf.io.FixedLenFeature([], tf.int64)}
    options = tf.data.Options()
    options.deterministic = deterministic
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF

    def decode(record):
        parsed = tf.io.parse_single_example(record, spec)
        return decode_pixels(parsed["image/encoded"], size), parsed["image/class/label"]

    ds = tf.data.Dataset.from_tensor_slices(files)
    if shuffle:
        ds = ds.shuffle(len(files), seed=seed)
    ds = ds.interleave(lambda f: tf.data.TFRecordDataset(f, compression_type="GZIP"),
                       cycle_length=max(1, min(len(files), 8)), num_parallel_calls=AUTOTUNE,
                       deterministic=deterministic)
    if shuffle and not cache:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)  # records: cheap to hold
    ds = ds.map(decode, num_parallel_calls=AUTOTUNE, deterministic=deterministic)
    if cache:
        ds = ds.cache()
        if shuffle:
            ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    return ds.batch(batch_size).prefetch(AUTOTUNE).with_options(options)


def is_augmentation(layer: layers.Layer) -> bool:
    """A layer `augmentation` made (so named): active in training only, left out of what is served."""
    return layer.name.startswith(AUGMENT_PREFIX)


def augmentation(names: list[str], seed: int) -> list[layers.Layer]:
    """Random layers, active only in training: flip (left-right), crop (a random 80-100% of each
    side, resized back) and rotation (up to +-10% of a turn, 36 degrees)."""
    out = []
    for name in names:
        if name == "flip":
            out.append(layers.RandomFlip("horizontal", seed=seed, dtype="float32", name=AUGMENT_PREFIX + "flip"))
        elif name == "crop":
            out.append(layers.RandomZoom((-0.2, 0.0), fill_mode="nearest", seed=seed + 1, dtype="float32",
                                         name=AUGMENT_PREFIX + "crop"))
        elif name == "rotation":
            out.append(layers.RandomRotation(0.1, fill_mode="nearest", seed=seed + 2, dtype="float32",
                                             name=AUGMENT_PREFIX + "rotation"))
        else:
            raise TrainError(f"unknown augmentation '{name}'; choose from {', '.join(AUGMENTATIONS)}")
    return out


def _cnn(x, filters: list[int], dropout: float, seed: int):
    """Blocks of two 3x3 convolutions with batch normalisation, each halving the size while it is
    above 2 pixels, then global average pooling."""
    for b, width in enumerate(filters):
        for c in range(2):
            x = layers.Conv2D(width, 3, padding="same", use_bias=False, name=f"block{b}_conv{c}",
                              kernel_initializer=keras.initializers.HeNormal(seed=seed + 10 * b + c))(x)
            x = layers.BatchNormalization(name=f"block{b}_bn{c}")(x)
            x = layers.ReLU(name=f"block{b}_relu{c}")(x)
        if min(x.shape[1], x.shape[2]) > 2:
            x = layers.MaxPooling2D(2, name=f"block{b}_pool")(x)
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    if dropout:
        x = layers.Dropout(dropout, seed=seed + 100, name="dropout")(x)
    return x


def _application(name: str, x, seed: int):
    """A keras.applications network without its head, built with weights=None (no download)."""
    apps = keras.applications
    shape = tuple(x.shape[1:])
    keras.utils.set_random_seed(seed)
    if name == "mobilenet_v3_small":
        net = apps.MobileNetV3Small(input_shape=shape, include_top=False, weights=None, pooling="avg",
                                    include_preprocessing=False)
    elif name == "efficientnet_v2_b0":
        net = apps.EfficientNetV2B0(input_shape=shape, include_top=False, weights=None, pooling="avg",
                                    include_preprocessing=False)
    elif name == "resnet50":
        net = apps.ResNet50(input_shape=shape, include_top=False, weights=None, pooling="avg")
    else:
        raise TrainError(f"unknown model '{name}'; choose from {', '.join(MODELS)}")
    return net(x)


def build_image_model(size: tuple[int, int], classes: list[str], train_stats: dict[str, Any], *, model: str,
                      filters: list[int], dropout: float, augment: list[str], seed: int) -> keras.Model:
    """uint8 pixels -> class probabilities, normalisation and augmentation inside."""
    channels = train_stats.get("channels") or {}
    mean = np.array(channels.get("mean") or [0.5] * 3, dtype=np.float32)
    std = np.maximum(np.array(channels.get("std") or [0.25] * 3, dtype=np.float32), 1e-3)
    pixels = keras.Input(shape=(*size, 3), dtype="uint8", name="pixels")
    x = layers.Rescaling(1.0 / 255.0, dtype="float32", name="rescale")(pixels)  # uint8 -> [0, 1]
    for layer in augmentation(augment, seed):
        x = layer(x)
    x = layers.Normalization(mean=mean.tolist(), variance=np.square(std).tolist(), name="normalize")(x)
    x = _cnn(x, filters, dropout, seed) if model == "cnn" else _application(model, x, seed)
    out = layers.Dense(len(classes), activation="softmax", dtype="float32", name="head",
                       kernel_initializer=keras.initializers.GlorotUniform(seed=seed + 1000))(x)
    return keras.Model(pixels, out, name=f"tfpipe_image_{model}")


def inference_model(model: keras.Model) -> keras.Model:
    """The same model without its augmentation layers, sharing every weight: what is served and
    converted. Keras's random layers still draw random numbers at inference (and TFLite has no
    op for that), though they return the image unchanged. The top level of an image model is a
    chain of layers, so it is rebuilt by calling the other layers in order."""
    x = pixels = keras.Input(shape=model.input.shape[1:], dtype=model.input.dtype, name="pixels")
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer) or is_augmentation(layer):
            continue
        x = layer(x)
    return keras.Model(pixels, x, name=model.name)
