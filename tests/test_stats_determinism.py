"""stats.json is a function of the values a split holds: the same bytes however the rows were cut
into batches and work units, and in whatever order and grouping a runner merges the parts (as
Flink and Spark do, each its own way). Every case below feeds the same rows through the data
stage's combiners along different cuts and merge trees and compares the serialized output."""

from __future__ import annotations

import json
import math
import random
from fractions import Fraction

import numpy as np
import pytest

from tfpipe.pipeline.validation import Column
from tfpipe.pipeline.schema import Feature, Label, Schema
from tfpipe.pipeline.stats import (SCALE, Moments, QuantileSketch, SplitStatsFn, StringStats, exact_sum,
                                   exact_sum_of_squares)

N = 6000
rng = np.random.default_rng(36)
WORDS = np.array([f"w{i}" for i in range(300)], dtype=object)
COLUMNS = {
    "normal": rng.normal(size=N),
    "heavy": rng.exponential(size=N) ** 4 * 1e6,                 # spans many binades
    "tiny": rng.normal(size=N) * 1e-300,                          # subnormals and squares that underflow
    "huge": rng.normal(size=N) * 1e300,                           # squares that overflow a double
    "count": rng.poisson(3, size=N).astype(np.float64),          # few distinct values: exact quantiles
    "lat": 41.8 + rng.uniform(0, 0.2, size=N),                    # a narrow range far from zero
    "city": rng.choice(np.array(["Chicago", "Evanston", "Oak Park", "Cicero"], dtype=object), size=N),
    "id": np.array([f"c{i}" for i in rng.permutation(N)], dtype=object),  # more distinct values than a table
    "when": np.array([f"2024-{m:02d}-{d:02d} {h:02d}:05" for m, d, h in
                      zip(rng.integers(1, 13, N), rng.integers(1, 29, N), rng.integers(0, 24, N))], dtype=object),
    "note": np.array([" ".join(rng.choice(WORDS, size=5)) for _ in range(N)], dtype=object),
    "y": rng.choice(np.array(["a", "b", "c"], dtype=object), size=N),
}
PRESENT = {name: rng.uniform(size=N) > 0.05 for name in COLUMNS}
SCHEMA = Schema([Feature("normal", "float"), Feature("heavy", "float"), Feature("tiny", "float"),
                 Feature("huge", "float"), Feature("count", "float"), Feature("lat", "float"),
                 Feature("city", "string"), Feature("id", "string"), Feature("when", "string", kind="date"),
                 Feature("note", "string", kind="text")],
                Label("y", "string", "multiclass", ["a", "b", "c"]))


def _batches(cuts: list[int]) -> list[dict[str, Column]]:
    edges = [0, *cuts, N]
    return [{name: Column(values[a:b], PRESENT[name][a:b] | (name == "y")) for name, values in COLUMNS.items()}
            for a, b in zip(edges, edges[1:]) if b > a]


def _stats(cuts: list[int], units: int, seed: int, table: int | None = None) -> bytes:
    """The split's stats.json part: batches dealt into `units` accumulators in order (a work unit
    sees its rows in file order), then merged in an order and grouping `seed` draws."""
    fn = SplitStatsFn(SCHEMA.to_json(), top_k=10)
    batches = _batches(cuts)
    per_unit = np.array_split(np.arange(len(batches)), units)
    accs = []
    for indices in per_unit:
        acc = fn.create_accumulator()
        if table:
            acc["id"] = StringStats(10, table)
        for i in indices:
            acc = fn.add_input(acc, batches[i])
        accs.append(acc)
    order = random.Random(seed)
    while len(accs) > 1:  # a random merge tree: any few of the parts at a time, as a runner's shuffle hands them
        order.shuffle(accs)
        k = order.randint(2, min(4, len(accs)))
        accs = [fn.merge_accumulators(accs[:k]), *accs[k:]]
    return json.dumps(fn.extract_output(accs[0])).encode()


CUTS = [
    ([], 1),                                   # one batch, one unit
    (list(range(500, N, 500)), 1),             # the reader's batches, one unit
    (list(range(500, N, 500)), 4),             # four work units
    (list(range(250, N, 250)), 8),
    (sorted(random.Random(5).sample(range(1, N), 40)), 13),  # uneven batches, odd units
    (list(range(1, 40)) + list(range(100, N, 997)), 7),        # tiny batches next to big ones
]


@pytest.mark.parametrize("table", [None, 512])  # 512: the `id` column's values outgrow the table
def test_the_same_rows_give_the_same_bytes_whatever_the_cut_and_merge_order(table):
    reference = _stats([], 1, 0, table)
    for (cuts, units), seed in zip(CUTS, range(1, 100)):
        for again in range(3):
            assert _stats(cuts, units, seed * 10 + again, table) == reference, (len(cuts), units, seed, again)
    stats = json.loads(reference)
    if table:
        assert stats["features"]["id"]["unique_is_lower_bound"] and stats["features"]["id"]["unique"] <= 512
    else:
        assert stats["features"]["id"]["unique"] == int(PRESENT["id"].sum())


@pytest.mark.parametrize("name", ["normal", "heavy", "tiny", "huge", "count", "lat"])
def test_mean_and_variance_are_the_correctly_rounded_exact_ones(name):
    values = COLUMNS[name][PRESENT[name]]
    moments = Moments()
    for part in np.array_split(values, 9):
        moments.add(part)
    exact = [Fraction(v) for v in values.tolist()]
    mean = sum(exact) / len(exact)
    variance = sum((v - mean) ** 2 for v in exact) / len(exact)
    assert moments.mean == float(mean)
    assert moments.variance == (float(variance) if variance < Fraction(1.7e308) else math.inf)
    assert float(Fraction(exact_sum(values), 2**SCALE)) == math.fsum(values.tolist())
    assert Fraction(exact_sum_of_squares(values), 2**(2 * SCALE)) == sum(v * v for v in exact)


@pytest.mark.parametrize("name", ["normal", "heavy", "lat", "count"])
def test_quantiles_hold_their_rank_within_a_tenth_of_a_percent(name):
    values = np.concatenate([COLUMNS[name]] * 30)  # 180,000 values: far more distinct ones than bins
    sketch = QuantileSketch()
    for part in np.array_split(values, 17):
        sketch.add(part)
    ordered = np.sort(values)
    qs = (0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99)
    for q, got in zip(qs, sketch.quantiles(qs), strict=True):
        lo, hi = np.searchsorted(ordered, got, "left"), np.searchsorted(ordered, got, "right")
        want = q * len(values)
        error = 0.0 if lo <= want <= hi else min(abs(lo - want), abs(hi - want)) / len(values)
        assert error <= 0.001, (q, got, error)
    if name == "count":  # a bin per distinct value: numpy's own inverted_cdf quantiles
        assert sketch.quantiles(qs) == [float(np.quantile(values, q, method="inverted_cdf")) for q in qs]


def test_image_statistics_are_the_same_whatever_the_merge_order():
    from tfpipe.pipeline.images import ImageInfo, ImageStats

    infos = []
    for i in range(500):
        h, w = int(rng.integers(8, 300)), int(rng.integers(8, 300))
        levels = rng.integers(0, 256, size=(3, 50))
        infos.append((ImageInfo("png", h, w, b"", levels.sum(axis=1), (levels ** 2).sum(axis=1), 50),
                      ["cat", "dog"][i % 2]))

    def stats(parts: int, seed: int) -> bytes:
        accs = []
        for chunk in np.array_split(np.arange(len(infos)), parts):
            acc = ImageStats()
            for i in chunk:
                acc.add(*infos[i])
            accs.append(acc)
        random.Random(seed).shuffle(accs)
        while len(accs) > 1:
            accs = [accs[0].merge(accs[1]), *accs[2:]] if seed % 2 else [*accs[:-2], accs[-2].merge(accs[-1])]
        return json.dumps(accs[0].to_json()).encode()

    reference = stats(1, 0)
    assert all(stats(parts, seed) == reference for parts, seed in [(2, 1), (7, 2), (13, 3), (500, 4)])
    assert json.loads(reference)["height"]["quantiles"][4] == float(np.quantile(
        [i.height for i, _ in infos], 0.5, method="inverted_cdf"))
