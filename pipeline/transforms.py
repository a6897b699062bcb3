"""The data job's Beam transforms, each one step of the job:

    WorkUnits -> ReadAndValidate -> AssignSplits -> EncodeExamples -> WriteShards
                       |                  |
                       |                  +-> KeyBySplit -> StatsPerSplit -> WriteStats
                       +-> (bad rows) WriteDeadLetter

An element is a batch of rows (a block of input, a few thousand rows), never a single
row, so the per-element cost of the runner is paid per batch. No step shuffles row data:
the runner fuses the chain from ReadAndValidate to WriteShards into one stage, and only
small statistics accumulators cross a shuffle. Each work unit owns its shard files, so
workers never write to the same file.

A unit's last element on both of the reader's outputs is a `UnitEnd`: the writers close
that unit's files when it arrives and WriteShards leaves the unit's summary (counts,
files, first bad rows) for the launcher to reconcile. The order holds on every runner
because the steps are fused: a runner (FnApiRunner, Flink's and Spark's job servers alike)
hands the chain to Beam's Python SDK harness as one stage, which passes each element a
step yields down the rest of the chain before the step goes on; a work unit is one input
element, so it is read whole within one bundle, and a retried bundle starts the unit's
files anew. Should a runner break that, WriteShards stops the job on a record that comes
after its unit's end, and the launcher on counts that disagree, rather than publish.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems

from tfpipe.pipeline.inputs import WorkUnit
from tfpipe.pipeline.readers import read_segment
from tfpipe.pipeline.validation import Batch, Column, Validator
from tfpipe.pipeline.schema import Schema
from tfpipe.pipeline.stats import SplitStatsFn
from tfpipe.pipeline.tfexample import ExampleEncoder, GzipTFRecordWriter

HASH_BUCKETS = 10000
BAD = "bad"  # the reader's tagged output of dead-letter rows (and of unlabelled rows, set aside)
UNLABELLED = "unlabelled"  # the folder unlabelled rows are set aside in
FIRST_BAD = 5  # bad rows kept per unit for the error message


def row_hashes(texts: list[str]) -> np.ndarray:
    """A stable 64-bit hash of each text (uint64)."""
    digests = b"".join(hashlib.blake2b(t.encode("utf-8"), digest_size=8).digest() for t in texts)
    return np.frombuffer(digests, dtype="<u8")


def split_bounds(split: dict[str, int]) -> np.ndarray:
    weights = np.array(list(split.values()), dtype=np.float64)
    return np.round(np.cumsum(weights) / weights.sum() * HASH_BUCKETS).astype(np.int64)


def split_texts(batch: Batch) -> list[str]:
    """The text each good row of a batch is hashed by: its --key value, or its raw row."""
    if batch.keys is None:
        return batch.raws
    return [k if k != "" else r for k, r in zip(batch.keys, batch.raws)]


def class_key(value) -> str:
    """A label value as the key of its class's stratum."""
    return str(value)


def strata_bounds(hashes: dict[str, np.ndarray], split: dict[str, int]) -> dict[str, np.ndarray]:
    """Per class, bounds on the 64-bit row hash that give each split its weight's share of the
    class's rows: the class's hashes sorted, the first round(n * 0.8) go to train (for 80/10/10),
    and so on. Rows with equal hashes (equal rows) stay together. A row of a class not counted
    here is split by its hash bucket alone."""
    weights = np.array(list(split.values()), dtype=np.float64)
    cuts = np.cumsum(weights)[:-1] / weights.sum()
    out = {}
    for cls, h in hashes.items():
        h = np.sort(np.asarray(h, dtype=np.uint64))
        ranks = np.floor(len(h) * cuts + 0.5).astype(np.int64)
        out[cls] = np.array([h[r] if r < len(h) else (1 << 64) - 1 for r in ranks], dtype=np.uint64)
    return out


def assign_splits(texts: list[str], labels, bounds: np.ndarray, strata: dict[str, np.ndarray] | None) -> np.ndarray:
    """Split index of each row: by its class's stratum bounds (`strata_bounds`) when given, else
    by its hash bucket in the cumulative split bounds (`split_bounds`)."""
    hashes = row_hashes(texts)
    which = np.searchsorted(bounds, hashes % HASH_BUCKETS, side="right")
    if strata:
        keys = np.array([class_key(v) for v in labels], dtype=object)
        for cls in set(keys.tolist()):
            b = strata.get(cls)
            if b is not None:
                rows = keys == cls
                which[rows] = np.searchsorted(b, hashes[rows], side="right")
    return which


def shard_name(split: str, shard: int, shards: int) -> str:
    return f"{split}-{shard:05d}-of-{shards:05d}.tfrecord.gz"


# ---- what flows between the steps --------------------------------------------------------------

@dataclass
class UnitBatch:
    """Good rows of one work unit, validated and typed."""

    unit: int
    batch: Batch


@dataclass
class BadRows:
    """Rows of one work unit written aside as JSON lines: dead-letter entries (reason, source,
    line, raw text) into `deadletter/`, or unlabelled rows (source, line, raw) into `unlabelled/`."""

    unit: int
    rows: list[dict]
    folder: str = "deadletter"


@dataclass
class SplitBatch:
    """The rows of a batch that hash to one split; `records` once encoded."""

    unit: int
    split: str
    columns: dict[str, Column]
    records: list[bytes] | None = None


@dataclass
class UnitEnd:
    """A work unit is read: the reader's counts, and the last element of that unit."""

    unit: int
    read: int
    bad: int
    first_bad: list[dict] = field(default_factory=list)
    unlabelled: int = 0


# ---- the steps -----------------------------------------------------------------------------------

# A test hook: "UNIT:MARKER" makes work unit UNIT fail after handing on its first batch, on the
# attempt that creates the file MARKER, and only that one: what a worker lost mid-unit looks like
# to the runner, which must retry the unit and leave the output as if nothing had failed.
FAIL_ONCE = "TFPIPE_TEST_FAIL_ONCE"


def fail_once(unit: int) -> None:
    spec = os.environ.get(FAIL_ONCE)
    if not spec:
        return
    index, _, marker = spec.partition(":")
    if int(index) != unit:
        return
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return  # a later attempt: it runs as usual
    raise RuntimeError(f"{FAIL_ONCE}: work unit {unit} fails on its first attempt ({marker})")


class ReadAndValidate(beam.DoFn):
    """Streams a work unit's byte ranges; good rows go out as batches, bad rows tagged BAD."""

    def __init__(self, schema_json: dict, enforced: bool, na_values: list[str]):
        self.schema_json, self.enforced, self.na_values = schema_json, enforced, na_values

    def setup(self) -> None:
        self.validator = Validator(Schema.from_json(self.schema_json, enforced=self.enforced), self.na_values)

    def process(self, unit: WorkUnit):
        read = bad = unlabelled = 0
        first_bad: list[dict] = []
        for seg in unit.segments:
            for batch in read_segment(seg, self.validator):
                read += len(batch) + len(batch.bad) + len(batch.unlabelled)
                if batch.bad:
                    bad += len(batch.bad)
                    first_bad.extend(batch.bad[: max(0, FIRST_BAD - len(first_bad))])
                    yield beam.pvalue.TaggedOutput(BAD, BadRows(unit.index, batch.bad))
                if batch.unlabelled:
                    unlabelled += len(batch.unlabelled)
                    yield beam.pvalue.TaggedOutput(BAD, BadRows(unit.index, batch.unlabelled, UNLABELLED))
                if len(batch):
                    yield UnitBatch(unit.index, batch)
                    fail_once(unit.index)
        end = UnitEnd(unit.index, read, bad, first_bad, unlabelled)
        yield beam.pvalue.TaggedOutput(BAD, end)
        yield end


class AssignSplits(beam.DoFn):
    """Cuts a batch into one SplitBatch per split, by a stable hash of the key or raw row; with
    `strata` (class -> hash bounds, from `strata_bounds`), by the row's class's own bounds."""

    def __init__(self, split: dict[str, int], label: str | None = None, strata: dict[str, np.ndarray] | None = None):
        self.names = list(split)
        self.bounds = split_bounds(split)
        self.label = label
        self.strata = strata or {}

    def process(self, element: UnitBatch | UnitEnd):
        if isinstance(element, UnitEnd):
            yield element
            return
        batch = element.batch
        labels = batch.columns[self.label].values if self.strata else None
        which = assign_splits(split_texts(batch), labels, self.bounds, self.strata)
        for s, name in enumerate(self.names):
            rows = np.flatnonzero(which == s)
            if len(rows):
                columns = {k: Column(c.values[rows], c.present[rows]) for k, c in batch.columns.items()}
                yield SplitBatch(element.unit, name, columns)


class EncodeExamples(beam.DoFn):
    """Serializes a SplitBatch's rows as tf.train.Example records, column by column."""

    def __init__(self, schema_json: dict, enforced: bool):
        self.schema_json, self.enforced = schema_json, enforced

    def setup(self) -> None:
        self.encoder = ExampleEncoder(Schema.from_json(self.schema_json, enforced=self.enforced).columns)

    def process(self, element: SplitBatch | UnitEnd):
        if isinstance(element, SplitBatch):
            element = SplitBatch(element.unit, element.split, element.columns, self.encoder.encode(element.columns))
        yield element


class _UnitFiles:
    """The open shard writers of one work unit, rows dealt round-robin over its shards."""

    def __init__(self, out_dir: str, names: list[str], owned: tuple[int, ...], shards: int, level: int):
        self.owned = owned
        self.writers = {(name, shard): GzipTFRecordWriter(
            FileSystems.join(out_dir, shard_name(name, shard, shards)), level) for name in names for shard in owned}
        self.dealt = dict.fromkeys(names, 0)

    def write(self, split: str, records: list[bytes]) -> None:
        n = len(self.owned)
        start = self.dealt[split]
        for j in range(min(n, len(records))):
            self.writers[(split, self.owned[(start + j) % n])].write(records[j::n])
        self.dealt[split] += len(records)

    def close(self) -> dict:
        files = {}
        for (name, _), w in self.writers.items():
            w.close()
            files[os.path.basename(w.path)] = {"split": name, "records": w.records, "bytes": w.bytes_written}
        return files


class WriteShards(beam.DoFn):
    """Writes encoded records to the unit's own shard files; at UnitEnd, closes them and
    leaves the unit's summary in `_units/` (what the launcher reconciles and counts progress by)."""

    def __init__(self, out_dir: str, split: dict[str, int], owned: dict[int, tuple[int, ...]], shards: int,
                 level: int):
        self.out_dir, self.names, self.owned, self.shards, self.level = out_dir, list(split), owned, shards, level

    def start_bundle(self) -> None:
        self.open: dict[int, _UnitFiles] = {}
        self.ended: set[int] = set()

    def _files(self, unit: int) -> _UnitFiles:
        if unit in self.ended:  # would reopen (truncate) the unit's finished files
            raise RuntimeError(f"work unit {unit}: records arrived after its end; the runner did not keep a unit's "
                               "elements in order, and the job stops rather than write a partial unit")
        if unit not in self.open:
            self.open[unit] = _UnitFiles(self.out_dir, self.names, self.owned[unit], self.shards, self.level)
        return self.open[unit]

    def process(self, element: SplitBatch | UnitEnd):
        files = self._files(element.unit)
        if isinstance(element, SplitBatch):
            files.write(element.split, element.records)
            return
        del self.open[element.unit]
        self.ended.add(element.unit)
        summary = {"unit": element.unit, "read": element.read, "bad": element.bad,
                   "unlabelled": element.unlabelled, "splits": files.dealt, "files": files.close(),
                   "first_bad": element.first_bad}
        path = FileSystems.join(self.out_dir, "_units", f"unit-{element.unit:05d}.json")
        with FileSystems.create(path) as f:
            f.write(json.dumps(summary).encode())

    def finish_bundle(self) -> None:
        # A unit whose end never came leaves no summary: the launcher fails the job on that.
        for files in self.open.values():
            files.close()
        self.open.clear()


class WriteDeadLetter(beam.DoFn):
    """Appends a unit's bad rows as JSON lines to `deadletter/part-UNIT.jsonl`, and its unlabelled
    rows to `unlabelled/part-UNIT.jsonl` (only units that have some)."""

    def __init__(self, out_dir: str):
        self.out_dir = out_dir

    def start_bundle(self) -> None:
        self.open: dict[tuple[int, str], object] = {}

    def process(self, element: BadRows | UnitEnd):
        if isinstance(element, UnitEnd):
            for where in [w for w in self.open if w[0] == element.unit]:
                self.open.pop(where).close()
            return
        where = (element.unit, element.folder)
        if where not in self.open:
            self.open[where] = FileSystems.create(
                FileSystems.join(self.out_dir, element.folder, f"part-{element.unit:05d}.jsonl"))
        self.open[where].write(
            "".join(json.dumps(b, ensure_ascii=False) + "\n" for b in element.rows).encode())

    def finish_bundle(self) -> None:
        for f in self.open.values():
            f.close()
        self.open.clear()


def key_by_split(element: SplitBatch | UnitEnd):
    if isinstance(element, SplitBatch):
        yield element.split, element.columns


def write_split_stats(item: tuple[str, dict], out_dir: str) -> None:
    split, stats = item
    with FileSystems.create(FileSystems.join(out_dir, "_stats", f"{split}.json")) as f:
        f.write(json.dumps(stats).encode())


class TFRecordsFromUnits(beam.PTransform):
    """Work units in; shard files, dead-letter files, unit summaries and per-split stats out."""

    def __init__(self, schema: Schema, split: dict[str, int], shards: int, owned: dict[int, tuple[int, ...]],
                 out_dir: str, level: int, na_values: list[str], top_k: int,
                 strata: dict[str, np.ndarray] | None = None):
        super().__init__()
        self.label_name, self.strata = schema.label.name, strata
        self.schema_json, self.enforced = schema.to_json(), schema.enforced
        self.split, self.shards, self.owned, self.out_dir = split, shards, owned, out_dir
        self.level, self.na_values, self.top_k = level, na_values, top_k

    def expand(self, units):
        rows = units | "ReadAndValidate" >> beam.ParDo(
            ReadAndValidate(self.schema_json, self.enforced, self.na_values)).with_outputs(BAD, main="good")
        _ = rows[BAD] | "WriteDeadLetter" >> beam.ParDo(WriteDeadLetter(self.out_dir))
        splits = rows.good | "AssignSplits" >> beam.ParDo(AssignSplits(self.split, self.label_name, self.strata))
        _ = (
            splits
            | "EncodeExamples" >> beam.ParDo(EncodeExamples(self.schema_json, self.enforced))
            | "WriteShards" >> beam.ParDo(WriteShards(self.out_dir, self.split, self.owned, self.shards, self.level))
        )
        return (
            splits
            | "KeyBySplit" >> beam.FlatMap(key_by_split)
            | "StatsPerSplit" >> beam.CombinePerKey(SplitStatsFn(self.schema_json, self.top_k))
            | "WriteStats" >> beam.Map(write_split_stats, self.out_dir)
        )
