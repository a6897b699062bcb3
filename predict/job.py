"""`tfpipe predict`: score a file of any size with a published model, as a Beam job.

    work units (the data stage's: record-aligned byte ranges, Parquet row groups; image files)
      -> Read: read and validate a unit with the data stage's readers against the schema the model
         was trained on (an image decoded in full); bad rows, with their reason, kept aside
      -> RunInference(TableModelHandler): one element a unit; the handler cuts its rows into
         model calls of --batch-rows (or as each worker measured), the version's serving_default
         called as the server calls it
      -> WriteUnit: the unit's predictions (predictions/part-UNIT.parquet|csv|jsonl), its
         dead-letter rows (deadletter/part-UNIT.jsonl) and its summary (_units/), each file
         whole: a retried unit writes the same files again, so a rerun bundle leaves no
         duplicate and no gap; no shuffle, so memory holds the units in flight, not the job

The launcher reconciles the units' counts (rows read = predicted + dead-lettered, exactly) and
publishes the output directory atomically with predict.json.
"""

from __future__ import annotations

import importlib.metadata
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
from apache_beam.ml.inference.base import RunInference

from tfpipe import __version__
from tfpipe.pipeline.autodetect import delimiter_name, shown_delimiter
from tfpipe.pipeline.inputs import InputFile, WorkUnit, is_remote, plan_units, resolve_inputs, scan_file
from tfpipe.pipeline.outputs import deadletter_files, human_bytes, match, publish, read_unit_summaries, write_outputs
from tfpipe.pipeline.runner import beam_options, environment_main, in_environment, progress, run_in_environment, \
    run_to_temp
from tfpipe.pipeline.readers import read_segment
from tfpipe.pipeline.validation import Validator
from tfpipe.pipeline.schema import Schema
from tfpipe.pipeline.tfexample import tfrecord_frames
from tfpipe.pipeline.transforms import fail_once
from tfpipe.prediction_logs import SUFFIX as LOG_SUFFIX
from tfpipe.predict.config import PredictConfig
from tfpipe.predict.errors import PredictError
from tfpipe.predict.model import (IMAGE_INPUT, Answered, ModelVersion, Rows, Scored, TableModelHandler, UnitRows,
                                  resolve)
from tfpipe.stage import StageOutputs, StageResult
from tfpipe.versions import served

IMAGE_UNIT = 256  # images per work unit
UNIT_BYTES = 16 << 20  # input bytes per work unit
FIRST_BAD = 5  # dead-letter entries each unit reports to the launcher (for the summary)
EXTENSIONS = {"parquet": "parquet", "csv": "csv", "jsonl": "jsonl"}
PREDICTIONS = "predictions"  # the folder of prediction files (a reader of the folder sees only them)
# --prediction-log: the request log's files, PREDICTION_LOGS/log-UNIT.tfrecord, which
# `tfpipe skew --logs OUT/prediction_logs/log` reads
PREDICTION_LOGS, LOG_PREFIX = "prediction_logs", "log"


# ---- the steps -----------------------------------------------------------------------------------

class ReadRows(beam.DoFn):
    """A work unit's rows, validated for scoring: one UnitRows."""

    def __init__(self, schema_json: dict, na_values: list[str], carried: tuple[str, ...]):
        self.schema_json, self.na_values, self.carried = schema_json, na_values, carried

    def setup(self) -> None:
        self.validator = Validator(Schema.from_json(self.schema_json), self.na_values, scoring=self.carried)

    def process(self, unit: WorkUnit):
        pieces, bad, read = [], [], 0
        for segment in unit.segments:
            for batch in read_segment(segment, self.validator):
                read += len(batch) + len(batch.bad)
                bad += batch.bad
                if len(batch):
                    pieces.append(Rows(unit.index, len(pieces), batch.source, batch.lines, batch.raws, batch.columns))
        yield UnitRows(unit.index, pieces, bad, read)


@dataclass(frozen=True)
class ImageFile:
    path: str
    name: str  # relative to the input folder: the output's `path` and the dead-letter's `source`
    label: str  # its class folder's name, or "" for a file directly in the folder


class ReadImages(beam.DoFn):
    """A unit's image files, each read and decoded in full (as the data stage checks a training
    image): an empty, truncated or non-image file is dead-lettered with its reason; the good files'
    bytes are what the model takes (it decodes and resizes them itself). One UnitRows."""

    def process(self, unit: "ImageUnit"):
        from tfpipe.pipeline.images import Rejection, inspect_image
        from tfpipe.pipeline.validation import Column

        bad, good = [], []
        for item in unit.files:
            try:
                with FileSystems.open(item.path, compression_type="uncompressed") as f:
                    data = f.read()
                verdict = inspect_image(data)
            except Exception as e:  # noqa: BLE001 (a missing or unreadable file is the input's problem)
                verdict = Rejection(f"cannot read the file: {str(e).splitlines()[0][:300] if str(e) else e!r}")
            if isinstance(verdict, Rejection):
                bad.append({"source": item.name, "path": item.path, "reason": verdict.reason})
            else:
                good.append((item, data))
        pieces = []
        if good:
            names = np.array([f.name for f, _ in good], dtype=object)
            everywhere = np.ones(len(good), bool)
            columns = {"path": Column(names, everywhere),
                       "label": Column(np.array([f.label for f, _ in good], dtype=object),
                                       np.array([bool(f.label) for f, _ in good])),
                       IMAGE_INPUT: Column(np.array([b for _, b in good] + [b""], dtype=object)[:-1], everywhere)}
            pieces.append(Rows(unit.index, 0, "", np.arange(len(good)), list(names), columns))
        yield UnitRows(unit.index, pieces, bad, len(unit.files))


@dataclass(frozen=True)
class ImageUnit:
    index: int
    files: tuple[ImageFile, ...]


def find_image_files(inputs: list[str]) -> list[ImageFile]:
    """The files of each input folder (directly in it, or in a class folder one level down) or
    glob, in name order; hidden files and deeper folders are not read."""
    found: list[ImageFile] = []
    for pattern in inputs:
        root = pattern.rstrip("/")
        if is_remote(root) or os.path.isdir(root):
            listed = [m.path for m in match(FileSystems.join(root, "*")) + match(FileSystems.join(root, "*", "*"))]
            for path in sorted(listed):
                rel = path[len(root) + 1:]
                parts = rel.split("/")
                if any(p.startswith(".") for p in parts) or (not is_remote(path) and os.path.isdir(path)):
                    continue
                found.append(ImageFile(path, rel, parts[0] if len(parts) == 2 else ""))
        else:
            for path in sorted(m.path for m in match(root)):
                if is_remote(path) or os.path.isfile(path):
                    found.append(ImageFile(path, os.path.basename(path), ""))
    if not found:
        raise PredictError(f"no image file found in {', '.join(inputs)} (a folder of images, or of class folders "
                           "of images, or a glob)")
    return found


class WriteUnit(beam.DoFn):
    """Writes one work unit's predictions, dead-letter rows and summary, each file whole."""

    def __init__(self, out_dir: str, layout: "Layout"):
        self.out_dir, self.layout = out_dir, layout

    def process(self, answered: Answered):
        unit, scored = answered.unit, answered.scored
        if len(scored) != len(unit.pieces):
            raise RuntimeError(f"work unit {unit.unit}: {len(scored)} of its {len(unit.pieces)} pieces were scored")
        predicted, refused = 0, []
        for rows, answer in zip(unit.pieces, scored):
            predicted += len(answer.taken)
            for i, reason in sorted(answer.refused.items()):
                if IMAGE_INPUT in rows.columns:  # an image: its file
                    refused.append({"source": rows.raws[i], "reason": reason})
                else:
                    refused.append({"source": rows.source, "line": int(rows.lines[i]), "reason": reason,
                                    "raw": rows.raws[i]})
        name = f"{PREDICTIONS}/part-{unit.unit:05d}.{EXTENSIONS[self.layout.output_format]}"
        if predicted:
            with FileSystems.create(FileSystems.join(self.out_dir, name)) as f:
                f.write(self.layout.encode(self.layout.table(unit.pieces, scored)))
        fail_once(unit.unit)  # a test hook: a unit lost after writing part of its files
        if self.layout.prediction_log and predicted:
            logs = [record for answer in scored for record in (answer.logs or [])]
            with FileSystems.create(FileSystems.join(self.out_dir, PREDICTION_LOGS,
                                                     f"{LOG_PREFIX}-{unit.unit:05d}{LOG_SUFFIX}")) as f:
                f.write(tfrecord_frames(logs))
        sources: dict[str, int] = {}  # each file in the order the unit read it
        for b in unit.bad + refused:
            sources.setdefault(b["source"], len(sources))
        dead = sorted(unit.bad + refused, key=lambda b: (sources[b["source"]], b.get("line", 0)))
        if dead:
            with FileSystems.create(FileSystems.join(self.out_dir, "deadletter",
                                                     f"part-{unit.unit:05d}.jsonl")) as f:
                f.write("".join(json.dumps(b, ensure_ascii=False) + "\n" for b in dead).encode())
        summary = {"unit": unit.unit, "read": unit.read, "predicted": predicted, "bad": len(dead),
                   "file": name if predicted else None, "first_bad": dead[:FIRST_BAD],
                   "batch_rows": answered.batch_rows, "measured": answered.measured}
        with FileSystems.create(FileSystems.join(self.out_dir, "_units", f"unit-{unit.unit:05d}.json")) as f:
            f.write(json.dumps(summary).encode())


# ---- the output's columns ------------------------------------------------------------------------

class Layout:
    """Which columns a prediction file holds and how they are encoded: the carried input columns
    (row IDs, the label when present), the features (or only --key), then the model's answer and
    the model's name and version."""

    def __init__(self, model: ModelVersion, carried: tuple[str, ...], key: str | None,
                 output_format: str, prediction_log: bool = False):
        self.output_format, self.prediction_log = output_format, prediction_log
        schema = model.schema
        if schema is None:  # images: each file's path (and its class folder, when it is in one)
            self.task, self.classes, self.label_type = "multiclass", list(model.classes), "string"
            self.inputs = [(n, "string") for n in carried]
        else:
            self.task = schema.label.task
            self.classes = [str(c) for c in schema.label.classes or []]
            self.label_type = schema.label.type
        if schema is not None and key:
            self.inputs = [(key, "string")]
        elif schema is not None:
            features = [(f.name, f.type) for f in schema.features]
            taken = {n for n, _ in features}
            self.inputs = [(n, "string") for n in carried if n not in taken and n != schema.label.name] + features
            if schema.label.name in carried and schema.label.name not in taken:
                self.inputs.append((schema.label.name, schema.label.type))
        names = {n for n, _ in self.inputs}
        self.prefix = "prediction_" if names & set(self._answer_names("")) else ""
        self.answers = self._answer_names(self.prefix)
        self.model_name, self.model_version = model.name, model.version

    def _answer_names(self, prefix: str) -> list[str]:
        if self.task == "regression":
            return [f"{prefix}prediction", "model", "model_version"]
        return ([f"{prefix}prediction", f"{prefix}probability"] + [f"{prefix}probability_{c}" for c in self.classes]
                + ["model", "model_version"])

    @property
    def columns(self) -> list[str]:
        return [n for n, _ in self.inputs] + self.answers

    def table(self, pieces: list[Rows], scored: list[Scored]):
        """A pyarrow Table of every row the model answered, in order (a missing value as null)."""
        import pyarrow as pa

        kept = [(rows, answer) for rows, answer in zip(pieces, scored) if len(answer.taken)]
        n = sum(len(answer.taken) for _, answer in kept)
        arrays = {}
        for name, type_ in self.inputs:
            values = np.concatenate([rows.columns[name].values[answer.taken] for rows, answer in kept])
            present = np.concatenate([rows.columns[name].present[answer.taken] for rows, answer in kept])
            arrow = {"float": pa.float64(), "int": pa.int64()}.get(type_, pa.string())
            if type_ == "string":
                values = values.astype(object)
                values[~present] = None
                arrays[name] = pa.array(values, type=arrow)
            else:
                arrays[name] = pa.array(values, type=arrow, mask=~present)
        if self.task == "regression":
            arrays[self.answers[0]] = pa.array(np.concatenate([a.outputs["predictions"] for _, a in kept])
                                               .astype(np.float64))
        else:
            probabilities = np.concatenate([a.outputs["probabilities"] for _, a in kept]).astype(np.float64)
            classes = np.concatenate([a.outputs["classes"] for _, a in kept])
            texts = pa.array(classes.astype(object), type=pa.binary()).cast(pa.string())
            arrays[self.answers[0]] = texts.cast(pa.int64()) if self.label_type == "int" else texts
            arrays[self.answers[1]] = pa.array(probabilities.max(axis=1))
            for j in range(len(self.classes)):
                arrays[self.answers[2 + j]] = pa.array(probabilities[:, j])
        arrays["model"] = pa.array([self.model_name] * n, type=pa.string())
        arrays["model_version"] = pa.array(np.full(n, self.model_version, dtype=np.int64))
        return pa.table(arrays)

    def encode(self, table) -> bytes:
        if self.output_format == "parquet":
            import pyarrow.parquet as pq

            buffer = io.BytesIO()
            pq.write_table(table, buffer)
            return buffer.getvalue()
        if self.output_format == "jsonl":
            return "".join(json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n"
                           for row in table.to_pylist()).encode()
        import pyarrow as pa
        import pyarrow.csv as pcsv

        buffer = pa.BufferOutputStream()
        pcsv.write_csv(table, buffer, pcsv.WriteOptions(quoting_style="needed"))
        return buffer.getvalue().to_pybytes()


# ---- the stage -----------------------------------------------------------------------------------

@dataclass
class Plan:
    config: PredictConfig
    model: ModelVersion
    inputs: list[dict]  # for predict.json
    units: list  # WorkUnit (tables) or ImageUnit
    carried: tuple[str, ...]
    layout: Layout
    runner: str
    workers: int
    started: float


def check_inputs(config: PredictConfig) -> ModelVersion:
    """What can be checked before Beam and TensorFlow are imported: the model and the options
    (a --workdir fills in --model and --out)."""
    if config.workdir and not config.model:
        config.model = workdir_model(config.workdir)
    if config.workdir and not config.out:
        config.out = os.path.join(config.workdir, "predict")
    if not config.model:
        raise PredictError("no model given: pass --model BASE/NAME (or BASE/NAME/VERSION), or --workdir of a run")
    if not config.out:
        raise PredictError("no output directory: pass --out DIR")
    if not config.input:
        raise PredictError("no input given: pass --input FILE (or a glob)")
    out = os.path.abspath(config.out)
    if not is_remote(config.out) and os.path.exists(out) and not config.force:
        if not os.path.isdir(out) or os.listdir(out):
            raise PredictError(f"--out {config.out} exists: pass --force to replace it, or another --out")
    return resolve(config.model)


def workdir_model(workdir: str) -> str:
    """The model base path a `tfpipe run` workdir serves: WORKDIR/export/models/NAME (its only one)."""
    models = os.path.join(workdir, "export", "models")
    names = sorted(d for d in os.listdir(models) if served(os.path.join(models, d)) is not None) \
        if os.path.isdir(models) else []  # a base path serves a version; another folder there is not one
    if len(names) != 1:
        found = f"it holds {', '.join(names)}" if names else "it holds no exported model"
        raise PredictError(f"--workdir {workdir}: {models} should hold one model ({found}); pass --model BASE/NAME")
    return os.path.join(models, names[0])


def run(config: PredictConfig, log: Callable[[str], None] = print) -> StageResult:
    """Batch inference: the output directory published atomically, and its result."""
    return result(_run(config, log))


def _run(config: PredictConfig, log: Callable[[str], None]) -> str:
    """Batch inference; the output directory."""
    if config.environment and not in_environment(config.environment):
        return run_in_environment(config, log, "predict", PredictError)
    started = time.time()
    model = check_inputs(config)
    if model.images:
        log(f"model: {model.name} version {model.version} ({model.path}): images, {len(model.classes)} classes")
        files = find_image_files(config.input)
        total = sum(os.path.getsize(f.path) for f in files if not is_remote(f.path))
        log(f"inputs: {len(files):,} file(s), {human_bytes(total)}")
        options, runner, workers = beam_options(config.beam_args, total, config.runner)
        per_unit = max(1, min(IMAGE_UNIT, math.ceil(len(files) / max(workers, 1))))
        units = [ImageUnit(i, tuple(files[start:start + per_unit]))
                 for i, start in enumerate(range(0, len(files), per_unit))]
        carried = ("path", "label") if any(f.label for f in files) else ("path",)
        inputs = [{"path": f.path} for f in files]
    else:
        schema = model.schema
        log(f"model: {model.name} version {model.version} ({model.path}): {len(schema.features)} features, "
            f"{schema.label.task} of '{schema.label.name}'")
        found = resolve_inputs(config.input, config.format)
        if any(f.format == "images" for f in found):
            raise PredictError(f"{model.name} is a table model: give it CSV, JSON Lines or Parquet files, not images")
        total = sum(f.size for f in found)
        log(f"inputs: {len(found)} file(s), {human_bytes(total)}")
        options, runner, workers = beam_options(config.beam_args, total, config.runner)
        shards = max(1, min(1024, math.ceil(total / UNIT_BYTES)), workers)
        grain = max(64 << 10, min(16 << 20, total // (shards * 8) or 1))
        scanned = [scan_file(f, grain, config.delimiter) for f in found]
        for f in scanned:
            if f.format == "csv" and f.delimiter != "," and config.delimiter == "auto":
                log(f"{os.path.basename(f.path)}: fields separated by {delimiter_name(f.delimiter)}s "
                    f"({shown_delimiter(f.delimiter)}, detected; --delimiter sets it)")
        carried = _carried(schema, scanned, config.key)
        units = plan_units(scanned, shards)
        inputs = [{"path": f.path, "format": f.format, "size": f.size, "sha256": f.sha256} for f in scanned]
    layout = Layout(model, carried, config.key, config.output_format, config.prediction_log)
    if layout.prefix:
        log(f"an input column is named like a prediction column: the answers are named {layout.prefix}*")
    plan = Plan(config, model, inputs, units, carried, layout, runner, workers, started)
    calls = (f"model calls of up to {config.batch_rows:,} {'images' if model.images else 'rows'}" if config.batch_rows
             else "model calls sized by measuring the model in each worker")
    log(f"running Beam ({runner}, {workers} worker{'s' if workers > 1 else ''}): {len(units)} work unit(s), {calls}")
    out = config.out if is_remote(config.out) else os.path.abspath(config.out)
    return run_to_temp(out, options, len(units), lambda p, tmp: build_pipeline(p, plan, tmp),
                       lambda tmp: _finish(plan, tmp, out, log), log, watch=lambda tmp: RowProgress(tmp, len(units), log))


def _carried(schema: Schema, files: list[InputFile], key: str | None) -> tuple[str, ...]:
    """The input columns carried beside the features: --key, or every other column of a CSV or
    Parquet input (row IDs, the label, any column the model does not take), or of JSON Lines the
    label and the columns the data stage left out. A CSV or Parquet input that lacks one of the
    model's feature columns is refused: every row would be scored without it."""
    features = [f.name for f in schema.features]
    for f in files:
        if f.columns is None:
            continue  # JSON Lines: a row without a column has it missing, as in training
        absent = [c for c in features if c not in f.columns]
        if absent:
            shown = ", ".join(absent[:10]) + (" ..." if len(absent) > 10 else "")
            raise PredictError(f"{f.path} lacks {len(absent)} of the model's feature columns ({shown}); "
                               f"its columns: {', '.join(f.columns[:30])}")
        if key and key not in f.columns:
            raise PredictError(f"--key: column '{key}' not found in {f.path}")
    if key:
        return (key,)
    # the input's other columns, in its order (a JSON Lines input's: those the data stage knew of)
    header = [c for f in files for c in (f.columns or ())]
    known = bool(header) and all(f.columns is not None for f in files)
    wanted = header if known else [schema.label.name] + list(schema.excluded) + ([schema.key] if schema.key else [])
    return tuple(dict.fromkeys(c for c in wanted if c not in features))


def build_pipeline(p: beam.Pipeline, plan: Plan, out_dir: str) -> None:
    schema = plan.model.schema
    handler = TableModelHandler(plan.model.path, plan.model.name, plan.model.version,
                                schema.to_json() if schema is not None else None, plan.config.batch_rows,
                                plan.config.prediction_log)
    reader = ReadImages() if schema is None else ReadRows(schema.to_json(), list(_na(plan)), plan.carried)
    _ = (p
         | "WorkUnits" >> beam.Create(plan.units)
         | "Read" >> beam.ParDo(reader).with_output_types(UnitRows)
         | "Predict" >> RunInference(handler).with_output_types(Answered)
         | "WriteUnits" >> beam.ParDo(WriteUnit(out_dir, plan.layout)))


def _na(plan: Plan) -> list[str]:
    if plan.config.na_values is not None:
        return plan.config.na_values
    return plan.model.data.get("config", {}).get("na_values") or []


def _finish(plan: Plan, tmp: str, out: str, log: Callable[[str], None]) -> str:
    summaries = read_unit_summaries([u.index for u in plan.units], tmp)
    read = sum(s["read"] for s in summaries)
    predicted = sum(s["predicted"] for s in summaries)
    bad = sum(s["bad"] for s in summaries)
    if read != predicted + bad:
        raise RuntimeError(f"row accounting failed: read {read} != predicted {predicted} + dead-lettered {bad}")
    if read == 0:
        raise PredictError("the inputs hold no data rows")
    first_bad = [b for s in summaries for b in s["first_bad"]][:FIRST_BAD]
    if bad / read > plan.config.max_bad_fraction:
        reasons = "\n".join(f"  {_where(b)}: {b['reason']}" for b in first_bad)
        raise PredictError(f"{bad} of {read} rows are bad ({bad / read:.2%}), over --max-bad-fraction "
                           f"{plan.config.max_bad_fraction:g}; nothing was written. First bad rows:\n{reasons}")
    files = sorted(s["file"] for s in summaries if s["file"])
    logs = [f"{PREDICTION_LOGS}/{LOG_PREFIX}-{s['unit']:05d}{LOG_SUFFIX}" for s in summaries
            if s["file"] and plan.config.prediction_log]
    elapsed = time.time() - plan.started
    manifest = {
        "stage": "predict", "tfpipe_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
        "config": plan.config.model_dump(),
        "model": {"name": plan.model.name, "version": plan.model.version, "path": plan.model.path},
        "inputs": plan.inputs,
        "beam": {"runner": plan.runner, "workers": plan.workers, "units": len(plan.units), "version": beam.__version__},
        "tensorflow_version": _installed("tensorflow"),  # the launcher's
        "batch_rows": sorted({s["batch_rows"] for s in summaries}),  # each worker's (measured or given)
        "counts": {"read": read, "predicted": predicted, "bad": bad},
        "columns": plan.layout.columns,
        "outputs": {"format": plan.config.output_format, "files": files, "prediction_logs": logs,
                    "deadletter": deadletter_files(tmp)},
        "first_bad": first_bad,
        "elapsed_s": round(elapsed, 3), "rows_per_s": round(read / elapsed, 1) if elapsed > 0 else None,
    }
    write_outputs(tmp, {"predict.json": manifest})
    publish(tmp, out, files + logs + manifest["outputs"]["deadletter"] + ["predict.json"])
    noun = "images" if plan.model.images else "rows"
    if not plan.config.batch_rows:
        log(_measured(summaries, noun))
    log(f"{read:,} {noun} read -> {predicted:,} predicted, {bad:,} dead-lettered"
        + (f" (deadletter/; first: {_where(first_bad[0])}: {first_bad[0]['reason']})"
           if first_bad else "")
        + f"; {len(files)} {plan.config.output_format} file(s) in {out} ({elapsed:.1f} s, "
          f"{read / max(elapsed, 1e-9):,.0f} {noun}/s)")
    return out


def _measured(summaries: list[dict], noun: str) -> str:
    """What the worker processes measured as each loaded the model, and chose, as one line."""
    chosen = sorted({s["batch_rows"] for s in summaries})
    said = {json.dumps(s["measured"]): s["measured"] for s in summaries if s["measured"]}
    speeds = "; ".join(f"process {i}: " * (len(said) > 1)
                       + ", ".join(f"{int(size):,} -> {rate:,.0f} {noun}/s" for size, rate in m.items())
                       for i, m in enumerate(said.values(), start=1))
    return (f"model calls of {' and '.join(f'{c:,}' for c in chosen)} {noun}, as measured where the model was "
            f"loaded ({speeds or 'no test rows kept with the version: the default size'}; --batch-rows sets it)")


def _installed(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _where(bad: dict) -> str:
    """A dead-letter entry's place: FILE:LINE for a row, the file for an image."""
    return f"{bad['source']}:{bad['line']}" if "line" in bad else bad["source"]


class RowProgress(progress):
    """The data stage's progress lines, with rows done, rows/s and the time left, from the work
    units' summaries as they appear."""

    def __init__(self, tmp: str, total: int, log):
        super().__init__(tmp, total, log)
        self._seen: dict[str, int] = {}

    def _watch(self) -> None:
        while not self._stop.wait(2.0):
            new = False
            for m in match(FileSystems.join(self.tmp, "_units", "*.json")):
                if m.path not in self._seen:
                    try:
                        with FileSystems.open(m.path) as f:
                            self._seen[m.path] = json.loads(f.read())["read"]
                        new = True
                    except Exception:  # noqa: BLE001 (being written: read at the next look)
                        pass
            done = len(self._seen)
            if new and done < self.total:
                elapsed = time.time() - self.started
                rows = sum(self._seen.values())
                left = elapsed / done * (self.total - done)
                self.log(f"  {done}/{self.total} work units, {rows:,} rows ({rows / elapsed:,.0f} rows/s), "
                         f"about {left:.0f} s left")


def result(out: str) -> StageResult:
    """The batch inference's output: the counts in one line."""
    path = FileSystems.join(out, "predict.json")
    with FileSystems.open(path) as f:
        m = json.loads(f.read())
    c = m["counts"]
    return StageResult(path, f"{c['read']:,} rows -> {c['predicted']:,} predicted, {c['bad']:,} dead-lettered",
                       StageOutputs(out))


if __name__ == "__main__":
    raise SystemExit(environment_main("predict", PredictConfig, run))
