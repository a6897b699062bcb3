"""Configuration of the serve step of `tfpipe run`: the `[serve]` section of tfpipe.toml.
`tfpipe serve` itself takes tensorflow_model_server's flags instead (serve/flags.py)."""

from __future__ import annotations

import dataclasses
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tfpipe.machine import cores
from tfpipe.serve.core.batching import RUN_BATCHING, BatchOptions


# [serve]'s batching keys: BatchOptions' fields, each under its own name
BATCH_FIELDS = tuple(f.name for f in dataclasses.fields(BatchOptions))


class ServeConfig(BaseModel):
    """How `tfpipe run` serves the exported model on the embedded server."""

    model_config = ConfigDict(extra="forbid")

    host: Literal["127.0.0.1", "0.0.0.0"] = Field("127.0.0.1", description="address the server listens on")
    port: int = Field(-1, ge=-1, le=65535, description="gRPC port (-1: a free port)")
    rest_api_port: int = Field(-1, ge=-1, le=65535, description="REST port (-1: a free port)")
    protocol: Literal["rest", "grpc"] = Field("rest", description="the API the load test calls")
    enable_batching: bool = Field(False, description="batch concurrent requests (TF Serving's --enable_batching)")
    max_batch_size: int = Field(RUN_BATCHING.max_batch_size, ge=1,
                                description="batching: most rows in one model call")
    batch_timeout_micros: int = Field(RUN_BATCHING.batch_timeout_micros, ge=0,
                                      description="batching: longest wait to fill a batch")
    max_enqueued_batches: int = Field(RUN_BATCHING.max_enqueued_batches, ge=1,
                                      description="batching: queue length before 503/UNAVAILABLE")
    num_batch_threads: int = Field(0, ge=0, description="batching: model calls in parallel (0: one per core)")
    allowed_batch_sizes: list[int] = Field(default_factory=list, description="batching: sizes a batch is padded up "
                                           "to, the last equal to max_batch_size (empty: no padding)")
    enable_large_batch_splitting: bool = Field(
        RUN_BATCHING.enable_large_batch_splitting, description="batching: split a request larger than "
        "max_execution_batch_size across model calls")
    max_execution_batch_size: int = Field(
        RUN_BATCHING.max_execution_batch_size, ge=0, description="batching, with enable_large_batch_splitting: most "
        "rows in one model call (0: max_batch_size)")
    batching: Literal["config", "tune"] = Field(
        "config", description="where batching.config comes from: 'config' the keys above (with enable_batching), "
        "'tune' tfpipe tune on the exported model before serving (its settings in [tune]; batching on)")
    check_rows: int = Field(32, ge=1, le=1000, description="eval rows whose served predictions (REST and gRPC) "
                            "must match the SavedModel run in-process")
    drain_seconds: float = Field(5.0, ge=0, description="when the run stops its server: how long requests already "
                                 "received are answered (tfpipe serve's --drain_seconds, 30 there; a run's server "
                                 "serves only the run's own checks and load tests)")

    def batching_on(self) -> bool:
        return self.enable_batching or self.batching == "tune"

    @model_validator(mode="after")
    def _valid_batching(self):
        self.batch_options().check()  # TF Serving's rules, checked where every batching setting is
        return self

    def batch_options(self) -> BatchOptions:
        """The batching parameters of this section, every BatchOptions field under its own name
        (num_batch_threads 0: one per core)."""
        options = BatchOptions.from_json({name: getattr(self, name) for name in BATCH_FIELDS})
        return dataclasses.replace(options, num_batch_threads=self.num_batch_threads or cores())

    def with_batching(self, options: BatchOptions) -> ServeConfig:
        """This section with `options` (a BatchOptions, such as the candidate `tfpipe tune` chose) as its
        batching parameters."""
        given = options.to_json()
        return self.model_copy(update={name: given[name] for name in BATCH_FIELDS})

    def fingerprint_fields(self) -> dict:
        """What decides the serve step's result; where it listens, and how long its stop waits, do not."""
        return self.model_dump(exclude={"host", "port", "rest_api_port", "protocol", "drain_seconds"})
