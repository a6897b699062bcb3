"""Behaviour of `tfpipe data`: through the CLI and through pipeline.job.run, with real Beam
and the TFRecords read back with tf.data."""

from __future__ import annotations

import csv
import glob
import gzip
import hashlib
import json
import os
import re
import signal
import time
from collections import Counter

import numpy as np
import pytest

from conftest import raw_records, read_split, run_cli, spawn_cli
from tfpipe.pipeline.config import DataConfig
from tfpipe.pipeline.errors import DataError
from tfpipe.pipeline.job import run
from tfpipe.stage import DataOutputs


def run_stage(log=None, **kw) -> str:
    lines = log if log is not None else []
    return run(DataConfig(**kw), log=lines.append).outputs.path


def load(out: str, name: str) -> dict:
    return json.load(open(os.path.join(out, name)))


def read_csv(path: str) -> tuple[list[str], list[list[str]]]:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], rows[1:]


# ---- penguins through the CLI ----------------------------------------------------------------

def test_penguins_cli_counts_schema_splits_and_stats(tmp_path, penguins_csv):
    out = tmp_path / "data"
    res = run_cli("data", "--input", penguins_csv, "--label", "species", "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert "rows read 344 = written 344 + dead-letter 0" in res.stdout
    assert res.stderr.strip() == ""  # no Beam chatter, no warnings

    schema = load(out, "schema.json")
    types = {f["name"]: (f["type"], f["nullable"]) for f in schema["features"]}
    assert types == {
        "island": ("string", False), "bill_length_mm": ("float", True), "bill_depth_mm": ("float", True),
        "flipper_length_mm": ("int", True), "body_mass_g": ("int", True), "sex": ("string", True),
        "year": ("int", False),
    }
    assert schema["label"] == {"name": "species", "type": "string", "task": "multiclass",
                               "classes": ["Adelie", "Chinstrap", "Gentoo"]}

    manifest = load(out, "data.json")
    counts = manifest["counts"]
    assert counts["read"] == 344 and counts["bad"] == 0
    header, rows = read_csv(penguins_csv)
    assert manifest["inputs"][0]["sha256"] == hashlib.sha256(open(penguins_csv, "rb").read()).hexdigest()

    stats = load(out, "stats.json")
    seen_species = Counter()
    total = 0
    for split in ("train", "eval", "test"):
        cols = read_split(str(out), split)
        n = len(cols["species"][0])
        assert n == counts["splits"][split] == stats["splits"][split]["rows"]
        total += n
        seen_species.update(v.decode() for v in cols["species"][0])
        # Stats against numpy on the very rows written to this split.
        for name in ("bill_length_mm", "body_mass_g"):
            values, present = cols[name]
            values = values[present].astype(np.float64)
            got = stats["splits"][split]["features"][name]
            assert got["count"] == len(values) and got["missing"] == int((~present).sum())
            assert got["mean"] == pytest.approx(values.mean(), rel=1e-5)
            assert got["variance"] == pytest.approx(values.var(), rel=1e-4)
            assert got["min"] == pytest.approx(values.min(), rel=1e-6)
            assert got["max"] == pytest.approx(values.max(), rel=1e-6)
        island = stats["splits"][split]["features"]["island"]
        assert dict(island["top"]) == dict(Counter(v.decode() for v in cols["island"][0]))
        assert stats["splits"][split]["label"]["distribution"] == dict(
            Counter(v.decode() for v in cols["species"][0]))
    assert total == 344
    assert seen_species == Counter(r[0] for r in rows)
    # 80/10/10 by hash on 344 rows: loose bounds, the exact fractions are checked on 15k rows below.
    assert 0.7 < counts["splits"]["train"] / 344 < 0.9


def test_penguins_missing_values_are_absent_features(tmp_path, penguins_csv):
    out = run_stage(input=[penguins_csv], label="species", out=str(tmp_path / "d"))
    header, rows = read_csv(penguins_csv)
    na_in_csv = sum(r[header.index("bill_length_mm")] == "NA" for r in rows)
    missing = sum(int((~read_split(out, s)["bill_length_mm"][1]).sum()) for s in ("train", "eval", "test"))
    assert na_in_csv == 2 and missing == 2


# ---- Chicago taxi ----------------------------------------------------------------------------

def test_chicago_taxi_schema_stats_and_split_fractions(tmp_path, chicago_csv):
    out = run_stage(input=[chicago_csv], label="big_tipper", exclude=["tips"], out=str(tmp_path / "d"),
                    shards=3)
    schema = load(out, "schema.json")
    names = [f["name"] for f in schema["features"]]
    assert "tips" not in names and "big_tipper" not in names and len(names) == 17
    types = {f["name"]: f["type"] for f in schema["features"]}
    assert types["fare"] == "float" and types["trip_start_timestamp"] == "int"
    assert types["company"] == "string" and types["pickup_latitude"] == "float"
    assert schema["label"]["task"] == "binary" and schema["label"]["classes"] == [0, 1]

    header, rows = read_csv(chicago_csv)
    counts = load(out, "data.json")["counts"]
    assert counts["read"] == len(rows) == 15002 and counts["bad"] == 0
    # Hash split on 15k rows lands within a point of the requested 80/10/10.
    for split, want in (("train", 0.8), ("eval", 0.1), ("test", 0.1)):
        assert abs(counts["splits"][split] / len(rows) - want) < 0.01
        assert len(glob.glob(os.path.join(out, f"{split}-*-of-00003.tfrecord.gz"))) == 3

    stats = load(out, "stats.json")["splits"]
    i_lat, i_fare, i_label = header.index("pickup_latitude"), header.index("fare"), header.index("big_tipper")
    # Missing counts and label distribution over all splits match the CSV itself.
    assert sum(s["features"]["pickup_latitude"]["missing"] for s in stats.values()) == \
        sum(r[i_lat] == "" for r in rows)
    dist = Counter()
    for s in stats.values():
        dist.update(s["label"]["distribution"])
    assert dist == Counter(r[i_label] for r in rows)
    # Numeric stats and quantiles of the train split against numpy on the rows read back.
    train = read_split(out, "train")
    fares = train["fare"][0][train["fare"][1]].astype(np.float64)
    got = stats["train"]["features"]["fare"]
    assert got["mean"] == pytest.approx(fares.mean(), rel=1e-5)
    assert got["variance"] == pytest.approx(fares.var(), rel=1e-4)
    for q, value in got["quantiles"].items():
        rank = np.searchsorted(np.sort(fares), value, side="right") / len(fares)
        lo = np.searchsorted(np.sort(fares), value, side="left") / len(fares)
        assert lo - 0.01 <= float(q) <= rank + 0.01, (q, value, lo, rank)
    full = np.array([float(r[i_fare]) for r in rows])
    assert sum(s["features"]["fare"]["count"] for s in stats.values()) == len(full)
    # TFRecords carry no excluded column.
    import tensorflow as tf

    ex = tf.train.Example.FromString(raw_records(out, "eval")[0])
    assert "tips" not in ex.features.feature and "big_tipper" in ex.features.feature


def test_split_is_deterministic_across_runs_shards_and_runners(tmp_path, chicago_csv):
    rows = tmp_path / "chicago.csv"  # the sample's first 4,000 rows: several bundles, three runs
    with open(chicago_csv) as f:
        rows.write_text("".join(line for _, line in zip(range(4001), f)))
    a = run_stage(input=[str(rows)], label="big_tipper", exclude=["tips"], out=str(tmp_path / "a"))
    b = run_stage(input=[str(rows)], label="big_tipper", exclude=["tips"], out=str(tmp_path / "b"))
    c = run_stage(input=[str(rows)], label="big_tipper", exclude=["tips"], out=str(tmp_path / "c"),
                  shards=4, beam_args=["--runner=BundleBasedDirectRunner"])
    for split in ("train", "eval", "test"):
        fa = sorted(glob.glob(os.path.join(a, f"{split}-*")))
        fb = sorted(glob.glob(os.path.join(b, f"{split}-*")))
        # Same inputs and options: byte-identical files.
        assert [open(x, "rb").read() for x in fa] == [open(x, "rb").read() for x in fb]
        # Another runner and another sharding: the same rows in each split.
        assert Counter(raw_records(a, split)) == Counter(raw_records(c, split))
    assert load(a, "data.json")["counts"] == load(c, "data.json")["counts"]


def test_key_column_decides_the_split(tmp_path, penguins_csv):
    # With a key, a row's split depends on its key alone: the same ids go to the same splits
    # whatever the file format or the rest of the row.
    header, rows = read_csv(penguins_csv)
    csv_path = tmp_path / "p.csv"
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", *header])
        for i, r in enumerate(rows):
            w.writerow([i, *r])
    jsonl = tmp_path / "p.jsonl.gz"
    with gzip.open(jsonl, "wt") as f:
        for i, r in enumerate(rows):
            rec = {"id": i, **{h: (None if v == "NA" else v) for h, v in zip(header, r)}}
            for num in ("bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g", "year"):
                if rec[num] is not None:
                    rec[num] = float(rec[num]) if "." in rec[num] else int(rec[num])
            f.write(json.dumps(rec) + "\n")
    # (the id is a row ID, left out of the features unless kept: kept here to read the splits back)
    a = run_stage(input=[str(csv_path)], label="species", key="id", keep_column=["id"], out=str(tmp_path / "a"))
    b = run_stage(input=[str(jsonl)], label="species", key="id", keep_column=["id"], out=str(tmp_path / "b"))
    for split in ("train", "eval", "test"):
        ids_a = sorted(read_split(a, split)["id"][0].tolist())
        ids_b = sorted(read_split(b, split)["id"][0].tolist())
        assert ids_a == ids_b and ids_a


# ---- formats -----------------------------------------------------------------------------------

def test_jsonl_parquet_gzip_and_globs(tmp_path, penguins_csv):
    import pyarrow as pa
    import pyarrow.parquet as pq

    header, rows = read_csv(penguins_csv)
    half = len(rows) // 2
    parts = tmp_path / "parts"
    parts.mkdir()
    for i, chunk in enumerate((rows[:half], rows[half:])):
        with gzip.open(parts / f"part{i}.csv.gz", "wt", newline="") as f:
            w = csv.writer(f)
            w.writerow(header)
            w.writerows(chunk)
    out = run_stage(input=[str(parts / "*.csv.gz")], label="species", out=str(tmp_path / "gz"))
    m = load(out, "data.json")
    assert m["counts"]["read"] == 344 and len(m["inputs"]) == 2 and all(i["compressed"] for i in m["inputs"])

    def typed(v, h):
        if v == "NA":
            return None
        if h in ("bill_length_mm", "bill_depth_mm"):
            return float(v)
        if h in ("flipper_length_mm", "body_mass_g", "year"):
            return int(v)
        return v

    records = [{h: typed(v, h) for h, v in zip(header, r)} for r in rows]
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "p.parquet", row_group_size=100)
    out = run_stage(input=[str(tmp_path / "p.parquet")], label="species", out=str(tmp_path / "pq"), shards=2)
    m = load(out, "data.json")
    assert m["counts"]["read"] == 344 and m["counts"]["bad"] == 0
    schema = load(out, "schema.json")
    assert {f["name"]: f["type"] for f in schema["features"]}["bill_depth_mm"] == "float"
    cols = read_split(out, "train")
    assert cols["body_mass_g"][0].dtype == np.int64

    with open(tmp_path / "p.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    out = run_stage(input=[str(tmp_path / "p.jsonl")], label="species", out=str(tmp_path / "js"))
    assert load(out, "data.json")["counts"]["read"] == 344
    assert load(out, "schema.json")["features"] == schema["features"]


# ---- bad rows ----------------------------------------------------------------------------------

BAD_CSV = (
    "id,x,n,city,label\n"          # line 1
    "1,0.5,3,Oslo,yes\n"           # 2 good
    "2,abc,3,Oslo,no\n"            # 3 unparsable float
    "3,0.1,4,Rome\n"               # 4 wrong column count
    "4,0.2,5,Rome,\n"              # 5 missing label
    '5,0.3,6,"New\nYork",yes\n'    # 6-7 good, quoted newline
    "6,inf,7,Oslo,no\n"            # 8 non-finite
    "7,0.4,9.5,Oslo,no\n"          # 9 float where int
    "8,0.6,1,Lima,yes,extra\n"     # 10 wrong column count
    "9,0.7,2,,no\n"                # 11 good (missing city)
)


def write_bad_inputs(tmp_path) -> tuple[str, str]:
    good = "".join(f"{100 + i},{i / 10},{i},Oslo,{'yes' if i % 2 else 'no'}\n" for i in range(100))
    csv_path = tmp_path / "bad.csv"
    csv_path.write_bytes((BAD_CSV + good).encode() + b"200,0.9,1,Z\xffrich,yes\n")
    jsonl_path = tmp_path / "bad.jsonl"
    jsonl_path.write_text(
        '{"id": 1, "x": 0.5, "n": 3, "city": "Oslo", "label": "yes"}\n'
        '{"id": 2, "x": "0.5", "n": 3, "city": "Oslo", "label": "no"}\n'
        '{"id": 3, "x": 0.5, "n": 3, "city": "Oslo", "label": "no"}\n'
        '{"id": 4, "x": 0.5, "n": [1, 2], "city": "Oslo", "label": "no"}\n'
        '{"id": 5, "x": 0.5, "n": 3, "city": "Oslo", "label": "no"\n'
        '[1, 2, 3]\n'
        + "".join(f'{{"id": {10 + i}, "x": {i}.5, "n": {i}, "city": "Rome", "label": "yes"}}\n' for i in range(100))
        # line 107, past the rows schema inference samples below: a key it never saw
        + '{"id": 3, "x": 0.5, "n": 3, "city": "Oslo", "label": "no", "colour": "red"}\n'
    )
    return str(csv_path), str(jsonl_path)


def test_bad_rows_go_to_dead_letter_with_reasons(tmp_path):
    csv_path, jsonl_path = write_bad_inputs(tmp_path)
    # Inference sees 'abc', 'inf' and '9.5' too, but a column stays numeric when 98% of it is.
    out = run_stage(input=[csv_path], label="label", out=str(tmp_path / "c"), max_bad_fraction=0.5,
                    keep_column=["id"])
    assert {f["name"]: f["type"] for f in load(out, "schema.json")["features"]} == \
        {"id": "int", "x": "float", "n": "int", "city": "string"}
    dead = [json.loads(line) for p in glob.glob(os.path.join(out, "deadletter", "*.jsonl")) for line in open(p)]
    by_line = {d["line"]: d for d in dead}
    assert set(by_line) == {3, 4, 8, 9, 10, 112}
    assert all(d["source"] == csv_path for d in dead)
    assert "'abc' is not a float" in by_line[3]["reason"] and by_line[3]["raw"] == "2,abc,3,Oslo,no"
    assert by_line[4]["reason"] == "expected 5 columns, got 4"
    assert "not a finite number" in by_line[8]["reason"]
    assert "'9.5' is not an int" in by_line[9]["reason"]
    assert by_line[10]["reason"] == "expected 5 columns, got 6"
    assert by_line[112]["reason"] == "not valid UTF-8"
    # line 5 has no label: set aside, not bad
    aside = [json.loads(line) for p in glob.glob(os.path.join(out, "unlabelled", "*.jsonl")) for line in open(p)]
    assert aside == [{"source": csv_path, "line": 5, "raw": "4,0.2,5,Rome,"}]
    m = load(out, "data.json")
    assert m["counts"]["read"] == 110 and m["counts"]["bad"] == 6 and m["counts"]["written"] == 103
    assert m["counts"]["unlabelled"] == 1 and m["outputs"]["unlabelled"] == ["unlabelled/part-00000.jsonl"]
    # The quoted newline survived as one value.
    cities = [v.decode() for s in ("train", "eval", "test") for v in read_split(out, s)["city"][0]]
    assert "New\nYork" in cities

    out = run_stage(input=[jsonl_path], label="label", out=str(tmp_path / "j"), max_bad_fraction=0.5,
                    infer_rows=60)
    dead = [json.loads(line) for p in glob.glob(os.path.join(out, "deadletter", "*.jsonl")) for line in open(p)]
    reasons = {d["line"]: d["reason"] for d in dead}
    assert "'0.5' is not a float" in reasons[2]  # type drift: a string where the schema says float
    assert reasons[107] == "unknown column(s) colour"
    assert "nested value" in reasons[4]
    assert reasons[5].startswith("invalid JSON")
    assert reasons[6] == "not a JSON object"
    m = load(out, "data.json")
    assert m["counts"]["read"] == 107 and m["counts"]["bad"] == 5


def test_too_many_bad_rows_fails_with_counts_and_reasons(tmp_path):
    csv_path, _ = write_bad_inputs(tmp_path)
    out = tmp_path / "out"
    res = run_cli("data", "--input", csv_path, "--label", "label", "--out", str(out))
    assert res.returncode == 2
    assert "6 of 109 labelled rows are bad (5.50%), over --max-bad-fraction 0.01" in res.stderr
    assert f"{csv_path}:3: column 'x': 'abc' is not a float" in res.stderr
    assert "Traceback" not in res.stderr
    assert not out.exists() and not glob.glob(str(tmp_path / ".out.tmp-*"))


# ---- cache, force, atomicity ----------------------------------------------------------------------

def test_rerun_is_a_cache_hit_until_inputs_or_options_change(tmp_path, penguins_csv):
    src = tmp_path / "p.csv"
    src.write_bytes(open(penguins_csv, "rb").read())
    out = str(tmp_path / "d")
    run_stage(input=[str(src)], label="species", out=out)
    first = load(out, "data.json")

    log: list[str] = []
    run_stage(log, input=[str(src)], label="species", out=out)
    assert any("cache hit" in line for line in log) and not any("running Beam" in line for line in log)
    assert load(out, "data.json") == first

    os.utime(src, (time.time() + 10, time.time() + 10))  # touched, same content: still a hit
    log = []
    run_stage(log, input=[str(src)], label="species", out=out)
    assert any("cache hit" in line and "by content" in line for line in log)

    log = []
    run_stage(log, input=[str(src)], label="species", out=out, force=True)
    assert any("running Beam" in line for line in log)
    assert load(out, "data.json")["fingerprint"] == first["fingerprint"]

    log = []
    run_stage(log, input=[str(src)], label="species", out=out, split={"train": 50, "eval": 50})
    assert any("running Beam" in line for line in log)
    assert set(load(out, "data.json")["counts"]["splits"]) == {"train", "eval"}
    assert not glob.glob(os.path.join(out, "test-*"))  # the old output was replaced whole

    with open(src, "a") as f:
        f.write("Adelie,Dream,40.0,18.0,190,3700,male,2009\n")
    log = []
    run_stage(log, input=[str(src)], label="species", out=out, split={"train": 50, "eval": 50})
    assert load(out, "data.json")["counts"]["read"] == 345


def _big_csv(path, rows: int) -> None:
    rng = np.random.default_rng(1)
    with open(path, "w") as f:
        f.write("a,b,c,label\n")
        for start in range(0, rows, 50000):
            n = min(50000, rows - start)
            cols = [rng.normal(size=n).round(5).astype(str), rng.integers(0, 1000, n).astype(str),
                    np.array(["x", "y", "z"])[rng.integers(0, 3, n)], rng.integers(0, 2, n).astype(str)]
            f.write("\n".join(",".join(r) for r in zip(*cols)) + "\n")


@pytest.fixture(scope="module")
def big_csv(tmp_path_factory):
    """400,000 rows: long enough to still be running when a test interrupts it."""
    src = tmp_path_factory.mktemp("big") / "big.csv"
    _big_csv(src, 400_000)
    return src


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_interrupted_run_leaves_no_output(tmp_path, big_csv, sig):
    out = tmp_path / "out"
    proc = spawn_cli("data", "--input", str(big_csv), "--label", "label", "--out", str(out), "--shards", "4",
                     start_new_session=True)
    deadline = time.time() + 120
    # Wait until the pipeline is writing shards into its temporary directory.
    while not glob.glob(str(tmp_path / ".out.tmp-*" / "train-*")) and time.time() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    os.kill(proc.pid, sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert not out.exists()
    if sig != signal.SIGKILL:
        assert "interrupted; no output was published" in err
        assert not glob.glob(str(tmp_path / ".out.tmp-*"))  # cleaned up on the way out
        return
    assert glob.glob(str(tmp_path / ".out.tmp-*"))  # SIGKILL cannot clean up: the next run must
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # any Beam worker processes of the killed run
    except ProcessLookupError:
        pass
    # The next run into the same output (here on the first 2,000 rows, to be quick) clears what
    # the killed run left behind and publishes.
    small = tmp_path / "small.csv"
    with open(big_csv) as f:
        small.write_text("".join(line for _, line in zip(range(2001), f)))
    res = run_cli("data", "--input", str(small), "--label", "label", "--out", str(out), "--shards", "4")
    assert res.returncode == 0, res.stderr
    assert load(str(out), "data.json")["counts"]["read"] == 2000
    assert not glob.glob(str(tmp_path / ".out.tmp-*"))


def test_local_parallel_workers_give_the_same_result(tmp_path):
    src = tmp_path / "big.csv"
    _big_csv(src, 60_000)
    one = run_stage(input=[str(src)], label="label", out=str(tmp_path / "one"), shards=2)
    two = run_stage(input=[str(src)], label="label", out=str(tmp_path / "two"), shards=2,
                    beam_args=["--direct_num_workers=2", "--direct_running_mode=multi_processing"])
    assert load(two, "data.json")["beam"]["workers"] == 2
    for split in ("train", "eval", "test"):
        for a, b in zip(sorted(glob.glob(os.path.join(one, f"{split}-*"))),
                        sorted(glob.glob(os.path.join(two, f"{split}-*")))):
            assert open(a, "rb").read() == open(b, "rb").read()
    # Stats merge in whatever order the workers finish: counts and vocabularies are exact,
    # moments equal to rounding, quantiles within the sketch's error.
    s1, s2 = load(one, "stats.json")["splits"], load(two, "stats.json")["splits"]
    for split in s1:
        assert s1[split]["label"] == s2[split]["label"] and s1[split]["rows"] == s2[split]["rows"]
        for name, f1 in s1[split]["features"].items():
            f2 = s2[split]["features"][name]
            for key, v in f1.items():
                if key == "quantiles":
                    width = f1["max"] - f1["min"]
                    assert v == pytest.approx(f2[key], abs=0.01 * width)
                elif isinstance(v, float):
                    assert v == pytest.approx(f2[key], rel=1e-9)
                else:
                    assert v == f2[key], (split, name, key)


# ---- schema enforcement ----------------------------------------------------------------------------

def test_enforced_schema(tmp_path, penguins_csv):
    inferred = run_stage(input=[penguins_csv], label="species", out=str(tmp_path / "a"))
    schema = load(inferred, "schema.json")
    for f in schema["features"]:
        if f["name"] == "sex":
            f["nullable"] = False  # enforce: rows without sex become dead letters
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    out = run_stage(input=[penguins_csv], label="species", out=str(tmp_path / "b"), schema=str(path),
                    max_bad_fraction=0.1)
    dead = [json.loads(line) for p in glob.glob(os.path.join(out, "deadletter", "*.jsonl")) for line in open(p)]
    header, rows = read_csv(penguins_csv)
    assert len(dead) == sum(r[header.index("sex")] == "NA" for r in rows) == 11
    assert {d["reason"] for d in dead} == {"missing value in non-nullable column 'sex'"}

    # A column the schema does not know is an error naming the file and the column.
    extra = tmp_path / "extra.csv"
    extra.write_text("species,island,colour\nAdelie,Dream,red\n")
    with pytest.raises(DataError, match="column 'colour' is not in the schema"):
        run_stage(input=[str(extra)], label="species", out=str(tmp_path / "c"), schema=str(path))


# ---- user errors: exit 2, one line, nothing written ----------------------------------------------

@pytest.mark.parametrize("case", ["missing", "empty", "noglob", "label", "schema", "split", "beam", "exclude"])
def test_bad_input_exits_2_with_one_line(tmp_path, penguins_csv, case):
    out = tmp_path / "out"
    args = ["--input", penguins_csv, "--label", "species", "--out", str(out)]
    expect = ""
    if case == "missing":
        args[1] = str(tmp_path / "nope.csv")
        expect = f"input {tmp_path / 'nope.csv'} does not exist"
    elif case == "empty":
        (tmp_path / "empty.csv").write_text("")
        args[1] = str(tmp_path / "empty.csv")
        expect = "is empty"
    elif case == "noglob":
        args[1] = str(tmp_path / "*.parquet")
        expect = "no file matches"
    elif case == "label":
        args[3] = "specie"
        expect = "label column 'specie' not found in"
    elif case == "schema":
        (tmp_path / "s.json").write_text("{not json")
        args += ["--schema", str(tmp_path / "s.json")]
        expect = f"schema file {tmp_path / 's.json'} is not valid JSON"
    elif case == "split":
        args += ["--split", "train=80,eval"]
        expect = "'eval' is not NAME=WEIGHT"
    elif case == "beam":
        args += ["--direct_num_wrokers=2"]
        expect = "unknown option --direct_num_wrokers=2"
    elif case == "exclude":
        args += ["--exclude", "tips"]
        expect = "--exclude: column 'tips' not found"
    res = run_cli("data", *args)
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 or case == "split", res.stderr
    assert expect in res.stderr
    assert not out.exists()


def test_existing_foreign_directory_is_not_overwritten(tmp_path, penguins_csv):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    res = run_cli("data", "--input", penguins_csv, "--label", "species", "--out", str(out))
    assert res.returncode == 2 and "is not a tfpipe data output" in res.stderr
    assert (out / "notes.txt").read_text() == "keep me"


def test_remote_paths_through_beam_filesystems(tmp_path, penguins_csv, monkeypatch):
    # Inputs and output on a non-local filesystem, as with gs:// on Dataflow: every read and
    # write goes through Beam's FileSystems, and publishing has no directory rename.
    import remote_fs

    monkeypatch.setattr(remote_fs, "ROOT", str(tmp_path))
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "penguins.csv").write_bytes(open(penguins_csv, "rb").read())
    log: list[str] = []
    out = run_stage(log, input=["testfs://raw/*.csv"], label="species", out="testfs://runs/data", shards=2)
    assert out == "testfs://runs/data"
    local = tmp_path / "runs" / "data"
    m = load(str(local), "data.json")
    assert m["counts"]["read"] == 344 and m["inputs"][0]["path"] == "testfs://raw/penguins.csv"
    assert sum(len(read_split(str(local), s)["species"][0]) for s in ("train", "eval", "test")) == 344
    # Nothing left under the temporary prefix (an object store has files, not folders).
    assert not [p for p in (tmp_path / "runs").rglob("*") if p.is_file() and ".tmp-" in str(p)]
    # A rerun is a cache hit; a forced rerun replaces the output in place.
    log = []
    run_stage(log, input=["testfs://raw/*.csv"], label="species", out="testfs://runs/data", shards=2)
    assert any("cache hit" in line for line in log)
    run_stage(input=["testfs://raw/*.csv"], label="species", out="testfs://runs/data", shards=1, force=True)
    assert len(glob.glob(str(local / "train-*"))) == 1
    assert load(str(local), "data.json")["counts"]["read"] == 344


def test_corrupt_inputs_are_user_errors(tmp_path, penguins_csv):
    # A gzip stream damaged past its first line is only found by the Beam worker reading it.
    header, *rows = open(penguins_csv, "rb").read().splitlines(keepends=True)
    rows = rows[::3] + rows[1::3] + rows[2::3]  # every species within the first 100 rows
    data = bytearray(gzip.compress(header + b"".join(rows * 40)))
    middle = len(data) // 2
    data[middle: middle + 64] = bytes(64)
    (tmp_path / "broken.csv.gz").write_bytes(bytes(data))
    res = run_cli("data", "--input", str(tmp_path / "broken.csv.gz"), "--label", "species",
                  "--out", str(tmp_path / "a"))
    assert res.returncode == 2, res.stderr
    assert f"input {tmp_path / 'broken.csv.gz'} is corrupt or unreadable" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "a").exists()
    # With a short sample the launcher does not reach the damage; the Beam worker does.
    res = run_cli("data", "--input", str(tmp_path / "broken.csv.gz"), "--label", "species",
                  "--out", str(tmp_path / "a"), "--infer-rows", "100")
    assert res.returncode == 2, res.stderr
    assert f"input {tmp_path / 'broken.csv.gz'} is corrupt or unreadable" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "a").exists()

    (tmp_path / "fake.parquet").write_bytes(b"PAR1 this is not parquet")
    res = run_cli("data", "--input", str(tmp_path / "fake.parquet"), "--label", "species",
                  "--out", str(tmp_path / "b"))
    assert res.returncode == 2 and "is not a readable Parquet file" in res.stderr

    (tmp_path / "notes.txt").write_text("hello")
    res = run_cli("data", "--input", str(tmp_path / "notes.txt"), "--label", "species",
                  "--out", str(tmp_path / "c"))
    assert res.returncode == 2 and "cannot tell the format of" in res.stderr and "--format" in res.stderr


def test_the_data_result_summarises_its_own_output(penguins_data):
    """What tfpipe run shows and keeps of the data stage, read by the stage itself: the 344
    penguins rows and where each went."""
    from tfpipe.pipeline.outputs import result

    r = result(penguins_data)
    m = re.fullmatch(r"344 rows -> train (\d+), eval (\d+), test (\d+); (\d+) dead-lettered", r.summary)
    assert m, r.summary
    assert sum(int(n) for n in m.groups()) == 344 and r.manifest.endswith("data.json")
    assert isinstance(r.outputs, DataOutputs) and r.code == 0
    assert r.outputs.path == penguins_data and len(r.outputs.fingerprint) == 64

