"""The steps of `tfpipe run`, in order: each one a stage run on the workdir's paths.

A step is one entry of REGISTRY: its name, the steps whose outputs it reads, the type of its
own outputs, the settings that decide its result (fingerprinted), the files outside the workdir
it reads (the data step's raw input), and `run(config, inputs, log) -> StageResult`.
`tfpipe/run.py` loops over the registry: it decides which steps are cached, runs the others and
keeps the manifest, and knows no stage's settings or files. Adding a stage to `tfpipe run` is
one entry here plus the stage itself (docs/architecture.md, "Adding a stage").

The stages are imported inside the step functions: `tfpipe --help` and the CLI's parser read
this module without loading TensorFlow, Beam or gRPC.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from tfpipe.files import digest, read_json, write_atomic
from tfpipe.stage import (
    DataOutputs,
    ExportOutputs,
    LoadtestOutputs,
    RolloutOutputs,
    ServeOutputs,
    SkewOutputs,
    StageOutputs,
    StageResult,
    TrainOutputs,
)

if TYPE_CHECKING:
    from tfpipe.config import Config
    from tfpipe.serve.deploy import Deployment

Log = Callable[[str], None]
O = TypeVar("O", bound=StageOutputs)


@dataclass(frozen=True)
class StepInputs:
    """What a step gets besides the config: the run's workdir (each step writes its own folder of
    it), the typed outputs of the steps it needs, and the run's embedded server (one per run: the
    serve step deploys to it, the load test targets it, `--serve-after` keeps it up)."""

    workdir: str
    upstream: Mapping[str, StageOutputs]
    server: Callable[[], Deployment]

    def path(self, *parts: str) -> str:
        return os.path.join(self.workdir, *parts)

    def of(self, step: str, kind: type[O]) -> O:
        """The outputs of `step` (one this step needs), as the `kind` its stage returns."""
        outputs = self.upstream[step]
        if not isinstance(outputs, kind):
            raise TypeError(f"{step}'s outputs are a {type(outputs).__name__}, not a {kind.__name__}")
        return outputs


@dataclass(frozen=True)
class Step:
    name: str
    needs: tuple[str, ...]
    outputs: type[StageOutputs]
    settings: Callable[[Config], dict[str, Any]]
    run: Callable[[Config, StepInputs, Log], StageResult]
    # the files outside the workdir the step reads, as they stand (path, size, time): None for a
    # step that reads only earlier steps' outputs (their manifests' hashes are its inputs instead).
    # Their stat is a quick check, not their content: a step whose files were touched runs, and the
    # stage then finds its own key, by content, unchanged; its manifest, and so every later step's
    # key, stays the same.
    sources: Callable[[Config], dict[str, Any]] | None = None


# ---- data --------------------------------------------------------------------------------------------

def data_settings(config: Config) -> dict[str, Any]:
    return config.data.settings()


def data_sources(config: Config) -> dict[str, Any]:
    if config.data.format == "images":
        from tfpipe.pipeline.image_job import find_images

        items, classes, _ = find_images(config.data, log=lambda _: None)
        return {"images": digest([[i.path, i.size] for i in items]), "count": len(items), "classes": classes}
    from tfpipe.pipeline.inputs import file_delimiter, resolve_inputs

    # A CSV file's delimiter (given, or detected from its head) decides how it is read; `auto` and
    # the delimiter it detects given by hand read the same rows, so it is the resolved one that counts.
    files = []
    for f in resolve_inputs(config.data.input, config.data.format):
        delimiter = file_delimiter(f, config.data.delimiter)
        files.append({"path": f.path, "size": f.size, "mtime": f.mtime,
                      **({"delimiter": delimiter} if delimiter not in (None, ",") else {})})
    return {"files": files}


def run_data(config: Config, inputs: StepInputs, log: Log) -> StageResult:
    from tfpipe.pipeline.job import run

    # The run owns the cache (it decided this step runs): the stage's own, for `tfpipe data` on
    # its own, is bypassed.
    return run(config.data.model_copy(update={"out": inputs.path("data"), "force": True}), log=log)


# ---- train and export --------------------------------------------------------------------------------

def run_train(config: Config, inputs: StepInputs, log: Log) -> StageResult:
    from tfpipe.train.job import run

    data = inputs.of("data", DataOutputs)
    return run(config.train.model_copy(update={"data": data.path, "out": inputs.path("train"), "force": True}),
               log=log)


def run_export(config: Config, inputs: StepInputs, log: Log) -> StageResult:
    from tfpipe.export.job import run

    cfg = config.export.model_copy(update={"model": inputs.of("train", TrainOutputs).path,
                                           "data": inputs.of("data", DataOutputs).path,
                                           "base": inputs.path("export", "models"),
                                           # the run's rollout step promotes, after its serving gate
                                           "serving_gate": config.rollout.serving_gate})
    done = run(cfg, log=log)
    # The version's folder moves when it is promoted or rolled back (candidates/N <-> N): the run keeps
    # (and fingerprints) a copy of its export.json where it stays.
    kept = inputs.path("export", "export.json")
    with open(done.manifest, "rb") as f:
        write_atomic(kept, f.read())
    return dataclasses.replace(done, manifest=kept)


def export_settings(config: Config) -> dict[str, Any]:
    return {**config.export.fingerprint_fields(), "serving_gate": config.rollout.serving_gate}


# ---- serve ------------------------------------------------------------------------------------------

def serve_settings(config: Config) -> dict[str, Any]:
    fields = config.serve.fingerprint_fields()
    if config.serve.batching == "tune":
        fields["tune"] = config.tune.fingerprint_fields()
    return fields


def run_serve(config: Config, inputs: StepInputs, log: Log) -> StageResult:
    from tfpipe.loadtest.payloads import rows_from_data
    from tfpipe.serve.deploy import result

    export, data = inputs.of("export", ExportOutputs), inputs.of("data", DataOutputs)
    deployment = inputs.server()
    notes, tuned = {}, ""
    if config.serve.batching == "tune":
        deployment.stop()  # the trials get the machine to themselves
        best, tuned = tune_batching(config, inputs, export, log)
        # the batching parameters only: the run's server is one process in this one (no workers)
        deployment.reconfigure(config.serve.with_batching(best))
        notes["tune"] = inputs.path("tune", "tune.json")
    # the version's parent: TF Serving's model_base_path, where a later export adds the next version
    # a new version that passed the offline gate is served beside, as NAME-candidate, for the rollout step
    candidate = export.candidate if export.decision == "passed" else None
    deployment.deploy(export.name, os.path.dirname(export.path), export.version,
                      lambda signature, n: rows_from_data(data.path, signature, n),
                      config.export.tolerance, log, notes=notes, candidate=candidate)
    return result(inputs.path("serve"), "images" if config.data.format == "images" else "rows", tuned)


def tune_batching(config: Config, inputs: StepInputs, export: ExportOutputs, log: Log):
    """`tfpipe tune` on the exported model with the [tune] settings, into the workdir's tune/;
    the best candidate and its label."""
    from tfpipe.tune.job import best, run

    out = inputs.path("tune")
    cfg = config.tune.model_copy(update={"model_name": export.name, "model_base_path": os.path.dirname(export.path),
                                         "data": inputs.of("data", DataOutputs).path, "payload": None, "out": out,
                                         "protocol": config.serve.protocol, "skip_workers": True})
    if run(cfg, log=lambda line: log("  " + line)).code:
        log("  no candidate met the [tune] SLO: serving with the best of them anyway")
    return best(out)


# ---- loadtest and skew ----------------------------------------------------------------------------------

def loadtest_settings(config: Config) -> dict[str, Any]:
    return {**config.loadtest.fingerprint_fields(), "protocol": config.serve.protocol}


def traffic_prefix(workdir: str) -> str:
    """The request log the load test's traffic is written to, for the skew step."""
    return os.path.join(workdir, "traffic", "requests")


def run_loadtest(config: Config, inputs: StepInputs, log: Log) -> StageResult:
    from tfpipe.errors import EXIT_INTERRUPTED
    from tfpipe.loadtest.job import run

    export = inputs.of("export", ExportOutputs)
    deployment = inputs.server()
    server = deployment.start()
    target = (f"http://127.0.0.1:{server.rest_port}" if config.serve.protocol == "rest"
              else f"grpc://127.0.0.1:{server.grpc_port}")
    out = inputs.path("loadtest")
    cfg = config.loadtest.model_copy(update={"target": target, "model": export.name,
                                             "data": inputs.of("data", DataOutputs).path, "payload": None,
                                             "out": out, "version": None, "label": None, "model_path": export.path})
    # The load test's requests are logged for the skew step: this load test's only (rows; the
    # skew check compares tabular features).
    traffic = traffic_prefix(inputs.workdir)
    shutil.rmtree(os.path.dirname(traffic), ignore_errors=True)
    images = config.data.format == "images"
    with contextlib.nullcontext() if images else deployment.logging_requests(export.name, traffic):
        done = run(cfg, log=log)  # publishes `out` whole (an interrupted run too: EXIT_INTERRUPTED)
    if done.code == EXIT_INTERRUPTED:
        raise KeyboardInterrupt
    return done


def run_skew(config: Config, inputs: StepInputs, log: Log) -> StageResult:
    from tfpipe.errors import RunError
    from tfpipe.skew.job import run, skipped

    out = inputs.path("skew")
    if config.data.format == "images":
        return skipped(out, "image data (skew compares tabular features)")
    from tfpipe.prediction_logs import log_files

    logs = traffic_prefix(inputs.workdir)
    if not log_files(logs):
        raise RunError(f"the load test's request log is gone ({os.path.dirname(logs)}): run again with --from loadtest")
    cfg = config.skew.model_copy(update={"data": inputs.of("data", DataOutputs).path, "logs": logs,
                                         "model": inputs.of("export", ExportOutputs).name, "out": out})
    return run(cfg, log=log)


# ---- rollout ------------------------------------------------------------------------------------------

def rollout_settings(config: Config) -> dict[str, Any]:
    return {**config.rollout.fingerprint_fields(), "users": config.loadtest.users, "slo": config.loadtest.slo,
            "protocol": config.serve.protocol}


def run_rollout(config: Config, inputs: StepInputs, log: Log) -> StageResult:
    from tfpipe.rollout.job import Target, Versions, run

    from tfpipe.versions import VersionError, candidates, version_path

    export = inputs.of("export", ExportOutputs)
    model_dir = os.path.dirname(export.path)
    try:  # the new version's own record says why the export decided as it did
        manifest = read_json(os.path.join(version_path(model_dir, export.candidate), "assets.extra", "export.json"))
    except VersionError:  # removed since (--keep, or by hand)
        manifest = None
    seen = Versions(model_dir, export.name, export.version, export.candidate, export.decision,
                    (manifest or {}).get("reason", ""))
    target = None
    if export.decision == "passed" and config.rollout.serving_gate and export.candidate in candidates(model_dir):
        server = inputs.server().start()
        address = (f"http://127.0.0.1:{server.rest_port}" if config.serve.protocol == "rest"
                   else f"grpc://127.0.0.1:{server.grpc_port}")
        target = Target(address, lambda model: sum(n for (m, _, _), n in list(server.metrics.requests.items())
                                                   if m == model),
                        inputs.of("data", DataOutputs).path, config.loadtest.users, config.loadtest.slo,
                        shadowing=server.shadowing)
    out = inputs.path("rollout")
    return run(config.rollout, seen, target, out, log=lambda line: log("  " + line),
               data=inputs.of("data", DataOutputs).path, models_config=inputs.path("serve", "models.config"))


REGISTRY = (
    Step("data", (), DataOutputs, data_settings, run_data, sources=data_sources),
    Step("train", ("data",), TrainOutputs, lambda c: c.train.fingerprint_fields(), run_train),
    Step("export", ("data", "train"), ExportOutputs, export_settings, run_export),
    Step("serve", ("data", "export"), ServeOutputs, serve_settings, run_serve),
    Step("loadtest", ("data", "export", "serve"), LoadtestOutputs, loadtest_settings, run_loadtest),
    Step("skew", ("data", "export", "loadtest"), SkewOutputs, lambda c: c.skew.fingerprint_fields(), run_skew),
    Step("rollout", ("data", "export", "serve", "loadtest", "skew"), RolloutOutputs, rollout_settings, run_rollout),
)
STEPS = tuple(s.name for s in REGISTRY)
BY_NAME = {s.name: s for s in REGISTRY}
