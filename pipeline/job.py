"""`tfpipe data`: raw rows to validated, split, sharded gzip TFRecords, schema and stats.

This module is the launcher: it resolves and scans the inputs, settles the schema, plans
record-aligned work units, runs the Beam pipeline (`tfpipe.pipeline.transforms`: read and
validate, assign splits, encode, write shards, dead-letter, statistics), reconciles every
unit's counts and publishes the output directory atomically.
"""

from __future__ import annotations

import math
import os
import time
import dataclasses
from dataclasses import dataclass
from typing import Callable

import apache_beam as beam
import numpy as np

from tfpipe import __version__
from tfpipe.files import cache_key
from tfpipe.pipeline.config import DataConfig
from tfpipe.pipeline.errors import DataError
from tfpipe.pipeline.autodetect import DELIMITERS, delimiter_name, found_format, shown_delimiter
from tfpipe.pipeline.inputs import (FoundFile, InputFile, WorkUnit, is_remote, plan_units, read_csv_header,
                                    resolve_inputs, scan_file)
from tfpipe.pipeline.readers import read_segment, sample_records
from tfpipe.pipeline.validation import Validator
from tfpipe.pipeline.schema import Schema, load_schema
from tfpipe.pipeline.schema_inference import infer_schema
from tfpipe.pipeline.stats import QUANTILES
from tfpipe.pipeline.outputs import (check_counts, data_manifest, human_bytes, print_summary, publish,
                                     published_names, read_data_manifest, read_split_stats, read_unit_summaries, result,
                                     tally, write_outputs)
from tfpipe.pipeline.runner import beam_options, environment_main, in_environment, run_in_environment, run_to_temp
from tfpipe.stage import StageResult
from tfpipe.pipeline.transforms import TFRecordsFromUnits, class_key, row_hashes, split_texts, strata_bounds

_SHARD_BYTES = 32 << 20  # input bytes per shard when --shards is not given
# Stratified splits read the labels once in the launcher before the job: bounded so that this
# pass stays short. Beyond it each class is large enough for hash splits to hold its share closely.
STRATIFY_BYTES = 64 << 20


@dataclass
class Plan:
    """What one data job does: decided before Beam runs, reconciled after it."""

    config: DataConfig
    schema: Schema
    files: list[InputFile]
    units: list[WorkUnit]
    shards: int  # per split
    settings: dict  # the options that decide the result (the cache key, with the inputs' hashes)
    fingerprint: str
    runner: str
    workers: int
    started: float  # time.time()
    strata: dict[str, np.ndarray] | None = None  # class -> row-hash bounds per split (stratified splits)
    notices: list[str] = dataclasses.field(default_factory=list)  # what tfpipe decided that a user should see


def build_pipeline(p: beam.Pipeline, plan: Plan, out_dir: str) -> None:
    config = plan.config
    _ = (
        p
        | "WorkUnits" >> beam.Create(plan.units)
        | "ToTFRecords" >> TFRecordsFromUnits(
            plan.schema, config.split, plan.shards, {u.index: u.shards for u in plan.units}, out_dir,
            config.compression_level, config.na_values, config.top_k, plan.strata)
    )


# ---- the stage -----------------------------------------------------------------------------------

def run(config: DataConfig, log: Callable[[str], None] = print) -> StageResult:
    """Run the data stage: its output directory published atomically, and its result."""
    return result(_run(config, log))


def _run(config: DataConfig, log: Callable[[str], None]) -> str:
    """The data stage; the output directory."""
    if config.environment and not in_environment(config.environment):
        return run_in_environment(config, log)
    config = config.model_copy(update={"format": found_format(config.format, config.input)})
    if config.format == "images":
        from tfpipe.pipeline.image_job import run_images

        return run_images(config, log)
    started = time.time()
    if not config.out:
        raise DataError("no output directory: pass --out DIR")
    if not config.label:
        raise DataError("no label column: pass --label COLUMN")
    out = config.out if is_remote(config.out) else os.path.abspath(config.out)
    notices: list[str] = []

    def notice(line: str) -> None:  # logged, and kept for data.json and the run's terminal
        notices.append(line)
        log(line)
    found = resolve_inputs(config.input, config.format)
    total = sum(f.size for f in found)
    log(f"inputs: {len(found)} file(s), {human_bytes(total)}")
    for f in found:
        if f.source:
            notice(f"{os.path.basename(f.source)}: an Excel workbook; its first sheet is read, as the CSV {f.path}")

    if config.schema_path:
        schema = load_schema(config.schema_path)
    settings = config.settings()

    previous = read_data_manifest(out)
    if previous and not config.force and _same_inputs_quick(previous, found) and \
            previous.get("settings") == settings and previous.get("tfpipe_version") == __version__ and \
            previous.get("config", {}).get("delimiter", "auto") == config.delimiter:
        log(f"cache hit: {out} is up to date with these inputs and options; nothing to do (--force reruns)")
        return out

    shards = config.shards or max(1, min(256, math.ceil(total / _SHARD_BYTES)))
    options, runner, workers = beam_options(config.beam_args, total, config.runner)
    if not config.shards and workers > 1:
        shards = max(shards, workers)
    grain = max(64 << 10, min(16 << 20, total // (shards * 8) or 1))
    log("scanning: hashing inputs and finding record boundaries")
    files = [scan_file(f, grain, config.delimiter) for f in found]
    _log_delimiters(files, config, notice)
    fingerprint = _fingerprint(settings, files)
    if previous and not config.force and previous.get("fingerprint") == fingerprint:
        log(f"cache hit: {out} is up to date (inputs unchanged by content); nothing to do (--force reruns)")
        return out

    if config.schema_path:
        _check_schema_fits(schema, files, config)
    else:
        schema = _infer(files, config, notice)
    plan = Plan(config, schema, files, plan_units(files, shards), shards, settings, fingerprint, runner, workers,
                started, notices=notices)
    log(f"schema: {len(schema.features)} features, label '{schema.label.name}' "
        f"({schema.label.task}{', enforced' if schema.enforced else ', inferred'})")
    plan.strata = _strata(plan, total, log)
    log(f"running Beam ({runner}, {workers} worker{'s' if workers > 1 else ''}): "
        f"{len(plan.units)} work unit(s) -> {shards} shard(s) per split")

    return run_to_temp(out, options, len(plan.units), lambda p, tmp: build_pipeline(p, plan, tmp),
                       lambda tmp: _finish(plan, tmp, out, log), log)


def _strata(plan: Plan, total: int, log: Callable[[str], None]) -> dict[str, np.ndarray] | None:
    """Stratified splits for a classification label: read every row's label and split hash once,
    and give each class its own hash bounds, so that every split holds the split weights' share
    of each class (a hash split leaves small classes and small tables unbalanced by chance). None
    when off, for regression, with --key (the key's groups decide), or beyond STRATIFY_BYTES."""
    config, schema = plan.config, plan.schema
    if config.stratify == "off" or schema.label.task == "regression" or schema.key:
        return None
    if total > STRATIFY_BYTES:
        log(f"split: by row hash (inputs over {human_bytes(STRATIFY_BYTES)}, beyond stratified splits)")
        return None
    validator = Validator(schema, config.na_values)
    hashes: dict[str, list] = {}
    for unit in plan.units:
        for seg in unit.segments:
            for batch in read_segment(seg, validator):
                if not len(batch):
                    continue
                h = row_hashes(split_texts(batch))
                labels = [class_key(v) for v in batch.columns[schema.label.name].values]
                for cls, value in zip(labels, h):
                    hashes.setdefault(cls, []).append(value)
    if not hashes:
        return None
    log(f"split: stratified by '{schema.label.name}' ({len(hashes)} classes, "
        f"{sum(map(len, hashes.values()))} labelled rows)")
    return strata_bounds(hashes, config.split)


def _infer(files: list[InputFile], config: DataConfig, log: Callable[[str], None]) -> Schema:
    columns: list[str] = []
    for f in files:
        for c in f.columns or ():
            if c not in columns:
                columns.append(c)
    records, textual = sample_records(files, config.infer_rows)
    for r in records:
        for c in r:
            if c not in columns:
                columns.append(c)
    _check_names(columns, config, files)
    return infer_schema(columns, records, config.label, exclude=config.exclude, keep=config.keep_column,
                        key=config.key, task=config.task, textual=textual, na_values=config.na_values, note=log)


def _log_delimiters(files: list[InputFile], config: DataConfig, log: Callable[[str], None]) -> None:
    """Say how each CSV input is split, when tfpipe chose it and it is not the plain comma."""
    if config.delimiter != "auto":
        return
    for f in files:
        if f.format == "csv" and f.delimiter != ",":
            log(f"{os.path.basename(f.path)}: fields separated by {delimiter_name(f.delimiter)}s "
                f"({shown_delimiter(f.delimiter)}, detected; --delimiter sets it)"
                + ("; a number written with a decimal comma (3,5), if any, is read as 3.5" if f.delimiter == ";" else ""))


def _check_names(columns: list[str], config: DataConfig, files: list[InputFile]) -> None:
    where = files[0].path if len(files) == 1 else "the inputs"
    shown = ", ".join(columns[:30]) + (" ..." if len(columns) > 30 else "")
    if config.label not in columns:
        raise DataError(_label_not_found(config.label, files) or
                        f"label column '{config.label}' not found in {where} (columns: {shown})")
    for flag, names in (("--exclude", config.exclude), ("--keep-column", config.keep_column)):
        for c in names:
            if c not in columns:
                raise DataError(f"{flag}: column '{c}' not found in {where} (columns: {shown})")
    if config.label in config.exclude:
        raise DataError(f"label column '{config.label}' cannot also be excluded")
    if config.key and config.key not in columns:
        raise DataError(f"--key: column '{config.key}' not found in {where} (columns: {shown})")


def _label_not_found(label: str, files: list[InputFile]) -> str | None:
    """For the first CSV input whose header lacks `label`: how its header was split, and the
    delimiter that would find the label, if one would."""
    f = next((f for f in files if f.format == "csv" and label not in (f.columns or ())), None)
    if f is None:
        return None
    names = f.columns or ()
    shown = ", ".join(repr(c) for c in names[:30]) + (" ..." if len(names) > 30 else "")
    text = (f"label column '{label}' not found in {f.path}: its header, split on {shown_delimiter(f.delimiter)}, "
            f"gives {len(names)} column{'s' if len(names) != 1 else ''}: {shown}")
    for d in DELIMITERS:
        if d == f.delimiter:
            continue
        try:
            other = read_csv_header(f.header.encode(), f.path, d)
        except DataError:
            continue
        if label in other:
            flag = "tab" if d == "\t" else d
            return text + f" (pass --delimiter '{flag}' to split it on {delimiter_name(d)}s)"
    return text


def _check_schema_fits(schema: Schema, files: list[InputFile], config: DataConfig) -> None:
    if config.label != schema.label.name:
        raise DataError(f"--label '{config.label}' differs from the schema's label '{schema.label.name}'")
    schema.excluded = sorted(set(schema.excluded) | set(config.exclude))
    schema.key = config.key or schema.key
    known = {c.name for c in schema.columns} | set(schema.excluded) | ({schema.key} - {None})
    for f in files:
        if f.columns is None:
            continue  # JSON Lines: checked row by row
        unknown = [c for c in f.columns if c not in known]
        if unknown:
            raise DataError(f"{f.path}: column '{unknown[0]}' is not in the schema (add --exclude {unknown[0]} to drop it)")
        if schema.label.name not in f.columns:
            raise DataError(_label_not_found(schema.label.name, [f]) or
                            f"label column '{schema.label.name}' not found in {f.path}")


def _finish(plan: Plan, tmp: str, out: str, log: Callable[[str], None]) -> str:
    """Reconcile the work units' counts, settle the schema, write schema/stats/data.json, publish."""
    config, schema, files = plan.config, plan.schema, plan.files
    summaries = read_unit_summaries([u.index for u in plan.units], tmp)
    counts = tally(summaries, list(config.split))
    if counts["read"] == 0:
        raise DataError("the inputs hold no data rows")
    check_counts(config, counts, summaries, "rows", lambda b: f"{b['source']}:{b['line']}")

    stats = {"quantiles": list(QUANTILES), "splits": {}}
    for name in config.split:
        stats["splits"][name] = read_split_stats(tmp, name) or {"rows": 0, "features": {}, "label": None}
    _settle_schema(schema, stats)

    inputs = [{"path": f.path, "format": f.format, "compressed": f.compressed, "size": f.size, "mtime": f.mtime,
               "sha256": f.sha256, **_csv_reading(f)} for f in files]
    manifest = data_manifest(config, summaries, counts, tmp, plan.started, fingerprint=plan.fingerprint,
                             settings=plan.settings, inputs=inputs, runner=plan.runner, workers=plan.workers,
                             shards=plan.shards, split_by="class" if plan.strata else "hash", notices=plan.notices)
    write_outputs(tmp, {"schema.json": schema.to_json(), "stats.json": stats, "data.json": manifest})
    publish(tmp, out, published_names(manifest))
    print_summary(manifest, out, log)
    return out


def _settle_schema(schema: Schema, stats: dict) -> None:
    """Fix what a sample cannot know: nullability and the full set of label classes."""
    splits = [s for s in stats["splits"].values() if s.get("rows")]
    if not schema.enforced:
        for f in schema.features:
            f.nullable = any(s["features"][f.name]["missing"] > 0 for s in splits)
    if schema.label.task != "regression" and not schema.enforced:
        seen = set()
        for s in splits:
            seen.update(s["label"]["distribution"])
        classes = sorted(int(v) for v in seen) if schema.label.type == "int" else sorted(seen)
        schema.label.classes = classes
        if len(classes) > 2 and schema.label.task == "binary":
            schema.label.task = "multiclass"


# ---- files, cache, atomic publish -------------------------------------------------------------

def _csv_reading(f: InputFile) -> dict:
    """How a CSV input was read (data.json records it): its delimiter, and whether a decimal comma
    is read as a point (with ';'). Nothing for other formats."""
    if f.format != "csv":
        return {}
    return {"delimiter": f.delimiter, "decimal_comma": f.delimiter == ";"}


def _fingerprint(settings: dict, files: list[InputFile]) -> str:
    """The content cache key (`cache_key`): the settings, and each input's path and sha256, with a
    CSV input's delimiter when it is not a comma (the one it was read with, however it was chosen)."""
    return cache_key(settings, [[f.path, f.sha256] + ([f.delimiter] if f.format == "csv" and f.delimiter != "," else [])
                                for f in files])


def _same_inputs_quick(manifest: dict, found: list[FoundFile]) -> bool:
    old = [(i["path"], i["size"], i["mtime"]) for i in manifest.get("inputs", [])]
    return old == [(f.path, f.size, f.mtime) for f in found]


if __name__ == "__main__":
    raise SystemExit(environment_main("data", DataConfig, run))
