"""The data job's Beam transforms one at a time, on a few rows, with Beam's TestPipeline and
assert_that (as Beam's own examples test theirs): the reader's dead-letter tagging, the split,
the encoder and the statistics combiner. The CLI's end-to-end tests are in test_data.py."""

from __future__ import annotations

import apache_beam as beam
import numpy as np
import pytest
import tensorflow as tf
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from tfpipe.pipeline.inputs import Segment, WorkUnit
from tfpipe.pipeline.validation import Batch, Column
from tfpipe.pipeline.schema import Feature, Label, Schema
from tfpipe.pipeline.stats import SplitStatsFn
from tfpipe.pipeline.transforms import (BAD, AssignSplits, BadRows, EncodeExamples, ReadAndValidate, SplitBatch,
                                        UnitBatch, UnitEnd)

SCHEMA = Schema([Feature("x", "float"), Feature("color", "string")], Label("y", "string", "multiclass", ["a", "b"]),
                enforced=True)


def pipeline() -> TestPipeline:
    return TestPipeline(argv=["--runner=FnApiRunner"])  # Beam's default would fetch Prism


def read_csv(p: TestPipeline, path, rows: str):
    """The reader's (good, BAD) outputs for one work unit: `rows` after SCHEMA's header line."""
    header = "x,color,y\n"
    path.write_text(header + rows)
    seg = Segment(str(path), "csv", False, ("x", "color", "y"), len(header), None, 2)
    return (p | beam.Create([WorkUnit(0, (seg,), (0,))])
            | beam.ParDo(ReadAndValidate(SCHEMA.to_json(), True, [])).with_outputs(BAD, main="good"))


def test_the_reader_tags_bad_rows_and_accounts_for_every_row(tmp_path):
    """Five rows in: three good ones out as a batch, two on the BAD output with their line and
    reason, and a UnitEnd on both outputs counting all five."""
    with pipeline() as p:
        out = read_csv(p, tmp_path / "rows.csv", "1.5,red,a\nnot-a-number,blue,b\n2.5,,b\n3.5,green,c\n4.5,red,a\n")
        good = out.good | "good rows" >> beam.Map(
            lambda e: ("end", e.read, e.bad) if isinstance(e, UnitEnd) else
            ("rows", [float(v) for v in e.batch.columns["x"].values], list(e.batch.lines)))
        bad = out[BAD] | "bad rows" >> beam.FlatMap(
            lambda e: [("end", e.read, e.bad)] if isinstance(e, UnitEnd) else
            [("bad", r["line"], r["reason"].split(":")[0]) for r in e.rows])
        assert_that(good, equal_to([("rows", [1.5, 2.5, 4.5], [2, 4, 6]), ("end", 5, 2)]), label="good")
        assert_that(bad, equal_to([("bad", 3, "column 'x'"),
                                   ("bad", 5, "label value 'c' is not one of the schema's classes"),
                                   ("end", 5, 2)]), label="bad")


def _batch(keys: list[str] | None, n: int) -> UnitBatch:
    return UnitBatch(0, Batch("rows.csv", np.arange(n) + 2, [f"row {i}" for i in range(n)], keys,
                              {"x": Column(np.arange(n, dtype=np.float64), np.ones(n, bool))}))


def test_the_split_is_a_stable_hash_of_the_key_and_keeps_every_row():
    """Rows with the same key land in the same split; all 400 rows come out, each once, in splits
    of about the weights asked for; a UnitEnd passes through."""
    keys = [f"user{i % 40}" for i in range(400)]
    with pipeline() as p:
        out = (p | beam.Create([_batch(keys, 400), UnitEnd(0, 400, 0)])
               | beam.ParDo(AssignSplits({"train": 80, "eval": 10, "test": 10})))
        rows = out | beam.FlatMap(lambda e: [] if isinstance(e, UnitEnd) else
                                  [(int(x), e.split) for x in e.columns["x"].values])
        ends = out | beam.Filter(lambda e: isinstance(e, UnitEnd)) | beam.Map(lambda e: e.read)

        def check(pairs):
            assert sorted(x for x, _ in pairs) == list(range(400))  # each row exactly once
            split_of_key: dict[str, set] = {}
            for x, split in pairs:
                split_of_key.setdefault(keys[x], set()).add(split)
            assert all(len(s) == 1 for s in split_of_key.values())  # a key never straddles splits
            counts = {s: sum(1 for _, t in pairs if t == s) for s in ("train", "eval", "test")}
            assert 240 <= counts["train"] <= 380 and counts["eval"] + counts["test"] >= 20, counts
        assert_that(rows, check, label="rows")
        assert_that(ends, equal_to([400]), label="ends")


def test_the_encoder_writes_examples_tensorflow_parses():
    """A SplitBatch's columns as serialized tf.train.Examples: a missing value is an absent feature."""
    columns = {"x": Column(np.array([1.5, 0.0]), np.array([True, False])),
               "color": Column(np.array(["red", "blue"], dtype=object), np.array([True, True])),
               "y": Column(np.array(["a", "b"], dtype=object), np.array([True, True]))}
    with pipeline() as p:
        out = (p | beam.Create([SplitBatch(0, "train", columns)])
               | beam.ParDo(EncodeExamples(SCHEMA.to_json(), True))
               | beam.FlatMap(lambda e: e.records))

        def parsed(records):
            assert len(records) == 2
            got = []
            for r in records:
                feature = tf.train.Example.FromString(r).features.feature
                got.append((list(feature["x"].float_list.value), feature["color"].bytes_list.value[0],
                            feature["y"].bytes_list.value[0]))
            assert sorted(got) == [([], b"blue", b"b"), ([1.5], b"red", b"a")]
        assert_that(out, parsed)


def test_the_stats_combiner_merges_batches_into_one_splits_statistics():
    """Two batches of one split combine (through merge_accumulators across bundles) into the
    statistics of all their rows: count, missing, mean and top values."""
    def batch(xs, colors, ys):
        present = np.array([x is not None for x in xs])
        return {"x": Column(np.array([x if x is not None else 0.0 for x in xs], dtype=np.float64), present),
                "color": Column(np.array(colors, dtype=object), np.array([c != "" for c in colors])),
                "y": Column(np.array(ys, dtype=object), np.ones(len(ys), bool))}
    with pipeline() as p:
        stats = (p | beam.Create([batch([1.0, 3.0], ["red", "red"], ["a", "b"]),
                                  batch([None, 5.0, 7.0], ["blue", "", "red"], ["a", "a", "b"])])
                 | beam.CombineGlobally(SplitStatsFn(SCHEMA.to_json(), top_k=5)))

        def check(results):
            (s,) = results
            x, color = s["features"]["x"], s["features"]["color"]
            assert s["rows"] == 5
            assert (x["count"], x["missing"]) == (4, 1) and x["mean"] == pytest.approx(4.0)
            assert (x["min"], x["max"]) == (1.0, 7.0)
            assert tuple(color["top"][0]) == ("red", 3)
            assert color["missing"] == 1
            assert s["label"]["distribution"] == {"a": 3, "b": 2}
        assert_that(stats, check)


def test_bad_rows_keep_their_raw_text_for_the_dead_letter(tmp_path):
    """A bad row's dead-letter entry keeps the raw line, so nothing of the input is lost."""
    with pipeline() as p:
        bad = read_csv(p, tmp_path / "rows.csv", "oops,red,a\n")[BAD]
        raws = bad | beam.FlatMap(lambda e: [r["raw"] for r in e.rows] if isinstance(e, BadRows) else [])
        assert_that(raws, equal_to(["oops,red,a"]))
