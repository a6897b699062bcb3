"""What every stage hands `tfpipe run` once it has run (a leaf: it imports nothing of tfpipe, so
every stage may import it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class StageResult:
    """A stage's manifest file (its hash goes into the later steps' fingerprints), the outputs the
    later steps read (its directory, a model's name and version, a gate's verdict), a one-line
    summary, and the stage's exit code (1 when its gate, an SLO or the skew check, failed)."""

    manifest: str
    summary: str
    outputs: dict[str, Any] = field(default_factory=dict)
    code: int = 0
