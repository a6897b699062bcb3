"""Feature columns from logged requests and from the training split, in the form the data stage's
statistics combiner takes (`Column`: values and a presence mask per feature).

A logged request gives its rows in one of two shapes:
- named tensors (Predict on serving_default): one tensor per feature, a value per row;
- tf.train.Examples: Classify, Regress and MultiInference (`Input.example_list`, or
  `example_list_with_context`, whose context features every example shares), and Predict on a
  signature taking serialized Examples (predict_examples).
A value is missing as the model sees it missing: an absent feature, a NaN, an empty string.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tfpipe.pipeline.validation import Column
from tfpipe.pipeline.schema import Schema


@dataclass
class Traffic:
    """What the requests of a log held, as columns, with counts of what did not fit the schema."""

    schema: Schema
    rows: int = 0
    requests: int = 0
    by_api: Counter = field(default_factory=Counter)  # "predict/grpc" -> requests
    unknown_inputs: Counter = field(default_factory=Counter)  # input or feature names not in the schema -> rows
    unreadable: Counter = field(default_factory=Counter)  # feature -> values that could not be read as its type
    skipped: Counter = field(default_factory=Counter)  # why a request gave no rows -> requests
    _values: dict[str, list[np.ndarray]] = field(default_factory=dict)
    _present: dict[str, list[np.ndarray]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.kinds = {c.name: "string" if c.type == "string" else "numeric" for c in self.schema.features}
        for name in self.kinds:
            self._values[name], self._present[name] = [], []

    def add(self, chunk: dict[str, tuple[np.ndarray, np.ndarray]], n: int) -> None:
        """`n` rows: per feature its values and presence; features the chunk lacks are missing."""
        for name, kind in self.kinds.items():
            if name in chunk:
                values, present = chunk[name]
            else:
                values = np.full(n, "", dtype=object) if kind == "string" else np.full(n, np.nan)
                present = np.zeros(n, dtype=bool)
            self._values[name].append(values)
            self._present[name].append(present)
        self.rows += n

    def freeze(self) -> None:
        """Join the chunks into `columns` (after the last `add`)."""
        self.columns: dict[str, Column] = {}
        for name, kind in self.kinds.items():
            empty = np.zeros(0, dtype=object if kind == "string" else np.float64)
            self.columns[name] = Column(np.concatenate(self._values[name]) if self._values[name] else empty,
                                        np.concatenate(self._present[name]) if self._present[name]
                                        else np.zeros(0, bool))


def typed(name: str, kind: str, raw: np.ndarray, traffic: Traffic) -> tuple[np.ndarray, np.ndarray]:
    """A feature's raw values (numbers, or bytes/str) as float64 with NaN, or str with ''."""
    raw = np.asarray(raw).reshape(-1)
    if kind == "string":
        values = np.array([v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in raw.tolist()],
                          dtype=object)
        return values, values != ""
    if raw.dtype.kind in "biuf":
        values = raw.astype(np.float64)
    else:  # strings where numbers belong: read what parses, count the rest
        values = np.full(len(raw), np.nan)
        for i, v in enumerate(raw.tolist()):
            text = v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
            try:
                values[i] = float(text) if text.strip() else np.nan
            except ValueError:
                traffic.unreadable[name] += 1
    return values, ~np.isnan(values)


def example_chunk(examples: list, context, traffic: Traffic) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Columns of tf.train.Examples (each feature's first value; context features fill in absent ones)."""
    n = len(examples)
    raw: dict[str, list] = {name: [None] * n for name in traffic.kinds}
    ctx = context.features.feature if context is not None else {}
    for i, ex in enumerate(examples):
        feats = ex.features.feature
        for key in set(feats) | set(ctx):
            if key not in raw:
                if key != traffic.schema.label.name:
                    traffic.unknown_inputs[key] += 1
                continue
            f = feats[key] if key in feats else ctx[key]
            kind = f.WhichOneof("kind")
            values = getattr(f, kind).value if kind else ()
            if len(values):
                raw[key][i] = values[0]
    chunk = {}
    for name, kind in traffic.kinds.items():
        column = raw[name]
        present = np.array([v is not None for v in column], dtype=bool)
        if kind == "string":
            filled = np.array([b"" if v is None else v for v in column], dtype=object)
        else:
            filled = np.array([np.nan if v is None else v for v in column], dtype=object)
            if all(isinstance(v, (int, float)) for v in filled.tolist()):
                filled = filled.astype(np.float64)
        values, ok = typed(name, kind, filled, traffic)
        chunk[name] = (values, ok & present)
    return chunk


def add_request(log, traffic: Traffic) -> None:
    """The rows of one logged call (a PredictionLog) into `traffic`."""
    import tensorflow as tf
    from tensorflow.core.example import example_pb2

    which = log.WhichOneof("log_type")
    if which == "predict_log":
        inputs = log.predict_log.request.inputs
        names = [k for k in inputs if k in traffic.kinds]
        if not names:
            strings = [k for k, t in inputs.items() if t.dtype == tf.string.as_datatype_enum]
            if len(strings) == 1 and len(inputs) == 1:  # serialized tf.Examples (predict_examples)
                serialized = tf.make_ndarray(inputs[strings[0]]).reshape(-1).tolist()
                try:
                    examples = [example_pb2.Example.FromString(s) for s in serialized]
                except Exception:
                    traffic.skipped["a string input that is neither features nor tf.Examples"] += 1
                    return
                traffic.add(example_chunk(examples, None, traffic), len(examples))
                return
            for k in inputs:
                traffic.unknown_inputs[k] += 1
            traffic.skipped["no input named after a feature"] += 1
            return
        arrays = {k: tf.make_ndarray(inputs[k]).reshape(-1) for k in names}
        sizes = {len(a) for a in arrays.values()}
        if len(sizes) != 1:
            traffic.skipped["inputs of different lengths"] += 1
            return
        n = sizes.pop()
        for k in inputs:
            if k not in traffic.kinds:
                traffic.unknown_inputs[k] += n
        traffic.add({k: typed(k, traffic.kinds[k], a, traffic) for k, a in arrays.items()}, n)
        return
    part = getattr(log, which) if which else None
    inp = part.request.input if part is not None and hasattr(part.request, "input") else None
    if inp is None:
        traffic.skipped[f"a {which} record without input" if which else "an empty record"] += 1
        return
    kind = inp.WhichOneof("kind")
    if kind == "example_list":
        examples, context = list(inp.example_list.examples), None
    elif kind == "example_list_with_context":
        examples, context = list(inp.example_list_with_context.examples), inp.example_list_with_context.context
    else:
        traffic.skipped["a request without examples"] += 1
        return
    traffic.add(example_chunk(examples, context, traffic), len(examples))


def read_traffic(logs: list[tuple], schema: Schema, model: str | None) -> Traffic:
    """The rows of (PredictionLog, RequestTiming) pairs, those to `model` only when it is given."""
    traffic = Traffic(schema)
    for log, timing in logs:
        if model is not None and log.log_metadata.model_spec.name != model:
            continue
        traffic.requests += 1
        api = log.WhichOneof("log_type") or "unknown"
        traffic.by_api[f"{api.removesuffix('_log')}/{timing.protocol or 'unknown'}"] += 1
        add_request(log, traffic)
    traffic.freeze()
    return traffic


def read_split(files: list[str], schema: Schema) -> Traffic:
    """The split's rows (gzip TFRecords of tf.Examples, as the data stage writes them) as columns."""
    import tensorflow as tf

    dtypes = {"int": tf.int64, "float": tf.float32, "string": tf.string}
    spec = {c.name: tf.io.RaggedFeature(dtypes[c.type]) for c in schema.features}
    traffic = Traffic(schema)
    ds = tf.data.TFRecordDataset(files, compression_type="GZIP").batch(4096).map(
        lambda s: tf.io.parse_example(s, spec))
    for batch in ds:
        n = None
        chunk: dict[str, Any] = {}
        for c in schema.features:
            splits, flat = batch[c.name].row_splits.numpy(), batch[c.name].flat_values.numpy()
            lengths = np.diff(splits)
            n = len(lengths)
            present = lengths > 0
            firsts = flat[splits[:-1][present]]
            kind = traffic.kinds[c.name]
            if kind == "string":
                values = np.full(n, "", dtype=object)
                values[present] = [v.decode("utf-8", "replace") for v in firsts.tolist()]
            else:
                values = np.full(n, np.nan)
                values[present] = firsts.astype(np.float64)
            chunk[c.name] = (values, present)
        traffic.add(chunk, n or 0)
    traffic.freeze()
    return traffic
