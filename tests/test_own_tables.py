"""A user's own table works the first time: the CSV delimiter (and a decimal comma) detected,
rows without a label set aside rather than bad, row-ID columns left out with a notice, and a
folder of class folders of images read as images without flags. Pure pieces table-driven;
the data stage itself run on small files with real Beam."""

from __future__ import annotations

import glob
import json
import os
import re

import numpy as np
import pytest

from conftest import read_split, run_cli
from tfpipe.pipeline.autodetect import decimal_comma_number, detect_delimiter, image_class_folders
from tfpipe.pipeline.config import DataConfig
from tfpipe.pipeline.errors import DataError
from tfpipe.pipeline.job import run
from tfpipe.pipeline.validation import Validator
from tfpipe.pipeline.schema import Feature, Label, Schema
from tfpipe.pipeline.schema_inference import id_like_name, infer_schema


def run_stage(log=None, **kw) -> str:
    return run(DataConfig(**kw), log=(log if log is not None else []).append).outputs.path


def load(out: str, name: str) -> dict:
    with open(os.path.join(out, name)) as f:
        return json.load(f)


def jsonl(pattern: str) -> list[dict]:
    return [json.loads(line) for p in sorted(glob.glob(pattern)) for line in open(p)]


# ---- the delimiter ---------------------------------------------------------------------------------

@pytest.mark.parametrize("head, complete, prefer, want", [
    ("a,b,c\n1,2,3\n4,5,6\n", True, ",", ","),
    ("amount;region;bought\n3,5;north;yes\n12;south;no\n", True, ",", ";"),  # decimal commas: still ';'
    ("a\tb\n1\t2\n", True, ",", "\t"),
    ("a|b|c\n1|2|3\n", True, ",", "|"),
    # quote-aware: the commas and semicolons inside quotes split nothing
    ('name;note\n"Smith, J";"a;b"\n"Lee, K";x\n', True, ",", ";"),
    ('name,note\n"a;b;c",x\n"d;e;f",y\n', True, ",", ","),
    # both split the header and every line alike: the comma wins the tie, a .tsv's tab wins its own
    ("a,b;c\n1,2;3\n", True, ",", ","),
    ("a,b\tc\n1,2\t3\n", True, "\t", "\t"),
    # a head cut mid-line: its last, partial line does not vote
    ("a;b;c\n1;2;3\n4;5", False, ",", ";"),
    # one bad line among many: the delimiter that fits most lines
    ("a;b;c\n1;2;3\n4;5;6\n7;8\n", True, ",", ";"),
    # a one-column file: nothing splits it, read with a comma
    ("label\nyes\nno\n", True, ",", ","),
])
def test_the_delimiter_is_the_one_that_splits_header_and_lines_alike(head, complete, prefer, want):
    assert detect_delimiter(head, complete, prefer) == want


@pytest.mark.parametrize("text, want", [
    ("3,5", "3.5"), ("-0,25", "-0.25"), (",5", ".5"), ("+12,0", "+12.0"),
    ("3.5", None), ("1,2,3", None), ("3,", None), ("a,b", None), ("12", None), ("", None),
])
def test_a_decimal_comma_number(text, want):
    assert decimal_comma_number(text) == want


@pytest.mark.parametrize("given, want", [
    ("auto", "auto"), (";", ";"), ("tab", "\t"), ("\\t", "\t"), ("\t", "\t"), ("|", "|"), ("semicolon", ";"),
    ("ab", None), ('"', None), ("", None), ("\n", None),
])
def test_the_delimiter_option(given, want):
    if want is None:
        with pytest.raises(ValueError, match="is not a delimiter"):
            DataConfig(delimiter=given)
    else:
        assert DataConfig(delimiter=given).delimiter == want


def _semicolon_table(path, rows: int = 60, unlabelled=(4, 17, 33)) -> None:
    """A spreadsheet's export: ';' fields, decimal commas, a row number, a few blank labels."""
    lines = ["row;amount;region;visits;bought"]
    for i in range(rows):
        label = "" if i in unlabelled else ("yes" if i % 3 else "no")
        lines.append(f"{i + 1};{i % 7},{i % 10}5;{'north' if i % 2 else 'south'};{i % 5};{label}")
    path.write_text("\n".join(lines) + "\n")


def test_a_semicolon_table_with_decimal_commas_blank_labels_and_a_row_number(tmp_path):
    src = tmp_path / "sales.csv"
    _semicolon_table(src)
    log: list[str] = []
    out = run_stage(log, input=[str(src)], label="bought", out=str(tmp_path / "d"))
    schema = load(out, "schema.json")
    assert {f["name"]: f["type"] for f in schema["features"]} == {"amount": "float", "region": "string",
                                                                  "visits": "int"}
    assert schema["excluded"] == ["row"]
    m = load(out, "data.json")
    assert m["counts"]["read"] == 60 and m["counts"]["unlabelled"] == 3 and m["counts"]["bad"] == 0
    assert m["counts"]["written"] == 57 == sum(m["counts"]["splits"].values())
    assert m["inputs"][0]["delimiter"] == ";" and m["inputs"][0]["decimal_comma"] is True
    assert [r["line"] for r in jsonl(os.path.join(out, "unlabelled", "*.jsonl"))] == [6, 19, 35]
    # 3,05 was read as 3.05: every written amount is one of the values the file spells
    amounts = np.concatenate([read_split(out, s)["amount"][0] for s in m["counts"]["splits"]])
    want = {round(i % 7 + (i % 10 * 10 + 5) / 100, 4) for i in range(60)}
    assert {round(float(a), 4) for a in amounts} <= want and len(amounts) == 57
    text = "\n".join(log)
    assert "fields separated by semicolons (';', detected" in text
    assert ("column 'row' looks like a row ID (unique in every sampled row, counting up by one from 1): "
            "left out of the model; --keep-column row keeps it") in text
    assert "rows read 60 = written 57 + dead-letter 0 + unlabelled 3" in text

    # The same delimiter given by hand reads the same result: a cache hit by content.
    log.clear()
    run_stage(log, input=[str(src)], label="bought", out=str(tmp_path / "d"), delimiter=";")
    assert any("cache hit" in line and "by content" in line for line in log), log
    # --keep-column keeps the row number as a feature.
    kept = run_stage(input=[str(src)], label="bought", out=str(tmp_path / "k"), keep_column=["row"])
    assert load(kept, "schema.json")["excluded"] == []


def test_the_wrong_delimiter_says_how_the_header_was_split(tmp_path):
    src = tmp_path / "sales.csv"
    _semicolon_table(src)
    res = run_cli("data", "--input", str(src), "--label", "bought", "--delimiter", ",", "--out", str(tmp_path / "o"))
    assert res.returncode == 2, res.stderr
    assert (f"label column 'bought' not found in {src}: its header, split on ',', gives 1 column: "
            "'row;amount;region;visits;bought' (pass --delimiter ';' to split it on semicolons)") in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_tab_separated_tsv_and_a_pandas_index(tmp_path):
    tsv = tmp_path / "t.tsv"
    tsv.write_text("\tcolour\tsize\tlabel\n" + "".join(
        f"{i}\t{['red', 'blue'][i % 2]}\t{i % 4}.5\t{'ab'[i % 3 == 0]}\n" for i in range(40)))
    log: list[str] = []
    out = run_stage(log, input=[str(tsv)], label="label", out=str(tmp_path / "d"))
    schema = load(out, "schema.json")
    assert [f["name"] for f in schema["features"]] == ["colour", "size"]
    assert schema["excluded"] == ["Unnamed: 0"]  # pandas' nameless index, as pandas names it
    assert load(out, "data.json")["inputs"][0]["delimiter"] == "\t"
    assert "--keep-column 'Unnamed: 0' keeps it" in "\n".join(log)


# ---- rows without a label ------------------------------------------------------------------------------

def _validator(label_type="string", classes=None, enforced=False) -> Validator:
    schema = Schema([Feature("x", "float")], Label("y", label_type, "multiclass", classes or ["a", "b"]),
                    enforced=enforced)
    return Validator(schema, ["NA"])


@pytest.mark.parametrize("row, label_type, enforced, want", [
    ("1.5,a", "string", False, "written"),
    ("1.5,", "string", False, "unlabelled"),
    ("1.5,NA", "string", False, "unlabelled"),
    ("1.5,c", "string", True, "bad: label value 'c' is not one of the schema's classes"),
    ("1.5,", "string", True, "unlabelled"),  # an enforced schema too: no label is not a bad label
    ("1.5,abc", "int", False, "bad: column 'y': 'abc' is not an int"),
    ("1.5,", "int", False, "unlabelled"),
    ("x,", "string", False, "bad: column 'x': 'x' is not a float"),  # a bad row stays bad without a label
])
def test_a_row_without_a_label_is_unlabelled_and_a_wrong_label_is_bad(row, label_type, enforced, want):
    classes = [0, 1] if label_type == "int" else ["a", "b"]
    batch = _validator(label_type, classes, enforced).csv_batch("f.csv", ("x", "y"), row + "\n", 2)
    got = ("written" if len(batch) else "unlabelled" if batch.unlabelled else "bad: " + batch.bad[0]["reason"])
    assert got == want
    assert len(batch) + len(batch.bad) + len(batch.unlabelled) == 1
    if batch.unlabelled:
        assert batch.unlabelled == [{"source": "f.csv", "line": 2, "raw": row}]


def test_unlabelled_rows_are_not_bad_rows_and_all_unlabelled_is_an_error(tmp_path):
    src = tmp_path / "few.csv"
    # 10% without a label: far over --max-bad-fraction 0.01, and not a bad row among them
    _semicolon_table(src, rows=50, unlabelled=range(0, 50, 10))
    out = run_stage(input=[str(src)], label="bought", out=str(tmp_path / "d"), max_bad_fraction=0.01)
    from tfpipe.pipeline.outputs import result

    summary = result(out).summary
    assert re.fullmatch(r"50 rows -> train \d+, eval \d+, test \d+; 5 unlabelled set aside; 0 dead-lettered",
                        summary), summary
    src.write_text("a;b;y\n" + "".join(f"{i};{i * 2};\n" for i in range(30)))
    with pytest.raises(DataError, match="label column 'y' is empty in the first 30 rows"):
        run_stage(input=[str(src)], label="y", out=str(tmp_path / "e"))


# ---- row IDs -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, want", [
    ("id", True), ("ID", True), ("Id", True), ("customer_id", True), ("CUSTOMER_ID", True), ("order id", True),
    ("customerId", True), ("rownames", True), ("index", True), ("Unnamed: 0", True),
    ("paid", False), ("idea", False), ("width", False), ("valid", False), ("X", False), ("identity", False),
])
def test_names_that_say_row_id(name, want):
    assert id_like_name(name) is want


_N = 30
_ROWS = {
    "int_named": [str(7 * i % 31) for i in range(_N)],  # distinct, in no order
    "counting": [str(100 + i) for i in range(_N)],
    "X": [str(i + 1) for i in range(_N)],
    "shuffled_int": [str(7 * i % 31) for i in range(_N)],
    "repeats_int": [str(i // 2) for i in range(_N)],
    "float": [f"{i}.5" for i in range(_N)],
    "code": [f"C-{10023 + 3 * i}" for i in range(_N)],
    "car": [f"Ford Model {i}" for i in range(_N)],
    "car_id": [f"Ford Model {i}" for i in range(_N)],
    "short_code": [f"c{i}" for i in range(_N)],
    "with_gap": [str(i) if i != 5 else "" for i in range(_N)],
}


@pytest.mark.parametrize("column, rows, want", [
    ("id", _ROWS["int_named"], True),  # an ID's name, distinct values
    ("counting", _ROWS["counting"], True),  # counts up by one in file order
    ("X", _ROWS["X"], True),  # R's write.csv row names
    ("shuffled_int", _ROWS["shuffled_int"], False),  # distinct, but neither named nor counting
    ("id", _ROWS["repeats_int"], False),  # named, but a value repeats
    ("id", _ROWS["float"], False),  # a float column is never an ID
    ("code", _ROWS["code"], True),  # distinct codes without spaces
    ("car", _ROWS["car"], False),  # distinct, but words: names or free text
    ("car_id", _ROWS["car_id"], True),  # words, but named an ID
    ("short_code", _ROWS["short_code"][:15], False),  # under 20 sampled rows
    ("counting", _ROWS["with_gap"], False),  # a missing value
])
def test_row_ids_are_left_out_with_a_notice(column, rows, want):
    labels = ["a", "b", "c"]
    records = [{column: v, "y": labels[i % 3], "other": str(i % 4)} for i, v in enumerate(rows)]
    notes: list[str] = []
    schema = infer_schema([column, "other", "y"], records, "y", note=notes.append)
    assert (column in schema.excluded) is want
    assert [f.name for f in schema.features] == (["other"] if want else [column, "other"])
    ids = [n for n in notes if "looks like a row ID" in n]
    assert len(ids) == int(want), notes
    kept = infer_schema([column, "other", "y"], records, "y", keep=[column], note=notes.append)
    assert column not in kept.excluded and len([n for n in notes if "looks like a row ID" in n]) == int(want)


def test_the_label_is_never_an_id():
    records = [{"id": str(i), "x": str(i % 3)} for i in range(30)]
    schema = infer_schema(["id", "x"], records, "id", task="regression")
    assert schema.label.name == "id" and schema.excluded == []


def test_typed_json_values_vote_alike():
    records = [{"customer_id": f"C{i:04d}", "n": i, "v": i + 0.5, "y": i % 2} for i in range(25)]
    schema = infer_schema(["customer_id", "n", "v", "y"], records, "y", textual=False)
    assert schema.excluded == ["customer_id", "n"] and [f.name for f in schema.features] == ["v"]


# ---- image folders -----------------------------------------------------------------------------------------------

def _shapes(root, classes=("circle", "square"), n=12):
    from PIL import Image

    for k, cls in enumerate(classes):
        os.makedirs(root / cls, exist_ok=True)
        for i in range(n):
            Image.new("RGB", (16, 16), (40 * k + i, 200 - 40 * k, i * 9)).save(root / cls / f"{i}.png")


def test_image_class_folders(tmp_path):
    _shapes(tmp_path / "shapes")
    (tmp_path / "shapes" / ".cache").mkdir()
    (tmp_path / "shapes" / "notes").mkdir()
    (tmp_path / "shapes" / "notes" / "read.txt").write_text("x")
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "a.png").write_bytes(b"")
    assert image_class_folders(str(tmp_path / "shapes")) == ["circle", "square"]
    assert image_class_folders(str(tmp_path / "flat")) == []
    assert image_class_folders(str(tmp_path / "none")) == []
    assert image_class_folders(str(tmp_path / "flat" / "a.png")) == []


def test_a_folder_of_class_folders_needs_no_flags(tmp_path, monkeypatch):
    _shapes(tmp_path / "shapes")
    res = run_cli("data", "--input", str(tmp_path / "shapes"), "--out", str(tmp_path / "d"))
    assert res.returncode == 0, res.stderr
    schema = load(str(tmp_path / "d"), "schema.json")
    assert schema["kind"] == "images" and schema["label"]["classes"] == ["circle", "square"]
    assert load(str(tmp_path / "d"), "data.json")["counts"]["read"] == 24

    # tfpipe run: images, no --label, named after the folder
    from tfpipe.cli import build_parser, run_request_config

    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(["run", "--input", "shapes/"])
    config, path, workdir = run_request_config(args)
    assert config.data.format == "images" and config.export.name == "shapes"
    assert workdir == os.path.join("runs", "shapes") and path is None

    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "sub").mkdir()
    res = run_cli("data", "--input", str(tmp_path / "empty"), "--label", "y", "--out", str(tmp_path / "e"))
    assert res.returncode == 2 and "is a directory with no class folders of images" in res.stderr
    res = run_cli("run", "--input", str(tmp_path / "empty"), "--workdir", str(tmp_path / "w"))
    assert res.returncode == 2 and "--label COLUMN" in res.stderr


def test_the_run_caches_the_data_step_by_the_delimiter_a_file_is_read_with(tmp_path):
    from tfpipe.config import load_config
    from tfpipe.steps import data_settings, data_sources

    src = tmp_path / "sales.csv"
    _semicolon_table(src)

    def key(delimiter: str):
        config = load_config(None, [f"data.input={json.dumps([str(src)])}", "data.label='bought'",
                                    f"data.delimiter={json.dumps(delimiter)}"])
        return data_settings(config), data_sources(config)

    assert key("auto") == key(";")  # what auto detects, given by hand: the same rows
    assert key(",") != key("auto")  # read otherwise: the step reruns
    assert key("auto")[1]["files"][0]["delimiter"] == ";"


def test_an_image_manifest_with_semicolons(tmp_path):
    from tfpipe.pipeline.image_job import find_images

    _shapes(tmp_path / "shapes", n=3)
    manifest = tmp_path / "list.csv"
    manifest.write_text("path;kind\n" + "".join(f"shapes/{c}/{i}.png;{c}\n" for c in ("circle", "square")
                                               for i in range(3)))
    items, classes, _ = find_images(DataConfig(format="images", input=[str(manifest)], image_column="path",
                                               label="kind"), log=lambda _: None)
    assert classes == ["circle", "square"] and len(items) == 6 and all(os.path.exists(i.path) for i in items)


# ---- stratified splits -------------------------------------------------------------------------------

@pytest.mark.parametrize("sizes, split, want", [
    # rows per class -> rows per split of each class: round(n * cumulative weight) at each cut
    ({"a": 50, "b": 50, "c": 50}, {"train": 80, "eval": 10, "test": 10}, {"a": [40, 5, 5], "b": [40, 5, 5], "c": [40, 5, 5]}),
    ({"yes": 7, "no": 93}, {"train": 80, "eval": 10, "test": 10}, {"yes": [6, 0, 1], "no": [74, 10, 9]}),
    ({"one": 1, "two": 2, "three": 3}, {"train": 80, "eval": 10, "test": 10},
     {"one": [1, 0, 0], "two": [2, 0, 0], "three": [2, 1, 0]}),
    ({"a": 10}, {"train": 1, "eval": 0, "test": 1}, {"a": [5, 0, 5]}),
    ({"a": 9}, {"train": 2, "test": 1}, {"a": [6, 3]}),
])
def test_each_class_gets_its_share_of_every_split(sizes, split, want):
    from tfpipe.pipeline.transforms import assign_splits, row_hashes, split_bounds, strata_bounds

    texts = [f"{cls},{i}" for cls, n in sizes.items() for i in range(n)]
    labels = [cls for cls, n in sizes.items() for _ in range(n)]
    hashes: dict[str, list] = {}
    for cls, h in zip(labels, row_hashes(texts)):
        hashes.setdefault(cls, []).append(h)
    strata = strata_bounds(hashes, split)
    which = assign_splits(texts, labels, split_bounds(split), strata)
    got = {cls: [int(((np.array(labels) == cls) & (which == s)).sum()) for s in range(len(split))] for cls in sizes}
    assert got == want
    # the same rows in another order, in other batches, land in the same splits
    order = np.random.default_rng(0).permutation(len(texts))
    again = np.empty_like(which)
    for part in np.array_split(order, 3):
        again[part] = assign_splits([texts[i] for i in part], [labels[i] for i in part], split_bounds(split), strata)
    assert (again == which).all()


def test_a_small_classification_table_is_split_by_class_and_a_regression_by_hash(tmp_path):
    rng = np.random.default_rng(3)
    path = tmp_path / "t.csv"
    rows = ["x,y,kind,price"] + [f"{rng.normal():.4f},{'rare' if i % 12 == 0 else 'common'},"
                                 f"{['a', 'b', 'c'][i % 3]},{rng.uniform(1, 9):.2f}" for i in range(240)]
    path.write_text("\n".join(rows) + "\n")
    log: list[str] = []
    out = run_stage(log, input=[str(path)], label="y", out=str(tmp_path / "d"))
    stats = load(out, "stats.json")["splits"]
    per_split = {s: stats[s]["label"]["distribution"] for s in ("train", "eval", "test")}
    assert per_split == {"train": {"common": 176, "rare": 16}, "eval": {"common": 22, "rare": 2},
                         "test": {"common": 22, "rare": 2}}
    assert load(out, "data.json")["split_by"] == "class"
    assert any("stratified by 'y' (2 classes, 240 labelled rows)" in line for line in log)

    out = run_stage(input=[str(path)], label="y", out=str(tmp_path / "h"), stratify="off")
    assert load(out, "data.json")["split_by"] == "hash"
    out = run_stage(input=[str(path)], label="price", out=str(tmp_path / "r"))
    assert load(out, "data.json")["split_by"] == "hash"
    out = run_stage(input=[str(path)], label="y", key="kind", out=str(tmp_path / "k"))
    assert load(out, "data.json")["split_by"] == "hash"


def test_an_image_folder_is_split_by_class(tmp_path):
    _shapes(tmp_path / "shapes", classes=("circle", "square", "star"), n=20)
    out = run_stage(input=[str(tmp_path / "shapes")], format="images", out=str(tmp_path / "d"))
    stats = load(out, "stats.json")["splits"]
    for split, n in (("train", 16), ("eval", 2), ("test", 2)):
        assert stats[split]["classes"] == {"circle": n, "square": n, "star": n}, (split, stats[split])
    assert load(out, "data.json")["split_by"] == "class"
