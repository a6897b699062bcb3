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
import os
from dataclasses import dataclass, field
from typing import Any

CPUS = os.cpu_count() or 1


def _bool(text: str) -> bool:
    t = str(text).lower()
    if t in ("1", "true", "yes"):
        return True
    if t in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


@dataclass(frozen=True)
class Flag:
    name: str
    kind: Any  # int, float, str or _bool
    default: Any
    help: str
    ignored: str = ""  # why this server accepts the flag but does nothing with it


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
    Flag("max_num_load_retries", int, 5, "Retries of a version whose load failed, before it is reported as failed."),
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


@dataclass
class ServeOptions:
    # tensorflow_model_server's (defaults as in TF Serving)
    port: int = 8500
    grpc_socket_path: str = ""
    rest_api_port: int = 0
    rest_api_num_threads: int = 4 * CPUS
    rest_api_timeout_in_ms: int = 30000
    rest_api_enable_cors_support: bool = False
    enable_batching: bool = False
    allow_version_labels_for_unavailable_models: bool = False
    batching_parameters_file: str = ""
    enable_per_model_batching_parameters: bool = False
    model_config_file: str = ""
    model_config_file_poll_wait_seconds: int = 0
    model_name: str = "default"
    model_base_path: str = ""
    num_load_threads: int = 0
    num_unload_threads: int = 0
    max_num_load_retries: int = 5
    load_retry_interval_micros: int = 60_000_000
    file_system_poll_wait_seconds: int = 1
    flush_filesystem_caches: bool = True
    tensorflow_session_parallelism: int = 0
    tensorflow_session_config_file: str = ""
    tensorflow_intra_op_parallelism: int = 0
    tensorflow_inter_op_parallelism: int = 0
    use_alts_credentials: bool = False
    ssl_config_file: str = ""
    platform_config_file: str = ""
    per_process_gpu_memory_fraction: float = 0.0
    saved_model_tags: str = "serve"
    grpc_channel_arguments: str = ""
    grpc_max_threads: int = 4 * CPUS
    enable_model_warmup: bool = True
    num_request_iterations_for_warmup: int = 0
    version: bool = False
    monitoring_config_file: str = ""
    remove_unused_fields_from_bundle_metagraph: bool = True
    prefer_tflite_model: bool = False
    num_tflite_pools: int = CPUS
    num_tflite_interpreters_per_pool: int = 1
    enable_signature_method_name_check: bool = False
    xla_cpu_compilation_enabled: bool = False
    xla_gpu_compilation_enabled: bool = False
    enable_profiler: bool = True
    thread_pool_factory_config_file: str = ""
    mixed_precision: str = ""
    skip_initialize_tpu: bool = False
    enable_grpc_healthcheck_service: bool = False
    enable_serialization_as_tensor_content: bool = False
    # tfpipe's own
    backend: str = "embedded"
    host: str = "0.0.0.0"
    max_request_bytes: int = 64 * 1024 * 1024
    rest_read_timeout_seconds: float = 30.0
    drain_seconds: float = 30.0
    workers: int = 1  # the command line's default, 0, means auto (tfpipe.serve.workers.worker_count)
    gpu: bool = False
    docker_image: str = ""
    config_dir: str = "serve-config"
    emit_k8s: str = ""
    dry_run: bool = False
    request_log_prefix: str = ""
    request_log_sampling_rate: float = 1.0
    request_log_queue_size: int = 10_000
    request_log_max_file_bytes: int = 64 * 1024 * 1024
    request_log_max_file_seconds: float = 3600.0
    request_log_max_files: int = 0
    # which TF Serving flags the command line named (the ignored-flag notes name only those)
    given: frozenset[str] = field(default_factory=frozenset)

    def tags(self) -> list[str]:
        return [t for t in self.saved_model_tags.split(",") if t] or ["serve"]


class _Given(argparse.Action):
    """Stores the value and remembers that the flag was on the command line."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, self.const if values is None else values)
        given = set(getattr(namespace, "_given", ()) or ())
        given.add(self.dest)
        namespace._given = given


def add_serve_flags(parser: argparse.ArgumentParser) -> None:
    tf = parser.add_argument_group(
        f"tensorflow_model_server flags (all {len(TF_SERVING_FLAGS)}; TF Serving's defaults)")
    for f in TF_SERVING_FLAGS:
        text = f"{f.help.rstrip('.')} (default {str(f.default).lower() if f.kind is _bool else repr(f.default)})"
        if f.ignored:
            text += f". Accepted, ignored: {f.ignored}."
        text = text.replace("%", "%%")
        if f.kind is _bool:
            tf.add_argument(f"--{f.name}", type=_bool, nargs="?", const=True, default=f.default,
                            action=_Given, metavar="true|false", help=text)
        else:
            tf.add_argument(f"--{f.name}", type=f.kind, default=f.default, action=_Given, metavar=f.kind.__name__.upper(),
                            help=text)
    own = parser.add_argument_group("tfpipe flags")
    own.add_argument("--backend", choices=["embedded", "tfserving", "docker"], default="embedded",
                     help="embedded: tfpipe's TF-Serving-compatible server (default); tfserving: run "
                          "tensorflow_model_server from PATH; docker: run the tensorflow/serving image")
    own.add_argument("--host", default="0.0.0.0", help="Address the embedded server binds (default 0.0.0.0)")
    own.add_argument("--max_request_bytes", type=int, default=64 * 1024 * 1024,
                     help="Largest REST body accepted; 413 over it, before any of the body is read when "
                          "Content-Length says so (default 64 MiB)")
    own.add_argument("--rest_read_timeout_seconds", type=float, default=30.0, metavar="S",
                     help="REST: a connection that has not sent a whole request line and headers within S seconds "
                          "(of opening, or of its previous answer, so idle connections too), or then its whole body "
                          "within S more, is closed; 0: no such limit (default 30)")
    own.add_argument("--drain_seconds", type=float, default=30.0, metavar="S",
                     help="On SIGTERM or Ctrl-C: stop accepting, and answer every request already received (REST "
                          "bodies still coming in, gRPC calls queued) for up to this long; what is still open then "
                          "is cut off, and one log line counts it (default 30)")
    own.add_argument("--workers", type=int, default=0, metavar="N",
                     help="Embedded server: N processes serving the same ports (SO_REUSEPORT), each with its own "
                          "copy of the models and a share of TensorFlow's threads, so that requests use N cores; "
                          "Prometheus shows their totals. Default: one per core, but one process with "
                          "--enable_batching (batches fill per process: tfpipe tune finds N with the batch size "
                          "split) or --grpc_socket_path (a Unix socket is not shared). 1: one process. A worker "
                          "that exits is started again; one that exits 4 times in a row without serving 60 s is "
                          "given up on (the others serve on; the server exits when none is left)")
    own.add_argument("--gpu", action="store_true", help="docker/k8s: the GPU image (tensorflow/serving:latest-gpu)")
    own.add_argument("--docker_image", default="", help="docker/k8s: image to run (default tensorflow/serving:latest[-gpu])")
    own.add_argument("--config_dir", default="serve-config",
                     help="tfserving/docker: where models.config, batching.config, monitoring.config are written")
    own.add_argument("--emit-k8s", "--emit_k8s", dest="emit_k8s", default="", metavar="DIR",
                     help="Write Kubernetes manifests (Deployment, Service, HPA) for TF Serving to DIR and exit")
    own.add_argument("--dry_run", action="store_true",
                     help="tfserving/docker: write the configs and print the command instead of running it")
    logs = parser.add_argument_group(
        "request logging (embedded server)",
        "A model's logging_config in --model_config_file, e.g.\n"
        "  logging_config { log_collector_config { type: \"tfrecord\" filename_prefix: \"/logs/m\" }\n"
        "                   sampling_config { sampling_rate: 0.1 } }\n"
        "writes sampled requests of every API as tensorflow.serving.PredictionLog records to rotated\n"
        "TFRecord files. These flags do the same for models without one, and bound what a log may hold.")
    logs.add_argument("--request_log_prefix", default="", metavar="PREFIX",
                      help="Log requests of every model without its own logging_config to PREFIX-*.tfrecord "
                           "(a local path or any TensorFlow filesystem)")
    logs.add_argument("--request_log_sampling_rate", type=float, default=1.0, metavar="RATE",
                      help="With --request_log_prefix: the share of requests logged, 0 to 1 (default 1.0)")
    logs.add_argument("--request_log_queue_size", type=int, default=10_000, metavar="N",
                      help="Records waiting for the writer; past that, records are dropped (and counted), "
                           "never the request (default 10000)")
    logs.add_argument("--request_log_max_file_bytes", type=int, default=64 * 1024 * 1024, metavar="BYTES",
                      help="Start a new log file before one passes this size (default 64 MiB)")
    logs.add_argument("--request_log_max_file_seconds", type=float, default=3600.0, metavar="S",
                      help="Start a new log file once one is this old (default 3600)")
    logs.add_argument("--request_log_max_files", type=int, default=0, metavar="N",
                      help="Keep at most N files per prefix, deleting the oldest; 0 keeps all (default)")


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
