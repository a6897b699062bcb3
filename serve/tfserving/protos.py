"""TF Serving's config messages that the tensorflow-serving-api wheel does not ship.

`ModelServerConfig` and `PlatformConfigMap` come from `tensorflow_serving.config`. These are
not in the wheel, so they are declared here with the same package, names, types and field
numbers, in a private descriptor pool (no clash if a later wheel ships them):

  * BatchingParameters, ModelWarmupOptions, SessionBundleConfig
    (tensorflow_serving/servables/tensorflow/session_bundle_config.proto);
  * SavedModelBundleSourceAdapterConfig (.../saved_model_bundle_source_adapter.proto), the
    payload of a --platform_config_file's `source_adapter_config`;
  * MonitoringConfig, PrometheusConfig (tensorflow_serving/config/monitoring_config.proto);
  * SSLConfig (tensorflow_serving/config/ssl_config.proto).

Their text protos parse and print exactly as tensorflow_model_server reads them.
"""

from __future__ import annotations

from google.protobuf import (
    descriptor_pb2,
    descriptor_pool,
    message_factory,
    wrappers_pb2,
)
from tensorflow.core.protobuf import config_pb2, named_tensor_pb2

_F = descriptor_pb2.FieldDescriptorProto
I32, I64, BOOL, STR = ".google.protobuf.Int32Value", ".google.protobuf.Int64Value", \
    ".google.protobuf.BoolValue", ".google.protobuf.StringValue"


def _field(msg, name: str, number: int, ftype: int, type_name: str = "", repeated: bool = False) -> None:
    f = msg.field.add(name=name, number=number, type=ftype,
                      label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL)
    if type_name:
        f.type_name = type_name


def _message(fd, name: str, fields: list[tuple]) -> None:
    """fields: (name, number, type) with type a scalar TYPE_* or a '.full.MessageName'."""
    m = fd.message_type.add(name=name)
    for fname, number, ftype, *rest in fields:
        repeated = bool(rest and rest[0])
        if isinstance(ftype, str):
            _field(m, fname, number, _F.TYPE_MESSAGE, ftype, repeated)
        else:
            _field(m, fname, number, ftype, repeated=repeated)


def _add_with_dependencies(pool, file_descriptor, added: set[str]) -> None:
    if file_descriptor.name in added:
        return
    for dep in file_descriptor.dependencies:
        _add_with_dependencies(pool, dep, added)
    pool.AddSerializedFile(file_descriptor.serialized_pb)
    added.add(file_descriptor.name)


def _build():
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()
    for f in (wrappers_pb2.DESCRIPTOR, config_pb2.DESCRIPTOR, named_tensor_pb2.DESCRIPTOR):
        _add_with_dependencies(pool, f, added)
    fd = descriptor_pb2.FileDescriptorProto(
        name="tfpipe/tensorflow_serving_configs.proto", package="tensorflow.serving", syntax="proto3",
        dependency=sorted(added & {"google/protobuf/wrappers.proto", "tensorflow/core/protobuf/config.proto",
                                   "tensorflow/core/protobuf/named_tensor.proto"}))
    _message(fd, "BatchingParameters", [
        ("max_batch_size", 1, I64), ("batch_timeout_micros", 2, I64), ("max_enqueued_batches", 3, I64),
        ("num_batch_threads", 4, I64), ("thread_pool_name", 5, STR),
        ("allowed_batch_sizes", 6, _F.TYPE_INT64, True), ("pad_variable_length_inputs", 7, _F.TYPE_BOOL),
        ("enable_large_batch_splitting", 8, BOOL), ("max_execution_batch_size", 9, I64)])
    _message(fd, "ModelWarmupOptions", [
        ("num_request_iterations", 1, I32), ("num_model_warmup_threads", 2, I32), ("model_name", 3, _F.TYPE_STRING),
        ("model_version", 4, _F.TYPE_INT64), ("enable_all_batch_sizes_warmup", 5, _F.TYPE_BOOL)])
    _message(fd, "SessionBundleConfig", [
        ("session_target", 1, _F.TYPE_STRING), ("session_config", 2, ".tensorflow.ConfigProto"),
        ("batching_parameters", 3, ".tensorflow.serving.BatchingParameters"),
        ("session_run_load_threadpool_index", 4, I32),
        ("experimental_transient_ram_bytes_during_load", 5, _F.TYPE_UINT64),
        ("saved_model_tags", 6, _F.TYPE_STRING, True),
        ("in_graph_batching_parameters", 7, ".tensorflow.BatchingOptions"),
        ("experimental_fixed_input_tensors", 778, ".tensorflow.NamedTensorProto", True),
        ("enable_model_warmup", 779, _F.TYPE_BOOL),
        ("model_warmup_options", 780, ".tensorflow.serving.ModelWarmupOptions"),
        ("enable_session_metadata", 781, _F.TYPE_BOOL),
        ("remove_unused_fields_from_bundle_metagraph", 782, _F.TYPE_BOOL),
        ("prefer_tflite_model", 783, _F.TYPE_BOOL),
        ("resource_estimation_uses_validation_result", 784, _F.TYPE_BOOL),
        ("num_tflite_interpreters", 785, _F.TYPE_INT32), ("num_tflite_interpreters_per_pool", 786, _F.TYPE_INT32),
        ("num_tflite_pools", 787, _F.TYPE_INT32), ("wrap_session_with_no_threading_params", 788, _F.TYPE_BOOL),
        ("enable_per_model_batching_params", 789, _F.TYPE_BOOL), ("enable_saved_model_config", 790, _F.TYPE_BOOL),
        ("mixed_precision", 791, _F.TYPE_STRING)])
    _message(fd, "SavedModelBundleSourceAdapterConfig", [
        ("legacy_config", 1000, ".tensorflow.serving.SessionBundleConfig")])
    _message(fd, "PrometheusConfig", [("enable", 1, _F.TYPE_BOOL), ("path", 2, _F.TYPE_STRING)])
    _message(fd, "MonitoringConfig", [("prometheus_config", 1, ".tensorflow.serving.PrometheusConfig")])
    _message(fd, "SSLConfig", [("server_key", 1, _F.TYPE_STRING), ("server_cert", 2, _F.TYPE_STRING),
                               ("custom_ca", 3, _F.TYPE_STRING), ("client_verify", 4, _F.TYPE_BOOL)])
    pool.Add(fd)

    def get(name: str):
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"tensorflow.serving.{name}"))

    names = ("BatchingParameters", "SessionBundleConfig", "SavedModelBundleSourceAdapterConfig",
             "MonitoringConfig", "SSLConfig")
    return pool, *(get(n) for n in names)


POOL, BatchingParameters, SessionBundleConfig, SavedModelBundleSourceAdapterConfig, MonitoringConfig, SSLConfig = \
    _build()
