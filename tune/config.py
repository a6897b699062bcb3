"""Configuration of `tfpipe tune`: the `[tune]` section of tfpipe.toml, one CLI flag per key."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tfpipe.loadtest.config import parse_duration
from tfpipe.loadtest.errors import LoadtestError
from tfpipe.loadtest.slo import parse_slo

MAX_TRIALS = 20


class TuneConfig(BaseModel):
    """Options of `tfpipe tune`; the field descriptions are the CLI's --help."""

    model_config = ConfigDict(extra="forbid")

    model_name: str | None = Field(None, description="name to serve the model under (as tfpipe serve's --model_name)")
    model_base_path: str | None = Field(None, description="the model's base path, holding numbered SavedModel "
                                        "versions (as tfpipe serve's --model_base_path)")
    backend: Literal["embedded", "tfserving", "docker"] = Field(
        "embedded", description="the server each trial starts: tfpipe's embedded server, tensorflow_model_server, "
        "or the tensorflow/serving container (as tfpipe serve's --backend)")
    serve_args: list[str] = Field(default_factory=list, description="more tfpipe serve / tensorflow_model_server flags "
                                  "for every trial, e.g. --serve-args=--tensorflow_intra_op_parallelism=2")
    protocol: Literal["rest", "grpc"] = Field("rest", description="the API the load calls")
    data: str | None = Field(None, description="a tfpipe data output directory: requests are built from its eval rows "
                             "(default: the rows of the newest version's warmup records, assets.extra/"
                             "tf_serving_warmup_requests)")
    payload: str | None = Field(None, description="a ready JSON request body ({\"instances\": ...}) instead of --data")
    warmup_records: str | None = Field(None, description="a SavedModel version directory whose warmup records' rows "
                                       "are the requests (the default: the newest version's)")
    batch_size: int = Field(1, ge=1, le=10000, description="rows per request")
    clients: int | None = Field(None, ge=1, le=10000, description="closed model: the most concurrent clients; each "
                                "trial steps through a quarter, half and all of them (default 32)")
    rate: float | None = Field(None, gt=0, description="open model: the most requests/s; each trial steps through a "
                               "quarter, half, three quarters and all of it (instead of --clients)")
    levels: str = Field("", description="comma list of clients (or rates with --rate) each trial steps through, "
                        "instead of the fractions above")
    slo: str = Field("p99<50ms", description="the service level a load level must meet to count; a trial's score is "
                     "the highest throughput of a level that met it with no errors")
    skip_workers: bool = Field(False, description="leave out the stage that measures the leader on one embedded-"
                               "server worker process per core (tfpipe serve --workers), which runs only with the "
                               "embedded backend on more than one core")
    trials: int = Field(MAX_TRIALS, ge=1, le=MAX_TRIALS, description="the most trials (server starts), every one "
                        "shown in the report")
    duration: str = Field("3s", description="measured time per load level")
    warmup: str = Field("1s", description="unmeasured load before each level")
    cores: int = Field(0, ge=0, description="cores the server may use, for num_batch_threads (0: this machine's)")
    start_timeout: str = Field("180s", description="longest wait for a trial's server to load the model")
    out: str = Field("runs/tune", description="where batching.config, tune.json, tune.html and each trial's "
                     "load test go")

    @field_validator("duration", "warmup", "start_timeout")
    @classmethod
    def _check_duration(cls, v: str) -> str:
        parse_duration(v)
        return v

    @field_validator("slo")
    @classmethod
    def _check_slo(cls, v: str) -> str:
        try:
            parse_slo(v)
        except LoadtestError as e:
            raise ValueError(str(e)) from None
        return v

    @field_validator("levels")
    @classmethod
    def _check_levels(cls, v: str) -> str:
        for part in [p for p in v.split(",") if p.strip()]:
            if float(part) <= 0:
                raise ValueError("levels must be positive numbers")
        return v

    @model_validator(mode="after")
    def _one_load_model(self):
        if self.clients is not None and self.rate is not None:
            raise ValueError("give --clients (closed model) or --rate (open model), not both")
        if self.data and self.payload:
            raise ValueError("give --data or --payload, not both")
        return self

    def load_levels(self) -> list[float]:
        """The load levels each trial steps through, lowest first."""
        given = sorted({float(p) for p in self.levels.split(",") if p.strip()})
        if given:
            return [v if self.rate else float(int(v)) for v in given]
        if self.rate:
            return sorted({round(self.rate * f, 3) for f in (0.25, 0.5, 0.75, 1.0)})
        most = self.clients or 32
        return sorted({float(max(1, most * f // 4)) for f in (1, 2, 4)})

    def fingerprint_fields(self) -> dict:
        """What decides this stage's result in `tfpipe run` (its step fingerprint): not the model and
        requests it is pointed at, and where it writes."""
        return self.model_dump(exclude={"model_name", "model_base_path", "data", "payload", "out"})
