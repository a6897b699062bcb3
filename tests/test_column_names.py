"""Any header a file allows is a feature name: columns named like Python keywords (`from`, `class`,
`lambda`), with a space and with a dot go through data, train and export, and the served model
takes them under their own names; and what that served model does with a value its training data
could not hold."""

from __future__ import annotations

import os

import pytest

from conftest import KEYWORD_HEADER as HEADER

# the keyword model is built once, by the worker that runs these files; on two workers, one would
# wait idle for the other to build it
pytestmark = pytest.mark.xdist_group("keyword_model")


@pytest.fixture(scope="module")
def exported(keyword_model) -> str:
    return keyword_model


def test_keyword_space_and_dot_headers_train_export_and_keep_their_names(exported):
    from tfpipe.export.signature_diff import signatures

    sigs = signatures(os.path.join(exported, "1"))
    assert sorted(sigs["serving_default"].inputs) == sorted(HEADER[:-1])  # what a client sends: the columns' names


def test_a_date_that_is_not_one_is_refused_naming_the_input_and_a_new_category_is_served(exported):
    """What the served model does with a value its training data could not hold: a date column's
    value that is not a date is refused (400, gRPC INVALID_ARGUMENT, naming the input), as the data
    stage dead-letters it; an empty one is missing, as training saw; a category never seen is the
    out-of-vocabulary value, as the rare values outside training's vocabulary were. A whole number for
    a float feature, and 3.0 for an int one, is that number in :classify too."""
    import grpc
    import numpy as np
    import requests
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    from tfpipe.serve.flags import ServeOptions
    from tfpipe.serve.server import ServerThread

    row = {"from": "north", "class": "a", "lambda": 3, "wind speed": 9.0, "Sepal.Length": 6.0, "day": "2021-03-04",
           "import": "False"}
    opts = ServeOptions(host="127.0.0.1", port=-1, rest_api_port=-1, model_name="kw", model_base_path=exported)
    with ServerThread(opts) as server:
        url = f"http://127.0.0.1:{server.rest_port}/v1/models/kw:predict"

        def post(**change):
            return requests.post(url, json={"instances": [row, {**row, **change}]}, timeout=30)

        ok = post()
        assert ok.status_code == 200, ok.text
        for bad in ("hello", "25/12/1988", "1988-02-30"):
            r = post(day=bad)
            assert r.status_code == 400, (bad, r.status_code, r.text)
            assert "the input `day` holds a value that is not an ISO-8601 date" in r.json()["error"] and bad in r.text
        missing = post(day="")
        assert missing.status_code == 200, missing.text
        unseen = post(**{"from": "west"})  # never in training: the out-of-vocabulary value
        assert unseen.status_code == 200, unseen.text
        assert abs(sum(unseen.json()["predictions"][1]["probabilities"]) - 1) < 1e-5
        assert post().status_code == 200  # and it keeps serving

        # a column trained from True/False takes JSON's true and false, and any case of its words
        low = {**row, "Sepal.Length": 1.0, "wind speed": 1.5}
        answers = {}
        for value in (True, "True", "true", "TRUE", False, "False", "false", "FALSE"):
            r = requests.post(url, json={"instances": [{**low, "import": value}]}, timeout=30)
            assert r.status_code == 200, (value, r.text)
            answers[value] = r.json()["predictions"][0]
        assert {str(v).lower(): a["classes"] for v, a in answers.items()} == {"true": "hi", "false": "lo"}, answers
        assert all(answers[v] == answers[True] for v in ("True", "true", "TRUE"))
        assert all(answers[v] == answers[False] for v in ("False", "false", "FALSE"))

        # :classify takes a whole number for a float feature, and 3.0 for an int one, as :predict does
        # (REST's JSON makes them an int64_list and a float_list); a string, or 3.5 for an int, is refused
        classify = f"http://127.0.0.1:{server.rest_port}/v1/models/kw:classify"
        sig = {"signature_name": "classification"}
        as_float = requests.post(classify, json={**sig, "examples": [row]}, timeout=30)
        swapped = {**row, "wind speed": 9, "Sepal.Length": 6, "lambda": 3.0}  # each number the other kind
        as_other = requests.post(classify, json={**sig, "examples": [swapped]}, timeout=30)
        assert as_float.status_code == as_other.status_code == 200, as_other.text
        assert as_other.json() == as_float.json() and len(as_other.json()["results"][0]) == 2
        for bad, key in (({"wind speed": "fast"}, "wind speed"), ({"lambda": 3.5}, "lambda")):
            r = requests.post(classify, json={**sig, "examples": [{**row, **bad}]}, timeout=30)
            assert r.status_code == 400 and key in r.json()["error"], r.text

        req = predict_pb2.PredictRequest()
        req.model_spec.name = "kw"
        for k, v in {**row, "day": "hello"}.items():
            dtype = object if isinstance(v, str) else np.int64 if k == "lambda" else np.float32
            req.inputs[k].CopyFrom(tf.make_tensor_proto(np.array([v], dtype=dtype)))
        with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            with pytest.raises(grpc.RpcError) as caught:
                stub.Predict(req, timeout=30)
            e = caught.value
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "the input `day`" in e.details(), e


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
