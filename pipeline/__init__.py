"""Data stage: an Apache Beam job from raw CSV/JSONL/Parquet rows to validated, split,
sharded gzip TFRecords, with schema.json, stats.json and a dead-letter output."""
