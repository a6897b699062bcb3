"""Configuration of the data stage: the `[data]` section of tfpipe.toml, one CLI flag per key."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tfpipe.files import file_sha256
from tfpipe.pipeline.schema import parse_size  # noqa: F401  (the data options' HxW sizes; train reads it there)

DEFAULT_NA_VALUES = ("NA", "N/A", "n/a", "NaN", "nan", "null", "NULL", "None", "#N/A")
_SPLIT_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


class DataConfig(BaseModel):
    """Options of `tfpipe data`; the field descriptions are the CLI's --help."""

    input: list[str] = Field(
        default_factory=list,
        description="input file(s) or glob(s): .csv, .jsonl/.json, .parquet; .gz for compressed text. With "
                    "--format images: a folder with one subfolder per class, or a .csv/.jsonl manifest",
    )
    label: str | None = Field(None, description="the label column to predict")
    out: str | None = Field(None, description="output directory (written atomically)")
    format: Literal["auto", "csv", "jsonl", "parquet", "images"] = Field(
        "auto", description="input format; auto picks it from each file's extension; images reads labelled "
                            "JPEG/PNG/BMP/GIF files"
    )
    image_column: str = Field(
        "image", description="images: the manifest column with each image's path (relative to the manifest)"
    )
    classes: list[str] = Field(
        default_factory=list,
        description="images: the class names, in label-id order; other labels go to the dead-letter "
                    "(default: the class folders, or every label the manifest names, sorted)",
    )
    min_size: str | None = Field(
        None, description="images: smaller images (HEIGHTxWIDTH, e.g. 32x32) go to the dead-letter"
    )
    resize: str | None = Field(
        None, description="images: resize to HEIGHTxWIDTH and re-encode (default: keep each file's bytes)"
    )
    delimiter: str = Field(
        "auto", description="CSV field separator: auto detects it from each file's header and first lines "
                            "(comma, semicolon, tab or pipe), or give one character; 'tab' or '\\t' for a tab. "
                            "With ';' numbers written with a decimal comma (3,5) are read as numbers"
    )
    exclude: list[str] = Field(default_factory=list, description="columns to drop from the features")
    keep_column: list[str] = Field(
        default_factory=list,
        description="columns to keep as features although they look like row IDs (unique in every sampled row), "
                    "which are otherwise left out",
    )
    key: str | None = Field(
        None, description="column whose value decides the split (default: a hash of the whole row)"
    )
    split: dict[str, int] = Field(
        default_factory=lambda: {"train": 80, "eval": 10, "test": 10},
        description="split names and weights, e.g. train=80,eval=10,test=10",
    )
    stratify: Literal["auto", "off"] = Field(
        "auto",
        description="auto: each split gets its weight's share of every class of a classification label (the "
                    "labels are read once before the job, for inputs up to 64 MiB and without --key); off: a "
                    "row's split is its hash alone",
    )
    schema_path: str | None = Field(
        None, alias="schema", description="enforce this schema.json instead of inferring one"
    )
    na_values: list[str] = Field(
        default_factory=lambda: list(DEFAULT_NA_VALUES),
        description="CSV texts that mean a missing value (the empty string always does)",
    )
    task: Literal["auto", "binary", "multiclass", "regression"] = Field(
        "auto", description="what the label is; auto infers it from the label's values"
    )
    max_bad_fraction: float = Field(
        0.01, ge=0.0, le=1.0, description="fail when more than this fraction of rows is bad"
    )
    shards: int | None = Field(
        None, ge=1, le=10000,
        description="TFRecord shards per split, also the units of parallel work (default: by input size)",
    )
    infer_rows: int = Field(
        20000, ge=10, description="rows sampled from the start of the inputs to infer the schema"
    )
    top_k: int = Field(1000, ge=1, description="most frequent values kept per string feature in stats.json")
    compression_level: int = Field(6, ge=1, le=9, description="gzip level of the TFRecords (6 = TF's default)")
    force: bool = Field(False, description="recompute even when the output is up to date")
    runner: str | None = Field(
        None, description="the Apache Beam runner: FnApiRunner (the default: on this machine), FlinkRunner, "
                          "SparkRunner, DataflowRunner, or a runner's class path; its own options (--flink_master, "
                          "--parallelism, --spark_master_url, ...) go with it (see docs/scaling-out.md)",
    )
    environment: str | None = Field(
        None, description="a Python environment (a virtualenv folder, such as the .venv-engines engines/setup.sh "
                          "makes) to run the data stage in: Beam's Flink and Spark runners are served for a Beam "
                          "release that cannot be installed beside TensorFlow (docs/scaling-out.md)",
    )
    beam_args: list[str] = Field(
        default_factory=list,
        description="Apache Beam pipeline options (--runner, --direct_num_workers, --project, ...)",
    )

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)

    @field_validator("split")
    @classmethod
    def _check_split(cls, v: dict[str, int]) -> dict[str, int]:
        if not v:
            raise ValueError("needs at least one split")
        for name, weight in v.items():
            if not _SPLIT_NAME.match(name):
                raise ValueError(f"split name {name!r} must be a letter followed by letters, digits or _")
            if weight < 0:
                raise ValueError(f"split weight for {name!r} must be >= 0")
        if sum(v.values()) <= 0:
            raise ValueError("split weights must add up to more than 0")
        return v

    @field_validator("delimiter")
    @classmethod
    def _check_delimiter(cls, v: str) -> str:
        v = {"tab": "\t", "\\t": "\t", "comma": ",", "semicolon": ";", "pipe": "|"}.get(v, v)
        if v != "auto" and (len(v) != 1 or v in "\"\r\n"):
            raise ValueError(f"{v!r} is not a delimiter: give one character (such as ; or |), 'tab', or auto")
        return v

    @field_validator("min_size", "resize")
    @classmethod
    def _check_size(cls, v: str | None) -> str | None:
        if v is not None:
            parse_size(v)
        return v

    def fingerprint_fields(self) -> dict:
        """The fields that decide the stage's output (not where it goes or how it is run). The
        delimiter is not one of them: each CSV input's delimiter, as detected or given, is part
        of the inputs' fingerprint instead, so `auto` and the same delimiter given by hand agree."""
        return self.model_dump(exclude={"out", "force", "runner", "environment", "beam_args", "input", "schema_path",
                                        "delimiter"})

    def settings(self) -> dict:
        """What decides the stage's output, for its cache key (`tfpipe.files.cache_key`) and the
        run's step: the fields above and the content of the schema file given."""
        return {**self.fingerprint_fields(),
                "schema_file_sha256": file_sha256(self.schema_path) if self.schema_path else None}


def parse_split(text: str) -> dict[str, int]:
    """Parse 'train=80,eval=10,test=10' into a dict, raising ValueError with the bad part."""
    out: dict[str, int] = {}
    for part in text.split(","):
        name, sep, weight = part.strip().partition("=")
        if not sep:
            raise ValueError(f"'{part}' is not NAME=WEIGHT")
        try:
            out[name.strip()] = int(weight)
        except ValueError:
            raise ValueError(f"weight '{weight}' of split '{name}' is not an integer") from None
    return out
