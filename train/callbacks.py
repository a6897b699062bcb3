"""What runs beside `tfpipe train`'s fit: the callbacks in the order Keras calls them (the epoch's
metrics line, BackupAndRestore, the learning rate kept, a non-finite loss stopped, checkpoints,
early stopping, TensorBoard, the GPU sampler), and what counts as an epoch better than the last."""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Callable

import keras

from tfpipe.train.config import UNTIL_STOPPED, UNTIL_STOPPED_MIN_DELTA, TrainConfig
from tfpipe.train.errors import DivergedError


class StopOnNonFiniteLoss(keras.callbacks.Callback):
    """Raises out of fit() on a NaN/Inf loss. Unlike TerminateOnNaN it does not let fit end
    normally, so BackupAndRestore keeps its backup of the last good epoch (keras#21771)."""

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            raise DivergedError(self.epoch + 1, batch + 1, float(loss))


class KeepLearningRate(keras.callbacks.Callback):
    """After BackupAndRestore restores the optimizer, apply this run's learning rate, so a
    rerun with a lower rate after a divergence resumes with the lower rate."""

    def __init__(self, rate: float):
        super().__init__()
        self.rate = rate

    def on_train_begin(self, logs=None):
        self.model.optimizer.learning_rate.assign(self.rate)


class EpochLog(keras.callbacks.Callback):
    """One JSON line per epoch in metrics.jsonl: metrics, wall time, and the time spent in
    training steps alone (fetching the batch included, validation and callbacks not)."""

    def __init__(self, path: str, examples: int, time_limit: float | None, log, say: bool = False):
        """`say`: log a line per epoch (in place of Keras's, whose 'Epoch 3/10000' would misread
        training that runs until early stopping)."""
        super().__init__()
        self.path, self.examples, self.time_limit, self.log, self.say = path, examples, time_limit, log, say
        self.epochs: list[dict[str, Any]] = []
        self.timed_out = False

    def on_train_begin(self, logs=None):
        self.started = time.perf_counter()

    def on_epoch_begin(self, epoch, logs=None):
        self.t0 = time.perf_counter()
        self.step_seconds = 0.0
        self.steps = 0

    def on_train_batch_begin(self, batch, logs=None):
        self.tb = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.step_seconds += time.perf_counter() - self.tb
        self.steps += 1

    def on_epoch_end(self, epoch, logs=None):
        seconds = time.perf_counter() - self.t0
        self.record({"epoch": epoch + 1, **{k: float(v) for k, v in (logs or {}).items()},
                     "seconds": round(seconds, 4), "steps": self.steps, "step_seconds": round(self.step_seconds, 4),
                     "examples_per_s": round(self.examples / self.step_seconds, 1)})
        if self.say:
            figures = ", ".join(f"{k} {float(v):.4g}" for k, v in (logs or {}).items() if k != "learning_rate")
            self.log(f"epoch {epoch + 1}: {seconds:.1f} s, {figures}")
        if self.time_limit and time.perf_counter() - self.started > self.time_limit:
            self.log(f"time limit of {self.time_limit:g} s reached after epoch {epoch + 1}")
            self.timed_out = True
            self.model.stop_training = True

    def record(self, row: dict[str, Any]) -> None:
        self.epochs.append(row)
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")


def gpu_sampler(gpus: list[dict], work: str, log: Callable[[str], None]):
    """GPU utilisation sampled while training, or None (no GPU, or NVML refused)."""
    if not gpus:
        return None
    from tfpipe.train.gpu_monitor import GpuSampler

    try:
        return GpuSampler(gpus, os.path.join(work, "logs"))
    except Exception as e:  # NVML missing or refused: train anyway, say so
        log(f"GPU utilisation is not sampled: NVML unavailable ({e})")
        return None


def callbacks(config: TrainConfig, work: str, epoch_log: EpochLog, sampler) -> list[keras.callbacks.Callback]:
    callbacks = [
        # Keras calls these in order. The epoch's metrics.jsonl line is written before its backup,
        # so a run killed between the two resumes from the epoch before and writes the line again
        # (the resume trims lines past the backup's epoch); the other way round, it lost a line.
        epoch_log,
        # double_checkpoint: the backup before the last is kept beside it (.bkp), for a run
        # killed while it wrote the last one (repair_backup)
        keras.callbacks.BackupAndRestore(os.path.join(work, "backup"), double_checkpoint=True),
        KeepLearningRate(config.learning_rate),  # after the restore, which brings the old rate back
        StopOnNonFiniteLoss(),
        keras.callbacks.ModelCheckpoint(os.path.join(work, "checkpoints", "epoch-{epoch:03d}.weights.h5"),
                                        save_weights_only=True),
        keras.callbacks.EarlyStopping(monitor="val_loss", patience=config.patience, restore_best_weights=True,
                                      start_from_epoch=config.min_epochs or 0, min_delta=min_delta(config)),
        keras.callbacks.TensorBoard(os.path.join(work, "logs"), profile_batch=(2, 6) if config.profile else 0),
    ]
    return callbacks + ([sampler] if sampler is not None else [])


def min_delta(config: TrainConfig) -> float:
    """How much an epoch must lower the eval loss to count as better: UNTIL_STOPPED_MIN_DELTA when
    training runs until early stopping, else any drop (a capped run stops at its cap anyway)."""
    return UNTIL_STOPPED_MIN_DELTA if config.epochs == UNTIL_STOPPED else 0.0
