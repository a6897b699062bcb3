"""Any header a file allows is a feature name: columns named like Python keywords (`from`, `class`,
`lambda`), with a space and with a dot go through data, train and export, and the served model
takes them under their own names."""

from __future__ import annotations

import csv
import os


HEADER = ["from", "class", "lambda", "wind speed", "Sepal.Length", "label"]


def _table(path: str) -> str:
    """120 rows: the label is "hi" when `Sepal.Length` is over 5, each column carrying some signal."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(HEADER)
        for i in range(120):
            x = (i * 37 % 100) / 10
            w.writerow([["north", "south"][i % 2], ["a", "b", "c"][i % 3], i % 7, round(x * 1.5, 2), x,
                        "hi" if x > 5 else "lo"])
    return path


def test_keyword_space_and_dot_headers_train_export_and_keep_their_names(tmp_path):
    from tfpipe.pipeline.config import DataConfig
    from tfpipe.pipeline.job import run

    data = run(DataConfig(input=[_table(str(tmp_path / "t.csv"))], label="label", out=str(tmp_path / "data")),
               log=lambda _: None)
    from tfpipe.export.config import ExportConfig
    from tfpipe.export.job import run as export
    from tfpipe.export.signature_diff import signatures
    from tfpipe.train.config import TrainConfig
    from tfpipe.train.job import run as train

    model = train(TrainConfig(data=data, out=str(tmp_path / "train"), epochs=30, learning_rate=0.05),
                  log=lambda _: None)
    export(ExportConfig(model=model, data=data, base=str(tmp_path / "models"), name="kw", tflite=""),
           log=lambda _: None)
    sigs = signatures(os.path.join(tmp_path, "models", "kw", "1"))
    assert sorted(sigs["serving_default"].inputs) == sorted(HEADER[:-1])  # what a client sends: the columns' names
