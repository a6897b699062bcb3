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


def test_a_signature_whose_arguments_tensorflow_renamed_takes_the_packed_fast_call(tmp_path):
    """TensorFlow names a loaded signature's arguments x_a for the inputs 'x.a' (a dotted column,
    as R's data frames have hundreds of): the server still calls it with one [batch, k] tensor per
    dtype (the fast path), not one tensor per input, and answers the same."""
    import numpy as np
    import tensorflow as tf

    from tfpipe.serve.core.servable import Servable

    names = [f"x.g{i}" for i in range(40)] + ["tag"]

    class Wide(tf.Module):
        @tf.function(input_signature=[{n: tf.TensorSpec([None], tf.string if n == "tag" else tf.float32, name=n)
                                       for n in names}])
        def serve(self, inputs):
            total = tf.add_n([inputs[n] * float(i + 1) for i, n in enumerate(names[:-1])])
            return {"y": total, "tag": tf.strings.upper(inputs["tag"])}

    m = Wide()
    tf.saved_model.save(m, str(tmp_path / "1"), signatures={"serving_default": m.serve})
    servable = Servable("wide", 1, str(tmp_path / "1"))
    sig = servable.signature("serving_default")
    _, kwargs = tf.saved_model.load(str(tmp_path / "1")).signatures["serving_default"].structured_input_signature
    assert "x_g0" in kwargs and "x.g0" in sig.inputs  # the case: the argument is not the key
    assert sig.call is not sig.call_any
    inputs = servable.check_inputs(sig, {**{n: np.array([1.0, 2.0], np.float32) for n in names[:-1]},
                                         "tag": np.array([b"a", b"b"], object)})
    fast, public = sig.call(inputs), sig.call_any(inputs)
    want = sum(range(1, 41))
    assert fast["y"].numpy().tolist() == public["y"].numpy().tolist() == [want, 2 * want]
    assert fast["tag"].numpy().tolist() == [b"A", b"B"]
