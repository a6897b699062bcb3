"""Batching parameters: TF Serving's BatchingParameters as one type (BatchOptions), the
starting point `tfpipe run` serves with, and how a request's rows are cut into model calls
(with batching off, --max_call_rows). No numpy at import: the CLI and the [serve] section's
validation import this at start; the batcher that uses it is serve/core/batcher.py."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tfpipe.machine import cores


@dataclass(frozen=True)
class BatchOptions:
    """TF Serving's BatchingParameters, the one type for them: what the server batches by, what
    `tfpipe run` writes from its [serve] section (`ServeConfig.batch_options`) and what `tfpipe
    tune` tries (its `Candidate` adds the worker count)."""

    max_batch_size: int = 1000
    batch_timeout_micros: int = 0
    num_batch_threads: int = cores()
    max_enqueued_batches: int = 10
    allowed_batch_sizes: tuple[int, ...] = ()
    enable_large_batch_splitting: bool = False
    max_execution_batch_size: int = 0  # 0: max_batch_size

    @classmethod
    def from_proto(cls, p) -> BatchOptions:
        given: dict = {name: int(getattr(p, name).value) for name in (
            "max_batch_size", "batch_timeout_micros", "max_enqueued_batches", "num_batch_threads",
            "max_execution_batch_size") if p.HasField(name)}
        if p.HasField("enable_large_batch_splitting"):
            given["enable_large_batch_splitting"] = bool(p.enable_large_batch_splitting.value)
        o = cls(**given, allowed_batch_sizes=tuple(sorted(int(x) for x in p.allowed_batch_sizes)))
        o.check()
        return o

    def to_json(self) -> dict:
        """Every field, as JSON (tune.json's candidates, a run's [serve] section)."""
        return {**dataclasses.asdict(self), "allowed_batch_sizes": list(self.allowed_batch_sizes)}

    @classmethod
    def from_json(cls, d: dict):
        """The options `to_json` wrote; a field it lacks takes its default."""
        return cls(**{**d, "allowed_batch_sizes": tuple(d.get("allowed_batch_sizes", ()))})

    def to_proto(self):
        """tensorflow.serving.BatchingParameters (batching.config) with these settings."""
        from tfpipe.serve.tfserving.protos import BatchingParameters

        p = BatchingParameters()
        p.max_batch_size.value = self.max_batch_size
        p.batch_timeout_micros.value = self.batch_timeout_micros
        p.max_enqueued_batches.value = self.max_enqueued_batches
        p.num_batch_threads.value = self.num_batch_threads
        p.allowed_batch_sizes.extend(self.allowed_batch_sizes)
        if self.enable_large_batch_splitting:
            p.enable_large_batch_splitting.value = True
        if self.max_execution_batch_size:
            p.max_execution_batch_size.value = self.max_execution_batch_size
        return p

    @property
    def execution_size(self) -> int:
        """The most rows one model call takes."""
        if self.enable_large_batch_splitting and self.max_execution_batch_size > 0:
            return self.max_execution_batch_size
        return self.max_batch_size

    def check(self) -> None:
        """ValueError naming what TF Serving would refuse in these parameters; the one place the
        rules are checked (batching.config as read, tfpipe run's [serve] section, tune's candidates)."""
        if self.max_batch_size < 1 or self.num_batch_threads < 1 or self.max_enqueued_batches < 1:
            raise ValueError("max_batch_size, num_batch_threads and max_enqueued_batches must be >= 1")
        sizes = self.allowed_batch_sizes
        if any(b <= a for a, b in zip(sizes, sizes[1:])) or any(x < 1 for x in sizes):
            raise ValueError(f"allowed_batch_sizes must be positive and rising, e.g. [8, 16, 32]; got {list(sizes)}")
        if sizes and sizes[-1] != self.execution_size:
            # TF Serving's own rule: the last allowed size must equal the largest batch.
            raise ValueError(f"the last entry of allowed_batch_sizes ({self.allowed_batch_sizes[-1]}) must "
                             f"equal max_batch_size ({self.execution_size})")


# What `tfpipe run` batches with when [serve] enable_batching is on and no key is given. TF
# Serving's own defaults (BatchOptions' field defaults, for a batching.config that leaves a
# field out) batch up to 1000 rows with no wait and 10 queued batches; for one model answering
# a load test on a few cores, 32 rows waiting at most 1 ms with 100 queued batches is the
# usual starting point, and `tfpipe tune` measures better ones.
RUN_BATCHING = BatchOptions(max_batch_size=32, batch_timeout_micros=1000, max_enqueued_batches=100)


def batch_shapes(inputs: dict) -> tuple | None:
    """What a request must share with the others of its batch (numpy arrays by input name): each
    input's name, dtype and shape past the batch dimension (dtype objects, not their names: numpy's
    dtype.str builds a string on every call), by name. None when the inputs cannot batch: a scalar,
    or batch dimensions that are zero or differ."""
    size, shapes = None, []
    for name, value in inputs.items():
        shape = value.shape
        if not shape or shape[0] == 0 or (size is not None and shape[0] != size):
            return None
        size = shape[0]
        shapes.append((name, value.dtype, shape[1:]))
    shapes.sort(key=lambda s: s[0])
    return tuple(shapes) if shapes else None


def row_parts(inputs: dict, rows: int) -> list[dict] | None:
    """`inputs` cut into successive parts of at most `rows` rows each (views, no copies), when they
    have more and can be cut: every input has the same first dimension (what batching needs too).
    None: one call takes them whole (`rows` 0, few enough rows, or inputs that do not batch)."""
    if rows <= 0 or not inputs:
        return None
    first = next(iter(inputs.values())).shape
    if not first or first[0] <= rows or batch_shapes(inputs) is None:  # (the common case: one cheap look)
        return None
    total = first[0]
    return [{k: v[start:start + rows] for k, v in inputs.items()} for start in range(0, total, rows)]


def join_rows(parts: list[dict], rows: list[int]) -> dict | None:
    """The outputs of successive calls on `rows` rows each, put together as one call's; None when an
    output is not one row per input row (a scalar, a per-call statistic): such a signature's
    outputs cannot be split and joined, and it has to be called on the whole request."""
    import numpy as np

    for part, n in zip(parts, rows):
        if any(v.ndim == 0 or v.shape[0] != n for v in part.values()):
            return None
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
