"""Shadow traffic's records: what the server keeps of the candidate's answers beside the served
version's (--shadow), the report files it writes (--shadow_report_dir) and how `tfpipe shadow`
merges and prints them. No TensorFlow: the command reads the files without it.

A record is one (served version, candidate version, API, signature) of one model:

    mirrored, skipped           requests sent to the candidate; requests not sent because the
                                candidate's calls in flight were at their bound
    errors, error_reasons       the candidate's failures by status (its own status code, or
                                MISSING_OUTPUT, SHAPE_MISMATCH, DTYPE_MISMATCH), and their words
    served_latency              the served version's model call for those requests (with batching,
                                its wait in the batch queue too)
    candidate_latency           the candidate's model call on the shadow thread (its input checks too)
    agreement                   rows compared; rows with a class output (string or int: `classes`,
                                `class_ids`, a Classify's top class) and those whose class differs
                                ("flipped"); rows with float outputs and their relative differences
                                |c - s| / max(|s|, 1e-12) (a row's largest over its values)
    slices                      the agreement per value of --shadow_slice's input
    worst                       the K rows with the largest differences (flipped rows first): the
                                row's inputs and both answers

Histograms have fixed logarithmic buckets (20 per decade), so that processes' records add up; a
quantile is the upper edge of the bucket it falls in (at most 12% above the value), kept within
the exact minimum and maximum.

A report file is `DIR/shadow-<model>-<pid>.json`, written whole (tfpipe.files.write_atomic) by
each server process at every base-path poll where something changed, and at its stop.
"""

from __future__ import annotations

import bisect
import glob
import json
import math
import os
import threading
import time
from typing import Any

FORMAT = 1
WORST_ROWS = 5  # K
MAX_SLICES = 64  # distinct slice values kept per record; further ones count under OTHER_SLICE
MAX_REASONS = 10  # distinct error texts kept per record
OTHER_SLICE, MISSING_SLICE, OTHER_REASON = "(other values)", "(missing)", "(other reasons)"
PER_DECADE = 20


class LogHistogram:
    """Counts of positive values in buckets 10**(k/20) wide, from 10**lo to 10**hi (below: the first
    bucket, zero included; above: the last, infinity included), with the exact count, sum, min, max."""

    def __init__(self, lo: int, hi: int):
        self.lo, self.hi = lo, hi
        self.edges = [10 ** (k / PER_DECADE) for k in range(lo * PER_DECADE, hi * PER_DECADE + 1)]
        self.counts: dict[int, int] = {}
        self.n, self.total, self.min, self.max = 0, 0.0, math.inf, -math.inf

    def add(self, value: float, times: int = 1) -> None:
        i = bisect.bisect_left(self.edges, value) if value == value else len(self.edges)  # NaN: the last
        self.counts[i] = self.counts.get(i, 0) + times
        self.n += times
        self.total += value * times if math.isfinite(value) else 0.0
        self.min, self.max = min(self.min, value), max(self.max, value)

    def add_all(self, values) -> None:
        """Every value of an iterable (a numpy array's rows)."""
        for v in values:
            self.add(float(v))

    def merge(self, other: LogHistogram) -> None:
        for i, c in other.counts.items():
            self.counts[i] = self.counts.get(i, 0) + c
        self.n += other.n
        self.total += other.total
        self.min, self.max = min(self.min, other.min), max(self.max, other.max)

    def quantile(self, q: float) -> float | None:
        """The q-quantile's bucket's upper edge, within [min, max]; None when empty."""
        if not self.n:
            return None
        if q <= 0:
            return self.min
        rank, seen = max(1, math.ceil(q * self.n)), 0
        for i in sorted(self.counts):
            seen += self.counts[i]
            if seen >= rank:
                upper = self.edges[i] if i < len(self.edges) else self.max
                return min(max(upper, self.min), self.max)
        return self.max

    def to_json(self) -> dict[str, Any]:
        return {"lo": self.lo, "hi": self.hi, "counts": {str(i): c for i, c in sorted(self.counts.items())},
                "n": self.n, "sum": self.total, "min": _number(self.min if self.n else None),
                "max": _number(self.max if self.n else None)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LogHistogram:
        h = cls(d["lo"], d["hi"])
        h.counts = {int(i): c for i, c in d["counts"].items()}
        h.n, h.total = d["n"], d["sum"]
        h.min = _float(d["min"]) if h.n else math.inf
        h.max = _float(d["max"]) if h.n else -math.inf
        return h


def latency_histogram() -> LogHistogram:
    return LogHistogram(-6, 3)  # 1 us to 1000 s


def difference_histogram() -> LogHistogram:
    return LogHistogram(-9, 3)  # relative differences from 1e-9 to 1000


def _number(v: float | None):
    """A float as JSON takes it: infinity and NaN as text."""
    return v if v is None or math.isfinite(v) else str(v)


def _float(v) -> float:
    return float(v) if v is not None else math.nan


class Agreement:
    """How the candidate's rows compare with the served version's."""

    def __init__(self):
        self.rows = self.class_rows = self.flipped = self.float_rows = 0
        self.rel_diff = difference_histogram()

    def add(self, rows: int, flipped: int | None, rel_diffs) -> None:
        """One request's rows: how many; how many of them flipped class (None: no class output); each
        row's relative difference (None: no float output)."""
        self.rows += rows
        if flipped is not None:
            self.class_rows += rows
            self.flipped += flipped
        if rel_diffs is not None:
            self.float_rows += rows
            self.rel_diff.add_all(rel_diffs)

    def merge(self, other: Agreement) -> None:
        self.rows += other.rows
        self.class_rows += other.class_rows
        self.flipped += other.flipped
        self.float_rows += other.float_rows
        self.rel_diff.merge(other.rel_diff)

    def to_json(self) -> dict[str, Any]:
        return {"rows": self.rows, "class_rows": self.class_rows, "flipped": self.flipped,
                "float_rows": self.float_rows, "rel_diff": self.rel_diff.to_json()}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Agreement:
        a = cls()
        a.rows, a.class_rows, a.flipped, a.float_rows = d["rows"], d["class_rows"], d["flipped"], d["float_rows"]
        a.rel_diff = LogHistogram.from_json(d["rel_diff"])
        return a


def _row_score(row: dict[str, Any]) -> tuple[int, float]:
    """How bad a worst row is: flipped rows first, then by relative difference."""
    rel = _float(row.get("rel_diff"))
    return int(bool(row.get("flipped"))), (math.inf if math.isnan(rel) else rel)


class Record:
    """One (served version, candidate version, API, signature) of a model: see the module's docstring."""

    def __init__(self, served: int, candidate: int, api: str, signature: str):
        self.served, self.candidate, self.api, self.signature = served, candidate, api, signature
        self.mirrored = self.skipped = 0
        self.errors: dict[str, int] = {}
        self.error_reasons: dict[str, int] = {}
        self.served_latency, self.candidate_latency = latency_histogram(), latency_histogram()
        self.agreement = Agreement()
        self.slices: dict[str, Agreement] = {}
        self.worst: list[dict[str, Any]] = []

    @property
    def key(self) -> tuple[int, int, str, str]:
        return self.served, self.candidate, self.api, self.signature

    def error(self, status: str, reason: str) -> None:
        self.errors[status] = self.errors.get(status, 0) + 1
        if reason not in self.error_reasons and len(self.error_reasons) >= MAX_REASONS:
            reason = OTHER_REASON
        self.error_reasons[reason] = self.error_reasons.get(reason, 0) + 1

    def slice(self, value: str) -> Agreement:
        if value not in self.slices and len(self.slices) >= MAX_SLICES:
            value = OTHER_SLICE
        return self.slices.setdefault(value, Agreement())

    def worst_floor(self) -> tuple[int, float]:
        """The score a row must beat to enter the worst rows."""
        return _row_score(self.worst[-1]) if len(self.worst) >= WORST_ROWS else (0, 0.0)

    def offer(self, rows: list[dict[str, Any]]) -> None:
        """Rows that may enter the worst rows; a row already there (same inputs and answers) is kept once."""
        kept, seen = [], set()
        for row in sorted(self.worst + rows, key=_row_score, reverse=True):
            same = json.dumps([row.get("inputs"), row.get("served"), row.get("candidate")], sort_keys=True)
            if same not in seen:
                seen.add(same)
                kept.append(row)
        self.worst = kept[:WORST_ROWS]

    def merge(self, other: Record) -> None:
        self.mirrored += other.mirrored
        self.skipped += other.skipped
        for status, n in other.errors.items():
            self.errors[status] = self.errors.get(status, 0) + n
        for reason, n in other.error_reasons.items():
            self.error_reasons[reason] = self.error_reasons.get(reason, 0) + n
        self.served_latency.merge(other.served_latency)
        self.candidate_latency.merge(other.candidate_latency)
        self.agreement.merge(other.agreement)
        for value, a in other.slices.items():
            self.slices.setdefault(value, Agreement()).merge(a)
        self.offer(other.worst)

    def to_json(self) -> dict[str, Any]:
        return {"served_version": self.served, "candidate_version": self.candidate, "api": self.api,
                "signature": self.signature, "mirrored": self.mirrored, "skipped": self.skipped,
                "errors": dict(sorted(self.errors.items())), "error_reasons": self.error_reasons,
                "served_latency": self.served_latency.to_json(), "candidate_latency": self.candidate_latency.to_json(),
                "agreement": self.agreement.to_json(),
                "slices": {v: a.to_json() for v, a in sorted(self.slices.items())}, "worst": self.worst}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Record:
        r = cls(d["served_version"], d["candidate_version"], d["api"], d["signature"])
        r.mirrored, r.skipped = d["mirrored"], d["skipped"]
        r.errors, r.error_reasons = dict(d["errors"]), dict(d["error_reasons"])
        r.served_latency = LogHistogram.from_json(d["served_latency"])
        r.candidate_latency = LogHistogram.from_json(d["candidate_latency"])
        r.agreement = Agreement.from_json(d["agreement"])
        r.slices = {v: Agreement.from_json(a) for v, a in d["slices"].items()}
        r.worst = list(d["worst"])
        return r


class Recorder:
    """The records of one server process, by model; thread-safe. `changed(model)` tells the report
    writer whether a model's records moved since it last took them."""

    def __init__(self):
        self._lock = threading.Lock()
        self._records: dict[str, dict[tuple, Record]] = {}
        self._changes: dict[str, int] = {}
        self._written: dict[str, int] = {}

    def update(self, model: str, key: tuple[int, int, str, str], change) -> None:
        """`change(record)` applied to the model's record for `key` (made when new), under the lock."""
        with self._lock:
            records = self._records.setdefault(model, {})
            record = records.get(key)
            if record is None:
                record = records[key] = Record(*key)
            change(record)
            self._changes[model] = self._changes.get(model, 0) + 1

    def floor(self, model: str, key: tuple[int, int, str, str]) -> tuple[int, float]:
        """The score a row must beat to enter the worst rows of the model's record for `key`."""
        with self._lock:
            record = self._records.get(model, {}).get(key)
            return record.worst_floor() if record is not None else (0, 0.0)

    def models(self) -> list[str]:
        with self._lock:
            return sorted(self._records)

    def snapshot(self, model: str) -> tuple[list[dict[str, Any]], bool]:
        """The model's records as JSON, and whether they changed since the last snapshot."""
        with self._lock:
            records = [r.to_json() for _, r in sorted(self._records.get(model, {}).items())]
            changes = self._changes.get(model, 0)
            changed, self._written[model] = self._written.get(model) != changes, changes
        return records, changed


def report_path(directory: str, model: str, pid: int | None = None) -> str:
    """Where a server process writes a model's report (the model's name made safe for a file name)."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model)
    return os.path.join(directory, f"shadow-{safe}-{os.getpid() if pid is None else pid}.json")


def report_file(model: str, records: list[dict[str, Any]], share: float, slice_column: str,
                candidate: int | None) -> dict[str, Any]:
    """A report file's content: the model, this process, the settings, the candidate now, the records."""
    return {"format": FORMAT, "model": model, "pid": os.getpid(), "written": time.time(), "share": share,
            "slice": slice_column, "candidate_now": candidate, "records": records}


def merge_reports(directory: str) -> dict[str, Any]:
    """Every process's report file in `directory`, merged per model: records of the same served
    version, candidate version, API and signature added up. Raises FileNotFoundError when there is
    no report file, ValueError naming a file that is not one."""
    paths = sorted(glob.glob(os.path.join(directory, "shadow-*.json")))
    if not paths:
        raise FileNotFoundError(f"{directory} holds no shadow report (shadow-MODEL-PID.json): was the server "
                                "started with --shadow and --shadow_report_dir pointing there?")
    models: dict[str, dict[str, Any]] = {}
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
            if doc.get("format") != FORMAT:
                raise ValueError(f"format {doc.get('format')!r}, not {FORMAT}")
            records = [Record.from_json(r) for r in doc["records"]]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path} is not a shadow report file: {e}") from None
        m = models.setdefault(doc["model"], {"model": doc["model"], "files": [], "pids": [], "share": doc["share"],
                                             "slice": doc["slice"], "candidate_now": None, "records": {}})
        m["files"].append(os.path.basename(path))
        m["pids"].append(doc["pid"])
        if doc.get("candidate_now") is not None:
            m["candidate_now"] = max(m["candidate_now"] or 0, doc["candidate_now"])
        for r in records:
            if r.key in m["records"]:
                m["records"][r.key].merge(r)
            else:
                m["records"][r.key] = r
    return {"dir": directory, "files": len(paths), "models": {
        name: {**m, "records": [_with_summary(r) for _, r in sorted(m["records"].items())]}
        for name, m in sorted(models.items())}}


def _with_summary(r: Record) -> dict[str, Any]:
    out = r.to_json()
    out["summary"] = summary(r.agreement) | {
        "served_latency_p50": r.served_latency.quantile(0.5), "served_latency_p99": r.served_latency.quantile(0.99),
        "candidate_latency_p50": r.candidate_latency.quantile(0.5),
        "candidate_latency_p99": r.candidate_latency.quantile(0.99), "errors": sum(r.errors.values())}
    out["slice_summaries"] = {v: summary(a) for v, a in sorted(r.slices.items())}
    return out


def summary(a: Agreement) -> dict[str, Any]:
    """The figures a reader wants of an agreement: the flipped share and the relative differences'
    median, p90, p99 and maximum."""
    h = a.rel_diff
    return {"rows": a.rows, "class_rows": a.class_rows, "flipped": a.flipped,
            "flipped_share": a.flipped / a.class_rows if a.class_rows else None, "float_rows": a.float_rows,
            "rel_diff_median": _number(h.quantile(0.5)), "rel_diff_p90": _number(h.quantile(0.9)),
            "rel_diff_p99": _number(h.quantile(0.99)), "rel_diff_max": _number(h.max if h.n else None)}


def report_lines(merged: dict[str, Any]) -> list[str]:
    """`tfpipe shadow DIR`'s report: per model, per (candidate, served version, API, signature)."""
    lines = [f"shadow traffic: {merged['files']} report file(s) in {merged['dir']}"]
    for name, m in merged["models"].items():
        now = m["candidate_now"]
        lines.append(f"model {name}: share {m['share']:g}, {len(m['pids'])} server process(es) (pids "
                     f"{', '.join(map(str, sorted(m['pids'])))}); "
                     + (f"candidate {now} shadowed at the last write" if now is not None else
                        "no candidate shadowed at the last write"))
        if not m["records"]:
            lines.append("  no request mirrored")
        for r in m["records"]:
            lines += _record_lines(r, m["slice"])
    return lines


def _record_lines(r: dict[str, Any], slice_column: str) -> list[str]:
    s = r["summary"]
    lines = [f"  candidate {r['candidate_version']} vs served {r['served_version']}, {r['api']} "
             f"{r['signature']}: {r['mirrored']} request(s) mirrored, {r['skipped']} skipped, {s['errors']} "
             "candidate error(s)"]
    lines.append(f"    {s['rows']} row(s) compared" + (f"; {agreement_text(s)}" if s["rows"] else ""))
    lat = [s["served_latency_p50"], s["served_latency_p99"], s["candidate_latency_p50"], s["candidate_latency_p99"]]
    if any(v is not None for v in lat):
        ms = ["-" if v is None else f"{v * 1000:.3g}" for v in lat]
        lines.append(f"    latency p50/p99: served {ms[0]}/{ms[1]} ms, candidate {ms[2]}/{ms[3]} ms")
    for status, n in r["errors"].items():
        lines.append(f"    error {status}: {n}")
    for reason, n in sorted(r["error_reasons"].items(), key=lambda kv: -kv[1]):
        lines.append(f"      {n} x {reason}")
    if r["slice_summaries"]:
        lines.append(f"    per {slice_column or 'slice'}:")
        width = max(len(v) for v in r["slice_summaries"])
        for value, a in r["slice_summaries"].items():
            lines.append(f"      {value:<{width}}  {a['rows']} row(s); {agreement_text(a)}")
    if r["worst"]:
        lines.append("    worst rows:")
        for row in r["worst"]:
            what = "flipped" if row.get("flipped") else f"relative difference {_fmt(row.get('rel_diff'))}"
            lines.append(f"      {what}: inputs {json.dumps(row['inputs'])}")
            lines.append(f"        served {json.dumps(row['served'])}")
            lines.append(f"        candidate {json.dumps(row['candidate'])}")
    return lines


def agreement_text(s: dict[str, Any]) -> str:
    """A summary's flipped share and relative differences, as one line's words."""
    parts = []
    if s["class_rows"]:
        parts.append(f"class flipped in {s['flipped']} of {s['class_rows']} ({100 * s['flipped_share']:.2f}%)")
    if s["float_rows"]:
        parts.append(f"relative difference median {_fmt(s['rel_diff_median'])}, p90 {_fmt(s['rel_diff_p90'])}, "
                     f"p99 {_fmt(s['rel_diff_p99'])}, max {_fmt(s['rel_diff_max'])}")
    return "; ".join(parts) or "no output compared"


def _fmt(v) -> str:
    return "-" if v is None else v if isinstance(v, str) else f"{v:.4g}"
