"""Raw records turned into typed, validated columns: a batch's good rows as numpy columns (with
a presence mask per column) and its bad rows as dead-letter entries with the reason, by the rules
of the table's Schema. The data stage and `tfpipe predict` validate alike (readers.py reads the
records)."""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from tfpipe.pipeline.autodetect import decimal_comma_number
from tfpipe.pipeline.dates import is_date_value, iso_text, parse_seconds
from tfpipe.pipeline.schema import Feature, Schema

@dataclass
class Column:
    values: np.ndarray  # float64, int64 or object (str); undefined where not present
    present: np.ndarray  # bool


@dataclass
class Batch:
    source: str
    lines: np.ndarray  # line (or row) number of each good row
    raws: list[str]  # raw text of each good row (hashed to split when there is no key)
    keys: list[str] | None  # split key text per good row, when --key is set
    columns: dict[str, Column]
    bad: list[dict[str, Any]] = field(default_factory=list)  # dead-letter entries
    # rows with no label: set aside (source, line, raw), neither written nor bad
    unlabelled: list[dict[str, Any]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.lines)


class Validator:
    """Turns raw records into typed columns, rejecting rows that do not fit the schema."""

    def __init__(self, schema: Schema, na_values: Iterable[str] = (), scoring: tuple[str, ...] | None = None):
        """`scoring`: rows to be scored by a trained model (tfpipe predict), not to train one: the
        features are validated as for training, the label is not needed (when named, it is read as its
        type, and may be missing), and the other columns named (row IDs, any other) are carried along
        as text, as written; None: training rows."""
        self.schema = schema
        self.na = frozenset(na_values) | {""}
        self.scoring = scoring is not None
        if self.scoring:
            features, label = {c.name for c in schema.features}, schema.label
            self.columns = (list(schema.features)
                            + [Feature(label.name, label.type, True)] * (label.name in scoring)
                            + [Feature(n, "string", True) for n in scoring if n not in features | {label.name}])
        else:
            self.columns = schema.columns
        self.label = schema.label.name
        self.known = ({c.name for c in self.columns} | {schema.label.name} | set(schema.excluded)
                      | ({schema.key} - {None}))
        self.classes = set(schema.label.classes) if schema.enforced and schema.label.classes else None

    # -- CSV ------------------------------------------------------------------------------

    def csv_batch(self, source: str, header: tuple[str, ...], text: str, first_line: int,
                  delimiter: str = ",") -> Batch:
        """Validate a block of CSV text whose first physical line is `first_line`. With a `;`
        delimiter, numbers written with a decimal comma (3,5) are read as numbers."""
        ncols = len(header)
        lines = text.split("\n")
        rows: list[list[str]] = []
        line_idx: list[int] = []
        bad: list[dict[str, Any]] = []
        spans: dict[int, int] = {}  # row -> physical lines, for records spanning several lines
        fast = _split_plain(text, lines, delimiter, ncols) if _plain_text(text) else None
        if fast is not None:  # no quote anywhere: a record is a line, its fields split at the delimiter
            cols, nrows = fast
            line_idx = list(range(nrows))
        reader = csv.reader(io.StringIO(text if fast is None else ""), delimiter=delimiter)
        prev = 0
        while fast is None:
            try:
                for row in reader:
                    cur = reader.line_num
                    if len(row) == ncols:
                        if cur - prev != 1:
                            spans[len(rows)] = cur - prev
                        rows.append(row)
                        line_idx.append(prev)
                    elif row and not (len(row) == 1 and row[0].strip() == ""):
                        bad.append(dead_row(source, first_line + prev, _raw(lines, prev, cur),
                                         f"expected {ncols} columns, got {len(row)}"))
                    prev = cur
                break
            except csv.Error as e:
                cur = max(reader.line_num, prev + 1)
                bad.append(dead_row(source, first_line + prev, _raw(lines, prev, cur), f"CSV syntax error: {e}"))
                prev = cur
        raws = [lines[i] for i in line_idx]
        if "\r" in text:
            raws = [r[:-1] if r.endswith("\r") else r for r in raws]
        for i, n_lines in spans.items():
            raws[i] = _raw(lines, line_idx[i], line_idx[i] + n_lines)
        if fast is None:
            cols, nrows = (list(zip(*rows)) if rows else [()] * ncols), len(rows)
        index = {name: i for i, name in enumerate(header)}
        converted: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray | None]] = {}
        for c in self.columns:
            i = index.get(c.name)
            if i is None:  # column absent from this file: every value missing
                converted[c.name] = _all_missing(c.type, nrows)
            else:
                converted[c.name] = _convert_text(cols[i], c.type, self.na, decimal_comma=delimiter == ";")
        key_i = index.get(self.schema.key) if self.schema.key else None
        keys = list(cols[key_i]) if key_i is not None else None
        return self._finish(source, np.asarray(line_idx, dtype=np.int64) + first_line, raws, keys,
                            converted, bad)

    # -- JSON Lines -------------------------------------------------------------------------

    def jsonl_batch(self, source: str, text: str, first_line: int) -> Batch:
        records: list[dict[str, Any]] = []
        raws: list[str] = []
        line_no: list[int] = []
        bad: list[dict[str, Any]] = []
        known = self.known
        for i, line in enumerate(text.split("\n")):
            if not line or line.isspace():
                continue
            try:
                obj = json.loads(line)
            except ValueError as e:
                bad.append(dead_row(source, first_line + i, line, f"invalid JSON: {e}"))
                continue
            if not isinstance(obj, dict):
                bad.append(dead_row(source, first_line + i, line, "not a JSON object"))
                continue
            if not self.scoring and not known.issuperset(obj):  # scoring: a column the model does not take is left
                extra = sorted(k for k in obj if k not in known)
                bad.append(dead_row(source, first_line + i, line, f"unknown column(s) {', '.join(extra)}"))
                continue
            records.append(obj)
            raws.append(line.rstrip("\r"))
            line_no.append(first_line + i)
        return self._typed_batch(source, records, raws, np.asarray(line_no, dtype=np.int64), bad)

    # -- Parquet ------------------------------------------------------------------------------

    def parquet_batch(self, source: str, table, first_row: int) -> Batch:
        """Validate a pyarrow Table of rows numbered from `first_row`."""
        records = table.to_pylist()
        bad = []
        good = []
        raws = []
        for i, r in enumerate(records):
            extra = [] if self.scoring else [k for k in r if k not in self.known]
            if extra:
                bad.append(dead_row(source, first_row + i, _json_text(r), f"unknown column(s) {', '.join(extra)}"))
            else:
                good.append(i)
                raws.append(_json_text(r))
        lines = np.asarray(good, dtype=np.int64) + first_row
        return self._typed_batch(source, [records[i] for i in good], raws, lines, bad)

    # -- shared -------------------------------------------------------------------------------

    def _typed_batch(self, source, records, raws, lines, bad) -> Batch:
        converted = {}
        for c in self.columns:
            converted[c.name] = _convert_typed([r.get(c.name) for r in records], c.type)
        keys = None
        if self.schema.key:
            keys = ["" if r.get(self.schema.key) is None else str(r.get(self.schema.key)) for r in records]
        return self._finish(source, lines, raws, keys, converted, bad)

    def _finish(self, source, lines, raws, keys, converted, bad) -> Batch:
        """Keep the rows that fit; a row whose values do not fit is bad (with the first reason), and
        a row that fits but has no label is unlabelled: set aside, for neither training nor the
        dead-letter."""
        n = len(lines)
        ok = np.ones(n, dtype=bool)
        reasons: dict[int, str] = {}
        for c in self.columns:
            values, present, problems = converted[c.name]
            if c.kind == "date":
                problems = {**_date_problems(values, present), **(problems or {})}
            for i, problem in (problems or {}).items():
                if ok[i]:
                    reasons[i] = f"column '{c.name}': {problem}"
                    ok[i] = False
            if self.schema.enforced and not c.nullable and c.name != self.label and not present.all():
                missing = ~present & ok
                for i in np.flatnonzero(missing):
                    reasons[i] = f"missing value in non-nullable column '{c.name}'"
                ok &= ~missing
        if self.scoring:  # the label is not needed: every row that fits is scored
            unlabelled = np.zeros(n, dtype=bool)
        else:
            values, present, _ = converted[self.label]
            unlabelled = ok & ~present
            ok &= present
        if self.classes is not None and not self.scoring:
            for i in np.flatnonzero(ok):
                if values[i] not in self.classes:
                    reasons[i] = f"label value {values[i]!r} is not one of the schema's classes"
                    ok[i] = False
        aside = [_aside(source, int(lines[i]), raws[i]) for i in np.flatnonzero(unlabelled)]
        if reasons or aside:
            for i in sorted(reasons):
                bad.append(dead_row(source, int(lines[i]), raws[i], reasons[i]))
            bad.sort(key=lambda b: b["line"])  # in the file's order, with the rows the reading refused
            idx = np.flatnonzero(ok)
            lines = lines[idx]
            raws = [raws[i] for i in idx]
            keys = [keys[i] for i in idx] if keys is not None else None
            columns = {}
            for name, (values, present, _) in converted.items():
                columns[name] = Column(values[idx], present[idx])
        else:
            columns = {name: Column(v, p) for name, (v, p, _) in converted.items()}
        return Batch(source, lines, raws, keys, columns, bad, aside)


def _date_problems(values: np.ndarray, present: np.ndarray) -> dict[int, str]:
    """The rows of a date column whose value is not an ISO-8601 date or time (pipeline.dates)."""
    return {int(i): f"{values[i]!r} is not an ISO-8601 date or time (YYYY-MM-DD[THH:MM[:SS]][Z|+HH:MM])"
            for i in np.flatnonzero(present) if parse_seconds(str(values[i])) is None}


def _plain_text(text: str) -> bool:
    """Whether csv.reader would read `text` as lines split at the delimiter: no quote character, and
    no NUL, no carriage return but those of CRLF line ends (a lone one ends a record for csv.reader)."""
    return ('"' not in text and "\0" not in text  # csv.reader refuses a NUL ("line contains NUL")
            and ("\r" not in text or text.count("\r") == text.count("\r\n")))


def _split_plain(text: str, lines: list[str], delimiter: str, ncols: int) -> tuple[list[list[str]], int] | None:
    """csv.reader's columns and row count for a block of plain lines (see _plain_text), at str's
    speed: the block split at every delimiter and newline at once, each column a slice of that;
    None when a line does not hold `ncols` fields (or is blank), whose reasons csv.reader's loop
    words."""
    if ncols < 2:  # one column: a blank line is no row for csv.reader, and one empty field here
        return None
    if text.endswith("\n"):  # the block's last newline ends its last record
        text, lines = text[:-2] if text.endswith("\r\n") else text[:-1], lines[:-1]
    if not lines or set(map(_DELIMITERS_IN, lines, itertools.repeat(delimiter))) != {ncols - 1}:
        return None
    if "\r" in text:  # CRLF line ends (_plain_text allows no other carriage return)
        text = text.replace("\r\n", "\n")
    flat = text.replace("\n", delimiter).split(delimiter)
    return [flat[i::ncols] for i in range(ncols)], len(lines)


_DELIMITERS_IN = str.count


def dead_row(source: str, line: int, raw: str, reason: str) -> dict[str, Any]:
    return {"source": source, "line": int(line), "reason": reason, "raw": raw}


def _aside(source: str, line: int, raw: str) -> dict[str, Any]:
    """An unlabelled row as `unlabelled/*.jsonl` keeps it: a dead-letter entry's fields, no reason."""
    return {"source": source, "line": int(line), "raw": raw}


def _raw(lines: list[str], start: int, end: int) -> str:
    text = "\n".join(lines[start:end])
    return text[:-1] if text.endswith("\r") else text


def _json_text(record: dict[str, Any]) -> str:
    return json.dumps(record, default=str, ensure_ascii=False)


def _problem(value: Any, type_: str) -> str:
    if isinstance(value, float) and math.isinf(value):
        return f"{value} is not a finite number"
    if type_ == "int" and isinstance(value, int) and not isinstance(value, bool):
        return f"{value} is outside the int64 range"
    if isinstance(value, (list, dict)):
        return f"nested value {_json_text(value)[:80]} where a {type_} was expected"
    return f"{value!r} is not a{'n' if type_ == 'int' else ''} {type_}"


def _all_missing(type_: str, n: int):
    dtype = {"int": np.int64, "float": np.float64, "string": object}[type_]
    return np.zeros(n, dtype=dtype), np.zeros(n, dtype=bool), None


def _decimal_comma_float(text: str) -> float:
    return float(decimal_comma_number(text) or text)


def _convert_text(col: tuple[str, ...], type_: str, na: frozenset[str], decimal_comma: bool = False):
    """CSV strings to (values, present, problems); the `na` texts are missing values. With
    `decimal_comma`, a float written 3,5 is 3.5."""
    n = len(col)
    if type_ == "string":
        values = np.array(col, dtype=object) if n else np.zeros(0, dtype=object)
        has_na = not na.isdisjoint(col)
        present = np.fromiter((v not in na for v in col), bool, n) if has_na else np.ones(n, dtype=bool)
        return values, present, None
    dtype = np.float64 if type_ == "float" else np.int64
    parse = (_decimal_comma_float if decimal_comma else float) if type_ == "float" else int
    # Fast paths: Python's own parsers through fromiter beat numpy's string casts 3x.
    try:
        return _finish_numeric(np.fromiter(map(parse, col), dtype, n), np.ones(n, dtype=bool), {})
    except (ValueError, OverflowError):
        pass
    filled = [("0" if v in na else v) for v in col]
    # an int written as a whole float (2.0, as pandas writes an int column with gaps) is that int:
    # _int_text reads it, once the plain parse has failed (a function call a value costs)
    for parse in (parse, _int_text) if type_ == "int" else (parse,):
        try:
            values = np.fromiter(map(parse, filled), dtype, n)
            return _finish_numeric(values, np.fromiter((v not in na for v in col), bool, n), {})
        except (ValueError, OverflowError):
            pass
    # Slow path, only for a batch holding a bad value: find which ones.
    values = np.zeros(n, dtype=dtype)
    present = np.zeros(n, dtype=bool)
    problems: dict[int, str] = {}
    for i, v in enumerate(col):
        if v in na:
            continue
        try:
            values[i] = parse(v)
            present[i] = True
        except (ValueError, OverflowError):
            problems[i] = _problem(v, type_) if type_ == "float" or not _is_int_text(v) else _problem(int(v), type_)
    return _finish_numeric(values, present, problems)


def _int_text(v: str) -> int:
    """An int's text, or a whole number's written as a float (`2.0`, `2e3`); ValueError otherwise."""
    try:
        return int(v)
    except ValueError:
        f = float(v)
        if not f.is_integer():
            raise ValueError(f"{v!r} is not a whole number") from None
        return int(f)


def _is_int_text(v: str) -> bool:
    try:
        int(v)
        return True
    except ValueError:
        return False


def _finish_numeric(values: np.ndarray, present: np.ndarray, problems: dict[int, str]):
    if values.dtype == np.float64:
        nan = np.isnan(values)
        if nan.any():
            present = present & ~nan  # "nan" in the data is a missing value
        for i in np.flatnonzero(np.isinf(values)):
            problems[int(i)] = _problem(float(values[i]), "float")
    return values, present, problems or None


def _convert_typed(col: list[Any], type_: str):
    """JSON/Parquet values to (values, present, problems); None is a missing value."""
    n = len(col)
    kinds = set(map(type, col))
    if type_ == "float" and kinds <= {float, int, type(None)}:
        values = np.array(col, dtype=np.float64) if n else np.zeros(0)
        return _finish_numeric(values, ~np.isnan(values), {})
    if type_ == "int" and kinds <= {int, bool, type(None)}:
        try:
            values = np.fromiter((0 if v is None else v for v in col), np.int64, n)
            return values, np.fromiter((v is not None for v in col), bool, n), None
        except OverflowError:
            pass
    if type_ == "string" and kinds <= {str, type(None)}:
        values = np.array(col, dtype=object) if n else np.zeros(0, dtype=object)
        return values, np.fromiter((v is not None and v != "" for v in col), bool, n), None
    # Slow path: mixed types in the batch; check each value.
    values = np.zeros(n, dtype={"int": np.int64, "float": np.float64, "string": object}[type_])
    present = np.zeros(n, dtype=bool)
    problems: dict[int, str] = {}
    for i, v in enumerate(col):
        accepted = _accept(v, type_)
        if accepted is _REJECT:
            problems[i] = _problem(v, type_)
        elif accepted is not None and accepted != "":
            values[i] = accepted
            present[i] = True
    if type_ == "string":
        return values, present, problems or None
    return _finish_numeric(values, present, problems)


_REJECT = object()


def _accept(v: Any, type_: str) -> Any:
    """The value to store for `v` in a column of `type_` (None: missing; _REJECT: type drift)."""
    if v is None:
        return None
    if isinstance(v, (list, dict)):
        return _REJECT
    if type_ == "string":
        # JSON numbers in a string column are kept as their text; dates and times as ISO-8601.
        if isinstance(v, str):
            return v
        return iso_text(v) if is_date_value(v) else _json_text(v)
    if isinstance(v, bool):
        return int(v)
    if type_ == "int":
        if isinstance(v, int):
            return v if -(2**63) <= v < 2**63 else _REJECT
        if isinstance(v, float) and v.is_integer():
            return int(v)
        return _REJECT
    return float(v) if isinstance(v, (int, float)) else _REJECT


# ---- streaming a segment ---------------------------------------------------------------------
