"""Request logging: TF Serving's `logging_config`, with a collector behind it.

A model's `logging_config` in the ModelServerConfig names a log collector type and a
filename prefix, and a sampling rate. Open-source tensorflow_model_server registers no
collector, so a config with one fails there ("No request-logger-creator provided"). This
server registers one type, `tfrecord`: sampled requests of every API, REST and gRPC, are
written as `tensorflow.serving.PredictionLog` records to rotated TFRecord files under the
prefix (the format: `tfpipe/prediction_logs.py`).

Logging never slows or fails a request. The request thread draws the sample and puts a
small entry on a bounded queue; one writer thread per prefix builds the protos, serializes
and writes them. When the queue is full the entry is dropped and counted
(`tfpipe_serving_request_log_records_total{status="dropped"}`); no error of the log reaches
the client.

A record is counted `written` once it is known to be on disk (after the flush that follows
each burst of writes), and `failed` when a write, flush, open, rotation or close fails
(a full disk): the file is given up, the records it holds in full stay readable, and the
writer tries a new file after RETRY_SECONDS, counting what comes meanwhile as failed. The
log says once when writing stops and once when it goes on again.

As in TF Serving's ServerRequestLogger, models with the same logging config share one
logger, a reload keeps the loggers whose config did not change, and a config that cannot
be used refuses the whole (re)load.
"""

from __future__ import annotations

import os
import queue
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tensorflow_serving.apis import prediction_log_pb2
from tensorflow_serving.config import logging_config_pb2, model_server_config_pb2

from tfpipe.prediction_logs import LOG_FIELDS, SUFFIX, timing_bytes
from tfpipe.serve.errors import invalid, not_found
from tfpipe.serve.flags import ServeOptions
from tfpipe.serve.metrics import Metrics

COLLECTOR_TYPE = "tfrecord"
GATHER_SECONDS = 0.02
# While writes fail, how long the writer waits before it tries a file again: a full disk is
# not hammered with a new file every burst, and logging goes on within this after space returns.
RETRY_SECONDS = 1.0
_STOP = object()
_FLAGS = ServeOptions()  # LogBounds' defaults are the --request_log_* flags' (serve/flags.py's table)


@dataclass(frozen=True)
class LogBounds:
    """How much a collector may hold: entries waiting in memory, and the size and age of a
    file before the next record starts a new one; `max_files` > 0 deletes the oldest of the
    files this process wrote for a prefix past that many (0 keeps them all)."""
    queue_size: int = _FLAGS.request_log_queue_size
    max_file_bytes: int = _FLAGS.request_log_max_file_bytes
    max_file_seconds: float = _FLAGS.request_log_max_file_seconds
    max_files: int = _FLAGS.request_log_max_files


@dataclass
class Entry:
    """One sampled request, as the request thread hands it over. `build()` returns the
    (request, response) protos; for gRPC these are the call's own, for REST they are made
    from the decoded JSON on the writer thread."""
    model: str
    version: int
    signature: str
    api: str
    protocol: str
    start_unix_nanos: int
    latency_nanos: int
    build: Callable[[], tuple[Any, Any]]
    sampling: logging_config_pb2.SamplingConfig | None = None
    tags: tuple[str, ...] = ()
    rest_format: str = ""


def check_logging_config(model: str, config: logging_config_pb2.LoggingConfig) -> None:
    collector = config.log_collector_config
    if collector.type != COLLECTOR_TYPE:
        raise not_found(f"Cannot find LogCollector::Factory for type: {collector.type} (model {model}; "
                        f"this server's collector type is '{COLLECTOR_TYPE}')")
    if not collector.filename_prefix:
        raise invalid(f"model {model}: logging_config.log_collector_config.filename_prefix is empty")
    rates = [config.sampling_config.sampling_rate] + \
        [t.sampling_rate for t in config.sampling_config.per_task_sampling_configs]
    if any(not 0.0 <= r <= 1.0 for r in rates):
        raise invalid(f"model {model}: logging_config sampling_rate must be in [0, 1], got {rates}")


def sampling_rate(config: logging_config_pb2.LoggingConfig, dc: str = "", task_index: int = 0) -> float:
    """TF Serving's RequestLogger: the first per-task config matching this task wins, else
    sampling_rate. This server is task 0 of no named data centre."""
    for t in config.sampling_config.per_task_sampling_configs:
        if (not t.dc or t.dc == dc) and (not t.HasField("task_index") or t.task_index == task_index):
            return t.sampling_rate
    return config.sampling_config.sampling_rate


class TFRecordCollector:
    """The writer thread of one filename prefix."""

    def __init__(self, prefix: str, bounds: LogBounds, metrics: Metrics, log: Callable[[str], None]):
        self.prefix, self.bounds, self.metrics, self.log = prefix, bounds, metrics, log
        self.queue: queue.Queue = queue.Queue(maxsize=max(1, bounds.queue_size))
        self._writer = None
        self._path = ""
        self._bytes = 0  # how far the open file's records reach
        self._durable = 0  # how much of it is known to be on disk
        self._pending: list[tuple[str, int]] = []  # (model, end offset) of records written since then
        self._opened = 0.0
        self._seq = 0
        self._files: list[str] = []
        self._failing = False  # writes fail: records are counted as failed until one succeeds
        self._failed = 0  # records failed since writes last succeeded
        self._retry_at = 0.0
        self._encode_error_said = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"tfpipe-request-log:{prefix}", daemon=True)
        self._thread.start()

    def offer(self, entry: Entry) -> None:
        if self._closed:  # a request thread took this collector before a reload retired it
            self.metrics.request_log(entry.model, "dropped")
            return
        try:
            self.queue.put_nowait(entry)
        except queue.Full:
            self.metrics.request_log(entry.model, "dropped")

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued, close the file, stop the thread. An entry that a request
        thread queued after the stop (a reload retired this prefix meanwhile) is counted as
        dropped, as is one offered after the close."""
        self._closed = True
        try:
            self.queue.put(_STOP, timeout=timeout)
        except queue.Full:
            pass
        self._thread.join(timeout=timeout)
        if not self._thread.is_alive():
            while True:
                try:
                    item = self.queue.get_nowait()
                except queue.Empty:
                    break
                if isinstance(item, Entry):
                    self.metrics.request_log(item.model, "dropped")
                elif isinstance(item, threading.Event):
                    item.set()

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until every entry queued so far is written and flushed (tests, shutdown)."""
        done = threading.Event()
        self.queue.put(done, timeout=timeout)
        done.wait(timeout)

    def _run(self) -> None:
        """Wake on the first entry, let more gather for GATHER_SECONDS, write them all, flush.
        Working in bursts keeps the writer off the GIL for most of each interval: a record
        written the moment it arrives would hold the GIL just as the next request comes in."""
        stop = False
        while not stop:
            batch = [self.queue.get()]
            if batch[0] is not _STOP and not isinstance(batch[0], threading.Event):
                time.sleep(GATHER_SECONDS)
            while True:
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            stop = any(item is _STOP for item in batch)
            try:
                self._write_batch([item for item in batch if isinstance(item, Entry)])
            except Exception as e:  # the writer thread outlives anything a burst raises
                self._give_up_file(e, [])
            finally:
                for item in batch:
                    if isinstance(item, threading.Event):
                        item.set()
        try:
            self._close_file()
        except Exception as e:
            self._give_up_file(e, [])

    def _write_batch(self, entries: list[Entry]) -> None:
        if not entries:
            return
        if self._failing and time.monotonic() < self._retry_at:
            for entry in entries:
                self._count_failed(entry.model)
            return
        for i, entry in enumerate(entries):
            try:
                record = encode(entry)
            except Exception as e:  # a request the log cannot represent: that record alone is lost
                self.metrics.request_log(entry.model, "failed")
                if not self._encode_error_said:
                    self._encode_error_said = True
                    self.log(f"request log {self.prefix}: a {entry.api} record of {entry.model} could not be made "
                             f"({_one_line(e)}); such records are counted in "
                             "tfpipe_serving_request_log_records_total{status=\"failed\"}")
                continue
            try:
                self._rotate(len(record))
                self._writer.write(record)
            except Exception as e:  # a full disk, a bad prefix: counted, never raised to a request
                self._give_up_file(e, entries[i:])
                return
            self._bytes += len(record) + 16  # TFRecord framing: length, two CRCs
            self._pending.append((entry.model, self._bytes))
        if self._writer is None:
            return
        try:
            self._writer.flush()
        except Exception as e:
            self._give_up_file(e, [])
            return
        self._on_disk()

    def _on_disk(self) -> None:
        """The records written so far are on disk: count them, and say so if writes had failed."""
        for model, _ in self._pending:
            self.metrics.request_log(model, "written")
        self._pending, self._durable = [], self._bytes
        if self._failing:
            self._failing = False
            self.log(f"request log {self.prefix}: writing again; {self._failed} records failed while it could not")
            self._failed = 0

    def _count_failed(self, model: str) -> None:
        self.metrics.request_log(model, "failed")
        self._failed += 1

    def _give_up_file(self, error: Exception, unwritten: list[Entry]) -> None:
        """A write, flush, open, rotation or close failed. The file is closed as it is: the
        records it holds in full are counted written (its size on disk says which), the others
        and `unwritten` failed; a file that holds no whole record is removed. The next record
        starts a new file, RETRY_SECONDS from now."""
        import tensorflow as tf

        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close()
            except Exception:  # noqa: BLE001 (the failure is the one being handled)
                pass
        size = 0
        if self._path:
            try:
                size = tf.io.gfile.stat(self._path).length
            except Exception:  # noqa: BLE001 (a file that cannot be read back holds nothing we count)
                size = 0
        lost = [e.model for e in unwritten]
        held = self._durable > 0
        for model, end in self._pending:
            if end <= size:
                self.metrics.request_log(model, "written")
                held = True
            else:
                lost.append(model)
        if self._path and not held:
            try:
                tf.io.gfile.remove(self._path)
            except Exception:  # noqa: BLE001 (never created, or already gone)
                pass
            if self._files and self._files[-1] == self._path:
                self._files.pop()
        self._pending, self._path, self._bytes, self._durable = [], "", 0, 0
        for model in lost:
            self._count_failed(model)
        if not self._failing:
            self._failing = True
            self.log(f"request log {self.prefix}: cannot write ({_one_line(error)}); records are counted in "
                     "tfpipe_serving_request_log_records_total{status=\"failed\"} and a new file is tried every "
                     f"{RETRY_SECONDS:g}s")
        self._retry_at = time.monotonic() + RETRY_SECONDS

    def _rotate(self, incoming: int) -> None:
        b = self.bounds
        if self._writer is not None and (self._bytes + incoming > b.max_file_bytes
                                         or time.monotonic() - self._opened >= b.max_file_seconds):
            self._close_file()
        if self._writer is None:
            self._open_file()

    def _open_file(self) -> None:
        import tensorflow as tf

        self._seq += 1
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        sep = "" if self.prefix.endswith(("/", os.sep)) else "-"
        self._path = f"{self.prefix}{sep}{stamp}-{os.getpid()}-{self._seq:05d}{SUFFIX}"
        self._bytes = self._durable = 0
        parent = os.path.dirname(self._path)
        if parent:
            tf.io.gfile.makedirs(parent)
        self._writer = tf.io.TFRecordWriter(self._path)
        self._opened = time.monotonic()
        self._files.append(self._path)
        if self.bounds.max_files > 0:
            while len(self._files) > self.bounds.max_files:
                old = self._files.pop(0)
                try:
                    tf.io.gfile.remove(old)
                except tf.errors.OpError:
                    pass

    def _close_file(self) -> None:
        """Close the file; raises what closing raises, with the file still named for
        `_give_up_file`."""
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
            self._on_disk()


def _one_line(error: Exception) -> str:
    text = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def encode(entry: Entry) -> bytes:
    """A PredictionLog, serialized, with tfpipe's RequestTiming after it."""
    request, response = entry.build()
    log = prediction_log_pb2.PredictionLog()
    meta = log.log_metadata
    meta.model_spec.name = entry.model
    meta.model_spec.version.value = entry.version
    meta.model_spec.signature_name = entry.signature
    if entry.sampling is not None:
        meta.sampling_config.CopyFrom(entry.sampling)
    meta.saved_model_tags.extend(entry.tags)
    meta.timestamp_secs = entry.start_unix_nanos // 1_000_000_000
    part = getattr(log, LOG_FIELDS[entry.api])
    part.request.CopyFrom(request)
    part.response.CopyFrom(response)
    return log.SerializeToString() + timing_bytes(entry.start_unix_nanos, entry.latency_nanos, entry.protocol,
                                                  entry.api, entry.rest_format)


class _Logger:
    """One LoggingConfig: its sampling and the collector of its prefix."""

    def __init__(self, config: logging_config_pb2.LoggingConfig, collector: TFRecordCollector):
        self.config, self.collector = config, collector
        self.rate = sampling_rate(config)


class RequestLogs:
    """The server's request loggers, by model name (TF Serving's ServerRequestLogger)."""

    def __init__(self, bounds: LogBounds, metrics: Metrics, tags: tuple[str, ...] = ("serve",),
                 log: Callable[[str], None] = print):
        self.bounds, self.metrics, self.tags, self.log = bounds, metrics, tags, log
        self._lock = threading.Lock()
        self._by_model: dict[str, list[_Logger]] = {}
        self._collectors: dict[str, TFRecordCollector] = {}
        metrics.request_log_depth = self.depth

    def update(self, config: model_server_config_pb2.ModelServerConfig) -> None:
        """Check every model's logging_config, then swap the loggers in; on an error nothing
        changes."""
        wanted: dict[str, list[logging_config_pb2.LoggingConfig]] = {}
        for model in config.model_config_list.config:
            if model.HasField("logging_config"):
                check_logging_config(model.name, model.logging_config)
                wanted.setdefault(model.name, []).append(model.logging_config)
        with self._lock:
            by_config: dict[bytes, _Logger] = {}
            for loggers in self._by_model.values():
                for lg in loggers:
                    by_config[lg.config.SerializeToString(deterministic=True)] = lg
            new: dict[str, list[_Logger]] = {}
            used: set[str] = set()
            for name, configs in wanted.items():
                for c in configs:
                    key = c.SerializeToString(deterministic=True)
                    if key not in by_config:
                        by_config[key] = _Logger(c, self._collector(c.log_collector_config.filename_prefix))
                    new.setdefault(name, []).append(by_config[key])
                    used.add(c.log_collector_config.filename_prefix)
            self._by_model = new
            retired = [p for p in self._collectors if p not in used]
            closing = [self._collectors.pop(p) for p in retired]
        for collector in closing:
            collector.close()

    def _collector(self, prefix: str) -> TFRecordCollector:
        if prefix not in self._collectors:
            self._collectors[prefix] = TFRecordCollector(prefix, self.bounds, self.metrics, self.log)
        return self._collectors[prefix]

    def record(self, model: str, version: int, signature: str, api: str, protocol: str, started: tuple[int, int],
               build: Callable[[], tuple[Any, Any]], rest_format: str = "") -> None:
        """Sample and queue one answered request; never raises, never blocks. `started` is
        (time.time_ns(), time.perf_counter_ns()) when the request came in."""
        loggers = self._by_model.get(model, ())
        if not loggers:
            return
        latency = time.perf_counter_ns() - started[1]
        for lg in loggers:
            if lg.rate <= 0.0 or (lg.rate < 1.0 and random.random() >= lg.rate):
                continue
            lg.collector.offer(Entry(model, version, signature, api, protocol, started[0], latency, build,
                                     lg.config.sampling_config, self.tags, rest_format))

    def depth(self) -> int:
        return sum(c.queue.qsize() for c in list(self._collectors.values()))

    def flush(self) -> None:
        for c in list(self._collectors.values()):
            c.flush()

    def close(self) -> None:
        with self._lock:
            collectors, self._collectors, self._by_model = list(self._collectors.values()), {}, {}
        for c in collectors:
            c.close()
