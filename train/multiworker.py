"""A training loop for MultiWorkerMirroredStrategy.

Keras 3's fit() fails under MultiWorkerMirroredStrategy with more than one worker
(keras-team/keras#20585), so multi-worker runs use this loop: `strategy.run` per step,
losses averaged over the global batch, gradients all-reduced by the strategy. It keeps the
single-machine path's behaviour: a backup every epoch in BackupAndRestore's format (so a
killed run resumes), a checkpoint per epoch, the NaN guard, early stopping with the best
weights restored, TensorBoard scalars and metrics.jsonl rows. Every decision that ends the
loop is taken from values all-reduced across workers, so no worker is left waiting.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from typing import Any, Callable

import keras
import tensorflow as tf

from tfpipe.files import write_json
from tfpipe.train.errors import DivergedError
from tfpipe.train.losses import loss_and_metrics, make_loss

BACKUP_WEIGHTS = "latest.weights.h5"  # BackupAndRestore's names, so resume reads either
BACKUP_META = "training_metadata.json"


class DistributedEval:
    """Loss and metrics of a model on a distributed dataset, all-reduced across workers."""

    def __init__(self, strategy: tf.distribute.Strategy, trainer: keras.Model, task: str, label_scale=None):
        self.strategy = strategy
        with strategy.scope():
            self.loss = make_loss(task, reduction=None)
            self.metrics = [keras.metrics.Mean(name="loss")] + loss_and_metrics(task, label_scale)[1]

        def replica(x, y):
            pred = trainer(x, training=False)
            self.metrics[0].update_state(per_example(self.loss, y, pred))
            for m in self.metrics[1:]:
                m.update_state(y, pred)

        # Partial last batches have other shapes: trace once for them, not per call.
        self._step = tf.function(lambda x, y: strategy.run(replica, args=(x, y)), reduce_retracing=True)

    def __call__(self, dist_ds) -> dict[str, float]:
        for m in self.metrics:
            m.reset_state()
        for x, y in dist_ds:
            self._step(x, y)
        return {m.name: float(m.result()) for m in self.metrics}


def per_example(loss: keras.losses.Loss, y, pred):
    """One loss value per example; 1-D predictions (binary, regression) get a class axis so
    the loss does not average them into one number."""
    if len(pred.shape) == 1:
        y, pred = y[:, None], pred[:, None]
    return loss(y, pred)


def fit_multiworker(strategy: tf.distribute.Strategy, trainer: keras.Model, train_ds: tf.data.Dataset,
                    eval_ds: tf.data.Dataset, *, task: str, epochs: int, patience: int, time_limit: float | None,
                    min_epochs: int = 0, min_delta: float = 0.0, work: str, examples: int, learning_rate: float,
                    on_epoch: Callable[[dict[str, Any]], None], log, label_scale=None) -> bool:
    """Train `trainer` (built and compiled in `strategy.scope()`) on per-worker datasets;
    `label_scale`: a regression label's (train.losses.LabelScale), MAE and RMSE in its units.
    Whether the time limit ended it."""
    train_step, train_metrics = _train_step(strategy, trainer, task, label_scale)

    @tf.function
    def any_worker(flag):
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.identity(flag)), axis=None)

    validate = DistributedEval(strategy, trainer, task, label_scale)
    dist_train = strategy.experimental_distribute_dataset(train_ds)
    dist_eval = strategy.experimental_distribute_dataset(eval_ds)
    backup = os.path.join(work, "backup")
    start = _resume(strategy, trainer, backup)
    trainer.optimizer.learning_rate.assign(learning_rate)  # this run's rate, also after a resume
    writer = tf.summary.create_file_writer(os.path.join(work, "logs", "train"))
    best, best_weights, waited, timed_out = math.inf, None, 0, False
    started = time.perf_counter()
    for epoch in range(start, epochs):
        for m in train_metrics:
            m.reset_state()
        t0 = time.perf_counter()
        steps, step_seconds = 0, 0.0
        for x, y in dist_train:
            ts = time.perf_counter()
            loss = float(train_step(x, y))
            step_seconds += time.perf_counter() - ts
            steps += 1
            if not math.isfinite(loss):
                raise DivergedError(epoch + 1, steps, loss)
        logs = {m.name: float(m.result()) for m in train_metrics}
        logs.update({f"val_{k}": v for k, v in validate(dist_eval).items()})
        seconds = time.perf_counter() - t0
        # the epoch's metrics line before its backup: a backup of epoch N implies its line (see job._callbacks)
        on_epoch({"epoch": epoch + 1, **logs, "seconds": round(seconds, 4), "steps": steps,
                  "step_seconds": round(step_seconds, 4), "examples_per_s": round(examples / step_seconds, 1)})
        _checkpoint(trainer, work, backup, epoch + 1, writer, logs)
        if epoch + 1 <= min_epochs:
            pass  # as Keras's EarlyStopping(start_from_epoch): no epoch is judged before min_epochs
        elif logs["val_loss"] < best - min_delta:
            best, best_weights, waited = logs["val_loss"], trainer.get_weights(), 0
        else:
            waited += 1
        out_of_time = bool(time_limit and time.perf_counter() - started > time_limit)
        if float(any_worker(tf.constant(1.0 if out_of_time else 0.0))) > 0:
            log(f"time limit of {time_limit:g} s reached after epoch {epoch + 1}")
            timed_out = True
            break
        if waited >= patience:  # val_loss is all-reduced, so every worker stops here together
            break
    if best_weights is not None:
        trainer.set_weights(best_weights)
    return timed_out


def _train_step(strategy: tf.distribute.Strategy, trainer: keras.Model, task: str, label_scale):
    """(train_step(x, y) -> the loss summed over replicas, the training metrics it updates)."""
    with strategy.scope():
        loss_fn = make_loss(task, reduction=None)
        train_metrics = [keras.metrics.Mean(name="loss")] + loss_and_metrics(task, label_scale)[1]
    optimizer = trainer.optimizer
    scale = getattr(optimizer, "scale_loss", None)  # LossScaleOptimizer under mixed_float16

    def train_replica(x, y):
        with tf.GradientTape() as tape:
            pred = trainer(x, training=True)
            losses = per_example(loss_fn, y, pred)
            loss = tf.nn.compute_average_loss(losses)
            scaled = scale(loss) if scale else loss
        grads = tape.gradient(scaled, trainer.trainable_variables)
        optimizer.apply_gradients(zip(grads, trainer.trainable_variables))
        train_metrics[0].update_state(losses)
        for m in train_metrics[1:]:
            m.update_state(y, pred)
        return loss

    @tf.function(reduce_retracing=True)
    def train_step(x, y):
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(train_replica, args=(x, y)), axis=None)
    return train_step, train_metrics


def _resume(strategy: tf.distribute.Strategy, trainer: keras.Model, backup: str) -> int:
    """The epoch to start from: 0, or the last one the backup in `backup` holds (its weights loaded)."""
    os.makedirs(backup, exist_ok=True)
    meta_path = os.path.join(backup, BACKUP_META)
    if not os.path.exists(meta_path):
        return 0
    with strategy.scope():
        trainer.optimizer.build(trainer.trainable_variables)
    trainer.load_weights(os.path.join(backup, BACKUP_WEIGHTS))
    with open(meta_path) as f:
        return json.load(f)["epoch"]


def _checkpoint(trainer: keras.Model, work: str, backup: str, epoch: int, writer, logs: dict[str, float]) -> None:
    """After `epoch` (1-based): its weights, the backup a resume starts from, and TensorBoard's scalars."""
    trainer.save_weights(os.path.join(work, "checkpoints", f"epoch-{epoch:03d}.weights.h5"))
    for name in (BACKUP_WEIGHTS, BACKUP_META):  # the one before, as double_checkpoint keeps it
        if os.path.exists(os.path.join(backup, name)):
            shutil.copyfile(os.path.join(backup, name), os.path.join(backup, name + ".bkp"))
    trainer.save_weights(os.path.join(backup, BACKUP_WEIGHTS))
    write_json(os.path.join(backup, BACKUP_META), {"epoch": epoch, "batch": 0})  # whole, for a resume
    with writer.as_default(step=epoch - 1):
        for k, v in logs.items():
            tf.summary.scalar(f"epoch_{k}", v)
