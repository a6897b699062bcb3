"""A tfpipe data directory as the trainer reads it: checked without TensorFlow, so that a wrong
--data fails in a fraction of a second, before TensorFlow is imported."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from tfpipe.pipeline.schema import Schema
from tfpipe.train.errors import TrainError


@dataclass(frozen=True)
class ImageLabel:
    name: str
    classes: list[str]
    task: str = "multiclass"  # an image model has one softmax output per class, two classes too


@dataclass(frozen=True)
class ImageSchema:
    """schema.json of labelled images (tfpipe data --format images)."""

    keys: dict[str, str]
    label: ImageLabel
    resize: tuple[int, int] | None  # what the data stage resized every image to, if it did

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "ImageSchema":
        resize = (doc.get("image") or {}).get("resize")
        return cls(dict(doc["keys"]), ImageLabel(doc["keys"]["label"], [str(c) for c in doc["label"]["classes"]]),
                   tuple(resize) if resize else None)


@dataclass
class DataDir:
    path: str
    schema: Schema | ImageSchema
    stats: dict[str, Any]
    manifest: dict[str, Any]

    @property
    def images(self) -> bool:
        return isinstance(self.schema, ImageSchema)

    def files(self, split: str) -> list[str]:
        entries = self.manifest["outputs"]["splits"].get(split)
        if entries is None:
            raise TrainError(f"{self.path} has no '{split}' split (splits: {', '.join(self.manifest['outputs']['splits'])})")
        return [os.path.join(self.path, e["file"]) for e in entries]

    def count(self, split: str) -> int:
        return int(self.manifest["counts"]["splits"].get(split, 0))

    def train_stats(self) -> dict[str, Any]:
        """Statistics of the training split: what the preprocessing layers are built from."""
        return self.stats["splits"]["train"]


def load_data_dir(path: str | None) -> DataDir:
    """Read and check a data stage output directory."""
    if not path:
        raise TrainError("no data directory: pass --data DIR (the output of tfpipe data)")
    if not os.path.isdir(path):
        raise TrainError(f"data directory {path} does not exist")
    docs = {}
    for name in ("data.json", "schema.json", "stats.json"):
        p = os.path.join(path, name)
        try:
            with open(p, encoding="utf-8") as f:
                docs[name] = json.load(f)
        except FileNotFoundError:
            raise TrainError(f"{path} is not a complete tfpipe data output: {name} is missing") from None
        except (OSError, ValueError) as e:
            raise TrainError(f"{p} cannot be read: {e}") from None
    manifest, stats = docs["data.json"], docs["stats.json"]
    if manifest.get("stage") != "data":
        raise TrainError(f"{path}/data.json is not a data stage manifest")
    version = docs["schema.json"].get("version")
    if version != 1:
        raise TrainError(f"{path}/schema.json has schema version {version!r}; this tfpipe reads version 1")
    try:
        if docs["schema.json"].get("kind") == "images":
            schema = ImageSchema.from_json(docs["schema.json"])
        else:
            schema = Schema.from_json(docs["schema.json"], source=f"{path}/schema.json")
    except (KeyError, TypeError, ValueError) as e:
        raise TrainError(f"{path}/schema.json is not a schema this tfpipe reads: {e}") from None
    except Exception as e:
        raise TrainError(str(e)) from None
    noun = "images" if isinstance(schema, ImageSchema) else "rows"
    if "train" not in stats.get("splits", {}) or not stats["splits"]["train"].get(noun):
        raise TrainError(f"{path} has no {noun} in its 'train' split")
    for split, entries in manifest["outputs"]["splits"].items():
        for e in entries:
            if not os.path.exists(os.path.join(path, e["file"])):
                raise TrainError(f"{path} is incomplete: {e['file']} of split '{split}' is missing")
    return DataDir(path, schema, stats, manifest)


def check_inputs(config) -> DataDir:
    """What `tfpipe train` can tell is wrong before TensorFlow is imported (`config`: a TrainConfig)."""
    data = load_data_dir(config.data)
    if not config.out:
        raise TrainError("no output directory: pass --out DIR")
    return data
