"""Configuration of the rollout step of `tfpipe run`: the `[rollout]` section of tfpipe.toml."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class RolloutConfig(BaseModel):
    """How `tfpipe run` decides whether a new version that passed the export's offline gate goes live."""

    model_config = ConfigDict(extra="forbid")

    serving_gate: bool = Field(True, description="load-test a new version that passed the offline gate beside the "
                               "served one, on the same requests, before it is served; false: serve it at once")
    rounds: int = Field(3, ge=1, le=10, description="load-test rounds per version, alternating served, new, served, "
                        "new, ... so that both meet the same machine; the new version's figure over the served "
                        "one's is the median over the rounds")
    duration: str = Field("2s", description="measured time of each round")
    warmup: str = Field("0.5s", description="unmeasured load before each round")
    max_p99_rise: float = Field(0.5, ge=0, description="the new version is held when its p99 latency exceeds the "
                                "served one's by more than this share, and by more than the served one's own spread "
                                "between rounds (p99 on a busy machine moves more than CPU time does)")
    max_cpu_rise: float = Field(0.25, ge=0, description="the same for the server's CPU time per request")
    shadow: bool = Field(True, description="after the rounds, one more round of the served version with every "
                         "request mirrored to the new one (shadow traffic): how often their answers differ, and "
                         "what mirroring costs the served traffic's CPU; reported, not a gate")

    def fingerprint_fields(self) -> dict:
        return self.model_dump()
