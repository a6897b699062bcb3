"""Configuration of the training stage: the `[train]` section of tfpipe.toml, one CLI flag per key."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


AUGMENTATIONS = ("flip", "crop", "rotation")  # images: the random layers --augment can add

# Defaults that follow the training split's size (TrainConfig.sized): a small table gets small
# batches and more epochs, so that the model takes enough optimizer steps to learn; one step an
# epoch (a batch larger than the data) stops early after a handful of updates.
STEPS_PER_EPOCH = 32
MIN_BATCH, MAX_BATCH = 16, 256
DEFAULT_EPOCHS, MAX_EPOCHS, MIN_STEPS = 30, 200, 1000
# Without --epochs, training runs until early stopping ends it (a table's eval loss may still fall
# after the epochs above: loans_full_schema at 30 epochs was 7 points of accuracy short), within a
# time limit, and says so when the limit, not the data, ended it.
UNTIL_STOPPED, DEFAULT_TIME_LIMIT = 10_000, 600.0
# ... where an epoch counts as better only when it lowers the eval loss by this much: on a split a
# small model separates perfectly the loss creeps toward 0 for ever (penguins' half table ran 1,199
# epochs to do so), each creep an "improvement" that resets the patience.
UNTIL_STOPPED_MIN_DELTA = 1e-4
DEFAULT_PATIENCE = 5
# Early stopping judges no epoch before the first WARMUP_STEPS steps are done (at most half the
# epochs): a small net's eval loss in its first epochs can be a low that later epochs, though far
# better, do not beat within the patience.
WARMUP_STEPS = 300
# A regression whose training split has fewer examples than SMALL_TABLE trains ENSEMBLE copies of
# its network side by side (TrainConfig.ensemble): on a few hundred rows one network's test error
# moves with its seed about as much as it differs from a tree ensemble's, and their mean moves less.
SMALL_TABLE, ENSEMBLE = 1000, 5
# A regression whose training split has at least WIDE_NET examples gets the wider hidden layers
# (TrainConfig.sized): a smooth function of several columns (a daily count over years, weekdays and
# days of the year) underfits with the narrow ones. Measured on the table that showed it in
# docs/benchmarks.md ("Real tables: the second gallery").
NARROW_HIDDEN, WIDE_HIDDEN, WIDE_NET = [64, 32], [256, 128], 4000


class TrainConfig(BaseModel):
    """Options of `tfpipe train`; the field descriptions are the CLI's --help."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    data: str | None = Field(None, description="the data stage's output directory")
    out: str | None = Field(None, description="output directory (written atomically)")
    epochs: int | None = Field(None, ge=1, description="maximum epochs, early stopping may end sooner (default: "
                               "until early stopping ends it, within --time-limit)")
    batch_size: int | None = Field(None, ge=1, description="examples per replica per step (default: from the "
                                   f"training split's size, about {STEPS_PER_EPOCH} steps an epoch, a power of two "
                                   f"from {MIN_BATCH} to {MAX_BATCH})")
    learning_rate: float = Field(1e-3, gt=0, description="Adam learning rate")
    hidden: list[int] | None = Field(None, description="hidden layer widths, e.g. 64,32 (default: "
                                     f"{','.join(map(str, NARROW_HIDDEN))}, or {','.join(map(str, WIDE_HIDDEN))} "
                                     f"for a regression of at least {WIDE_NET:,} training examples)")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout after each hidden layer (images: before the head)")
    target: Literal["auto", "standard", "log"] = Field(
        "auto", description="regression: the label as the network learns it; auto takes log(1 + y) for a label never "
                            "below 0 whose upper spread is twice its lower one (prices, salaries), unless an ensemble "
                            "learns it, else mean and std; the served model answers in the label's units either way")
    ensemble: int | None = Field(
        None, ge=1, description="regression: copies of the network trained side by side in one model, each on its "
                                "own loss, the model answering their mean (default: "
                                f"{ENSEMBLE} when the training split has fewer than {SMALL_TABLE:,} examples, else 1)")
    scaling: Literal["auto", "log", "standard"] = Field(
        "auto", description="numbers: auto encodes each in quantile bins of the training split (piecewise linear: "
                            "where a value falls among the training values, in up to 10 pieces, bounded to the "
                            "training range); log normalises a heavy-tailed column (never below 0, a long right tail) "
                            "as log(1 + x) and the others by mean and std; standard normalises every one by mean and "
                            "std")
    model: Literal["cnn", "mobilenet_v3_small", "efficientnet_v2_b0", "resnet50"] = Field(
        "cnn", description="images: the network; cnn is a small CNN for CPUs, the others are keras.applications "
                           "architectures trained from scratch (weights=None)")
    filters: list[int] = Field(default_factory=lambda: [32, 64, 128],
                               description="images, --model cnn: filters of each convolution block, e.g. 32,64")
    image_size: str | None = Field(
        None, description="images: the model's input HEIGHTxWIDTH (default: the data stage's --resize, else the "
                          "training images' median size)")
    augment: str = Field("flip,crop", description="images: random augmentation in training, any of flip, crop, "
                                                  "rotation, comma-separated ('none' for none)")
    precision: Literal["auto", "float32", "mixed_float16", "mixed_bfloat16"] = Field(
        "auto", description="dtype policy; auto: mixed_float16 on NVIDIA GPUs with compute capability >= 7.0")
    xla: Literal["auto", "on", "off"] = Field("auto", description="XLA jit_compile; auto: on with a GPU")
    strategy: Literal["auto", "default", "mirrored", "multiworker"] = Field(
        "auto", description="distribution strategy; auto: mirrored with more than one GPU")
    grad_accum_steps: int = Field(1, ge=1, description="batches whose gradients are averaged per update")
    seed: int = Field(42, description="random seed for weights, shuffling and dropout")
    deterministic: bool = Field(False, description="deterministic ops and input order (bit-identical reruns)")
    shuffle_buffer: int = Field(10000, ge=1, description="examples in the training shuffle buffer")
    cache_mb: int = Field(
        512, ge=0,
        description="keep the preprocessed training and eval features in memory when they fit in this many MB (0: never)")
    patience: int | None = Field(None, ge=1, description="epochs without eval-loss improvement before stopping "
                                 f"(default: {DEFAULT_PATIENCE}, or a tenth of the epochs when that is more; without "
                                 f"--epochs, of {DEFAULT_EPOCHS}, or more when an epoch is few steps, so that "
                                 f"training takes at least {MIN_STEPS} steps, up to {MAX_EPOCHS})")
    min_epochs: int | None = Field(None, ge=0, description="epochs before early stopping may stop or keep a best "
                                   f"epoch (default: those of the first {WARMUP_STEPS} steps, at most half the "
                                   "epochs)")
    time_limit: float | None = Field(None, gt=0, description="stop training after this many seconds (default: "
                                     f"{DEFAULT_TIME_LIMIT:.0f} without --epochs, else none); training that ends "
                                     "here while the eval loss still falls says so")
    profile: bool = Field(False, description="write a TensorBoard profiler trace of a few steps")
    log_device_placement: bool = Field(False, description="log which device runs each op")
    force: bool = Field(False, description="retrain even when the output is up to date")

    @field_validator("hidden", "filters")
    @classmethod
    def _check_hidden(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and any(w < 1 for w in v):
            raise ValueError("widths must be >= 1")
        return v

    @field_validator("image_size")
    @classmethod
    def _check_size(cls, v: str | None) -> str | None:
        if v is not None:
            from tfpipe.pipeline.schema import parse_size

            parse_size(v)
        return v

    @field_validator("augment")
    @classmethod
    def _check_augment(cls, v: str) -> str:
        names = [n.strip() for n in v.split(",") if n.strip() and n.strip() != "none"]
        unknown = [n for n in names if n not in AUGMENTATIONS]
        if unknown:
            raise ValueError(f"unknown augmentation '{unknown[0]}'; choose from {', '.join(AUGMENTATIONS)} (or none)")
        return ",".join(names)

    @property
    def augmentations(self) -> list[str]:
        return [n for n in self.augment.split(",") if n]

    def sized(self, examples: int, regression: bool = False) -> tuple["TrainConfig", str]:
        """This config with the batch size, epochs and patience it leaves open chosen for
        `examples` training examples (and the ensemble, for a `regression`), and a note saying
        what was chosen ('' when nothing was)."""
        chosen = {}
        if self.batch_size is None:
            target = max(1, examples // STEPS_PER_EPOCH)
            chosen["batch_size"] = min(MAX_BATCH, max(MIN_BATCH, 2 ** int(math.log2(target)) if target else 1))
        batch = chosen.get("batch_size", self.batch_size)
        steps = max(1, math.ceil(examples / batch))
        epochs = self.epochs or min(MAX_EPOCHS, max(DEFAULT_EPOCHS, math.ceil(MIN_STEPS / steps)))
        if self.epochs is None:  # until early stopping, within a time limit; `epochs` sizes the patience
            chosen["epochs"] = UNTIL_STOPPED
            if self.time_limit is None:
                chosen["time_limit"] = DEFAULT_TIME_LIMIT
        if self.patience is None:
            chosen["patience"] = max(DEFAULT_PATIENCE, epochs // 10)
        if self.min_epochs is None:
            chosen["min_epochs"] = min(epochs // 2, math.ceil(WARMUP_STEPS / steps))
        if self.ensemble is None and regression:
            chosen["ensemble"] = ENSEMBLE if examples < SMALL_TABLE else 1
        if self.hidden is None:
            chosen["hidden"] = list(WIDE_HIDDEN if regression and examples >= WIDE_NET else NARROW_HIDDEN)
        if not chosen:
            return self, ""
        # the narrow layers go unsaid: every classification and small table has them (and images none)
        said = {k: ",".join(map(str, v)) if k == "hidden" else v for k, v in chosen.items()
                if k not in ("epochs", "time_limit") and not (k == "hidden" and v == NARROW_HIDDEN)}
        if not said and "epochs" not in chosen:
            return self.model_copy(update=chosen), ""
        note = ", ".join(([f"until early stopping (time limit {chosen.get('time_limit', self.time_limit):g} s)"]
                          if "epochs" in chosen else []) + [f"{k.replace('_', ' ')} {v}" for k, v in said.items()])
        return self.model_copy(update=chosen), f"for {examples:,} training examples: {note}"

    def resume_fields(self) -> dict:
        """What must match for a new run to resume an interrupted one's checkpoints."""
        return self.model_dump(include={"hidden", "dropout", "seed", "batch_size", "grad_accum_steps", "model",
                                        "filters", "image_size", "augment", "scaling", "target",
                                        "ensemble"})

    def fingerprint_fields(self) -> dict:
        return self.model_dump(exclude={"data", "out", "force", "profile", "log_device_placement"})


def parse_int_list(text: str) -> list[int]:
    """'64,32' -> [64, 32]."""
    try:
        return [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise ValueError(f"'{text}' is not a comma-separated list of integers") from None
