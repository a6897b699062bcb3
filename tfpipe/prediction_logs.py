"""The request-log file format, shared by the server that writes it (`tfpipe serve`'s
`tfrecord` log collector), `tfpipe skew` and `tfpipe loadtest --replay`, which read it.

Each log is a set of TFRecord files named `<filename_prefix>-<UTC time>-<pid>-<seq>.tfrecord`.
A record is a serialized `tensorflow.serving.PredictionLog`, TF Serving's own message: log
metadata (model spec, sampling config, SavedModel tags, timestamp_secs) and the request and
response of one Predict, Classify, Regress or MultiInference call.

TF Serving's LogMetadata keeps time in whole seconds and no latency, which is too coarse for
replaying traffic. So each record also carries a `tfpipe.RequestTiming` in field 20460 of
the PredictionLog: a field number PredictionLog does not use. Any PredictionLog parser reads
the record as usual and keeps that field as an unknown field; `timing()` reads it back.

This module imports nothing of tfpipe, so every stage may use it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

TIMING_FIELD = 20460
SUFFIX = ".tfrecord"
LOG_FIELDS = {"predict": "predict_log", "classify": "classify_log", "regress": "regress_log",
              "multi_inference": "multi_inference_log"}
# A SavedModel's warmup records: PredictionLogs too, in this file of a version directory (TF Serving's
# name), which tfpipe export writes, the server replays before a version serves and loadtest can send.
WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")


def _timing_classes():
    F = descriptor_pb2.FieldDescriptorProto
    fd = descriptor_pb2.FileDescriptorProto(name="tfpipe/request_timing.proto", package="tfpipe", syntax="proto3")
    timing = fd.message_type.add(name="RequestTiming")
    for name, number, ftype in [("start_unix_nanos", 1, F.TYPE_INT64), ("latency_nanos", 2, F.TYPE_INT64),
                                ("protocol", 3, F.TYPE_STRING), ("api", 4, F.TYPE_STRING),
                                ("rest_format", 5, F.TYPE_STRING)]:
        timing.field.add(name=name, number=number, type=ftype, label=F.LABEL_OPTIONAL)
    carrier = fd.message_type.add(name="TimingCarrier")
    carrier.field.add(name="timing", number=TIMING_FIELD, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                      type_name=".tfpipe.RequestTiming")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return (message_factory.GetMessageClass(pool.FindMessageTypeByName("tfpipe.RequestTiming")),
            message_factory.GetMessageClass(pool.FindMessageTypeByName("tfpipe.TimingCarrier")))


RequestTiming, _Carrier = _timing_classes()


def timing_bytes(start_unix_nanos: int, latency_nanos: int, protocol: str, api: str, rest_format: str = "") -> bytes:
    """The bytes to append to a serialized PredictionLog (protobuf merges concatenated messages)."""
    carrier = _Carrier()
    t = carrier.timing
    t.start_unix_nanos, t.latency_nanos, t.protocol, t.api, t.rest_format = \
        start_unix_nanos, latency_nanos, protocol, api, rest_format
    return carrier.SerializeToString()


def timing(record: bytes):
    """The RequestTiming a record carries (all fields zero or empty when it carries none,
    as in a log written by another server)."""
    return _Carrier.FromString(record).timing


def log_files(prefix: str) -> list[str]:
    """The files of the log at `prefix`, oldest first (their names sort by time)."""
    import tensorflow as tf

    pattern = f"{prefix}*{SUFFIX}" if prefix.endswith(("/", os.sep)) else f"{prefix}-*{SUFFIX}"
    return sorted(tf.io.gfile.glob(pattern), key=os.path.basename)


@dataclass
class LogRead:
    """What reading a log found: the records, and the files whose last record was cut short
    (a server killed mid-write): the records before the cut are kept."""
    records: list[bytes]
    files: list[str]
    truncated: list[str]


def read_log(prefix: str, limit: int | None = None) -> LogRead:
    import tensorflow as tf

    files = log_files(prefix)
    records, truncated = [], []
    for path in files:
        try:
            for raw in tf.data.TFRecordDataset(path).as_numpy_iterator():
                records.append(raw)
                if limit is not None and len(records) >= limit:
                    return LogRead(records, files, truncated)
        except tf.errors.DataLossError:
            truncated.append(path)
    return LogRead(records, files, truncated)


def iter_logs(records: list[bytes]) -> Iterator[tuple]:
    """(PredictionLog, RequestTiming) per record."""
    from tensorflow_serving.apis import prediction_log_pb2

    for raw in records:
        yield prediction_log_pb2.PredictionLog.FromString(raw), timing(raw)
