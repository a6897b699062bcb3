from tfpipe import UserError


class LoadtestError(UserError):
    """A user error (unreachable target, unknown model, bad SLO): one line, exit 2."""
