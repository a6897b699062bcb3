"""The data stage's user-facing error: the CLI turns it into one line and exit code 2."""


class DataError(Exception):
    """Bad input or configuration for the data stage (missing file, bad schema, too many bad rows)."""
