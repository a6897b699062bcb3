"""Configuration of the serve step of `tfpipe run`: the `[serve]` section of tfpipe.toml.
`tfpipe serve` itself takes tensorflow_model_server's flags instead (serve/flags.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ServeConfig(BaseModel):
    """How `tfpipe run` serves the exported model on the embedded server."""

    model_config = ConfigDict(extra="forbid")

    host: Literal["127.0.0.1", "0.0.0.0"] = Field("127.0.0.1", description="address the server listens on")
    port: int = Field(-1, ge=-1, le=65535, description="gRPC port (-1: a free port)")
    rest_api_port: int = Field(-1, ge=-1, le=65535, description="REST port (-1: a free port)")
    protocol: Literal["rest", "grpc"] = Field("rest", description="the API the load test calls")
    enable_batching: bool = Field(False, description="batch concurrent requests (TF Serving's --enable_batching)")
    max_batch_size: int = Field(32, ge=1, description="batching: most rows in one model call")
    batch_timeout_micros: int = Field(1000, ge=0, description="batching: longest wait to fill a batch")
    max_enqueued_batches: int = Field(100, ge=1, description="batching: queue length before 503/UNAVAILABLE")
    num_batch_threads: int = Field(0, ge=0, description="batching: model calls in parallel (0: one per core)")
    check_rows: int = Field(32, ge=1, le=1000, description="eval rows whose served predictions (REST and gRPC) "
                            "must match the SavedModel run in-process")

    def fingerprint_fields(self) -> dict:
        """What decides the serve step's result; where it listens does not."""
        return self.model_dump(exclude={"host", "port", "rest_api_port", "protocol"})
