"""The model `tfpipe predict` scores with: which version a path names, what it was trained on, and
the RunInference handler that calls it.

The handler loads the version as the embedded server does (`serve.core.servable.Servable`) and
calls its serving_default signature with the rows' columns as raw named tensors, through the same
input checks and the same packed call, so that a batch job answers what the server answers for
the same rows and version. Beam's own TensorFlow handlers cannot: they load with
`keras.models.load_model`, which refuses SavedModel directories under Keras 3, and call the model
rather than a signature; tfx-bsl's handler needs tensorflow-serving-api 2.19 beside our 2.21 and
runs only Example signatures (docs/predict.md says what was tried).
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
import sys
import time
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import apache_beam as beam
import numpy as np
from apache_beam.ml.inference.base import ModelHandler

from tfpipe.pipeline.validation import Column
from tfpipe.pipeline.schema import Schema, load_schema
from tfpipe.predict.errors import PredictError
from tfpipe.versions import CANDIDATES, served, version_path

TEST_DATA = os.path.join("assets.extra", "test_data")  # what every version keeps of its data (export.judge)
SIGNATURE = "serving_default"


IMAGE_INPUT = "image_bytes"  # an image model's serving_default input: encoded image files (export/images.py)


@dataclass(frozen=True)
class ModelVersion:
    name: str
    version: int
    path: str  # the version's directory (a SavedModel)
    schema: Schema | None  # what a table model was trained on (None for an image model)
    data: dict  # its data stage's data.json (how the training rows were read)
    classes: tuple[str, ...] = ()  # an image model's classes, in label-id order

    @property
    def images(self) -> bool:
        return self.schema is None


def resolve(model: str) -> ModelVersion:
    """BASE/NAME (the version a server polling it serves: the highest numeric one), or
    BASE/NAME/VERSION (served or kept as a candidate), or a SavedModel directory of a version."""
    path = os.path.abspath(model.rstrip("/"))
    if not os.path.exists(path):
        raise PredictError(f"--model {model}: no such directory")
    if os.path.exists(os.path.join(path, "saved_model.pb")):
        version_dir = path
        parent = os.path.dirname(path)
        if os.path.basename(parent) == CANDIDATES:
            parent = os.path.dirname(parent)
        name = os.path.basename(parent)
        try:
            version = int(os.path.basename(path))
        except ValueError:
            raise PredictError(f"--model {model}: a SavedModel whose directory is not a version number; give "
                               "BASE/NAME/VERSION as the export wrote it") from None
    else:
        version = served(path)
        if version is None:
            raise PredictError(f"--model {model}: neither a model base path (BASE/NAME, holding numeric version "
                               "directories) nor a version's SavedModel directory")
        version_dir = version_path(path, version)
        name = os.path.basename(path)
    stored = os.path.join(version_dir, TEST_DATA)
    try:
        with open(os.path.join(stored, "data.json")) as f:
            data = json.load(f)
        with open(os.path.join(stored, "schema.json")) as f:
            schema_doc = json.load(f)
    except FileNotFoundError:
        raise PredictError(f"{version_dir} keeps no schema of its training data ({TEST_DATA}/): it was not "
                           "exported by tfpipe export, or by a release before versions kept one") from None
    if schema_doc.get("kind") == "images":
        classes = tuple(str(c) for c in schema_doc["label"]["classes"])
        return ModelVersion(name, version, version_dir, None, data, classes)
    return ModelVersion(name, version, version_dir, load_schema(os.path.join(stored, "schema.json")), data)


@dataclass
class Rows:
    """Rows of one work unit, validated: `seq` orders a unit's pieces, `lines` are the rows' line
    (or row) numbers in `source`, `raws` their text as read (for the dead-letter)."""

    unit: int
    seq: int
    source: str
    lines: np.ndarray
    raws: list[str]
    columns: dict[str, Column]

    def __len__(self) -> int:
        return len(self.lines)

    def split(self, rows: int) -> list["Rows"]:
        """These rows in pieces of at most `rows` (views, not copies)."""
        if len(self) <= rows:
            return [self]
        return [Rows(self.unit, self.seq, self.source, self.lines[i:i + rows], self.raws[i:i + rows],
                     {k: type(c)(c.values[i:i + rows], c.present[i:i + rows]) for k, c in self.columns.items()})
                for i in range(0, len(self), rows)]


def _columns_bytes(columns: dict) -> int:
    return sum(c.values.nbytes + c.present.nbytes for c in columns.values())


@dataclass
class UnitRows:
    """A work unit read: its good rows (a Rows per batch read, each of one source file), the rows
    dead-lettered on the way, and how many it read. RunInference's element."""

    unit: int
    pieces: list[Rows]
    bad: list[dict]
    read: int

    def nbytes(self) -> int:
        return sum(_columns_bytes(rows.columns) for rows in self.pieces)


@dataclass
class Scored:
    """What the model answered for a Rows: its outputs for the rows it took (`taken`, their
    positions), and a reason for each row it refused."""

    outputs: dict[str, np.ndarray]
    taken: np.ndarray
    refused: dict[int, str]
    logs: list[bytes] | None = None  # with --prediction-log: a PredictionLog per row taken


def model_inputs(rows: Rows, schema: Schema | None, dtypes: dict[str, Any]) -> tuple[dict[str, np.ndarray],
                                                                                     dict[int, str]]:
    """The signature's inputs for `rows` (missing values as the model takes them: NaN for a number,
    "" for a text) and the rows that cannot be one: a missing value for an input the model takes
    only as whole numbers (int64). An image model (`schema` None) takes the files' bytes."""
    if schema is None:
        return {IMAGE_INPUT: rows.columns[IMAGE_INPUT].values}, {}
    inputs, refused = {}, {}
    for f in schema.features:
        col = rows.columns[f.name]
        dtype = dtypes[f.name]
        if dtype == object:
            values = col.values.copy()
            values[~col.present] = ""
            inputs[f.name] = values
        elif dtype.kind == "f":
            values = col.values.astype(dtype)
            values[~col.present] = np.nan
            inputs[f.name] = values
        else:
            for i in np.flatnonzero(~col.present):
                refused.setdefault(int(i), f"column '{f.name}': a missing value, which the model takes only as a "
                                           "whole number (its training data never missed one)")
            inputs[f.name] = col.values.astype(dtype)
    return inputs, refused


@dataclass
class Answered:
    """A work unit and what the model answered for it: a Scored per piece of `unit.pieces`, in
    model calls of up to `batch_rows` rows (as `measured`, or given). RunInference's output."""

    unit: UnitRows
    scored: list[Scored]
    batch_rows: int
    measured: dict[int, float] | None  # rows a call -> rows/s, when the worker measured

    def nbytes(self) -> int:
        return self.unit.nbytes() + sum(v.nbytes for s in self.scored for v in s.outputs.values())


class SizedCoder(beam.coders.Coder):
    """Pickle, with a size estimate that encodes nothing: Beam estimates the size of sampled
    elements (every one of the first ten of each step) by encoding them, which for an element of a
    whole work unit is a large share of the job (docs/benchmarks.md, batch inference)."""

    def encode(self, value) -> bytes:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)

    def decode(self, encoded: bytes):
        return pickle.loads(encoded)

    def is_deterministic(self) -> bool:
        return False

    def estimate_size(self, value) -> int:
        return value.nbytes()


beam.coders.registry.register_coder(UnitRows, SizedCoder)
beam.coders.registry.register_coder(Answered, SizedCoder)


BATCH_SIZES = (256, 1024, 4096)  # rows a call, tried when a worker loads a table model
IMAGE_BATCH_SIZES = (4, 16, 64)  # the same for an image model


@dataclass
class Loaded:
    """A worker's model: the version as the server loads it, the schema its rows are read with
    (None: an image model), and the rows a call (given, or measured at load)."""

    servable: Any  # serve.core.servable.Servable
    schema: Schema | None
    batch_rows: int
    measured: dict[int, float] | None


class TableModelHandler(ModelHandler[UnitRows, Answered, Loaded]):
    """RunInference's handler for a tfpipe model: each element is a work unit's rows (the job's
    UnitRows: a Rows per batch read), answered in model calls of `batch_rows` rows, consecutive
    pieces joined up to that size; the inference is a Scored per piece. The model is loaded once
    per worker process and shared by its threads (RunInference's default); with `batch_rows` None,
    the worker measures the size of its calls when it loads the model (`measure_batch_rows`), so
    that the launcher never imports TensorFlow."""

    def __init__(self, version_dir: str, name: str, version: int, schema_json: dict | None, batch_rows: int | None,
                 prediction_log: bool = False):
        super().__init__()
        self.version_dir, self.name, self.version = version_dir, name, version
        self.schema_json, self.batch_rows, self.prediction_log = schema_json, batch_rows, prediction_log

    def load_model(self) -> Loaded:
        _import_tensorflow()
        from tfpipe.serve.core.servable import Servable

        servable = Servable(self.name, self.version, self.version_dir)
        schema = Schema.from_json(self.schema_json) if self.schema_json is not None else None
        if self.batch_rows:
            return Loaded(servable, schema, self.batch_rows, None)
        chosen, measured = measure_batch_rows(servable, self.version_dir, schema)
        return Loaded(servable, schema, chosen, measured)

    def batch_elements_kwargs(self) -> dict:
        return {"min_batch_size": 1, "max_batch_size": 1}  # a unit a batch: the handler makes the calls

    def run_inference(self, batch: Sequence[UnitRows], model: Loaded, inference_args=None) -> Iterable[Answered]:
        sig = model.servable.signature(SIGNATURE)
        for unit in batch:
            unit.pieces = [part for rows in unit.pieces for part in rows.split(model.batch_rows)]
            scored: list[Scored] = []
            call: list = []
            pieces = [(rows, *model_inputs(rows, model.schema, sig.numpy_dtypes)) for rows in unit.pieces]
            for piece in pieces + [None]:
                if call and (piece is None or sum(len(r) for r, _, _ in call) + len(piece[0]) > model.batch_rows):
                    scored += _scored(model.servable, sig, call)
                    call = []
                if piece is not None:
                    call.append(piece)
            if self.prediction_log:
                for (_, inputs, _), answer in zip(pieces, scored):
                    if len(answer.taken):
                        answer.logs = prediction_logs(self.name, self.version, sig,
                                                      {k: v[answer.taken] for k, v in inputs.items()}, answer.outputs)
            yield Answered(unit, scored, model.batch_rows, model.measured)

    def get_num_bytes(self, batch: Sequence[UnitRows]) -> int:
        """For RunInference's byte metrics: the columns' array bytes (Beam's default pickles the whole
        batch to measure it)."""
        return sum(unit.nbytes() for unit in batch)

    def get_metrics_namespace(self) -> str:
        return "tfpipe_predict"


def _import_tensorflow() -> None:
    """Import TensorFlow without scikit-learn, in a worker that has imported neither: TensorFlow
    imports Keras 3 at once, and Keras' scikit-learn wrappers import scikit-learn and SciPy when
    they are installed, a large share of a worker's start-up for wrappers it never builds. Keras
    takes their absence; scikit-learn imports as usual afterwards."""
    if "tensorflow" in sys.modules or "sklearn" in sys.modules:
        return
    sys.modules["sklearn"] = None  # an import of it raises ImportError
    try:
        importlib.import_module("tensorflow")
    finally:
        if "sklearn" in sys.modules and sys.modules["sklearn"] is None:
            del sys.modules["sklearn"]


def measure_batch_rows(servable, version_dir: str, schema: Schema | None) -> tuple[int, dict[int, float] | None]:
    """The rows a model call: the smallest of BATCH_SIZES whose rows/s is within 10% of the best
    measured in this process with the version's own test rows (a larger call holds more memory and
    gives the workers' threads fewer turns, for little more speed); with the rows/s of each size.
    A version without test rows gets the middle size, unmeasured (None)."""
    sizes = IMAGE_BATCH_SIZES if schema is None else BATCH_SIZES
    sig = servable.signature(SIGNATURE)
    rows = _test_rows(version_dir, schema)
    if rows is None or len(rows) == 0:
        return sizes[1], None
    speeds = {}
    for size in sizes:
        idx = np.arange(size) % len(rows)
        piece = Rows(0, 0, "", idx, [""] * size, {k: Column(c.values[idx], c.present[idx]) for k, c in rows.columns.items()})
        inputs, _ = model_inputs(piece, schema, sig.numpy_dtypes)
        _call(servable, sig, inputs)  # the first call of a shape traces nothing, but warms caches
        calls, begun = 0, time.perf_counter()
        while calls < 2 or time.perf_counter() - begun < 0.1:
            _call(servable, sig, inputs)
            calls += 1
        speeds[size] = size * calls / (time.perf_counter() - begun)
    best = max(speeds.values())
    return min(s for s, v in speeds.items() if v >= 0.9 * best), speeds


def _test_rows(version_dir: str, schema: Schema | None) -> Rows | None:
    """The version's kept test rows (up to 4,096) as a Rows of typed columns, or its images' bytes;
    None when it keeps none that can be read."""
    import tensorflow as tf

    from tfpipe.train.data import parse_spec, raw_inputs
    from tfpipe.train.datadir import load_data_dir

    try:
        data = load_data_dir(os.path.join(version_dir, TEST_DATA))
        files = [f for split in data.manifest["outputs"]["splits"] for f in data.files(split)]
    except Exception:  # noqa: BLE001 (no rows to measure with: the default size)
        return None
    records = [r.numpy() for r in tf.data.TFRecordDataset(files, compression_type="GZIP").take(4096)]
    if not records:
        return None
    if schema is None:
        encoded = tf.io.parse_example(records, {"image/encoded": tf.io.FixedLenFeature([], tf.string)})
        images = encoded["image/encoded"].numpy()
        column = Column(np.array(list(images) + [b""], dtype=object)[:-1], np.ones(len(images), bool))
        return Rows(0, 0, "", np.arange(len(images)), [""] * len(images), {IMAGE_INPUT: column})
    spec = {k: v for k, v in parse_spec(schema).items() if k != schema.label.name}
    parsed = raw_inputs(tf.io.parse_example(records, spec), schema)
    columns = {}
    for f in schema.features:
        values = parsed[f.name].numpy()
        if values.dtype == object:
            present = values != b""
            values = np.array([v.decode("utf-8") for v in values], dtype=object)
        else:
            present = ~np.isnan(values)
            values = np.nan_to_num(values).astype(np.int64) if f.type == "int" else values
        columns[f.name] = Column(values, present)
    n = len(records)
    return Rows(0, 0, "", np.arange(n), [""] * n, columns)


def _scored(model, sig, pieces: list[tuple[Rows, dict, dict]]) -> list[Scored]:
    """One call for every piece's rows; when the model refuses the call (a value it does not
    take), each piece alone, and a refused piece row by row, so that only the rows it refuses go
    to the dead-letter, each with the model's reason."""
    import grpc

    from tfpipe.serve.errors import ServingError

    takes = [np.array([i for i in range(len(rows)) if i not in refused], dtype=np.int64)
             for rows, _, refused in pieces]
    if not any(len(take) for take in takes):  # every row refused before the model saw it
        return [Scored({}, take, dict(refused)) for (_, _, refused), take in zip(pieces, takes)]
    joined = {k: np.concatenate([inputs[k][take] for (_, inputs, _), take in zip(pieces, takes)])
              for k in pieces[0][1]}
    try:
        out = _call(model, sig, joined)
    except ServingError as e:
        if e.code != grpc.StatusCode.INVALID_ARGUMENT:  # not the rows' fault: the job fails, as a server's 5xx
            raise
        if len(pieces) > 1:
            return [s for piece in pieces for s in _scored(model, sig, [piece])]
        out = None
    if out is not None:
        result, start = [], 0
        for (_, _, refused), take in zip(pieces, takes):
            result.append(Scored({k: v[start:start + len(take)] for k, v in out.items()}, take, dict(refused)))
            start += len(take)
        return result
    rows, inputs, refused = pieces[0]
    refused = dict(refused)
    kept, answers = [], []
    for i in takes[0]:
        try:
            answers.append(_call(model, sig, {k: v[i:i + 1] for k, v in inputs.items()}))
            kept.append(i)
        except ServingError as e:
            if e.code != grpc.StatusCode.INVALID_ARGUMENT:
                raise
            refused[int(i)] = f"the model refused it: {e.message}"
    outputs = ({k: np.concatenate([a[k] for a in answers]) for k in answers[0]} if answers else {})
    return [Scored(outputs, np.array(kept, dtype=np.int64), refused)]


def _call(model, sig, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return model.run(sig, model.check_inputs(sig, inputs))


def prediction_logs(name: str, version: int, sig, inputs: dict[str, np.ndarray],
                    outputs: dict[str, np.ndarray]) -> list[bytes]:
    """A serialized TF Serving PredictionLog per row: the PredictRequest one client would have sent
    for it (its features as [1] tensors of the signature's dtypes) and the PredictResponse; the
    request log's records, which tfpipe skew reads."""
    import time

    from tensorflow.core.framework import tensor_pb2, types_pb2
    from tensorflow_serving.apis import prediction_log_pb2

    def tensor(values: np.ndarray, dtype) -> "tensor_pb2.TensorProto":
        values = np.asarray(values)
        t = tensor_pb2.TensorProto(dtype=dtype.as_datatype_enum)
        t.tensor_shape.dim.add(size=1)
        for d in values.shape:
            t.tensor_shape.dim.add(size=d)
        flat = values.reshape(-1)
        if dtype.as_datatype_enum == types_pb2.DT_STRING:
            t.string_val.extend(v if isinstance(v, bytes) else str(v).encode("utf-8") for v in flat)
        elif dtype.as_datatype_enum == types_pb2.DT_FLOAT:
            t.float_val.extend(flat.tolist())
        elif dtype.as_datatype_enum == types_pb2.DT_DOUBLE:
            t.double_val.extend(flat.tolist())
        else:
            t.int64_val.extend(int(v) for v in flat)
        return t

    now = int(time.time())
    records = []
    n = len(next(iter(inputs.values())))
    for i in range(n):
        log = prediction_log_pb2.PredictionLog()
        log.log_metadata.model_spec.name = name
        log.log_metadata.model_spec.version.value = version
        log.log_metadata.model_spec.signature_name = SIGNATURE
        log.log_metadata.timestamp_secs = now
        request = log.predict_log.request
        request.model_spec.CopyFrom(log.log_metadata.model_spec)
        for k, v in inputs.items():
            request.inputs[k].CopyFrom(tensor(v[i], sig.inputs[k][0]))
        response = log.predict_log.response
        response.model_spec.CopyFrom(log.log_metadata.model_spec)
        for k, v in outputs.items():
            response.outputs[k].CopyFrom(tensor(v[i], sig.outputs[k]))
        records.append(log.SerializeToString())
    return records
