"""`tfpipe serve`'s flags: all 48 of tensorflow_model_server's, plus a few of tfpipe's.

A command line written for tensorflow_model_server works with the program name replaced
by `tfpipe serve`; both `--flag=value` and `--flag value` are accepted, and boolean flags
take `--flag`, `--flag=true` or `--flag=false` as TF Serving's do. Defaults are TF
Serving's (tensorflow_serving/model_servers/server.h). A flag that only concerns TF
Serving's own internals is accepted, and the server says in one line that it ignores it
and why (`Flag.ignored`); the rest are honoured.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field, make_dataclass
from typing import Any

from tfpipe.machine import cores

CPUS = cores()  # the cores this process may use (affinity, cgroup quota)


def _bool(text: str) -> bool:
    t = str(text).lower()
    if t in ("1", "true", "yes"):
        return True
    if t in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _share(text: str) -> float:
    """A share of requests, 0 to 1 (--shadow)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a share of requests from 0 to 1, got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a share of requests from 0 to 1 (0: off, 1: every request), "
                                         f"got {text}")
    return value


@dataclass(frozen=True)
class Flag:
    """One flag: the parser's argument, ServeOptions' field and its --help line are all made
    from this (the tables below), so a default is written once."""
    name: str
    kind: Any  # int, float, str or _bool
    default: Any
    help: str
    ignored: str = ""  # why this server accepts the flag but does nothing with it
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    aliases: tuple[str, ...] = ()
    switch: bool = False  # tfpipe's on/off flags: present is on (TF Serving's booleans take a value)
    shown_default: str | None = None  # the default as --help says it, where repr() reads badly


_TFLITE = ("TF Serving's experimental TFLite runtime; tfpipe serve runs every version's SavedModel with "
           "TensorFlow (tfpipe export measures the TFLite variants)")

# In tensorflow_model_server's order (model_servers/main.cc).
TF_SERVING_FLAGS: list[Flag] = [
    Flag("port", int, 8500, "gRPC port (PredictionService, ModelService); 0 disables TCP gRPC (then "
         "--grpc_socket_path is needed). Negative: pick a free port (tfpipe's, for tests)."),
    Flag("grpc_socket_path", str, "", "Also serve gRPC on this Unix domain socket (relative or absolute path)."),
    Flag("rest_api_port", int, 0, "REST port; 0 disables the REST API. Must differ from --port."),
    Flag("rest_api_num_threads", int, 4 * CPUS, "Threads that run REST requests' model calls."),
    Flag("rest_api_timeout_in_ms", int, 30000, "REST request timeout; 504 past it."),
    Flag("rest_api_enable_cors_support", _bool, False, "Add CORS headers (Access-Control-Allow-*) to REST answers."),
    Flag("enable_batching", _bool, False, "Merge concurrent requests into batches (see --batching_parameters_file)."),
    Flag("allow_version_labels_for_unavailable_models", _bool, False,
         "Let a config assign a new version label to a version that is not AVAILABLE yet."),
    Flag("batching_parameters_file", str, "", "BatchingParameters text proto (needs --enable_batching)."),
    Flag("enable_per_model_batching_parameters", _bool, False,
         "With --enable_batching: a version's batching_params.pbtxt (in its SavedModel directory) replaces "
         "--batching_parameters_file for that version."),
    Flag("model_config_file", str, "", "ModelServerConfig text proto: several models, version policies, labels "
         "(--model_name and --model_base_path are then ignored)."),
    Flag("model_config_file_poll_wait_seconds", int, 0, "Re-read --model_config_file this often; 0: read once."),
    Flag("model_name", str, "default", "Name of the model when --model_base_path is used."),
    Flag("model_base_path", str, "", "Directory holding numbered version subdirectories (BASE/VERSION/)."),
    Flag("num_load_threads", int, 0, "Threads that load versions; 0 loads them one after another."),
    Flag("num_unload_threads", int, 0, "Threads that unload versions; 0 unloads them one after another."),
    Flag("max_num_load_retries", int, 5, "Retries of a version whose load failed, before it is reported as failed "
         "(END with its error); meanwhile its status is LOADING with the last attempt's error."),
    Flag("load_retry_interval_micros", int, 60_000_000, "Wait between load retries; negative: no wait."),
    Flag("file_system_poll_wait_seconds", int, 1, "Poll base paths for new versions this often; 0: once; "
         "negative: never (no model loads)."),
    Flag("flush_filesystem_caches", _bool, True, "Flush file-system caches after loads.",
         ignored="tfpipe serve keeps no file-system cache, and TensorFlow's Python API has no call that flushes "
                 "its own"),
    Flag("tensorflow_session_parallelism", int, 0, "Threads for both TensorFlow pools; 0: TensorFlow's choice."),
    Flag("tensorflow_session_config_file", str, "", "TensorFlow ConfigProto text proto: thread pools, GPU memory, "
         "XLA and graph rewrites are applied to TensorFlow's runtime."),
    Flag("tensorflow_intra_op_parallelism", int, 0, "TensorFlow intra-op threads; 0: TensorFlow's choice."),
    Flag("tensorflow_inter_op_parallelism", int, 0, "TensorFlow inter-op threads; 0: TensorFlow's choice."),
    Flag("use_alts_credentials", _bool, False, "Secure gRPC with Google ALTS (Google Cloud VMs only)."),
    Flag("ssl_config_file", str, "", "SSLConfig text proto: TLS for gRPC, client certificates with client_verify."),
    Flag("platform_config_file", str, "", "PlatformConfigMap text proto; its tensorflow SessionBundleConfig "
         "replaces the batching, session and warmup flags."),
    Flag("per_process_gpu_memory_fraction", float, 0.0, "Share of each GPU's memory TensorFlow may take; 0: grow "
         "as needed."),
    Flag("saved_model_tags", str, "serve", "Comma-separated tags of the MetaGraphDef to load."),
    Flag("grpc_channel_arguments", str, "", "Comma-separated gRPC server channel arguments, e.g. "
         "grpc.max_connection_age_ms=2000 (integers are passed as integers)."),
    Flag("grpc_max_threads", int, 4 * CPUS, "Threads that answer gRPC calls."),
    Flag("enable_model_warmup", _bool, True, "Replay assets.extra/tf_serving_warmup_requests before serving a version."),
    Flag("num_request_iterations_for_warmup", int, 0, "Replay each warmup record this many times; 0: once."),
    Flag("version", _bool, False, "Print the version and exit."),
    Flag("monitoring_config_file", str, "", "MonitoringConfig text proto; enables Prometheus metrics on the REST port."),
    Flag("remove_unused_fields_from_bundle_metagraph", _bool, True, "Drop unused MetaGraphDef fields after loading.",
         ignored="tfpipe serve keeps only a loaded meta graph's signature defs, so the other fields are never kept"),
    Flag("prefer_tflite_model", _bool, False, "Run model.tflite instead of the SavedModel.", ignored=_TFLITE),
    Flag("num_tflite_pools", int, CPUS, "TFLite interpreter pools.", ignored=_TFLITE),
    Flag("num_tflite_interpreters_per_pool", int, 1, "TFLite interpreters per pool.", ignored=_TFLITE),
    Flag("enable_signature_method_name_check", _bool, False,
         "Classify/Regress accept only signatures whose method is classify/regress (off: any signature of the "
         "right shape, as native TF2 models need)."),
    Flag("xla_cpu_compilation_enabled", _bool, False, "Allow the XLA JIT on CPU.",
         ignored="TensorFlow's Python runtime always allows XLA for functions compiled with jit_compile=True and "
                 "has no switch that forbids it"),
    Flag("xla_gpu_compilation_enabled", _bool, False, "Allow the XLA JIT on CPU and GPU.",
         ignored="TensorFlow's Python runtime always allows XLA for functions compiled with jit_compile=True and "
                 "has no switch that forbids it"),
    Flag("enable_profiler", _bool, True, "Register TensorFlow's profiler gRPC service.",
         ignored="the profiler service is TF Serving's C++ gRPC service; TensorFlow's Python profiler server "
                 "(tf.profiler.experimental.server.start) can run in a process of its own"),
    Flag("thread_pool_factory_config_file", str, "", "ThreadPoolConfig text proto for per-request thread pools.",
         ignored="TF Serving's C++ thread-pool factory registry; model calls here run on TensorFlow's own "
                 "pools (--tensorflow_*_parallelism)"),
    Flag("mixed_precision", str, "", "'bfloat16': run float32 models with bfloat16 auto mixed precision."),
    Flag("skip_initialize_tpu", _bool, False, "Skip TPU system initialisation.",
         ignored="TPU initialisation; this server runs on CPU and GPU"),
    Flag("enable_grpc_healthcheck_service", _bool, False,
         "Serve the standard grpc.health.v1.Health service: \"\", ModelService and PredictionService SERVING "
         "until a drain; with --workers N, \"\" only while every worker is ready, tfpipe.worker.<i> each one."),
    Flag("enable_serialization_as_tensor_content", _bool, False,
         "Predict responses carry tensor_content bytes instead of typed value fields."),
]
FLAGS_BY_NAME = {f.name: f for f in TF_SERVING_FLAGS}
BOOL_FLAGS = {f.name for f in TF_SERVING_FLAGS if f.kind is _bool}


# tfpipe's own, after TF Serving's.
TFPIPE_FLAGS: list[Flag] = [
    Flag("backend", str, "embedded", "embedded: tfpipe's TF-Serving-compatible server; tfserving: run "
         "tensorflow_model_server from PATH; docker: run the tensorflow/serving image",
         choices=("embedded", "tfserving", "docker")),
    Flag("host", str, "0.0.0.0", "Address the embedded server binds", metavar="ADDRESS"),
    Flag("max_request_bytes", int, 64 * 1024 * 1024, "Largest request accepted: a REST body (413 over it, before "
         "any of the body is read when Content-Length says so) and a gRPC message once decompressed "
         "(RESOURCE_EXHAUSTED; TF Serving's limit is 2 GiB)", metavar="BYTES", shown_default="64 MiB"),
    Flag("grpc_max_calls_in_flight", int, 10_000, "gRPC: a call that comes while N are being answered is "
         "RESOURCE_EXHAUSTED at once (a client retries it later), rather than queued in grpc core until core "
         "cancels a burst of them; the health service is not counted. 0: no bound (grpc core's own queue "
         "bounds then apply)", metavar="N", shown_default="10000"),
    Flag("grpc_max_concurrent_streams", int, 32, "gRPC: the calls one connection may have open at once "
         "(HTTP/2's MAX_CONCURRENT_STREAMS); a client queues the rest itself, so that the calls another connection "
         "sends are not read behind thousands of this one's; 0: no bound (grpc core's default, as TF Serving)",
         metavar="N"),
    Flag("large_requests_at_once", int, 0, "Large requests (a REST body or a gRPC Predict over 64 KiB, or one "
         "declaring as many elements) answered at once per process; the others wait their turn, in the order they "
         "came, without holding a thread. 0: half the cores, at least one", metavar="N",
         shown_default="half the cores"),
    Flag("max_concurrent_model_calls", int, 0, "Unbatched model calls each transport runs at once; the others "
         "wait, taken in turns by connection. 0: four per core", metavar="N", shown_default="four per core"),
    Flag("max_call_rows", int, 1024, "With batching off: a request of more rows runs as successive model calls of "
         "at most N rows each, and other requests' calls run between them, so that one large request (or a small "
         "one that TensorFlow's fill-out makes large) cannot hold the model while the others wait; the answer is "
         "the same (rows are answered independently, as batching assumes; a signature whose outputs are not one "
         "row per input row is called whole). With batching on, the batching parameters bound a call. 0: no "
         "limit", metavar="N"),
    Flag("model_config_reload", _bool, True, "Answer ModelService.HandleReloadConfigRequest, which replaces the "
         "served models (an empty list unloads them all) for anyone who can reach the gRPC port, as TF Serving "
         "does; false: PERMISSION_DENIED, and the models change only through --model_config_file and its poll"),
    Flag("rest_read_timeout_seconds", float, 30.0, "REST: a connection that has not sent a whole request line and "
         "headers within S seconds (of opening, or of its previous answer, so idle connections too), or then its "
         "whole body within S more, is closed; 0: no such limit", metavar="S", shown_default="30"),
    Flag("drain_seconds", float, 30.0, "On SIGTERM or Ctrl-C: stop accepting, and answer every request already "
         "received (REST bodies still coming in, gRPC calls queued) for up to this long; what is still open then is "
         "cut off, and one log line counts it", metavar="S", shown_default="30"),
    Flag("workers", int, 0, "Embedded server: N processes serving the same ports (SO_REUSEPORT), each with its own "
         "copy of the models and a share of TensorFlow's threads, so that requests use N cores; Prometheus shows "
         "their totals. 0: one per core, but one process with --enable_batching (batches fill per process: "
         "tfpipe tune finds N with the batch size split) or --grpc_socket_path (a Unix socket is not shared). A "
         "worker that exits is started again; one that exits 4 times in a row without serving 60 s is given up on "
         "(the others serve on; the server exits when none is left)", metavar="N"),
    Flag("gpu", _bool, False, "docker/k8s: the GPU image (tensorflow/serving:latest-gpu)", switch=True),
    Flag("docker_image", str, "", "docker/k8s: image to run (default tensorflow/serving:latest[-gpu])",
         metavar="IMAGE", shown_default=""),
    Flag("config_dir", str, "serve-config",
         "tfserving/docker: where models.config, batching.config, monitoring.config are written", metavar="DIR"),
    Flag("emit_k8s", str, "", "Write Kubernetes manifests (Deployment, Service, HPA) for TF Serving to DIR and exit",
         metavar="DIR", aliases=("--emit-k8s",), shown_default=""),
    Flag("dry_run", _bool, False, "tfserving/docker: write the configs and print the command instead of running it",
         switch=True),
]

REQUEST_LOG_HELP = (
    "A model's logging_config in --model_config_file, e.g.\n"
    "  logging_config { log_collector_config { type: \"tfrecord\" filename_prefix: \"/logs/m\" }\n"
    "                   sampling_config { sampling_rate: 0.1 } }\n"
    "writes sampled requests of every API as tensorflow.serving.PredictionLog records to rotated\n"
    "TFRecord files. These flags do the same for models without one, and bound what a log may hold.")
REQUEST_LOG_FLAGS: list[Flag] = [
    Flag("request_log_prefix", str, "", "Log requests of every model without its own logging_config to "
         "PREFIX-*.tfrecord (a local path or any TensorFlow filesystem)", metavar="PREFIX", shown_default=""),
    Flag("request_log_sampling_rate", float, 1.0, "With --request_log_prefix: the share of requests logged, 0 to 1",
         metavar="RATE"),
    Flag("request_log_queue_size", int, 10_000, "Records waiting for the writer; past that, records are dropped "
         "(and counted), never the request", metavar="N", shown_default="10000"),
    Flag("request_log_max_file_bytes", int, 64 * 1024 * 1024, "Start a new log file before one passes this size; "
         "only a single larger record makes one larger", metavar="BYTES", shown_default="64 MiB"),
    Flag("request_log_max_file_seconds", float, 3600.0, "Start a new log file once one is this old", metavar="S",
         shown_default="3600"),
    # A log left on must not fill the disk: 16 files of the default 64 MiB are 1 GiB per prefix and process.
    Flag("request_log_max_files", int, 16, "Each server process keeps the newest N of the files it wrote per "
         "prefix, deleting older ones: N x --request_log_max_file_bytes bounds the disk a prefix's log takes per "
         "worker process. Files of earlier runs are left alone. 0 keeps every file", metavar="N",
         shown_default="16: 1 GiB with the default file size"),
]

SHADOW_HELP = (
    "Mirror a share of live requests to each model's newest candidate (BASE/NAME/candidates/N, as\n"
    "tfpipe export keeps them) and record how it would have answered: clients get only the served\n"
    "version's answers. `tfpipe shadow DIR` prints what --shadow_report_dir collected.")
SHADOW_FLAGS: list[Flag] = [
    Flag("shadow", _share, 0.0, "Embedded server: for every model whose base path has a candidates/ folder, mirror "
         "this share (0 to 1, drawn per request) of the Predict, Classify and Regress requests that name no version "
         "or label to its newest candidate (when newer than the versions served), loaded and warmed up beside the "
         "served version and followed at each base-path poll. The candidate runs after the served answer, on a "
         "thread of its own, at most 2 calls in flight (more are skipped and counted); its answers, errors and "
         "latency are compared with the served ones (Prometheus tfpipe_serving_shadow_*, --shadow_report_dir)",
         metavar="SHARE", shown_default="0: off"),
    Flag("shadow_slice", str, "", "With --shadow: also break the agreement down per value of this input (a string or "
         "int input of the signature, one value per row; for Classify and Regress, a feature of the tf.Examples)",
         metavar="COLUMN", shown_default=""),
    Flag("shadow_report_dir", str, "", "With --shadow: each server process writes DIR/shadow-MODEL-PID.json at every "
         "base-path poll and at its stop; `tfpipe shadow DIR` merges and prints them. Default: metrics only",
         metavar="DIR", shown_default=""),
]

CANARY_HELP = (
    "Answer a share of the requests that name no version or label with each model's newest\n"
    "candidate (the one --shadow would mirror to); promote it (tfpipe promote's move) once it has\n"
    "answered --canary_requests within the bounds below, roll it back at once when it does not.\n"
    "A request the candidate fails, or answers with NaN or infinity, is answered by the served\n"
    "version: clients are answered all along.")
CANARY_FLAGS: list[Flag] = [
    Flag("canary", _share, 0.0, "Embedded server: the share (0 to 1) of the Predict, Classify and Regress requests "
         "that name no version or label answered by the model's newest candidate (BASE/NAME/candidates/N, newer than "
         "the versions served, not rolled back before), drawn per request, or per client with --canary_key",
         metavar="SHARE", shown_default="0: off"),
    Flag("canary_key", str, "x-canary-key", "With --canary: the request header (REST) or metadata key (gRPC) that names "
         "a client; requests with the same value all go to the candidate or all to the served version (sticky), "
         "requests without it are drawn one by one", metavar="NAME"),
    Flag("canary_requests", int, 1000, "With --canary: promote the candidate once it has answered this many requests "
         "(in this server process) within the bounds", metavar="N"),
    Flag("canary_min_seconds", float, 0.0, "With --canary: and once its canary has run this long", metavar="SECONDS"),
    Flag("canary_max_p99_rise", float, 0.5, "With --canary: roll back when the candidate's model-call p99 exceeds the "
         "served version's (over the same time) by more than this share", metavar="SHARE"),
    Flag("canary_max_disagreement", float, 0.1, "With --canary: roll back when the candidate's answers differ from "
         "the served version's on the same requests (the served version answers them too, off the request's path) "
         "beyond this: the share of rows whose class flips, or for models without class outputs the median "
         "relative difference", metavar="SHARE"),
]

ALL_FLAGS = TF_SERVING_FLAGS + TFPIPE_FLAGS + REQUEST_LOG_FLAGS + SHADOW_FLAGS + CANARY_FLAGS
_TYPES = {int: int, float: float, str: str, _bool: bool, _share: float}


def _tags(self) -> list[str]:
    return [t for t in self.saved_model_tags.split(",") if t] or ["serve"]


def flag_arg(name: str, value: Any) -> list[str]:
    """One flag as a command line gives it, from its row of the tables: `--name=value`; a TF
    Serving boolean as true|false (tensorflow_model_server's own parser takes only those); a tfpipe
    switch present when on, absent when off."""
    f = ALL_FLAGS_BY_NAME[name]
    if f.switch:
        return [f"--{name}"] if value else []
    if f.kind is _bool:
        return [f"--{name}={'true' if value else 'false'}"]
    return [f"--{name}={value}"]


def _to_argv(self, names: Any = None) -> list[str]:
    """These options as `tfpipe serve`'s command line: the flags `names`, in that order (default:
    every one whose value is not the table's default, which the parser gives back to the others)."""
    if names is None:
        names = [f.name for f in ALL_FLAGS if getattr(self, f.name) != f.default]
    return [arg for name in names for arg in flag_arg(name, getattr(self, name))]


def _to_json(self) -> str:
    """These options whole, with which flags the command line named: what a worker process is given."""
    values = {f.name: getattr(self, f.name) for f in ALL_FLAGS}
    return json.dumps({**values, "given": sorted(self.given)})


def _from_json(text: str):
    values = json.loads(text)
    return ServeOptions(**{**values, "given": frozenset(values.get("given", ()))})


# Every flag's value, by its name, with the tables' defaults; `given`: which TF Serving flags the
# command line named (the ignored-flag notes name only those). Made from the tables, so the
# options, the parser and --help cannot disagree on a default.
ServeOptions = make_dataclass(
    "ServeOptions",
    [(f.name, _TYPES[f.kind], field(default=f.default)) for f in ALL_FLAGS]
    + [("given", frozenset, field(default_factory=frozenset))],
    namespace={"tags": _tags, "to_argv": _to_argv, "to_json": _to_json, "from_json": staticmethod(_from_json),
               "__module__": __name__,
               "__doc__": "`tfpipe serve`'s options: tensorflow_model_server's flags, then tfpipe's; "
                          "`to_argv()` and `to_json()` write them from the tables, `from_json()` reads them back."})
ALL_FLAGS_BY_NAME = {f.name: f for f in ALL_FLAGS}


class _Given(argparse.Action):
    """Stores the value and remembers that the flag was on the command line."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, self.const if values is None else values)
        given = set(getattr(namespace, "_given", ()) or ())
        given.add(self.dest)
        namespace._given = given


def _help(f: Flag, tf_serving: bool) -> str:
    """The flag's --help text with its default: TF Serving's as main.cc's help prints them."""
    if f.shown_default is not None:
        shown = f.shown_default
    elif f.kind is _bool:
        shown = "" if f.switch else str(f.default).lower()
    else:
        shown = repr(f.default) if tf_serving else str(f.default)
    text = f.help.rstrip(".") + (f" (default {shown})" if shown != "" else "")
    if f.ignored:
        text += f". Accepted, ignored: {f.ignored}."
    return text.replace("%", "%%")


def _add(group, f: Flag, tf_serving: bool = False) -> None:
    names = [f"--{f.name}", *f.aliases]
    if f.switch:
        group.add_argument(*names, dest=f.name, action="store_true", help=_help(f, tf_serving))
    elif f.kind is _bool:
        group.add_argument(*names, dest=f.name, type=_bool, nargs="?", const=True, default=f.default,
                           action=_Given, metavar="true|false", help=_help(f, tf_serving))
    else:
        group.add_argument(*names, dest=f.name, type=f.kind, default=f.default, action=_Given, choices=f.choices,
                           metavar=f.metavar or (None if f.choices else f.kind.__name__.upper()),
                           help=_help(f, tf_serving))


def add_serve_flags(parser: argparse.ArgumentParser) -> None:
    tf = parser.add_argument_group(
        f"tensorflow_model_server flags (all {len(TF_SERVING_FLAGS)}; TF Serving's defaults)")
    for f in TF_SERVING_FLAGS:
        _add(tf, f, tf_serving=True)
    own = parser.add_argument_group("tfpipe flags")
    for f in TFPIPE_FLAGS:
        _add(own, f)
    logs = parser.add_argument_group("request logging (embedded server)", REQUEST_LOG_HELP)
    for f in REQUEST_LOG_FLAGS:
        _add(logs, f)
    shadow = parser.add_argument_group("shadow traffic (embedded server)", SHADOW_HELP)
    for f in SHADOW_FLAGS:
        _add(shadow, f)
    canary = parser.add_argument_group("canary (embedded server)", CANARY_HELP)
    for f in CANARY_FLAGS:
        _add(canary, f)


def options_from_args(args: argparse.Namespace) -> ServeOptions:
    values = {k: getattr(args, k) for k in ServeOptions.__dataclass_fields__ if k != "given"}
    return ServeOptions(**values, given=frozenset(getattr(args, "_given", ()) or ()))


def ignored_flag_notes(opts: ServeOptions) -> list[str]:
    """One line per TF Serving flag on the command line that this server does not act on."""
    return [f"--{f.name} is accepted and ignored: {f.ignored}" for f in TF_SERVING_FLAGS
            if f.ignored and f.name in opts.given]


def version_text() -> str:
    """What `--version` prints, as tensorflow_model_server words it; TensorFlow's version is read
    from its installed metadata, so the answer comes without importing it."""
    from importlib.metadata import PackageNotFoundError, version

    from tfpipe import __version__

    try:
        library = version("tensorflow")
    except PackageNotFoundError:  # a build installed under another distribution name
        import tensorflow as tf

        library = tf.__version__
    return f"TensorFlow ModelServer: tfpipe {__version__} (embedded)\nTensorFlow Library: {library}"
