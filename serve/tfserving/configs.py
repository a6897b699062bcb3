"""TF Serving's config files (text protos), read and written with the official messages, and
the SessionBundleConfig that tensorflow_model_server derives from its flags (or takes from
--platform_config_file): batching, TensorFlow session settings, tags and warmup."""

from __future__ import annotations

import os
from collections.abc import Callable

from google.protobuf import text_format
from tensorflow.core.protobuf import config_pb2
from tensorflow_serving.config import model_server_config_pb2, platform_config_pb2

from tfpipe.files import write_atomic
from tfpipe.serve.errors import ServeError
from tfpipe.versions import CANDIDATES, candidate_model
from tfpipe.serve.flags import ServeOptions
from tfpipe.serve.tfserving.protos import (
    POOL,
    BatchingParameters,
    MonitoringConfig,
    SavedModelBundleSourceAdapterConfig,
    SessionBundleConfig,
    SSLConfig,
)

DEFAULT_METRICS_PATH = "/monitoring/prometheus/metrics"
DEFAULT_BATCH_THREAD_POOL = "model_server_batch_threads"
SOURCE_ADAPTER_TYPE = "type.googleapis.com/tensorflow.serving.SavedModelBundleSourceAdapterConfig"


def read_text_proto(path: str, message, what: str):
    """Parse a text proto file; errors read as tensorflow_model_server's do
    ("Error parsing text-format tensorflow.serving.ModelServerConfig: 1:10: ...")."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise ServeError(f"{what}: cannot read {path}: {e.strerror}") from None
    try:
        return text_format.Parse(text, message, descriptor_pool=POOL)
    except text_format.ParseError as e:
        raise ServeError(f"{what} {path}: Error parsing text-format {message.DESCRIPTOR.full_name}: {e}") from None


def model_server_config(opts: ServeOptions, log: Callable[[str], None] | None = None
                        ) -> model_server_config_pb2.ModelServerConfig:
    """From --model_config_file, or one model from --model_name/--model_base_path. As in TF
    Serving, a config file wins over --model_base_path, and relative base paths are relative
    to the server's working directory."""
    if opts.model_config_file:
        if opts.model_base_path and log:
            log("--model_name and --model_base_path are ignored: --model_config_file is set")
        config = read_text_proto(opts.model_config_file, model_server_config_pb2.ModelServerConfig(),
                                 "--model_config_file")
        if config.WhichOneof("config") == "model_config_list" and not config.model_config_list.config:
            raise ServeError(f"--model_config_file {opts.model_config_file} lists no models")
        return _with_request_log(config, opts)
    if not opts.model_base_path:
        raise ServeError("Both server_options.model_base_path and server_options.model_config_file are empty! "
                         "Give --model_base_path (with --model_name) or --model_config_file")
    config = model_server_config_pb2.ModelServerConfig()
    config.model_config_list.config.add(name=opts.model_name, base_path=os.path.abspath(opts.model_base_path),
                                        model_platform="tensorflow")
    return _with_request_log(config, opts)


def _with_request_log(config, opts: ServeOptions):
    """--request_log_prefix: a tfrecord logging_config for each model that has none."""
    if opts.request_log_prefix:
        if not 0.0 <= opts.request_log_sampling_rate <= 1.0:
            raise ServeError(f"--request_log_sampling_rate must be in [0, 1], got {opts.request_log_sampling_rate}")
        for c in config.model_config_list.config:
            if not c.HasField("logging_config"):
                c.logging_config.log_collector_config.type = "tfrecord"
                c.logging_config.log_collector_config.filename_prefix = opts.request_log_prefix
                c.logging_config.sampling_config.sampling_rate = opts.request_log_sampling_rate
    return config


def batching_parameters(opts: ServeOptions):
    """--batching_parameters_file, or TF Serving's defaults (which name the shared thread pool)."""
    if opts.batching_parameters_file and not opts.enable_batching:
        raise ServeError("server_options.batching_parameters_file is set without setting "
                         "server_options.enable_batching to true (add --enable_batching)")
    if not opts.batching_parameters_file:
        params = BatchingParameters()
        params.thread_pool_name.value = DEFAULT_BATCH_THREAD_POOL
        return params
    return read_text_proto(opts.batching_parameters_file, BatchingParameters(), "--batching_parameters_file")


def session_bundle_config(opts: ServeOptions):
    """The SessionBundleConfig tensorflow_model_server builds (model_servers/server.cc): from
    the flags, or the tensorflow platform's legacy_config of --platform_config_file (which
    then replaces --enable_batching and the session flags)."""
    if opts.platform_config_file:
        return _platform_session_config(opts.platform_config_file)
    cfg = SessionBundleConfig()
    if opts.enable_batching:
        cfg.batching_parameters.CopyFrom(batching_parameters(opts))
        cfg.enable_per_model_batching_params = opts.enable_per_model_batching_parameters
    else:
        batching_parameters(opts)  # a batching file without --enable_batching is an error
    if opts.tensorflow_session_config_file:
        cfg.session_config.CopyFrom(read_text_proto(opts.tensorflow_session_config_file, config_pb2.ConfigProto(),
                                                    "--tensorflow_session_config_file"))
    if opts.per_process_gpu_memory_fraction:
        cfg.session_config.gpu_options.per_process_gpu_memory_fraction = opts.per_process_gpu_memory_fraction
    intra, inter, both = (opts.tensorflow_intra_op_parallelism, opts.tensorflow_inter_op_parallelism,
                          opts.tensorflow_session_parallelism)
    if intra > 0 and inter > 0 and both > 0:
        raise ServeError("Either configure server_options.tensorflow_session_parallelism or "
                         "(server_options.tensorflow_intra_op_parallelism, "
                         "server_options.tensorflow_inter_op_parallelism) separately. You cannot configure all.")
    if intra > 0 or inter > 0:
        cfg.session_config.intra_op_parallelism_threads = intra
        cfg.session_config.inter_op_parallelism_threads = inter
    elif both > 0:
        cfg.session_config.intra_op_parallelism_threads = both
        cfg.session_config.inter_op_parallelism_threads = both
    cfg.saved_model_tags.extend(opts.tags())
    cfg.enable_model_warmup = opts.enable_model_warmup
    if opts.num_request_iterations_for_warmup > 0:
        cfg.model_warmup_options.num_request_iterations.value = opts.num_request_iterations_for_warmup
    cfg.remove_unused_fields_from_bundle_metagraph = opts.remove_unused_fields_from_bundle_metagraph
    cfg.prefer_tflite_model = opts.prefer_tflite_model
    cfg.num_tflite_interpreters_per_pool = opts.num_tflite_interpreters_per_pool
    cfg.num_tflite_pools = opts.num_tflite_pools
    cfg.mixed_precision = opts.mixed_precision
    return cfg


def _platform_session_config(path: str):
    platforms = read_text_proto(path, platform_config_pb2.PlatformConfigMap(), "--platform_config_file")
    unknown = sorted(set(platforms.platform_configs) - {"tensorflow"})
    if unknown:
        raise ServeError(f"--platform_config_file {path}: platform(s) {unknown} are not supported; this server "
                         "runs the tensorflow platform")
    if "tensorflow" not in platforms.platform_configs:
        raise ServeError(f"--platform_config_file {path} has no 'tensorflow' platform")
    adapter = platforms.platform_configs["tensorflow"].source_adapter_config
    if adapter.type_url != SOURCE_ADAPTER_TYPE:
        raise ServeError(f"--platform_config_file {path}: the tensorflow platform's source_adapter_config must be "
                         f"a SavedModelBundleSourceAdapterConfig, got {adapter.type_url or 'nothing'}")
    config = SavedModelBundleSourceAdapterConfig()
    adapter.Unpack(config)
    cfg = config.legacy_config
    if not cfg.saved_model_tags:
        cfg.saved_model_tags.append("serve")
    return cfg


def monitoring_config(opts: ServeOptions):
    if not opts.monitoring_config_file:
        return None
    config = read_text_proto(opts.monitoring_config_file, MonitoringConfig(), "--monitoring_config_file")
    if config.prometheus_config.enable and not config.prometheus_config.path:
        config.prometheus_config.path = DEFAULT_METRICS_PATH
    return config


def ssl_config(opts: ServeOptions):
    if not opts.ssl_config_file:
        return None
    if opts.use_alts_credentials:
        raise ServeError("Either use_alts_credentials must be false or ssl_config_file must be empty.")
    config = read_text_proto(opts.ssl_config_file, SSLConfig(), "--ssl_config_file")
    if not config.server_key or not config.server_cert:
        raise ServeError(f"--ssl_config_file {opts.ssl_config_file}: server_key and server_cert (PEM text) are needed")
    return config


def channel_arguments(text: str) -> list[tuple[str, int | str]]:
    """--grpc_channel_arguments as gRPC server options: `k=v,k2=v2`; a value that parses as a
    32-bit integer is passed as one, as TF Serving does. A later key replaces an earlier one."""
    out: dict[str, int | str] = {}
    for item in (p for p in text.split(",") if p.strip()):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ServeError(f"--grpc_channel_arguments: {item!r} is not KEY=VALUE")
        value = value.strip()
        try:
            number = int(value, 10)
            out[key.strip()] = number if -2**31 <= number < 2**31 else value
        except ValueError:
            out[key.strip()] = value
    return list(out.items())


def write_text_proto(path: str, message) -> str:
    write_atomic(path, text_format.MessageToString(message))
    return path


def remove_candidate(path: str, name: str) -> bool:
    """Take model `name`'s candidate entry (add_candidate's) out of the models.config at `path`, once
    it has been judged: promoted, its version is in the served range; held, it waits in candidates/.
    False when there was none (or no file)."""
    if not os.path.exists(path):
        return False
    config = read_text_proto(path, model_server_config_pb2.ModelServerConfig(), "models config")
    entries = config.model_config_list.config
    keep = [c for c in entries if c.name != candidate_model(name)]
    if len(keep) == len(entries):
        return False
    out = model_server_config_pb2.ModelServerConfig()
    out.model_config_list.config.extend(keep)
    write_text_proto(path, out)
    return True


def add_candidate(path: str, name: str, base_path: str, version: int) -> str:
    """Add to the models.config at `path` the candidate `version` of model `name` (kept in
    BASE/NAME/candidates/, which TF Serving's default policy never serves) as a model of its own,
    NAME-candidate: its base path the candidates folder, a `specific` version policy naming it.
    A client, a load test or a canary router calls it by that name beside the served one."""
    config = read_text_proto(path, model_server_config_pb2.ModelServerConfig(), "models config")
    entry = config.model_config_list.config.add(name=candidate_model(name),
                                                base_path=os.path.join(os.path.abspath(base_path), CANDIDATES),
                                                model_platform="tensorflow")
    entry.model_version_policy.specific.versions.append(version)
    return write_text_proto(path, config)
