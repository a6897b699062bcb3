"""tfpipe predict: a file scored by a published model as a Beam job. Every row read is predicted or
dead-lettered with its reason; the answers are the embedded server's for the same rows and version;
each output format reads back; a file without the label column scores."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import KEYWORD_HEADER, keyword_table, run_cli

# the keyword model is built once, by the worker that runs these files; on two workers, one would
# wait idle for the other to build it
pytestmark = pytest.mark.xdist_group("keyword_model")

FEATURES = KEYWORD_HEADER[:-1]
BAD = {  # line in the input (header = line 1) -> what is wrong with the row, as the dead-letter's reason says it
    4: "column 'lambda': 'x' is not an int",
    7: "column 'day': 'hello' is not an ISO-8601 date",
    9: "expected 8 columns, got 3",
    12: "missing value in non-nullable column 'lambda'",  # never missing in training: the model takes int64
}


def _input(path: str, rows: int = 120) -> dict[int, dict]:
    """keyword_table's rows as a `;` CSV with four bad rows (BAD), one row without its label and one
    with a category training never saw; returns the good rows by line."""
    plain = keyword_table(path + ".plain.csv", rows)
    with open(plain, newline="") as f:
        table = list(csv.reader(f))
    good = {}
    with open(path, "w", newline="") as f:
        w = csv.writer(f, delimiter=";")
        w.writerow(table[0])
        for line, row in enumerate(table[1:], start=2):
            row = list(row)
            if line == 4:
                row[2] = "x"
            elif line == 7:
                row[5] = "hello"
            elif line == 9:
                row = row[:3]
            elif line == 12:
                row[2] = ""
            elif line == 15:
                row[-1] = ""  # no label: scored all the same
            elif line == 20:
                row[0] = "west"  # never in training: the out-of-vocabulary value, as the server takes it
            w.writerow(row)
            if line not in BAD:
                good[line] = dict(zip(table[0], row))
    return good


def _instance(row: dict) -> dict:
    """A good input row as a REST instance, typed as the signature takes it."""
    out = {}
    for k in FEATURES:
        v = row[k]
        out[k] = int(v) if k == "lambda" else float(v) if k in ("wind speed", "Sepal.Length") else v
    return out


@pytest.fixture(scope="module")
def scored(keyword_model, tmp_path_factory):
    """The bad-rows input scored through the CLI, CSV output: (output dir, good rows by line)."""
    root = tmp_path_factory.mktemp("predict")
    good = _input(str(root / "rows.csv"))
    out = root / "scored"
    res = run_cli("predict", "--model", keyword_model, "--input", str(root / "rows.csv"), "--out", str(out),
                  "--output-format", "csv")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "120 rows read -> 116 predicted, 4 dead-lettered" in res.stdout, res.stdout
    return str(out), good, res.stdout


def _read_csv(out: str) -> list[dict]:
    rows = []
    for name in sorted(os.listdir(os.path.join(out, "predictions"))):
        with open(os.path.join(out, "predictions", name), newline="") as f:
            rows.extend(csv.DictReader(f))
    return rows


def test_every_row_is_predicted_or_dead_lettered_with_its_reason(scored):
    out, good, stdout = scored
    manifest = json.load(open(os.path.join(out, "predict.json")))
    assert manifest["counts"] == {"read": 120, "predicted": 116, "bad": 4}
    assert manifest["model"]["name"] == "kw" and manifest["model"]["version"] == 1
    dead = [json.loads(line) for name in manifest["outputs"]["deadletter"]
            for line in open(os.path.join(out, name))]
    assert sorted(d["line"] for d in dead) == sorted(BAD)
    for d in dead:
        assert d["reason"].startswith(BAD[d["line"]]), d
        assert d["raw"] and d["source"].endswith("rows.csv")
    rows = _read_csv(out)
    assert len(rows) == len(good) == 116
    # in the input's order, each with its features as read, the label where it had one, the model
    assert [r["from"] for r in rows] == [g["from"] for g in good.values()]
    assert rows[list(good).index(15)]["label"] == "" and rows[0]["label"] in ("hi", "lo")
    assert {r["model"] for r in rows} == {"kw"} and {r["model_version"] for r in rows} == {"1"}
    assert set(rows[0]) == set(FEATURES) | {"label", "prediction", "probability", "probability_hi",
                                            "probability_lo", "model", "model_version"}
    assert "fields separated by semicolons" in stdout
    # the worker measured the size of its model calls on the version's test rows, and said so
    from tfpipe.predict.model import BATCH_SIZES

    assert len(manifest["batch_rows"]) == 1 and manifest["batch_rows"][0] in BATCH_SIZES
    assert f"model calls of {manifest['batch_rows'][0]:,} rows, as measured where the model was loaded (256 -> " \
        in stdout, stdout


def test_the_answers_are_the_servers_for_the_same_rows_and_version(scored, keyword_model):
    """REST and gRPC Predict on the embedded server, the same rows: the same classes, and the same
    probabilities within float32 rounding."""
    import grpc
    import requests
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    from tfpipe.serve.flags import ServeOptions
    from tfpipe.serve.server import ServerThread

    out, good, _ = scored
    rows = _read_csv(out)
    instances = [_instance(g) for g in good.values()]
    opts = ServeOptions(host="127.0.0.1", port=-1, rest_api_port=-1, model_name="kw", model_base_path=keyword_model)
    with ServerThread(opts) as server:
        r = requests.post(f"http://127.0.0.1:{server.rest_port}/v1/models/kw:predict",
                          json={"instances": instances}, timeout=60)
        assert r.status_code == 200, r.text
        rest = r.json()["predictions"]
        req = predict_pb2.PredictRequest()
        req.model_spec.name = "kw"
        for k in FEATURES:
            values = [i[k] for i in instances]
            dtype = np.int64 if k == "lambda" else np.float32 if k in ("wind speed", "Sepal.Length") else object
            req.inputs[k].CopyFrom(tf.make_tensor_proto(np.array(values, dtype=dtype)))
        with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            reply = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(req, timeout=60)
    grpc_classes = [c.decode() for c in tf.make_ndarray(reply.outputs["classes"])]
    grpc_probabilities = tf.make_ndarray(reply.outputs["probabilities"])
    assert [r["prediction"] for r in rows] == [p["classes"] for p in rest] == grpc_classes
    batch = np.array([[float(r["probability_hi"]), float(r["probability_lo"])] for r in rows])
    served = np.array([p["probabilities"] for p in rest])
    order = [["hi", "lo"].index(c) for c in ("hi", "lo")]  # the schema's classes are sorted: hi, lo
    np.testing.assert_allclose(batch, served[:, order], rtol=0, atol=1e-6)
    np.testing.assert_allclose(batch, grpc_probabilities[:, order], rtol=0, atol=1e-6)
    assert len({r["prediction"] for r in rows}) == 2  # both classes come up: the comparison means something


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_each_output_format_reads_back_the_same_answers(scored, keyword_model, tmp_path, fmt):
    """Parquet and JSON Lines hold the CSV's answers; --key writes only that column beside them; a
    file without the label column is scored; --workdir names a run's model and output."""
    import pandas as pd

    from tfpipe.predict.config import PredictConfig
    from tfpipe.predict.job import run

    out, good, _ = scored
    want = _read_csv(out)
    source = tmp_path / "no-label.csv"
    with open(source, "w", newline="") as f:  # no label; a row number training never saw, carried along
        w = csv.writer(f)
        w.writerow(["Sample Number", *FEATURES])
        for line, g in good.items():
            w.writerow([line, *(g[k] for k in FEATURES)])
    if fmt == "parquet":
        config = PredictConfig(model=keyword_model, input=[str(source)], out=str(tmp_path / "o"), output_format=fmt,
                               batch_rows=32, prediction_log=True)
    else:  # a run's workdir names the model it serves and where the predictions go
        os.makedirs(tmp_path / "run" / "export" / "models" / "load-results")  # not a model: no version in it
        os.symlink(keyword_model, tmp_path / "run" / "export" / "models" / "kw")
        config = PredictConfig(workdir=str(tmp_path / "run"), input=[str(source)], output_format=fmt, key="from")
    got_dir = run(config, log=lambda _: None).outputs.path
    assert got_dir == str(tmp_path / ("o" if fmt == "parquet" else "run/predict"))
    folder = os.path.join(got_dir, "predictions")
    if fmt == "parquet":
        got = pd.read_parquet(folder)
        assert list(got.columns) == ["Sample Number", *FEATURES, "prediction", "probability", "probability_hi",
                                     "probability_lo", "model", "model_version"]
        assert got["Sample Number"].tolist() == [str(line) for line in good]
        assert got["lambda"].dtype == np.int64 and got["wind speed"].dtype == np.float64
    else:
        got = pd.concat(pd.read_json(os.path.join(folder, n), lines=True) for n in sorted(os.listdir(folder)))
        assert list(got.columns) == ["from", "prediction", "probability", "probability_hi", "probability_lo",
                                     "model", "model_version"]
    assert got["prediction"].tolist() == [w["prediction"] for w in want]
    np.testing.assert_allclose(got["probability_hi"], [float(w["probability_hi"]) for w in want], atol=1e-6)
    assert got["from"].tolist() == [g["from"] for g in good.values()]


@pytest.mark.parametrize("args, error", [
    (["--model", "{tmp}/nowhere"], "--model {tmp}/nowhere: no such directory"),
    (["--model", "{tmp}"], "neither a model base path"),
    (["--input", "{tmp}/lacks.csv"], "lacks 1 of the model's feature columns (day)"),
    # a virtualenv that engines/setup.sh did not make: no tfpipe in it
    (["--environment", "{tmp}/plain"], "environment {tmp}/plain: Python there has no module 'tfpipe"),
])
def test_bad_input_exits_2_with_one_line(keyword_model, tmp_path, args, error):
    with open(tmp_path / "lacks.csv", "w") as f:
        f.write(",".join(c for c in FEATURES if c != "day") + "\nnorth,a,3,1.0,2.0,True\n")
    if "--environment" in args:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "plain")], check=True)
    given = {"--model": keyword_model, "--input": str(tmp_path / "lacks.csv"), "--out": str(tmp_path / "o")}
    for flag, value in zip(args[::2], args[1::2]):
        given[flag] = value.format(tmp=tmp_path)
    res = run_cli("predict", *[x for kv in given.items() for x in kv])
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and error.format(tmp=tmp_path) in lines[0], res.stderr
    assert not (tmp_path / "o").exists()


def test_the_prediction_log_is_the_request_logs_format_which_skew_reads(scored, keyword_model, tmp_path):
    """--prediction-log: each scored row as a PredictionLog (its PredictRequest and PredictResponse),
    in the files tfpipe skew reads as it reads a server's request log."""
    from tensorflow_serving.apis import prediction_log_pb2

    from tfpipe.prediction_logs import read_log
    from tfpipe.predict.config import PredictConfig
    from tfpipe.predict.job import run

    out, good, _ = scored
    want = _read_csv(out)
    source = tmp_path / "rows.jsonl"
    with open(source, "w") as f:
        for g in good.values():
            f.write(json.dumps(_instance(g)) + "\n")
    got = run(PredictConfig(model=keyword_model, input=[str(source)], out=str(tmp_path / "o"), prediction_log=True),
              log=lambda _: None).outputs.path
    records = read_log(os.path.join(got, "prediction_logs", "log")).records
    assert len(records) == len(good)
    first = prediction_log_pb2.PredictionLog.FromString(records[0])
    request, response = first.predict_log.request, first.predict_log.response
    assert request.model_spec.name == "kw" and request.model_spec.version.value == 1
    assert sorted(request.inputs) == sorted(FEATURES)
    assert request.inputs["from"].string_val == [list(good.values())[0]["from"].encode()]
    assert response.outputs["classes"].string_val == [want[0]["prediction"].encode()]
    data = os.path.join(os.path.dirname(os.path.dirname(keyword_model)), "data")
    res = run_cli("skew", "--data", data, "--logs", os.path.join(got, "prediction_logs", "log"),
                  "--out", str(tmp_path / "skew"))
    assert res.returncode in (0, 1), res.stderr[-2000:]
    report = json.load(open(tmp_path / "skew" / "skew.json"))
    assert report["traffic"]["rows"] == report["traffic"]["requests"] == len(good), report["traffic"]


def test_only_the_rows_a_model_refuses_are_dead_lettered_with_its_reason(tmp_path):
    """A call the model refuses (INVALID_ARGUMENT, as a server answers 400) is split: the pieces
    alone, then the refused piece row by row, so that the other rows are answered and each refused
    one carries the model's message; an error that is not the rows' (here a file the model reads
    is gone, NOT_FOUND) fails the job instead."""
    import tensorflow as tf

    from tfpipe.pipeline.validation import Column
    from tfpipe.predict.model import Rows, _scored
    from tfpipe.serve.core.servable import Servable
    from tfpipe.serve.errors import ServingError

    class NonNegative(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
        def serve(self, x):
            check = tf.debugging.assert_non_negative(x, message="x must not be negative")
            with tf.control_dependencies([check]):
                return {"y": x * 2.0}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
        def broken(self, x):  # a file it needs is gone: NOT_FOUND, which is no row's fault
            return {"y": x * tf.strings.to_number(tf.io.read_file(str(tmp_path / "gone")))}

    module = NonNegative()
    tf.saved_model.save(module, str(tmp_path / "1"), signatures={"serving_default": module.serve,
                                                                 "broken": module.broken})
    servable = Servable("nn", 1, str(tmp_path / "1"))
    sig = servable.signature("serving_default")

    def piece(seq, values):
        x = np.array(values, np.float32)
        rows = Rows(0, seq, "f.csv", np.arange(len(x)) + 2, [str(v) for v in values],
                    {"x": Column(x, np.ones(len(x), bool))})
        return rows, {"x": x}, {}

    pieces = [piece(0, [1.0, 2.0]), piece(1, [3.0, -1.0, 4.0]), piece(2, [5.0])]
    first, second, third = _scored(servable, sig, pieces)
    assert first.outputs["y"].tolist() == [2.0, 4.0] and not first.refused
    assert second.taken.tolist() == [0, 2] and second.outputs["y"].tolist() == [6.0, 8.0]
    assert list(second.refused) == [1] and "x must not be negative" in second.refused[1]
    assert third.outputs["y"].tolist() == [10.0]
    with pytest.raises(ServingError) as e:
        _scored(servable, servable.signature("broken"), pieces)
    assert e.value.code.name == "NOT_FOUND"
