"""Configuration of `tfpipe predict`: the `[predict]` section of tfpipe.toml, one CLI flag per key."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tfpipe.pipeline.config import DEFAULT_NA_VALUES

OUTPUT_FORMATS = ("parquet", "csv", "jsonl")


class PredictConfig(BaseModel):
    """Options of `tfpipe predict`; the field descriptions are the CLI's --help."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(
        None, description="the model: BASE/NAME (the version a server would serve: the highest numeric one) or "
                          "BASE/NAME/VERSION (a served or a candidate version); BASE is the export's --base")
    workdir: str | None = Field(
        None, description="a tfpipe run's workdir: without --model, the model it serves (WORKDIR/export/models/NAME); "
                          "without --out, WORKDIR/predict")
    input: list[str] = Field(
        default_factory=list,
        description="file(s) or glob(s) to score, read as tfpipe data reads them: .csv (any delimiter), "
                    ".jsonl/.json, .parquet; .gz for compressed text. An image model: a folder of image files "
                    "(or of class folders of them), or a glob")
    out: str | None = Field(None, description="output directory (written atomically; default WORKDIR/predict with "
                                              "--workdir)")
    format: Literal["auto", "csv", "jsonl", "parquet"] = Field(
        "auto", description="input format; auto picks it from each file's extension")
    delimiter: str = Field(
        "auto", description="CSV field separator: auto detects it from each file's header and first lines, or give "
                            "one character ('tab' for a tab)")
    output_format: Literal["parquet", "csv", "jsonl"] = Field(
        "parquet", description="how the predictions are written: Parquet, CSV or JSON Lines, one file per work unit")
    key: str | None = Field(
        None, description="write only this input column beside each prediction (default: every column the model "
                          "knows, its label too when the input has it)")
    prediction_log: bool = Field(
        False, description="also write each row as a TF Serving PredictionLog (a PredictRequest and its "
                           "PredictResponse) in gzip TFRecords under prediction_logs/: the request log's records, "
                           "which tfpipe skew reads")
    batch_rows: int | None = Field(
        None, ge=1, description="most rows in one model call (default: chosen by measuring the model at start-up)")
    na_values: list[str] | None = Field(
        None, description="CSV texts that mean a missing value (default: those the model's data stage used)")
    max_bad_fraction: float = Field(
        1.0, ge=0.0, le=1.0, description="fail, publishing nothing, when more than this fraction of rows is "
                                         "dead-lettered (default 1: never; every bad row is in deadletter/ with its "
                                         "reason)")
    runner: str | None = Field(
        None, description="Beam runner (default FnApiRunner; FlinkRunner, SparkRunner as the data stage runs them)")
    environment: str | None = Field(
        None, description="a Python environment (a virtualenv folder, such as the .venv-predict that engines/setup.sh "
                          "--predict makes) to run the job in: Beam's Flink and Spark runners are served for a Beam "
                          "release that installs beside TensorFlow 2.20, not 2.21 (docs/predict.md)")
    beam_args: list[str] = Field(default_factory=list, description="extra Beam pipeline options")
    force: bool = Field(False, description="replace --out if it exists")

    @property
    def default_na(self) -> tuple[str, ...]:
        return DEFAULT_NA_VALUES
