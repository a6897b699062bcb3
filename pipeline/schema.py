"""The schema: the one description of the features that every later stage reads.

`schema.json` is written by the data stage. Training builds its parsing specs and
preprocessing layers from it, export builds its signatures from it, and nobody else
keeps a list of columns. How the data stage infers one from a table's rows is in
pipeline/schema_inference.py.
"""

from __future__ import annotations

import json
import keyword
import re
import unicodedata
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from tfpipe.pipeline.errors import DataError

SCHEMA_VERSION = 1
TYPES = ("int", "float", "string")
TASKS = ("binary", "multiclass", "regression")
# An integer label with at most this many distinct values is a class id, not a quantity.
MAX_INT_CLASSES = 20


# What a string feature holds beyond its storage type, when it is not a category: "date" (ISO-8601
# text or a Parquet date/timestamp, stored as text; the model parses it) or "text" (free text,
# vectorised by words inside the model).
KINDS = ("date", "text")


@dataclass
class Feature:
    name: str
    type: str  # one of TYPES
    nullable: bool = True
    kind: str | None = None  # one of KINDS, for a "string" feature; None: a number or a category


@dataclass
class Label:
    name: str
    type: str
    task: str  # one of TASKS
    classes: list[Any] | None = None  # sorted class values for classification tasks


@dataclass
class Schema:
    features: list[Feature]
    label: Label
    key: str | None = None
    # True when types and nullability were given by the user (--schema) and are enforced,
    # False when they were inferred from a sample of the input.
    enforced: bool = False
    excluded: list[str] = field(default_factory=list)

    @property
    def columns(self) -> list[Feature]:
        """Features followed by the label, in the order they are written to each Example."""
        return [*self.features, Feature(self.label.name, self.label.type, nullable=False)]

    def graph_names(self) -> dict[str, str]:
        """Each feature's name inside TensorFlow graphs (see `graph_names`)."""
        return graph_names([f.name for f in self.features])

    def to_json(self) -> dict[str, Any]:
        return {
            "version": SCHEMA_VERSION,
            "label": asdict(self.label),
            "features": [{k: v for k, v in asdict(f).items() if k != "kind" or v is not None} for f in self.features],
            "key": self.key,
            "excluded": list(self.excluded),
            "tf_example": {
                c.name: {"int": "int64_list", "float": "float_list", "string": "bytes_list"}[c.type]
                for c in self.columns
            },
            "missing_values": "a missing value is an absent feature in the tf.train.Example",
        }

    @classmethod
    def from_json(cls, data: Any, source: str = "schema", enforced: bool = True) -> "Schema":
        """Parse and check a schema dict, raising DataError that names `source` on any problem.
        `enforced`: whether its types and nullability are the user's to enforce (a --schema
        file, the default) or were inferred from the input."""
        try:
            if not isinstance(data, dict):
                raise ValueError("top level must be a JSON object")
            label = data["label"]
            if not isinstance(label, dict):
                raise ValueError("'label' must be an object")
            features = data["features"]
            if not isinstance(features, list):
                raise ValueError("'features' must be a list")
            feats = []
            for i, f in enumerate(features):
                if not isinstance(f, dict) or "name" not in f or "type" not in f:
                    raise ValueError(f"features[{i}] needs 'name' and 'type'")
                unknown = set(f) - {"name", "type", "nullable", "kind"}
                if unknown:
                    raise ValueError(f"features[{i}] has unknown key(s) {sorted(unknown)}")
                _check_type(f["type"], f"features[{i}].type")
                kind = f.get("kind")
                if kind is not None and (kind not in KINDS or f["type"] != "string"):
                    raise ValueError(f"features[{i}].kind is {kind!r}; a string feature's kind may be "
                                     f"{', '.join(KINDS)} (or absent)")
                feats.append(Feature(str(f["name"]), f["type"], bool(f.get("nullable", True)), kind))
            _check_type(label.get("type"), "label.type")
            task = label.get("task")
            if task not in TASKS:
                raise ValueError(f"label.task is {task!r}; allowed: {', '.join(TASKS)}")
            classes = label.get("classes")
            if task != "regression":
                if not isinstance(classes, list) or len(classes) < 2:
                    raise ValueError("label.classes must list at least two classes for classification")
                if task == "binary" and len(classes) != 2:
                    raise ValueError("a binary label needs exactly two classes")
            names = [f.name for f in feats] + [label["name"]]
            dup = {n for n in names if names.count(n) > 1}
            if dup:
                raise ValueError(f"duplicate column(s) {sorted(dup)}")
            return cls(
                features=feats,
                label=Label(str(label["name"]), label["type"], task, classes),
                key=data.get("key"),
                enforced=enforced,
                excluded=list(data.get("excluded", [])),
            )
        except KeyError as e:
            raise DataError(f"{source}: missing key {e}") from None
        except (ValueError, TypeError) as e:
            raise DataError(f"{source}: {e}") from None


# What TensorFlow takes as an op or scope name (graph nodes, Keras layer names); a column's
# own name is kept everywhere a user sees it: the data, the schema, the signature, the report.
_GRAPH_NAME = re.compile(r"^[A-Za-z0-9.][A-Za-z0-9_.\-]*$")


def graph_names(names: Iterable[str]) -> dict[str, str]:
    """Each column name and the name that stands for it inside a TensorFlow graph: the name
    itself when TensorFlow takes it and it is no Python keyword (`from`, `class`: a tf.function's
    argument names cannot be), else its ASCII letters, digits, '.', '-' and '_' with
    everything else as '_' (accents folded: 'humidité' -> 'humidite', 'wind speed' ->
    'wind_speed'), made unique with a numeric suffix. The mapping depends only on the names,
    so training, export and every reader derive the same one."""
    out: dict[str, str] = {}
    taken = {n for n in names if _GRAPH_NAME.match(n) and not keyword.iskeyword(n)}
    for name in names:
        if name in taken:
            out[name] = name
            continue
        folded = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
        base = re.sub(r"[^A-Za-z0-9_.\-]", "_", folded).strip("_") or "column"
        if not re.match(r"[A-Za-z0-9.]", base):
            base = "c" + base
        if keyword.iskeyword(base):  # a Python keyword cannot name a signature's argument: 'from' -> 'from_'
            base += "_"
        candidate, i = base, 2
        while candidate in taken:
            candidate, i = f"{base}_{i}", i + 1
        taken.add(candidate)
        out[name] = candidate
    return out


def _check_type(value: Any, where: str) -> None:
    if value not in TYPES:
        raise ValueError(f"{where} is {value!r}; allowed: {', '.join(TYPES)}")


def load_schema(path: str) -> Schema:
    """Read a schema.json written by the data stage (or by hand) and check it."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise DataError(f"schema file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"schema file {path} cannot be read: {e}") from None
    except json.JSONDecodeError as e:
        raise DataError(f"schema file {path} is not valid JSON: {e}") from None
    return Schema.from_json(data, source=f"schema file {path}")


def parse_size(text: str) -> tuple[int, int]:
    """'HxW' (or a single number N for NxN) as (height, width); ValueError names the problem."""
    parts = text.lower().replace(" ", "").split("x")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"'{text}' is not a size: write HEIGHTxWIDTH, such as 224x224") from None
    if len(values) == 1:
        values = values * 2
    if len(values) != 2 or min(values) < 1:
        raise ValueError(f"'{text}' is not a size: write HEIGHTxWIDTH with both above 0, such as 224x224")
    return values[0], values[1]
