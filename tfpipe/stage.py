"""What every stage hands `tfpipe run` once it has run: a StageResult carrying its typed outputs.
A leaf: it imports nothing of tfpipe, so every stage may import it.

The outputs classes are the contracts between steps: what a later step reads of an earlier one
(a directory, a model's name and version, a gate's verdict). The run manifest stores them as JSON
and rebuilds them for a later run whose earlier steps are cached."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypeVar

O = TypeVar("O", bound="StageOutputs")


@dataclass(frozen=True)
class StageOutputs:
    """Every stage's outputs: the directory it published."""

    path: str

    def as_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls: type[O], stored: dict[str, Any]) -> O:
        """The outputs as a run manifest stored them (other keys in `stored`, the manifest's path
        and hash, are the run's own)."""
        required = [f for f in dataclasses.fields(cls)
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        missing = [f.name for f in required if f.name not in stored]
        if missing:
            raise KeyError(f"{cls.__name__}: the stored outputs lack {', '.join(missing)}")
        return cls(**{f.name: stored[f.name] for f in dataclasses.fields(cls) if f.name in stored})


@dataclass(frozen=True)
class DataOutputs(StageOutputs):
    """The data stage's snapshot: its directory of TFRecords, schema and stats, and its fingerprint."""

    fingerprint: str


@dataclass(frozen=True)
class TrainOutputs(StageOutputs):
    """The trained model's directory and the fingerprint of its training run."""

    fingerprint: str


@dataclass(frozen=True)
class ExportOutputs(StageOutputs):
    """The version served after the export (`path` is its directory, base/name/version): the new
    one when it was published or promoted, the baseline when the gate held or refused the new one
    (`candidate`, kept in base/name/candidates/); `decision` says which."""

    name: str
    version: int
    candidate: int | None = None
    decision: str = "published"


@dataclass(frozen=True)
class ServeOutputs(StageOutputs):
    """The directory of the served configs and serve.json."""


@dataclass(frozen=True)
class LoadtestOutputs(StageOutputs):
    """The load test's results directory and its SLO verdict (None: no SLO was set)."""

    slo_passed: bool | None


@dataclass(frozen=True)
class SkewOutputs(StageOutputs):
    """The skew check's directory and verdict (None: skipped)."""

    passed: bool | None


@dataclass(frozen=True)
class TuneOutputs(StageOutputs):
    """The tune's directory (batching.config, tune.json) and its best candidate's label."""

    best: str


@dataclass(frozen=True)
class RolloutOutputs(StageOutputs):
    """The rollout step's directory, its decision on the new version (published, promoted, held,
    refused) and the version served after it."""

    decision: str
    served: int


@dataclass(frozen=True)
class StageResult:
    """A stage's manifest file (its hash goes into the later steps' fingerprints), its typed
    outputs, a one-line summary, and the stage's exit code (1 when its gate, an SLO or the skew
    check, failed)."""

    manifest: str
    summary: str
    outputs: StageOutputs
    code: int = 0
    notes: tuple[str, ...] = ()  # what the stage decided that a user should see below its summary line
