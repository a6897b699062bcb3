"""`tfpipe loadtest`'s user-facing error: the CLI turns it into one line and exit code 2."""

from tfpipe import UserError


class LoadtestError(UserError):
    """A user error (unreachable target, unknown model, bad SLO): one line, exit 2."""
