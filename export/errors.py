"""The export stage's user-facing error: the CLI turns it into one line and exit code 2."""

from tfpipe import UserError


class ExportError(UserError):
    """Bad input or configuration for export (missing train dir, version taken, check failed)."""
