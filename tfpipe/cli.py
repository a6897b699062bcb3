"""The `tfpipe` command. Each subcommand is a thin layer over a stage's `run(config)`."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import json
import logging
import os
import signal
import sys
import textwrap
import threading
import types
import traceback
import typing
from typing import Any, Literal

from pydantic import BaseModel

from tfpipe import __version__, quiet_native_stderr
from tfpipe.config import Config, load_config, validate
from tfpipe.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USER_ERROR, ConfigError, UserError
from tfpipe.rollout.commands import add_rollout_commands

# Set when SIGINT/SIGTERM arrives: Beam re-raises an interrupt inside a DoFn as another error.
_interrupted = threading.Event()


def _on_signal(signum, frame):
    _interrupted.set()
    raise KeyboardInterrupt


def add_model_flags(parser: argparse.ArgumentParser, model: type[BaseModel], skip: set[str] = frozenset(),
                    underscores: bool = False) -> None:
    """One flag per config key, named after the key (`max_bad_fraction` -> `--max-bad-fraction`;
    with `underscores`, `--max_bad_fraction` as well, TF Serving's spelling).

    Flags default to 'not given', so only flags on the command line override the config file.
    """
    from tfpipe.pipeline.config import parse_split
    from tfpipe.train.config import parse_int_list

    for name, field in model.model_fields.items():
        if name in skip:
            continue
        key = field.alias or name
        flag = "--" + key.replace("_", "-")
        ann = field.annotation
        if typing.get_origin(ann) in (typing.Union, types.UnionType):  # `X | None`: a flag gives an X
            ann = next((a for a in typing.get_args(ann) if a is not type(None)), ann)
        origin = typing.get_origin(ann)
        help_ = field.description or ""
        kw: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS}
        if ann is bool:
            kw.update(action="store_true")
        elif origin is list and typing.get_args(ann) == (int,):
            kw.update(type=_arg_type(parse_int_list), metavar="N,N,...")
        elif origin is list:
            kw.update(nargs="+", action="extend", metavar=key.upper())
        elif origin is dict:
            kw.update(type=_arg_type(parse_split), metavar="NAME=W,...")
        elif origin is Literal:
            kw.update(choices=typing.get_args(ann))
        else:
            scalar = next((a for a in typing.get_args(ann) if a is not type(None)), ann)
            kw.update(type=scalar if scalar in (int, float) else str, metavar=key.upper())
        if field.default is not None and not callable(field.default_factory) and ann is not bool:
            help_ += f" (default: {field.default})"
        elif field.default_factory is not None and origin is dict:
            help_ += " (default: " + ",".join(f"{k}={v}" for k, v in field.default_factory().items()) + ")"
        elif field.default_factory is not None and typing.get_args(ann) == (int,):
            help_ += " (default: " + ",".join(map(str, field.default_factory())) + ")"
        names = [flag] + (["--" + key] if underscores and "_" in key else [])
        parser.add_argument(*names, help=help_.replace("%", "%%"), **kw)  # argparse formats help with %


def _arg_type(parse):
    def convert(text: str):
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    convert.__name__ = parse.__name__
    return convert


def _section(args: argparse.Namespace, config: Config, section: str, model: type[BaseModel]) -> Any:
    """The config file's section with the command line's flags laid over it."""
    values = getattr(config, section).model_dump(by_alias=True, exclude_unset=True)
    for name, field in model.model_fields.items():
        if hasattr(args, name):
            values[field.alias or name] = getattr(args, name)
    return validate(model, values, source="options", prefix=section)


def cmd_stage(stage: "_StageCommand", args: argparse.Namespace, extra: list[str]) -> int:
    """A stage's command: its config section with the flags over it, options it does not know
    passed on to Beam (`accepts_extra`), its inputs checked before the stage (and TensorFlow or
    Beam with it) is imported, then the stage's run; the exit code is its result's (an SLO missed,
    a feature skewed, no tune candidate within the SLO, an export the gate held or refused: 1)."""
    module, _, cls = stage.config.partition(":")
    cfg = _section(args, load_config(args.config), stage.name, getattr(importlib.import_module(module), cls))
    if extra:
        cfg.beam_args = [*cfg.beam_args, *extra]
    if stage.check:
        module, _, function = stage.check.partition(":")
        getattr(importlib.import_module(module), function)(cfg)  # a wrong path fails now, not after imports
    # TensorFlow, the TFLite converter and LiteRT write chatter to fd 2; errors still reach the
    # user as exceptions (the data stage's Beam logs stay, for --debug to show)
    with quiet_native_stderr(stage.quiet and not args.debug):
        job = importlib.import_module(stage.job)
        return job.run(cfg, log=lambda line: print(line, flush=True)).code


def cmd_serve(args: argparse.Namespace, extra: list[str]) -> int:
    from tfpipe.serve.flags import options_from_args

    opts = options_from_args(args)
    log = lambda line: print(line, flush=True)  # noqa: E731
    if opts.version and opts.backend == "embedded":
        from tfpipe.serve.flags import version_text

        print(version_text())
        return 0
    for arg in extra:  # as tensorflow_model_server: named, then ignored
        print(f"unknown argument: {arg} (ignored; 'tfpipe serve --help' lists the flags)", file=sys.stderr)
    if opts.backend == "embedded" and not (opts.emit_k8s or opts.version):
        from tfpipe.serve.workers import run_workers, worker_count  # the supervisor imports no TensorFlow

        n, why = worker_count(opts)
        if opts.workers == 0:  # auto: say what it chose
            log(f"tfpipe serve: {n} worker process{'es' if n > 1 else ''} ({why}; --workers N to choose)")
        opts = dataclasses.replace(opts, workers=n)
        if n > 1:
            return run_workers(opts, log, debug=args.debug)
    with quiet_native_stderr(not args.debug):
        import tfpipe.serve.tfserving.configs  # noqa: F401  (TensorFlow comes with the official protos)
    if opts.emit_k8s:
        from tfpipe.serve.tfserving.k8s import emit

        emit(opts, opts.emit_k8s, log)
        return 0
    if opts.backend != "embedded":
        from tfpipe.serve.tfserving.launcher import launch

        return launch(opts, log)
    with quiet_native_stderr(not args.debug):
        from tfpipe.serve.server import run_embedded
    return run_embedded(opts, log)


def run_request_config(args: argparse.Namespace) -> tuple[Config, str | None, str]:
    """The config, its path and the workdir of `tfpipe run`/`tfpipe show`. Three cases:
    --config FILE; --input FILE with no --config (the user's own data: workdir runs/<file stem>,
    model named after the file, every other setting the stages' defaults); neither (the demo)."""
    from tfpipe.run import DEMO_CONFIG, default_workdir, exported_model_name, own_data_name

    inputs = getattr(args, "input", None)
    overrides = list(getattr(args, "set", None) or [])
    if inputs:
        overrides.append("data.input=" + json.dumps(inputs))
    if getattr(args, "label", None):
        overrides.append("data.label=" + json.dumps(args.label))
    if args.config or not inputs:
        path = args.config or DEMO_CONFIG
        config = _images_found(load_config(path, overrides))
        return config, path, args.workdir or default_workdir(config, path)
    # A workdir that already exported a model keeps its name: the second day's file is judged
    # against the version served under it, whatever the new file is called.
    name = (exported_model_name(args.workdir) if args.workdir else None) or own_data_name(inputs)
    config = _images_found(load_config(None, [f"export.name={json.dumps(name)}"] + overrides))
    if not config.data.label and config.data.format != "images" and args.command == "run":
        raise ConfigError(f"tfpipe run --input {' '.join(inputs)}: name the column to predict with --label COLUMN"
                          " (or give a folder with one subfolder of images per class)")
    return config, None, args.workdir or config.run.workdir or os.path.join("runs", name)


def _images_found(config: Config) -> Config:
    """A config whose input is one folder of class folders of images, with format auto, reads
    images: every step that asks `data.format` then sees it (no --label needed: the folders are
    the classes)."""
    from tfpipe.pipeline.autodetect import found_format

    config.data.format = found_format(config.data.format, config.data.input)
    return config


def cmd_run(args: argparse.Namespace, extra: list[str]) -> int:
    from tfpipe.run import RunRequest, run

    config, path, workdir = run_request_config(args)
    return run(RunRequest(config=config, config_path=path, workdir=workdir, from_step=args.from_step,
                          only=args.only, force=args.force, serve_after=args.serve_after, debug=args.debug))


def cmd_show(args: argparse.Namespace, extra: list[str]) -> int:
    from tfpipe.show import show

    _, _, workdir = run_request_config(args)
    return show(workdir, as_json=args.json)


@dataclasses.dataclass(frozen=True)
class _StageCommand:
    """A stage's subcommand, whose flags come from its config model (`config`, "module:Class",
    imported when the parser is built), and its texts for --help."""

    name: str
    config: str
    job: str  # the stage's module, whose run(config, log) the command calls
    help: str
    description: str
    epilog: str
    check: str | None = None  # "module:function" checking the config's paths before the stage is imported
    quiet: bool = True  # native code's writes to fd 2 silenced (TensorFlow's chatter), as without --debug
    accepts_extra: bool = False  # options it does not know are passed on (Beam's)
    flag_options: tuple[tuple[str, Any], ...] = ()  # add_model_flags' keyword arguments


_STAGE_COMMANDS = (
    _StageCommand(
        "data", "tfpipe.pipeline.config:DataConfig", "tfpipe.pipeline.job",
        help="raw CSV/JSONL/Parquet -> validated, split, sharded gzip TFRecords + schema + stats",
        description=(
            "An Apache Beam job: reads CSV (with a header), JSON Lines or Parquet (globs, several "
            "files, .gz), infers or enforces a schema, sends bad rows to deadletter/*.jsonl with a "
            "reason, splits by a stable hash, computes statistics, and writes gzip TFRecords of "
            "tf.train.Example plus schema.json, stats.json and data.json into --out, atomically. "
            "Any other option is passed to Beam unchanged (--runner, --direct_num_workers, "
            "--direct_running_mode, --project, --region, --temp_location, --flink_master, ...); "
            "the default runner is FnApiRunner, with one worker per core on inputs over 16 MB. "
            "With --format images it reads labelled JPEG/PNG/BMP/GIF files instead: a folder with one "
            "subfolder per class, or a CSV/JSONL manifest of image paths and labels; empty, "
            "non-image, truncated, too small (--min-size) and unknown-class files go to the dead-letter "
            "with their reason, and each record keeps the file's bytes (re-encoded only with --resize)."),
        epilog=(
            "examples: tfpipe data --input 'raw/*.csv' --label big_tipper --exclude tips --out work/data; "
            "tfpipe data --format images --input photos/ --min-size 32x32 --out work/images"),
        accepts_extra=True,
        flag_options=(("skip", frozenset({"beam_args"})),),
        quiet=False,
    ),
    _StageCommand(
        "train", "tfpipe.train.config:TrainConfig", "tfpipe.train.job",
        help="TFRecords from tfpipe data -> a Keras 3 model with its preprocessing inside",
        description=(
            "Reads only the data stage's output (TFRecords, schema.json, stats.json): tf.data "
            "(parallel interleave, shuffle, batch-then-parse, prefetch) feeds a Keras 3 model whose "
            "preprocessing layers (imputation, normalisation, string lookups) are built from the "
            "statistics, so the saved model takes raw features. Mixed precision and XLA on GPUs, "
            "MirroredStrategy over several GPUs, MultiWorkerMirroredStrategy with TF_CONFIG, gradient "
            "accumulation, early stopping, a checkpoint every epoch, and resume: a killed run started "
            "again with the same command continues from its last epoch. On an image data dir "
            "(tfpipe data --format images): a small CNN or a keras.applications network on uint8 "
            "pixels, with augmentation and normalisation inside the model (--model, --filters, "
            "--image-size, --augment)."),
        epilog="example: tfpipe train --data runs/taxi/data --out runs/taxi/train --epochs 20 --hidden 128,64",
        check="tfpipe.train.datadir:check_inputs",
    ),
    _StageCommand(
        "export", "tfpipe.export.config:ExportConfig", "tfpipe.export.job",
        help="a trained model -> a versioned SavedModel for TF Serving, published atomically",
        description=(
            "Writes BASE/NAME/VERSION/ (VERSION one more than the highest so far, never reused) with "
            "two signatures: serving_default takes raw features as named tensors, predict_examples "
            "takes serialized tf.train.Example strings; both return probabilities, class_ids and "
            "classes (classification) or predictions (regression). Warmup requests for TF Serving "
            "come from real eval rows. The SavedModel is reloaded and checked against the Keras "
            "model before an atomic rename publishes it. An image model's serving_default takes "
            "encoded image bytes (image_bytes), predict_pixels uint8 pixels, classification "
            "serialized Examples; its TFLite variants take uint8 pixels. When BASE/NAME already serves "
            "a version, the new one is judged against it on the same rows (the new test split and the "
            "one the served version kept): served only if it is not worse beyond the noise, meets "
            "--thresholds and keeps the served version's signatures; otherwise it is kept in "
            "BASE/NAME/candidates/ for `tfpipe promote`, the served version is untouched, and the exit "
            "status is 1."),
        epilog=("examples: tfpipe export --model runs/taxi/train --data runs/taxi/data --base runs/taxi/models; "
                "tfpipe export ... --thresholds 'accuracy>=0.8' 'accuracy>=baseline-0.01' --slice company"),
        check="tfpipe.export.inputs:check_inputs",
    ),
    _StageCommand(
        "loadtest", "tfpipe.loadtest.config:LoadtestConfig", "tfpipe.loadtest.job",
        help="load-test a TF Serving endpoint (REST or gRPC) with locust: true percentiles, sweeps, an SLO gate",
        description=(
            "Builds requests from real eval rows of a tfpipe data directory (with its test rows too when the "
            "eval split has under 200; or takes --payload), shaped for the signature the server reports, "
            "checks that the server accepts one, then runs locust as a library in its own process per step: "
            "closed model (--users N, each user waits for its answer) or open model (--rate R requests/s on "
            "a schedule, latency counted from the intended send time). Every response time is kept with "
            "microsecond resolution; prints p50/p90/p95/p99/p99.9/max per step, finds the knee of a --sweep, "
            "writes results.json, results.csv and report.html into --out (default runs/loadtest), and exits 1 "
            "when --slo is missed (0 when met). With --replay PREFIX it sends a request log's requests "
            "again (written by tfpipe serve's logging_config or --request_log_prefix), each over the API and "
            "protocol it came in on, at its recorded time times 1/--speed, and compares count, rate and latency "
            "with the log's. Requests go only to --target (and --grpc-target)."),
        epilog=(
            'examples: tfpipe loadtest --target http://127.0.0.1:8501 --model taxi --data runs/taxi/data '
            '--sweep 1,2,4,8 --duration 10s --slo "p99<20ms,errors<0.1%"; '
            'tfpipe loadtest --replay logs/taxi --target http://127.0.0.1:8501 '
            '--grpc-target grpc://127.0.0.1:8500 --speed 2'),
    ),
    _StageCommand(
        "skew", "tfpipe.skew.config:SkewConfig", "tfpipe.skew.job",
        help="training/serving skew: logged requests' features against the training split",
        description=(
            "Reads a request log written by tfpipe serve (a model's logging_config, or --request_log_prefix): "
            "the features of every logged Predict (named tensors or serialized tf.Examples), Classify, Regress "
            "and MultiInference request, REST or gRPC. Computes their statistics with the data stage's combiner "
            "and compares each feature with the training split of --data, as TFDV does: L-infinity distance over "
            "value frequencies for categorical features, Jensen-Shannon divergence (in bits, 0 to 1) over the "
            "training quantile bins for numeric ones. Also reports features never sent, a rise in missing values, "
            "categories training never saw and values beyond the training range. Each distance comes with its "
            "noise bound, the distance that samples of the traffic's size (identical rows counted once) drawn "
            "from the training split stay under with --confidence: a feature is skewed only when its distance "
            "is over its threshold and beyond that bound. Writes skew.json and skew.html into --out; exits 1 "
            "when a feature is skewed, 0 when none is."),
        epilog=(
            "example: tfpipe skew --data runs/taxi/data --logs /var/log/tfpipe/taxi --threshold 0.1 "
            "trip_miles=0.2"),
        check="tfpipe.skew.job:check_inputs",
    ),
    _StageCommand(
        "predict", "tfpipe.predict.config:PredictConfig", "tfpipe.predict.job",
        help="batch inference: score a file of any size with a published model, as a Beam job",
        description=(
            "Reads CSV (any delimiter), JSON Lines or Parquet (globs, several files, .gz) with the data stage's "
            "readers, validates each row against the schema the model was trained on (kept in the version's "
            "assets.extra/), and scores the good rows with the version's serving_default signature, called as "
            "tfpipe serve calls it, through Beam's RunInference. Rows that do not fit, or that the model "
            "refuses, go to deadletter/*.jsonl with their reason: rows read = predicted + dead-lettered. "
            "Writes predictions/part-*.parquet (or csv, jsonl) with the carried input columns (row IDs, the label when "
            "present), the features (or only --key), the prediction (with each class's probability), the "
            "model's name and version, and predict.json, into --out atomically. A retried work unit rewrites "
            "its own files whole. Any other option is passed to Beam unchanged (--runner, --direct_num_workers, "
            "--direct_running_mode, ...); the default runner is FnApiRunner, with one worker per core on "
            "inputs over 16 MB. An image model scores a folder of image files (or of class folders of them): "
            "each file decoded in full first, a broken one dead-lettered."),
        epilog=("examples: tfpipe predict --model runs/taxi/export/models/taxi --input 'new/*.csv' --out scored; "
                "tfpipe predict --model runs/taxi/export/models/taxi/3 --input trips.parquet --key trip_id "
                "--output-format csv --out scored"),
        accepts_extra=True,
        flag_options=(("skip", frozenset({"beam_args"})),),
        check="tfpipe.predict.job:check_inputs",
    ),
    _StageCommand(
        "tune", "tfpipe.tune.config:TuneConfig", "tfpipe.tune.job",
        help="batching tuned by measurement: TF Serving's BatchingParameters searched with the load generator",
        description=(
            "Searches max_batch_size, batch_timeout_micros, num_batch_threads, max_enqueued_batches and "
            "allowed_batch_sizes for the highest throughput within --slo. Each trial starts the server (--backend: "
            "tfpipe's embedded server, tensorflow_model_server or the tensorflow/serving container, through tfpipe "
            "serve) on the model with one candidate batching.config, load-tests it with tfpipe loadtest's generator "
            "at each load level, lowest first, until one misses the SLO, and stops it. The candidates come coarse to "
            "fine from the TF Serving batching guide's CPU starting point (num_batch_threads = cores, "
            "batch_timeout_micros 0, max_batch_size 32): a 3x3 grid of batch size and timeout, the best pair's "
            "neighbours, thread counts, the queue length and padding, and the start and the leader measured again; "
            "at most --trials (20). Writes batching.config (the best), tune.json and tune.html (every trial) into "
            "--out; exits 1 when no candidate met the SLO. A killed tune resumes where it stopped when run again. "
            "Flags take TF Serving's spelling (--model_base_path) or tfpipe's (--model-base-path)."),
        epilog=(
            'example: tfpipe tune --model_name taxi --model_base_path runs/taxi/export/serving '
            '--data runs/taxi/data --clients 32 --slo "p99<20ms" --out runs/taxi-tune; then: tfpipe serve '
            '--model_name taxi --model_base_path ... --enable_batching '
            '--batching_parameters_file runs/taxi-tune/batching.config'),
        flag_options=(("underscores", True),),
        check="tfpipe.tune.job:check_inputs",
    ),
)


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", metavar="TOML", help="tfpipe.toml to read; flags override its keys")
    common.add_argument("--debug", action="store_true", help="show tracebacks and Beam's logs")

    parser = argparse.ArgumentParser(
        prog="tfpipe",
        description="Raw data to a served, load-tested TensorFlow model.",
    )
    parser.add_argument("--version", action="version", version=f"tfpipe {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for stage in _STAGE_COMMANDS:  # in `tfpipe --help`'s order: data, train, export, then serve
        if stage.name == "loadtest":
            _add_serve(sub)
        module, _, cls = stage.config.partition(":")
        p = sub.add_parser(stage.name, parents=[common], help=stage.help, description=stage.description,
                           epilog=stage.epilog)
        add_model_flags(p, getattr(importlib.import_module(module), cls), **dict(stage.flag_options))
        p.set_defaults(handler=functools.partial(cmd_stage, stage),
                       **({"accepts_extra": True} if stage.accepts_extra else {}))
    _add_run(sub, common)
    _add_show(sub, common)
    add_rollout_commands(sub, common)
    return parser


def _add_serve(sub) -> None:
    """`tfpipe serve`: tensorflow_model_server's flags, and tfpipe's own."""
    from tfpipe.serve.flags import add_serve_flags

    debug_only = argparse.ArgumentParser(add_help=False)
    debug_only.add_argument("--debug", action="store_true", help="show tracebacks and TensorFlow's logs")
    serve = sub.add_parser(
        "serve", parents=[debug_only], allow_abbrev=False,
        help="serve BASE/NAME/VERSION SavedModels with TF Serving's gRPC and REST APIs",
        description=(
            "Takes tensorflow_model_server's own flags: a command line written for it works with the "
            "program name replaced by 'tfpipe serve'. The default backend is an embedded server that "
            "speaks TF Serving's gRPC (PredictionService, ModelService) and REST APIs, polls the base "
            "paths for new versions (hot reload with zero failed requests), runs warmup records, "
            "batches requests with --enable_batching, and exports Prometheus metrics with "
            "--monitoring_config_file. --backend tfserving runs the real tensorflow_model_server with "
            "generated models.config / batching.config / monitoring.config; --backend docker runs the "
            "tensorflow/serving image; --emit-k8s DIR writes Kubernetes manifests. SIGTERM drains "
            "in-flight requests and exits 0."
        ),
        epilog=("example: tfpipe serve --rest_api_port=8501 --model_name=taxi --model_base_path=runs/taxi/models/taxi\n"
                "         tfpipe serve --model_config_file=models.config --enable_batching "
                "--batching_parameters_file=batching.config"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_serve_flags(serve)
    serve.set_defaults(handler=cmd_serve, accepts_extra=True)


def _add_run(sub, common: argparse.ArgumentParser) -> None:
    from tfpipe.steps import STEPS

    run = sub.add_parser(
        "run", parents=[common],
        help="the whole pipeline, data -> train -> export -> serve -> loadtest -> skew, step-cached, one report",
        description=textwrap.fill(
            "Runs every stage in one workdir from one config file (a section per stage: [data], [train], "
            "[export], [serve], [loadtest], [skew], [tune], [run]); with --input FILE --label COLUMN and no "
            "--config, your own data into runs/<file stem> with every stage's defaults; with neither, the "
            "bundled penguins demo (examples/penguins.toml). The workdir decides every stage's paths (paths "
            "in the stage sections are for the single-stage commands). Each step is cached by a fingerprint "
            "of its config section, the hashes of its inputs and the tfpipe version: a rerun with nothing "
            "changed does no work, a "
            "changed option reruns that step and the ones after it, and a run that failed or was killed "
            "resumes at the step where it stopped (training from its last finished epoch). The model is "
            "served by the embedded server on 127.0.0.1 from the generated TF Serving configs, its answers "
            "checked against the SavedModel in-process, then load-tested with its requests logged, and the "
            "logged features compared with the training data (tfpipe skew). Writes manifest.json (lineage) "
            "and report.html; logs/STEP.log holds each step's output. Exit 1 when the load test misses "
            "its SLO or a feature is skewed, 2 on a user error."
        ),
        epilog=("examples: tfpipe run\n"
                "          tfpipe run --input my.csv --label label\n"
                "          tfpipe run --config examples/chicago_taxi.toml\n"
                "          tfpipe run --set train.learning_rate=0.003        (reruns train and what follows)\n"
                "          tfpipe run --from export --serve-after"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("--workdir", metavar="DIR", help="where everything goes (default: [run] workdir, "
                     "else runs/<config file name>)")
    run.add_argument("--from", dest="from_step", choices=STEPS, metavar="STEP",
                     help=f"rerun this step and every later one ({', '.join(STEPS)})")
    run.add_argument("--only", choices=STEPS, metavar="STEP",
                     help="run just this step (earlier ones must have run)")
    run.add_argument("--force", action="store_true", help="rerun every step, cached or not")
    run.add_argument("--serve-after", action="store_true",
                     help="keep serving the model in the foreground afterwards, printing curl and Python calls")
    run.add_argument("--input", nargs="+", metavar="PATH",
                     help="the data's input files (overrides [data] input); without --config, your own data: "
                          "the workdir is runs/<file stem> and the model is named after the file")
    run.add_argument("--label", metavar="COLUMN", help="the column to predict (overrides [data] label; needed "
                     "with --input and no --config)")
    run.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE",
                     help="override one config key, e.g. --set train.learning_rate=0.003 (repeatable)")
    run.set_defaults(handler=cmd_run)


def _add_show(sub, common: argparse.ArgumentParser) -> None:
    show = sub.add_parser(
        "show", parents=[common],
        help="what a run's workdir holds: each step's state, fingerprint, inputs and outputs, and the lineage",
        description="Prints manifest.json of a tfpipe run workdir: per step its status, when it ran, its "
                    "fingerprint, inputs and outputs; then which data made the model version being served.",
    )
    show.add_argument("--workdir", metavar="DIR", help="the run's workdir (default: as tfpipe run picks it)")
    show.add_argument("--input", nargs="+", metavar="PATH", help="the input files a run without --config was given "
                      "(its workdir is runs/<file stem>)")
    show.add_argument("--json", action="store_true", help="print manifest.json itself")
    show.set_defaults(handler=cmd_show)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USER_ERROR
    if extra and not getattr(args, "accepts_extra", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if not args.debug:
        # TensorFlow's C++ log (including a harmless cuInit error on machines without a GPU);
        # real failures still reach the user as exceptions.
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    logging.basicConfig(level=logging.INFO if args.debug else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if not args.debug:
        # Errors inside the pipeline reach the user through the one-line message below.
        logging.getLogger("apache_beam").setLevel(logging.CRITICAL)
        # Beam's GCP module warns on import that optional cloud clients are absent.
        logging.getLogger().addFilter(lambda r: "apitools not found" not in str(r.msg))
    # SIGTERM cleans up like Ctrl-C: temporary outputs are removed, nothing half-written stays.
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        return args.handler(args, extra)
    except UserError as e:
        if args.debug:
            traceback.print_exc()
        print(f"tfpipe {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print(f"tfpipe {args.command}: interrupted; no output was published", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader of our output went away (`tfpipe history ... | head`): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:  # a bug, not a user error: say so, keep the traceback for --debug
        if _interrupted.is_set():
            print(f"tfpipe {args.command}: interrupted; no output was published", file=sys.stderr)
            return EXIT_INTERRUPTED
        if args.debug:
            raise
        print(f"tfpipe {args.command}: internal error: {type(e).__name__}: {e} "
              "(rerun with --debug for the traceback)", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
