"""Read a segment of an input file as batches of typed, validated columns (validation.py's).

Each batch carries its good rows as numpy columns (with a presence mask per column) and
its bad rows as dead-letter entries with the reason. Reading streams in blocks, so memory
stays bounded however large the input is.
"""

from __future__ import annotations

import csv
import io
import json
import zlib
from typing import Any, Iterator

import numpy as np

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from tfpipe.pipeline.autodetect import decimal_comma_number
from tfpipe.pipeline.errors import DataError, worker_data_error
from tfpipe.pipeline.inputs import Segment
from tfpipe.pipeline.validation import Batch, Column, Validator, dead_row

BLOCK = 1 << 20  # bytes of text per batch: ~10k rows of a typical table
MAX_RECORD = 16 << 20  # a quoted CSV record longer than this is taken as broken quoting


def read_segment(seg: Segment, validator: Validator) -> Iterator[Batch]:
    """Yield validated batches of one segment, reading at most a block of text at a time."""
    try:
        yield from _read_segment(seg, validator)
    except Exception as e:
        problem = unreadable(seg.path, e)
        if problem is None:
            raise
        raise worker_data_error(problem) from None


def unreadable(path: str, e: Exception) -> str | None:
    """What to tell the user when reading `path` raised `e`; None for errors that are bugs."""
    if isinstance(e, (OSError, EOFError, zlib.error)):
        return f"input {path} is corrupt or unreadable: {e}"
    if type(e).__module__.startswith("pyarrow"):
        return f"input {path} is not readable Parquet: {e}"
    return None


def _read_segment(seg: Segment, validator: Validator) -> Iterator[Batch]:
    if seg.format == "parquet":
        yield from _read_parquet(seg, validator)
        return
    compression = CompressionTypes.GZIP if seg.compressed else CompressionTypes.UNCOMPRESSED
    quote_aware = seg.format == "csv"
    with FileSystems.open(seg.path, compression_type=compression) as f:
        if seg.compressed:
            _skip(f, seg.start)
        else:
            f.seek(seg.start)
        remaining = None if seg.end is None else seg.end - seg.start
        line = seg.first_line
        carry = b""
        while True:
            want = BLOCK if remaining is None else min(BLOCK, remaining)
            chunk = f.read(want) if want > 0 else b""
            if remaining is not None:
                remaining -= len(chunk)
            data = carry + chunk
            if not data:
                return
            final = not chunk
            cut = len(data) if final else _last_record_end(data, quote_aware)
            if cut <= 0 and len(data) > MAX_RECORD:
                # An unbalanced quote: no record ends in sight. Cut at a newline anyway so
                # memory stays bounded; the rows around the stray quote become dead letters.
                cut = data.rfind(b"\n") + 1
            if cut <= 0:
                carry = data
                continue
            carry = data[cut:]
            text = _decode(data[:cut])
            if seg.format == "csv":
                batch = validator.csv_batch(seg.path, seg.columns, text, line, seg.delimiter)
            else:
                batch = validator.jsonl_batch(seg.path, text, line)
            line += text.count("\n")
            if "\ufffd" in text:
                _reject_bad_utf8(batch)
                _reject_bad_utf8_unlabelled(batch)
            yield batch
            if final:
                return


def _skip(f, n: int) -> None:
    while n > 0:
        got = f.read(min(n, BLOCK))
        if not got:
            return
        n -= len(got)


def _last_record_end(data: bytes, quote_aware: bool) -> int:
    """Offset just past the last newline that ends a record (outside CSV quotes), or 0."""
    end = data.rfind(b"\n")
    if not quote_aware:
        return end + 1
    # `data` starts at a record boundary, so quotes before a record end are balanced.
    quotes = data.count(b'"', 0, end)
    while end >= 0 and quotes % 2:
        prev = data.rfind(b"\n", 0, end)
        quotes -= data.count(b'"', prev + 1, end)
        end = prev
    return end + 1


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("utf-8", errors="replace")


def _reject_bad_utf8(batch: Batch) -> None:
    bad = [i for i, raw in enumerate(batch.raws) if "\ufffd" in raw]
    if not bad:
        return
    keep = np.setdiff1d(np.arange(len(batch)), bad)
    for i in bad:
        batch.bad.append(dead_row(batch.source, int(batch.lines[i]), batch.raws[i], "not valid UTF-8"))
    batch.lines = batch.lines[keep]
    batch.raws = [batch.raws[i] for i in keep]
    if batch.keys is not None:
        batch.keys = [batch.keys[i] for i in keep]
    batch.columns = {k: Column(c.values[keep], c.present[keep]) for k, c in batch.columns.items()}


def _reject_bad_utf8_unlabelled(batch: Batch) -> None:
    """An unlabelled row that is not valid UTF-8 is bad, as a labelled one would be."""
    if any("\ufffd" in r["raw"] for r in batch.unlabelled):
        batch.bad += [dead_row(r["source"], r["line"], r["raw"], "not valid UTF-8")
                      for r in batch.unlabelled if "\ufffd" in r["raw"]]
        batch.unlabelled = [r for r in batch.unlabelled if "\ufffd" not in r["raw"]]


def _read_parquet(seg: Segment, validator: Validator) -> Iterator[Batch]:
    import pyarrow.parquet as pq

    with FileSystems.open(seg.path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        pf = pq.ParquetFile(f)
        row = seg.first_line
        for group in range(seg.start, seg.end):
            for rb in pf.iter_batches(batch_size=8192, row_groups=[group]):
                import pyarrow as pa

                table = pa.Table.from_batches([rb])
                yield validator.parquet_batch(seg.path, table, row)
                row += table.num_rows


def sample_records(files, limit: int) -> tuple[list[dict[str, Any]], bool]:
    """Up to `limit` raw records from the start of the inputs, shared across files, for
    schema inference. Returns (records, textual): CSV records hold strings."""
    per_file = max(1, -(-limit // len(files)))
    records: list[dict[str, Any]] = []
    textual = all(f.format == "csv" for f in files)
    for f in files:
        try:
            records.extend(_sample_file(f, per_file))
        except Exception as e:
            problem = unreadable(f.path, e)
            if problem is None:
                raise
            raise DataError(problem) from None
    return records, textual


def _sample_file(f, per_file: int) -> list[dict[str, Any]]:
    import gzip

    records: list[dict[str, Any]] = []
    if f.format == "parquet":
        import pyarrow.parquet as pq

        with FileSystems.open(f.path, compression_type=CompressionTypes.UNCOMPRESSED) as raw:
            for rb in pq.ParquetFile(raw).iter_batches(batch_size=min(per_file, 8192)):
                records.extend(rb.to_pylist()[: per_file - len(records)])
                if len(records) >= per_file:
                    break
        return records
    with FileSystems.open(f.path, compression_type=CompressionTypes.UNCOMPRESSED) as raw:
        stream = gzip.GzipFile(fileobj=raw) if f.compressed else raw
        text = io.TextIOWrapper(stream, encoding="utf-8", errors="replace", newline="")
        if f.format == "csv":
            reader = csv.reader(text, delimiter=f.delimiter)
            next(reader, None)  # header
            for row in reader:
                if len(row) == len(f.columns):
                    if f.delimiter == ";":  # as the reader will read them: 3,5 is the number 3.5
                        row = [decimal_comma_number(v) or v for v in row]
                    records.append(dict(zip(f.columns, row)))
                    if len(records) >= per_file:
                        break
        else:
            for line in text:
                try:
                    obj = json.loads(line)
                except ValueError:
                    continue
                if isinstance(obj, dict):
                    records.append(obj)
                    if len(records) >= per_file:
                        break
    return records
