"""The pure pieces, each on its own table: they run in milliseconds, and a failure names the piece."""

from __future__ import annotations

import math

import numpy as np
import pytest

# ---- the data stage's quantile sketch --------------------------------------------------------------


@pytest.mark.parametrize("values", [
    np.arange(1000, dtype=np.float64),                          # fits in one level: exact
    np.random.default_rng(0).normal(size=200_000),              # many compactions
    np.random.default_rng(1).exponential(size=100_000) ** 3,    # heavy tail
    np.repeat([1.0, 2.0, 3.0], 50_000),                         # few distinct values
])
def test_quantile_sketch_ranks_within_one_percent_of_numpy(values):
    from tfpipe.pipeline.stats import QUANTILES, QuantileSketch

    sketch = QuantileSketch()
    for chunk in np.array_split(values, 37):
        sketch.add(chunk)
    ordered = np.sort(values)
    for q, got in zip(QUANTILES, sketch.quantiles(QUANTILES), strict=True):
        # the rank of the answer in the true data, against the rank asked for
        lo, hi = np.searchsorted(ordered, got, "left"), np.searchsorted(ordered, got, "right")
        want = q * len(values)
        error = 0.0 if lo <= want <= hi else min(abs(lo - want), abs(hi - want)) / len(values)
        assert error <= 0.01, (q, got, error)


def test_quantile_sketches_merge_as_if_fed_one_stream():
    from tfpipe.pipeline.stats import QuantileSketch

    values = np.random.default_rng(2).uniform(0, 100, size=60_000)
    parts = [QuantileSketch() for _ in range(3)]
    for part, chunk in zip(parts, np.array_split(values, 3), strict=True):
        part.add(chunk)
    merged = parts[0]
    merged.merge(parts[1])
    merged.merge(parts[2])
    for q, got in zip((0.1, 0.5, 0.9), merged.quantiles((0.1, 0.5, 0.9)), strict=True):
        assert abs(got - np.quantile(values, q)) <= 2.0, (q, got)  # 2% of the range
    assert QuantileSketch().quantiles((0.5,)) == [None]  # empty: no value, not a crash


# ---- tensors <-> TensorProto (the server's gRPC side) ----------------------------------------------

@pytest.mark.parametrize("value", [
    np.array([1.5, -2.25], np.float32),
    np.array([[1, 2, 3], [4, 5, 6]], np.int64),
    np.array([True, False]),
    np.array([0.1], np.float64),
    np.array([b"a", b"\xff\x00"], dtype=object),
    np.zeros((0, 3), np.float32),
    np.array(7, np.int32),  # a scalar
    np.array([1.5, -0.25], np.float16),  # no typed field of ours: tf.make_tensor_proto's
])
@pytest.mark.parametrize("content", [False, True])
def test_tensor_proto_round_trips(value, content):
    from tfpipe.serve.codecs.tensor_proto import tensor_proto, tensor_to_numpy

    from tensorflow.core.framework import tensor_pb2

    made = tensor_proto(value, content=content)
    filled = tensor_pb2.TensorProto()
    assert tensor_proto(value, content=content, into=filled) is filled and filled == made
    back = tensor_to_numpy(made)
    assert back.shape == value.shape
    assert back.tolist() == value.tolist()
    if value.dtype != object:
        assert back.dtype == value.dtype


def test_tensor_protos_follow_tfs_rules_for_short_values_and_open_shapes():
    from tensorflow.core.framework import tensor_pb2, types_pb2

    from tfpipe.serve.errors import ServingError
    from tfpipe.serve.codecs.tensor_proto import tensor_to_numpy

    short = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[1.0, 2.0])
    short.tensor_shape.dim.add(size=4)
    assert tensor_to_numpy(short).tolist() == [1.0, 2.0, 2.0, 2.0]  # the last value repeats
    open_shape = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[1.0])
    open_shape.tensor_shape.dim.add(size=-1)
    with pytest.raises(ServingError, match="fully defined shape"):
        tensor_to_numpy(open_shape, "x")


def _one_input(dtype: str, field: str, values: list, dims: list[int], content: bytes = b""):
    from tensorflow.core.framework import tensor_pb2, types_pb2

    proto = tensor_pb2.TensorProto(dtype=getattr(types_pb2, dtype), tensor_content=content)
    getattr(proto, field).extend(values)
    for d in dims:
        proto.tensor_shape.dim.add(size=d)
    return proto


@pytest.mark.parametrize("dtype, field, values, dims, content, taken", [
    ("DT_FLOAT", "float_val", [1.5], [1], b"", True),
    ("DT_DOUBLE", "double_val", [float("nan")], [1], b"", True),
    ("DT_INT32", "int_val", [-2**31], [1], b"", True),
    ("DT_INT64", "int64_val", [2**63 - 1], [1], b"", True),
    ("DT_BOOL", "bool_val", [True], [1], b"", True),
    ("DT_STRING", "string_val", [b"\xff\x00"], [1], b"", True),
    ("DT_FLOAT", "float_val", [1.0, 2.0], [2], b"", False),  # two rows
    ("DT_FLOAT", "float_val", [1.0], [1, 1], b"", False),  # a rank-2 tensor
    ("DT_FLOAT", "float_val", [], [1], b"", False),  # no value: TF's zero
    ("DT_FLOAT", "float_val", [], [1], np.float32(4).tobytes(), False),  # tensor_content
    ("DT_INT8", "int_val", [5], [1], b"", False),  # a narrow integer: tensor_to_numpy's checks
    ("DT_FLOAT", "float_val", [1.0], [], b"", False),  # a scalar
])
def test_one_value_grpc_inputs_read_in_one_pass_as_tensor_to_numpy_reads_them(dtype, field, values, dims,
                                                                                content, taken):
    from tensorflow_serving.apis import predict_pb2

    from tfpipe.serve.codecs.tensor_proto import one_value_inputs, predict_inputs, tensor_to_numpy

    request = predict_pb2.PredictRequest()
    request.inputs["a"].CopyFrom(_one_input("DT_FLOAT", "float_val", [0.5], [1]))
    request.inputs["b"].CopyFrom(_one_input(dtype, field, values, dims, content))
    request.inputs["c"].CopyFrom(_one_input("DT_STRING", "string_val", [b"x"], [1]))
    assert (one_value_inputs(request.inputs) is not None) is taken
    got = predict_inputs(request)
    assert list(got) == list(request.inputs)  # in the request's order
    for name, proto in request.inputs.items():
        want = tensor_to_numpy(proto, name)
        assert (got[name].dtype, got[name].shape) == (want.dtype, want.shape), name
        np.testing.assert_array_equal(got[name], want)


def _requests_of_every_kind():
    """One request of each message type the gRPC services take, as clients serialize them."""
    from grpc_health.v1 import health_pb2
    from tensorflow_serving.apis import (classification_pb2, get_model_metadata_pb2, get_model_status_pb2,
                                         inference_pb2, model_management_pb2, predict_pb2, regression_pb2)

    spec = {"name": "m", "signature_name": "s"}
    predict = predict_pb2.PredictRequest(model_spec=spec, output_filter=["y"])
    predict.inputs["x"].CopyFrom(_one_input("DT_FLOAT", "float_val", [0.5], [1]))
    return [predict, predict_pb2.PredictRequest(output_filter=["y"]), classification_pb2.ClassificationRequest(
        model_spec=spec), regression_pb2.RegressionRequest(model_spec=spec), inference_pb2.MultiInferenceRequest(
        tasks=[{"model_spec": spec}]), get_model_metadata_pb2.GetModelMetadataRequest(
        model_spec=spec, metadata_field=["signature_def"]), get_model_status_pb2.GetModelStatusRequest(
        model_spec=spec), model_management_pb2.ReloadConfigRequest(metric_names=["a"]),
        health_pb2.HealthCheckRequest(service="x")]


def test_a_compressed_grpc_message_is_told_by_its_first_bytes():
    """grpc core hands compressed messages on as they came (grpc_calls): gzip and zlib streams, at every
    level and of any text, are told apart from every request the services take, serialized."""
    import gzip
    import zlib

    from tfpipe.serve.transports.grpc_calls import DEFLATE, GZIP, compression

    for request in _requests_of_every_kind():
        raw = request.SerializeToString()
        assert raw and compression(raw) == 0, request
        for level in range(10):
            assert compression(gzip.compress(raw, compresslevel=level)) == GZIP
            assert compression(zlib.compress(raw, level)) == DEFLATE
    assert compression(b"") == 0 and compression(b"\x1f") == 0 and compression(b"\x78\x00") == 0


def test_finished_gives_a_coroutine_that_never_waits_its_value_and_refuses_one_that_would():
    import asyncio

    from tfpipe.serve.core.examples import finished

    async def at_once(x):
        return x * 2

    async def waits():
        await asyncio.sleep(0)
        return 1

    assert finished(at_once(21)) == 42
    with pytest.raises(RuntimeError, match="needs an event loop"):
        finished(waits())


# ---- model version policy ---------------------------------------------------------------------------

@pytest.mark.parametrize("policy_text,on_disk,failed,expected", [
    ("", {1, 2, 3}, set(), [3]),                                      # no policy: TF Serving's latest 1
    ("latest { num_versions: 2 }", {1, 2, 3}, set(), [3, 2]),         # newest first
    ("latest { num_versions: 2 }", {1, 2, 3}, {3}, [2, 1]),           # a failed load is passed over
    ("all {}", {4, 1, 9}, {9}, [1, 4, 9]),
    ("specific { versions: 2 versions: 7 }", {1, 2, 3}, set(), [2]),  # 7 is not on disk
    ("latest {}", set(), set(), []),
])
def test_version_policy_picks_tf_servings_versions(policy_text, on_disk, failed, expected):
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    from tfpipe.serve.core.manager import wanted_versions

    policy = None
    if policy_text:  # as a models.config gives it
        policy = text_format.Parse(f"model_version_policy {{ {policy_text} }}",
                                   model_server_config_pb2.ModelConfig()).model_version_policy
    assert wanted_versions(policy, dict.fromkeys(on_disk, "path"), failed) == expected


# ---- load test: SLO terms and the latency histogram -------------------------------------------------

@pytest.mark.parametrize("text,expected", [
    ("p99<20ms", [("p99", "<", 20.0)]),
    ("p50<=500us, p99.9<1s", [("p50", "<=", 0.5), ("p99.9", "<", 1000.0)]),
    ("errors<0.1%", [("errors", "<", 0.001)]),
    ("errors<0.01", [("errors", "<", 0.01)]),
    ("rps>=100,", [("rps", ">=", 100.0)]),
    ("", []),
])
def test_slo_terms_parse(text, expected):
    from tfpipe.loadtest.slo import parse_slo

    got = parse_slo(text)
    assert [t[:2] for t in got] == [t[:2] for t in expected]
    assert [t[2] for t in got] == pytest.approx([t[2] for t in expected])


@pytest.mark.parametrize("text,message", [
    ("p99<20", "give a unit"),
    ("p99<20%", "give a unit"),
    ("errors<1ms", "errors take %"),
    ("rps>100ms", "rps takes a plain number"),
    ("p42<1ms", "cannot parse SLO term 'p42<1ms'"),
    ("p99 = 1ms", "cannot parse"),
])
def test_slo_terms_refused_name_the_term(text, message):
    from tfpipe.loadtest.errors import LoadtestError
    from tfpipe.loadtest.slo import parse_slo

    with pytest.raises(LoadtestError, match=message):
        parse_slo(text)


@pytest.mark.parametrize("slo,step,failed", [
    ("p99<20ms", {"p99_ms": 19.9}, []),
    ("p99<20ms", {"p99_ms": 20.0}, ["p99 20 not < 20"]),
    ("errors<1%,rps>10", {"error_fraction": 0.02, "rps": 11.0}, ["errors 0.02 not < 0.01"]),
    ("mean<=1ms,max<2ms", {"mean_ms": 1.0, "max_ms": 3.0}, ["max 3 not < 2"]),
])
def test_slo_check_names_each_broken_term(slo, step, failed):
    from tfpipe.loadtest.slo import check, parse_slo

    assert check(parse_slo(slo), step) == failed


@pytest.mark.parametrize("n_rows,batch_size,requests,first_rows", [
    (3, 1, 3, [[0], [1], [2]]),                     # fewer rows than requests: each once
    (3, 2, 2, [[0, 1], [2, 0]]),                    # a batch wraps around to the first row
    (2000, 1, 200, [[0], [10], [20]]),              # more rows than 200 requests hold: spread over all
    (2000, 4, 200, [[0, 2, 5, 7], [10, 12, 15, 17]]),
    (450, 4, 113, [[0, 1, 2, 3], [4, 5, 6, 7]]),    # 452 slots for 450 rows: cycle, no row left out
])
def test_load_test_requests_sample_the_whole_split(n_rows, batch_size, requests, first_rows):
    from tfpipe.loadtest.payloads import chunks

    rows = [{"i": i} for i in range(n_rows)]
    got = [[r["i"] for r in chunk] for chunk in chunks(rows, batch_size)]
    assert len(got) == requests and all(len(c) == batch_size for c in got)
    assert got[:len(first_rows)] == first_rows
    sent = {i for c in got for i in c}
    assert sent == set(range(n_rows)) if n_rows <= requests * batch_size else max(sent) >= n_rows * 0.99


@pytest.mark.parametrize("seconds,p,expected_ms", [
    ([0.001] * 99 + [0.5], 50, 1.0),
    ([0.001] * 99 + [0.5], 99, 1.0),
    ([0.001] * 99 + [0.5], 100, 500.0),
    ([0.0001234], 50, 0.123),          # to the microsecond below 10 ms
    ([0.0123456], 50, 12.35),          # 4 significant digits above
    ([i / 1e4 for i in range(1, 1001)], 90, 90.0),
])
def test_latency_histogram_percentiles(seconds, p, expected_ms):
    from tfpipe.loadtest.histogram import LatencyHistogram

    h = LatencyHistogram()
    for s in seconds:
        h.add(s)
    assert h.percentile(p) == pytest.approx(expected_ms, rel=5e-4, abs=1e-3)


def test_latency_histograms_merge_and_survive_json():
    from tfpipe.loadtest.histogram import LatencyHistogram

    a, b, both = LatencyHistogram(), LatencyHistogram(), LatencyHistogram()
    for i, s in enumerate(np.random.default_rng(3).exponential(0.002, size=5000)):
        (a if i % 2 else b).add(s)
        both.add(s)
    a.merge(b)
    assert a.summary() == pytest.approx(both.summary())
    again = LatencyHistogram.from_json(a.to_json())
    assert again.summary() == pytest.approx(both.summary()) and again.n == 5000
    assert math.isnan(LatencyHistogram().percentile(50))


# ---- TF Serving config files ------------------------------------------------------------------------

@pytest.mark.parametrize("batching", [False, True])
def test_config_writers_write_what_tf_servings_protos_read(tmp_path, batching):
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    from tfpipe.serve.config import ServeConfig
    from tfpipe.serve.flags import ServeOptions
    from tfpipe.serve.tfserving.protos import BatchingParameters, MonitoringConfig
    from tfpipe.serve.deploy import write_batching
    from tfpipe.serve.tfserving.launcher import server_flags, write_configs

    params = ""
    if batching:
        params = write_batching(str(tmp_path / "params.config"),
                                ServeConfig(max_batch_size=16, batch_timeout_micros=500, num_batch_threads=3))
    opts = ServeOptions(model_name="taxi", model_base_path="/m/taxi", enable_batching=batching,
                        batching_parameters_file=params)
    paths = write_configs(opts, str(tmp_path / "cfg"))
    assert sorted(paths) == (["batching", "models", "monitoring"] if batching else ["models", "monitoring"])
    models = text_format.Parse(open(paths["models"]).read(), model_server_config_pb2.ModelServerConfig())
    (model,) = models.model_config_list.config
    assert (model.name, model.base_path, model.model_platform) == ("taxi", "/m/taxi", "tensorflow")
    monitoring = text_format.Parse(open(paths["monitoring"]).read(), MonitoringConfig())
    assert monitoring.prometheus_config.enable
    flags = server_flags(opts, paths, ports=False)
    assert f"--model_config_file={paths['models']}" in flags
    assert ("--enable_batching=true" in flags) == batching
    if batching:
        b = text_format.Parse(open(paths["batching"]).read(), BatchingParameters())
        assert (b.max_batch_size.value, b.batch_timeout_micros.value, b.num_batch_threads.value) == (16, 500, 3)
        assert f"--batching_parameters_file={paths['batching']}" in flags


# ---- the serve step's check -------------------------------------------------------------------------

@pytest.mark.parametrize("got,tolerance,worst,message", [
    ({"p": [[0.1, 0.9]], "c": [b"b"]}, 1e-6, 0.0, None),
    ({"p": [[0.1000001, 0.9]], "c": ["b"]}, 1e-5, 1e-7, None),   # strings compare decoded
    ({"p": [[0.2, 0.9]], "c": [b"b"]}, 1e-5, None, "output p differs from the SavedModel by 0.1"),
    ({"p": [[0.1, 0.9]], "c": [b"a"]}, 1e-5, None, "answered c=\\['a'\\]"),
    ({"c": [b"b"]}, 1e-5, None, "answered no output 'p'"),
    ({"p": [[0.1]], "c": [b"b"]}, 1e-5, None, "has 1 values where the SavedModel gives 2"),
])
def test_served_answers_are_compared_output_by_output(got, tolerance, worst, message):
    from tfpipe.serve.deploy import CheckFailed, compare

    want = {"p": np.array([[0.1, 0.9]], np.float32), "c": np.array([b"b"], dtype=object)}
    got = {k: np.array(v, dtype=object if k == "c" else np.float64) for k, v in got.items()}
    if message:
        with pytest.raises(CheckFailed, match=message):
            compare("REST", want, got, tolerance)
    else:
        assert compare("REST", want, got, tolerance) == pytest.approx(worst, abs=1e-7)


def test_deadlines_time_out_only_the_requests_past_theirs_on_one_timer():
    """The REST timeout: each request's work runs on its own task; those still running when their
    deadline passes end in TimeoutError, the others answer, and a cancellation from elsewhere (a
    client gone) stays a CancelledError."""
    import asyncio

    from tfpipe.serve.transports.deadlines import Deadlines

    async def main():
        d = Deadlines(0.2)

        async def request(hold: float, delay: float = 0.0):
            await asyncio.sleep(delay)
            try:
                return await d.run(asyncio.sleep(hold, "answered"))
            except TimeoutError:
                return "timed out", asyncio.get_running_loop().time()

        loop = asyncio.get_running_loop()
        t0 = loop.time()
        # the second starts 0.1 s later, so its deadline is the timer's second stop
        results = await asyncio.gather(request(5), request(5, 0.1), request(0.05), request(0.05, 0.12))
        gone = asyncio.create_task(request(5))
        await asyncio.sleep(0.05)
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        return t0, results, d

    t0, results, d = asyncio.run(main())
    (first, at1), (second, at2) = results[0], results[1]
    assert (first, second, results[2], results[3]) == ("timed out", "timed out", "answered", "answered")
    assert 0.2 <= at1 - t0 < 0.3 and 0.3 <= at2 - t0 < 0.4, (at1 - t0, at2 - t0)
    assert not d._deadlines and not d._expired  # nothing kept of finished requests


@pytest.mark.parametrize("inputs, rows, cut", [
    ({"a": np.arange(10), "b": np.arange(20).reshape(10, 2)}, 4, [4, 4, 2]),
    ({"a": np.arange(8)}, 4, [4, 4]),
    ({"a": np.arange(4)}, 4, None),  # few enough rows: one call
    ({"a": np.arange(10)}, 0, None),  # no limit
    ({"a": np.arange(10), "b": np.arange(9)}, 4, None),  # first dimensions differ: not rows
    ({"a": np.float32(1.0)}, 4, None),  # a scalar
])
def test_a_requests_rows_are_cut_into_calls_and_the_answers_joined(inputs, rows, cut):
    from tfpipe.serve.core.batching import join_rows, row_parts

    parts = row_parts(inputs, rows)
    if cut is None:
        assert parts is None
        return
    assert [len(p["a"]) for p in parts] == cut
    outputs = [{"y": p["a"] * 2, "z": np.stack([p["a"], p["a"]], 1)} for p in parts]
    joined = join_rows(outputs, cut)
    assert joined["y"].tolist() == (inputs["a"] * 2).tolist() and joined["z"].shape == (len(inputs["a"]), 2)
    assert join_rows([{"total": np.float32(p["a"].sum())} for p in parts], cut) is None  # one number per call
    assert join_rows([{"y": p["a"][:1]} for p in parts], cut) is None  # not one row per row


@pytest.mark.parametrize("body", [
    {"predictions": [{"a": i, "b": [i / 3, float("nan")]} for i in range(10)]},
    {"outputs": {"x": list(range(9)), "y": [[1.5, 2.5]] * 9, "z": "s"}},
    {"results": [[["a", 0.5]]] * 4, "n": []},
    {"predictions": 3.5},
])
def test_a_large_answer_written_in_pieces_is_the_text_of_one_dumps(body, monkeypatch):
    import json

    from tfpipe.serve.transports import rest_answers

    pieces = list(rest_answers.text_in_pieces(body, items=4))
    assert "".join(pieces) == json.dumps(body, allow_nan=True)
    monkeypatch.setattr(rest_answers, "ANSWER_CHUNK_BYTES", 16)
    chunks = rest_answers.encoded(iter(pieces))
    assert b"".join(chunks) == json.dumps(body, allow_nan=True).encode()
    assert all(len(c) >= 16 for c in chunks[:-1]) and (len(chunks) > 1) == (len(json.dumps(body)) > 16)


def _outputs(n: int) -> list[dict]:
    rng = np.random.default_rng(n)
    return [
        {"p": rng.random((n, 3)).astype(np.float32), "c": np.array([b"a", b"\xff"] * n, dtype=object)[:n],
         "i": np.arange(n)},
        {"p": rng.random(n).astype(np.float32)},
        {"p": np.array([np.nan, -np.inf] * n, dtype=np.float32)[:n], "s": np.float32(3.0)},
        {"a": np.zeros(n), "b": np.zeros(n + 1)},
        {"x_bytes": np.array([b"\x00\x01"] * n, dtype=object)},
    ]


@pytest.mark.parametrize("outputs", [o for n in (0, 1, 3, 4, 7, 12) for o in _outputs(n)])
@pytest.mark.parametrize("row_format", [True, False])
def test_an_answer_written_rows_at_a_time_is_the_text_of_one_dumps(outputs, row_format):
    """json_output_text gives json_outputs' text, or its error, whether the outputs are cut or not
    (3 rows a piece: 4, 7 and 12 rows are cut; a 0-d output and unequal rows are not)."""
    from tfpipe.serve.codecs.rest_json import dumps, json_output_text, json_outputs
    from tfpipe.serve.errors import ServingError

    def text(fn):
        try:
            return fn()
        except ServingError as e:
            return "error: " + e.message

    whole = text(lambda: dumps(json_outputs(outputs, row_format)))
    pieces = text(lambda: list(json_output_text(outputs, row_format, rows=3)))
    if whole.startswith("error: "):
        assert pieces == whole
    else:
        assert "".join(pieces) == whole
        assert (len(pieces) > 1) == (max((v.shape[0] for v in outputs.values() if v.ndim), default=0) > 3)


def test_a_parsed_document_held_elsewhere_is_not_taken_apart():
    """_take_apart empties what only it holds; what something else holds stays whole."""
    from tfpipe.serve.transports.rest_api import _take_apart

    rows = [{"a": i} for i in range(3000)]
    doc = {"instances": rows, "signature_name": "s"}
    _take_apart([doc])  # `doc` holds it here too
    assert doc == {"instances": rows, "signature_name": "s"} and len(rows) == 3000
    held = [{"instances": rows, "other": [1, 2]}]
    _take_apart(held)  # its own dict and list go; `rows`, held here too, stays
    assert held == [] and len(rows) == 3000 and rows[-1] == {"a": 2999}
    mine = [{"instances": [{"a": i} for i in range(3000)]}]
    inner = mine[0]["instances"]
    _take_apart(mine)
    assert inner == [{"a": i} for i in range(3000)]  # held here: not emptied


@pytest.mark.parametrize("gc_on", [True, False])
def test_large_requests_pause_the_collector_and_shorten_the_switch_interval_until_the_last_ends(gc_on):
    import gc
    import sys

    from tfpipe.serve.core.large_requests import LARGE_SWITCH_SECONDS, large_request

    was_on, was_interval = gc.isenabled(), sys.getswitchinterval()
    (gc.enable if gc_on else gc.disable)()
    try:
        first = large_request()
        first.__enter__()
        assert not gc.isenabled() and sys.getswitchinterval() == pytest.approx(LARGE_SWITCH_SECONDS)
        with large_request():
            pass
        assert not gc.isenabled() and sys.getswitchinterval() == pytest.approx(LARGE_SWITCH_SECONDS)
        first.__exit__(None, None, None)
        assert gc.isenabled() == gc_on and sys.getswitchinterval() == pytest.approx(was_interval)
    finally:
        (gc.enable if was_on else gc.disable)()
        sys.setswitchinterval(was_interval)


@pytest.mark.parametrize("value", [np.arange(0, dtype=np.float32), np.arange(65_537, dtype=np.float32),
                                   np.arange(140_000, dtype=np.int64).reshape(70_000, 2),
                                   np.array([b"s%d" % i for i in range(70_000)], dtype=object)])
def test_a_long_tensor_is_filled_in_parts_with_the_same_values(value):
    import tensorflow as tf

    from tfpipe.serve.codecs.tensor_proto import tensor_proto

    proto = tensor_proto(value)
    assert tf.make_ndarray(proto).tolist() == value.tolist()


@pytest.mark.parametrize("cpu_max, cores", [
    ("max 100000", None), ("200000 100000", 2), ("150000 100000", 2), ("50000 100000", 1), ("", None),
    ("100000", None), ("x 100000", None), ("0 100000", None),
])
def test_a_cgroup_cpu_quota_in_whole_cores(cpu_max, cores):
    from tfpipe.machine import quota_cores

    assert quota_cores(cpu_max) == cores


def test_the_cores_a_process_may_use_are_its_affinity_within_its_quota(tmp_path):
    import os

    from tfpipe.machine import cores

    affinity = len(os.sched_getaffinity(0))
    assert cores(str(tmp_path)) == affinity  # no cgroup files: no quota
    (tmp_path / "cpu.max").write_text("100000 100000\n")
    assert cores(str(tmp_path)) == 1
    (tmp_path / "cpu.max").write_text(f"{100000 * (affinity + 3)} 100000\n")
    assert cores(str(tmp_path)) == affinity  # a quota above the cores it may run on does not add any
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("100000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cores(str(tmp_path)) == 1  # cgroups v1
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cores(str(tmp_path)) == affinity


@pytest.mark.parametrize("text", [
    "1,a,2.5\n3,b,4\n",
    "1,a,2.5\r\n3,b,4\r\n",
    "1,a,2.5\n3,b,4",                 # no newline at the end (a file's last block)
    "1,a,2.5\n\n3,b,4\n",             # a blank line: csv.reader skips it
    "1,a\n3,b,4\n",                   # a short record: dead-lettered
    "1,a,2.5,9\n3,b,4\n",             # a long one
    '1,"a,b",2\n3,b,4\n',             # a quoted field: csv.reader's own loop
    "1,a,2\r3,b,4\n",                 # a lone carriage return ends a record for csv.reader
    "1,a\x00b,2\n",                   # a NUL: csv.reader refuses the line
    " 1 , a ,2\n",                    # spaces are kept, as csv.reader keeps them
    "1,2.5,a\r\n3,4,b\r\n",           # CRLF with a text last: no carriage return left in it
])
def test_the_plain_csv_split_reads_what_csv_reader_reads(text):
    """The reader's fast path (a block with no quote: split each line at the delimiter) gives the
    same rows, lines and dead-letter entries as csv.reader's loop, or leaves the block to it."""
    from tfpipe.pipeline import validation
    from tfpipe.pipeline.schema import Feature, Label, Schema

    last_text = text.startswith("1,2.5,")
    schema = (Schema([Feature("x", "int"), Feature("y", "float")], Label("s", "string", "binary"))
              if last_text else Schema([Feature("x", "int"), Feature("s", "string")], Label("y", "float", "regression")))
    header = ("x", "y", "s") if last_text else ("x", "s", "y")

    def read():
        b = validation.Validator(schema).csv_batch("f.csv", header, text, 2)
        return (b.lines.tolist(), b.raws, {k: (c.values.tolist(), c.present.tolist()) for k, c in b.columns.items()},
                b.bad)

    fast = read()
    plain = validation._plain_text
    validation._plain_text = lambda _: False  # csv.reader's loop for every block
    try:
        slow = read()
    finally:
        validation._plain_text = plain
    assert fast == slow


def test_a_child_process_imports_the_installed_tfpipe_from_a_folder_holding_a_tfpipe_folder(tmp_path):
    """Run from the parent of a clone (a folder holding a folder named tfpipe), `python -m` put that
    folder first on the child's import path and the child imported it as the package; module_argv's
    children import the installed one."""
    import subprocess
    import sys

    from tfpipe.children import module_argv

    (tmp_path / "tfpipe" / "serve").mkdir(parents=True)
    shadowed = subprocess.run([sys.executable, "-m", "tfpipe.cli", "--version"], cwd=tmp_path, capture_output=True,
                              text=True)
    assert shadowed.returncode != 0 and "from 'tfpipe' (unknown location)" in shadowed.stderr  # what they met
    child = subprocess.run(module_argv("tfpipe.cli", "--version"), cwd=tmp_path, capture_output=True, text=True)
    assert child.returncode == 0 and child.stdout.startswith("tfpipe "), child.stderr
