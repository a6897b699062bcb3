"""tfpipe: raw data to a served, load-tested TensorFlow model.

The stages are subpackages (tfpipe.pipeline, tfpipe.train, tfpipe.export, tfpipe.serve,
tfpipe.loadtest); tfpipe.cli and tfpipe.run drive them. Importing this package imports no
stage and no TensorFlow."""

import contextlib
import logging
import os
import sys
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("tfpipe")
except PackageNotFoundError:  # a source tree that is not installed
    __version__ = "0.0.0+source"

__all__ = ["EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_USER_ERROR", "UserError", "__version__", "quiet_native_stderr"]

EXIT_FAILED, EXIT_USER_ERROR, EXIT_INTERRUPTED = 1, 2, 130  # a bug; a user error; Ctrl-C or SIGTERM


class UserError(Exception):
    """An error the user can fix (a bad path, flag or input): every stage's own error class
    derives from it, and a command shows it as one line and exits EXIT_USER_ERROR. Anything
    else is a bug (EXIT_FAILED)."""


@contextlib.contextmanager
def quiet_native_stderr(quiet: bool):
    """Silence what native code writes straight to fd 2 (TensorFlow 2.21 prints CUDA-stub
    lines on import that no log-level variable suppresses); `quiet=False` (--debug) keeps them."""
    if not quiet:
        yield
        return
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


class _ColumnNamesKept(logging.Filter):
    """Drops TensorFlow's warning that a column's own name (`Sepal.Length`, `measured on`) "is not
    a valid tf.function parameter name" and is sanitized, which it prints when a model's signatures
    are made (export) and loaded (serve): the signatures take the column's name (export's
    finish_signatures), so the warning would tell the user the opposite of what happens to their
    names."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "is not a valid tf.function parameter name" not in record.getMessage()


logging.getLogger("absl").addFilter(_ColumnNamesKept())
