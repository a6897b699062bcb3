"""`tfpipe data --format images`: labelled images to validated, split, sharded gzip TFRecords.

Inputs are a folder with one subfolder per class (Keras's `image_dataset_from_directory`
layout), or a CSV/JSONL manifest with an image path (relative to the manifest) and a label.
The Beam pipeline:

    ImageUnits -> ReadAndCheckImages -> WriteShards
                         |--(bad)----> WriteDeadLetter
                         +--(stats)--> StatsPerSplit -> WriteStats

Each image is decoded in full (a truncated file is caught here, not in training); a file
that is empty, not an image, truncated, too small, or of an unknown class goes to the
dead-letter with its path and reason. Good images are written as their own encoded bytes
(re-encoded only with --resize), split by a stable hash of their path relative to the
input (each class's hashes cut at its own bounds, so that every split holds its share of
each class), with the conventional `image/...` keys. The writers, the dead-letter and the unit
summaries are the row path's (`pipeline/transforms.py`), and the launcher reconciles the
counts the same way: every file is written or dead-lettered.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import time
from dataclasses import dataclass
from typing import Callable

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems

from tfpipe.files import cache_key
from tfpipe.pipeline.autodetect import SAMPLE_BYTES, detect_delimiter
from tfpipe.pipeline.config import DataConfig, parse_size
from tfpipe.pipeline.errors import DataError
from tfpipe.pipeline.images import ImageInfo, ImageStats, Rejection, image_example, inspect_image
from tfpipe.pipeline.inputs import is_remote
from tfpipe.pipeline.outputs import (check_counts, data_manifest, print_summary, publish, published_names,
                                     read_data_manifest, read_split_stats, read_unit_summaries, tally, write_outputs)
from tfpipe.pipeline.runner import beam_options, run_to_temp
from tfpipe.pipeline.stats import QUANTILES
from tfpipe.pipeline.transforms import (BAD, FIRST_BAD, BadRows, SplitBatch, UnitEnd, WriteDeadLetter, WriteShards,
                                        assign_splits, row_hashes, split_bounds, strata_bounds, write_split_stats)

STATS = "stats"  # the reader's tagged output: (split, ImageStats) per work unit
_RECORDS_PER_ELEMENT = 32  # records handed to the writer at a time
_IMAGES_PER_SHARD = 2000  # default shards: about this many images per shard file
DIGITS = "sklearn://digits"  # scikit-learn's handwritten digits as PNG files (tfpipe.examples.digits)
MANIFEST_FORMATS = (".csv", ".jsonl", ".json")
SCHEMA_KEYS = {"encoded": "image/encoded", "format": "image/format", "height": "image/height",
               "width": "image/width", "label": "image/class/label", "text": "image/class/text"}


@dataclass(frozen=True)
class ImageItem:
    """One input file: where it is, the name its split is hashed from, its label."""

    path: str
    name: str  # relative to the input folder or manifest: the dead-letter's `source`
    label: str
    size: int = -1  # bytes, when the listing knew it


@dataclass(frozen=True)
class ImageUnit:
    index: int
    items: tuple[ImageItem, ...]
    shards: tuple[int, ...]


# ---- finding the images ------------------------------------------------------------------------

def _listing(pattern: str) -> list[tuple[str, int]]:
    try:
        return [(m.path, m.size_in_bytes) for m in FileSystems.match([pattern])[0].metadata_list]
    except Exception:
        return []


def _from_folder(root: str) -> tuple[list[ImageItem], int]:
    """Files in ROOT/CLASS/; returns them and the count of files directly in ROOT (not inputs)."""
    root = root.rstrip("/")
    items = []
    for path, size in sorted(_listing(FileSystems.join(root, "*", "*"))):
        rel = path[len(root) + 1:]
        label, _, name = rel.partition("/")
        if not name or "/" in name or label.startswith(".") or name.startswith("."):
            continue
        if not is_remote(path) and os.path.isdir(path):
            continue  # Keras's layout: a class folder's own subfolders are not read
        items.append(ImageItem(path, rel, label, size))
    loose = [p for p, _ in _listing(FileSystems.join(root, "*")) if is_remote(p) or not os.path.isdir(p)]
    return items, len(loose)


def _from_manifest(path: str, image_column: str, label: str, delimiter: str = "auto") -> list[ImageItem]:
    base = path.rsplit("/", 1)[0] if "/" in path else "."
    with FileSystems.open(path) as f:
        text = f.read().decode("utf-8-sig")
    if path.endswith(".csv"):
        if delimiter == "auto":
            delimiter = detect_delimiter(text[:SAMPLE_BYTES], len(text) <= SAMPLE_BYTES)
        reader = csv.DictReader(io.StringIO(text), delimiter=delimiter)
        columns = reader.fieldnames or []
        rows = list(reader)
    else:
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}:{n}: not a JSON object ({e.msg})") from None
        columns = sorted({k for r in rows for k in r})
    for needed, flag in ((image_column, "--image-column"), (label, "--label")):
        if needed not in columns:
            raise DataError(f"{path}: no column '{needed}' (columns: {', '.join(columns)}); name it with {flag}")
    items = []
    for row in rows:
        image = str(row.get(image_column) or "")
        full = image if (image.startswith("/") or is_remote(image)) else FileSystems.join(base, image)
        items.append(ImageItem(full, image, str(row.get(label) or "")))
    return items


def find_images(config: DataConfig, log: Callable[[str], None]) -> tuple[list[ImageItem], list[str], list[dict]]:
    """Every input image with its label, the class names (their order is the label id) and the
    input list for data.json."""
    if not config.input:
        raise DataError("no input given: pass --input FOLDER (one subfolder per class) or a manifest .csv/.jsonl")
    items: list[ImageItem] = []
    sources = []
    folder_classes: set[str] = set()
    for source in config.input:
        if source == DIGITS:  # the bundled demo set, written out as PNG class folders once
            from tfpipe.examples.digits import cached_folder

            try:
                folder = cached_folder()
            except (RuntimeError, OSError) as e:
                raise DataError(f"input {source}: {e}") from None
            found, _ = _from_folder(folder)
            sources.append({"folder": source, "written_to": folder, "images": len(found)})
            folder_classes |= {i.label for i in found}
        elif source.lower().endswith(MANIFEST_FORMATS):
            if not FileSystems.exists(source):
                raise DataError(f"manifest {source} does not exist")
            found = _from_manifest(source if is_remote(source) else os.path.abspath(source), config.image_column,
                                   config.label or "label", config.delimiter)
            sources.append({"manifest": source, "images": len(found)})
        else:
            if not is_remote(source) and not os.path.isdir(source):
                raise DataError(f"input {source} is not a folder of class subfolders or a .csv/.jsonl manifest")
            found, loose = _from_folder(source if is_remote(source) else os.path.abspath(source))
            folder_classes |= {i.label for i in found}
            if loose:
                log(f"  {source}: {loose} file(s) outside the class subfolders are not inputs (Keras's layout)")
            sources.append({"folder": source, "images": len(found), "outside_class_folders": loose})
        if not found:
            raise DataError(f"input {source} holds no files (expected {source}/CLASS/IMAGE)")
        items += found
    if config.classes:
        classes = list(config.classes)
    else:
        classes = sorted(folder_classes | {i.label for i in items if i.label})
    if len(classes) < 2:
        raise DataError(f"{len(classes)} class(es) found ({', '.join(classes) or 'none'}); "
                        "a classifier needs 2 or more")
    return items, classes, sources


def plan_image_units(items: list[ImageItem], shards: int) -> list[ImageUnit]:
    """At most `shards` contiguous units of about equal bytes; each owns its shard numbers."""
    n_units = max(1, min(shards, len(items)))
    weights = [max(i.size, 1) for i in items]
    total = sum(weights)
    groups: list[list[ImageItem]] = [[] for _ in range(n_units)]
    before = 0
    for item, w in zip(items, weights):
        groups[min(n_units - 1, int((before + w / 2) * n_units / total))].append(item)
        before += w
    groups = [g for g in groups if g]
    return [ImageUnit(u, tuple(g), tuple(s for s in range(shards) if s % len(groups) == u))
            for u, g in enumerate(groups)]


# ---- the Beam steps ----------------------------------------------------------------------------

class ReadAndCheckImages(beam.DoFn):
    """Reads and decodes each image of a unit; records go out per split, rejects tagged BAD,
    the unit's statistics per split tagged STATS; a UnitEnd ends the unit on both writers."""

    def __init__(self, split: dict[str, int], classes: list[str], min_size: tuple[int, int],
                 resize: tuple[int, int] | None, strata: dict[str, np.ndarray] | None = None):
        self.names, self.bounds = list(split), split_bounds(split)
        self.classes, self.min_size, self.resize = classes, min_size, resize
        self.strata = strata or {}

    def setup(self) -> None:
        self.label_ids = {c: i for i, c in enumerate(self.classes)}

    def process(self, unit: ImageUnit):
        bad = 0
        first_bad: list[dict] = []
        pending: dict[str, list[bytes]] = {name: [] for name in self.names}
        stats = {name: ImageStats() for name in self.names}
        which = assign_splits([i.name for i in unit.items], [i.label for i in unit.items], self.bounds, self.strata)
        for item, s in zip(unit.items, which.tolist()):
            verdict = self._check(item)
            if isinstance(verdict, Rejection):
                entry = {"source": item.name, "path": item.path, "label": item.label, "reason": verdict.reason}
                bad += 1
                if len(first_bad) < FIRST_BAD:
                    first_bad.append(entry)
                yield beam.pvalue.TaggedOutput(BAD, BadRows(unit.index, [entry]))
                continue
            split = self.names[s]
            pending[split].append(image_example(verdict, self.label_ids[item.label], item.label))
            stats[split].add(verdict, item.label)
            if len(pending[split]) >= _RECORDS_PER_ELEMENT:
                yield SplitBatch(unit.index, split, {}, pending[split])
                pending[split] = []
        for split, records in pending.items():
            if records:
                yield SplitBatch(unit.index, split, {}, records)
            if stats[split].count:
                yield beam.pvalue.TaggedOutput(STATS, (split, stats[split]))
        end = UnitEnd(unit.index, len(unit.items), bad, first_bad)
        yield beam.pvalue.TaggedOutput(BAD, end)
        yield end

    def _check(self, item: ImageItem) -> ImageInfo | Rejection:
        if not item.name:
            return Rejection("no image path in the manifest row")
        if item.label not in self.label_ids:
            return Rejection(f"unknown label '{item.label}' (classes: {', '.join(self.classes)})"
                             if item.label else "no label")
        try:
            with FileSystems.open(item.path, compression_type="uncompressed") as f:
                data = f.read()
        except Exception as e:  # a missing or unreadable file is the input's problem, not the job's
            text = str(e).splitlines()[0] if str(e) else type(e).__name__
            return Rejection(f"cannot read the file: {text[:300]}")
        return inspect_image(data, self.min_size, self.resize)


class ImageStatsFn(beam.CombineFn):
    def create_accumulator(self) -> ImageStats:
        return ImageStats()

    def add_input(self, acc: ImageStats, unit_stats: ImageStats) -> ImageStats:
        return acc.merge(unit_stats)

    def merge_accumulators(self, accs) -> ImageStats:
        accs = iter(accs)
        first = next(accs)
        for other in accs:
            first.merge(other)
        return first

    def extract_output(self, acc: ImageStats) -> dict:
        return acc.to_json()


def build_image_pipeline(p: beam.Pipeline, units: list[ImageUnit], config: DataConfig, classes: list[str],
                         shards: int, out_dir: str) -> None:
    min_size = parse_size(config.min_size) if config.min_size else (1, 1)
    resize = parse_size(config.resize) if config.resize else None
    images = (
        p
        | "ImageUnits" >> beam.Create(units)
        | "ReadAndCheckImages" >> beam.ParDo(
            ReadAndCheckImages(config.split, classes, min_size, resize, image_strata(units, config))
        ).with_outputs(BAD, STATS, main="good")
    )
    _ = images.good | "WriteShards" >> beam.ParDo(
        WriteShards(out_dir, config.split, {u.index: u.shards for u in units}, shards, config.compression_level))
    _ = images[BAD] | "WriteDeadLetter" >> beam.ParDo(WriteDeadLetter(out_dir))
    _ = (
        images[STATS]
        | "StatsPerSplit" >> beam.CombinePerKey(ImageStatsFn())
        | "WriteStats" >> beam.Map(write_split_stats, out_dir)
    )


def image_strata(units: list[ImageUnit], config: DataConfig) -> dict[str, np.ndarray] | None:
    """Each class's own split bounds (`transforms.strata_bounds`) from every listed file, so that
    every split holds its share of each class; None with --stratify off."""
    if config.stratify == "off":
        return None
    hashes: dict[str, list] = {}
    for unit in units:
        for item, h in zip(unit.items, row_hashes([i.name for i in unit.items])):
            hashes.setdefault(item.label, []).append(h)
    return strata_bounds(hashes, config.split)


# ---- the launcher ------------------------------------------------------------------------------

def run_images(config: DataConfig, log: Callable[[str], None] = print) -> str:
    """Run the image data stage; returns the output directory (published atomically)."""
    started = time.time()
    if not config.out:
        raise DataError("no output directory: pass --out DIR")
    out = config.out if is_remote(config.out) else os.path.abspath(config.out)
    read_data_manifest(out)  # refuses to replace a directory that is not a data output
    items, classes, sources = find_images(config, log)
    total = sum(max(i.size, 0) for i in items)
    shards = config.shards or max(1, min(256, math.ceil(len(items) / _IMAGES_PER_SHARD)))
    options, runner, workers = beam_options(config.beam_args, total, config.runner)
    if not config.shards and workers > 1:
        shards = max(shards, workers)
    units = plan_image_units(items, shards)
    log(f"inputs: {len(items)} image file(s) in {len(classes)} classes ({', '.join(classes[:10])}"
        f"{' ...' if len(classes) > 10 else ''})")
    log(f"running Beam ({runner}, {workers} worker{'s' if workers > 1 else ''}): "
        f"{len(units)} work unit(s) -> {shards} shard(s) per split")
    run_to_temp(out, options, len(units), lambda p, tmp: build_image_pipeline(p, units, config, classes, shards, tmp),
                lambda tmp: _finish(config, units, classes, sources, shards, runner, workers, started, tmp, out, log),
                log)
    return out


def _finish(config: DataConfig, units: list[ImageUnit], classes: list[str], sources: list[dict], shards: int,
            runner: str, workers: int, started: float, tmp: str, out: str, log: Callable[[str], None]) -> None:
    """Check that every file was written or dead-lettered; write schema, stats and data.json; publish."""
    summaries = read_unit_summaries([u.index for u in units], tmp)
    counts = tally(summaries, list(config.split), rows=False)
    check_counts(config, counts, summaries, "images", lambda b: b["source"], inputs=sum(len(u.items) for u in units))
    stats = {"kind": "images", "quantiles": list(QUANTILES),
             "splits": {name: read_split_stats(tmp, name) or ImageStats().to_json() for name in config.split}}
    schema = {"version": 1, "kind": "images", "keys": SCHEMA_KEYS,
              "label": {"name": SCHEMA_KEYS["label"], "task": "binary" if len(classes) == 2 else "multiclass",
                        "classes": classes},
              "image": {"resize": list(parse_size(config.resize)) if config.resize else None, "channels": 3}}
    settings = config.fingerprint_fields()
    fingerprint = cache_key(settings, [[u.index, [[i.name, i.size] for i in u.items]] for u in units])
    manifest = data_manifest(config, summaries, counts, tmp, started, fingerprint=fingerprint, settings=settings,
                             inputs=sources, runner=runner, workers=workers, shards=shards, kind="images",
                             split_by="hash" if config.stratify == "off" else "class")
    write_outputs(tmp, {"schema.json": schema, "stats.json": stats, "data.json": manifest})
    publish(tmp, out, published_names(manifest))
    print_summary(manifest, out, log)
