"""A user's own file through `tfpipe run --input FILE --label COL`, with no config: the workdir and
the model take the file's name, nothing of the penguins demo comes in, and a small data set's
served traffic is not called skewed for its sampling noise, while a real shift still is."""

from __future__ import annotations

import csv
import json
import os
import random

import pytest

from conftest import run_cli, skew_of_predictions
from tfpipe.stage import SkewOutputs

pytestmark = pytest.mark.xdist_group("own_data")


def _load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def own_run(tmp_path_factory):
    """400 random rows: three float columns, an int, a categorical `color`, a binary label."""
    root = tmp_path_factory.mktemp("own")
    rng = random.Random(11)
    path = root / "my_rows.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["x1", "x2", "x3", "count", "color", "label"])
        for _ in range(400):
            w.writerow([round(rng.gauss(0, 1), 4), round(rng.uniform(0, 10), 3), round(rng.expovariate(1), 4),
                        rng.randint(0, 20), rng.choice(["red", "green", "blue"]),
                        "yes" if rng.random() < 0.85 else "no"])
    workdir = str(root / "runs" / "my_rows")
    # shortened for the suite (the defaults otherwise: nothing is read from examples/penguins.toml);
    # the labels are drawn apart from the features, 85% yes, so the model learns to say yes, as
    # the majority class does, and is no better than it: published anyway
    res = run_cli("run", "--input", str(path), "--label", "label", "--workdir", workdir,
                  "--set", "train.epochs=4", "--set", "export.tflite=float32", "--set", "export.allow_weak=true",
                  "--set", "loadtest.duration=2s",
                  "--set", "loadtest.warmup=0.5s", "--set", "loadtest.users=2", timeout=400)
    return workdir, res


@pytest.mark.long
def test_own_file_runs_to_the_end_and_small_traffic_is_within_noise(own_run):
    workdir, res = own_run
    assert res.returncode == 0, res.stdout + res.stderr
    assert "my_rows.csv (label 'label', model 'my_rows')" in res.stdout
    assert "penguins" not in res.stdout
    export = _load(os.path.join(workdir, "export", "models", "my_rows", "1", "assets.extra", "export.json"))
    assert export["name"] == "my_rows"
    # a model no better than the trivial baseline is said to be so, published or not
    assert "NO BETTER" in res.stdout and "published anyway (allow_weak)" in open(
        os.path.join(workdir, "logs", "export.log")).read()
    train = _load(os.path.join(workdir, "train", "train.json"))
    assert train["config"]["epochs"] == 4 and train["config"]["patience"] == 5  # the stage's default, not 8
    skew = _load(os.path.join(workdir, "skew", "skew.json"))
    assert skew["passed"] is True and skew["flagged"] == []
    # the load test sent the 40 eval and 40-odd test rows, again and again: that is the evidence
    assert 60 <= skew["noise"]["effective_rows"] <= 100 < skew["traffic"]["rows"]
    for f in skew["features"]:
        assert f["verdict"] in ("ok", "within noise"), f
        assert f["noise_bound"] is not None and f["noise_bound"] > 0
        if f["distance"] > f["threshold"]:
            assert f["verdict"] == "within noise" and f["distance"] <= f["noise_bound"]
    page = open(os.path.join(workdir, "skew", "skew.html")).read()
    assert "noise bound" in page


@pytest.mark.long  # test_run's test of a category moved runs in the main suite, on its shared first run
def test_fifty_rows_with_one_category_moved_by_half_are_skewed(own_run, tmp_path):
    """The run's model served with request logging; 50 rows whose color is red in 84% of them
    (a third in training): tfpipe skew exits 1 and names color only."""
    workdir, res = own_run
    assert res.returncode == 0, res.stdout + res.stderr
    rng = random.Random(5)
    colors = ["red"] * 42 + ["green"] * 4 + ["blue"] * 4
    rows = [{"x1": rng.gauss(0, 1), "x2": rng.uniform(0, 10), "x3": rng.expovariate(1), "count": rng.randint(0, 20),
             "color": c} for c in colors]
    res, skew = skew_of_predictions(workdir, "my_rows", rows, tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    assert skew["flagged"] == ["color"]
    color = next(f for f in skew["features"] if f["name"] == "color")
    assert color["distance"] > 0.45 and color["distance"] > color["noise_bound"]
    assert skew["noise"]["effective_rows"] == pytest.approx(50)
    assert "over their threshold and beyond the noise: color" in res.stdout
    from tfpipe.skew.job import result

    r = result(str(tmp_path / "skew"), res.returncode)  # what tfpipe run shows and keeps of it
    assert r.summary.endswith("SKEWED: color") and r.summary.startswith("5 logged requests, 50 rows (50 effective)")
    assert (r.outputs, r.code) == (SkewOutputs(str(tmp_path / "skew"), False), 1)


@pytest.mark.parametrize("argv, workdir, name, config_path", [
    (["run"], "runs/penguins", "penguins", "penguins.toml"),
    (["run", "--input", "data/my rows.csv", "--label", "y"], "runs/my_rows", "my_rows", None),
    (["run", "--input", "raw/*.csv", "--label", "y"], "runs/raw", "raw", None),
    (["run", "--input", "a.parquet", "--label", "y", "--workdir", "w"], "w", "a", None),
    (["run", "--input", "a.csv", "--label", "y", "--set", "export.name=taxi"], "runs/a", "taxi", None),
    (["run", "--config", "examples/chicago_taxi.toml", "--input", "a.csv"], "runs/chicago_taxi", "chicago_taxi",
     "chicago_taxi.toml"),
    (["show", "--input", "data/my.csv"], "runs/my", None, None),
])
def test_run_picks_the_workdir_and_model_name_from_what_it_is_given(argv, workdir, name, config_path, monkeypatch):
    from tfpipe.cli import build_parser, run_request_config

    monkeypatch.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = build_parser().parse_args(argv)
    config, path, got = run_request_config(args)
    assert got == workdir
    if name:
        assert config.export.name == name
    assert (path is None) == (config_path is None) and (path or "").endswith(config_path or "")


def test_own_file_without_a_label_is_a_clear_error():
    from tfpipe.cli import build_parser, run_request_config
    from tfpipe.errors import ConfigError

    with pytest.raises(ConfigError, match="--label COLUMN"):
        run_request_config(build_parser().parse_args(["run", "--input", "my.csv"]))
