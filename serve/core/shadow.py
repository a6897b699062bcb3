"""Shadow traffic (--shadow=SHARE): a share of the live requests mirrored to a model's candidate.

Which candidate: the manager loads, for each model whose base path has a `candidates/` folder, the
newest candidate when it is newer than the served range (`ModelManager.candidate`; see manager.py),
with the loading and warmup of any version, and follows it at every poll.

Which requests: Predict, Classify and Regress that name no version and no label, each drawn at
random with probability SHARE, once the served version has answered. Clients get the served
version's answer only, never later for the mirror:
  * the core hands the request's checked inputs (or tf.Examples) and the served outputs to `Shadow`
    after the served model call; they wait for the shadow's own thread (`tfpipe-shadow`), which
    calls the candidate, never through the batch queue, and compares the answers there too;
  * the thread takes what is pending once the first of it has waited WINDOW_S (or BATCH_ROWS rows
    are pending), and answers Predicts of the same signature, input shapes and output shapes with
    one call of the candidate on their rows together (a candidate's call costs much the same for
    one row as for a few: mirroring one request at a time cost the served traffic more than the
    candidate's own call). A call that fails answers each of its requests alone, so that an error
    is the request's own. Classify and Regress are answered one by one. Each request of a shared
    call records that call's time as the candidate's latency;
  * at most MAX_PENDING_ROWS rows (and MAX_PENDING_BYTES of inputs) wait: a request drawn beyond
    them is not mirrored and is counted as skipped (one that alone exceeds them still waits when
    nothing else does).

What is recorded (serve/shadow_report.py): per model, (served, candidate) versions, API and
signature, the mirrored and skipped requests, the candidate's errors by status, both latencies,
the agreement per row (class flips for string and int outputs, relative differences for float
ones, and per value of --shadow_slice's input) and the worst rows. Outputs are compared by name,
those of the served answer (a Predict's output_filter applies): one the candidate lacks, or of
another shape or kind, is an error of the candidate's (MISSING_OUTPUT, SHAPE_MISMATCH,
DTYPE_MISMATCH) with the reason. Prometheus counts them too (serve/metrics.py); with
--shadow_report_dir each process writes its records at every base-path poll and at its stop.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from tfpipe.files import writable_dir, write_atomic
from tfpipe.serve.core.batching import batch_shapes
from tfpipe.serve.core.examples import finished
from tfpipe.serve.core.manager import ModelManager
from tfpipe.serve.core.servable import Servable
from tfpipe.serve.errors import ServeError, ServingError
from tfpipe.serve.metrics import Metrics
from tfpipe.serve.shadow_report import MISSING_SLICE, Recorder, Record, report_file, report_path

WINDOW_S = 0.005  # how long the first of the pending requests waits for others to share the candidate's call
BATCH_ROWS = 256  # pending rows that end the wait at once
MAX_PENDING_ROWS = 1024  # rows waiting for the candidate; a request beyond them is skipped
MAX_PENDING_BYTES = 16 << 20  # and their inputs' bytes
CLOSE_WAIT_S = 10.0  # at stop, how long the mirrored calls in flight have to finish before the last report
_TINY = 1e-12


class Mismatch(Exception):
    """An output of the candidate's that cannot be compared with the served one."""

    def __init__(self, status: str, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


def check_options(share: float, report_dir: str) -> None:
    """--shadow within [0, 1], and --shadow_report_dir a directory this process can write in."""
    if not 0.0 <= share <= 1.0:
        raise ServeError(f"--shadow={share:g}: the share of requests mirrored to a candidate must be within 0 and 1 "
                         "(0: off, 1: every request that names no version or label)")
    why = writable_dir(report_dir) if share > 0 and report_dir else None
    if why:
        raise ServeError(f"--shadow_report_dir={report_dir}: {why}")


@dataclasses.dataclass
class _Mirrored:
    """A request waiting for the candidate: `call(candidate)` answers it alone; `inputs` (a Predict's
    checked inputs) and `group` (what requests answered by one call must share) when it may be
    answered together with others."""
    candidate: Servable
    key: tuple
    call: Callable[[Servable], dict[str, np.ndarray]]
    outputs: dict[str, np.ndarray]
    rows: _Rows
    served_seconds: float
    size: int  # rows
    nbytes: int
    inputs: dict[str, np.ndarray] | None = None
    group: tuple | None = None


class Shadow:
    """Mirrors requests to the manager's candidates and records the comparison. `draw()` is the
    random draw (tests pass their own); `window`, `max_pending_rows`: see the module's docstring."""

    def __init__(self, manager: ModelManager, share: float, slice_column: str, report_dir: str, metrics: Metrics,
                 log: Callable[[str], None] = print, draw: Callable[[], float] = random.random,
                 window: float = WINDOW_S, max_pending_rows: int = MAX_PENDING_ROWS):
        check_options(share, report_dir)
        self.manager, self.share, self.slice_column, self.report_dir = manager, share, slice_column, report_dir
        self.metrics, self.log, self.draw = metrics, log, draw
        self.window, self.max_pending_rows = window, max_pending_rows
        self.recorder = Recorder()
        self._pending: list[_Mirrored] = []
        self._pending_rows = self._pending_bytes = 0
        self._busy = False  # the shadow thread holds requests it took from _pending
        self._cv = threading.Condition()
        self._closed = False
        self._said_none = False
        self._written: set[str] = set()
        self._write_error = ""
        self._thread = threading.Thread(target=self._loop, name="tfpipe-shadow", daemon=True)
        self._thread.start()

    # ---- on the request's path: cheap, never blocking -------------------------------------

    def predict(self, served: Servable, signature: str, inputs: dict[str, np.ndarray],
                outputs: dict[str, np.ndarray], served_seconds: float) -> None:
        """A Predict the served version has answered (`outputs`, after its output_filter)."""
        if self.draw() >= self.share:
            return

        def call(candidate: Servable) -> dict[str, np.ndarray]:
            sig = candidate.signature(signature)
            return candidate.run(sig, candidate.check_inputs(sig, inputs))

        rows = _Rows.of_inputs(inputs, self.slice_column)
        shapes = batch_shapes(inputs)
        group = None
        if shapes is not None and all(v.ndim and v.shape[0] == rows.count for v in outputs.values()):
            group = (signature, shapes, tuple((k, v.dtype, v.shape[1:]) for k, v in outputs.items()))
        self._mirror(served, "predict", signature, call, outputs, rows, served_seconds,
                     sum(v.nbytes for v in inputs.values()), inputs if group else None, group)

    def examples(self, api: str, served: Servable, signature: str, examples: list[bytes], result: tuple,
                 served_seconds: float) -> None:
        """A Classify (`result`: classes, scores) or Regress (`result`: values,) the served version
        has answered."""
        if self.draw() >= self.share:
            return
        if api == "classify":
            def call(candidate: Servable) -> dict[str, np.ndarray]:
                return classification_view(*finished(candidate.classify(signature, examples))[1:])
            outputs = classification_view(*result)
        else:
            def call(candidate: Servable) -> dict[str, np.ndarray]:
                return {"outputs": finished(candidate.regress(signature, examples))[1]}
            outputs = {"outputs": result[0]}
        self._mirror(served, api, signature, call, outputs, _Rows.of_examples(examples, self.slice_column),
                     served_seconds, sum(len(e) for e in examples))

    def _mirror(self, served: Servable, api: str, signature: str, call, outputs: dict[str, np.ndarray],
                rows: _Rows, served_seconds: float, nbytes: int, inputs=None, group=None) -> None:
        candidate = self.manager.candidate(served.name)
        if candidate is None:
            return
        key = (served.version, candidate.version, api, signature)
        item = _Mirrored(candidate, key, call, outputs, rows, served_seconds, rows.count, nbytes, inputs,
                         None if group is None else (candidate.uid, *group))
        with self._cv:
            go = (not self._closed and self._pending_rows + item.size <= self.max_pending_rows
                  and self._pending_bytes + nbytes <= MAX_PENDING_BYTES) or not (self._pending or self._closed)
            if go:
                self._pending.append(item)
                self._pending_rows += item.size
                self._pending_bytes += nbytes
                if len(self._pending) == 1 or self._pending_rows >= BATCH_ROWS:  # else it waits out its window
                    self._cv.notify()
        if not go:
            self.recorder.update(served.name, key, _skipped)
            self.metrics.shadow_skipped(served.name, api, signature)

    # ---- on the shadow thread --------------------------------------------------------------

    def _loop(self) -> None:
        """Take what is pending once the first of it has waited `window` seconds (or the pending rows
        reach BATCH_ROWS), and answer it."""
        while True:
            with self._cv:
                while not self._pending and not self._closed:
                    self._cv.wait()
                if not self._pending:
                    return
                deadline = time.monotonic() + self.window
                while not self._closed and self._pending_rows < BATCH_ROWS:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cv.wait(left)
                items, self._pending = self._pending, []
                self._pending_rows = self._pending_bytes = 0
                self._busy = True
            try:
                self._answer(items)
            except Exception as e:  # noqa: BLE001 (a bug here must not kill the shadow thread)
                self.log(f"shadow traffic: recording a mirrored call failed: {type(e).__name__}: {e}")
            finally:
                items = []  # no reference to a candidate while waiting: an unloaded one is freed at once
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()

    def _answer(self, items: list[_Mirrored]) -> None:
        """Requests that may be answered together (the same candidate, signature, input and output
        shapes) by one call of the candidate, and each other one alone."""
        groups: dict[tuple, list[_Mirrored]] = {}
        for item in items:
            groups.setdefault(item.group if item.group is not None else (id(item),), []).append(item)
        for group in groups.values():
            if len(group) == 1:
                self._alone(group[0])
            else:
                self._together(group)

    def _alone(self, item: _Mirrored) -> None:
        t0 = time.perf_counter()
        got, error, compared = None, None, None
        try:
            got = item.call(item.candidate)
        except ServingError as e:
            error = (e.code.name, e.message)
        except Exception as e:  # noqa: BLE001 (whatever the candidate does is recorded, never raised)
            error = ("INTERNAL", f"{type(e).__name__}: {e}")
        seconds = time.perf_counter() - t0
        if error is None:
            try:
                compared = compare(item.outputs, got)
            except Mismatch as e:
                error = (e.status, e.reason)
        self._record(item.candidate.name, item.key, [item.served_seconds], seconds, error, item.outputs, got,
                     compared, item.rows)

    def _together(self, group: list[_Mirrored]) -> None:
        """One call of the candidate on the group's rows, compared and recorded as one; when it fails,
        each request is answered alone (so that an error is its own)."""
        first = group[0]
        inputs = {k: np.concatenate([g.inputs[k] for g in group]) for k in first.inputs}
        t0 = time.perf_counter()
        try:
            sig = first.candidate.signature(first.key[3])
            got = first.candidate.run(sig, first.candidate.check_inputs(sig, inputs))
            served = {k: np.concatenate([g.outputs[k] for g in group]) for k in first.outputs}
            compared = compare(served, got)
        except Exception:  # noqa: BLE001 (answered alone instead)
            for item in group:
                self._alone(item)
            return
        seconds = time.perf_counter() - t0
        self._record(first.candidate.name, first.key, [g.served_seconds for g in group], seconds, None, served, got,
                     compared, _Rows.of_inputs(inputs, self.slice_column))

    def _record(self, model: str, key: tuple, served_seconds: list[float], seconds: float,
                error: tuple[str, str] | None, served: dict, got: dict | None, compared, rows: _Rows) -> None:
        """Mirrored requests answered by one call of the candidate (`seconds`) into the model's record
        and the metrics: each one's latencies; the error, or the rows' agreement (in all, per slice)
        and those that may enter the worst rows."""
        slices, worst = {}, []
        if compared is not None:
            slices = rows.slices() if self.slice_column else {}
            worst = worst_rows(served, got, compared, rows, self.recorder.floor(model, key))
        flips, rel = compared if compared is not None else (None, None)

        def change(r: Record) -> None:
            r.mirrored += len(served_seconds)
            for s in served_seconds:
                r.served_latency.add(s)
            r.candidate_latency.add(seconds, len(served_seconds))
            if error is not None:
                r.error(*error)
                return
            r.agreement.add(_row_count(flips, rel), None if flips is None else int(np.count_nonzero(flips)), rel)
            for value, idx in slices.items():
                r.slice(value).add(len(idx), None if flips is None else int(np.count_nonzero(flips[idx])),
                                   None if rel is None else rel[idx])
            if worst:
                r.offer(worst)

        self.recorder.update(model, key, change)
        self.metrics.shadow_mirrored(model, key[2], key[3], seconds, error[0] if error else None,
                                     0 if flips is None else len(flips), 0 if flips is None else int(flips.sum()),
                                     requests=len(served_seconds))

    # ---- at each poll, and at stop -------------------------------------------------------------

    def polled(self) -> None:
        """After each base-path poll (the manager's poller thread): say once when no model has
        candidates, and write the report files whose records changed."""
        shadowed = self.manager.shadowed()
        if not shadowed and not self._said_none:
            self.log(f"--shadow={self.share:g}: no model's base path has a candidates/ folder "
                     "(BASE/NAME/candidates/N): nothing is mirrored (looked for again at each base-path poll)")
        self._said_none = not shadowed
        if self.report_dir:
            self.write_reports(shadowed)

    def write_reports(self, shadowed: dict[str, int | None] | None = None, force: bool = False) -> None:
        """DIR/shadow-<model>-<pid>.json for each model with records or a candidate, when its records
        changed since the last write (or `force`); a failed write is logged once per reason."""
        shadowed = self.manager.shadowed() if shadowed is None else shadowed
        for model in sorted(set(self.recorder.models()) | {m for m, v in shadowed.items() if v is not None}):
            records, changed = self.recorder.snapshot(model)
            if not (changed or force or model not in self._written):
                continue
            doc = report_file(model, records, self.share, self.slice_column, shadowed.get(model))
            try:
                write_atomic(report_path(self.report_dir, model), json.dumps(doc))
                self._written.add(model)
            except OSError as e:
                if str(e) != self._write_error:
                    self._write_error = str(e)
                    self.log(f"shadow traffic: cannot write the report of {model} in {self.report_dir}: {e}")

    def settled(self, timeout: float) -> bool:
        """Wait until every mirrored request taken so far is answered and recorded; whether it is."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while self._pending or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(min(left, 0.1))
        return True

    def close(self) -> None:
        """No more mirroring; what is pending is answered (at once, without the window), for up to
        CLOSE_WAIT_S, then the last reports are written."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(CLOSE_WAIT_S)
        if self.report_dir:
            self.write_reports(force=True)


def _skipped(record: Record) -> None:
    record.skipped += 1


def _row_count(flips, rel) -> int:
    return len(flips) if flips is not None else len(rel) if rel is not None else 0


class _Rows:
    """A request's rows as the report needs them: their count, each row's inputs as JSON, and its
    value of the slice column. Examples are parsed only when asked."""

    def __init__(self, count: int, row: Callable[[int], dict[str, Any]], slice_values: Callable[[], list[str]]):
        self.count, self.row, self._slice_values = count, row, slice_values

    @classmethod
    def of_inputs(cls, inputs: dict[str, np.ndarray], column: str) -> _Rows:
        count = max((v.shape[0] for v in inputs.values() if v.ndim), default=1)

        def row(i: int) -> dict[str, Any]:
            return {k: jsonable(v[i] if v.ndim and v.shape[0] == count else v) for k, v in inputs.items()}

        def slice_values() -> list[str]:
            v = inputs.get(column)
            if v is None or not v.ndim or v.shape[0] != count or v.size != count:
                return [MISSING_SLICE] * count
            return [_text(x) for x in v.reshape(count)]
        return cls(count, row, slice_values)

    @classmethod
    def of_examples(cls, examples: list[bytes], column: str) -> _Rows:
        def row(i: int) -> dict[str, Any]:
            return example_features(examples[i])

        def slice_values() -> list[str]:
            out = []
            for e in examples:
                values = example_features(e, only=column).get(column)
                out.append(_text(values[0]) if values else MISSING_SLICE)
            return out
        return cls(len(examples), row, slice_values)

    def slices(self) -> dict[str, np.ndarray]:
        """Slice value -> the indices of its rows."""
        groups: dict[str, list[int]] = {}
        for i, v in enumerate(self._slice_values()):
            groups.setdefault(v, []).append(i)
        return {v: np.array(idx) for v, idx in groups.items()}


def classification_view(classes: np.ndarray | None, scores: np.ndarray | None) -> dict[str, np.ndarray]:
    """A Classify answer as the comparison reads it: each row's top class (by score) under `classes`
    (its index under `class_ids` without class names; the whole row of classes without scores), and
    the scores."""
    out = {}
    if scores is not None:
        top = np.argmax(scores, axis=1)
        out["scores"] = scores
        if classes is not None:
            out["classes"] = classes[np.arange(len(top)), top]
        else:
            out["class_ids"] = top
    elif classes is not None:
        out["classes"] = classes
    return out


def compare(served: dict[str, np.ndarray], candidate: dict[str, np.ndarray]):
    """(flips, rel): per row, whether any class output (string, int or bool) differs, and the largest
    relative difference |c - s| / max(|s|, 1e-12) of its float outputs; None where there is no such
    output. Mismatch for an output the candidate lacks, or of another shape or kind."""
    flips = rel = None
    rows = None
    for name, s in served.items():
        c = candidate.get(name)
        if c is None:
            raise Mismatch("MISSING_OUTPUT", f"the candidate has no output {name!r}")
        if s.shape != c.shape:
            raise Mismatch("SHAPE_MISMATCH", f"output {name!r}: the candidate's shape is {list(c.shape)}, the served "
                                             f"version's {list(s.shape)}")
        kind_s, kind_c = s.dtype.kind, c.dtype.kind
        if (kind_s in "OSU") != (kind_c in "OSU") or (kind_s == "f") != (kind_c == "f"):
            raise Mismatch("DTYPE_MISMATCH", f"output {name!r}: the candidate's dtype is {c.dtype.name}, the served "
                                             f"version's {s.dtype.name}")
        n = s.shape[0] if s.ndim else 1
        rows = n if rows is None else rows
        if kind_s == "f":
            d = relative_difference(s, c)
            if d.ndim != 1:  # a row's largest over its values
                d = d.reshape(n, -1)
                d = d.max(axis=1) if d.shape[1] else np.zeros(n)
            d = d if n == rows else np.full(rows, d.max(initial=0.0))
            rel = d if rel is None else np.maximum(rel, d)
        else:
            f = s != c
            if f.ndim != 1:
                f = f.reshape(n, -1).any(axis=1)
            f = f if n == rows else np.full(rows, bool(f.any()))
            flips = f if flips is None else flips | f
    return flips, rel


def relative_difference(s: np.ndarray, c: np.ndarray) -> np.ndarray:
    """|c - s| / max(|s|, 1e-12), elementwise, in the outputs' float dtype (float64 for float16):
    NaN against NaN is 0, against a number inf; the same infinity is 0."""
    if s.dtype.itemsize < 4 or c.dtype != s.dtype:
        s, c = s.astype(np.float64), c.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        d = np.abs(c - s) / np.maximum(np.abs(s), _TINY)
        if np.isnan(d).any():  # NaN or infinity among the values: the rare case
            d = np.where((np.isnan(s) & np.isnan(c)) | (s == c), 0.0, d)
            d = np.where(np.isnan(d), np.inf, d)
    return d


def worst_rows(served: dict, got: dict, compared, rows: _Rows, floor: tuple[int, float], k: int = 5) -> list[dict]:
    """This request's rows that enter the record's worst rows (beating `floor`): at most k, with a
    difference, flipped ones first; each with its inputs and both answers, as JSON values."""
    flips, rel = compared
    n = _row_count(flips, rel)
    f = flips if flips is not None else np.zeros(n, bool)
    r = rel if rel is not None else np.zeros(n)
    if not n or (int(f.any()), float(r.max())) <= max(floor, (0, 0.0)):  # none beats the floor: the usual case
        return []
    order = np.lexsort((-r, -f.astype(np.int8)))[:k]
    out = []
    for i in order:
        score = (int(f[i]), float(r[i]))
        if score <= floor or score == (0, 0.0):
            continue
        out.append({"flipped": bool(f[i]), "rel_diff": jsonable(r[i]) if rel is not None else None,
                    "inputs": rows.row(int(i)), "served": _answer(served, int(i), n),
                    "candidate": _answer(got, int(i), n, only=served)})
    return out


def _answer(outputs: dict[str, np.ndarray], i: int, n: int, only=None) -> dict[str, Any]:
    return {k: jsonable(v[i] if v.ndim and v.shape[0] == n else v) for k, v in outputs.items()
            if only is None or k in only}


def jsonable(value) -> Any:
    """A numpy value (or row) as JSON takes it: bytes as text (base64 when not UTF-8), infinities and
    NaN as text, float32 as its shortest decimal."""
    if isinstance(value, np.ndarray):
        return [jsonable(v) for v in value]
    if isinstance(value, (np.float32, np.float16)) and np.isfinite(value):
        return float(str(value))  # the shortest text that reads back as the same float32: 46.8, not 46.799999
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return {"b64": base64.b64encode(value).decode("ascii")}
    if isinstance(value, float) and not np.isfinite(value):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def _text(value) -> str:
    v = jsonable(value)
    return v if isinstance(v, str) else json.dumps(v)


def example_features(serialized: bytes, only: str | None = None) -> dict[str, list]:
    """A serialized tf.Example's features as JSON lists (`only`: that feature alone); {} when it is
    not one."""
    from tensorflow.core.example import example_pb2

    try:
        example = example_pb2.Example.FromString(serialized)
    except Exception:  # noqa: BLE001 (the served version took it; a reader's failure costs only the row's inputs)
        return {}
    out = {}
    for name, feature in example.features.feature.items():
        if only is not None and name != only:
            continue
        kind = feature.WhichOneof("kind")
        out[name] = jsonable(list(getattr(feature, kind).value)) if kind else []
    return out
