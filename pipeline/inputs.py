"""Find the inputs, hash them, and cut them into record-aligned work units.

The launcher reads every input once (it needs the sha256 for data.json anyway) and, in
the same pass, notes record boundaries every `grain` bytes: a newline, and for CSV one
outside any quoted field. Work units are contiguous runs of those grains, so Beam
workers can read byte ranges in parallel and still know each record's line number.
"""

from __future__ import annotations

import csv
import glob
import gzip
import hashlib
import io
import os
from dataclasses import dataclass

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from tfpipe.pipeline.autodetect import SAMPLE_BYTES, detect_delimiter, shown_delimiter
from tfpipe.pipeline.errors import DataError
from tfpipe.pipeline.sheets import is_workbook, sheet_as_csv

BLOCK = 8 << 20
_EXTENSIONS = {
    ".csv": "csv",
    ".tsv": "csv",
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
    ".pq": "parquet",
}


@dataclass(frozen=True)
class FoundFile:
    """An input file as listed, before it is read: where, which format, how big, when changed."""

    path: str
    format: str
    compressed: bool
    size: int
    mtime: float
    source: str | None = None  # the Excel workbook whose first sheet this CSV is (pipeline/sheets.py)


@dataclass(frozen=True)
class InputFile:
    path: str
    format: str
    compressed: bool
    size: int
    mtime: float
    sha256: str
    columns: tuple[str, ...] | None  # CSV header or Parquet column names; None for JSON Lines
    data_start: int  # byte offset of the first data record (after the CSV header)
    cuts: tuple[tuple[int, int], ...]  # record-aligned (byte offset, line number) grain starts
    row_groups: tuple[int, ...] = ()  # rows per Parquet row group
    delimiter: str = ","  # CSV: the field separator, given or detected
    header: str = ""  # CSV: the header line as written (for the error that says how it was split)


@dataclass(frozen=True)
class Segment:
    """A contiguous run of records of one file: bytes [start, end) or Parquet row groups."""

    path: str
    format: str
    compressed: bool
    columns: tuple[str, ...] | None
    start: int
    end: int | None  # None: to the end of the (decompressed) stream
    first_line: int  # 1-based line number (Parquet: row number) of the first record
    delimiter: str = ","  # CSV: the field separator


@dataclass(frozen=True)
class WorkUnit:
    index: int
    segments: tuple[Segment, ...]
    shards: tuple[int, ...]  # shard numbers this unit writes, rows dealt round-robin


def is_remote(path: str) -> bool:
    return "://" in path and not path.startswith("pkg://")


def package_path(path: str) -> str:
    """`pkg://PACKAGE/FILE` names a data file shipped inside an installed Python package."""
    from importlib.resources import files

    package, _, inner = path[len("pkg://"):].partition("/")
    try:
        return str(files(package).joinpath(inner))
    except ModuleNotFoundError:
        raise DataError(f"input {path}: Python package '{package}' is not installed") from None


def resolve_inputs(patterns: list[str], fmt: str) -> list[FoundFile]:
    """Expand paths and globs into the files they name, checking that each exists and is not empty."""
    if not patterns:
        raise DataError("no input given: pass --input PATH_OR_GLOB")
    found: list[FoundFile] = []
    seen = set()
    for pattern in patterns:
        if pattern.startswith("pkg://"):
            pattern = package_path(pattern)
        if is_remote(pattern):
            try:
                metas = FileSystems.match([pattern])[0].metadata_list
            except Exception as e:  # Beam raises its own BeamIOError subclasses per filesystem
                raise DataError(f"input {pattern}: {e}") from None
            entries = [(m.path, m.size_in_bytes, m.last_updated_in_seconds, None) for m in metas]
        else:
            if glob.has_magic(pattern):
                paths = sorted(glob.glob(pattern, recursive=True))
            elif os.path.isdir(pattern):
                raise DataError(f"input {pattern} is a directory with no class folders of images in it; give "
                                f"files or a glob like {pattern.rstrip('/')}/*.csv, or, for images, a folder "
                                "with one subfolder of images (jpg, png, bmp, gif) per class")
            elif not os.path.exists(pattern):
                raise DataError(f"input {pattern} does not exist")
            else:
                paths = [pattern]
            entries = []
            for p in paths:
                if os.path.isdir(p):
                    continue
                source = None
                if is_workbook(p):  # its first sheet, as CSV (pipeline/sheets.py)
                    source, p = os.path.abspath(p), sheet_as_csv(p)
                st = os.stat(p)
                entries.append((os.path.abspath(p), st.st_size, st.st_mtime, source))
        if not entries:
            raise DataError(f"no file matches {pattern}")
        for path, size, mtime, source in entries:
            if path in seen:
                continue
            seen.add(path)
            file_fmt, compressed = detect_format(path, fmt)
            if size == 0:
                raise DataError(f"input {path} is empty")
            found.append(FoundFile(path, file_fmt, compressed, size, mtime, source))
    return found


def detect_format(path: str, fmt: str) -> tuple[str, bool]:
    name = path.lower()
    compressed = name.endswith(".gz")
    if compressed:
        name = name[:-3]
    if fmt != "auto":
        return fmt, compressed
    for ext, f in _EXTENSIONS.items():
        if name.endswith(ext):
            return f, compressed
    raise DataError(f"cannot tell the format of {path} from its extension; pass --format csv|jsonl|parquet "
                    "(an Excel workbook is read as .xlsx)")


def open_raw(path: str):
    try:
        return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    except Exception as e:
        raise DataError(f"cannot read input {path}: {_reason(e)}") from None


def _reason(e: Exception) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    # Beam wraps OS errors as BeamIOError({path: OSError}); show the innermost reason.
    inner = getattr(e, "exception_details", None)
    if isinstance(inner, dict) and inner:
        return _reason(next(iter(inner.values())))
    return str(e)


def read_csv_header(first_line: bytes, path: str, delimiter: str = ",") -> tuple[str, ...]:
    """The column names of a CSV header line. A nameless first column is the row index pandas
    (`to_csv`) and R (`write.csv`) write: it is named `Unnamed: 0`, as pandas reads it back."""
    try:
        text = first_line.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise DataError(f"{path}: the header line is not valid UTF-8") from None
    header = next(csv.reader(io.StringIO(text), delimiter=delimiter), [])
    header = [h.strip() for h in header]
    if not header or all(h == "" for h in header):
        raise DataError(f"{path}: the first line must be a header naming the columns")
    if header[0] == "" and len(header) > 1:
        header[0] = "Unnamed: 0"
    dup = sorted({h for h in header if header.count(h) > 1})
    if dup:
        raise DataError(f"{path}: duplicate column name(s) in the header: {', '.join(dup)}")
    if "" in header:
        raise DataError(f"{path}: header column {header.index('') + 1} has no name "
                        f"(split on {shown_delimiter(delimiter)})")
    return tuple(header)


def csv_delimiter(path: str, head: bytes, requested: str, complete: bool) -> str:
    """The delimiter of a CSV file: `requested`, or with `auto` the one detected from `head`, its
    first bytes (`complete` when that is the whole file); a .tsv file prefers a tab."""
    if requested != "auto":
        return requested
    name = path.lower().removesuffix(".gz")
    text = head.decode("utf-8-sig", errors="replace")
    return detect_delimiter(text, complete, prefer="\t" if name.endswith(".tsv") else ",")


def read_head(found: FoundFile, n: int = SAMPLE_BYTES) -> bytes:
    """The first `n` bytes of a file's (decompressed) text."""
    with open_raw(found.path) as raw:
        if not found.compressed:
            return raw.read(n)
        try:
            with gzip.GzipFile(fileobj=raw) as g:
                return g.read(n)
        except (OSError, EOFError) as e:
            raise DataError(f"{found.path} is not a readable gzip file: {e}") from None


def file_delimiter(found: FoundFile, requested: str) -> str | None:
    """The delimiter a CSV input is read with (None for other formats), without scanning it whole."""
    if found.format != "csv":
        return None
    if requested != "auto":
        return requested
    head = read_head(found)
    return csv_delimiter(found.path, head, requested, len(head) < SAMPLE_BYTES)


def header_line(first_line: bytes) -> str:
    return first_line.decode("utf-8-sig", errors="replace").rstrip("\r\n")


def scan_file(found: FoundFile, grain: int, delimiter: str = "auto") -> InputFile:
    """Hash a file and note record-aligned cut points about every `grain` bytes (row groups for
    Parquet; none inside a gzip file, which is read whole). A CSV file's delimiter is
    `delimiter`, or detected from its head with `auto`."""
    if found.format == "parquet":
        return _scan_parquet(found)
    if found.compressed:
        return _scan_gzip(found, delimiter)
    return _scan_text(found, grain, delimiter)


def _scan_parquet(found: FoundFile) -> InputFile:
    """Its hash, columns, and one cut per row group."""
    path, fmt, size, mtime = found.path, found.format, found.size, found.mtime
    sha = _whole_file_sha256(path)
    try:
        import pyarrow.parquet as pq

        with open_raw(path) as f:
            meta = pq.ParquetFile(f).metadata
            columns = tuple(meta.schema.to_arrow_schema().names)
            groups = tuple(meta.row_group(i).num_rows for i in range(meta.num_row_groups))
    except DataError:
        raise
    except Exception as e:
        raise DataError(f"{path} is not a readable Parquet file: {e}") from None
    cuts = tuple((i, sum(groups[:i]) + 1) for i in range(len(groups)))
    return InputFile(path, fmt, False, size, mtime, sha, columns, 0, cuts, groups)


def _scan_gzip(found: FoundFile, requested: str) -> InputFile:
    """Its hash and, for CSV, the header line: a gzip stream cannot be entered midway."""
    path, fmt, size, mtime = found.path, found.format, found.size, found.mtime
    sha = _whole_file_sha256(path)
    if fmt != "csv":
        return InputFile(path, fmt, True, size, mtime, sha, None, 0, ((0, 1),))
    head = read_head(found)
    first = head.split(b"\n", 1)[0] + b"\n" if b"\n" in head else head
    if b"\n" not in head and len(head) == SAMPLE_BYTES:
        raise DataError(f"{path}: the header line is longer than {SAMPLE_BYTES >> 10} KB")
    delimiter = csv_delimiter(path, head, requested, len(head) < SAMPLE_BYTES)
    columns = read_csv_header(first, path, delimiter)
    return InputFile(path, fmt, True, size, mtime, sha, columns, len(first), ((len(first), 2),),
                     delimiter=delimiter, header=header_line(first))


def _scan_text(found: FoundFile, grain: int, requested: str = "auto") -> InputFile:
    """Hash a CSV or JSON Lines file block by block and cut it at the first record start after
    every `grain` bytes; in CSV a newline inside a quoted field starts no record."""
    path, fmt, size, mtime = found.path, found.format, found.size, found.mtime
    sha = hashlib.sha256()
    quote_aware = fmt == "csv"
    cuts: list[tuple[int, int]] = []
    columns = None
    delimiter, header = ",", ""
    data_start = 0
    lines = quotes = 0  # newlines and quote characters in the bytes before `counted`
    counted = 0
    offset = 0  # byte offset of the current block
    target = 0  # cut at the first record start at or after this offset
    with open_raw(path) as f:
        while True:
            block = f.read(BLOCK)
            if not block:
                break
            sha.update(block)
            if offset == 0 and fmt == "csv":
                nl = block.find(b"\n")
                if nl < 0 and size > len(block):
                    raise DataError(f"{path}: the header line is longer than {BLOCK >> 20} MB")
                first = block[: nl + 1] if nl >= 0 else block
                head = block[:SAMPLE_BYTES]
                delimiter = csv_delimiter(path, head, requested, len(head) == size)
                columns, header = read_csv_header(first, path, delimiter), header_line(first)
                data_start = target = len(first)
            while target < min(offset + len(block), size):
                rel = target - offset
                if target == data_start:
                    cut = rel
                else:
                    # A line starts right after a newline; search from rel-1 so a line
                    # starting exactly at `target` counts.
                    nl = block.find(b"\n", max(rel - 1, 0))
                    if nl < 0:
                        target = offset + len(block)
                        break
                    cut = nl + 1
                lines += block.count(b"\n", counted - offset, cut)
                if quote_aware:
                    quotes += block.count(b'"', counted - offset, cut)
                counted = offset + cut
                if quotes % 2:
                    target = counted + 1  # inside a quoted field: try the next line start
                    continue
                if counted < size:
                    cuts.append((counted, lines + 1))
                target = counted + grain
            lines += block.count(b"\n", counted - offset)
            if quote_aware:
                quotes += block.count(b'"', counted - offset)
            offset += len(block)
            counted = offset
    if fmt == "csv" and columns is None:
        raise DataError(f"{path}: the first line must be a header naming the columns")
    return InputFile(path, fmt, False, size, mtime, sha.hexdigest(), columns, data_start, tuple(cuts),
                     delimiter=delimiter, header=header)


def _whole_file_sha256(path: str) -> str:
    """The sha256 of a file's bytes as stored (compressed ones too), read block by block."""
    sha = hashlib.sha256()
    with open_raw(path) as f:
        _hash_stream(f, sha)
    return sha.hexdigest()


def _hash_stream(f, sha) -> None:
    while True:
        block = f.read(BLOCK)
        if not block:
            return
        sha.update(block)


def plan_units(files: list[InputFile], shards: int) -> list[WorkUnit]:
    """Partition all grains into at most `shards` contiguous, size-balanced work units."""
    grains: list[tuple[InputFile, int, int | None, int, int]] = []  # file, start, end, line, weight
    for f in files:
        if f.format == "parquet":
            for i, n in enumerate(f.row_groups):
                grains.append((f, i, i + 1, f.cuts[i][1], max(1, f.size * n // max(1, sum(f.row_groups)))))
        elif f.compressed:
            grains.append((f, f.data_start, None, f.cuts[0][1], f.size * 4))
        else:
            for i, (start, line) in enumerate(f.cuts):
                end = f.cuts[i + 1][0] if i + 1 < len(f.cuts) else f.size
                grains.append((f, start, end, line, end - start))
    if not grains:
        return []
    total = sum(g[4] for g in grains)
    n_units = min(shards, len(grains))
    groups: list[list] = [[] for _ in range(n_units)]
    before = 0
    for g in grains:
        # Assign by the grain's midpoint so units come out even in bytes.
        mid = before + g[4] / 2
        groups[min(n_units - 1, int(mid * n_units / total))].append(g)
        before += g[4]
    groups = [g for g in groups if g]
    units = []
    for u, group in enumerate(groups):
        segments: list[Segment] = []
        for f, start, end, line, _ in group:
            last = segments[-1] if segments else None
            if last and last.path == f.path and last.end == start:
                segments[-1] = Segment(f.path, f.format, f.compressed, f.columns, last.start, end, last.first_line,
                                       f.delimiter)
            else:
                segments.append(Segment(f.path, f.format, f.compressed, f.columns, start, end, line, f.delimiter))
        owned = tuple(s for s in range(shards) if s % len(groups) == u)
        units.append(WorkUnit(u, tuple(segments), owned))
    return units
