"""The data stage's user-facing error: the CLI turns it into one line and exit code 2."""

import re

from tfpipe import UserError

# Beam re-raises a worker's exception wrapped in its own, or as text from another process;
# this marker lets the launcher find a user error inside whatever comes back.
_MARK = "[tfpipe user error] "


class DataError(UserError):
    """Bad input or configuration for the data stage (missing file, bad schema, too many bad rows)."""


class RunnerError(DataError):
    """The Beam runner refused or failed the job (a job server's error, a failed engine job): one
    line naming the runner and what it said, exit code 2 like any other error the user can act on."""


def worker_data_error(message: str) -> DataError:
    """A DataError raised inside a Beam worker, recognisable after Beam wraps it."""
    return DataError(_MARK + message)


def find_data_error(exc: BaseException) -> DataError | None:
    """The user error a failed pipeline carries, if any."""
    found = re.search(re.escape(_MARK) + r"(.+?)(?: \[while running|$|\\n|')", str(exc), re.M)
    return DataError(found.group(1)) if found else None
