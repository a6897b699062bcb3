"""One TOML file per run, one section per stage, validated with clear messages naming the bad key."""

from __future__ import annotations

import difflib
import tomllib
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tfpipe.pipeline.config import DataConfig
from tfpipe.export.config import ExportConfig
from tfpipe.predict.config import PredictConfig
from tfpipe.loadtest.config import LoadtestConfig
from tfpipe.rollout.config import RolloutConfig
from tfpipe.serve.config import ServeConfig
from tfpipe.skew.config import SkewConfig
from tfpipe.train.config import TrainConfig
from tfpipe.tune.config import TuneConfig
from tfpipe.errors import ConfigError


class RunSection(BaseModel):
    """`[run]`: options of `tfpipe run` itself."""

    model_config = ConfigDict(extra="forbid")

    workdir: str | None = Field(None, description="where every stage's output goes (default: runs/<config name>)")


class Config(BaseModel):
    """The whole tfpipe.toml: a section per stage."""

    model_config = ConfigDict(extra="forbid")

    run: RunSection = Field(default_factory=RunSection)
    data: DataConfig = Field(default_factory=DataConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    export: ExportConfig = Field(default_factory=ExportConfig)
    serve: ServeConfig = Field(default_factory=ServeConfig)
    loadtest: LoadtestConfig = Field(default_factory=LoadtestConfig)
    skew: SkewConfig = Field(default_factory=SkewConfig)
    tune: TuneConfig = Field(default_factory=TuneConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    predict: PredictConfig = Field(default_factory=PredictConfig)


def load_config(path: str | None, overrides: list[str] = ()) -> Config:
    """Read and validate a TOML config (an empty config when `path` is None), with
    `SECTION.KEY=VALUE` overrides laid over it."""
    raw = read_toml(path) if path else {}
    for item in overrides:
        section, key, value = parse_override(item)
        raw.setdefault(section, {})[key] = value
    source = (path or "options") + (" with --set/--input" if overrides and path else "")
    return validate(Config, raw, source=source)


def parse_override(item: str) -> tuple[str, str, Any]:
    """'train.learning_rate=0.01' -> ('train', 'learning_rate', 0.01). The value is read as TOML
    (numbers, true/false, [lists], "strings") and taken as a plain string when it is not TOML."""
    name, sep, text = item.partition("=")
    section, dot, key = name.strip().partition(".")
    if not sep or not dot or not section or not key:
        raise ConfigError(f"--set {item!r}: use SECTION.KEY=VALUE, e.g. train.learning_rate=0.01")
    try:
        value = tomllib.loads(f"v = {text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = text.strip()
    return section, key, value


def read_toml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except OSError as e:
        raise ConfigError(f"config file {path} cannot be read: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None


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
