"""Real TensorFlow Serving: config files, the tensorflow_model_server command line, and the
tensorflow/serving container with the right mounts and ports."""

from __future__ import annotations

import os
import shutil
import subprocess

from tensorflow_serving.config import model_server_config_pb2

from tfpipe import versions
from tfpipe.serve.errors import ServeError
from tfpipe.serve.flags import TF_SERVING_FLAGS, ServeOptions, flag_arg
from tfpipe.serve.tfserving.configs import (
    DEFAULT_METRICS_PATH,
    batching_parameters,
    model_server_config,
    monitoring_config,
    write_text_proto,
)
from tfpipe.serve.tfserving.protos import MonitoringConfig

CONTAINER_MODELS, CONTAINER_CONFIG = "/models", "/config"
GRPC_IN_CONTAINER, REST_IN_CONTAINER = 8500, 8501  # what the image's entrypoint passes


def write_configs(opts: ServeOptions, config_dir: str, base_paths: dict[str, str] | None = None) -> dict[str, str]:
    """models.config, batching.config (with --enable_batching) and monitoring.config (always:
    Prometheus on at the usual path unless a monitoring file says otherwise) in config_dir.
    `base_paths` rewrites each model's base_path (the container sees its own paths)."""
    if opts.shadow > 0:
        raise ServeError(f"--shadow={opts.shadow:g}: tensorflow_model_server has no shadow traffic; it needs "
                         "--backend embedded")
    os.makedirs(config_dir, exist_ok=True)
    config = model_server_config(opts)
    logged = [c.name for c in config.model_config_list.config if c.HasField("logging_config")]
    if logged:
        raise ServeError(f"model(s) {logged} have a logging_config: open-source tensorflow_model_server has no request "
                         "log collector and refuses such a config ('No request-logger-creator provided.'); request "
                         "logging needs --backend embedded")
    canaries = _canaries(config) if opts.canary > 0 else {}
    for c in config.model_config_list.config:
        if base_paths and c.name in base_paths:
            c.base_path = base_paths[c.name]
        if not c.model_platform:
            c.model_platform = "tensorflow"
    for c in list(config.model_config_list.config):
        if c.name in canaries:  # tensorflow_model_server splits no traffic: the candidate is a model of its own
            entry = config.model_config_list.config.add(
                name=versions.candidate_model(c.name), model_platform="tensorflow",
                base_path=f"{c.base_path.rstrip('/')}/{versions.CANDIDATES}")
            entry.model_version_policy.specific.versions.append(canaries[c.name])
    paths = {"models": write_text_proto(os.path.join(config_dir, "models.config"), config)}
    if opts.enable_batching:
        paths["batching"] = write_text_proto(os.path.join(config_dir, "batching.config"), batching_parameters(opts))
    monitoring = monitoring_config(opts)
    if monitoring is None:
        monitoring = MonitoringConfig()
        monitoring.prometheus_config.enable = True
        monitoring.prometheus_config.path = DEFAULT_METRICS_PATH
    paths["monitoring"] = write_text_proto(os.path.join(config_dir, "monitoring.config"), monitoring)
    return paths


def _canaries(config) -> dict[str, int]:
    """--canary with tensorflow_model_server: each model's candidate the embedded server would canary
    (the newest in BASE/NAME/candidates/, newer than the served range, not rolled back by a canary)."""
    out = {}
    for c in config.model_config_list.config:
        rolled_back = versions.canary_rolled_back(c.base_path)
        held = [v for v in versions.candidates(c.base_path) if v not in rolled_back]
        served = versions.served(c.base_path)
        if held and (served is None or held[-1] > served):
            out[c.name] = held[-1]
    return out


# The flags the generated configs replace (the model's, monitoring's and batching's files), and
# --version, which tfpipe serve answers itself: never passed on as given.
_REPLACED = {"model_config_file", "model_name", "model_base_path", "monitoring_config_file",
             "enable_batching", "batching_parameters_file", "version"}


def server_flags(opts: ServeOptions, paths: dict[str, str], ports: bool = True) -> list[str]:
    """tensorflow_model_server's flags for these options and config files; every other TF
    Serving flag the command line named is passed on as it was given."""
    addresses = ["port", "rest_api_port"]
    polls = ["model_config_file_poll_wait_seconds", "file_system_poll_wait_seconds"]
    serving = ["enable_model_warmup", "rest_api_num_threads", "rest_api_timeout_in_ms", "grpc_max_threads"]
    threads = [n for n in ("tensorflow_intra_op_parallelism", "tensorflow_inter_op_parallelism") if getattr(opts, n)]
    flags = opts.to_argv(addresses) if ports else []
    flags += flag_arg("model_config_file", paths["models"]) + opts.to_argv(polls)
    flags += flag_arg("monitoring_config_file", paths["monitoring"]) + opts.to_argv(serving)
    if opts.enable_batching:
        flags += flag_arg("enable_batching", True) + flag_arg("batching_parameters_file", paths["batching"])
    flags += opts.to_argv(threads)
    written = {*addresses, *polls, *serving, *threads, *_REPLACED}
    return flags + opts.to_argv([f.name for f in TF_SERVING_FLAGS if f.name in opts.given and f.name not in written])


def _refuse_what_it_cannot_do(opts: ServeOptions) -> None:
    """A switch that protects the server, which tensorflow_model_server has no way to honour."""
    if not opts.model_config_reload:
        raise ServeError("--model_config_reload=false: tensorflow_model_server answers HandleReloadConfigRequest "
                         "for anyone who reaches its --port and has no switch to turn it off; serve on a "
                         "trusted network, or use the default --backend embedded")


def tfserving_command(opts: ServeOptions) -> list[str]:
    _refuse_what_it_cannot_do(opts)
    binary = shutil.which("tensorflow_model_server")
    if binary is None and not opts.dry_run:
        raise ServeError("tensorflow_model_server is not on PATH: install TensorFlow Serving "
                         "(apt package tensorflow-model-server, see tensorflow.org/tfx/serving/setup), "
                         "use --backend docker, or the default --backend embedded")
    paths = write_configs(opts, os.path.abspath(opts.config_dir))
    return [binary or "tensorflow_model_server", *server_flags(opts, paths)]


def image(opts: ServeOptions) -> str:
    return opts.docker_image or ("tensorflow/serving:latest-gpu" if opts.gpu else "tensorflow/serving:latest")


def container_base_paths(config: model_server_config_pb2.ModelServerConfig) -> dict[str, str]:
    return {c.name: f"{CONTAINER_MODELS}/{c.name}" if "://" not in c.base_path else c.base_path
            for c in config.model_config_list.config}


def docker_command(opts: ServeOptions) -> list[str]:
    _refuse_what_it_cannot_do(opts)
    if not opts.dry_run:
        if shutil.which("docker") is None:
            raise ServeError("docker is not on PATH: install Docker to use --backend docker, or use "
                             "--backend tfserving or the default --backend embedded")
        if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
            raise ServeError("docker is installed but its engine is not reachable (is the daemon running "
                             "and may this user use it?)")
    config = model_server_config(opts)
    config_dir = os.path.abspath(opts.config_dir)
    host_paths = {c.name: c.base_path for c in config.model_config_list.config}
    write_configs(opts, config_dir, container_base_paths(config))
    inside = {k: f"{CONTAINER_CONFIG}/{k}.config" for k in ("models", "batching", "monitoring")}
    cmd = ["docker", "run", "--rm", "--init",
           "-p", f"{opts.port}:{GRPC_IN_CONTAINER}"]
    if opts.rest_api_port:
        cmd += ["-p", f"{opts.rest_api_port}:{REST_IN_CONTAINER}"]
    if opts.gpu:
        cmd += ["--gpus", "all"]
    for name, path in host_paths.items():
        if "://" not in path:
            cmd += ["-v", f"{path}:{CONTAINER_MODELS}/{name}:ro"]
    cmd += ["-v", f"{config_dir}:{CONTAINER_CONFIG}:ro", image(opts)]
    return cmd + server_flags(opts, inside, ports=False)


def launch(opts: ServeOptions, log=print) -> int:
    """Run real TF Serving (replacing this process, so signals reach it directly)."""
    cmd = tfserving_command(opts) if opts.backend == "tfserving" else docker_command(opts)
    log(f"configs in {os.path.abspath(opts.config_dir)}")
    log(" ".join(cmd))
    if opts.dry_run:
        return 0
    os.execvp(cmd[0], cmd)
    return 0  # not reached
