"""Data stage: an Apache Beam job from raw CSV/JSONL/Parquet rows to validated, split,
sharded gzip TFRecords, with schema.json, stats.json and a dead-letter output."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("tfpipe")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+source"
