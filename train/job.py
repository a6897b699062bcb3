"""`tfpipe train`: the data stage's TFRecords -> a Keras 3 model with preprocessing inside.

The run works in `.NAME.resume` beside --out: checkpoints, the BackupAndRestore backup and logs
accumulate there, so a killed run started again resumes from its last epoch (train/resume.py);
on success the directory is renamed to --out. The callbacks are train/callbacks.py's.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
import warnings
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

import keras
import tensorflow as tf

from tfpipe import __version__
from tfpipe.files import cache_key, read_json, write_json
from tfpipe.machine import cores
from tfpipe.stage import StageResult, TrainOutputs
from tfpipe.train.config import UNTIL_STOPPED, TrainConfig
from tfpipe.train.data import make_dataset
from tfpipe.train.datadir import DataDir, check_inputs
from tfpipe.train.devices import (choose_precision, choose_strategy, choose_xla, cpu_features, setup_gpus,
                                  worker_position)
from tfpipe.train.errors import DivergedError, TrainError
from tfpipe.train.losses import LabelScale, label_scale, loss_and_metrics
from tfpipe.train.model import build_models
from tfpipe.train.callbacks import EpochLog, callbacks, gpu_sampler, min_delta
from tfpipe.train.resume import publish_work, resumed_epoch, work_dir


# Our datasets are finite by design: an epoch is one pass, not a fixed number of steps.
warnings.filterwarnings("ignore", message="Your input ran out of data")


@dataclass
class _Runtime:
    """Where and how this process trains: devices, precision, XLA, the tf.distribute strategy, and
    this process's place among the workers."""

    gpus: list[dict]
    policy: str
    policy_why: str
    xla: bool
    xla_why: str
    strategy: tf.distribute.Strategy
    strategy_name: str
    workers: int
    worker: int
    global_batch: int
    devices: dict

    @property
    def shard(self) -> tuple[int, int] | None:
        return (self.workers, self.worker) if self.workers > 1 else None


@dataclass
class _Model:
    """What the model's kind (image or rows) decides: the model to save, the one to fit (the rows'
    takes preprocessed features), how a split is read, and whether it is cached in memory."""

    model: keras.Model
    trainer: keras.Model
    dataset: Callable[[str, bool], tf.data.Dataset]  # (split, shuffle)
    feature_mb: float
    cache: bool
    image: dict | None = None  # the image model's size, network, augmentation, classes
    label_scale: LabelScale | None = None  # a regression's: the trainer's standard units


def run(config: TrainConfig, log: Callable[[str], None] = print) -> StageResult:
    """Train: the output directory published atomically, and its result. A worker of multi-worker
    training other than the chief publishes nothing: its result has no manifest."""
    out = _run(config, log)
    if out is None:
        return StageResult("", f"trained as worker of a multi-worker run; its chief publishes {config.out}",
                           TrainOutputs(os.path.abspath(config.out), ""))
    return result(out)


def _run(config: TrainConfig, log: Callable[[str], None]) -> str | None:
    """Train; the output directory (None on a worker that is not the chief)."""
    started = time.time()
    data = check_inputs(config)
    out = os.path.abspath(config.out)
    fingerprint = cache_key(config.fingerprint_fields(), {"data": data.manifest["fingerprint"]})
    previous = read_json(os.path.join(out, "train.json"))
    if previous and previous.get("fingerprint") == fingerprint and not config.force:
        log(f"cache hit: {out} is up to date with this data and these options; nothing to do (--force retrains)")
        return out
    config, sized = config.sized(data.count("train"), regression=data.schema.label.task == "regression")
    if sized:
        log(sized + " (set --batch-size, --epochs, --patience, --min-epochs"
            + (", --ensemble" if "ensemble" in sized else "") + (", --hidden" if "hidden" in sized else "")
            + " to choose)")
    rt = _runtime(config, log)
    work = work_dir(out, config, data, rt.worker, log)
    with rt.strategy.scope():
        built = _image_model(config, data, rt, log) if data.images else _row_model(config, data, rt)
        compile_trainer(built.trainer, data.schema.label.task, config.learning_rate, config.grad_accum_steps, rt.xla,
                        built.label_scale)
    # Each worker batches its own files at the global batch size; tf.distribute splits every
    # batch across all replicas, so a step sees `batch_size` examples per replica.
    train_ds = built.dataset("train", True)
    eval_split = "eval" if data.count("eval") else "train"
    eval_ds = built.dataset(eval_split, False)
    epoch_log = EpochLog(os.path.join(work, "metrics.jsonl"), data.count("train"), config.time_limit, log,
                         say=config.epochs == UNTIL_STOPPED)
    sampler = gpu_sampler(rt.gpus, work, log)
    resumed = resumed_epoch(work)
    if resumed:
        log(f"resuming from the backup of epoch {resumed} in {work}")
    log(f"training on {data.count('train'):,} examples, evaluating on {data.count(eval_split):,} ({eval_split})"
        + (f"; {'decoded images' if data.images else 'preprocessed features'} cached in memory "
           f"({built.feature_mb:.1f} MB)" if built.cache else ""))
    _fit(config, data, rt, built.trainer, (train_ds, eval_ds), work, epoch_log, sampler, log, built.label_scale)
    results = _evaluate(data, rt, built, eval_ds, eval_split)
    shutil.rmtree(os.path.join(work, "backup"), ignore_errors=True)
    if rt.worker == 0:
        built.model.save(os.path.join(work, "model.keras"))  # before _timing, which may step the trainer
    timing = _timing(epoch_log.epochs, built.trainer, train_ds, config, data.schema.label.task, rt.xla,
                     reuse=rt.workers == 1, scale=built.label_scale)
    if rt.worker != 0:  # in multi-worker training only the chief publishes
        shutil.rmtree(work, ignore_errors=True)
        return None
    manifest = {
        "stage": "train",
        "tfpipe_version": __version__,
        "fingerprint": fingerprint,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": config.model_dump(mode="json"),
        "data": {"path": data.path, "fingerprint": data.manifest["fingerprint"]},
        "devices": rt.devices,
        "precision": {"policy": rt.policy, "why": rt.policy_why, "loss_scaling": rt.policy == "mixed_float16"},
        "xla": {"jit_compile": rt.xla, "why": rt.xla_why},
        "strategy": {"name": rt.strategy_name, "replicas": rt.strategy.num_replicas_in_sync, "workers": rt.workers,
                     "global_batch": rt.global_batch, "grad_accum_steps": config.grad_accum_steps},
        "gpu_utilization": sampler.summary() if sampler is not None else None,
        "epochs_run": len(epoch_log.epochs),
        **ending(epoch_log, config),
        "resumed_from_epoch": resumed,
        "metrics": results,
        "rows": {split: data.count(split) for split in results},
        "image": built.image,
        **timing,
        "elapsed_s": round(time.time() - started, 2),
    }
    write_json(os.path.join(work, "train.json"), manifest)
    publish_work(work, out)
    _print_summary(manifest, out, log)
    return out


def _runtime(config: TrainConfig, log: Callable[[str], None]) -> _Runtime:
    """Choose devices, precision, XLA and strategy (and say which, and why); set Keras's policy and seed."""
    gpus = setup_gpus(config.log_device_placement)
    policy, policy_why = choose_precision(config.precision, gpus)
    xla, xla_why = choose_xla(config.xla, gpus)
    strategy, strategy_name = choose_strategy(config.strategy, gpus)
    workers, worker = worker_position(strategy)
    keras.config.set_dtype_policy(policy)
    keras.utils.set_random_seed(config.seed)
    if config.deterministic:
        tf.config.experimental.enable_op_determinism()
    replicas = strategy.num_replicas_in_sync
    rt = _Runtime(gpus, policy, policy_why, xla, xla_why, strategy, strategy_name, workers, worker,
                  config.batch_size * replicas, {"cpus": cores(), "cpu": cpu_features(), "gpus": gpus})
    for g in gpus:
        log(f"GPU {g['device']}: {g['name']}, compute capability {g['compute_capability']}, "
            f"{g['memory_gb'] or '?'} GB")
    if not gpus:
        cpu = rt.devices["cpu"]
        log(f"devices: CPU only ({cores()} cores"
            + (f", {', '.join(cpu['features'])}" if cpu["features"] else "") + ")")
    log(f"precision {policy} ({policy_why}); XLA {'on' if xla else 'off'} ({xla_why}); {strategy_name}; "
        f"global batch {rt.global_batch} = {config.batch_size} x {replicas} replica(s)"
        + (f", gradients accumulated over {config.grad_accum_steps} batches" if config.grad_accum_steps > 1 else ""))
    return rt


def _cached_rows(data: DataDir) -> int:
    """Rows kept in memory when the features fit: the training split and the split evaluated
    after every epoch (read again each time, a small split's parsing and preprocessing would
    cost more than its epoch's training)."""
    return data.count("train") + data.count("eval")


def _image_model(config: TrainConfig, data: DataDir, rt: _Runtime, log: Callable[[str], None]) -> _Model:
    """A CNN or keras.applications network on uint8 pixels, read from the image TFRecords."""
    from tfpipe.pipeline.schema import parse_size
    from tfpipe.train.images import build_image_model, image_dataset, image_size

    train_stats = data.train_stats()
    classes = data.schema.label.classes
    size = image_size(parse_size(config.image_size) if config.image_size else None, data.schema, train_stats,
                      config.model)
    model = build_image_model(size, classes, train_stats, model=config.model, filters=config.filters,
                              dropout=config.dropout, augment=config.augmentations, seed=config.seed)
    log(f"model {config.model}: {size[0]}x{size[1]}x3 uint8 pixels -> {len(classes)} classes, "
        f"{model.count_params():,} parameters; augmentation: {', '.join(config.augmentations) or 'none'}")
    feature_mb = _cached_rows(data) * size[0] * size[1] * 3 / 2**20  # decoded uint8 pixels
    cache = feature_mb <= config.cache_mb

    def dataset(split: str, shuffle: bool) -> tf.data.Dataset:
        return image_dataset(data.files(split), size, rt.global_batch, shuffle=shuffle, seed=config.seed,
                             shuffle_buffer=config.shuffle_buffer, deterministic=config.deterministic or not shuffle,
                             shard=rt.shard, cache=cache)
    image = {"size": list(size), "model": config.model, "augment": config.augmentations, "classes": classes,
             "parameters": model.count_params()}
    return _Model(model, model, dataset, feature_mb, cache, image)


def _row_model(config: TrainConfig, data: DataDir, rt: _Runtime) -> _Model:
    """Dense layers behind the preprocessing built from the statistics; the trainer takes the
    preprocessed features, which the datasets compute (and cache) once."""
    stats = data.train_stats()
    preprocessor, trainer, model = build_models(data.schema, stats, config.hidden, config.dropout, config.seed,
                                                config.scaling, config.target, config.ensemble or 1)
    feature_mb = _cached_rows(data) * preprocessor.output.shape[-1] * 4 / 2**20
    cache = feature_mb <= config.cache_mb
    scale = label_scale(stats, config.target, config.ensemble or 1) if data.schema.label.task == "regression" else None

    def dataset(split: str, shuffle: bool) -> tf.data.Dataset:
        return make_dataset(data.files(split), data.schema, rt.global_batch, shuffle=shuffle, seed=config.seed,
                            shuffle_buffer=config.shuffle_buffer, deterministic=config.deterministic or not shuffle,
                            shard=rt.shard, preprocess=preprocessor, cache=cache, label_scale=scale)
    return _Model(model, trainer, dataset, feature_mb, cache, label_scale=scale)


def _fit(config: TrainConfig, data: DataDir, rt: _Runtime, trainer: keras.Model, datasets: tuple, work: str,
         epoch_log: EpochLog, sampler, log: Callable[[str], None], scale=None) -> None:
    """Keras's fit with its callbacks in one process, the custom loop over several workers;
    failures as TrainErrors. `datasets`: (train, eval)."""
    train_ds, eval_ds = datasets
    try:
        if rt.workers > 1:
            from tfpipe.train.multiworker import fit_multiworker

            if sampler is not None:
                sampler.on_train_begin()  # the custom loop runs no Keras callbacks
            epoch_log.timed_out = fit_multiworker(
                rt.strategy, trainer, train_ds, eval_ds, task=data.schema.label.task, epochs=config.epochs,
                patience=config.patience, min_epochs=config.min_epochs or 0, min_delta=min_delta(config),
                time_limit=config.time_limit, work=work,
                examples=data.count("train"), learning_rate=config.learning_rate, on_epoch=epoch_log.record, log=log,
                label_scale=scale)
        else:
            trainer.fit(train_ds, validation_data=eval_ds, epochs=config.epochs,
                        callbacks=callbacks(config, work, epoch_log, sampler),
                        shuffle=False,  # the dataset shuffles itself
                        verbose=0 if epoch_log.say else 1 if os.isatty(1) else 2)
    except DivergedError as e:
        good = resumed_epoch(work)
        if good:
            hint = (f"the last good epoch ({good}) is kept in {work}; rerun with a lower --learning-rate to resume "
                    "from it")
        else:
            hint = "no epoch had finished; rerun with a lower --learning-rate"
        raise TrainError(f"{e}; {hint}") from None
    except tf.errors.DataLossError as e:
        raise TrainError(f"a TFRecord file of {data.path} is corrupt: {e.message.splitlines()[0]}") from None
    except tf.errors.ResourceExhaustedError:
        raise TrainError("out of GPU memory: lower --batch-size, use --precision mixed_float16, "
                         "or keep the batch with --grad-accum-steps") from None


def _evaluate(data: DataDir, rt: _Runtime, built: _Model, eval_ds, eval_split: str) -> dict[str, dict]:
    """Metrics on the eval and test splits that have rows."""
    results = {}
    if rt.workers > 1:
        from tfpipe.train.multiworker import DistributedEval

        evaluate = DistributedEval(rt.strategy, built.trainer, data.schema.label.task, built.label_scale)
    for split in ("eval", "test"):
        if data.count(split):
            ds = eval_ds if split == eval_split else built.dataset(split, False)
            if rt.workers > 1:
                results[split] = evaluate(rt.strategy.experimental_distribute_dataset(ds))
            else:
                results[split] = {k: float(v) for k, v in
                                  built.trainer.evaluate(ds, verbose=0, return_dict=True).items()}
    return results


def compile_trainer(trainer: keras.Model, task: str, learning_rate: float, accum: int, xla: bool,
                    scale=None) -> None:
    """Adam, with gradients averaged over `accum` batches per update when accum > 1; a
    regression's MAE and RMSE in the label's units (`scale`, see loss_and_metrics)."""
    optimizer = keras.optimizers.Adam(learning_rate, gradient_accumulation_steps=accum if accum > 1 else None)
    loss, metrics = loss_and_metrics(task, scale)
    # Under mixed_float16 Keras wraps the optimizer in a LossScaleOptimizer (auto_scale_loss).
    trainer.compile(optimizer=optimizer, loss=loss, metrics=metrics, jit_compile=xla)


def _timing(epochs, trainer, train_ds, config, task, xla, reuse: bool, scale=None) -> dict[str, Any]:
    """Throughput, mean step time and the share of each step spent waiting for input.

    The wait is measured, not guessed: the trainer takes the same steps on one batch held in
    memory (pure compute); the rest of a training step's time is input wait. With `reuse` the
    trainer itself does it, through the step function fit() compiled (its weights were
    saved before); otherwise (a multi-worker run, where fit() is not used) a copy does."""
    steady = epochs[1:] or epochs  # the first epoch includes tracing
    if not steady:
        return {}
    seconds = sum(e["step_seconds"] for e in steady)
    examples = sum(e["step_seconds"] * e["examples_per_s"] for e in steady)
    step_time = seconds / sum(e["steps"] for e in steady)
    probe = trainer
    if not reuse:
        probe = keras.models.clone_model(trainer)
        compile_trainer(probe, task, config.learning_rate, 1, xla, scale)
    batch = next(iter(train_ds))
    probe.train_on_batch(*batch)  # trace and compile outside the timing
    n = 20
    t0 = time.perf_counter()
    for _ in range(n):
        probe.train_on_batch(*batch)
    compute = (time.perf_counter() - t0) / n
    return {"examples_per_s": round(examples / seconds, 1), "mean_step_s": round(step_time, 6),
            "compute_step_s": round(compute, 6),
            "input_wait_fraction": round(max(0.0, 1 - compute / step_time), 4)}


def ending(epoch_log: EpochLog, config: TrainConfig) -> dict[str, Any]:
    """What ended training: "early stopping" (the data), "time limit" or "epochs" (a budget), and
    whether the eval loss was still falling then: its best epoch among the last `patience`, and in
    the run's second half (a patience as long as the run would count a best first epoch followed
    by nothing but worse ones)."""
    run = len(epoch_log.epochs)
    ended = "time limit" if epoch_log.timed_out else "epochs" if run >= config.epochs else "early stopping"
    losses = [e.get("val_loss") for e in epoch_log.epochs]
    known = [(v, i) for i, v in enumerate(losses) if v is not None and math.isfinite(v)]
    best = min(known)[1] + 1 if known else None
    recent = min(config.patience or 1, max(1, run // 2))
    falling = ended != "early stopping" and best is not None and run - best < recent
    return {"ended_by": ended, "best_epoch": best, "still_improving": falling}


def epochs_text(m: dict[str, Any]) -> str:
    """'40 epochs', '13 of 20 epochs (early stopping: ...)', '51 epochs (early stopping: ...)', or a
    budget's end while the eval loss still fell, from a train.json."""
    run, cfg = m["epochs_run"], m.get("config", {})
    planned = cfg.get("epochs")
    ended = m.get("ended_by") or ("epochs" if not planned or run >= planned else "early stopping")
    if m.get("still_improving"):
        budget = (f"the time limit of {cfg.get('time_limit'):g} s" if ended == "time limit"
                  else f"its {planned} epochs")
        more = "--time-limit (train.time_limit)" if ended == "time limit" else "--epochs (train.epochs)"
        return (f"{run} epochs, ended by {budget} while the eval loss still fell (best at epoch "
                f"{m.get('best_epoch')}): not converged, {more} gives it longer")
    if ended == "epochs":
        return f"{run} epochs"
    if ended == "time limit":
        return f"{run} epochs (the time limit of {cfg.get('time_limit'):g} s)"
    why = f"early stopping: eval loss not better for {cfg.get('patience')} epochs"
    return f"{run} epochs ({why})" if planned == UNTIL_STOPPED else f"{run} of {planned} epochs ({why})"


def _print_summary(m: dict[str, Any], out: str, log) -> None:
    for split, metrics in m["metrics"].items():
        log(f"  {split:5s} " + "  ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
    if "examples_per_s" in m:
        log(f"  {epochs_text(m)}, {m['examples_per_s']:,.0f} examples/s, step {m['mean_step_s'] * 1000:.2f} ms "
            f"(input wait {m['input_wait_fraction']:.1%})")
    log(f"wrote {out} in {m['elapsed_s']:.1f} s")


def _accuracy_interval(m: dict[str, Any], split: str, metric: str) -> str:
    """' (95% CI 0.90-1.00, 35 rows)' after a split's accuracy, from its rows (train.json's
    `rows`); the other metrics get their rows only."""
    rows = (m.get("rows") or {}).get(split)
    if not rows:
        return ""
    if metric != "accuracy":
        return f" on {rows:,} rows"
    from tfpipe.intervals import LEVEL, interval_text, wilson

    low, high = wilson(round(m["metrics"][split][metric] * rows), rows)
    return interval_text({"level": LEVEL, "low": low, "high": high}, rows=rows)


def result(out: str) -> StageResult:
    """The training stage's output for `tfpipe run`: epochs, the eval metric, precision and speed in one line."""
    with open(os.path.join(out, "train.json")) as f:
        m = json.load(f)
    split = "eval" if "eval" in m["metrics"] else next(iter(m["metrics"]), None)
    metrics = m["metrics"].get(split, {})
    metric = next((k for k in ("accuracy", "auc", "mae", "rmse") if k in metrics), None)
    summary = (epochs_text(m) + (f" (resumed after epoch {m['resumed_from_epoch']})" if m.get("resumed_from_epoch")
                                 else "")
               + (f", {split} {metric} {metrics[metric]:.3f}{_accuracy_interval(m, split, metric)}" if metric else "")
               + f", {m['precision']['policy']}, {m.get('examples_per_s', 0):,.0f} examples/s")
    return StageResult(os.path.join(out, "train.json"), summary, TrainOutputs(out, m["fingerprint"]))
