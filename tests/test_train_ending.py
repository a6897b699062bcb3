"""How long training runs without --epochs (until early stopping, within a time limit), and what
the summary says ended it: the data (early stopping), or a budget while the eval loss still fell."""

from __future__ import annotations

import pytest

from tfpipe.train.config import DEFAULT_TIME_LIMIT, UNTIL_STOPPED, TrainConfig


@pytest.mark.parametrize("given,examples,want", [
    ({}, 275, {"epochs": UNTIL_STOPPED, "time_limit": DEFAULT_TIME_LIMIT, "patience": 5, "min_epochs": 17}),
    ({}, 120, {"epochs": UNTIL_STOPPED, "patience": 12, "min_epochs": 38}),  # few steps an epoch: more patience
    ({"time_limit": 60.0}, 275, {"epochs": UNTIL_STOPPED, "time_limit": 60.0}),
    ({"epochs": 20}, 275, {"epochs": 20, "time_limit": None, "patience": 5, "min_epochs": 10}),  # a hard cap
])
def test_without_epochs_training_runs_until_early_stopping_within_a_time_limit(given, examples, want):
    config, note = TrainConfig(**given).sized(examples)
    assert {k: getattr(config, k) for k in want} == want
    assert ("until early stopping" in note) == ("epochs" not in given)


class _Log:
    def __init__(self, losses, timed_out=False):
        self.epochs = [{"epoch": i + 1, "val_loss": v} for i, v in enumerate(losses)]
        self.timed_out = timed_out


@pytest.mark.parametrize("losses,timed_out,config,want,text", [
    ([1.0, 0.8, 0.7, 0.71, 0.72, 0.73, 0.74, 0.75], False, {"epochs": UNTIL_STOPPED, "patience": 5},
     ("early stopping", 3, False), "8 epochs (early stopping: eval loss not better for 5 epochs)"),
    ([1.0, 0.9, 0.8, 0.7], True, {"epochs": UNTIL_STOPPED, "patience": 5, "time_limit": 600.0},
     ("time limit", 4, True), "4 epochs, ended by the time limit of 600 s while the eval loss still fell (best at "
                              "epoch 4): not converged, --time-limit (train.time_limit) gives it longer"),
    ([1.0, 0.5, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6], True, {"epochs": UNTIL_STOPPED, "patience": 5, "time_limit": 60.0},
     ("time limit", 2, False), "8 epochs (the time limit of 60 s)"),
    ([1.0, 0.9, 0.8], False, {"epochs": 3, "patience": 5},
     ("epochs", 3, True), "3 epochs, ended by its 3 epochs while the eval loss still fell (best at epoch 3): not "
                          "converged, --epochs (train.epochs) gives it longer"),
    ([0.5] + [0.6] * 19, False, {"epochs": 20, "patience": 20},  # a patience as long as the run
     ("epochs", 1, False), "20 epochs"),
    ([1.0] * 14 + [0.5] + [0.6] * 5, False, {"epochs": 20, "patience": 20},
     ("epochs", 15, True), "20 epochs, ended by its 20 epochs while the eval loss still fell (best at epoch 15): "
                           "not converged, --epochs (train.epochs) gives it longer"),
    ([1.0, 0.5, 0.9, 0.9], False, {"epochs": 10, "patience": 2},
     ("early stopping", 2, False), "4 of 10 epochs (early stopping: eval loss not better for 2 epochs)"),
])
def test_the_summary_says_what_ended_training(losses, timed_out, config, want, text):
    from tfpipe.train.job import ending, epochs_text

    got = ending(_Log(losses, timed_out), TrainConfig(**config))
    assert (got["ended_by"], got["best_epoch"], got["still_improving"]) == want
    assert epochs_text({"epochs_run": len(losses), "config": config, **got}) == text


@pytest.mark.parametrize("config,want", [({"epochs": UNTIL_STOPPED}, 1e-4), ({"epochs": 40}, 0.0)])
def test_until_early_stopping_a_better_epoch_must_lower_the_loss_by_a_little(config, want):
    """Without a cap, a loss creeping toward 0 on a split the model separates must not reset the
    patience for ever; a capped run counts any drop, as before."""
    from tfpipe.train.callbacks import min_delta

    assert min_delta(TrainConfig(**config)) == want
