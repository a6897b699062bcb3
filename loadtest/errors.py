class LoadtestError(Exception):
    """A user error (unreachable target, unknown model, bad SLO): one line, exit 2."""
