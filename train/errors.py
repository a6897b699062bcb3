"""The training stage's user-facing error: the CLI turns it into one line and exit code 2."""


class TrainError(Exception):
    """Bad input or configuration for training (missing data dir, bad flag, diverged loss)."""
