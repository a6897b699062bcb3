"""`tfpipe run` end to end on penguins: every artifact's content, a rerun that is all cache hits,
a changed learning rate that reruns train and what follows but not data, and a run killed during
training that resumes there. One first run is shared and never changed: a test that runs again
works on its own copy of it, so every test stands alone, in any order."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import threading
import time

import numpy as np
import pytest
from browser import render
from conftest import ROOT, backup_epoch, run_cli, spawn_cli

from tfpipe import versions

# its expensive fixtures (servers, runs) are session-scoped and built once, on one xdist worker: a
# worker may run other files in between, which would tear down and rebuild module-scoped ones
pytestmark = pytest.mark.xdist_group("run")

STEPS = ["data", "train", "export", "serve", "loadtest", "skew", "rollout"]


@pytest.fixture(scope="session")
def config(tmp_path_factory, penguins_csv) -> str:
    """The penguins demo, shortened for tests: 20 epochs at a higher learning rate, one TFLite
    variant, a 1-second load test."""
    path = tmp_path_factory.mktemp("config") / "penguins.toml"
    path.write_text(f"""
[data]
input = [{json.dumps(penguins_csv)}]
label = "species"

[train]
epochs = 20
batch_size = 32
patience = 20
learning_rate = 0.01

[export]
name = "penguins"
tflite = "float32"
max_accuracy_drop = 0.05

[serve]
check_rows = 16

[loadtest]
users = 2
duration = "1s"
warmup = "0.2s"
slo = "p99<2000ms,errors<1%"
""")
    return str(path)


@pytest.fixture(scope="session")
def first_run(tmp_path_factory, config) -> tuple[str, subprocess.CompletedProcess]:
    workdir = str(tmp_path_factory.mktemp("run") / "penguins")
    res = run_cli("run", "--config", config, "--workdir", workdir, timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr
    return workdir, res


@pytest.fixture
def run_copy(first_run, tmp_path) -> str:
    """A copy of the first run's workdir for a test that runs again in it."""
    workdir = str(tmp_path / "penguins")
    shutil.copytree(first_run[0], workdir, symlinks=True)
    return workdir


def manifest(workdir: str) -> dict:
    with open(os.path.join(workdir, "manifest.json")) as f:
        return json.load(f)


def load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def states(stdout: str) -> dict[str, str]:
    """{step: its final state} from the one line per step the run prints."""
    out = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in STEPS and parts[1] in ("cached", "done", "failed", "running"):
            out[parts[0]] = parts[1]
    return out


def test_first_run_produces_every_artifact_with_reconciling_content(first_run, penguins_csv):
    workdir, res = first_run
    assert states(res.stdout) == dict.fromkeys(STEPS, "done")
    assert f"report: {workdir}/report.html" in res.stdout
    m = manifest(workdir)
    assert m["last_run"]["states"] == dict.fromkeys(STEPS, "done")
    assert all(m["steps"][s]["status"] == "done" and len(m["steps"][s]["fingerprint"]) == 64 for s in STEPS)

    # data: every CSV row is accounted for
    with open(penguins_csv) as f:
        csv_rows = sum(1 for _ in csv.DictReader(f))
    data = load(os.path.join(workdir, "data", "data.json"))
    c = data["counts"]
    assert c["read"] == csv_rows == 344
    assert sum(c["splits"].values()) + c["bad"] == c["read"]
    assert data["inputs"][0]["sha256"] == hashlib.sha256(open(penguins_csv, "rb").read()).hexdigest()

    # train: a real model
    train = load(os.path.join(workdir, "train", "train.json"))
    assert train["metrics"]["eval"]["accuracy"] >= 0.85  # 35 eval rows: see test_train's penguins floor
    assert train["data"]["fingerprint"] == data["fingerprint"]

    # export: version 1, its lineage names this train run and this data snapshot
    version_dir = os.path.join(workdir, "export", "models", "penguins", "1")
    export = load(os.path.join(version_dir, "assets.extra", "export.json"))
    assert export["lineage"]["train_fingerprint"] == train["fingerprint"]
    assert export["lineage"]["data_fingerprint"] == data["fingerprint"]
    assert [v["variant"] for v in export["variants"]] == ["savedmodel", "float32"]

    # serve: the TF Serving configs parse with the official protos and point at the model; the
    # answer the server gave for a row equals what the SavedModel gives in this process
    import tensorflow as tf
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    served = load(os.path.join(workdir, "serve", "serve.json"))
    config = text_format.Parse(open(os.path.join(workdir, "serve", "models.config")).read(),
                               model_server_config_pb2.ModelServerConfig())
    assert [(c.name, c.base_path) for c in config.model_config_list.config] == \
        [("penguins", os.path.join(workdir, "export", "models", "penguins"))]
    assert served["check"]["rows"] == 16 and served["check"]["max_abs_diff"] <= 1e-5
    row = served["check"]["example"]["instance"]
    fn = tf.saved_model.load(version_dir).signatures["serving_default"]
    feeds = {k: tf.constant([v.encode() if isinstance(v, str) else v], spec.dtype)
             for k, spec in fn.structured_input_signature[1].items() for v in [row[k]]}
    local = fn(**feeds)
    np.testing.assert_allclose(served["check"]["served"]["probabilities"], local["probabilities"].numpy()[0],
                               atol=1e-5)
    assert served["check"]["served"]["classes"] == local["classes"].numpy()[0].decode()

    # loadtest: requests were answered, none failed, the SLO verdict is recorded
    results = load(os.path.join(workdir, "loadtest", "results.json"))
    step = results["steps"][0]
    assert step["requests"] > 50 and step["errors"] == 0 and 0 < step["p50_ms"] <= step["p99_ms"]
    assert results["slo_passed"] is True
    assert results["config"]["target"].startswith("http://127.0.0.1:")
    # the tensorflow_model_server command in serve.json names the ports this run's server used
    rest_port = int(results["config"]["target"].rsplit(":", 1)[1])
    assert f"--rest_api_port={rest_port}" in served["tensorflow_model_server"]
    assert "--port=8500" not in served["tensorflow_model_server"]

    # skew: the load test's requests were logged (its warmup too) and its eval rows pass against training
    skew = load(os.path.join(workdir, "skew", "skew.json"))
    assert skew["passed"] is True and skew["flagged"] == []
    assert skew["traffic"]["requests"] >= step["requests"] and skew["traffic"]["by_api"] == {
        "predict/rest": skew["traffic"]["requests"]}
    schema = load(os.path.join(workdir, "data", "schema.json"))
    assert [f["name"] for f in skew["features"]] == [c["name"] for c in schema["features"]]
    # every feature of the eval rows within the sampling noise of its count (68 rows weigh in)
    assert all(f["distance"] is not None and f["distance"] <= f["noise_bound"] for f in skew["features"])


def test_report_renders_in_a_headless_browser(first_run):
    workdir, _ = first_run
    page = render(os.path.join(workdir, "report.html"))
    assert page["errors"] == []
    # rows per split, loss, accuracy, throughput, variant sizes, latency vs throughput,
    # latency distribution, one time series per load step
    assert page["svgs"] >= 8 and page["empty_svgs"] == 0
    for text in ("Lineage", "penguins version 1", "Rows per split", "Loss per epoch", "float32",
                 "match", "SLO p99<2000ms,errors<1%: met"):
        assert text in page["text"] or text in open(os.path.join(workdir, "report.html")).read(), text
    # the skew verdict: every feature within its threshold, or over it only within the noise
    assert "Every feature within its threshold." in page["text"] or re.search(
        r"No feature skewed: .+ over the threshold but within the noise of a sample this size\.", page["text"])


def test_shifted_traffic_fails_the_skew_check_naming_the_feature(first_run, tmp_path):
    """The run's model served with request logging; the eval rows sent as tf.Examples over gRPC
    Classify and REST :classify, with body mass 3 kg heavier: tfpipe skew exits 1 and names
    body_mass_g, and only it."""
    import grpc
    from tensorflow.core.example import example_pb2
    from tensorflow_serving.apis import classification_pb2, prediction_service_pb2_grpc

    from conftest import raw_records, skew_after, start_cli_server

    workdir, _ = first_run
    prefix = str(tmp_path / "logs" / "penguins")
    proc, grpc_port, rest_port = start_cli_server(
        "--model_name=penguins", f"--model_base_path={workdir}/export/models/penguins",
        f"--request_log_prefix={prefix}")
    examples = [example_pb2.Example.FromString(r) for r in raw_records(os.path.join(workdir, "data"), "eval")]
    rows = []
    for ex in examples:
        del ex.features.feature["species"]
        mass = ex.features.feature["body_mass_g"].int64_list.value
        if mass:
            mass[0] += 3000
        values = {k: f.bytes_list.value or f.float_list.value or f.int64_list.value
                  for k, f in ex.features.feature.items()}  # a missing value: an empty list, left out here
        rows.append({k: v[0].decode() if isinstance(v[0], bytes) else v[0] for k, v in values.items() if v})
    try:
        request = classification_pb2.ClassificationRequest()
        request.model_spec.name, request.model_spec.signature_name = "penguins", "classification"
        request.input.example_list.examples.extend(examples)
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            for _ in range(3):
                stub.Classify(request, timeout=30)
        import requests

        for _ in range(3):
            r = requests.post(f"http://127.0.0.1:{rest_port}/v1/models/penguins:classify",
                              json={"signature_name": "classification", "examples": rows}, timeout=30)
            assert r.status_code == 200, r.text
    finally:
        res, skew = skew_after(proc, workdir, prefix, str(tmp_path / "skew"))
    assert res.returncode == 1, res.stdout + res.stderr
    assert "skew: 1 of 7 features over their threshold and beyond the noise: body_mass_g" in res.stdout
    assert skew["flagged"] == ["body_mass_g"]
    assert skew["traffic"]["requests"] == 6 and skew["traffic"]["rows"] == 6 * len(examples)
    assert skew["traffic"]["by_api"] == {"classify/grpc": 3, "classify/rest": 3}
    mass = next(f for f in skew["features"] if f["name"] == "body_mass_g")
    assert mass["distance"] > 0.5 and mass["out_of_range"]["above_max"] > 0
    assert mass["reasons"][0].startswith("Jensen-Shannon divergence")


def test_fifty_rows_with_one_category_moved_are_skewed(first_run, tmp_path):
    """The run's model served with request logging; fifty of its eval and test rows with no value
    missing, as they are but for the island, Torgersen in 42 of them (about a sixth in training),
    sent to REST :predict in batches of ten: tfpipe skew exits 1 and names island only, and counts
    fifty effective rows."""
    from tensorflow.core.example import example_pb2

    from conftest import raw_records, skew_of_predictions

    workdir, _ = first_run
    data = os.path.join(workdir, "data")
    rows = []
    for record in raw_records(data, "eval") + raw_records(data, "test"):
        values = {k: f.bytes_list.value or f.float_list.value or f.int64_list.value
                  for k, f in example_pb2.Example.FromString(record).features.feature.items() if k != "species"}
        rows.append({k: v[0].decode() if isinstance(v[0], bytes) else v[0] for k, v in values.items() if v})
    rows = [r for r in rows if len(r) == 7][:50]  # :predict takes every input of each row
    assert len(rows) == 50
    for i, row in enumerate(rows):
        row["island"] = "Torgersen" if i < 42 else ["Biscoe", "Dream"][i % 2]
    res, skew = skew_of_predictions(workdir, "penguins", rows, tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    assert skew["flagged"] == ["island"], skew["flagged"]
    island = next(f for f in skew["features"] if f["name"] == "island")
    assert island["distance"] > island["threshold"] and island["distance"] > island["noise_bound"]
    assert skew["noise"]["effective_rows"] == pytest.approx(50)
    assert "over their threshold and beyond the noise: island" in res.stdout


def test_show_prints_the_lineage_down_to_the_input_file(first_run, penguins_csv):
    workdir, _ = first_run
    res = run_cli("show", "--workdir", workdir)
    assert res.returncode == 0, res.stderr
    sha = hashlib.sha256(open(penguins_csv, "rb").read()).hexdigest()
    assert "lineage: model penguins version 1" in res.stdout
    assert f"{penguins_csv} sha256 {sha[:16]}" in res.stdout
    for step in STEPS:
        assert f"\n{step:<9} done" in res.stdout


def test_a_second_run_is_all_cache_hits(run_copy, config):
    workdir = run_copy
    before = manifest(workdir)
    res = run_cli("run", "--config", config, "--workdir", workdir)
    assert res.returncode == 0, res.stdout + res.stderr
    assert states(res.stdout) == dict.fromkeys(STEPS, "cached")
    after = manifest(workdir)
    assert after["last_run"]["states"] == dict.fromkeys(STEPS, "cached")
    assert {s: after["steps"][s]["fingerprint"] for s in STEPS} == {s: before["steps"][s]["fingerprint"] for s in STEPS}
    assert [v for v in os.listdir(os.path.join(workdir, "export", "models", "penguins")) if v.isdigit()] == ["1"]


@pytest.mark.long
def test_batching_tune_reruns_serve_onwards_and_serves_the_tuned_config(run_copy, config):
    """[serve] batching = "tune": the serve step runs tfpipe tune on the exported model (here one
    trial, the start) and serves with its batching.config; the report shows the trials."""
    workdir = run_copy
    res = run_cli("run", "--config", config, "--workdir", workdir, "--set", "serve.batching=tune",
                  "--set", "tune.trials=1", "--set", 'tune.levels="2"', "--set", 'tune.duration="0.5s"',
                  "--set", 'tune.warmup="0.2s"', "--set", 'tune.slo="p99<2000ms"')
    assert res.returncode == 0, res.stdout + res.stderr
    assert states(res.stdout) == {**dict.fromkeys(STEPS[:3], "cached"), **dict.fromkeys(STEPS[3:], "done")}
    assert "batching tuned: max_batch_size=32 batch_timeout_micros=0" in res.stdout, res.stdout
    tuned = load(os.path.join(workdir, "tune", "tune.json"))
    assert len(tuned["trials"]) == 1 and tuned["trials"][0]["score_rps"] > 0
    serve = load(os.path.join(workdir, "serve", "serve.json"))
    assert serve["tune"] == os.path.join(workdir, "tune", "tune.json")
    assert "--enable_batching=true" in serve["tensorflow_model_server"]
    assert (open(os.path.join(workdir, "serve", "batching.config")).read()
            == open(os.path.join(workdir, "tune", "batching.config")).read())
    report = open(os.path.join(workdir, "report.html")).read()
    assert "Batching tuned by measurement" in report


@pytest.mark.long
def test_a_new_learning_rate_reruns_train_onwards_and_a_killed_run_resumes(run_copy, config):
    workdir = run_copy
    data_sha = manifest(workdir)["steps"]["data"]["outputs"]["sha256"]
    # Version 2 is a second day: judged offline against version 1, served beside it and load-tested
    # in one short round each (loose bounds: the serving gate's own tests judge speed), then promoted.
    args = ["run", "--config", config, "--workdir", workdir, "--set", "train.learning_rate=0.003",
            "--set", "rollout.rounds=1", "--set", "rollout.duration=1s", "--set", "rollout.max_p99_rise=3",
            "--set", "rollout.max_cpu_rise=3"]

    # Start the changed run and kill it hard once training has backed up two epochs.
    proc = spawn_cli(*args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        if backup_epoch(os.path.join(workdir, "train")) >= 2:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be killed during training"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    printed = []
    while not lines.empty():
        printed.append(lines.get())
    printed = "".join(printed)
    assert "data     cached" in printed and "train    running  ([train] config changed)" in printed, printed
    killed = manifest(workdir)
    assert killed["steps"]["train"]["status"] == "running"  # what a killed run leaves behind

    res = run_cli(*args, timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "resuming: the last run stopped at train" in res.stdout
    assert states(res.stdout) == {"data": "cached", **dict.fromkeys(STEPS[1:], "done")}
    m = manifest(workdir)
    assert m["steps"]["data"]["outputs"]["sha256"] == data_sha
    train = load(os.path.join(workdir, "train", "train.json"))
    assert train["config"]["learning_rate"] == 0.003
    assert train["resumed_from_epoch"] >= 2
    assert "resuming from the backup of epoch" in open(os.path.join(workdir, "logs", "train.log")).read()
    export = load(os.path.join(workdir, "export", "models", "penguins", "2", "assets.extra", "export.json"))
    assert export["lineage"]["train_fingerprint"] == train["fingerprint"] and export["decision"] == "passed"
    served = load(os.path.join(workdir, "serve", "serve.json"))
    assert served["version"] == 1 and served["candidate"]["version"] == 2  # side by side for the gate
    # ...and out of the generated models.config once judged: version 2 is in the served range now
    config = open(os.path.join(workdir, "serve", "models.config")).read()
    assert 'name: "penguins"' in config and "penguins-candidate" not in config
    assert served["candidate"]["check"]["rows"] > 0  # the candidate's REST and gRPC answers were checked too
    rollout = load(os.path.join(workdir, "rollout", "rollout.json"))
    assert rollout["decision"] == "promoted" and rollout["served"] == 2, rollout
    for arm in ("served", "new"):
        (measured,) = rollout["serving"]["rounds"][arm]
        assert measured["requests"] > 0 and measured["cpu_us"] > 0
    (shadowed,) = rollout["serving"]["shadow"]["records"]  # version 1's requests mirrored to version 2
    assert shadowed["mirrored"] > 0 and shadowed["summary"]["class_rows"] > 0, shadowed
    assert "version 2 PROMOTED" in res.stdout
    model = os.path.join(workdir, "export", "models", "penguins")
    assert [e["event"] for e in versions.history(model)] == ["published", "passed offline", "promoted"]
    assert versions.served(model) == 2
    # The promotion moved version 2's folder out of candidates/: the run's records still hold, and the
    # same command again is all cached (it exported a third version when they pointed at the old folder).
    again = run_cli(*args, timeout=120)
    assert again.returncode == 0 and set(states(again.stdout).values()) == {"cached"}, again.stdout
    shown = run_cli("show", "--workdir", workdir)
    assert f"lineage: model penguins version 2 ({os.path.join(model, '2')}), served" in shown.stdout, shown.stdout
    assert "changed or removed since" not in shown.stdout


def test_a_failing_step_says_where_and_points_at_its_log(tmp_path, config):
    workdir = str(tmp_path / "w")
    res = run_cli("run", "--config", config, "--workdir", workdir, "--input", str(tmp_path / "missing.csv"))
    assert res.returncode == 2, res.stdout + res.stderr
    assert states(res.stdout) == {"data": "failed"}
    assert "missing.csv" in res.stdout and f"log: {workdir}/logs/data.log" in res.stdout
    assert "run the same command again to resume" in res.stdout
    entry = manifest(workdir)["steps"]["data"]
    assert entry["status"] == "failed" and "missing.csv" in entry["error"]
    assert "missing.csv" in open(os.path.join(workdir, "logs", "data.log")).read()


@pytest.mark.parametrize("args, message", [
    (["--set", "train.learning_rat=0.1"], "unknown key 'train.learning_rat' (did you mean 'learning_rate'?)"),
    (["--set", "train.epochs=-1"], "'train.epochs': Input should be greater than or equal to 1"),
    (["--set", "nonsense"], "use SECTION.KEY=VALUE"),
    (["--only", "export"], "--only export needs the output of data, train: run without --only first"),
])
def test_bad_options_exit_2_with_one_line(tmp_path, config, args, message):
    res = run_cli("run", "--config", config, "--workdir", str(tmp_path / "w"), *args)
    assert res.returncode == 2, res.stdout + res.stderr
    assert message in res.stderr


def test_chicago_taxi_config_reads_the_shipped_sample(tmp_path, chicago_csv):
    """The example config as a clone has it: its input is the sample shipped in examples/data/."""
    workdir = str(tmp_path / "taxi")
    res = run_cli("run", "--config", os.path.join(ROOT, "examples", "chicago_taxi.toml"),
                  "--workdir", workdir, "--only", "data")
    assert res.returncode == 0, res.stdout + res.stderr
    assert states(res.stdout) == {"data": "done"}
    schema = load(os.path.join(workdir, "data", "schema.json"))
    assert schema["label"]["name"] == "big_tipper"
    assert "tips" not in [f["name"] for f in schema["features"]]
    counts = load(os.path.join(workdir, "data", "data.json"))["counts"]
    with open(chicago_csv) as f:
        assert counts["read"] == sum(1 for _ in csv.DictReader(f))


@pytest.mark.parametrize("codes, want", [
    ({}, ""),
    ({"loadtest": 1}, "; the load test MISSED its SLO"),
    ({"loadtest": 1, "skew": 1}, "; the load test MISSED its SLO; the served traffic is SKEWED from the training data"),
    ({"loadtest": 0, "skew": 1}, "; the served traffic is SKEWED from the training data"),
])
def test_the_run_names_the_gates_that_failed(codes, want):
    """From each step's recorded exit code (a cached step keeps its own), not from its stage's manifest."""
    from types import SimpleNamespace

    from tfpipe.run import _misses

    run = SimpleNamespace(manifest={"steps": {name: {"status": "done", "code": c} for name, c in codes.items()}})
    assert _misses(run) == want


def test_each_steps_stored_outputs_are_what_its_stage_reads_from_its_own_files(first_run):
    """The run manifest keeps each step's typed outputs as JSON; rebuilt (as a later run whose earlier
    steps are cached does), they equal what the stage's own reader gives from its files now."""
    from tfpipe.export.job import result as export_result
    from tfpipe.loadtest.job import result as loadtest_result
    from tfpipe.pipeline.outputs import result as data_result
    from tfpipe.rollout.job import result as rollout_result
    from tfpipe.serve.deploy import result as serve_result
    from tfpipe.skew.job import result as skew_result
    from tfpipe.stage import ServeOutputs
    from tfpipe.steps import BY_NAME
    from tfpipe.train.job import result as train_result

    workdir = first_run[0]
    steps = manifest(workdir)["steps"]
    at = lambda *parts: os.path.join(workdir, *parts)  # noqa: E731
    served = serve_result(at("serve"), "rows")
    assert served.summary.startswith("penguins version 1 on the embedded server: REST and gRPC answers match the "
                                     "SavedModel on 16 rows (max diff "), served.summary
    assert served.outputs == ServeOutputs(at("serve")) and served.manifest == at("serve", "serve.json")
    now = {"data": data_result(at("data")), "train": train_result(at("train")),
           "export": export_result(at("export", "models", "penguins", "1")), "serve": served,
           "loadtest": loadtest_result(at("loadtest")), "skew": skew_result(at("skew")),
           "rollout": rollout_result(at("rollout"))}
    assert list(now) == STEPS
    # the export step keeps its version's export.json where it stays (the version's folder moves when
    # it is promoted or rolled back): the same bytes
    kept = at("export", "export.json")
    assert open(kept, "rb").read() == open(now["export"].manifest, "rb").read()
    now["export"] = dataclasses.replace(now["export"], manifest=kept)
    for name, r in now.items():
        stored = steps[name]
        assert BY_NAME[name].outputs.from_json(stored["outputs"]) == r.outputs, name
        assert (stored["outputs"]["manifest"], stored["summary"], stored["code"]) == (r.manifest, r.summary, r.code)


def test_the_registry_runs_each_step_after_the_steps_it_reads():
    from tfpipe.steps import REGISTRY, STEPS as registered

    assert list(registered) == STEPS
    for i, step in enumerate(REGISTRY):
        assert set(step.needs) <= set(registered[:i]), step.name
    # only the data step reads files outside the workdir; every later one reads earlier steps' outputs
    assert [s.name for s in REGISTRY if s.sources] == ["data"] and all(s.needs for s in REGISTRY[1:])


@pytest.mark.parametrize("kind, stored, want", [
    ("ExportOutputs", {"path": "/m/p/1", "name": "p", "version": 1, "manifest": "x", "sha256": "y"},
     ("/m/p/1", "p", 1, None, "published")),  # stored before exports had a gate: the defaults
    ("ExportOutputs", {"path": "/m/p/1", "name": "p", "version": 1, "candidate": 2, "decision": "held"},
     ("/m/p/1", "p", 1, 2, "held")),
    ("SkewOutputs", {"path": "/s", "passed": None}, ("/s", None)),
    ("ExportOutputs", {"path": "/m/p/1", "name": "p"}, KeyError("ExportOutputs: the stored outputs lack version")),
    ("DataOutputs", {"manifest": "x"}, KeyError("DataOutputs: the stored outputs lack path, fingerprint")),
])
def test_stored_outputs_rebuild_into_their_type_or_say_what_is_missing(kind, stored, want):
    import dataclasses

    from tfpipe import stage

    cls = getattr(stage, kind)
    if isinstance(want, KeyError):
        with pytest.raises(KeyError) as e:
            cls.from_json(stored)
        assert e.value.args == want.args
    else:
        assert dataclasses.astuple(cls.from_json(stored)) == want
