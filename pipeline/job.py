"""`tfpipe data`: raw rows to validated, split, sharded gzip TFRecords, schema and stats.

This module is the launcher: it resolves and scans the inputs, settles the schema, plans
record-aligned work units, runs the Beam pipeline (`tfpipe.pipeline.transforms`: read and
validate, assign splits, encode, write shards, dead-letter, statistics), reconciles every
unit's counts and publishes the output directory atomically.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from tfpipe import __version__
from tfpipe.files import digest, publish_dir, temp_dir
from tfpipe.pipeline.config import DataConfig
from tfpipe.pipeline.errors import DataError, find_data_error
from tfpipe.pipeline.inputs import FoundFile, InputFile, WorkUnit, is_remote, plan_units, resolve_inputs, scan_file
from tfpipe.pipeline.readers import sample_records
from tfpipe.pipeline.schema import Schema, infer_schema, load_schema
from tfpipe.pipeline.stats import QUANTILES
from tfpipe.pipeline.transforms import TFRecordsFromUnits

LOCAL_RUNNERS = {"FnApiRunner", "DirectRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner"}
_SHARD_BYTES = 32 << 20  # input bytes per shard when --shards is not given


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


def build_pipeline(p: beam.Pipeline, plan: Plan, out_dir: str) -> None:
    config = plan.config
    _ = (
        p
        | "WorkUnits" >> beam.Create(plan.units)
        | "ToTFRecords" >> TFRecordsFromUnits(
            plan.schema, config.split, plan.shards, {u.index: u.shards for u in plan.units}, out_dir,
            config.compression_level, config.na_values, config.top_k)
    )


# ---- Beam options ------------------------------------------------------------------------------

def _option_classes(cls=PipelineOptions):
    for sub in cls.__subclasses__():
        yield sub
        yield from _option_classes(sub)


def check_beam_args(args: list[str]) -> None:
    """Reject arguments that are not Beam pipeline options, so a typo is not silently dropped."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for cls in set(_option_classes()):
        try:
            cls._add_argparse_args(parser)
        except argparse.ArgumentError:
            pass  # an option registered by two classes
    _, unknown = parser.parse_known_args(args)
    flags = [a for a in unknown if a.startswith("-")]
    if flags:
        raise DataError(f"unknown option {flags[0]}: not a `tfpipe data` option nor an Apache Beam pipeline option")


def beam_options(args: list[str], input_bytes: int) -> tuple[PipelineOptions, str, int]:
    """Pipeline options with tfpipe's local defaults; returns (options, runner, local workers)."""
    check_beam_args(args)
    given = PipelineOptions(args).get_all_options(drop_default=True)
    extra = []
    runner = given.get("runner") or "FnApiRunner"
    if "runner" not in given:
        extra.append("--runner=FnApiRunner")  # Beam's default would download Prism from the internet
    workers = given.get("direct_num_workers") or 1
    if runner in LOCAL_RUNNERS and "direct_num_workers" not in given and input_bytes > 16 << 20:
        workers = os.cpu_count() or 1
        if workers > 1:
            extra += [f"--direct_num_workers={workers}", "--direct_running_mode=multi_processing"]
    if "default_sdk_harness_log_level" not in given:
        extra.append("--default_sdk_harness_log_level=WARNING")
    return PipelineOptions(args + extra), runner, workers


# ---- the stage -----------------------------------------------------------------------------------

def run(config: DataConfig, log: Callable[[str], None] = print) -> str:
    """Run the data stage; returns the output directory (published atomically)."""
    started = time.time()
    if not config.out:
        raise DataError("no output directory: pass --out DIR")
    if not config.label:
        raise DataError("no label column: pass --label COLUMN")
    out = config.out if is_remote(config.out) else os.path.abspath(config.out)
    found = resolve_inputs(config.input, config.format)
    total = sum(f.size for f in found)
    log(f"inputs: {len(found)} file(s), {human_bytes(total)}")

    schema_text = None
    if config.schema_path:
        schema = load_schema(config.schema_path)
        with open(config.schema_path, "rb") as f:
            schema_text = f.read()
    settings = config.result_fingerprint_fields()
    settings["schema_file_sha256"] = hashlib.sha256(schema_text).hexdigest() if schema_text else None

    previous = _read_manifest(out)
    if previous and not config.force and _same_inputs_quick(previous, found) and \
            previous.get("settings") == settings and previous.get("tfpipe_version") == __version__:
        log(f"cache hit: {out} is up to date with these inputs and options; nothing to do (--force reruns)")
        return out

    shards = config.shards or max(1, min(256, math.ceil(total / _SHARD_BYTES)))
    options, runner, workers = beam_options(config.beam_args, total)
    if not config.shards and workers > 1:
        shards = max(shards, workers)
    grain = max(64 << 10, min(16 << 20, total // (shards * 8) or 1))
    log("scanning: hashing inputs and finding record boundaries")
    files = [scan_file(f, grain) for f in found]
    fingerprint = _fingerprint(settings, files)
    if previous and not config.force and previous.get("fingerprint") == fingerprint:
        log(f"cache hit: {out} is up to date (inputs unchanged by content); nothing to do (--force reruns)")
        return out

    if config.schema_path:
        _check_schema_fits(schema, files, config)
    else:
        schema = _infer(files, config)
    plan = Plan(config, schema, files, plan_units(files, shards), shards, settings, fingerprint, runner, workers,
                started)
    log(f"schema: {len(schema.features)} features, label '{schema.label.name}' "
        f"({schema.label.task}{', enforced' if schema.enforced else ', inferred'})")
    log(f"running Beam ({runner}, {workers} worker{'s' if workers > 1 else ''}): "
        f"{len(plan.units)} work unit(s) -> {shards} shard(s) per split")

    tmp = _temp_dir(out)
    try:
        with _progress(tmp, len(plan.units), log):
            try:
                with beam.Pipeline(options=options) as p:
                    build_pipeline(p, plan, tmp)
            except Exception as e:
                user_error = find_data_error(e)
                if user_error:
                    raise user_error from None
                raise
        result = _finish(plan, tmp, out, log)
    except BaseException:
        _remove(tmp)
        raise
    return result


def _infer(files: list[InputFile], config: DataConfig) -> Schema:
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
    _check_names(columns, config, files[0].path if len(files) == 1 else "the inputs")
    return infer_schema(columns, records, config.label, exclude=config.exclude, key=config.key,
                        task=config.task, textual=textual, na_values=config.na_values)


def _check_names(columns: list[str], config: DataConfig, where: str) -> None:
    shown = ", ".join(columns[:30]) + (" ..." if len(columns) > 30 else "")
    if config.label not in columns:
        raise DataError(f"label column '{config.label}' not found in {where} (columns: {shown})")
    for c in config.exclude:
        if c not in columns:
            raise DataError(f"--exclude: column '{c}' not found in {where} (columns: {shown})")
    if config.label in config.exclude:
        raise DataError(f"label column '{config.label}' cannot also be excluded")
    if config.key and config.key not in columns:
        raise DataError(f"--key: column '{config.key}' not found in {where} (columns: {shown})")


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
            raise DataError(f"label column '{schema.label.name}' not found in {f.path}")


def _finish(plan: Plan, tmp: str, out: str, log: Callable[[str], None]) -> str:
    """Reconcile the work units' counts, settle the schema, write schema/stats/data.json, publish."""
    config, schema, files = plan.config, plan.schema, plan.files
    summaries = []
    for u in plan.units:
        path = FileSystems.join(tmp, "_units", f"unit-{u.index:05d}.json")
        try:
            with FileSystems.open(path) as f:
                summaries.append(json.loads(f.read()))
        except Exception:
            raise RuntimeError(f"work unit {u.index} finished without its summary ({path})") from None
    read = sum(s["read"] for s in summaries)
    bad = sum(s["bad"] for s in summaries)
    per_split = {name: sum(s["splits"][name] for s in summaries) for name in config.split}
    written = sum(per_split.values())
    if read != written + bad:
        raise RuntimeError(f"row accounting failed: read {read} != written {written} + bad {bad}")
    if read == 0:
        raise DataError("the inputs hold no data rows")
    fraction = bad / read
    first_bad = [b for s in summaries for b in s["first_bad"]][:5]
    if fraction > config.max_bad_fraction or written == 0:
        reasons = "\n".join(f"  {b['source']}:{b['line']}: {b['reason']}" for b in first_bad)
        raise DataError(
            f"{bad} of {read} rows are bad ({fraction:.2%}), over --max-bad-fraction "
            f"{config.max_bad_fraction:g}; nothing was written. First bad rows:\n{reasons}")

    stats = {"quantiles": list(QUANTILES), "splits": {}}
    for name in config.split:
        path = FileSystems.join(tmp, "_stats", f"{name}.json")
        if FileSystems.exists(path):
            with FileSystems.open(path) as f:
                stats["splits"][name] = json.loads(f.read())
        else:
            stats["splits"][name] = {"rows": 0, "features": {}, "label": None}
    _settle_schema(schema, stats)

    files_out: dict[str, list] = {name: [] for name in config.split}
    for s in summaries:
        for fname, info in s["files"].items():
            files_out[info["split"]].append({"file": fname, "records": info["records"], "bytes": info["bytes"]})
    for name in files_out:
        files_out[name].sort(key=lambda x: x["file"])
    dead_files = sorted(os.path.basename(m.path) for m in _match(FileSystems.join(tmp, "deadletter", "*.jsonl")))
    elapsed = time.time() - plan.started
    manifest = {
        "stage": "data",
        "tfpipe_version": __version__,
        "fingerprint": plan.fingerprint,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": config.model_dump(mode="json", by_alias=True),
        "settings": plan.settings,
        "inputs": [{"path": f.path, "format": f.format, "compressed": f.compressed, "size": f.size,
                    "mtime": f.mtime, "sha256": f.sha256} for f in files],
        "beam": {"runner": plan.runner, "workers": plan.workers, "args": list(config.beam_args)},
        "shards": plan.shards,
        "counts": {"read": read, "written": written, "bad": bad, "splits": per_split},
        "bad_fraction": fraction,
        "outputs": {"schema": "schema.json", "stats": "stats.json", "splits": files_out,
                    "deadletter": [f"deadletter/{d}" for d in dead_files]},
        "elapsed_s": round(elapsed, 3),
        "rows_per_s": round(read / elapsed, 1) if elapsed > 0 else None,
    }
    for name, text in (("schema.json", schema.to_json()), ("stats.json", stats), ("data.json", manifest)):
        with FileSystems.create(FileSystems.join(tmp, name)) as f:
            f.write(json.dumps(text, indent=2, ensure_ascii=False).encode())
    # Scratch files of the pipeline: deleted file by file, since object stores have no folders.
    scratch = _match(FileSystems.join(tmp, "_units", "*")) + _match(FileSystems.join(tmp, "_stats", "*"))
    FileSystems.delete([m.path for m in scratch])
    if not is_remote(tmp):
        for folder in ("_units", "_stats"):
            shutil.rmtree(os.path.join(tmp, folder), ignore_errors=True)
    names = [f["file"] for files in files_out.values() for f in files]
    names += manifest["outputs"]["deadletter"] + ["schema.json", "stats.json", "data.json"]
    _publish(tmp, out, names)
    _print_summary(manifest, out, log)
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


def human_bytes(n: float) -> str:
    unit = "B"
    for bigger in ("KB", "MB", "GB"):
        if n < 1000:
            break
        n, unit = n / 1000, bigger
    return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"


def _print_summary(manifest: dict, out: str, log) -> None:
    c = manifest["counts"]
    by_split: dict[str, list[int]] = {}
    for name, files in manifest["outputs"]["splits"].items():
        by_split[name] = [len(files), sum(f["bytes"] for f in files)]
    rows = [("split", "rows", "files", "MB")]
    for name, n in c["splits"].items():
        rows.append((name, f"{n:,}", str(by_split[name][0]), f"{by_split[name][1] / 1e6:.2f}"))
    rows.append(("dead-letter", f"{c['bad']:,}", str(len(manifest["outputs"]["deadletter"])), ""))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        log("  " + "  ".join(v.ljust(widths[0]) if i == 0 else v.rjust(widths[i]) for i, v in enumerate(r)))
    log(f"rows read {c['read']:,} = written {c['written']:,} + dead-letter {c['bad']:,}; "
        f"{manifest['elapsed_s']:.1f} s, {manifest['rows_per_s']:,.0f} rows/s")
    log(f"wrote {out}")


# ---- files, cache, atomic publish -------------------------------------------------------------

def _fingerprint(settings: dict, files: list[InputFile]) -> str:
    return digest({"settings": settings, "version": __version__, "inputs": [[f.path, f.sha256] for f in files]})


def _read_manifest(out: str) -> dict | None:
    path = FileSystems.join(out, "data.json")
    try:
        with FileSystems.open(path) as f:
            return json.loads(f.read())
    except Exception:
        if not is_remote(out) and os.path.isdir(out) and os.listdir(out):
            raise DataError(f"{out} exists and is not a tfpipe data output (no readable data.json); "
                            "choose another --out or remove it") from None
        return None


def _same_inputs_quick(manifest: dict, found: list[FoundFile]) -> bool:
    old = [(i["path"], i["size"], i["mtime"]) for i in manifest.get("inputs", [])]
    return old == [(f.path, f.size, f.mtime) for f in found]


def _temp_dir(out: str) -> str:
    if is_remote(out):
        return f"{out.rstrip('/')}.tmp-{uuid.uuid4().hex[:8]}"
    parent = os.path.dirname(os.path.abspath(out.rstrip(os.sep)))
    os.makedirs(parent, exist_ok=True)
    if not os.access(parent, os.W_OK):
        raise DataError(f"cannot write to {parent}")
    tmp = temp_dir(out.rstrip(os.sep))  # those left by killed runs go first
    os.makedirs(os.path.join(tmp, "deadletter"))
    return tmp


def _publish(tmp: str, out: str, names: list[str]) -> None:
    """Move the finished output into place; a reader sees the old or the new one, never half.

    `names` lists every output file relative to `tmp`, data.json last."""
    if is_remote(out):
        # Object stores have no directory rename: the old output goes first, then the new
        # files move one by one with data.json last, so a reader that trusts data.json
        # never sees a partial output.
        old = [m.path for m in _match(FileSystems.join(out, "*")) + _match(FileSystems.join(out, "deadletter", "*"))]
        if old:
            FileSystems.delete(old)
        for name in names:
            FileSystems.rename([FileSystems.join(tmp, name)], [FileSystems.join(out, name)])
        _remove(tmp)
        return
    publish_dir(tmp, out)


def _remove(tmp: str) -> None:
    if is_remote(tmp):
        try:
            FileSystems.delete([tmp.rstrip("/") + "/"])
        except Exception:
            pass
    else:
        shutil.rmtree(tmp, ignore_errors=True)


def _match(pattern: str):
    try:
        return FileSystems.match([pattern])[0].metadata_list
    except Exception:
        return []


class _progress:
    """Prints a line as work units finish, from the summary files they leave."""

    def __init__(self, tmp: str, total: int, log):
        self.tmp, self.total, self.log = tmp, total, log
        self._stop = threading.Event()

    def __enter__(self):
        self.started = time.time()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        done = 0
        while not self._stop.wait(1.0):
            now = len(_match(FileSystems.join(self.tmp, "_units", "*.json")))
            if now != done and now < self.total:
                done = now
                self.log(f"  {done}/{self.total} work units done ({time.time() - self.started:.0f} s)")

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.log(f"  pipeline finished in {time.time() - self.started:.1f} s")
        return False
