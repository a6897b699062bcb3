"""`tfpipe predict`'s user-facing error: the CLI turns it into one line and exit code 2."""

from tfpipe.pipeline.errors import DataError


class PredictError(DataError):
    """Bad input or configuration for tfpipe predict (no such model, a file lacking a feature column).
    A DataError, so that one raised inside a Beam worker comes back to the launcher as itself."""
