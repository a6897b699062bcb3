"""The second day: a retrained penguins model goes live only after it has beaten the served one on
the same rows; a worse one, or one that would break the served one's clients, is kept as a
candidate while the served version goes on answering; promote and rollback by hand; the history.
Real data stage, training, export and server on 127.0.0.1."""

from __future__ import annotations

import csv
import json
import os
import random
import shutil

import pytest
import requests
from conftest import run_cli
from reloading import wait_version

from tfpipe import versions

pytestmark = pytest.mark.xdist_group("second_day")


def _data(csv_path: str, out: str, **settings) -> str:
    from tfpipe.pipeline.config import DataConfig
    from tfpipe.pipeline.job import run

    return run(DataConfig(input=[csv_path], label="species", out=out, **settings), log=lambda _: None).outputs.path


def _train(data: str, out: str, epochs: int) -> str:
    res = run_cli("train", "--data", data, "--out", out, "--epochs", str(epochs), "--learning-rate", "0.01")
    assert res.returncode == 0, res.stderr
    return out


def _rows(penguins_csv: str) -> tuple[list[str], list[dict[str, str]]]:
    with open(penguins_csv, newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames), list(reader)


def _write(path: str, header: list[str], rows: list[dict[str, str]]) -> str:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, header)
        w.writeheader()
        w.writerows(rows)
    return path


@pytest.fixture(scope="module")
def day_data(tmp_path_factory, penguins_csv, penguins_data):
    """The data stage's output for each day of the story: day 1 on half the rows; day 2 on all of
    them (the suite's shared penguins data); day 2 with every label shuffled; day 2 without the
    island column."""
    root = tmp_path_factory.mktemp("day-data")
    header, rows = _rows(penguins_csv)
    half = _write(str(root / "half.csv"), header, rows[::2])
    shuffled_rows = [dict(r) for r in rows]
    species = [r["species"] for r in rows]
    random.Random(0).shuffle(species)
    for r, s in zip(shuffled_rows, species):
        r["species"] = s
    shuffled = _write(str(root / "shuffled.csv"), header, shuffled_rows)
    return {"day1": _data(half, str(root / "day1")), "more rows": penguins_data,
            "shuffled": _data(shuffled, str(root / "shuffled")),
            "no island": _data(penguins_csv, str(root / "noisland"), exclude=["island"])}


@pytest.fixture(scope="module")
def days(tmp_path_factory, day_data, penguins_trained):
    """(data, trained model) for each day of the story; day 2 on all the rows is the suite's shared
    penguins model."""
    root = tmp_path_factory.mktemp("days")
    return {"day1": (day_data["day1"], _train(day_data["day1"], str(root / "day1-train"), 10)),
            "more rows": penguins_trained,
            "shuffled": (day_data["shuffled"], _train(day_data["shuffled"], str(root / "shuffled-train"), 5)),
            "no island": (day_data["no island"], _train(day_data["no island"], str(root / "noisland-train"), 5))}


def export(model: tuple[str, str], base, *flags: str):
    data, train = model
    return run_cli("export", "--model", train, "--data", data, "--base", str(base), "--name", "penguins",
                   "--tflite", "", "--warmup-records", "5", *flags)


@pytest.fixture(scope="module")
def day1_published(tmp_path_factory, days):
    """A base path holding day 1's model alone, exported once (version 1, published): where both
    gate stories start. Each test works on its own copy of it (`_from_day1`)."""
    base = tmp_path_factory.mktemp("day1-published") / "models"
    res = export(days["day1"], base)
    assert res.returncode == 0, res.stderr
    return base


def _from_day1(day1_published, tmp_path):
    base = tmp_path / "models"
    shutil.copytree(day1_published, base, symlinks=True)
    return base


def served_version(url: str) -> tuple[int, float]:
    """(the version the server answers unversioned requests from, one prediction's top score)."""
    row = {"bill_length_mm": 39.1, "bill_depth_mm": 18.7, "flipper_length_mm": 181, "body_mass_g": 3750,
           "island": "Torgersen", "sex": "male", "year": 2007}
    status = requests.get(f"{url}/v1/models/penguins", timeout=30).json()["model_version_status"]
    available = [int(s["version"]) for s in status if s["state"] == "AVAILABLE"]
    r = requests.post(f"{url}/v1/models/penguins:predict", json={"instances": [row]}, timeout=30)
    assert r.status_code == 200, r.text
    return max(available), max(r.json()["predictions"][0]["probabilities"])


@pytest.mark.long
def test_a_new_version_is_served_only_when_it_beats_the_served_one(tmp_path, days, day1_published):
    from tfpipe.serve.flags import ServeOptions
    from tfpipe.serve.server import ServerThread

    base = _from_day1(day1_published, tmp_path)  # day 1's export, published
    model = str(base / "penguins")
    assert versions.served(model) == 1 and [e["event"] for e in versions.history(model)] == ["published"]
    assert os.path.exists(os.path.join(model, "1", "assets.extra", "test_data", "data.json"))  # kept for day 2

    opts = ServeOptions(host="127.0.0.1", port=-1, rest_api_port=-1, model_name="penguins", model_base_path=model,
                        file_system_poll_wait_seconds=1)
    with ServerThread(opts) as server:
        url = f"http://127.0.0.1:{server.rest_port}"
        assert served_version(url)[0] == 1

        # Labels shuffled: no better than chance on day 1's rows, where the served version is right.
        res = export(days["shuffled"], base, "--slice", "island")
        assert res.returncode == 1, res.stdout + res.stderr
        assert "held" in res.stdout and "previous test split" in res.stdout
        assert versions.served(model) == 1 and versions.candidates(model) == [2]
        server.manager.poll()  # a poll of the base path, now: the held version is not in the served range
        assert served_version(url)[0] == 1
        manifest = json.load(open(os.path.join(model, "candidates", "2", "assets.extra", "export.json")))
        assert manifest["decision"] == "held" and not manifest["gate"]["passed"]
        assert any(c["slice"] and c["slice"].startswith("island=") for c in manifest["gate"]["checks"])

        # All the rows: at least as good on both days' test rows, so it is served.
        res = export(days["more rows"], base)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "promoted" in res.stdout
        assert versions.served(model) == 3
        wait_version(url, "penguins", 3)

        # A model without the island column would break clients that send it: refused, named.
        res = export(days["no island"], base)
        assert res.returncode == 1
        assert "refused" in res.stdout and "input 'island' removed" in res.stdout
        assert versions.served(model) == 3 and versions.candidates(model) == [2, 4]

        # Back to the day before, by hand; then the held candidate promoted by hand.
        res = run_cli("rollback", model, "--reason", "checked by hand")
        assert res.returncode == 0, res.stderr
        assert versions.served(model) == 1 and versions.candidates(model) == [2, 3, 4]
        wait_version(url, "penguins", 1)
        res = run_cli("promote", model, "--version", "3")
        assert res.returncode == 0, res.stderr
        wait_version(url, "penguins", 3)

    res = run_cli("history", model)
    assert res.returncode == 0
    events = [line.split()[1] for line in res.stdout.splitlines()[1:]]
    assert events == ["published", "held", "promoted", "refused", "rolled", "promoted"], res.stdout
    assert "checked by hand" in res.stdout


@pytest.mark.long
def test_a_threshold_holds_a_version_that_the_noise_rule_would_pass(tmp_path, days, day1_published):
    base = _from_day1(day1_published, tmp_path)
    assert versions.served(str(base / "penguins")) == 1
    res = export(days["more rows"], base, "--thresholds", "accuracy>=1.01")
    assert res.returncode == 1 and "held" in res.stdout and "accuracy>=1.01" in res.stdout, res.stdout
    assert versions.served(str(base / "penguins")) == 1 and versions.candidates(str(base / "penguins")) == [2]


def _record(passed: bool, breaks: list[str] = ()) -> dict:
    check = {"data": "new test split", "slice": None, "rows": 30, "metric": "accuracy", "candidate": 0.9,
             "baseline": 0.92, "p_value": 0.5}
    return {"breaking_changes": list(breaks), "passed": passed, "failed": [] if passed else ["x worse"],
            "data": [{"rows": 30}, {"rows": 20}], "thresholds": [], "checks": [check]}


@pytest.mark.parametrize("record,settings,want", [
    (_record(True), {}, ("promoted", "not worse than the served version beyond the noise (new test split (30 rows): "
                                     "accuracy 0.9 vs 0.92 served, p=0.5)")),
    (_record(True), {"serving_gate": True}, ("passed", "not worse")),
    (_record(False), {}, ("held", "x worse")),
    (_record(False), {"promote": "always"}, ("promoted", "--promote always, though x worse")),
    (_record(True), {"promote": "never"}, ("held", "--promote never")),
    (_record(True, ["serving_default: input 'a' removed"]), {"promote": "always"},
     ("refused", "serving_default: input 'a' removed (--breaking-change to allow it)")),
    (_record(True, ["serving_default: input 'a' removed"]), {"breaking_change": True}, ("promoted", "not worse")),
])
def test_the_decision(record, settings, want):
    from tfpipe.export.config import ExportConfig
    from tfpipe.export.judge import decide

    decision, why = decide(record, ExportConfig(**settings))
    assert decision == want[0] and want[1] in why, why


def test_the_new_data_is_compared_with_the_data_of_the_served_version(tmp_path, day_data, penguins_csv):
    """The same rows have not moved; a column shifted by 20 mm has, and only it; and the first day's
    half of the rows (every second one, and the file alternates the sexes) has moved in `sex`."""
    from tfpipe.export.judge import keep_test_data
    from tfpipe.rollout.drift import drift_line, new_data_against_served
    from tfpipe.train.datadir import load_data_dir

    served = tmp_path / "1"
    keep_test_data(str(served), load_data_dir(day_data["more rows"]))  # what a version of all the rows keeps
    same = new_data_against_served(day_data["no island"], str(served))  # the same rows, island left out
    assert same["drifted"] == [] and len(same["features"]) == 6 and same["only_served"] == ["island"], same
    assert "no feature moved" in drift_line(same)
    assert new_data_against_served(day_data["day1"], str(served))["drifted"] == ["sex"]
    header, rows = _rows(penguins_csv)
    for r in rows:
        if r["bill_length_mm"] not in ("", "NA"):
            r["bill_length_mm"] = str(float(r["bill_length_mm"]) + 20)
    shifted = _data(_write(str(tmp_path / "shifted.csv"), header, rows), str(tmp_path / "shifted-data"))
    moved = new_data_against_served(shifted, str(served))
    assert moved["drifted"] == ["bill_length_mm"], moved["features"]
    assert "bill_length_mm moved beyond the noise" in drift_line(moved)


@pytest.mark.parametrize("a,b,measure,moved", [
    ([50, 50], [48, 52], "l_infinity", False),
    ([50, 50], [10, 90], "l_infinity", True),
    ([5, 5, 5, 5], [100, 100, 100, 100], "jensen_shannon", False),
    ([5, 5, 5, 5], [400, 0, 0, 0], "jensen_shannon", True),
])
def test_two_sample_bound(a, b, measure, moved):
    import numpy as np

    from tfpipe.rollout.drift import js_pairs, two_sample_bound

    a, b = np.array(a, float), np.array(b, float)
    fa, fb = a / a.sum(), b / b.sum()
    d = np.abs(fa - fb).max() if measure == "l_infinity" else js_pairs(fa[None, :], fb[None, :])[0]
    bound = two_sample_bound(a, b, measure, 0.99)
    assert bool(d > bound) is moved, (d, bound)
    assert two_sample_bound(np.zeros(2), b[:2], measure, 0.99) is None


def test_a_served_version_without_an_example_signature_holds_the_new_one_with_the_reason(tmp_path):
    """A served version tfpipe did not make (no classification or regression signature to answer the
    rows through): the new version is not compared but held, the reason says why; --promote always
    still serves it (with --breaking-change, since its signatures differ too)."""
    import tensorflow as tf
    from serving_models import save_half

    from tfpipe.export.config import ExportConfig
    from tfpipe.export.judge import decide, judge

    class Regressor(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
        def regress(self, inputs):
            return {"outputs": tf.zeros([tf.shape(inputs)[0]])}

    save_half(str(tmp_path / "served"))
    module = Regressor()
    tf.saved_model.save(module, str(tmp_path / "new"), signatures={"regression": module.regress})
    record = judge(str(tmp_path / "new"), str(tmp_path / "served"), None, ExportConfig(), log=lambda _: None)
    assert not record["passed"] and "cannot be judged against" in record["failed"][0], record
    assert decide(record, ExportConfig(breaking_change=True)) == ("held", record["failed"][0])
    assert decide(record, ExportConfig(breaking_change=True, promote="always"))[0] == "promoted"
    assert decide(record, ExportConfig())[0] == "refused"  # and its signatures differ
