"""How tfpipe starts a Python process of its own (a serving worker, a load generator, a tuning
trial's server, a Beam stage in its engine environment): `python -P -m MODULE`, so that the
current directory does not come first on the child's import path. With `-m` alone, a command run
from a folder that holds a folder named `tfpipe` (the parent of a clone of this repository) had
its children import that folder as the package, and fail."""

from __future__ import annotations

import sys


def module_argv(module: str, *args: str, python: str = sys.executable) -> list[str]:
    """The command that runs `module` with `args` in `python` (an interpreter of Python 3.11 or
    later, as tfpipe needs: `-P` is 3.11's)."""
    return [python, "-P", "-m", module, *args]
