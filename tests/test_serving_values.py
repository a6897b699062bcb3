"""What the served model does with a value its training data could not hold: a date column's
value that is not a date is refused (400, gRPC INVALID_ARGUMENT, naming the input), as the data
stage dead-letters it; an empty one is missing, as training saw; a category never seen is the
out-of-vocabulary value, as the rare values outside training's vocabulary were."""

from __future__ import annotations

import csv
import datetime

import numpy as np
import requests


def _table(path: str) -> str:
    start = datetime.date(2020, 1, 1)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["day", "shop", "units", "busy"])
        for i in range(200):
            day = start + datetime.timedelta(days=i * 3)
            units = 10 + (i * 7) % 30
            w.writerow([day.isoformat() if i % 17 else "", ["north", "south", "east"][i % 3], units,
                        "yes" if units > 24 else "no"])
    return path


def test_a_date_that_is_not_one_is_refused_naming_the_input_and_a_new_category_is_served(tmp_path):
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    from tfpipe.export.config import ExportConfig
    from tfpipe.export.job import run as export
    from tfpipe.pipeline.config import DataConfig
    from tfpipe.pipeline.job import run as data_stage
    from tfpipe.serve.flags import ServeOptions
    from tfpipe.serve.server import ServerThread
    from tfpipe.train.config import TrainConfig
    from tfpipe.train.job import run as train

    quiet = lambda _: None  # noqa: E731
    data = data_stage(DataConfig(input=[_table(str(tmp_path / "t.csv"))], label="busy", out=str(tmp_path / "d")),
                      log=quiet)
    model = train(TrainConfig(data=data, out=str(tmp_path / "train"), epochs=30, learning_rate=0.05), log=quiet)
    export(ExportConfig(model=model, data=data, base=str(tmp_path / "models"), name="shop", tflite=""), log=quiet)
    row = {"day": "2021-03-04", "shop": "north", "units": 27}
    opts = ServeOptions(host="127.0.0.1", port=-1, rest_api_port=-1, model_name="shop",
                        model_base_path=str(tmp_path / "models" / "shop"))
    with ServerThread(opts) as server:
        url = f"http://127.0.0.1:{server.rest_port}/v1/models/shop:predict"

        def post(**change):
            return requests.post(url, json={"instances": [row, {**row, **change}]}, timeout=30)

        ok = post()
        assert ok.status_code == 200, ok.text
        for bad in ("hello", "25/12/1988", "1988-02-30"):
            r = post(day=bad)
            assert r.status_code == 400, (bad, r.status_code, r.text)
            assert 'the input `day` holds a value that is not an ISO-8601 date' in r.json()["error"] and bad in r.text
        missing = post(day="")
        assert missing.status_code == 200, missing.text
        unseen = post(shop="west")  # never in training: the out-of-vocabulary value
        assert unseen.status_code == 200, unseen.text
        probabilities = unseen.json()["predictions"][1]["probabilities"]
        assert abs(sum(probabilities) - 1) < 1e-5
        assert post().status_code == 200  # and it keeps serving

        req = predict_pb2.PredictRequest()
        req.model_spec.name = "shop"
        for k, v in {**row, "day": "hello"}.items():
            req.inputs[k].CopyFrom(tf.make_tensor_proto(np.array([v], dtype=object if isinstance(v, str) else np.int64)))
        with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            try:
                stub.Predict(req, timeout=30)
                raise AssertionError("a date that is not one was answered")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and 'the input `day`' in e.details(), e
