"""The training stage's user-facing error: the CLI turns it into one line and exit code 2."""

from tfpipe import UserError


class TrainError(UserError):
    """Bad input or configuration for training (missing data dir, bad flag, diverged loss)."""


class DivergedError(Exception):
    """The loss became NaN or Inf; raised out of the training loop so the last backup stays."""

    def __init__(self, epoch: int, step: int, loss: float):
        super().__init__(f"loss became {loss} at epoch {epoch}, step {step}")
