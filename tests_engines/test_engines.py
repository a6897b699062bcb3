"""`tfpipe data` on Apache Flink and Apache Spark, through Beam's job servers built by
engines/setup.sh, against FnApiRunner in the main environment: the same records per split, the
same dead-letter rows, schema.json and stats.json byte for byte, the same counts; with at least 4
work units at parallelism 2, and after a work unit failed once and was retried."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys

import grpc
import pytest

from conftest import IMAGE_ARGS, REFERENCE, TAXI_ARGS, assert_same_output, tfpipe_data

FLINK = ["--runner", "FlinkRunner", "--flink_master=[local]", "--parallelism=2"]
SPARK = ["--runner", "SparkRunner", "--spark_master_url=local[2]"]


@pytest.mark.parametrize("engine", [FLINK, SPARK], ids=["flink", "spark"])
def test_taxi_rows_on_an_engine_match_fnapirunner(engine, inputs, tmp_path):
    out = tmp_path / "data"
    res = tfpipe_data("--input", os.path.join(inputs, "taxi.csv"), *TAXI_ARGS, "--out", str(out), *engine)
    manifest = assert_same_output(str(out), os.path.join(REFERENCE, "taxi"))
    assert manifest["beam"]["runner"] == engine[1] and manifest["beam"]["workers"] == 2
    assert "4 work unit(s)" in res.stdout and "2 workers" in res.stdout


def test_images_on_flink_match_fnapirunner(inputs, tmp_path):
    out = tmp_path / "images"
    tfpipe_data("--input", os.path.join(inputs, "images"), *IMAGE_ARGS, "--out", str(out), *FLINK)
    manifest = assert_same_output(str(out), os.path.join(REFERENCE, "images"))
    assert manifest["kind"] == "images" and manifest["counts"]["bad"] > 0


@pytest.mark.parametrize("engine", ["spark", "flink"])
def test_a_unit_that_fails_once_is_retried_and_the_output_is_exact(engine, inputs, tmp_path):
    """Work unit 2 fails after writing part of its files, on its first attempt only; the engine
    retries it (Spark's task, Flink's job) and the output is the reference's, record for record."""
    marker = tmp_path / "failed-once"
    out = tmp_path / "data"
    env = {"TFPIPE_TEST_FAIL_ONCE": f"2:{marker}"}
    if engine == "spark":
        options = ["--runner", "SparkRunner", "--spark_master_url=local[2,3]"]  # a task tried up to 3 times
    else:
        # Flink's restart strategy from its own configuration, which the job server reads from
        # FLINK_CONF_DIR (Beam's number_of_execution_retries never reaches it from Python)
        conf = tmp_path / "flink-conf"
        conf.mkdir()
        (conf / "flink-conf.yaml").write_text("restart-strategy.type: fixed-delay\n"
                                              "restart-strategy.fixed-delay.attempts: 2\n"
                                              "restart-strategy.fixed-delay.delay: 0 s\n")
        options, env["FLINK_CONF_DIR"] = FLINK, str(conf)
    tfpipe_data("--input", os.path.join(inputs, "taxi.csv"), *TAXI_ARGS, "--out", str(out), *options, env=env)
    assert marker.exists(), "work unit 2 never failed: the retry was not tested"
    assert_same_output(str(out), os.path.join(REFERENCE, "taxi"))


def test_a_failed_unit_without_retries_fails_the_job_in_one_line(inputs, tmp_path):
    """Flink with no restart strategy (its default here): the same failure ends the job, in one
    line with the worker's own error, and nothing is published."""
    out = tmp_path / "data"
    res = subprocess.run([sys.executable, "-m", "tfpipe.cli", "data", "--input", os.path.join(inputs, "taxi.csv"),
                          *TAXI_ARGS, "--out", str(out), *FLINK], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "TFPIPE_TEST_FAIL_ONCE": f"1:{tmp_path / 'marker'}"})
    assert res.returncode == 2, res.stderr[-2000:]
    errors = [line for line in res.stderr.splitlines() if line.startswith("tfpipe data:")]
    assert len(errors) == 1 and errors[0].startswith("tfpipe data: error: the job failed on FlinkRunner (FAILED): "
                                                     "RuntimeError: TFPIPE_TEST_FAIL_ONCE: work unit 1 fails"), errors
    assert not out.exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_external_worker_pool_serves_the_flink_job(inputs, tmp_path):
    """Beam's Python worker pool as a process of its own, as a cluster's task managers would
    reach it: it starts `python` from PATH for each worker, so this environment's comes first."""
    port = _free_port()
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    pool = subprocess.Popen([sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main",
                             f"--service_port={port}"], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "pool.log", "wb"))
    try:
        with grpc.insecure_channel(f"localhost:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=60)  # the pool answers
        out = tmp_path / "data"
        tfpipe_data("--input", os.path.join(inputs, "taxi.csv"), *TAXI_ARGS, "--out", str(out), *FLINK,
                    "--environment_type=EXTERNAL", f"--environment_config=localhost:{port}")
        assert_same_output(str(out), os.path.join(REFERENCE, "taxi"))
    finally:
        pool.terminate()
        pool.wait(timeout=60)


def _run_config(path, inputs: str, workdir, runner: list[str]) -> None:
    name, *options = runner[1:]  # "FlinkRunner", then its own options
    quoted = ", ".join(f'"{o}"' for o in options)
    path.write_text(f'[run]\nworkdir = "{workdir}"\n\n[data]\ninput = ["{os.path.join(inputs, "taxi.csv")}"]\n'
                    f'label = "big_tipper"\nexclude = ["tips"]\nshards = 4\nrunner = "{name}"\n'
                    f'environment = "{sys.prefix}"\nbeam_args = [{quoted}]\n')


def test_tfpipe_run_takes_its_data_step_to_this_environment_and_caches_it_by_the_data(inputs, tmp_path):
    """`tfpipe run` in the main environment (TensorFlow, Beam 2.77) with `[data] runner` and
    `[data] environment` (this one: Beam 2.62): the data step runs on Flink here; the same data
    on Spark is the same step, cached."""
    main_tfpipe = os.environ["TFPIPE_MAIN_TFPIPE"]
    workdir = tmp_path / "run"
    flink, spark = tmp_path / "flink.toml", tmp_path / "spark.toml"
    _run_config(flink, inputs, workdir, FLINK)
    _run_config(spark, inputs, workdir, SPARK)
    first = subprocess.run([main_tfpipe, "run", "--config", str(flink), "--only", "data"], capture_output=True,
                           text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    manifest = assert_same_output(str(workdir / "data"), os.path.join(REFERENCE, "taxi"))
    assert manifest["beam"]["runner"] == "FlinkRunner" and manifest["beam"]["version"] == "2.62.0"
    again = subprocess.run([main_tfpipe, "run", "--config", str(spark), "--only", "data"], capture_output=True,
                           text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert re.search(r"data\s+cached", again.stdout), again.stdout


def test_process_workers_without_tfpipe_get_its_data_code_staged_with_the_job(inputs, tmp_path):
    """PROCESS workers, as a cluster's would be: Beam's boot program (built from Beam's Go module)
    in an environment with Beam and no tfpipe; the job stages tfpipe's data code as a wheel
    (`--extra_package`, engines/worker_wheel.py) and the boot program installs it, offline."""
    worker_env = os.environ["TFPIPE_ENGINE_WORKER_ENV"]
    python = os.path.join(worker_env, "bin", "python")
    probe = [python, "-c", "import tfpipe.pipeline.transforms"]
    assert subprocess.run(probe, cwd=tmp_path, capture_output=True).returncode != 0, "the workers have tfpipe already"
    config = json.dumps({"command": os.environ["TFPIPE_ENGINE_BOOT"],
                         "env": {"PATH": os.path.join(worker_env, "bin") + os.pathsep + "/usr/bin:/bin",
                                 # the boot program's pip installs into this environment, not a new one
                                 "RUN_PYTHON_SDK_IN_DEFAULT_ENVIRONMENT": "1"}})
    out = tmp_path / "data"
    # One worker process: with RUN_PYTHON_SDK_IN_DEFAULT_ENVIRONMENT every worker's boot program
    # pip-installs the staged wheel into the same environment, two of them at the same time
    tfpipe_data("--input", os.path.join(inputs, "taxi.csv"), *TAXI_ARGS, "--out", str(out), *FLINK,
                "--sdk_worker_parallelism=1", "--environment_type=PROCESS", f"--environment_config={config}",
                f"--extra_package={os.environ['TFPIPE_ENGINE_WORKER_WHEEL']}",
                cwd=str(tmp_path))  # the workers start in the job server's folder: not the repository's
    assert_same_output(str(out), os.path.join(REFERENCE, "taxi"))
    assert subprocess.run(probe, cwd=tmp_path, capture_output=True).returncode == 0  # installed by the boot program
