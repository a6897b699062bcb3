"""`tfpipe tune`'s user-facing error: the CLI turns it into one line and exit code 2."""

from tfpipe import UserError


class TuneError(UserError):
    """A user error (no model at the path, no request source, a server that will not start): one line, exit 2."""
