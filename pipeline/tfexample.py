"""Serialize validated columns as tf.train.Example records in gzip TFRecord files.

The Example wire format is written directly: one feature map entry per present value,
built column-wise and memoised per distinct value, then joined per row. This is several
times faster than filling protobuf messages row by row, and the result parses with
`tf.train.Example.FromString` and `tf.io.parse_example` like any other Example.
A missing value is an absent feature, as TensorFlow expects.
"""

from __future__ import annotations

import struct
import zlib
from typing import Iterable

import google_crc32c
import numpy as np

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from tfpipe.pipeline.validation import Column
from tfpipe.pipeline.schema import Feature

_MEMO_LIMIT = 1 << 16  # distinct values remembered per column before the memo is reset


def varint(n: int) -> bytes:
    if n < 0:
        n += 1 << 64  # int64 values are encoded as their two's complement
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL_VARINTS = [varint(i) for i in range(1 << 14)]


def _len_prefix(n: int) -> bytes:
    return _SMALL_VARINTS[n] if n < 16384 else varint(n)


def _entry(key: bytes, feature: bytes) -> bytes:
    """A `map<string, Feature>` entry of Features: field 1 holding {key: 1, value: 2}."""
    body = b"\x0a" + _len_prefix(len(key)) + key + b"\x12" + _len_prefix(len(feature)) + feature
    return b"\x0a" + _len_prefix(len(body)) + body


class ExampleEncoder:
    """Encodes batches of columns into serialized tf.train.Example bytes."""

    def __init__(self, columns: list[Feature]):
        self.columns = columns
        self._keys = [c.name.encode("utf-8") for c in columns]
        self._memo: list[dict] = [{} for _ in columns]
        # A float feature entry has a fixed layout: a constant prefix, then 4 value bytes.
        self._float_prefix = {
            i: _entry(k, b"\x12\x06\x0a\x04" + b"\0\0\0\0")[:-4]
            for i, (c, k) in enumerate(zip(columns, self._keys)) if c.type == "float"
        }

        # An int entry's layout depends only on the varint's length (1-10 bytes).
        self._int_prefix = {
            i: {n: _int_prefix(k, n) for n in range(1, 11)}
            for i, (c, k) in enumerate(zip(columns, self._keys)) if c.type == "int"
        }

    def encode(self, columns: dict[str, Column]) -> list[bytes]:
        """One serialized Example per row of `columns`."""
        parts = []
        for i, c in enumerate(self.columns):
            values, present = columns[c.name].values, columns[c.name].present
            if c.type == "float":
                parts.append(self._floats(i, values, present))
            elif c.type == "int":
                parts.append(self._ints(i, values, present))
            else:
                parts.append(self._memoised(i, values.tolist(), present, self._bytes_entry))
        return [example_bytes(row) for row in zip(*parts)]

    def _floats(self, i: int, values: np.ndarray, present: np.ndarray) -> list[bytes]:
        value_bytes = values.astype("<f4").view(np.uint8).reshape(len(values), 4)
        entries = _rows_with_prefix(self._float_prefix[i], value_bytes)
        return _blank_missing(entries, present)

    def _ints(self, i: int, values: np.ndarray, present: np.ndarray) -> list[bytes]:
        """Int64 entries, varint-encoded column-wise: rows grouped by encoded length."""
        u = values.astype(np.int64).view(np.uint64)
        length = np.ones(len(u), dtype=np.int64)
        for k in range(1, 10):
            length += u >= np.uint64(1 << (7 * k))
        entries: list[bytes] = [b""] * len(u)
        prefixes = self._int_prefix[i]
        for n_bytes in np.unique(length).tolist():
            rows = np.flatnonzero(length == n_bytes)
            group = u[rows]
            varints = np.empty((len(rows), n_bytes), dtype=np.uint8)
            for j in range(n_bytes):
                byte = (group >> np.uint64(7 * j)) & np.uint64(0x7F)
                varints[:, j] = byte | np.uint64(0x80 if j < n_bytes - 1 else 0)
            for row, entry in zip(rows.tolist(), _rows_with_prefix(prefixes[n_bytes], varints)):
                entries[row] = entry
        return _blank_missing(entries, present)

    def _memoised(self, i: int, values: list, present: np.ndarray, make) -> list[bytes]:
        memo = self._memo[i]
        if len(memo) > _MEMO_LIMIT:
            memo.clear()
        memo[None] = b""  # a missing JSON/Parquet value
        key = self._keys[i]
        out = []
        append = out.append
        get = memo.get
        for v in values:
            e = get(v)
            if e is None:
                e = memo[v] = make(key, v)
            append(e)
        if not present.all():
            for j in np.flatnonzero(~present):
                out[j] = b""
        return out

    @staticmethod
    def _bytes_entry(key: bytes, v) -> bytes:
        return bytes_entry(key, v.encode("utf-8") if isinstance(v, str) else bytes(v))


def bytes_entry(key: bytes, data: bytes) -> bytes:
    """A feature map entry holding one bytes value."""
    bytes_list = b"\x0a" + _len_prefix(len(data)) + data
    return _entry(key, b"\x0a" + _len_prefix(len(bytes_list)) + bytes_list)


def int64_entry(key: bytes, value: int) -> bytes:
    """A feature map entry holding one int64 value."""
    packed = varint(value)
    int64_list = b"\x0a" + _len_prefix(len(packed)) + packed
    return _entry(key, b"\x1a" + _len_prefix(len(int64_list)) + int64_list)


def example_bytes(entries: Iterable[bytes]) -> bytes:
    """A serialized tf.train.Example from its feature map entries."""
    features = b"".join(entries)
    return b"\x0a" + _len_prefix(len(features)) + features


def _int_prefix(key: bytes, n_bytes: int) -> bytes:
    """The bytes of an int64 feature entry before its `n_bytes`-long varint."""
    placeholder = b"\x80" * (n_bytes - 1) + b"\x00"
    int64_list = b"\x0a" + _len_prefix(n_bytes) + placeholder
    entry = _entry(key, b"\x1a" + _len_prefix(len(int64_list)) + int64_list)
    return entry[:-n_bytes]


def _rows_with_prefix(prefix: bytes, values: np.ndarray) -> list[bytes]:
    """Row j: `prefix` + the bytes of values[j] (a uint8 matrix with one row per entry)."""
    n, width = values.shape[0], len(prefix) + values.shape[1]
    buf = np.empty((n, width), dtype=np.uint8)
    buf[:, : len(prefix)] = np.frombuffer(prefix, dtype=np.uint8)
    buf[:, len(prefix):] = values
    flat = buf.tobytes()
    return [flat[j: j + width] for j in range(0, n * width, width)]


def _blank_missing(entries: list[bytes], present: np.ndarray) -> list[bytes]:
    if not present.all():
        for j in np.flatnonzero(~present).tolist():
            entries[j] = b""
    return entries


def _masked_crc(data: bytes) -> bytes:
    crc = google_crc32c.value(data)
    return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


def tfrecord_frames(records: Iterable[bytes]) -> bytes:
    """Records in TFRecord framing (length, its masked CRC32C, the data, its masked CRC32C): an
    uncompressed TFRecord file's bytes."""
    parts = []
    for r in records:
        length = struct.pack("<Q", len(r))
        parts += (length, _masked_crc(length), r, _masked_crc(r))
    return b"".join(parts)


class GzipTFRecordWriter:
    """Writes TFRecord framing (length, masked CRC32C) through gzip, as TF's GZIP option does."""

    def __init__(self, path: str, level: int = 6):
        self.path = path
        self.records = 0
        self._file = FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED)
        self._zip = zlib.compressobj(level, zlib.DEFLATED, 31)  # wbits 31: gzip container
        self.bytes_written = 0

    def write(self, records: Iterable[bytes]) -> None:
        records = list(records)
        self.records += len(records)
        self._put(self._zip.compress(tfrecord_frames(records)))

    def _put(self, data: bytes) -> None:
        if data:
            self._file.write(data)
            self.bytes_written += len(data)

    def close(self) -> None:
        self._put(self._zip.flush())
        self._file.close()
