"""What a model is trained to minimise and reports, and a regression label's scale: the trainer
learns the label in standard units (`LabelScale`, `label_scale`; in log scale for a skewed label),
its loss is per ensemble member (`make_loss`), and its MAE and RMSE are reported in the label's
own units (`ScaledMAE`, `ScaledRMSE`, `loss_and_metrics`). Registered with Keras, as the layers."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import keras
from keras import ops


# A regression label is learnt in log scale when it never goes below 0 and its upper spread
# (median to 99th percentile) is at least this many times its lower one: prices, salaries, counts.
LABEL_SKEW = 2.0


@dataclass(frozen=True)
class LabelScale:
    """How a regression's trainer sees the label: (y - mean) / std, of log(1 + y) when `log`."""

    mean: float
    std: float
    log: bool = False

    def to_label(self, z):
        """The trainer's units back to the label's (Keras ops): z * std + mean, then exp(.) - 1."""
        y = z * self.std + self.mean
        return ops.exp(y) - 1.0 if self.log else y


def long_right_tail(stats: dict[str, Any], ratio: float) -> bool:
    """Whether a number's statistics (stats.json) show it never below 0 (they hold its log1p
    moments) with an upper spread, median to 99th percentile, at least `ratio` times its lower
    one, 1st percentile to median."""
    q = stats.get("quantiles") or {}
    low, mid, high = q.get("0.01"), q.get("0.5"), q.get("0.99")
    if not stats.get("log1p") or None in (low, mid, high) or high <= mid:
        return False
    return (high - mid) >= ratio * (mid - low)


def skewed_label(label: dict[str, Any]) -> bool:
    """Whether a regression label's training statistics call for a log-scale target."""
    return long_right_tail(label, LABEL_SKEW)


def label_scale(train_stats: dict[str, Any], target: str = "auto", ensemble: int = 1) -> LabelScale:
    """A regression label's scale over the training split: its mean and std (std 1 when it does
    not vary), or those of log(1 + y) for a skewed label learnt by one network (`target` auto)
    or when told (log). An ensemble (see model.py's _members) learns a skewed label in its own scale too:
    the log target's answer, exp of a mean log, falls below the mean that a squared error
    rewards, and the ensemble's mean steadies what the label's scale leaves noisier in one
    network."""
    label = train_stats["label"]
    log = target == "log" or (target == "auto" and ensemble == 1 and skewed_label(label))
    if log and label.get("log1p"):
        moments = label["log1p"]
        return LabelScale(float(moments["mean"]), math.sqrt(moments["variance"]) or 1.0, True)
    return LabelScale(float(label.get("mean") or 0.0), float(label.get("std") or 1.0))


class _EachMember:
    """A regression loss that takes an ensemble's (batch, members) predictions (see model.py's _members)
    with the (batch,) label: the label is broadcast over the members and their losses averaged,
    so each member learns from its own error (the loss of their mean would train them as one
    network). One network's (batch,) predictions are taken as they are."""

    def call(self, y_true, y_pred):
        if len(y_pred.shape) == len(y_true.shape) + 1 and y_pred.shape[-1] != 1:
            y_true = ops.expand_dims(y_true, -1)
        return super().call(y_true, y_pred)


@keras.saving.register_keras_serializable(package="tfpipe")
class SquaredError(_EachMember, keras.losses.MeanSquaredError):
    """Mean squared error, of one network or each member of an ensemble (see _EachMember)."""


def make_loss(task: str, reduction: str | None = "sum_over_batch_size") -> keras.losses.Loss:
    """The task's loss; a regression's, mean squared error, of one network or of each member of
    an ensemble (see _EachMember)."""
    cls = {"binary": keras.losses.BinaryCrossentropy, "multiclass": keras.losses.SparseCategoricalCrossentropy,
           "regression": SquaredError}[task]
    return cls(reduction=reduction)


def members_mean(y_pred):
    """A regression trainer's prediction: an ensemble's (batch, members) as their mean (what the
    model answers, see Denormalize), a single network's as it is."""
    return ops.mean(y_pred, axis=-1) if len(y_pred.shape) == 2 else y_pred


@keras.saving.register_keras_serializable(package="tfpipe")
class ScaledMAE(keras.metrics.Mean):
    """Mean absolute error per example in the label's units, of a trainer that predicts the label
    in standard units (`scale`'s mean and std, of log(1 + y) when `log`)."""

    def __init__(self, std: float = 1.0, mean: float = 0.0, log: bool = False, name: str = "mae", **kwargs):
        super().__init__(name=name, **kwargs)
        self.scale = LabelScale(float(mean), float(std), bool(log))

    def update_state(self, y_true, y_pred, sample_weight=None):
        t, p = (self.scale.to_label(ops.cast(v, "float32")) for v in (y_true, members_mean(y_pred)))
        return super().update_state(ops.abs(t - p), sample_weight=sample_weight)

    def get_config(self):
        return {**super().get_config(), "std": self.scale.std, "mean": self.scale.mean, "log": self.scale.log}


@keras.saving.register_keras_serializable(package="tfpipe")
class ScaledRMSE(keras.metrics.RootMeanSquaredError):
    """RMSE in the label's units, of a trainer that predicts it in standard units (see ScaledMAE)."""

    def __init__(self, std: float = 1.0, mean: float = 0.0, log: bool = False, name: str = "rmse", **kwargs):
        super().__init__(name=name, **kwargs)
        self.scale = LabelScale(float(mean), float(std), bool(log))

    def update_state(self, y_true, y_pred, sample_weight=None):
        t, p = (self.scale.to_label(ops.cast(v, "float32")) for v in (y_true, members_mean(y_pred)))
        return super().update_state(t, p, sample_weight=sample_weight)

    def get_config(self):
        return {**super().get_config(), "std": self.scale.std, "mean": self.scale.mean, "log": self.scale.log}


def loss_and_metrics(task: str, scale: LabelScale | None = None):
    """The loss and the metrics reported for a task. A regression's trainer learns the label in
    standard units (`scale`, see label_scale): the loss stays in those units, MAE and RMSE are
    given in the label's. MAE is taken per example: Keras's MeanAbsoluteError reduces 1-D
    predictions over their last axis, the batch, first, and reported about half the true MAE on
    a table of house prices."""
    if task == "binary":
        metrics = [keras.metrics.BinaryAccuracy(name="accuracy"), keras.metrics.AUC(name="auc")]
    elif task == "multiclass":
        metrics = [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
    else:
        scale = scale or LabelScale(0.0, 1.0)
        metrics = [ScaledMAE(scale.std, scale.mean, scale.log), ScaledRMSE(scale.std, scale.mean, scale.log)]
    return make_loss(task), metrics
