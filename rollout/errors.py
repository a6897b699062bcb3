from tfpipe import UserError


class RolloutError(UserError):
    """A user error (no such model directory or version, nothing to roll back to): one line, exit 2."""
