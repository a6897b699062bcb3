"""The hand-written tf.train.Example encoder against TensorFlow's own parser, on the values
real data rarely has: negative and extreme int64s, long and non-ASCII strings, gaps."""

from __future__ import annotations

import numpy as np

from tfpipe.pipeline.validation import Column
from tfpipe.pipeline.schema import Feature
from tfpipe.pipeline.tfexample import ExampleEncoder


def test_encoded_examples_parse_exactly():
    import tensorflow as tf

    ints = np.array([0, 1, 127, 128, 300, -1, -2**63, 2**63 - 1, 16384, 2**35], dtype=np.int64)
    n = len(ints)
    floats = np.array([0.0, -1.5, 3.25, 1e30, -1e-30, 7.0, 2.5, 1e-3, 42.0, -0.0])
    strings = np.array(["x", "é ü 中文", "", "long" * 5000, "a,b", "\n", "y", "z", "0", "nul\x00"], dtype=object)
    present_i = np.array([True] * 9 + [False])
    present_s = np.array([True, True, False] + [True] * 7)
    columns = [Feature("a", "int"), Feature("b", "float"), Feature("c", "string"), Feature("label", "int", False)]
    data = {"a": Column(ints, present_i), "b": Column(floats, np.ones(n, bool)),
            "c": Column(strings, present_s), "label": Column(np.arange(n), np.ones(n, bool))}
    records = ExampleEncoder(columns).encode(data)
    assert len(records) == n
    for i, record in enumerate(records):
        feature = tf.train.Example.FromString(record).features.feature
        if present_i[i]:
            assert list(feature["a"].int64_list.value) == [ints[i]]
        else:
            assert "a" not in feature
        assert feature["b"].float_list.value[0] == np.float32(floats[i])
        if present_s[i]:
            assert feature["c"].bytes_list.value[0].decode() == strings[i]
        else:
            assert "c" not in feature
        assert list(feature["label"].int64_list.value) == [i]
    # And through tf.io.parse_example, as training reads them.
    parsed = tf.io.parse_example(tf.constant(records), {"a": tf.io.VarLenFeature(tf.int64),
                                                        "c": tf.io.VarLenFeature(tf.string)})
    assert parsed["a"].values.numpy().tolist() == ints[present_i].tolist()
    assert len(parsed["c"].values) == int(present_s.sum())
