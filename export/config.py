"""Configuration of the export stage: the `[export]` section of tfpipe.toml, one CLI flag per key."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

TFLITE_VARIANTS = ("float32", "float16", "dynamic", "int8")


# The reloaded SavedModel's answers against the Keras model's: float32 sums taken in another order
# (fused kernels, another reduction tree) differ by tens to hundreds of units in the last place; a
# signature that transforms an input wrongly differs by orders of magnitude more.
RELOAD_TOLERANCE = 1024 * 2.0 ** -23


class ExportConfig(BaseModel):
    """Options of `tfpipe export`; the field descriptions are the CLI's --help."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    model: str | None = Field(None, description="the train stage's output directory")
    data: str | None = Field(None, description="the data stage's output directory (eval and test rows)")
    base: str | None = Field(None, description="model base path: versions go to BASE/NAME/VERSION/")
    name: str = Field("model", pattern=r"^[A-Za-z0-9_.-]+$", description="model name under the base path")
    version: int | None = Field(None, ge=1, description="version number (default: one more than the highest so far)")
    warmup_records: int = Field(100, ge=0, le=1000, description="TF Serving warmup requests built from eval rows")
    keep: int | None = Field(None, ge=1, description="keep only the newest N versions, and the newest N candidates "
                             "(never the one just written, the one served, nor the one a rollback returns to)")
    tolerance: float = Field(RELOAD_TOLERANCE, gt=0, description="how far the reloaded SavedModel may differ from "
                             "Keras, and the served model from the SavedModel (regression: relative to the label's "
                             "size); default 1,024 float32 units in the last place of 1: the reloaded graph adds in "
                             "another order than Keras does, a wrong input transform differs by far more")
    tflite: str = Field("auto", description="TFLite variants to build and measure, comma-separated ('' for none); "
                        "auto: " + ",".join(TFLITE_VARIANTS) + ", without int8 for a regression (full-integer "
                        "activations cannot hold a label's range: docs/export.md)")
    max_accuracy_drop: float = Field(0.01, ge=0, description="largest accuracy drop of a TFLite variant below "
                                     "the SavedModel (classification)")
    max_rmse_rise: float = Field(0.10, ge=0, description="largest relative rise of a TFLite variant's RMSE over "
                                 "the SavedModel's (regression; int8's rounding of activations costs a regression a "
                                 "few percent)")
    drop_confidence: float = Field(0.95, ge=0.5, lt=1, description="a variant's drop counts only when it is beyond "
                                   "the test split's sampling noise at this confidence (McNemar's test for "
                                   "accuracy, a paired t-test for RMSE)")
    allow_drop: bool = Field(False, description="drop a variant that loses too much accuracy instead of failing "
                             "(with --tflite auto, the default, such a variant is always dropped, with a notice)")
    allow_weak: bool = Field(False, description="publish a model no better than the trivial baseline (the majority "
                             "class, or the mean label) on the test split, with a warning, instead of failing")

    promote: Literal["gate", "always", "never"] = Field(
        "gate", description="when a version is already served from the base path: 'gate' serves the new one only "
        "if it is not worse than the served one beyond the noise (and meets --thresholds), else keeps it in "
        "BASE/NAME/candidates/ (exit 1); 'always' serves it whatever the comparison says; 'never' keeps it as a "
        "candidate for `tfpipe promote`")
    thresholds: list[str] = Field(default_factory=list, description="more conditions for the new version, each "
                                  "on the new and the previous test split: a value (accuracy>=0.8, rmse<=1200) "
                                  "or a change against the served version (accuracy>=baseline-0.01, "
                                  "rmse<=baseline+5%)")
    gate_confidence: float = Field(0.95, ge=0.5, lt=1, description="the new version is held when it is worse than "
                                   "the served one beyond the test rows' sampling noise at this confidence "
                                   "(McNemar's exact test for classes, a paired bootstrap of the RMSE)")
    serving_gate: bool = Field(False, description="keep a version that passes as a candidate (decision 'passed') "
                               "for a serving gate to promote: tfpipe run's rollout step load-tests it beside the "
                               "served one first; on its own, `tfpipe promote` serves it")
    slice: list[str] = Field(default_factory=list, description="columns whose every value (with enough rows) "
                             "is checked on its own, e.g. --slice island")
    slice_min_rows: int = Field(10, ge=1, description="a slice with fewer test rows than this is not judged")
    breaking_change: bool = Field(False, description="allow a new version whose signatures would break the "
                                  "served one's clients (an input renamed, removed, added or retyped; an "
                                  "output gone); refused otherwise")

    @field_validator("thresholds")
    @classmethod
    def _check_thresholds(cls, v: list[str]) -> list[str]:
        from tfpipe.export.gate import parse_threshold

        for text in v:
            parse_threshold(text)  # ValueError: one line naming what is wrong
        return v

    @field_validator("tflite")
    @classmethod
    def _check_variants(cls, v: str) -> str:
        if v.strip() == "auto":
            return "auto"
        names = [n.strip() for n in v.split(",") if n.strip()]
        unknown = [n for n in names if n not in TFLITE_VARIANTS]
        if unknown:
            raise ValueError(f"unknown TFLite variant '{unknown[0]}'; allowed: {', '.join(TFLITE_VARIANTS)}")
        return ",".join(names)

    def variants_for(self, task: str) -> list[str]:
        """The variants to build for a model of `task` (binary, multiclass, regression)."""
        if self.tflite == "auto":
            return [v for v in TFLITE_VARIANTS if not (task == "regression" and v == "int8")]
        return [n for n in self.tflite.split(",") if n]

    def fingerprint_fields(self) -> dict:
        """What decides this stage's result in `tfpipe run` (its step fingerprint): not where the
        model, data and models come from and go, and which versions stay."""
        return self.model_dump(exclude={"model", "data", "base", "version", "keep"})
