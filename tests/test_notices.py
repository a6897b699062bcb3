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
    from tfpipe.pipeline.schema import infer_schema

    notes: list[str] = []
    schema = infer_schema(["x", "y"], _rows(values), "y", task=task, note=notes.append)
    assert (schema.label.task, schema.label.type) == (want_task, want_type)
    assert said in notes, notes


def test_text_and_date_columns_are_said():
    from tfpipe.pipeline.schema import infer_schema

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
    from tfpipe.pipeline.launch import result

    path = tmp_path / "bfi.csv"
    lines = ["row;A1;age;education"]
    for i in range(200):
        education = "" if i % 13 == 0 else f"{1 + i % 5}.0"
        lines.append(f"{i + 1};{1 + i % 6};{20 + i % 40};{education}")
    path.write_text("\n".join(lines) + "\n")
    out = run(DataConfig(input=[str(path)], label="education", out=str(tmp_path / "d")), log=lambda _: None)
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
