"""One TOML file per run, one section per stage, validated with clear messages naming the bad key."""

from __future__ import annotations

import difflib
import tomllib
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.config import DataConfig
from export.config import ExportConfig
from loadtest.config import LoadtestConfig
from train.config import TrainConfig


class ConfigError(Exception):
    """A config file or flag that does not validate; the CLI shows it as one line, exit 2."""


class Config(BaseModel):
    """The whole tfpipe.toml: a section per stage."""

    model_config = ConfigDict(extra="forbid")

    data: DataConfig = Field(default_factory=DataConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    export: ExportConfig = Field(default_factory=ExportConfig)
    loadtest: LoadtestConfig = Field(default_factory=LoadtestConfig)


def load_config(path: str | None) -> Config:
    """Read and validate a TOML config (an empty config when `path` is None)."""
    if path is None:
        return Config()
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except OSError as e:
        raise ConfigError(f"config file {path} cannot be read: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
    return validate(Config, raw, source=path)


def validate(model: type[BaseModel], raw: dict[str, Any], source: str, prefix: str = "") -> Any:
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(f"{source}: {explain(e, model, prefix)}") from None


def explain(error: ValidationError, model: type[BaseModel], prefix: str = "") -> str:
    """The first validation problem as one sentence naming the key and what is allowed."""
    err = error.errors()[0]
    loc = [str(p) for p in err["loc"]]
    key = ".".join([p for p in [prefix] if p] + loc)
    if err["type"] == "extra_forbidden":
        allowed = _allowed_keys(model, loc[:-1])
        hint = difflib.get_close_matches(loc[-1], allowed, n=1)
        did = f" (did you mean '{hint[0]}'?)" if hint else ""
        return f"unknown key '{key}'{did}; allowed: {', '.join(allowed)}"
    return f"'{key}': {err['msg']}"


def _allowed_keys(model: type[BaseModel], path: list[str]) -> list[str]:
    for part in path:
        field = model.model_fields.get(part)
        if field is None or not isinstance(field.annotation, type) or not issubclass(field.annotation, BaseModel):
            return []
        model = field.annotation
    return [f.alias or name for name, f in model.model_fields.items()]
