"""The REST API's JSON-to-tensor path fuzzed in process (tests/rest_fuzz.py has the strategies and
the long run over HTTP): a client's body, however malformed, becomes tensors, tf.Examples or a
ServingError (a 4xx), never another exception (a 500)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings

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

    from tfpipe.serve.errors import ServingError
    from tfpipe.serve.requests import json_examples, json_inputs
    from tfpipe.serve.rest_api import parse_json

    body, mutation, rng = request
    raw = encode(body, mutation, rng)
    try:
        parsed = parse_json(raw)
    except ServingError as e:
        assert e.http_status < 500
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
    from tfpipe.serve.requests import json_inputs
    from tfpipe.serve.rest_api import parse_json

    raw = ('{"instances": ' + "[" * depth + "1.0" + "]" * depth + "}").encode()
    try:
        tensors, _ = json_inputs(parse_json(raw), {"x": tf.float32})
    except ServingError as e:
        assert e.http_status == 400 and depth > 64
        assert "nested" in e.message or "Terminate parsing" in e.message, e.message
    else:
        assert depth <= 64 and tensors["x"].ndim == depth
