"""TF Serving's config files (text protos), read and written with the official messages."""

from __future__ import annotations

import os

from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

from serve.errors import ServeError
from serve.flags import ServeOptions
from serve.protos import BatchingParameters, MonitoringConfig

DEFAULT_METRICS_PATH = "/monitoring/prometheus/metrics"


def read_text_proto(path: str, message, what: str):
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise ServeError(f"cannot read {what} {path}: {e.strerror}") from None
    try:
        return text_format.Parse(text, message)
    except text_format.ParseError as e:
        raise ServeError(f"{what} {path} is not a valid {message.DESCRIPTOR.name} text proto: {e}") from None


def model_server_config(opts: ServeOptions) -> model_server_config_pb2.ModelServerConfig:
    """From --model_config_file, or one model from --model_name/--model_base_path."""
    if opts.model_config_file and opts.model_base_path:
        raise ServeError("give --model_config_file or --model_base_path, not both")
    if opts.model_config_file:
        config = read_text_proto(opts.model_config_file, model_server_config_pb2.ModelServerConfig(),
                                 "--model_config_file")
        base_dir = os.path.dirname(os.path.abspath(opts.model_config_file))
        for c in config.model_config_list.config:
            if c.base_path and not os.path.isabs(c.base_path) and "://" not in c.base_path:
                c.base_path = os.path.normpath(os.path.join(base_dir, c.base_path))
        if not config.model_config_list.config:
            raise ServeError(f"--model_config_file {opts.model_config_file} lists no models")
        return config
    if not opts.model_base_path:
        raise ServeError("nothing to serve: give --model_base_path (with --model_name) or --model_config_file")
    config = model_server_config_pb2.ModelServerConfig()
    config.model_config_list.config.add(name=opts.model_name, base_path=os.path.abspath(opts.model_base_path),
                                        model_platform="tensorflow")
    return config


def batching_parameters(opts: ServeOptions):
    if opts.batching_parameters_file and not opts.enable_batching:
        raise ServeError("--batching_parameters_file needs --enable_batching")
    if not opts.batching_parameters_file:
        return BatchingParameters()
    return read_text_proto(opts.batching_parameters_file, BatchingParameters(), "--batching_parameters_file")


def monitoring_config(opts: ServeOptions):
    if not opts.monitoring_config_file:
        return None
    config = read_text_proto(opts.monitoring_config_file, MonitoringConfig(), "--monitoring_config_file")
    if config.prometheus_config.enable and not config.prometheus_config.path:
        config.prometheus_config.path = DEFAULT_METRICS_PATH
    return config


def write_text_proto(path: str, message) -> str:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text_format.MessageToString(message))
    os.replace(tmp, path)
    return path
