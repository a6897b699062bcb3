"""`tfpipe serve`'s flags: tensorflow_model_server's own, plus a few of tfpipe's.

A command line written for tensorflow_model_server works with the program name replaced
by `tfpipe serve`; both `--flag=value` and `--flag value` are accepted, and boolean flags
take `--flag`, `--flag=true` or `--flag=false` as TF Serving's do.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

CPUS = os.cpu_count() or 1


def _bool(text: str) -> bool:
    t = str(text).lower()
    if t in ("1", "true", "yes"):
        return True
    if t in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


# name, type, default, help: tensorflow_model_server's flags that tfpipe serve honours.
TF_SERVING_FLAGS = [
    ("port", int, 8500, "gRPC port (PredictionService, ModelService)."),
    ("rest_api_port", int, 0, "REST port; 0 (the default, as in TF Serving) disables the REST API."),
    ("rest_api_num_threads", int, 4 * CPUS, "Threads that run REST requests' model calls."),
    ("rest_api_timeout_in_ms", int, 30000, "REST request timeout; 504 past it."),
    ("grpc_max_threads", int, 4 * CPUS, "Threads that run gRPC requests' model calls."),
    ("model_name", str, "default", "Name of the model when --model_base_path is used."),
    ("model_base_path", str, "", "Directory holding numbered version subdirectories (BASE/VERSION/)."),
    ("model_config_file", str, "", "ModelServerConfig text proto: several models, version policies, labels."),
    ("model_config_file_poll_wait_seconds", int, 0, "Re-read --model_config_file this often; 0: read once."),
    ("file_system_poll_wait_seconds", int, 1, "Poll base paths for new versions this often; 0: once."),
    ("enable_batching", _bool, False, "Merge concurrent requests into batches (see --batching_parameters_file)."),
    ("batching_parameters_file", str, "", "BatchingParameters text proto."),
    ("monitoring_config_file", str, "", "MonitoringConfig text proto; enables Prometheus metrics."),
    ("enable_model_warmup", _bool, True, "Replay assets.extra/tf_serving_warmup_requests before serving a version."),
    ("tensorflow_intra_op_parallelism", int, 0, "TensorFlow intra-op threads; 0: TensorFlow's choice."),
    ("tensorflow_inter_op_parallelism", int, 0, "TensorFlow inter-op threads; 0: TensorFlow's choice."),
]
BOOL_FLAGS = {n for n, t, _, _ in TF_SERVING_FLAGS if t is _bool}


@dataclass
class ServeOptions:
    port: int = 8500
    rest_api_port: int = 0
    rest_api_num_threads: int = 4 * CPUS
    rest_api_timeout_in_ms: int = 30000
    grpc_max_threads: int = 4 * CPUS
    model_name: str = "default"
    model_base_path: str = ""
    model_config_file: str = ""
    model_config_file_poll_wait_seconds: int = 0
    file_system_poll_wait_seconds: int = 1
    enable_batching: bool = False
    batching_parameters_file: str = ""
    monitoring_config_file: str = ""
    enable_model_warmup: bool = True
    tensorflow_intra_op_parallelism: int = 0
    tensorflow_inter_op_parallelism: int = 0
    # tfpipe's own
    backend: str = "embedded"
    host: str = "0.0.0.0"
    max_request_bytes: int = 64 * 1024 * 1024
    drain_seconds: float = 30.0
    gpu: bool = False
    docker_image: str = ""
    config_dir: str = "serve-config"
    emit_k8s: str = ""
    dry_run: bool = False


def add_serve_flags(parser: argparse.ArgumentParser) -> None:
    tf = parser.add_argument_group("tensorflow_model_server flags")
    for name, kind, default, text in TF_SERVING_FLAGS:
        if kind is _bool:
            tf.add_argument(f"--{name}", type=_bool, nargs="?", const=True, default=default,
                            help=f"{text} (default {str(default).lower()})")
        else:
            tf.add_argument(f"--{name}", type=kind, default=default, help=f"{text} (default {default!r})")
    own = parser.add_argument_group("tfpipe flags")
    own.add_argument("--backend", choices=["embedded", "tfserving", "docker"], default="embedded",
                     help="embedded: tfpipe's TF-Serving-compatible server (default); tfserving: run "
                          "tensorflow_model_server from PATH; docker: run the tensorflow/serving image")
    own.add_argument("--host", default="0.0.0.0", help="Address the embedded server binds (default 0.0.0.0)")
    own.add_argument("--max_request_bytes", type=int, default=64 * 1024 * 1024,
                     help="Largest REST body accepted; 413 over it (default 64 MiB)")
    own.add_argument("--drain_seconds", type=float, default=30.0,
                     help="On SIGTERM, wait this long for in-flight requests (default 30)")
    own.add_argument("--gpu", action="store_true", help="docker/k8s: the GPU image (tensorflow/serving:latest-gpu)")
    own.add_argument("--docker_image", default="", help="docker/k8s: image to run (default tensorflow/serving:latest[-gpu])")
    own.add_argument("--config_dir", default="serve-config",
                     help="tfserving/docker: where models.config, batching.config, monitoring.config are written")
    own.add_argument("--emit-k8s", "--emit_k8s", dest="emit_k8s", default="", metavar="DIR",
                     help="Write Kubernetes manifests (Deployment, Service, HPA) for TF Serving to DIR and exit")
    own.add_argument("--dry_run", action="store_true",
                     help="tfserving/docker: write the configs and print the command instead of running it")


def options_from_args(args: argparse.Namespace) -> ServeOptions:
    return ServeOptions(**{k: getattr(args, k) for k in ServeOptions.__dataclass_fields__})
