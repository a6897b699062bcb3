"""The user-facing error of promote, rollback and rollout: the CLI turns it into one line, exit 2."""

from tfpipe import UserError


class RolloutError(UserError):
    """A user error (no such model directory or version, nothing to roll back to): one line, exit 2."""
