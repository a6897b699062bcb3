"""Configuration of `tfpipe skew`: the `[skew]` section of tfpipe.toml, one CLI flag per key."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

DEFAULT_THRESHOLD = 0.1
DEFAULT_CONFIDENCE = 0.99


def parse_thresholds(items: list[str]) -> tuple[float, dict[str, float]]:
    """['0.2', 'fare=0.3'] -> (0.2, {'fare': 0.3}): a bare number sets every feature's threshold,
    NAME=VALUE one feature's. Each is a distance in [0, 1]."""
    default, per_feature = DEFAULT_THRESHOLD, {}
    for item in items:
        name, sep, text = str(item).rpartition("=")
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"threshold {item!r}: use a number (every feature) or FEATURE=NUMBER") from None
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"threshold {item!r}: distances run from 0 to 1")
        if sep and not name:
            raise ValueError(f"threshold {item!r}: no feature name before '='")
        if sep:
            per_feature[name] = value
        else:
            default = value
    return default, per_feature


class SkewConfig(BaseModel):
    """Options of `tfpipe skew`; the field descriptions are the CLI's --help."""

    model_config = ConfigDict(extra="forbid")

    data: str | None = Field(None, description="the tfpipe data output the model was trained on: its train split "
                             "is the reference")
    logs: str | None = Field(None, description="the request log's filename_prefix (as in the server's logging_config "
                             "or --request_log_prefix)")
    model: str | None = Field(None, description="only the requests to this model (needed when the log holds several)")
    threshold: list[str] = Field(default_factory=list, description="the largest distance that passes: a number for "
                                 f"every feature, FEATURE=NUMBER for one (default {DEFAULT_THRESHOLD}: L-infinity over "
                                 "category frequencies, Jensen-Shannon divergence over the train quantile bins, "
                                 "and the rise in the fraction of missing values)")
    confidence: float = Field(DEFAULT_CONFIDENCE, gt=0.5, lt=1.0,
                              description="a distance over its threshold is skew only when samples of the traffic's "
                              "size drawn from the training split stay under it this often (the noise bound)")
    max_records: int = Field(100_000, ge=1, description="read at most this many logged requests, oldest first")
    out: str = Field("runs/skew", description="where skew.json and skew.html go")

    @field_validator("threshold")
    @classmethod
    def _check_threshold(cls, v: list[str]) -> list[str]:
        parse_thresholds(v)
        return v

    def fingerprint_fields(self) -> dict:
        """What decides this stage's result in `tfpipe run` (its step fingerprint): not which data,
        logs and model it reads, and where it writes."""
        return self.model_dump(exclude={"data", "logs", "model", "out"})
