"""A run workdir's manifest.json, read by `tfpipe run` and `tfpipe show`."""

from __future__ import annotations

import json
import os
from typing import Any

from tfpipe.errors import RunError

def read_manifest(workdir: str) -> dict[str, Any]:
    """The workdir's manifest; {} when there is none yet."""
    try:
        with open(os.path.join(workdir, "manifest.json")) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise RunError(f"{workdir}/manifest.json is unreadable ({e}); move it away to start afresh") from None
