"""The REST API's JSON-to-tensor path fuzzed in process (tests/rest_fuzz.py has the strategies and
the long run over HTTP): a client's body, however malformed, becomes tensors, tf.Examples or a
ServingError (a 4xx), never another exception (a 500)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rest_fuzz import encode, requests_

SIGNATURES = [  # input name -> dtype, as the REST handler gets them from a signature
    {"x": "float32"}, {"x": "int64"}, {"x": "string"}, {"x": "bool"}, {"x": "int8"}, {"x": "float16"},
    {"species": "string", "bill_length_mm": "float32", "body_mass_g": "int64", "island": "string"},
    {"inputs": "string"},
]


# TFPIPE_FUZZ_EXAMPLES=N: a longer, randomised run of N bodies; the suite's 600 are the same every time
LONG_RUN = os.environ.get("TFPIPE_FUZZ_EXAMPLES")


@settings(max_examples=int(LONG_RUN or 600), deadline=None, database=None, derandomize=not LONG_RUN,
          suppress_health_check=list(HealthCheck))
@given(requests_)
def test_any_body_becomes_tensors_or_a_4xx(request):
    import tensorflow as tf

    from tfpipe.serve.codecs import json_text
    from tfpipe.serve.codecs.json_text import parse_json
    from tfpipe.serve.codecs.rest_json import json_examples, json_inputs
    from tfpipe.serve.errors import ServingError

    body, mutation, rng = request
    raw = encode(body, mutation, rng)

    def read():
        try:
            return parse_json(raw)
        except ServingError as e:
            assert e.http_status < 500
            return e.message

    parsed, saved = read(), json_text.PIECES_CHARS
    json_text.PIECES_CHARS = 0
    try:
        assert read() == parsed  # a long document, read value by value, reads the same
    finally:
        json_text.PIECES_CHARS = saved
    if isinstance(parsed, str):
        return
    for sig in SIGNATURES:
        try:
            json_inputs(parsed, {k: tf.as_dtype(v) for k, v in sig.items()})
        except ServingError as e:
            assert e.http_status < 500
    try:
        json_examples(parsed)
    except ServingError as e:
        assert e.http_status < 500


@pytest.mark.parametrize("depth", [63, 64, 65, 100, 999, 50_000])  # 50,000: CVE-2025-0649 in TF Serving 2.19
def test_deep_nesting_is_a_400_naming_the_depth(depth):
    import tensorflow as tf

    from tfpipe.serve.errors import ServingError
    from tfpipe.serve.codecs.rest_json import json_inputs
    from tfpipe.serve.codecs.json_text import parse_json

    raw = ('{"instances": ' + "[" * depth + "1.0" + "]" * depth + "}").encode()
    try:
        tensors, _ = json_inputs(parse_json(raw), {"x": tf.float32})
    except ServingError as e:
        assert e.http_status == 400 and depth > 64
        assert "nested" in e.message or "Terminate parsing" in e.message, e.message
    else:
        assert depth <= 64 and tensors["x"].ndim == depth


ROW_SIGNATURE = {"species": "string", "bill_length_mm": "float32", "body_mass_g": "int64", "year": "int32",
                 "flag": "bool", "ratio": "float64", "small": "int8"}
FITTING = {  # values of each input's own kind, edges included
    "string": st.text(max_size=5), "bool": st.booleans(),
    "float32": st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-2**70, 2**70),
                         st.integers(2**53 - 2, 2**53 + 2), st.just(2**60 + 2**36 + 1)),
    "int64": st.integers(-2**63 - 2, 2**63 + 2), "int32": st.integers(-2**31 - 2, 2**31 + 2),
    "int8": st.integers(-200, 200)}
FITTING["float64"] = FITTING["float32"]
STRANGERS = st.one_of(st.floats(), st.integers(), st.booleans(), st.text(max_size=3), st.none(),
                      st.just({"b64": "AA=="}), st.lists(st.integers(0, 3), max_size=2))


def _same_tensors(got: dict, want: dict) -> None:
    import numpy as np

    assert list(got) == list(want)
    for name in want:
        assert (got[name].dtype, got[name].shape) == (want[name].dtype, want[name].shape), name
        if want[name].dtype.kind == "f":
            np.testing.assert_array_equal(got[name], want[name])  # NaN equals NaN here
        else:
            assert got[name].tolist() == want[name].tolist(), name


def test_the_one_pass_row_reader_gives_the_exact_readers_tensors_or_leaves_the_body_to_it():
    """Rows of scalars take a faster reader (one array per dtype); where it takes a body, the exact
    reader must give the same tensors; where it leaves one, the exact reader answers (or refuses).
    Both cases must come up (derandomized: the same bodies on every run)."""
    import tensorflow as tf

    from tfpipe.serve.codecs.rest_json import _exact_instances, _scalar_rows

    taken: list[bool] = []

    @settings(max_examples=400, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(st.sets(st.sampled_from(sorted(ROW_SIGNATURE)), min_size=1), st.integers(1, 4), st.data())
    def check(names, n, data):
        inputs = {k: tf.as_dtype(ROW_SIGNATURE[k]) for k in sorted(names)}
        instances = []
        for _ in range(n):  # mostly each input's own kind, now and then another value or a key too many
            row = {k: data.draw(st.one_of(FITTING[ROW_SIGNATURE[k]], STRANGERS) if data.draw(st.integers(0, 9)) == 0
                                else FITTING[ROW_SIGNATURE[k]]) for k in inputs}
            if data.draw(st.integers(0, 19)) == 0:
                row["other"] = 1.0
            instances.append(row)
        fast = _scalar_rows(instances, inputs)
        if fast is not None:
            _same_tensors(fast, _exact_instances(instances, inputs))
        taken.append(fast is not None)

    check()
    # both readers get a good share of the bodies (which ones depends on Hypothesis's version)
    assert 0.1 < sum(taken) / len(taken) < 0.95, (sum(taken), len(taken))


@pytest.mark.parametrize("rows, block_rows", [(5, 2), (4, 2), (3, 3), (1, 1)])
def test_rows_beyond_a_block_are_converted_block_by_block_into_the_same_tensors(monkeypatch, rows, block_rows):
    """A long body's rows are converted BLOCK_ROWS at a time (a numpy call holds the GIL): the
    tensors are the exact reader's, whatever the cut."""
    import tensorflow as tf

    from tfpipe.serve.codecs import rest_json

    inputs = {k: tf.as_dtype(v) for k, v in ROW_SIGNATURE.items() if k != "small"}
    instances = [{"species": f"s{i}", "bill_length_mm": 39.5 + i, "body_mass_g": 3750 + i, "year": 2007 + i,
                  "flag": i % 2 == 0, "ratio": i / 3} for i in range(rows)]
    monkeypatch.setattr(rest_json, "BLOCK_ROWS", block_rows)
    fast = rest_json._scalar_rows(instances, inputs)
    assert fast is not None
    _same_tensors(fast, rest_json._exact_instances(instances, inputs))


@pytest.mark.parametrize("row, taken", [
    ({"species": "Adelie", "bill_length_mm": 39.1, "body_mass_g": 3750, "year": 2007, "flag": True,
      "ratio": float("nan")}, True),
    ({"species": "é", "bill_length_mm": 39, "body_mass_g": -2**63, "year": 2**31 - 1, "flag": False,
      "ratio": 1e308}, True),
    ({"species": "Adelie", "bill_length_mm": 1e39, "body_mass_g": 0, "year": 0, "flag": True, "ratio": 0.5},
     True),  # beyond float32: inf, as the exact reader makes it
    ({"species": "Adelie", "bill_length_mm": 2**53, "body_mass_g": 0, "year": 0, "flag": True, "ratio": 0.5},
     True),
    ({"species": "Adelie", "bill_length_mm": 2**60 + 2**36 + 1, "body_mass_g": 0, "year": 0, "flag": True,
      "ratio": 0.5}, False),  # an integer a double rounds: float32 straight from int64, as the exact reader
    ({"species": "Adelie", "bill_length_mm": True, "body_mass_g": 1, "year": 1, "flag": True, "ratio": 0.5},
     False),  # a boolean for a float
    ({"species": "Adelie", "bill_length_mm": 1.0, "body_mass_g": 1.5, "year": 1, "flag": True, "ratio": 0.5},
     False),  # a float for an integer
    ({"species": "Adelie", "bill_length_mm": 1.0, "body_mass_g": 1, "year": 2**31, "flag": True, "ratio": 0.5},
     False),  # beyond int32
    ({"species": {"b64": "QQ=="}, "bill_length_mm": 1.0, "body_mass_g": 1, "year": 1, "flag": True, "ratio": 0.5},
     False),  # base64 for a string
    ({"species": "A", "bill_length_mm": [1.0], "body_mass_g": 1, "year": 1, "flag": True, "ratio": 0.5},
     False),  # a list: a tensor per instance
    ({"species": "A", "bill_length_mm": 1.0, "body_mass_g": 1, "year": 1, "flag": True}, False),  # one missing
    ({"species": "A", "bill_length_mm": 1.0, "body_mass_g": 1, "year": 1, "flag": True, "other": 0.5},
     False),  # a stranger in place of one
])
def test_the_one_pass_row_reader_takes_rows_of_plain_scalars_only(row, taken):
    import tensorflow as tf

    from tfpipe.serve.errors import ServingError
    from tfpipe.serve.codecs.rest_json import _exact_instances, _scalar_rows, json_inputs

    inputs = {k: tf.as_dtype(v) for k, v in ROW_SIGNATURE.items() if k != "small"}
    instances = [row, row]
    fast = _scalar_rows(instances, inputs)
    assert (fast is not None) is taken
    if taken:
        _same_tensors(fast, _exact_instances(instances, inputs))
        assert fast["bill_length_mm"].shape == (2,) and fast["species"][1] == row["species"].encode()
    else:  # what a client gets is the exact reader's answer
        try:
            want = _exact_instances(instances, inputs)
        except ServingError as e:
            with pytest.raises(ServingError) as got:
                json_inputs({"instances": instances}, inputs)
            assert got.value.message == e.message
        else:
            _same_tensors(json_inputs({"instances": instances}, inputs)[0], want)
