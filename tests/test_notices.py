"""What the data stage decided about a table, said where a user sees it: the label's task and why
(a whole-number label written as 1.0, 2.0 is classes), the text and date columns, the row ID left
out, the delimiter found; in the log, in data.json and under the run's data line."""

from __future__ import annotations

import json
import os

import pytest


def _rows(label_values, extra=None):
    return [{"x": str(i), "y": label_values[i % len(label_values)], **(extra(i) if extra else {})}
            for i in range(60)]


@pytest.mark.parametrize("values,task,want_task,want_type,said", [
    (["1.0", "2.0", "3.0", "", "5.0"], "auto", "multiclass", "int",
     "label 'y': multiclass classification, 4 classes (1, 2, 3, 5): at most 20 distinct whole numbers (written as "
     "decimals: 1.0, 2.0, ...); --task regression predicts a number"),
    (["1.5", "2.25", "3.0"], "auto", "regression", "float",
     "label 'y': regression (numbers with decimals; --task multiclass treats its values as classes)"),
    ([str(i) for i in range(30)], "auto", "regression", "int",
     "label 'y': regression (whole numbers, more than 20 distinct: a quantity; --task multiclass treats its values "
     "as classes)"),
    (["cat", "dog", "eel"], "auto", "multiclass", "string",
     "label 'y': multiclass classification, 3 classes (cat, dog, eel): strings"),
    (["yes", "no"], "auto", "binary", "string", "label 'y': binary classification, 2 classes (no, yes): two values"),
    (["1.0", "2.0", "3.0"], "regression", "regression", "float", "label 'y': regression (--task)"),
])
def test_the_label_task_and_why_are_said(values, task, want_task, want_type, said):
    from tfpipe.pipeline.schema_inference import infer_schema

    notes: list[str] = []
    schema = infer_schema(["x", "y"], _rows(values), "y", task=task, note=notes.append)
    assert (schema.label.task, schema.label.type) == (want_task, want_type)
    assert said in notes, notes


def test_text_and_date_columns_are_said():
    from tfpipe.pipeline.schema_inference import infer_schema

    def extra(i):
        return {"when": f"2024-0{1 + i % 9}-1{i % 10}", "review": f"the parcel came {i} days late and the box was torn"}

    notes: list[str] = []
    infer_schema(["x", "when", "review", "y"], _rows(["a", "b"], extra), "y", note=notes.append)
    assert "read as free text (words, as a bag of tokens): review" in notes, notes
    assert "read as dates (their parts, as numbers): when" in notes, notes


def test_a_whole_number_label_written_as_decimals_trains_as_classes_and_the_run_says_so(tmp_path):
    """psych's bfi `education` as pandas writes it (1.0 ... 5.0, gaps where missing), `;`-separated,
    with a row number: the data stage reads 1.0 as class 1 (no row dead-lettered), and its notices
    are in data.json and in the StageResult the run prints under the data line."""
    from tfpipe.pipeline.config import DataConfig
    from tfpipe.pipeline.job import run
    from tfpipe.pipeline.outputs import result

    path = tmp_path / "bfi.csv"
    lines = ["row;A1;age;education"]
    for i in range(200):
        education = "" if i % 13 == 0 else f"{1 + i % 5}.0"
        lines.append(f"{i + 1};{1 + i % 6};{20 + i % 40};{education}")
    path.write_text("\n".join(lines) + "\n")
    out = run(DataConfig(input=[str(path)], label="education", out=str(tmp_path / "d")), log=lambda _: None).outputs.path
    m = json.load(open(os.path.join(out, "data.json")))
    assert m["counts"]["bad"] == 0 and m["counts"]["unlabelled"] == 16
    schema = json.load(open(os.path.join(out, "schema.json")))
    assert schema["label"] == {"name": "education", "type": "int", "task": "multiclass", "classes": [1, 2, 3, 4, 5]}
    notes = result(out).notes
    assert notes == tuple(m["notices"])
    assert any(n.startswith("bfi.csv: fields separated by semicolons") for n in notes), notes
    assert any(n.startswith("column 'row' looks like a row ID") for n in notes), notes
    assert any(n.startswith("label 'education': multiclass classification, 5 classes") for n in notes), notes


@pytest.mark.parametrize("inputs,want", [
    (["sales.csv"], "sales"), (["x.csv.gz"], "x"), (["data/x.JSONL.GZ"], "x"), (["t.parquet"], "t"),
    (["raw/*.csv"], "raw"), (["my table (2).csv"], "my_table_2"),
])
def test_a_runs_name_is_the_files_stem_without_its_compression(inputs, want):
    from tfpipe.run import own_data_name

    assert own_data_name(inputs) == want


def test_an_excel_workbooks_first_sheet_is_read_as_a_table(tmp_path):
    """A .xlsx with dates, whole numbers, blanks, a trailing empty row and a second sheet: the data
    stage reads the first sheet (dates as dates), says so, and loses no row. An .xls is refused
    with what to do."""
    import datetime

    import openpyxl

    from tfpipe.pipeline.config import DataConfig
    from tfpipe.pipeline.errors import DataError
    from tfpipe.pipeline.job import run

    wb = openpyxl.Workbook()
    ws = wb.active
    ws.append(["day", "births", "weekday", "note"])
    for i in range(60):
        ws.append([datetime.date(1988, 1, 1) + datetime.timedelta(days=i), 7000 + (i * 37) % 900,
                   ["Mon", "Tue", "Wed"][i % 3], None if i % 5 else "holiday"])
    ws.append([None] * 4)
    wb.create_sheet("other").append(["not", "this"])
    path = tmp_path / "births.xlsx"
    wb.save(path)
    log: list[str] = []
    out = run(DataConfig(input=[str(path)], label="births", out=str(tmp_path / "d")), log=log.append).outputs.path
    m = json.load(open(os.path.join(out, "data.json")))
    assert m["counts"]["read"] == 60 and m["counts"]["bad"] == 0
    schema = json.load(open(os.path.join(out, "schema.json")))
    kinds = {f["name"]: (f["type"], f.get("kind")) for f in schema["features"]}
    assert kinds["day"] == ("string", "date") and kinds["weekday"] == ("string", None)
    assert schema["label"]["type"] == "int"
    assert any(n.startswith("births.xlsx: an Excel workbook; its first sheet is read") for n in m["notices"])
    (tmp_path / "old.xls").write_bytes(b"\xd0\xcf\x11\xe0" + b"\0" * 100)
    with pytest.raises(DataError, match=r"Excel 97-2003 workbook \(.xls\).*save it as .xlsx"):
        run(DataConfig(input=[str(tmp_path / "old.xls")], label="births", out=str(tmp_path / "e")), log=log.append)
