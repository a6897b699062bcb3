"""TF Serving's config messages that the tensorflow-serving-api wheel does not ship.

`ModelServerConfig` comes from `tensorflow_serving.config`. `BatchingParameters`
(tensorflow_serving/servables/tensorflow/session_bundle_config.proto) and
`MonitoringConfig` (tensorflow_serving/config/monitoring_config.proto) are not in the
wheel, so they are declared here with the same package, names, types and field numbers,
in a private descriptor pool (no clash if a later wheel ships them). Their text protos
parse and print exactly as tensorflow_model_server reads them.
"""

from __future__ import annotations

from google.protobuf import (
    descriptor_pb2,
    descriptor_pool,
    message_factory,
    wrappers_pb2,
)

_F = descriptor_pb2.FieldDescriptorProto


def _field(msg, name: str, number: int, ftype: int, type_name: str = "", repeated: bool = False) -> None:
    f = msg.field.add(name=name, number=number, type=ftype,
                      label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL)
    if type_name:
        f.type_name = type_name


def _build():
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(wrappers_pb2.DESCRIPTOR.serialized_pb)
    fd = descriptor_pb2.FileDescriptorProto(name="tfpipe/tensorflow_serving_configs.proto",
                                            package="tensorflow.serving", syntax="proto3",
                                            dependency=["google/protobuf/wrappers.proto"])
    b = fd.message_type.add(name="BatchingParameters")
    i64, s = ".google.protobuf.Int64Value", ".google.protobuf.StringValue"
    _field(b, "max_batch_size", 1, _F.TYPE_MESSAGE, i64)
    _field(b, "batch_timeout_micros", 2, _F.TYPE_MESSAGE, i64)
    _field(b, "max_enqueued_batches", 3, _F.TYPE_MESSAGE, i64)
    _field(b, "num_batch_threads", 4, _F.TYPE_MESSAGE, i64)
    _field(b, "thread_pool_name", 5, _F.TYPE_MESSAGE, s)
    _field(b, "allowed_batch_sizes", 6, _F.TYPE_INT64, repeated=True)
    _field(b, "pad_variable_length_inputs", 7, _F.TYPE_BOOL)
    _field(b, "enable_large_batch_splitting", 8, _F.TYPE_BOOL)
    _field(b, "max_execution_batch_size", 9, _F.TYPE_MESSAGE, i64)
    p = fd.message_type.add(name="PrometheusConfig")
    _field(p, "enable", 1, _F.TYPE_BOOL)
    _field(p, "path", 2, _F.TYPE_STRING)
    m = fd.message_type.add(name="MonitoringConfig")
    _field(m, "prometheus_config", 1, _F.TYPE_MESSAGE, ".tensorflow.serving.PrometheusConfig")
    pool.Add(fd)
    get = lambda name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"tensorflow.serving.{name}"))
    return get("BatchingParameters"), get("MonitoringConfig")


BatchingParameters, MonitoringConfig = _build()
