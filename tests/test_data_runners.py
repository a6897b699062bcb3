"""How `tfpipe data` names and starts Beam runners, and what a user sees when a runner refuses a
job. The engines themselves (Flink, Spark) run in tests_engines/, in their own environment."""

from __future__ import annotations

import json
import os
from concurrent import futures

import grpc
import pytest

from conftest import run_cli

FN_API = "apache_beam.runners.portability.fn_api_runner.FnApiRunner"


@pytest.mark.parametrize("args, runner, want_runner, want_name, want_workers", [
    ([], None, FN_API, "FnApiRunner", 1),                                  # the default, by class path
    (["--runner=FnApiRunner"], None, FN_API, "FnApiRunner", 1),            # a short name Beam 2.62 lacks
    (["--runner", "FnApiRunner"], None, FN_API, "FnApiRunner", 1),
    ([], "FnApiRunner", FN_API, "FnApiRunner", 1),                         # [data] runner
    (["--runner=BundleBasedDirectRunner"], "FnApiRunner", "BundleBasedDirectRunner", "BundleBasedDirectRunner", 1),
    (["--runner=FlinkRunner", "--flink_master=[local]", "--parallelism=2"], None, "FlinkRunner", "FlinkRunner", 2),
    (["--flink_master=[local]", "--parallelism=3"], "FlinkRunner", "FlinkRunner", "FlinkRunner", 3),
    (["--spark_master_url=local[2]"], "SparkRunner", "SparkRunner", "SparkRunner", 2),
    (["--spark_master_url=local[2,3]"], "SparkRunner", "SparkRunner", "SparkRunner", 2),  # task retries
    (["--runner=PortableRunner", "--parallelism=2", "--job_endpoint=localhost:1"], None, "PortableRunner",
     "PortableRunner", 2),
])
def test_runner_options(args, runner, want_runner, want_name, want_workers, tmp_path, monkeypatch):
    from tfpipe.pipeline.runner import beam_options

    monkeypatch.setenv("TFPIPE_ENGINE_JARS", str(tmp_path))
    for engine in ("flink", "spark"):
        import apache_beam

        (tmp_path / f"beam-{engine}-job-server-{apache_beam.__version__}.jar").write_bytes(b"")
    options, name, workers = beam_options(args, input_bytes=1000, runner=runner)
    got = options.get_all_options()
    assert (got["runner"], name, workers) == (want_runner, want_name, want_workers)
    # Beam's Java job servers take WARN, not WARNING, and the Python SDK takes both.
    assert got["default_sdk_harness_log_level"] == "WARN"
    if name in ("FlinkRunner", "SparkRunner", "PortableRunner"):  # a Python worker per slot, not one for all
        assert int(got["sdk_worker_parallelism"]) == want_workers
    if name == "FlinkRunner":
        assert got["flink_job_server_jar"].endswith(f"beam-flink-job-server-{apache_beam.__version__}.jar")
    if name == "SparkRunner":
        assert got["spark_job_server_jar"].startswith(str(tmp_path))


def test_a_job_server_jar_given_is_kept_and_a_missing_one_says_how_to_build_it(tmp_path, monkeypatch):
    from tfpipe.pipeline.errors import DataError
    from tfpipe.pipeline.runner import beam_options

    monkeypatch.setenv("TFPIPE_ENGINE_JARS", str(tmp_path / "none"))
    with pytest.raises(DataError, match=r"SparkRunner needs Beam.s Spark job server .* engines/setup.sh builds it "
                                        r".* --environment"):
        beam_options(["--runner=SparkRunner"], input_bytes=1000)
    options, _, _ = beam_options(["--runner=FlinkRunner", "--flink_job_server_jar=/opt/mine.jar"], 1000)
    assert options.get_all_options()["flink_job_server_jar"] == "/opt/mine.jar"
    options, _, _ = beam_options(["--runner=FlinkRunner", "--job_endpoint=localhost:8099"], 1000)
    assert not options.get_all_options().get("flink_job_server_jar")  # a running job service needs no jar


def test_the_runner_is_not_part_of_the_data_fingerprint():
    from tfpipe.pipeline.config import DataConfig

    local = DataConfig(input=["a.csv"], label="y")
    flink = DataConfig(input=["a.csv"], label="y", runner="FlinkRunner",
                       beam_args=["--flink_master=[local]", "--parallelism=2"])
    assert local.fingerprint_fields() == flink.fingerprint_fields()


def _refusing_job_service(details: str):
    """A job service, as Beam's Java job servers answer a job they cannot parse: Prepare fails
    with INTERNAL and the details the test gives (the Java side's are empty)."""
    from apache_beam.portability.api import beam_job_api_pb2_grpc

    class Refusing(beam_job_api_pb2_grpc.JobServiceServicer):
        def DescribePipelineOptions(self, request, context):
            from apache_beam.portability.api import beam_job_api_pb2

            return beam_job_api_pb2.DescribePipelineOptionsResponse()

        def Prepare(self, request, context):
            context.abort(grpc.StatusCode.INTERNAL, details)

    return Refusing()


@pytest.fixture
def refusing_job_service(request):
    from apache_beam.portability.api import beam_job_api_pb2_grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    beam_job_api_pb2_grpc.add_JobServiceServicer_to_server(_refusing_job_service(request.param), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None)


@pytest.mark.parametrize("refusing_job_service, said", [
    ("", "no details; the job server's log says why (rerun with --debug)"),
    ("option --foo is not known\nat line 2", "option --foo is not known"),
], indirect=["refusing_job_service"])
def test_a_job_the_runner_refuses_is_one_line_not_an_internal_error(refusing_job_service, said, chicago_csv,
                                                                    tmp_path):
    out = tmp_path / "data"
    res = run_cli("data", "--input", chicago_csv, "--label", "big_tipper", "--exclude", "tips", "--out", str(out),
                  "--runner", "PortableRunner", f"--job_endpoint={refusing_job_service}",
                  "--environment_type=EXTERNAL", "--environment_config=127.0.0.1:1")
    assert res.returncode == 2, res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("tfpipe data:")]
    assert errors == [f"tfpipe data: error: the PortableRunner job service refused the job (INTERNAL): {said}"], \
        res.stderr
    assert "internal error" not in res.stderr and "Traceback" not in res.stderr
    assert not out.exists() and not [p for p in os.listdir(tmp_path) if p.startswith(".data.tmp")]


def test_the_config_files_runner_key_reaches_beam(chicago_csv, tmp_path):
    cfg = tmp_path / "t.toml"
    out = tmp_path / "data"
    cfg.write_text(f'[data]\ninput = ["{chicago_csv}"]\nlabel = "big_tipper"\nexclude = ["tips"]\nout = "{out}"\n'
                   'runner = "BundleBasedDirectRunner"\nshards = 2\n')
    res = run_cli("data", "--config", str(cfg))
    assert res.returncode == 0, res.stderr
    manifest = json.loads((out / "data.json").read_text())
    assert manifest["beam"]["runner"] == "BundleBasedDirectRunner" and manifest["config"]["runner"] == \
        "BundleBasedDirectRunner"


def test_a_record_after_its_units_end_stops_the_job_instead_of_truncating_the_units_files(tmp_path):
    """What the writers rely on, checked where they would be hurt: a runner that handed on a unit's
    records after its end would have WriteShards reopen (truncate) the unit's finished files."""
    from tfpipe.pipeline.transforms import SplitBatch, UnitEnd, WriteShards

    (tmp_path / "_units").mkdir()
    writer = WriteShards(str(tmp_path), {"train": 1}, {0: (0,)}, shards=1, level=6)
    writer.start_bundle()
    writer.process(SplitBatch(0, "train", {}, [b"record"]))
    writer.process(UnitEnd(0, read=1, bad=0))
    summary = json.loads((tmp_path / "_units" / "unit-00000.json").read_text())
    assert summary["splits"] == {"train": 1}
    with pytest.raises(RuntimeError, match="work unit 0: records arrived after its end"):
        writer.process(SplitBatch(0, "train", {}, [b"late"]))
    assert summary == json.loads((tmp_path / "_units" / "unit-00000.json").read_text())
