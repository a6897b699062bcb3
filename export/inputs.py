"""What `tfpipe export` reads and where it writes, checked without TensorFlow: a wrong --model,
--data or --base fails in a fraction of a second, before TensorFlow is imported."""

from __future__ import annotations

import os

from tfpipe.export.config import ExportConfig
from tfpipe.export.errors import ExportError
from tfpipe import versions
from tfpipe.files import read_json, writable_dir
from tfpipe.train.datadir import DataDir, load_data_dir
from tfpipe.train.errors import TrainError

HIGH_WATER = ".tfpipe-last-version"  # highest version ever written, so none is reused


def check_inputs(config: ExportConfig) -> tuple[str, DataDir, str]:
    """(train dir, data dir, model dir) with the model dir under the base path created; ExportError
    on what is wrong (a --version that already exists too)."""
    train_dir = check_train_dir(config.model)
    try:
        data = load_data_dir(config.data)
    except TrainError as e:
        raise ExportError(str(e)) from None
    if not config.base:
        raise ExportError("no model base path: pass --base DIR (versions go to BASE/NAME/VERSION)")
    model_dir = os.path.join(os.path.abspath(config.base), config.name)
    why = writable_dir(model_dir)
    if why:
        raise ExportError(f"{model_dir}: {why}")
    if config.version is not None:
        choose_version(model_dir, config.version)
    from tfpipe.export.gate import check_thresholds, parse_threshold

    try:
        check_thresholds([parse_threshold(t) for t in config.thresholds], data.schema.label.task)
    except ValueError as e:
        raise ExportError(f"--thresholds: {e}") from None
    return train_dir, data, model_dir


def check_train_dir(path: str | None) -> str:
    if not path:
        raise ExportError("no trained model: pass --model DIR (the output of tfpipe train)")
    if not os.path.isdir(path):
        raise ExportError(f"train directory {path} does not exist")
    for name in ("model.keras", "train.json"):
        if not os.path.exists(os.path.join(path, name)):
            raise ExportError(f"{path} is not a complete tfpipe train output: {name} is missing")
    return os.path.abspath(path)


def choose_version(model_dir: str, requested: int | None) -> int:
    """The requested version (refused when it exists, served or a candidate), else one more than
    any this model ever had."""
    present = versions.numeric_versions(model_dir) + versions.candidates(model_dir)
    high = read_json(os.path.join(model_dir, HIGH_WATER)) or 0
    if requested is not None:
        if requested in present:
            raise ExportError(f"version {requested} already exists in {model_dir}; versions are never overwritten")
        return requested
    return max([high, *present]) + 1
