"""Errors a user can fix, and the exit codes of every tfpipe command. Imported by the CLI and
the orchestrator alike; it imports neither."""

from __future__ import annotations

EXIT_FAILED, EXIT_USER_ERROR, EXIT_INTERRUPTED = 1, 2, 130  # a bug; a user error; Ctrl-C or SIGTERM


class ConfigError(Exception):
    """A config file or flag that does not validate; the CLI shows it as one line, exit 2."""


class RunError(Exception):
    """A run that cannot start or continue for a reason the user can fix (exit 2)."""


def user_errors() -> tuple[type[Exception], ...]:
    """Errors a user can fix: shown as one line, exit code 2. Anything else is a bug (exit 1)."""
    from tfpipe.export.errors import ExportError
    from tfpipe.loadtest.errors import LoadtestError
    from tfpipe.pipeline.errors import DataError
    from tfpipe.serve.errors import ServeError
    from tfpipe.skew.errors import SkewError
    from tfpipe.train.errors import TrainError
    from tfpipe.tune.errors import TuneError

    return (ConfigError, RunError, DataError, TrainError, ExportError, ServeError, LoadtestError, SkewError,
            TuneError)
