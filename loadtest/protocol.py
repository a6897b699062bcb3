"""What `tfpipe loadtest` and its generator processes say to each other: the step they run
(`StepSpec`, a JSON file for the generator and a locust message for its workers) and the
generator's messages while it runs (`Progress`, `Waiting`: one JSON object per stdout line)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace


@dataclass(frozen=True)
class StepSpec:
    """One load step."""

    kind: str  # "rest", "grpc", or "replay" (logged requests over both)
    address: str  # http://HOST:PORT for REST, HOST:PORT for gRPC; replay: the REST address or ""
    users: int
    warmup: float  # seconds of unmeasured load first
    duration: float  # measured seconds
    max_requests: int  # the measured part ends early once this many were answered
    path: str = ""  # REST: /v1/models/NAME[/versions/N]:predict
    bodies: list[str] = field(default_factory=list)  # REST: request bodies, sent in turn
    requests: list[str] = field(default_factory=list)  # gRPC: base64 serialized PredictRequests
    rate: float | None = None  # open model: requests/s; None: closed model
    workers: int = 1  # generator processes on this machine
    expect_workers: int = 0  # worker processes from other machines
    worker_wait_s: float = 120.0  # how long a master waits for its workers
    master_bind: str | None = None
    master_port: int | None = None
    web_port: int | None = None  # locust's web UI
    last_step: bool = True  # workers from other machines stop after it
    share: float = 1.0  # a worker's part of an open-model rate
    token: str = ""  # the step, as workers tell one master's steps apart
    # replay: [offset_s, "rest", path, JSON body] or [offset_s, "grpc", method, base64 request], by offset
    replay: list[list] = field(default_factory=list)
    grpc_address: str = ""  # replay: where gRPC requests go
    speed: float = 1.0  # replay: offsets are divided by it

    def __post_init__(self):
        if self.kind not in ("rest", "grpc", "replay"):
            raise ValueError(f"kind must be rest, grpc or replay, not {self.kind!r}")
        payloads = {"rest": self.bodies, "grpc": self.requests, "replay": self.replay}[self.kind]
        if not payloads:
            raise ValueError(f"a {self.kind} step needs its payloads")

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> StepSpec:
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown step spec field(s): {', '.join(sorted(unknown))}")
        return cls(**data)

    def for_worker(self, share: float, token: str) -> StepSpec:
        """What a worker needs: the load and its share of it, none of the master's own settings."""
        return replace(self, web_port=None, master_bind=None, master_port=None, share=share, token=token)


@dataclass(frozen=True)
class Progress:
    """Every half second: seconds since the step started, requests answered so far."""

    elapsed_s: float
    answered: int


@dataclass(frozen=True)
class Waiting:
    """A master still waiting for workers from other machines."""

    ready: int
    expected: int
    address: str


MESSAGES = {"progress": Progress, "waiting": Waiting}


def encode(message: Progress | Waiting) -> str:
    """One line of JSON: {"type": ..., fields...}."""
    kind = next(k for k, c in MESSAGES.items() if isinstance(message, c))
    return json.dumps({"type": kind, **asdict(message)})


def decode(line: str) -> Progress | Waiting | None:
    """The message on a line, or None for anything else the generator printed."""
    try:
        data = json.loads(line)
        return MESSAGES[data.pop("type")](**data)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
