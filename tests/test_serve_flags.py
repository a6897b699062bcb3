"""`tfpipe serve` takes every tensorflow_model_server flag and acts on those that apply: the
flag table against TF Serving's main.cc, the pure pieces behind the flags (table-driven),
and servers started as a user would start them (TLS with client certificates, the health
service, CORS, tensor_content answers, the method-name check, load retries, a missing base
path, version labels, platform and per-model batching configs)."""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import requests
from conftest import ROOT, free_port, spawn_cli

# its expensive fixtures (servers, runs) are session-scoped and built once, on one xdist worker: a
# worker may run other files in between, which would tear down and rebuild module-scoped ones
pytestmark = pytest.mark.xdist_group("serve_flags")

# tensorflow_model_server's flags, in the order tensorflow_serving/model_servers/main.cc defines them.
MAIN_CC_FLAGS = [
    "port", "grpc_socket_path", "rest_api_port", "rest_api_num_threads", "rest_api_timeout_in_ms",
    "rest_api_enable_cors_support", "enable_batching", "allow_version_labels_for_unavailable_models",
    "batching_parameters_file", "enable_per_model_batching_parameters", "model_config_file",
    "model_config_file_poll_wait_seconds", "model_name", "model_base_path", "num_load_threads",
    "num_unload_threads", "max_num_load_retries", "load_retry_interval_micros", "file_system_poll_wait_seconds",
    "flush_filesystem_caches", "tensorflow_session_parallelism", "tensorflow_session_config_file",
    "tensorflow_intra_op_parallelism", "tensorflow_inter_op_parallelism", "use_alts_credentials",
    "ssl_config_file", "platform_config_file", "per_process_gpu_memory_fraction", "saved_model_tags",
    "grpc_channel_arguments", "grpc_max_threads", "enable_model_warmup", "num_request_iterations_for_warmup",
    "version", "monitoring_config_file", "remove_unused_fields_from_bundle_metagraph", "prefer_tflite_model",
    "num_tflite_pools", "num_tflite_interpreters_per_pool", "enable_signature_method_name_check",
    "xla_cpu_compilation_enabled", "xla_gpu_compilation_enabled", "enable_profiler",
    "thread_pool_factory_config_file", "mixed_precision", "skip_initialize_tpu", "enable_grpc_healthcheck_service",
    "enable_serialization_as_tensor_content",
]


def _parse(*argv: str):
    from tfpipe.serve.flags import options_from_args

    from tfpipe.cli import build_parser

    args, extra = build_parser().parse_known_args(["serve", *argv])
    return options_from_args(args), extra


# ---- the flag table ------------------------------------------------------------------------

def test_the_parser_and_the_options_have_the_same_defaults():
    """One table makes both: a command line with no flag gives ServeOptions() field by field,
    and every flag the parser takes is an option (no parser-only or option-only flag)."""
    import dataclasses

    from tfpipe.serve.flags import ALL_FLAGS, ServeOptions

    opts, extra = _parse()
    assert extra == [] and opts == ServeOptions()
    assert [f.name for f in dataclasses.fields(ServeOptions)] == [f.name for f in ALL_FLAGS] + ["given"]
    assert opts.workers == 0  # auto: one per core (tfpipe.serve.workers.worker_count)


def test_every_tensorflow_model_server_flag_is_taken_and_listed_in_help():
    from tfpipe.serve.flags import TF_SERVING_FLAGS, _bool

    from tfpipe.cli import build_parser

    assert [f.name for f in TF_SERVING_FLAGS] == MAIN_CC_FLAGS and len(MAIN_CC_FLAGS) == 48
    argv, expected = [], {}
    for f in TF_SERVING_FLAGS:  # every flag given a value other than its default
        if f.kind is _bool:
            value = not f.default
            argv.append(f"--{f.name}={str(value).lower()}")
        elif f.kind is int:
            value = f.default + 3
            argv.append(f"--{f.name}={value}")
        elif f.kind is float:
            value = 0.25
            argv.append(f"--{f.name}={value}")
        else:
            value = f"{f.name}-value"
            argv.append(f"--{f.name}={value}")
        expected[f.name] = value
    opts, extra = _parse(*argv)
    assert extra == []
    assert {k: getattr(opts, k) for k in expected} == expected
    assert opts.given == set(MAIN_CC_FLAGS)
    serve = next(a for a in build_parser()._subparsers._group_actions[0].choices.items() if a[0] == "serve")[1]
    text = serve.format_help()
    for name in MAIN_CC_FLAGS:
        assert f"--{name}" in text, name


@pytest.mark.parametrize("argv,name,value", [
    (["--enable_batching"], "enable_batching", True),
    (["--enable_batching=true"], "enable_batching", True),
    (["--enable_batching=false"], "enable_batching", False),
    (["--enable_batching=1"], "enable_batching", True),
    (["--enable_model_warmup=0"], "enable_model_warmup", False),
    (["--port=9000"], "port", 9000),
    (["--port", "9000"], "port", 9000),
    (["--per_process_gpu_memory_fraction=0.5"], "per_process_gpu_memory_fraction", 0.5),
])
def test_flags_parse_as_tensorflow_model_server_parses_them(argv, name, value):
    opts, _ = _parse(*argv)
    assert getattr(opts, name) == value and name in opts.given


def test_ignored_flags_are_named_with_the_reason_only_when_given():
    from tfpipe.serve.flags import ignored_flag_notes

    opts, _ = _parse("--prefer_tflite_model=true", "--enable_profiler", "--port=9000")
    notes = ignored_flag_notes(opts)
    assert len(notes) == 2 and all("accepted and ignored: " in n for n in notes)
    assert any(n.startswith("--prefer_tflite_model ") for n in notes)
    assert ignored_flag_notes(_parse("--port=9000")[0]) == []


# ---- pure pieces behind the flags ---------------------------------------------------------

@pytest.mark.parametrize("text,expected", [
    ("", []),
    ("grpc.so_reuseaddr=1", [("grpc.so_reuseaddr", 1)]),
    ("grpc.max_connection_age_ms=2000,grpc.lb_policy_name=grpclb",
     [("grpc.max_connection_age_ms", 2000), ("grpc.lb_policy_name", "grpclb")]),
    ("a=1,a=2", [("a", 2)]),  # the later one wins
    ("big=4294967296", [("big", "4294967296")]),  # beyond int32: passed as a string, as TF Serving does
])
def test_channel_arguments(text, expected):
    from tfpipe.serve.tfserving.configs import channel_arguments

    assert channel_arguments(text) == expected


def test_channel_arguments_refuse_what_is_not_key_value():
    from tfpipe.serve.tfserving.configs import channel_arguments
    from tfpipe.serve.errors import ServeError

    with pytest.raises(ServeError, match="not KEY=VALUE"):
        channel_arguments("grpc.so_reuseaddr")


@pytest.mark.parametrize("name,version", [
    ("1", 1), ("00000123", 123), ("0", 0), ("+5", 5), ("-3", -3), (" 7 ", 7), ("9223372036854775807", 2**63 - 1),
    ("9223372036854775808", None), ("1_000", None), ("1.0", None), ("v1", None), ("", None), ("assets", None),
])
def test_version_directory_names_read_as_tf_serving_reads_them(name, version):
    from tfpipe.serve.core.manager import version_number

    assert version_number(name) == version


def test_version_directories_on_disk(tmp_path):
    from tfpipe.serve.core.manager import versions_on_disk

    for d in ("00000123", "7", "tmp", "00000124.partial"):
        (tmp_path / d).mkdir()
    (tmp_path / "99").write_text("a file, not a version")
    assert {v: name for v, (name, _) in versions_on_disk(str(tmp_path)).items()} == {123: "00000123", 7: "7"}


def test_base_path_findings_say_what_is_wrong(tmp_path):
    from tfpipe.serve.core.manager import base_path_finding

    assert "Could not find base path" in base_path_finding("m", str(tmp_path / "nope"), {}, None)
    (tmp_path / "file").write_text("x")
    assert "a file, not a directory" in base_path_finding("m", str(tmp_path / "file"), {}, None)
    flat = tmp_path / "flat"
    (flat / "variables").mkdir(parents=True)
    (flat / "saved_model.pb").write_bytes(b"")
    text = base_path_finding("m", str(flat), {}, None)
    assert "No versions of servable m found under base path" in text
    assert "saved_model.pb, variables/" in text and f"move it into {flat}/1/" in text
    assert base_path_finding("m", str(flat), {1: ("1", 0.0)}, None) == ""


def test_session_bundle_config_follows_tensorflow_model_server(tmp_path):
    from tfpipe.serve.tfserving.configs import session_bundle_config
    from tfpipe.serve.errors import ServeError

    cfg = session_bundle_config(_parse("--model_base_path=x", "--enable_batching",
                                       "--tensorflow_session_parallelism=3", "--saved_model_tags=serve,gpu",
                                       "--num_request_iterations_for_warmup=4", "--mixed_precision=bfloat16")[0])
    assert cfg.batching_parameters.thread_pool_name.value == "model_server_batch_threads"
    assert (cfg.session_config.intra_op_parallelism_threads, cfg.session_config.inter_op_parallelism_threads) == (3, 3)
    assert list(cfg.saved_model_tags) == ["serve", "gpu"]
    assert cfg.model_warmup_options.num_request_iterations.value == 4 and cfg.mixed_precision == "bfloat16"
    with pytest.raises(ServeError, match="You cannot configure all"):
        session_bundle_config(_parse("--tensorflow_session_parallelism=1", "--tensorflow_intra_op_parallelism=1",
                                     "--tensorflow_inter_op_parallelism=1")[0])
    with pytest.raises(ServeError, match="enable_batching"):
        session_bundle_config(_parse(f"--batching_parameters_file={tmp_path / 'b'}")[0])
    platform = tmp_path / "platform.config"
    platform.write_text(PLATFORM_CONFIG)
    cfg = session_bundle_config(_parse(f"--platform_config_file={platform}", "--enable_batching=false")[0])
    assert cfg.batching_parameters.max_batch_size.value == 4  # the platform config replaces the flags
    assert cfg.session_config.inter_op_parallelism_threads == 2 and list(cfg.saved_model_tags) == ["serve"]


PLATFORM_CONFIG = """platform_configs {
  key: "tensorflow"
  value {
    source_adapter_config {
      [type.googleapis.com/tensorflow.serving.SavedModelBundleSourceAdapterConfig] {
        legacy_config {
          session_config { inter_op_parallelism_threads: 2 }
          batching_parameters { max_batch_size { value: 4 } batch_timeout_micros { value: 200000 }
                                num_batch_threads { value: 1 } }
        }
      }
    }
  }
}
"""


@pytest.mark.parametrize("raw,message", [
    (b"", "JSON Parse error: The document is empty"),
    (b"  \n", "JSON Parse error: The document is empty. at offset: 3"),
    (b"instances = [1, 2]", "JSON Parse error: Invalid value. at offset: 0"),
    (b'{"instances": [1, 2}', "JSON Parse error: Missing a comma or ']' after an array element."),
    (b'{"instances": [1] "x": 1}', "JSON Parse error: Missing a comma or '}' after an object member."),
    (b"{instances: 1}", "JSON Parse error: Missing a name for object member."),
    (b'{"instances" 1}', "JSON Parse error: Missing a colon after a name of object member."),
    (b'{"a": "b', "JSON Parse error: Missing a closing quotation mark in string."),
    (b'{"a": "\\q"}', "JSON Parse error: Invalid escape character in string."),
    (b"\xff", "JSON Parse error: Invalid encoding in string."),
    (b"[1, 2]", "JSON Value: [1,2] Is not object"),
    # half a surrogate pair: Python's parser keeps it, rapidjson (and so TF Serving) refuses it
    (b'{"a": "\\ud800"}', "JSON Parse error: The surrogate pair in string is invalid. at offset: 7"),
    (b'{"a": "x\\udc00"}', "JSON Parse error: The surrogate pair in string is invalid. at offset: 8"),
    (b'{"a": "\\ud800\\u0041"}', "JSON Parse error: The surrogate pair in string is invalid. at offset: 7"),
    (b'{"\\ud800": 1, "b": "\\ud83d\\ude00"}',
     "JSON Parse error: The surrogate pair in string is invalid. at offset: 2"),
])
@pytest.mark.parametrize("pieces", [False, True])
def test_json_that_does_not_parse_gets_rapidjsons_words(raw, message, pieces, monkeypatch):
    """The same words whether the document is read whole or, as a long one is, in pieces."""
    from tfpipe.serve.codecs import json_text
    from tfpipe.serve.codecs.json_text import parse_json
    from tfpipe.serve.errors import ServingError

    if pieces:
        monkeypatch.setattr(json_text, "PIECES_CHARS", 0)

    with pytest.raises(ServingError) as e:
        parse_json(raw)
    assert e.value.message.startswith(message) and e.value.http_status == 400


@pytest.mark.parametrize("pieces", [False, True])
def test_json_parsing_stops_after_the_first_value(pieces, monkeypatch):
    from tfpipe.serve.codecs import json_text
    from tfpipe.serve.codecs.json_text import parse_json

    if pieces:
        monkeypatch.setattr(json_text, "PIECES_CHARS", 0)

    assert parse_json(b'{"instances": [1]} trailing words') == {"instances": [1]}
    assert parse_json(b'{"instances": [1]} "\\ud800"') == {"instances": [1]}  # half a pair, but after it


@pytest.mark.parametrize("raw, value", [
    (b'{"a": "\\ud83d\\ude00"}', "\U0001f600"),  # a pair: one code point
    (b'{"a": "\\\\ud800"}', "\\ud800"),  # an escaped backslash, then plain letters
    (b'{"a": "\\u00e9\\\\"}', "\u00e9\\"),
])
def test_escapes_that_are_not_half_a_pair_parse(raw, value):
    from tfpipe.serve.codecs.json_text import parse_json

    assert parse_json(raw) == {"a": value}


@pytest.mark.parametrize("raw", [
    b'{"instances": [{"a": 1, "b": [1.5, NaN, -Infinity]}, {"a": 2}], "signature_name": "s"}',
    b' \n{ "inputs" : { "x" : [ 1 , 2 ] } , "x": [] , "x" : [ [ ] , { } ] }  tail',
    b'{}', b'{"a": []}', b'{"a": [1,]}', b'{"a": [1 2]}', b'{"a" 1}', b'{"a": 1,}', b'[1, 2]', b'{"a": "\ud800"}',
    b'{"instances": [' + b"9" * 5000 + b"]}", b'{"a": [' + b"[" * 100_000 + b"]}",
])
def test_a_long_document_read_in_pieces_gives_what_one_read_gives(raw, monkeypatch):
    from tfpipe.serve.codecs import json_text
    from tfpipe.serve.errors import ServingError

    def parsed():
        try:
            return json_text.parse_json(raw)
        except ServingError as e:
            return e.message

    whole = parsed()
    monkeypatch.setattr(json_text, "PIECES_CHARS", 0)
    assert parsed() == whole


@pytest.mark.parametrize("method,path,expected", [
    ("POST", "/v1/models/m:predict", ("m", None, None, "predict")),
    ("POST", "/V1/MODELS/m/VERSIONS/00042:PREDICT", None),  # the verb is compared exactly
    ("POST", "/V1/Models/m/Versions/00042:predict", ("m", 42, None, "predict")),
    ("POST", "/v1/models/my%2Fmodel/labels/can%20ary:regress", ("my/model", None, "can ary", "regress")),
    ("GET", "/v1/models/m/versions/3/metadata", ("m", 3, None, "metadata")),
    ("GET", "/v1/models/m/labels/stable", ("m", None, "stable", "model_status")),
    ("GET", "/v1/models", ("", None, None, "model_status")),
    ("GET", "/v1/models/m:predict", None),
    ("PUT", "/v1/models/m", None),
])
def test_rest_paths(method, path, expected):
    from tfpipe.serve.transports.rest_api import parse_path

    assert parse_path(method, path) == expected


@pytest.mark.parametrize("body,dtypes,expected", [
    ({"instances": [1.0, 2.0, 5.0]}, {"x": "float32"}, {"x": [1.0, 2.0, 5.0]}),
    ({"instances": [[1, 2], [3, 4]]}, {"x": "float32"}, {"x": [[1.0, 2.0], [3.0, 4.0]]}),
    ({"instances": [{"a": 1, "b": "t"}, {"a": 2, "b": {"b64": "dQ=="}}]}, {"a": "int64", "b": "string"},
     {"a": [1, 2], "b": [b"t", b"u"]}),
    ({"inputs": {"a": [[1], [2]], "b": ["x", "y"]}}, {"a": "int32", "b": "string"}, {"a": [[1], [2]], "b": [b"x", b"y"]}),
    ({"inputs": {"a": [1], "extra": 3}}, {"a": "int64"}, {"a": [1]}),  # TF Serving reads only the signature's inputs
    ({"inputs": 3.5}, {"x": "float64"}, {"x": 3.5}),
    ({"instances": [True, False]}, {"x": "bool"}, {"x": [True, False]}),
])
def test_json_inputs(body, dtypes, expected):
    import tensorflow as tf

    from tfpipe.serve.codecs.rest_json import json_inputs

    got, _ = json_inputs(body, {k: tf.as_dtype(v) for k, v in dtypes.items()})
    assert set(got) == set(expected)
    for k, v in expected.items():
        assert got[k].tolist() == v and got[k].dtype == (object if dtypes[k] == "string" else np.dtype(dtypes[k]))


@pytest.mark.parametrize("body,dtypes,message", [
    ({"instances": ["x", "y"]}, {"x": "float32"},
     'Failed to process element: 0 of \'instances\' list. Error: INVALID_ARGUMENT: JSON Value: "x" Type: String is '
     "not of expected type: float"),
    ({"instances": [1.5]}, {"x": "int64"}, "is not of expected type: int64"),
    ({"instances": [[1, 2], [3]]}, {"x": "float32"}, "Expecting tensor size: 2 but got: 1"),
    ({"instances": [[[1], 2]]}, {"x": "float32"}, "found at incorrect level: 2 in the JSON DOM. Expected at level: 2"),
    ({"instances": [[1, [2]]]}, {"x": "float32"}, "Encountered list at unexpected level: 1 expected < 1"),
    ({"instances": [1, 2]}, {"a": "float32", "b": "float32"}, "instances is a plain list, but expecting list of objects"),
    ({"instances": [{"a": 1}]}, {"a": "float32", "b": "float32"}, "keys must be equal to: a,b"),
    ({"instances": [{"c": 1}]}, {"a": "float32"}, "JSON object: does not have named input: c"),
    ({"inputs": {"a": 1}}, {"a": "float32", "b": "float32"}, "Missing named input: b in 'inputs' object."),
    ({"inputs": [1], "instances": [1]}, {"x": "float32"}, "expecting only one of 'inputs' or 'instances'"),
    ({"instances": []}, {"x": "float32"}, "No values in 'instances' array"),
    ({"instances": 3}, {"x": "float32"}, "Expecting 'instances' to be an list/array"),
    ({}, {"x": "float32"}, "Missing 'inputs' or 'instances' key"),
    ({"inputs": {"b64": "@@"}}, {"x": "string"}, "Unable to base64 decode"),
])
def test_json_inputs_refused_with_tf_servings_words(body, dtypes, message):
    import tensorflow as tf

    from tfpipe.serve.errors import ServingError
    from tfpipe.serve.codecs.rest_json import json_inputs

    with pytest.raises(ServingError) as e:
        json_inputs(body, {k: tf.as_dtype(v) for k, v in dtypes.items()})
    assert message in e.value.message and e.value.http_status == 400


@pytest.mark.parametrize("body,message", [
    ({"examples": [{"x": [1, 2.5]}]}, "Unexpected element type in feature: x expecting type: int64"),
    ({"examples": [{"x": None}]}, "Feature: x has element with unexpected JSON type: Null"),
    ({"examples": [{"x": 2**64 - 1}]}, "Feature: x has uint64_t element. Only int64_t is supported."),
    ({"examples": ["x"]}, "Example must be JSON object but got JSON String"),
    ({"examples": []}, "'examples' value is an empty array"),
    ({}, "When method is classify, key 'examples' is expected and was not found"),
])
def test_json_examples_refused_with_tf_servings_words(body, message):
    from tfpipe.serve.errors import ServingError
    from tfpipe.serve.codecs.rest_json import json_examples

    with pytest.raises(ServingError) as e:
        json_examples(body)
    assert message in e.value.message


# ---- a TensorProto's cost bounded by its size, not by the shape it declares ----------------------

def _proto(dtype: str, dims: list[int], field: str = "", values=(), content: bytes = b""):
    from tensorflow.core.framework import tensor_pb2, types_pb2

    proto = tensor_pb2.TensorProto(dtype=getattr(types_pb2, dtype))
    for d in dims:
        proto.tensor_shape.dim.add(size=d)
    if field:
        getattr(proto, field).extend(values)
    if content:
        proto.tensor_content = content
    return proto


@pytest.mark.parametrize("proto, shape, values", [
    (("DT_FLOAT", [4], "float_val", [1.0, 2.0]), (4,), [1.0, 2.0, 2.0, 2.0]),  # TF's rule: the last one repeated
    (("DT_FLOAT", [1024, 1024], "float_val", [7.0]), (1024, 1024), None),  # exactly MAX_FILL_ELEMENTS
    (("DT_INT64", [3]), (3,), [0, 0, 0]),  # no values: zeros
    (("DT_STRING", [2, 2], "string_val", [b"a"]), (2, 2), [[b"a", b"a"], [b"a", b"a"]]),
    (("DT_HALF", [3], "half_val", [15360]), (3,), [1.0, 1.0, 1.0]),  # a dtype make_ndarray reads
    (("DT_FLOAT", [0, 2**40]), (0, 2**40), None),  # no elements at all
    (("DT_DOUBLE", [2], "", (), np.array([1.5, 2.5]).tobytes()), (2,), [1.5, 2.5]),
])
def test_tensor_protos_are_filled_out_as_tensorflow_does_within_the_bound(proto, shape, values):
    from tfpipe.serve.codecs.tensor_proto import tensor_to_numpy

    got = tensor_to_numpy(_proto(*proto), "x")
    assert got.shape == shape
    if values is not None:
        assert got.tolist() == values
    else:
        assert got.size == 0 or (got == got.flat[0]).all()


@pytest.mark.parametrize("proto, message", [
    (("DT_FLOAT", [250_000_000], "float_val", [1.0]), "has 250,000,000 elements and the request carries 1 values"),
    (("DT_FLOAT", [1024 * 1024 + 1]), "only up to 1,048,576 elements"),
    (("DT_STRING", [2**20], "string_val", [b"x" * 17]), "and 16 MiB of strings"),
    (("DT_HALF", [10**12], "half_val", [15360]), "only up to 1,048,576 elements"),
    (("DT_COMPLEX64", [10**9], "scomplex_val", [1.0, 2.0]), "only up to 1,048,576 elements"),
    (("DT_FLOAT", [2**40, 2**40, 2**40], "float_val", [1.0]), "is too large (more than 2**59 elements)"),
    (("DT_FLOAT", [0, 2**62, 2**62]), "is too large"),
    (("DT_INT64", [2**63 - 1, 2]), "is too large"),
    (("DT_FLOAT", [-1]), "needs a fully defined shape"),
    (("DT_FLOAT", [1] * 65, "float_val", [1.0]), "has 65 dimensions: a tensor here has at most 64"),
    (("DT_FLOAT", [2], "float_val", [1.0, 2.0, 3.0]), "3 values for shape [2]"),
    (("DT_UINT16", [1], "int_val", [70000]), "a value out of range for uint16"),
    (("DT_FLOAT", [10**9], "", (), b"\0" * 4), "tensor_content holds 4 bytes"),
])
def test_tensor_protos_beyond_their_values_are_refused_before_any_allocation(proto, message):
    """What a request declares but does not carry is INVALID_ARGUMENT naming the input (cut, as any
    client text in an error), found before anything is allocated: the call's peak traced memory
    (numpy's arrays included) stays under 1 MB."""
    import tracemalloc

    from tfpipe.serve.errors import ServingError
    from tfpipe.serve.codecs.tensor_proto import tensor_to_numpy

    built = _proto(*proto)
    tracemalloc.start()
    try:
        with pytest.raises(ServingError) as e:
            tensor_to_numpy(built, "n" * 1000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert e.value.code.name == "INVALID_ARGUMENT" and message in e.value.message, e.value.message
    assert e.value.message.startswith(f"input '{'n' * 256}...'")
    assert peak < 2**20, peak


def test_the_fill_out_bound_is_for_all_of_a_requests_tensors_together():
    """Seven inputs of 149,796 rows from one value each fit in 1,048,576 elements; eight do not,
    and the one past the bound (whichever the map gives last) is named with what was left for it."""
    from tensorflow_serving.apis import predict_pb2

    from tfpipe.serve.codecs.tensor_proto import predict_inputs
    from tfpipe.serve.errors import ServingError

    request = predict_pb2.PredictRequest()
    for i in range(7):
        request.inputs[f"x{i}"].CopyFrom(_proto("DT_FLOAT", [149_796], "float_val", [float(i)]))
    assert {k: v.shape for k, v in predict_inputs(request).items()} == {f"x{i}": (149_796,) for i in range(7)}
    request.inputs["x7"].CopyFrom(_proto("DT_FLOAT", [149_796], "float_val", [7.0]))
    with pytest.raises(ServingError) as e:
        predict_inputs(request)
    assert re.match(r"input 'x[0-7]': shape \[149796\]", e.value.message), e.value.message
    assert "for all of a request's tensors together (4 left for this one)" in e.value.message


@pytest.mark.parametrize("call_rows, rows", [(4, [4.0] * 8 + [2.0] * 2), (0, [10.0] * 10), (10, [10.0] * 10)])
def test_a_request_of_more_rows_than_max_call_rows_is_answered_by_calls_of_that_many(tmp_path, call_rows, rows):
    """With batching off, ten rows and --max_call_rows=4 are three model calls (4, 4 and 2 rows) on
    REST's Predict, gRPC's Predict and Classify alike; a signature answering one number per call
    (`total`) is called on the whole request."""
    import grpc
    import tensorflow as tf
    from serving_models import save_call_rows
    from tensorflow_serving.apis import classification_pb2, predict_pb2, prediction_service_pb2_grpc

    from tfpipe.serve.flags import ServeOptions
    from tfpipe.serve.server import ServerThread

    save_call_rows(str(tmp_path / "m" / "1"))
    opts = ServeOptions(host="127.0.0.1", port=-1, rest_api_port=-1, model_name="m",
                        model_base_path=str(tmp_path / "m"), file_system_poll_wait_seconds=0, max_call_rows=call_rows)
    xs = [float(i) for i in range(10)]
    with ServerThread(opts) as s:
        url = f"http://127.0.0.1:{s.rest_port}/v1/models/m:predict"
        assert requests.post(url, json={"instances": xs}, timeout=30).json()["predictions"] == rows
        r = requests.post(url, json={"signature_name": "total", "inputs": xs}, timeout=30)
        assert r.json() == {"outputs": sum(xs)}, r.text
        channel = grpc.insecure_channel(f"127.0.0.1:{s.grpc_port}")
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "m"
        request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array(xs, np.float32)))
        assert tf.make_ndarray(stub.Predict(request, timeout=30).outputs["rows"]).tolist() == rows
        request = classification_pb2.ClassificationRequest()
        request.model_spec.name = "m"
        request.model_spec.signature_name = "classification"
        for x in xs:
            request.input.example_list.examples.add().features.feature["x"].float_list.value.append(x)
        answer = stub.Classify(request, timeout=30).result.classifications
        channel.close()
        assert [c.classes[0].score for c in answer] == rows


def test_a_large_body_read_off_the_loop_is_answered_and_refused_as_a_small_one(tmp_path):
    """A body over OFF_LOOP_BYTES is parsed and decoded on a REST thread: its rows are answered (in
    calls of the default --max_call_rows), its errors are the same 400s as a small body's, and
    Classify's examples too. A gRPC Predict whose answer is that large (TensorFlow's fill-out makes
    a small request large) has its answer built on a gRPC thread: the same answer."""
    import grpc
    import tensorflow as tf
    from serving_models import save_call_rows
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    from tfpipe.serve.core.inference import OFF_LOOP_BYTES
    from tfpipe.serve.flags import ServeOptions
    from tfpipe.serve.server import ServerThread

    save_call_rows(str(tmp_path / "m" / "1"))
    opts = ServeOptions(host="127.0.0.1", port=-1, rest_api_port=-1, model_name="m",
                        model_base_path=str(tmp_path / "m"), file_system_poll_wait_seconds=0)
    xs = [i + 0.5 for i in range(20_000)]
    body = json.dumps({"instances": xs}).encode()
    assert len(body) > OFF_LOOP_BYTES
    with ServerThread(opts) as s:
        url = f"http://127.0.0.1:{s.rest_port}/v1/models/m"
        r = requests.post(f"{url}:predict", data=body, timeout=60)
        assert int(r.headers["Content-Length"]) == len(r.content)
        assert r.headers["Content-Type"] == "application/json; charset=utf-8"
        assert r.json()["predictions"] == [1024.0] * 19 * 1024 + [544.0] * 544
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "m"
        request.inputs["x"].dtype = tf.float32.as_datatype_enum
        request.inputs["x"].tensor_shape.dim.add(size=20_000)
        request.inputs["x"].float_val.append(0.5)  # one value: filled out to 20,000 rows
        assert request.ByteSize() < OFF_LOOP_BYTES
        with grpc.insecure_channel(f"127.0.0.1:{s.grpc_port}") as channel:
            answer = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=60)
        assert answer.model_spec.version.value == 1 and answer.model_spec.signature_name == "serving_default"
        assert tf.make_ndarray(answer.outputs["rows"]).tolist() == [1024.0] * 19 * 1024 + [544.0] * 544
        for bad, small, message in (
                (body[:-2], b'{"instances": [1.5', "JSON Parse error: Missing a comma or ']' after an array element."),
                (body.replace(b"0.5,", b'0.5, "x",', 1), b'{"instances": [1.5, "x"]}', "is not of expected type: float")):
            for sent in (bad, small):
                r = requests.post(f"{url}:predict", data=sent, timeout=60)
                assert r.status_code == 400 and message in r.json()["error"], (len(sent), r.text)
        examples = {"signature_name": "classification", "examples": [{"x": x} for x in xs[:5000]]}
        assert len(json.dumps(examples)) > OFF_LOOP_BYTES
        r = requests.post(f"{url}:classify", json=examples, timeout=60)
        assert r.status_code == 200 and r.json()["results"][0] == [["rows", 1024.0]], r.text[:300]


def test_a_small_requests_large_answer_is_encoded_in_pieces_off_the_loop(tmp_path, monkeypatch):
    """The answer's size decides, on both transports: one REST row whose answer is 20,000 floats
    is encoded in pieces (rest_answers.encoded), as a large body's is; gRPC's the same values."""
    import grpc
    import tensorflow as tf
    from serving_models import save_predict
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    from tfpipe.serve.flags import ServeOptions
    from tfpipe.serve.server import ServerThread
    from tfpipe.serve.transports import rest_api

    encoded = []
    real = rest_api.encoded
    monkeypatch.setattr(rest_api, "encoded", lambda pieces: encoded.append(1) or real(pieces))
    save_predict(str(tmp_path / "m" / "1"), lambda x: {"y": tf.tile(x, [20_000])})
    opts = ServeOptions(host="127.0.0.1", port=-1, rest_api_port=-1, model_name="m",
                        model_base_path=str(tmp_path / "m"), file_system_poll_wait_seconds=0)
    with ServerThread(opts) as s:
        url = f"http://127.0.0.1:{s.rest_port}/v1/models/m:predict"
        r = requests.post(url, json={"instances": [1.5]}, timeout=30)
        assert r.status_code == 200 and r.json() == {"predictions": [1.5] * 20_000} and encoded == [1]
        r = requests.post(url, json={"instances": [1.5], "signature_name": "nope"}, timeout=30)
        assert r.status_code == 400 and encoded == [1]  # (an error is small)
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "m"
        request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([1.5], np.float32)))
        with grpc.insecure_channel(f"127.0.0.1:{s.grpc_port}") as channel:
            answer = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)
        assert tf.make_ndarray(answer.outputs["y"]).tolist() == [1.5] * 20_000


def test_a_fill_out_request_batching_would_refuse_is_refused_before_its_tensors_are_built(tmp_path, monkeypatch):
    """With batching on, a gRPC Predict declaring more rows than max_batch_size is INVALID_ARGUMENT
    in the batcher's words, and its one value is never filled out to its declared shape."""
    import grpc
    import tensorflow as tf
    from serving_models import save_call_rows
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    from tfpipe.serve.codecs import tensor_proto
    from tfpipe.serve.flags import ServeOptions
    from tfpipe.serve.server import ServerThread

    built = []
    real = tensor_proto.tensor_to_numpy
    monkeypatch.setattr(tensor_proto, "tensor_to_numpy", lambda *a, **k: built.append(a[1]) or real(*a, **k))
    save_call_rows(str(tmp_path / "m" / "1"))
    cfg = tmp_path / "batching.config"
    cfg.write_text("max_batch_size { value: 32 }\nbatch_timeout_micros { value: 1000 }\n")
    opts = ServeOptions(host="127.0.0.1", port=-1, rest_api_port=-1, model_name="m",
                        model_base_path=str(tmp_path / "m"), file_system_poll_wait_seconds=0,
                        enable_batching=True, batching_parameters_file=str(cfg))
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "m"
    request.inputs["x"].dtype = tf.float32.as_datatype_enum
    with ServerThread(opts) as s, grpc.insecure_channel(f"127.0.0.1:{s.grpc_port}") as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        for rows, ok in ((100_000, False), (33, False), (32, True)):
            request.inputs["x"].tensor_shape.ClearField("dim")
            request.inputs["x"].tensor_shape.dim.add(size=rows)
            request.inputs["x"].ClearField("float_val")
            request.inputs["x"].float_val.extend([0.5, 1.5])  # two values, the last one repeated
            built.clear()
            if ok:
                answer = stub.Predict(request, timeout=30)
                assert tf.make_ndarray(answer.outputs["rows"]).tolist() == [32.0] * 32 and built == ["x"]
                continue
            with pytest.raises(grpc.RpcError) as e:
                stub.Predict(request, timeout=30)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert e.value.details() == f"Task size {rows} is larger than maximum input batch size 32"
            assert built == []  # refused before any tensor was made


@pytest.mark.parametrize("calls, options, rejected", [
    (3000, {"grpc_max_concurrent_streams": 0}, False),  # all 3,000 reach the server at once
    (3000, {}, False),  # 32 at a time: the client queues the others, and none is refused
    (16, {"grpc_max_calls_in_flight": 4}, True),
])
def test_a_burst_of_grpc_calls_is_answered_or_refused_as_resource_exhausted_never_cancelled(
        tmp_path, calls, options, rejected):
    """3,000 Predicts at once on one channel: grpc core's default queue bounds (1,000, up to 3,000)
    cancelled a burst of them, and core's overload protection refused calls a client sent within
    the connection's bound of streams (UNAVAILABLE); every one is answered. Past
    --grpc_max_calls_in_flight, a call is RESOURCE_EXHAUSTED with the flag named, at once, and the
    others are answered."""
    import asyncio
    import collections

    import grpc
    from serving_models import save_slow
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    from tfpipe.serve.flags import ServeOptions
    from tfpipe.serve.server import ServerThread

    save_slow(str(tmp_path / "m" / "1"), seconds=0.02 if rejected else 0)
    opts = ServeOptions(host="127.0.0.1", port=-1, rest_api_port=0, model_name="m", model_base_path=str(tmp_path / "m"),
                        file_system_poll_wait_seconds=0, **options)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "m"
    request.inputs["x"].dtype = 1
    request.inputs["x"].tensor_shape.dim.add(size=1)
    request.inputs["x"].float_val.append(1.0)

    async def burst(port: int) -> tuple[collections.Counter, set[str]]:
        codes, details = collections.Counter(), set()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)

            async def one():
                try:
                    await stub.Predict(request, timeout=120)
                    codes["OK"] += 1
                except grpc.aio.AioRpcError as e:
                    codes[e.code().name] += 1
                    details.add(e.details())
            await asyncio.gather(*[one() for _ in range(calls)])
        return codes, details

    with ServerThread(opts) as s:
        codes, details = asyncio.run(burst(s.grpc_port))
    assert set(codes) == ({"OK", "RESOURCE_EXHAUSTED"} if rejected else {"OK"}), (codes, details)
    assert sum(codes.values()) == calls
    if rejected:
        assert details == {"Too many calls in flight: this server answers 4 at once (--grpc_max_calls_in_flight); "
                           "try again later"}


def _http2_settings(port: int) -> dict[int, int]:
    """The SETTINGS a server sends on a new HTTP/2 connection, read off the wire: {identifier: value}."""
    import socket
    import struct

    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + struct.pack(">I", 0)[1:] + b"\x04\x00" + struct.pack(">I", 0))
        buf = b""
        while True:
            while len(buf) < 9:
                buf += s.recv(65536)
            size, kind, flags = int.from_bytes(buf[:3], "big"), buf[3], buf[4]
            while len(buf) < 9 + size:
                buf += s.recv(65536)
            payload, buf = buf[9:9 + size], buf[9 + size:]
            if kind == 4 and not flags & 1:  # SETTINGS, not an ACK
                return {int.from_bytes(payload[i:i + 2], "big"): int.from_bytes(payload[i + 2:i + 6], "big")
                        for i in range(0, size, 6)}


@pytest.mark.parametrize("options, streams", [
    ({}, 32),
    ({"grpc_max_concurrent_streams": 5}, 5),
    ({"grpc_max_concurrent_streams": 0}, None),  # grpc core's default: no bound
    ({"grpc_channel_arguments": "grpc.max_concurrent_streams=100"}, 100),  # the channel argument wins
])
def test_the_grpc_port_bounds_each_connections_open_calls(tmp_path, options, streams):
    """--grpc_max_concurrent_streams is HTTP/2's MAX_CONCURRENT_STREAMS (setting 0x3), sent to every
    client that connects: the calls one connection may have open at once."""
    from serving_models import save_slow

    from tfpipe.serve.flags import ServeOptions
    from tfpipe.serve.server import ServerThread

    save_slow(str(tmp_path / "m" / "1"), seconds=0)
    opts = ServeOptions(host="127.0.0.1", port=-1, rest_api_port=0, model_name="m", model_base_path=str(tmp_path / "m"),
                        file_system_poll_wait_seconds=0, **options)
    with ServerThread(opts) as s:
        assert _http2_settings(s.grpc_port).get(0x3) == streams


@pytest.mark.parametrize("given, width", [(None, "default"), (3, 3)])
def test_large_requests_at_once_sets_the_processs_lane(tmp_path, given, width):
    """--large_requests_at_once is how many large requests the server's process answers at once
    (0, the default: half the cores); the lane's order is tests/test_turns.py's."""
    from serving_models import save_slow

    from tfpipe.serve.core import large_requests
    from tfpipe.serve.flags import ServeOptions
    from tfpipe.serve.server import ServerThread

    save_slow(str(tmp_path / "m" / "1"), seconds=0)
    opts = ServeOptions(host="127.0.0.1", port=-1, rest_api_port=0, model_name="m", model_base_path=str(tmp_path / "m"),
                        file_system_poll_wait_seconds=0,
                        **({"large_requests_at_once": given} if given is not None else {}))
    try:
        with ServerThread(opts):
            assert large_requests._lane.width == (large_requests.LARGE_AT_ONCE if width == "default" else width)
    finally:
        large_requests.at_once(0)


def test_a_models_own_warmup_records_are_filled_out_without_the_bound():
    """Warmup records come with the model, as trusted as it is: filled out as TF Serving fills them."""
    from tensorflow_serving.apis import predict_pb2

    from tfpipe.serve.codecs.tensor_proto import predict_inputs

    request = predict_pb2.PredictRequest()
    request.inputs["x"].CopyFrom(_proto("DT_FLOAT", [2, 1024 * 1024], "float_val", [0.5]))
    got = predict_inputs(request, bounded=False)["x"]
    assert got.shape == (2, 1024 * 1024) and float(got.min()) == float(got.max()) == 0.5


def test_error_messages_cut_a_clients_text_and_stay_within_grpcs_header_limit():
    """A quoted name is cut at QUOTED_CHARS with an ellipsis; a whole message at MAX_MESSAGE_BYTES of
    UTF-8 (gRPC percent-encodes it into a header that clients refuse over 8 KiB)."""
    import grpc

    from tfpipe.serve.errors import MAX_MESSAGE_BYTES, QUOTED_CHARS, ServingError, quoted

    assert quoted("penguins") == "penguins" and quoted(7) == "7"
    assert quoted("m" * 10_000) == "m" * QUOTED_CHARS + "..."
    assert ServingError(grpc.StatusCode.NOT_FOUND, "short").message == "short"
    for text in ("x" * 100_000, "\U0001f600" * 5_000, "\u00e9" * 2_000):
        message = ServingError(grpc.StatusCode.NOT_FOUND, "Servable not found: " + text).message
        assert message.startswith("Servable not found: ") and message.endswith("...")
        assert MAX_MESSAGE_BYTES - 4 <= len(message.encode("utf-8")) <= MAX_MESSAGE_BYTES
        assert 3 * len(message.encode("utf-8")) < 8192  # percent-encoded, every byte as %XX at worst


def test_json_examples_merge_context_with_the_example_winning():
    from tensorflow.core.example import example_pb2

    from tfpipe.serve.codecs.rest_json import json_examples

    (raw,) = json_examples({"context": {"c": "ctx", "x": 1.0}, "examples": [{"x": 2.0, "flag": True}]})
    ex = example_pb2.Example.FromString(raw)
    f = ex.features.feature
    assert f["c"].bytes_list.value == [b"ctx"] and f["x"].float_list.value == [2.0] and f["flag"].int64_list.value == [1]


def test_large_batches_are_split_and_put_back_together():
    from tfpipe.serve.core.batcher import BatchScheduler
    from tfpipe.serve.core.batching import BatchOptions

    sizes = []

    def run(merged):
        sizes.append(len(merged["x"]))
        return {"y": merged["x"] * 10}

    scheduler = BatchScheduler(BatchOptions(max_batch_size=8, enable_large_batch_splitting=True,
                                            max_execution_batch_size=2, num_batch_threads=1))
    try:
        out = scheduler.submit(("owner",), run, {"x": np.arange(5.0)}).result(timeout=30)
    finally:
        scheduler.close()
    assert out["y"].tolist() == [0.0, 10.0, 20.0, 30.0, 40.0] and max(sizes) <= 2 and sum(sizes) == 5


def test_an_unloaded_versions_queue_runs_what_it_holds_then_goes():
    from tfpipe.serve.core.batcher import BatchScheduler
    from tfpipe.serve.core.batching import BatchOptions

    release = threading.Event()

    def run(merged):
        release.wait(30)
        return {"y": merged["x"] + 1}

    scheduler = BatchScheduler(BatchOptions(max_batch_size=1, num_batch_threads=1, max_enqueued_batches=10))
    try:
        futures = [scheduler.submit((7, "sig"), run, {"x": np.array([float(i)])}) for i in range(3)]
        scheduler.drop(7)  # the version unloads while one batch runs and two wait
        assert scheduler.queue_count() == 1
        release.set()
        assert [f.result(timeout=30)["y"].tolist() for f in futures] == [[1.0], [2.0], [3.0]]
        deadline = time.time() + 10
        while scheduler.queue_count() and time.time() < deadline:
            time.sleep(0.01)
        assert scheduler.queue_count() == 0
        late = scheduler.submit((7, "sig"), run, {"x": np.array([9.0])})  # resolved just before the unload
        assert late.result(timeout=30)["y"].tolist() == [10.0]
        deadline = time.time() + 10
        while scheduler.queue_count() and time.time() < deadline:
            time.sleep(0.01)
        assert scheduler.queue_count() == 0
    finally:
        scheduler.close()


# ---- servers -------------------------------------------------------------------------------

def _certificates(tmp_path):
    """A CA, a server certificate for localhost/127.0.0.1 and a client certificate, as PEM text."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def make(subject, issuer_name, issuer_key, ca=False, san=None):
        key = ec.generate_private_key(ec.SECP256R1())
        b = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
             .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_name or subject)]))
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if san:
            b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
        cert = b.sign(issuer_key or key, hashes.SHA256())
        pem_key = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()).decode()
        return key, cert.public_bytes(serialization.Encoding.PEM).decode(), pem_key

    ca_key, ca_pem, _ = make("tfpipe test CA", None, None, ca=True)
    _, server_pem, server_key = make("localhost", "tfpipe test CA", ca_key,
                                     san=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    _, client_pem, client_key = make("client", "tfpipe test CA", ca_key)
    return ca_pem, (server_pem, server_key), (client_pem, client_key)


def _start(*flags: str, env=None) -> tuple[subprocess.Popen, list[str]]:
    """`tfpipe serve` with these flags; its output lines are collected as they come."""
    proc = spawn_cli("serve", "--host=127.0.0.1", *flags, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines: list[str] = []
    threading.Thread(target=lambda: [lines.append(x.rstrip("\n")) for x in proc.stdout], daemon=True).start()
    return proc, lines


def _wait_for_line(proc, lines, text: str, timeout: float = 120) -> str:
    deadline = time.time() + timeout
    while time.time() < deadline:
        for line in list(lines):
            if text in line:
                return line
        if proc.poll() is not None:
            time.sleep(0.2)  # let the reader thread catch up
            for line in list(lines):
                if text in line:
                    return line
            raise AssertionError(f"the server exited ({proc.returncode}) before saying {text!r}:\n" + "\n".join(lines))
        time.sleep(0.05)
    raise AssertionError(f"no {text!r} within {timeout}s:\n" + "\n".join(lines))


def _stop(proc) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="session")
def half_models(tmp_path_factory):
    """TF Serving's half_plus_two as a TF1 graph (classify method) and as native TF2 (predict
    method), in their own base paths, version 00000123."""
    from serving_models import save_half_plus_two_tf1, save_half_plus_two_tf2

    root = tmp_path_factory.mktemp("half_models")
    save_half_plus_two_tf1(str(root / "tf1" / "00000123"))
    save_half_plus_two_tf2(str(root / "tf2" / "00000123"))
    return root


def test_a_secure_server_with_the_flags_that_apply(half_models, tmp_path):
    """TLS with client certificates on the TCP port and the Unix socket, the standard health
    service, CORS, tensor_content answers, the method-name check, warmup iterations, load and
    unload threads, and flags TF Serving alone acts on (each named once as ignored); an
    unknown flag is named and ignored, as tensorflow_model_server does."""
    import grpc
    import tensorflow as tf
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from tensorflow_serving.apis import classification_pb2, predict_pb2, prediction_service_pb2_grpc

    ca, (server_cert, server_key), (client_cert, client_key) = _certificates(tmp_path)
    ssl = tmp_path / "ssl.config"
    ssl.write_text(f"server_key: {json.dumps(server_key)}\nserver_cert: {json.dumps(server_cert)}\n"
                   f"custom_ca: {json.dumps(ca)}\nclient_verify: true\n")
    config = tmp_path / "models.config"
    config.write_text(f'model_config_list {{ config {{ name: "tf1" base_path: "{half_models / "tf1"}" }} '
                      f'config {{ name: "tf2" base_path: "{half_models / "tf2"}" }} }}')
    port, rest_port, sock = free_port(), free_port(), str(tmp_path / "grpc.sock")
    ignored = ["--prefer_tflite_model=false", "--num_tflite_pools=2", "--enable_profiler",
               "--flush_filesystem_caches=true", "--skip_initialize_tpu", "--xla_cpu_compilation_enabled=true",
               "--thread_pool_factory_config_file=unused.config", "--remove_unused_fields_from_bundle_metagraph"]
    proc, lines = _start(f"--port={port}", f"--rest_api_port={rest_port}", f"--grpc_socket_path={sock}",
                         f"--model_config_file={config}", f"--ssl_config_file={ssl}",
                         "--enable_grpc_healthcheck_service", "--rest_api_enable_cors_support",
                         "--enable_serialization_as_tensor_content", "--enable_signature_method_name_check",
                         "--num_load_threads=2", "--num_unload_threads=1", "--num_request_iterations_for_warmup=2",
                         "--tensorflow_session_parallelism=1", "--saved_model_tags=serve", "--no_such_flag=1",
                         *ignored)
    try:
        _wait_for_line(proc, lines, "Exporting HTTP/REST API")
        log = "\n".join(lines)
        for flag in ignored:
            assert f"{flag.split('=')[0]} is accepted and ignored: " in log, flag
        assert "unknown argument: --no_such_flag=1" in log
        creds = grpc.ssl_channel_credentials(root_certificates=ca.encode(), private_key=client_key.encode(),
                                             certificate_chain=client_cert.encode())
        options = [("grpc.ssl_target_name_override", "localhost")]
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "tf1"
        request.inputs["x"].CopyFrom(tf.make_tensor_proto([[2.0]], dtype=tf.float32))
        for target in (f"localhost:{port}", f"unix:{sock}"):
            with grpc.secure_channel(target, creds, options=options) as channel:
                answer = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)
                y = answer.outputs["y"]
                assert y.tensor_content and not y.float_val  # --enable_serialization_as_tensor_content
                assert tf.make_ndarray(y).tolist() == [[3.0]]
                health = health_pb2_grpc.HealthStub(channel)
                for service in ("", "ModelService", "PredictionService"):
                    status = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status
                    assert status == health_pb2.HealthCheckResponse.SERVING, service
                with pytest.raises(grpc.RpcError) as e:
                    health.Check(health_pb2.HealthCheckRequest(service="Nope"), timeout=10)
                assert e.value.code() == grpc.StatusCode.NOT_FOUND
                classify = classification_pb2.ClassificationRequest()
                classify.model_spec.name, classify.model_spec.signature_name = "tf2", "classify_x_to_y"
                classify.input.example_list.examples.add().features.feature["x"].float_list.value.append(2.0)
                with pytest.raises(grpc.RpcError) as e:  # a predict-method signature, refused with the check on
                    prediction_service_pb2_grpc.PredictionServiceStub(channel).Classify(classify, timeout=30)
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert ("Expected classification signature method_name to be tensorflow/serving/classify. "
                        "Was: tensorflow/serving/predict") in e.value.details()
        # Without a client certificate, or without TLS, nothing gets through.
        bare = grpc.ssl_channel_credentials(root_certificates=ca.encode())
        for channel in (grpc.secure_channel(f"localhost:{port}", bare, options=options),
                        grpc.insecure_channel(f"127.0.0.1:{port}")):
            with channel, pytest.raises(grpc.RpcError) as e:
                prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=10)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        # CORS headers on every REST answer, and the preflight as TF Serving answers it.
        url = f"http://127.0.0.1:{rest_port}/v1/models/tf1"
        r = requests.post(f"{url}:predict", json={"instances": [1.0, 2.0, 5.0]}, timeout=30)
        assert r.json() == {"predictions": [2.5, 3.0, 4.5]}
        assert r.headers["Access-Control-Allow-Origin"] == "*" and "POST" in r.headers["Access-Control-Allow-Methods"]
        assert requests.options(f"{url}:predict", headers={"Origin": "https://app.example"}, timeout=30).status_code == 200
        preflight = requests.options(f"{url}:predict", timeout=30)
        assert preflight.status_code == 400 and "Origin header is missing" in preflight.json()["error"]
        assert preflight.headers["Access-Control-Allow-Origin"] == "*"
    finally:
        _stop(proc)


def test_version_prints_and_exits():
    r = subprocess.run([sys.executable, "-m", "tfpipe.cli", "serve", "--version"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("TensorFlow ModelServer: tfpipe ")
    assert "TensorFlow Library: 2." in r.stdout


def test_a_missing_base_path_is_reported_and_polled_until_a_version_appears(half_models, tmp_path):
    """TF Serving waits for its models before it opens its ports; so does tfpipe serve, saying
    which path is wrong and what it holds, then serving as soon as a version appears."""
    import grpc

    base = tmp_path / "model"
    port, rest_port = free_port(), free_port()
    proc, lines = _start(f"--port={port}", f"--rest_api_port={rest_port}", f"--model_base_path={base}",
                         "--file_system_poll_wait_seconds=1")
    try:
        _wait_for_line(proc, lines, f"Could not find base path {base} for servable default")
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:  # not listening yet
            with pytest.raises(grpc.FutureTimeoutError):
                grpc.channel_ready_future(channel).result(timeout=1)
        shutil.copytree(half_models / "tf1" / "00000123", base)  # the SavedModel itself, not in a version dir
        line = _wait_for_line(proc, lines, "No versions of servable default found under base path")
        assert "saved_model.pb" in line and f"move it into {base}/1/" in line
        staging = tmp_path / "staging"
        shutil.copytree(half_models / "tf1" / "00000123", staging)
        os.rename(staging, base / "00000007")
        _wait_for_line(proc, lines, "Exporting HTTP/REST API")
        r = requests.post(f"http://127.0.0.1:{rest_port}/v1/models/default:predict", json={"instances": [2.0]},
                          timeout=30)
        assert r.json() == {"predictions": [3.0]}
        status = requests.get(f"http://127.0.0.1:{rest_port}/v1/models/default", timeout=30).json()
        assert [s["version"] for s in status["model_version_status"]] == ["7"]
    finally:
        _stop(proc)


def test_a_model_whose_loads_all_fail_is_retried_then_stops_the_start(tmp_path):
    """--max_num_load_retries / --load_retry_interval_micros; then, as tensorflow_model_server,
    the server does not start."""
    version = tmp_path / "broken" / "1"
    version.mkdir(parents=True)
    (version / "saved_model.pb").write_bytes(b"not a SavedModel")
    proc, lines = _start(f"--port={free_port()}", f"--model_base_path={tmp_path / 'broken'}",
                         "--max_num_load_retries=2", "--load_retry_interval_micros=100000")
    try:
        proc.wait(timeout=120)
    finally:
        _stop(proc)
    time.sleep(0.2)
    log = "\n".join(lines)
    assert proc.returncode == 2, log
    assert "(attempt 1 of 3); retrying in 0.1s" in log and "(attempt 2 of 3)" in log
    assert "Failed to start server. Error: UNKNOWN: 1 model(s) did not become available" in log


def _reload(port: int, config_text: str):
    import grpc
    from google.protobuf import text_format
    from tensorflow_serving.apis import model_management_pb2, model_service_pb2_grpc

    request = model_management_pb2.ReloadConfigRequest()
    text_format.Parse(config_text, request.config)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return model_service_pb2_grpc.ModelServiceStub(channel).HandleReloadConfigRequest(request, timeout=60)


@pytest.mark.parametrize("allow", [False, True])
def test_version_labels_may_only_name_available_versions(half_models, tmp_path, allow):
    """As TF Serving's ServerCore: a label must point at an AVAILABLE version; with
    --allow_version_labels_for_unavailable_models a new label may wait for its version, but an
    existing label is never moved to one that is not AVAILABLE."""
    import grpc

    from tfpipe.serve.flags import ServeOptions
    from tfpipe.serve.server import ServerThread

    base = half_models / "tf1"

    def config(labels: str) -> str:
        return f'model_config_list {{ config {{ name: "m" base_path: "{base}" {labels} }} }}'

    opts = ServeOptions(host="127.0.0.1", port=-1, rest_api_port=0, model_name="m", model_base_path=str(base),
                        file_system_poll_wait_seconds=0, allow_version_labels_for_unavailable_models=allow)
    with ServerThread(opts) as s:
        _reload(s.grpc_port, config('version_labels { key: "stable" value: 123 }'))
        assert s.manager.resolve("m", label="stable").version == 123
        later = config('version_labels { key: "stable" value: 123 } version_labels { key: "next" value: 124 }')
        if allow:
            _reload(s.grpc_port, later)
        else:
            with pytest.raises(grpc.RpcError) as e:
                _reload(s.grpc_port, later)
            assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "Request to assign label to version 124 of model m, which is not currently available" in \
                e.value.details()
        with pytest.raises(grpc.RpcError) as e:  # moving "stable" to a version that is not there: never
            _reload(s.grpc_port, config('version_labels { key: "stable" value: 124 }'))
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert s.manager.resolve("m", label="stable").version == 123


def _batches(server) -> int:
    return server.metrics.batch_sizes.n


def _concurrent_predicts(url: str, n: int) -> list[float]:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(n) as pool:
        answers = list(pool.map(lambda x: requests.post(url, json={"instances": [float(x)]}, timeout=60).json(),
                                range(n)))
    return [a["predictions"][0] for a in answers]


def test_platform_config_file_turns_batching_on(half_models, tmp_path):
    """--platform_config_file's SessionBundleConfig replaces the batching flags."""
    from tfpipe.serve.flags import ServeOptions
    from tfpipe.serve.server import ServerThread

    platform = tmp_path / "platform.config"
    platform.write_text(PLATFORM_CONFIG)
    opts = ServeOptions(host="127.0.0.1", port=-1, rest_api_port=-1, model_name="m",
                        model_base_path=str(half_models / "tf2"), file_system_poll_wait_seconds=0,
                        platform_config_file=str(platform))
    with ServerThread(opts) as s:
        assert s.batcher is not None and s.batcher.options.max_batch_size == 4
        url = f"http://127.0.0.1:{s.rest_port}/v1/models/m:predict"
        assert _concurrent_predicts(url, 4) == [0.5 * x + 2 for x in range(4)]
        assert 1 <= _batches(s) < 4  # merged within the 200 ms batch timeout


def test_per_model_batching_parameters(half_models, tmp_path):
    """--enable_per_model_batching_parameters: a version's batching_params.pbtxt sets its batching;
    a version without one is served unbatched."""
    from tfpipe.serve.flags import ServeOptions
    from tfpipe.serve.server import ServerThread

    batched = tmp_path / "batched"
    shutil.copytree(half_models / "tf2", batched)
    (batched / "00000123" / "batching_params.pbtxt").write_text(
        "max_batch_size { value: 8 }\nbatch_timeout_micros { value: 200000 }\n")
    config = tmp_path / "models.config"
    config.write_text(f'model_config_list {{ config {{ name: "batched" base_path: "{batched}" }} '
                      f'config {{ name: "plain" base_path: "{half_models / "tf2"}" }} }}')
    opts = ServeOptions(host="127.0.0.1", port=-1, rest_api_port=-1, model_config_file=str(config),
                        file_system_poll_wait_seconds=0, enable_batching=True,
                        enable_per_model_batching_parameters=True)
    with ServerThread(opts) as s:
        base = f"http://127.0.0.1:{s.rest_port}/v1/models"
        assert _concurrent_predicts(f"{base}/plain:predict", 4) == [0.5 * x + 2 for x in range(4)]
        assert _batches(s) == 0
        assert _concurrent_predicts(f"{base}/batched:predict", 4) == [0.5 * x + 2 for x in range(4)]
        assert 1 <= _batches(s) < 4
        options = s.inference.batch_options(s.manager.resolve("batched"))
        assert options.max_batch_size == 8 and s.inference.batch_options(s.manager.resolve("plain")) is None


@pytest.mark.parametrize("text", [
    "max_batch_size { value: 16 } batch_timeout_micros { value: 500 } max_enqueued_batches { value: 4 } "
    "num_batch_threads { value: 2 } allowed_batch_sizes: 8 allowed_batch_sizes: 16",
    "max_batch_size { value: 64 } batch_timeout_micros { value: 0 } max_enqueued_batches { value: 10 } "
    "num_batch_threads { value: 1 } enable_large_batch_splitting { value: true } "
    "max_execution_batch_size { value: 32 }",
])
def test_batching_parameters_read_and_written_are_the_same(text):
    """One writer of batching.config (BatchOptions.to_proto, used by tfpipe run and tfpipe tune):
    TF Serving's text read by the server and written back is the same message."""
    from google.protobuf import text_format

    from tfpipe.serve.core.batching import BatchOptions
    from tfpipe.serve.tfserving.protos import BatchingParameters

    given = text_format.Parse(text, BatchingParameters())
    assert BatchOptions.from_proto(given).to_proto() == given


def _example(**features):
    from tensorflow.core.example import example_pb2

    ex = example_pb2.Example()
    for k, (kind, values) in features.items():
        getattr(ex.features.feature[k], kind).value.extend(values)
    return ex.SerializeToString()


@pytest.mark.parametrize("features, key, want, expected", [
    ({"x": ("int64_list", [3, -2])}, "x", "float", {"x": ("float_list", [3.0, -2.0])}),
    ({"x": ("float_list", [3.0, -2.0])}, "x", "int64", {"x": ("int64_list", [3, -2])}),
    ({"x": ("float_list", [3.5])}, "x", "int64", None),                    # a fraction is not an int
    ({"x": ("float_list", [float("nan")])}, "x", "int64", None),
    ({"y": ("int64_list", [1])}, "x", "float", {"y": ("int64_list", [1])}),  # without the key: as it was
    ({"x": ("bytes_list", [b"a"])}, "x", "float", {"x": ("bytes_list", [b"a"])}),  # not a number: as it was
])
def test_an_examples_numbers_move_to_the_list_the_model_parses(features, key, want, expected):
    from tensorflow.core.example import example_pb2

    from tfpipe.serve.core.examples import as_numbers

    got = as_numbers([_example(**features)], key, want)
    if expected is None:
        assert got is None
    else:
        (raw,) = got
        ex = example_pb2.Example.FromString(raw)
        assert {k: (f.WhichOneof("kind"), list(getattr(f, f.WhichOneof("kind")).value))
                for k, f in ex.features.feature.items()} == expected


def test_a_string_that_is_not_an_example_is_left_to_the_models_refusal():
    from tfpipe.serve.core.examples import as_numbers

    assert as_numbers([b"\xff\xff"], "x", "float") is None


@pytest.mark.parametrize("values, numpy_dtype, dtype, want", [
    ([5400, 1_700_000_000], "int64", "float32", [5400.0, 1_700_000_000.0]),  # held exactly
    ([2**24 + 1], "int64", "float64", [2.0**24 + 1]),
    ([-(2**63)], "int64", "float32", [-(2.0**63)]),  # a power of two: exact
    ([2**63 - 1], "int64", "float32", "9223372036854775807 would be 9223372036854775808"),
    ([2**24 + 1], "int64", "float32", "16777217 would be 16777216"),
    ([[1, 2], [3, 2**60 + 1]], "int64", "float64", "1152921504606846977 would be 1152921504606846976"),
    ([2**64 - 1], "uint64", "float64", "18446744073709551615 would be"),
    ([70000], "int32", "float16", "70000 would be inf"),
    ([2.5], "float64", "int64", "non-integral numbers"),
    ([300], "int64", "uint8", "out of range for uint8"),
])
def test_a_numeric_input_of_another_dtype_is_converted_only_when_exact(values, numpy_dtype, dtype, want):
    """gRPC tensors of another numeric dtype than the signature's (TF Serving refuses the dtype): converted
    when every value is held exactly, else INVALID_ARGUMENT naming the input and the first value lost."""
    import numpy as np
    import tensorflow as tf

    from tfpipe.serve.core.servable import coerce
    from tfpipe.serve.errors import ServingError

    value = np.array(values, dtype=numpy_dtype)
    if isinstance(want, str):
        with pytest.raises(ServingError, match=want) as e:
            coerce(value, tf.as_dtype(dtype), "x")
        assert e.value.code.name == "INVALID_ARGUMENT" and "input 'x'" in e.value.message
    else:
        got = coerce(value, tf.as_dtype(dtype), "x")
        assert got.dtype == np.dtype(dtype) and got.tolist() == want


def test_model_config_reload_false_refuses_the_reload_rpc_and_keeps_serving(tmp_path):
    """--model_config_reload=false: HandleReloadConfigRequest (which would unload every model given an
    empty list) is PERMISSION_DENIED naming the flag, and the model goes on answering."""
    import grpc
    import numpy as np
    import tensorflow as tf
    from serving_models import save_half
    from tensorflow_serving.apis import model_management_pb2, model_service_pb2_grpc, predict_pb2
    from tensorflow_serving.apis import prediction_service_pb2_grpc
    from tensorflow_serving.config import model_server_config_pb2

    from tfpipe.serve.flags import ServeOptions
    from tfpipe.serve.server import ServerThread

    save_half(str(tmp_path / "half" / "1"), b=2.0)
    opts = ServeOptions(host="127.0.0.1", port=-1, rest_api_port=0, model_name="half",
                        model_base_path=str(tmp_path / "half"), model_config_reload=False)
    empty = model_server_config_pb2.ModelServerConfig()
    empty.model_config_list.SetInParent()
    with ServerThread(opts) as server, grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        with pytest.raises(grpc.RpcError) as caught:
            model_service_pb2_grpc.ModelServiceStub(channel).HandleReloadConfigRequest(
                model_management_pb2.ReloadConfigRequest(config=empty), timeout=30)
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "--model_config_reload=false" in caught.value.details()
        request = predict_pb2.PredictRequest(model_spec={"name": "half"})
        request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([2.0], np.float32)))
        answer = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)
        assert list(answer.outputs["y"].float_val) == [3.0]


@pytest.mark.parametrize("backend", ["tfserving", "docker"])
def test_model_config_reload_false_is_refused_for_tensorflow_model_server(backend, tmp_path):
    """tensorflow_model_server cannot turn its reload RPC off: asking for it there is an error naming
    the flag, not a server that silently leaves the RPC open."""
    from tfpipe.serve.errors import ServeError
    from tfpipe.serve.flags import ServeOptions
    from tfpipe.serve.tfserving.launcher import docker_command, tfserving_command

    (tmp_path / "m" / "1").mkdir(parents=True)
    opts = ServeOptions(backend=backend, model_name="m", model_base_path=str(tmp_path / "m"), dry_run=True,
                        config_dir=str(tmp_path / "cfg"), model_config_reload=False)
    with pytest.raises(ServeError, match="--model_config_reload=false: tensorflow_model_server"):
        (tfserving_command if backend == "tfserving" else docker_command)(opts)
