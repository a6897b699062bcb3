"""The export stage's user-facing error: the CLI turns it into one line and exit code 2."""


class ExportError(Exception):
    """Bad input or configuration for export (missing train dir, version taken, check failed)."""
