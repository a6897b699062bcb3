"""A table's schema inferred from a sample of its rows (`infer_schema`): each column's type by a
vote of its values, dates and free text told from categories, row IDs told from features, and
the label's task (binary, multiclass or regression), each decision a user may need said as a
note. The schema type itself, and how it is stored, are in pipeline/schema.py."""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Iterable

from tfpipe.pipeline.dates import is_date_value, parse_seconds
from tfpipe.pipeline.errors import DataError
from tfpipe.pipeline.schema import MAX_INT_CLASSES, Feature, Label, Schema

# A column is numeric when at least this share of its sampled values parse as numbers;
# the few that do not are bad rows (dead-letter), not a reason to make it a string column.
NUMERIC_SHARE = 0.98
TEXT_WORDS, TEXT_DISTINCT = 2.5, 0.5  # free text: words per value on average, and distinct values
_SPACE = re.compile(r"\s")


class _TypeVote:
    """Counts how many sampled values of one column fit each type, and notes what tells a row
    ID: whether every value differs, whether the integers count up by one, any whitespace."""

    def __init__(self, na_values: frozenset[str] = frozenset()) -> None:
        self.na_values = na_values
        self.ints = 0
        self.floats = 0
        self.seen = 0
        self.missing = 0
        self.values: set[Any] = set()
        self.dates = 0  # ISO-8601 texts, or date/timestamp values
        self.words = 0  # words in the texts, to tell free text from categories
        self.distinct: set[Any] | None = set()  # every value so far; None once one repeats
        self.counting = True  # the integers so far are n, n+1, n+2, ... in file order
        self.first_int: int | None = None
        self.last_int: int | None = None
        self.min_int = self.max_int = 0
        self.spaces = False

    def _add_string(self, text: str) -> None:
        if parse_seconds(text) is not None:
            self.dates += 1
        self.words += len(text.split())

    def _note(self, value: Any, as_int: int | None) -> None:
        # Every ID rule needs distinct values: a column with a repeat is done being watched.
        if self.distinct is None:
            return
        if value in self.distinct:
            self.distinct = None
            return
        self.distinct.add(value)
        if as_int is None:
            self.counting = False
        else:
            if self.last_int is None:
                self.first_int = self.min_int = self.max_int = as_int
            elif as_int != self.last_int + 1:
                self.counting = False
            self.last_int = as_int
            self.min_int, self.max_int = min(self.min_int, as_int), max(self.max_int, as_int)
        if isinstance(value, str) and not self.spaces and _SPACE.search(value):
            self.spaces = True

    def add_text(self, text: str) -> None:
        if text == "" or text in self.na_values:
            self.missing += 1
            return
        self.seen += 1
        as_int = None
        try:
            as_int = int(text)
            self.ints += 1
            self.floats += 1
        except ValueError:
            try:
                float(text)
                self.floats += 1
            except ValueError:
                self._add_string(text)
        if len(self.values) <= 1000:
            self.values.add(text)
        self._note(text, as_int)

    def add_value(self, value: Any) -> None:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            self.missing += 1
            return
        self.seen += 1
        if isinstance(value, (bool, int)):
            self.ints += 1
            self.floats += 1
        elif isinstance(value, float):
            self.floats += 1  # JSON and Parquet say float: keep it float even if integral
        elif is_date_value(value):
            self.dates += 1
        elif isinstance(value, str):
            self._add_string(value)
        if isinstance(value, (list, dict)):
            self.distinct, self.counting = None, False
            return
        if len(self.values) <= 1000:
            self.values.add(value)
        self._note(value, value if isinstance(value, int) and not isinstance(value, bool) else None)

    @property
    def type(self) -> str:
        if self.seen == 0:
            return "string"
        if self.ints >= NUMERIC_SHARE * self.seen:
            return "int"
        return "float" if self.floats >= NUMERIC_SHARE * self.seen else "string"

    @property
    def kind(self) -> str | None:
        """"date" when (nearly) every value is a date or time; "text" when the values are
        several words each (TEXT_WORDS on average) and mostly distinct (TEXT_DISTINCT of the
        values seen), as sentences are and categories are not; else None."""
        if self.type != "string" or self.seen == 0:
            return None
        if self.dates >= NUMERIC_SHARE * self.seen:
            return "date"
        distinct = len(self.values) / min(self.seen, 1001)
        if self.words / self.seen >= TEXT_WORDS and distinct >= TEXT_DISTINCT and self.seen >= 20:
            return "text"
        return None


# A string column is taken for an ID only from this many sampled rows on: in a handful of rows
# most short texts are unique.
MIN_STRING_ID_ROWS = 20
_ID_NAME = re.compile(r"^(id|rownames|index|unnamed: \d+)$|[_ ]id$", re.IGNORECASE)


def id_like_name(name: str) -> bool:
    """A column name that says row ID: id, ID, customer_id, 'order id', customerId, rownames,
    index, pandas' `Unnamed: 0` (its nameless index column)."""
    return bool(_ID_NAME.search(name)) or name.endswith("Id")


def row_id_reason(name: str, vote: _TypeVote) -> str | None:
    """Why column `name` looks like a row ID rather than a feature, or None when it does not.

    Never a float column, nor one with a missing or repeated value in the sample. An integer
    column: when its name says ID (or it is R's row-name column `X` holding 1..n), or its values
    count up by one in file order. A string column: from MIN_STRING_ID_ROWS rows on, when its name
    says ID or no value holds a space (codes such as C-10023, not names or free text)."""
    if vote.missing or vote.distinct is None or vote.seen < 2 or vote.kind == "date":
        return None  # dates are unique per row by nature; free text is an ID only by its name (below)
    kind = vote.type
    if kind == "int":
        if id_like_name(name) or (name == "X" and vote.min_int == 1 and vote.max_int == vote.seen):
            return "unique in every sampled row"
        if vote.counting and vote.seen >= 3:
            return f"unique in every sampled row, counting up by one from {vote.first_int}"
        return None
    if kind == "string" and vote.seen >= MIN_STRING_ID_ROWS and (id_like_name(name) or not vote.spaces):
        return "unique in every sampled row"
    return None


def infer_schema(
    columns: list[str],
    rows: Iterable[dict[str, Any]],
    label: str,
    *,
    exclude: Iterable[str] = (),
    keep: Iterable[str] = (),
    key: str | None = None,
    task: str = "auto",
    textual: bool = True,
    na_values: Iterable[str] = (),
    note: Callable[[str], None] = lambda _: None,
) -> Schema:
    """Infer feature types and the label's task from sample rows (dicts of raw values).

    `textual` rows hold CSV strings (an empty string is missing); otherwise they hold
    typed JSON/Parquet values (None is missing). A column that looks like a row ID
    (`row_id_reason`) is excluded, with a `note` saying so, unless it is the label or in `keep`.
    """
    excluded = [c for c in exclude]
    na = frozenset(na_values)
    votes = {c: _TypeVote(na) for c in columns if c not in excluded}
    n = 0
    for row in rows:
        n += 1
        for c, vote in votes.items():
            v = row.get(c, "" if textual else None)
            if textual:
                vote.add_text(v)
            else:
                vote.add_value(v)
    if n == 0:
        raise DataError("the input holds no data rows")
    lv = votes[label]
    if lv.seen == 0:
        raise DataError(f"label column '{label}' is empty in the first {n} rows")
    given = task
    label_type, task, classes = _label_task(label, lv, task, n)
    note(f"label '{label}': " + _task_text(task, classes, label_type, given, decimals=lv.type == "float"))
    for c in [c for c in votes if c != label and c not in keep]:
        reason = row_id_reason(c, votes[c])
        if reason:
            note(f"column '{c}' looks like a row ID ({reason}): left out of the model; "
                 f"--keep-column {_flag_value(c)} keeps it")
            del votes[c]
            excluded.append(c)
    features = [
        Feature(c, votes[c].type, nullable=votes[c].missing > 0, kind=votes[c].kind) for c in votes if c != label
    ]
    for kind, what in (("text", "free text (words, as a bag of tokens)"), ("date", "dates (their parts, as numbers)")):
        named = [f.name for f in features if f.kind == kind]
        if named:
            note(f"read as {what}: {', '.join(named[:8])}{' ...' if len(named) > 8 else ''}")
    return Schema(features, Label(label, label_type, task, classes), key=key, excluded=excluded)


def _task_text(task: str, classes: list[Any] | None, label_type: str, given: str, decimals: bool = False) -> str:
    """The task chosen for the label, and why, as a notice says it (`decimals`: its whole numbers
    were written as 1.0, 2.0, ...)."""
    if given != "auto":
        return f"{task} (--task)"
    if task == "regression":
        why = ("numbers with decimals" if label_type == "float" else
               f"whole numbers, more than {MAX_INT_CLASSES} distinct: a quantity")
        return f"regression ({why}; --task multiclass treats its values as classes)"
    shown = ", ".join(map(str, (classes or [])[:6])) + (" ..." if len(classes or []) > 6 else "")
    n = len(classes or [])
    why = "two values" if task == "binary" else (
        "strings" if label_type == "string" else f"at most {MAX_INT_CLASSES} distinct whole numbers"
        + (" (written as decimals: 1.0, 2.0, ...)" if decimals else ""))
    return (f"{task} classification, {n} classes ({shown}): {why}"
            + ("; --task regression predicts a number" if label_type == "int" else ""))


def _flag_value(name: str) -> str:
    """A column name as a shell command line takes it."""
    return name if re.fullmatch(r"[A-Za-z0-9_.:-]+", name) else "'" + name.replace("'", "'\\''") + "'"


def _whole(values) -> list[int] | None:
    """The values as ints when every one is a whole number written as a float (`1.0`, 1.0), else None."""
    out = []
    for v in values:
        try:
            f = float(v)
        except (TypeError, ValueError):
            return None
        if not f.is_integer():
            return None
        out.append(int(f))
    return out


def _label_task(label: str, lv: _TypeVote, task: str, n: int) -> tuple[str, str, list[Any] | None]:
    """The label's type, its task (`task`, or inferred from its sampled values when auto) and its
    classes. A float label whose values are all whole numbers, few of them (pandas writes an int
    column with missing values as 1.0, 2.0, ...), is a class label of ints unless `task` says
    regression."""
    label_type = lv.type
    distinct = lv.values
    whole = _whole(distinct) if label_type == "float" else None
    if whole is not None and task != "regression" and (task != "auto" or 2 <= len(set(whole)) <= MAX_INT_CLASSES):
        label_type, distinct = "int", {str(v) for v in whole}
    if task == "auto":
        if label_type == "float":
            task = "regression"
        elif len(distinct) == 1:
            raise DataError(
                f"label column '{label}' holds a single value ({next(iter(distinct))!r}) in the "
                f"first {n} rows; pass --task to say what to predict"
            )
        elif len(distinct) == 2:
            task = "binary"
        elif label_type == "string" or len(distinct) <= MAX_INT_CLASSES:
            task = "multiclass"
        else:
            task = "regression"
    if task == "regression" and label_type == "string":
        raise DataError(f"label column '{label}' holds strings; a regression label must be numeric")
    classes = None
    if task != "regression":
        if label_type == "float":
            raise DataError(f"label column '{label}' holds non-integer numbers; use --task regression")
        classes = sorted({c for c in (_typed(v, label_type) for v in distinct) if c is not None})
    return label_type, task, classes


def _typed(value: Any, type_: str) -> Any:
    if type_ == "int":
        try:
            return int(value)
        except (TypeError, ValueError):
            return None  # a stray value in the sample; its row will be a dead letter
    return str(value)
