"""Configuration of `tfpipe loadtest`: the `[loadtest]` section of tfpipe.toml, one CLI flag per key."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


def parse_duration(text: str) -> float:
    """'30s', '2m', '500ms' or a plain number of seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", str(text))
    if not m:
        raise ValueError(f"not a duration: {text!r} (use e.g. 30s, 2m, 500ms)")
    return float(m[1]) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[m[2]]


class LoadtestConfig(BaseModel):
    """Options of `tfpipe loadtest`; the field descriptions are the CLI's --help."""

    model_config = ConfigDict(extra="forbid")

    target: str | None = Field(None, description="server to load: http://HOST:PORT (REST) or grpc://HOST:PORT")
    model: str | None = Field(None, description="model name on the server")
    version: int | None = Field(None, ge=0, description="model version (default: the latest)")
    label: str | None = Field(None, description="model version label (instead of --version)")
    signature: str = Field("serving_default", description="signature to call")
    data: str | None = Field(None, description="a tfpipe data output directory: requests are built from its eval rows "
                                "(and its test rows when the eval split has under 200; images: its test images, sent "
                                "as encoded bytes)")
    payload: str | None = Field(None, description="a ready JSON request body ({\"instances\": ...}) instead of --data")
    warmup_records: str | None = Field(None, description="a SavedModel version directory: requests are built from "
                                       "the rows of its warmup records (assets.extra/tf_serving_warmup_requests), "
                                       "instead of --data")
    batch_size: int = Field(1, ge=1, le=10000, description="rows per request")
    users: int = Field(8, ge=1, le=10000, description="closed model: concurrent users, each waits for its answer")
    rate: float | None = Field(None, gt=0, description="open model: requests/s on a fixed schedule (instead of --users)")
    sweep: str = Field("", description="comma list of users (or rates with --rate) to step through, e.g. 1,2,4,8")
    duration: str = Field("10s", description="measured time per step")
    warmup: str = Field("2s", description="unmeasured load before each step")
    workers: int = Field(1, ge=0, le=64, description="locust worker processes on this machine, under a master "
                         "when more than 1 (use every core); 0 with --expect-workers: only other machines' workers")
    master_bind: str | None = Field(None, description="HOST:PORT where the master listens for workers from other "
                                    "machines, e.g. 0.0.0.0:5557 (default: 127.0.0.1, a free port, local workers only)")
    expect_workers: int = Field(0, ge=0, le=1024, description="workers from other machines (`tfpipe loadtest --worker "
                                "--master HOST:PORT`) each step waits for, beside the --workers on this machine")
    worker: bool = Field(False, description="run as workers for a master on another machine (with --master and "
                         "--workers): the master sends target, payloads and load; steps follow until it ends the run")
    master: str | None = Field(None, description="HOST:PORT of the master, with --worker")
    max_requests: int = Field(1_000_000, ge=1, description="stop a step after this many requests")
    model_path: str | None = Field(None, description="the served SavedModel on this machine (a version directory, "
                                   "or the base path for its newest version): its in-process latency on the same "
                                   "payloads is the baseline that separates serving overhead from model time")
    web: bool = Field(False, description="also serve locust's web UI on 127.0.0.1:--web-port to watch the run live")
    web_port: int = Field(8089, ge=0, le=65535, description="port of locust's web UI with --web")
    replay: str | None = Field(None, description="a request log's filename_prefix (tfpipe serve's logging_config or "
                               "--request_log_prefix): send its requests again, each over the API and protocol it "
                               "came in on, at its recorded time (open model), instead of --data/--payload")
    speed: float = Field(1.0, gt=0, le=1000, description="with --replay: how much faster than recorded (2.0: twice "
                         "the rate, half the time)")
    grpc_target: str | None = Field(None, description="with --replay: grpc://HOST:PORT for the logged gRPC requests "
                                    "when --target is the REST address")
    slo: str = Field("", description='service level objective, e.g. "p99<20ms,errors<0.1%"; exit 1 when missed')
    out: str = Field("runs/loadtest", description="where results.json, results.csv and report.html go")

    @field_validator("sweep")
    @classmethod
    def _check_sweep(cls, v: str) -> str:
        for part in [p for p in v.split(",") if p.strip()]:
            if float(part) <= 0:
                raise ValueError("sweep steps must be positive numbers")
        return v

    @field_validator("duration", "warmup")
    @classmethod
    def _check_duration(cls, v: str) -> str:
        parse_duration(v)
        return v

    @model_validator(mode="after")
    def _one_version_choice(self):
        if self.version is not None and self.label:
            raise ValueError("give --version or --label, not both")
        for name in ("master_bind", "master"):
            value = getattr(self, name)
            if value is not None and not re.fullmatch(r"[^\s:]+:\d{1,5}", value):
                raise ValueError(f"--{name.replace('_', '-')} takes HOST:PORT, not {value!r}")
        if self.worker and not self.master:
            raise ValueError("--worker needs --master HOST:PORT (where the master's --master-bind listens)")
        if self.replay and (self.data or self.payload or self.rate or self.sweep):
            raise ValueError("--replay sends the logged requests at their recorded times: leave out --data, "
                             "--payload, --rate and --sweep")
        if self.master and not self.worker:
            raise ValueError("--master is for workers: add --worker (a master listens with --master-bind)")
        if self.expect_workers and not self.master_bind:
            raise ValueError("--expect-workers needs --master-bind HOST:PORT for the other machines to connect to")
        if self.workers == 0 and not (self.worker or self.expect_workers):
            raise ValueError("--workers 0 leaves nobody to send requests: give --expect-workers too")
        return self

    def steps(self) -> list[float]:
        values = [float(p) for p in self.sweep.split(",") if p.strip()]
        return values or [self.rate if self.rate else float(self.users)]

    def fingerprint_fields(self) -> dict:
        """What decides this stage's result in `tfpipe run` (its step fingerprint): not the server,
        model and requests it is pointed at, and where it writes."""
        return self.model_dump(exclude={"target", "model", "data", "out", "version", "label", "payload"})
