"""Errors a user can fix, and the exit codes of every tfpipe command. Imported by the CLI and
the orchestrator alike; it imports neither. The stages' own errors derive from `UserError`
(in the `tfpipe` package itself, which every stage may import)."""

from __future__ import annotations

from tfpipe import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USER_ERROR, UserError

__all__ = ["EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_USER_ERROR", "ConfigError", "RunError", "UserError"]


class ConfigError(UserError):
    """A config file or flag that does not validate; the CLI shows it as one line, exit 2."""


class RunError(UserError):
    """A run that cannot start or continue for a reason the user can fix (exit 2)."""
