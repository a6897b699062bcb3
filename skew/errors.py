"""`tfpipe skew`'s user-facing error: the CLI turns it into one line and exit code 2."""

from tfpipe import UserError


class SkewError(UserError):
    """A user error (no logs under the prefix, not a tabular data dir, a bad threshold): one line, exit 2."""
