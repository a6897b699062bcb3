"""Benchmark the training stage's choices, as ratios measured in one run.

    python benchmarks/bench_train.py [--data DATA_DIR] [--steps 200]
    python benchmarks/bench_train.py --images 4000 [--image-size 64] [--models cnn,mobilenet_v3_small,resnet50]

Without --data it runs `tfpipe data` on examples/data/chicago_taxi/data.csv first. Prints:
  * input pipeline alone (examples/s) against the training step's consumption, and the
    measured input-wait fraction of a real `tfpipe train` run, with and without the
    in-memory feature cache;
  * batch-then-parse against parse-then-batch (input pipeline, examples/s);
  * XLA on against off, and float32 against mixed precision (training steps, examples/s,
    on a batch held in memory so only compute is timed), for the default model and for a
    wider one.
On a GPU machine the same script measures the GPU paths (mixed_float16 + XLA vs float32).

With --images N it generates N JPEGs of shapes on textures (bench_data.py's generator, at
--image-size pixels), runs `tfpipe data --format images` on them, and prints:
  * the CPU's model and instruction sets (AVX2, AVX-512, AVX-512 BF16, AMX), which decide
    what bfloat16 can gain;
  * the image input pipeline (parallel decode and resize, images/s) against what a float32
    training step consumes, and the input wait of a real `tfpipe train` run;
  * per --models network, training steps on a batch held in memory (images/s): float32 with
    and without XLA, and mixed_bfloat16 with and without XLA.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfpipe.train.config import TrainConfig  # noqa: E402
from tfpipe.train.data import label_encoder, make_dataset, parse_spec, raw_inputs  # noqa: E402
from tfpipe.train.datadir import load_data_dir  # noqa: E402
from tfpipe.train.job import compile_trainer, run as train_run  # noqa: E402
from tfpipe.train.model import build_models  # noqa: E402

BATCH = 256


def ensure_data(path: str | None) -> str:
    if path:
        return path
    from tfpipe.pipeline.config import DataConfig
    from tfpipe.pipeline.job import run

    csv = os.path.join(ROOT, "examples", "data", "chicago_taxi", "data.csv")
    out = os.path.join(ROOT, ".bench", "chicago-data")
    return run(DataConfig(input=[csv], label="big_tipper", exclude=["tips"], out=out), log=lambda _: None).outputs.path


def parse_then_batch(data) -> tf.data.Dataset:
    """The input pipeline as it was first written, for comparison: each example parsed on its
    own, then batched (make_dataset batches first and parses the batch at once)."""
    spec, encode_label, label = parse_spec(data.schema), label_encoder(data.schema), data.schema.label.name
    ds = tf.data.Dataset.from_tensor_slices(data.files("train")).shuffle(len(data.files("train")), seed=0)
    ds = ds.interleave(lambda f: tf.data.TFRecordDataset(f, compression_type="GZIP"),
                       num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    ds = ds.shuffle(10000, seed=0, reshuffle_each_iteration=True)

    def parsed(record):
        example = tf.io.parse_single_example(record, spec)
        return raw_inputs(example, data.schema), encode_label(example[label])
    return ds.map(parsed, num_parallel_calls=tf.data.AUTOTUNE).batch(BATCH)


def pipeline_rate(data, batches: int, *, parse_after_batch: bool, preprocess) -> float:
    if parse_after_batch:
        ds = make_dataset(data.files("train"), data.schema, BATCH, shuffle=True, seed=0, deterministic=False,
                          preprocess=preprocess)
    else:
        ds = parse_then_batch(data)
    it = iter(ds.repeat())
    for _ in range(10):
        next(it)
    t0 = time.perf_counter()
    n = 0
    for _ in range(batches):
        x, y = next(it)
        n += int(y.shape[0])
    return n / (time.perf_counter() - t0)


def step_rate(data, steps: int, *, policy: str, xla: bool, hidden: list[int]) -> float:
    keras.config.set_dtype_policy(policy)
    try:
        pre, trainer, _ = build_models(data.schema, data.train_stats(), hidden, 0.0, seed=0)
        compile_trainer(trainer, data.schema.label.task, 1e-3, 1, xla)
        batch = next(iter(make_dataset(data.files("train"), data.schema, BATCH, shuffle=False, seed=0,
                                       deterministic=True, preprocess=pre)))
        return held_batch_rate(trainer, batch, BATCH, 20, steps)
    finally:
        keras.config.set_dtype_policy("float32")


def held_batch_rate(model, batch, size: int, warm_steps: int, steps: int) -> float:
    """Examples/s of `model.fit` stepping on one batch held in memory (no input pipeline),
    after `warm_steps` that trace and compile."""
    held = tf.data.Dataset.from_tensors(batch).repeat()
    model.fit(held, steps_per_epoch=warm_steps, epochs=1, verbose=0)
    t0 = time.perf_counter()
    model.fit(held, steps_per_epoch=steps, epochs=1, verbose=0)
    return steps * size / (time.perf_counter() - t0)


def real_run(data_path: str, cache_mb: int) -> dict:
    out = os.path.join(tempfile.mkdtemp(prefix="bench-train-"), "train")
    train_run(TrainConfig(data=data_path, out=out, epochs=8, patience=8, cache_mb=cache_mb), log=lambda _: None)
    return json.load(open(os.path.join(out, "train.json")))


def image_pipeline_rate(data, size: tuple[int, int], batch: int, batches: int) -> float:
    from tfpipe.train.images import image_dataset

    it = iter(image_dataset(data.files("train"), size, batch, shuffle=True, seed=0, deterministic=False).repeat())
    for _ in range(5):
        next(it)
    t0 = time.perf_counter()
    n = sum(int(next(it)[1].shape[0]) for _ in range(batches))
    return n / (time.perf_counter() - t0)


def image_step_rate(data, size: tuple[int, int], model: str, batch: int, steps: int, *, policy: str,
                    xla: bool) -> float:
    from tfpipe.train.images import build_image_model, image_dataset

    keras.config.set_dtype_policy(policy)
    try:
        net = build_image_model(size, data.schema.label.classes, data.train_stats(), model=model,
                                filters=[32, 64, 128], dropout=0.0, augment=["flip", "crop"], seed=0)
        compile_trainer(net, "multiclass", 1e-3, 1, xla)
        first = next(iter(image_dataset(data.files("train"), size, batch, shuffle=False, seed=0,
                                        deterministic=True)))
        return held_batch_rate(net, first, batch, 3, steps)
    finally:
        keras.config.set_dtype_policy("float32")


def images_main(args) -> None:
    from tfpipe.train.devices import cpu_features

    from bench_data import image_data_dir

    data_path = image_data_dir(args.images, args.image_size)
    data = load_data_dir(data_path)
    size = (args.image_size, args.image_size)
    cpu = cpu_features()
    print(f"CPU: {cpu['model']}, {os.cpu_count()} cores; instruction sets: {', '.join(cpu['features']) or 'none listed'}")
    print(f"{data.count('train'):,} training images of {size[0]}x{size[1]}, {len(data.schema.label.classes)} classes; "
          f"batch {args.batch}\n")
    pipeline = image_pipeline_rate(data, size, args.batch, 40)
    consume = image_step_rate(data, size, "cnn", args.batch, 20, policy="float32", xla=False)
    out = os.path.join(tempfile.mkdtemp(prefix="bench-train-images-"), "train")
    train_run(TrainConfig(data=data_path, out=out, epochs=3, patience=3, batch_size=args.batch), log=lambda _: None)
    real = json.load(open(os.path.join(out, "train.json")))
    print("input pipeline, parallel decode + resize (images/s)")
    print(f"  pipeline alone               {pipeline:>10,.0f}")
    print(f"  cnn float32 step consumes    {consume:>10,.0f}   pipeline/consumption {pipeline / consume:.2f}x")
    print(f"  tfpipe train (cnn, 3 epochs) {real['examples_per_s']:>10,.0f}   input wait "
          f"{real['input_wait_fraction']:.1%} of step time (target < 5%)\n")
    print("training steps on a batch held in memory (images/s)")
    for model in args.models.split(","):
        steps = args.steps if model == "cnn" else max(5, args.steps // 4)
        rows = [(policy, xla, image_step_rate(data, size, model, args.batch, steps, policy=policy, xla=xla))
                for policy in ("float32", "mixed_bfloat16") for xla in (False, True)]
        base = rows[0][2]
        print(f"  {model}")
        for policy, xla, rate in rows:
            print(f"    {policy:15s} XLA {'on ' if xla else 'off'} {rate:>10,.1f}   {rate / base:.2f}x float32 without XLA")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--images", type=int, help="benchmark an image model on this many generated images")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32, help="images per step (--images only)")
    ap.add_argument("--models", default="cnn,mobilenet_v3_small,resnet50", help="networks to time (--images only)")
    args = ap.parse_args()
    if args.images:
        images_main(args)
        return
    data_path = ensure_data(args.data)
    data = load_data_dir(data_path)
    gpus = tf.config.list_physical_devices("GPU")
    print(f"device: {'GPU x%d' % len(gpus) if gpus else 'CPU, %d cores' % os.cpu_count()}; "
          f"{data.count('train'):,} training examples; batch {BATCH}\n")

    pre, _, _ = build_models(data.schema, data.train_stats(), [64, 32], 0.0, seed=0)
    batches = max(50, args.steps // 2)
    btp = pipeline_rate(data, batches, parse_after_batch=True, preprocess=None)
    ptb = pipeline_rate(data, batches, parse_after_batch=False, preprocess=None)
    full = pipeline_rate(data, batches, parse_after_batch=True, preprocess=pre)
    consume = step_rate(data, args.steps, policy="float32", xla=bool(gpus), hidden=[64, 32])
    cached, uncached = real_run(data_path, 512), real_run(data_path, 0)

    print("input pipeline (examples/s)")
    print(f"  batch-then-parse             {btp:>12,.0f}")
    print(f"  parse-then-batch             {ptb:>12,.0f}   batch-then-parse is {btp / ptb:.2f}x")
    print(f"  parse + preprocessing        {full:>12,.0f}")
    print(f"  training step consumes       {consume:>12,.0f}   pipeline/consumption {full / consume:.2f}x")
    print("tfpipe train on this data (input wait = share of step time waiting for data)")
    for name, m in (("features cached in memory", cached), ("no cache", uncached)):
        print(f"  {name:28s} {m['examples_per_s']:>12,.0f} ex/s   step {m['mean_step_s'] * 1e3:.2f} ms   "
              f"input wait {m['input_wait_fraction']:.1%}")

    print("training step throughput, batch held in memory (examples/s)")
    for hidden in ([64, 32], [1024, 1024, 1024]):
        label = ",".join(map(str, hidden))
        off = step_rate(data, args.steps, policy="float32", xla=False, hidden=hidden)
        on = step_rate(data, args.steps, policy="float32", xla=True, hidden=hidden)
        rows = [("float32, XLA off", off), ("float32, XLA on", on)]
        for policy in ("mixed_bfloat16", "mixed_float16"):
            rows.append((f"{policy}, XLA off", step_rate(data, args.steps, policy=policy, xla=False, hidden=hidden)))
        rows.append(("mixed_float16, XLA on", step_rate(data, args.steps, policy="mixed_float16", xla=True,
                                                         hidden=hidden)))
        print(f"  hidden {label}")
        for name, rate in rows:
            print(f"    {name:26s} {rate:>12,.0f}   {rate / off:.2f}x float32 without XLA")


if __name__ == "__main__":
    main()
