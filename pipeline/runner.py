"""How a Beam stage (data, predict) runs: Beam's options and runner (local, Flink, Spark, with the
job-server jars engines/setup.sh makes), the stage in another Python environment (`[data]
environment`), the pipeline run into a temporary output directory, a runner's failure in one
line, and the progress lines while it runs. outputs.py reads back what it wrote."""

from __future__ import annotations

import argparse
import collections
import contextlib
import logging
import os
import re
import subprocess
import sys
import threading
import time
from typing import Callable, TypeVar

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from tfpipe.children import module_argv
from tfpipe.machine import cores
from tfpipe.pipeline.errors import DataError, RunnerError, find_data_error
from tfpipe.pipeline.inputs import is_remote
from tfpipe.pipeline.outputs import match, remove, temp_output_dir


T = TypeVar("T")


LOCAL_RUNNERS = {"FnApiRunner", "DirectRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner"}


# Beam's in-process runner by its class path: Beam 2.62 does not know the short name.
FN_API_RUNNER = "apache_beam.runners.portability.fn_api_runner.FnApiRunner"


# Runners that start one of Beam's Java job servers from a jar, and the option that names it.
JOB_SERVER_JARS = {"FlinkRunner": ("flink", "flink_job_server_jar"), "SparkRunner": ("spark", "spark_job_server_jar")}


def runner_name(runner: str) -> str:
    """A runner's short name, whether given as one or as a class path."""
    return runner.rsplit(".", 1)[-1]


def jars_dir() -> str:
    """Where engines/setup.sh leaves the job server jars: $TFPIPE_ENGINE_JARS, else tfpipe's cache."""
    given = os.environ.get("TFPIPE_ENGINE_JARS")
    if given:
        return given
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "tfpipe", "jars")


def job_server_jar(engine: str, beam_version: str | None = None) -> str:
    """The path of the job server jar engines/setup.sh builds for `engine` and this Beam release."""
    return os.path.join(jars_dir(), f"beam-{engine}-job-server-{beam_version or beam.__version__}.jar")


def _option_classes(cls=PipelineOptions):
    for sub in cls.__subclasses__():
        yield sub
        yield from _option_classes(sub)


def check_beam_args(args: list[str]) -> None:
    """Reject arguments that are not Beam pipeline options, so a typo is not silently dropped."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for cls in set(_option_classes()):
        try:
            cls._add_argparse_args(parser)
        except argparse.ArgumentError:
            pass  # an option registered by two classes
    _, unknown = parser.parse_known_args(args)
    flags = [a for a in unknown if a.startswith("-")]
    if flags:
        raise DataError(f"unknown option {flags[0]}: not a `tfpipe data` option nor an Apache Beam pipeline option")


def _engine_workers(name: str, given: dict) -> int | None:
    """How many workers a Flink or Spark run has, as its own options say (None: the engine decides)."""
    if name == "FlinkRunner" and given.get("parallelism"):
        return int(given["parallelism"])
    if name == "SparkRunner":
        master = str(given.get("spark_master_url") or "local[4]")  # Beam's default master
        found = re.fullmatch(r"local\[(\d+)(?:,\s*\d+)?\]", master)
        if found:
            return int(found.group(1))
    if given.get("parallelism"):
        return int(given["parallelism"])
    return None


def beam_options(args: list[str], input_bytes: int, runner: str | None = None) -> tuple[PipelineOptions, str, int]:
    """Pipeline options with tfpipe's local defaults; returns (options, runner, workers).

    `runner` is the `[data] runner` setting; a --runner among `args` wins over it. FnApiRunner,
    by that name or its class path, becomes its class path. Flink and Spark get the job server
    jar engines/setup.sh built unless the options name one or a running job service."""
    given = PipelineOptions(args).get_all_options(drop_default=True)
    runner = given.get("runner") or runner or "FnApiRunner"
    name = runner_name(runner)
    check_beam_args(args)
    args = _without_runner(args) + [f"--runner={FN_API_RUNNER if name == 'FnApiRunner' else runner}"]
    extra = []
    workers = given.get("direct_num_workers") or 1
    if name in LOCAL_RUNNERS and "direct_num_workers" not in given and input_bytes > 16 << 20:
        workers = cores()
        if workers > 1:
            extra += [f"--direct_num_workers={workers}", "--direct_running_mode=multi_processing"]
    elif name not in LOCAL_RUNNERS:
        workers = _engine_workers(name, given) or 1
        if workers > 1 and "sdk_worker_parallelism" not in given:
            # one Python worker per task slot: Beam's default is one per task manager, shared by all
            # its slots (with EXTERNAL or PROCESS workers, one process where N were asked for)
            extra.append(f"--sdk_worker_parallelism={workers}")
    if name in JOB_SERVER_JARS:
        engine, option = JOB_SERVER_JARS[name]
        if not given.get(option) and not given.get("job_endpoint"):
            jar = job_server_jar(engine)
            if not os.path.exists(jar):
                raise DataError(f"{name} needs Beam's {engine.capitalize()} job server for Beam {beam.__version__} "
                                f"({jar} does not exist): engines/setup.sh builds it for the engine environment's "
                                f"Beam, which --environment .venv-engines runs the data stage in "
                                f"(docs/scaling-out.md); or pass --{option}=PATH")
            extra.append(f"--{option}={jar}")
    if "default_sdk_harness_log_level" not in given:
        # WARN, not WARNING: Beam's Java job servers take only DEBUG, TRACE, WARN, ERROR, INFO, OFF.
        extra.append("--default_sdk_harness_log_level=WARN")
    return PipelineOptions(args + extra), name, workers


def _without_runner(args: list[str]) -> list[str]:
    """The options without --runner, given as --runner=X or as --runner X."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a == "--runner":
            skip = True
        elif not a.startswith("--runner="):
            out.append(a)
    return out


def in_environment(environment: str) -> bool:
    """Whether this process runs in the Python environment (virtualenv folder) `environment`."""
    return os.path.realpath(sys.prefix) == os.path.realpath(environment)


def run_in_environment(config, log: Callable[[str], None], stage: str = "data",
                       error: type[Exception] = DataError) -> str:
    """Run a Beam stage (`tfpipe data`, `tfpipe predict`) in the Python environment
    `config.environment` names, as a process of its own (`python -m tfpipe.STAGE_MODULE`, the
    config as JSON on its stdin), its lines passed on to `log`; its user error comes back as the
    same one line, raised as `error`. Returns the output directory."""
    python = os.path.join(config.environment, "bin", "python")
    if not os.path.exists(python):
        raise error(f"environment {config.environment}: no {python} (engines/setup.sh makes one)")
    payload = config.model_copy(update={"environment": None}).model_dump_json(by_alias=True)
    proc = subprocess.Popen(module_argv(STAGE_MODULES[stage], python=python), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        errors: list[str] = []
        drain = threading.Thread(target=lambda: errors.extend(proc.stderr), daemon=True)
        drain.start()
        proc.stdin.write(payload)
        proc.stdin.close()
        for line in proc.stdout:
            log(line.rstrip("\n"))
        code = proc.wait()
        drain.join()
    finally:
        if proc.poll() is None:  # interrupted: the child's own handler removes its temporary output
            proc.terminate()
            proc.wait()
    said = [e.rstrip("\n") for e in errors if e.strip()]
    prefix = environment_error(stage)
    if code == 2 and said and said[-1].startswith(prefix):
        raise error(said[-1][len(prefix):])
    missing = [m.group(1) for m in map(re.compile(r"ModuleNotFoundError: No module named '([^']+)'").search, said) if m]
    if code != 0 and missing:  # another virtualenv: not one engines/setup.sh made
        raise error(f"environment {config.environment}: Python there has no module '{missing[-1]}': make the "
                    f"environment with bash engines/setup.sh{' --predict' if stage == 'predict' else ''} "
                    f"{config.environment} (it installs tfpipe there too)")
    if code != 0:
        raise RuntimeError(f"the {stage} stage in {config.environment} exited with {code}: " + "\n".join(said[-20:]))
    return config.out if is_remote(config.out) else os.path.abspath(config.out)


# the module each Beam stage runs as in another environment (its `environment_main`)
STAGE_MODULES = {"data": "tfpipe.pipeline.job", "predict": "tfpipe.predict.job"}


def environment_error(stage: str) -> str:
    return f"tfpipe {stage}: error: "


def environment_main(stage: str, config_type, run: Callable) -> int:
    """A Beam stage run for another process (`run_in_environment`): its config as JSON on stdin,
    its lines on stdout, a user error as one line on stderr and exit code 2."""
    import json
    import signal

    from tfpipe import UserError

    config = config_type.model_validate(json.loads(sys.stdin.read()))
    logging.getLogger("apache_beam").setLevel(logging.CRITICAL)  # errors come back as the line below

    def interrupted(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    try:
        run(config, log=lambda line: print(line, flush=True))
    except UserError as e:
        print(f"{environment_error(stage)}{e}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


def run_to_temp(out: str, options: PipelineOptions, units: int, build: Callable[[beam.Pipeline, str], None],
                finish: Callable[[str], T], log: Callable[[str], None], watch=None) -> T:
    """Run the pipeline `build(p, tmp)` lays out, writing into a temporary sibling of `out`, then
    `finish(tmp)` (reconcile and publish). The temporary directory goes whatever fails or is
    interrupted; a user error raised inside a Beam worker comes back as the DataError it was.
    `watch(tmp)`: the context that reports progress while it runs (default: work units done)."""
    tmp = temp_output_dir(out)
    runner = runner_name(str(options.get_all_options()["runner"]))  # before the runner can change the options
    try:
        with (watch or (lambda t: progress(t, units, log)))(tmp), job_server_log() as server_lines:
            try:
                with beam.Pipeline(options=options) as p:
                    build(p, tmp)
            except Exception as e:
                user_error = find_data_error(e) or runner_error(e, runner, list(server_lines))
                if user_error:
                    raise user_error from None
                raise
        return finish(tmp)
    except BaseException:
        remove(tmp)
        raise


@contextlib.contextmanager
def job_server_log():
    """The last lines a Java job server started by Beam printed (Beam logs them at INFO, which the
    CLI hides), for the error line when the job service refuses a job without saying why."""
    lines: collections.deque[str] = collections.deque(maxlen=400)
    logger = logging.getLogger("apache_beam.utils.subprocess_server")

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler, level, propagate = Keep(logging.INFO), logger.level, logger.propagate
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
        logger.propagate = False  # kept for the error line, not printed
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def runner_error(exc: BaseException, runner: str, server_log: list[str] = ()) -> RunnerError | None:
    """A failure the runner reported (a job service's gRPC error, a job that ended FAILED, a job
    server that did not start) as one line naming the runner, with the job server's own reason
    when its log has one; None for anything else, which is tfpipe's own bug and keeps its traceback."""
    import grpc

    text = str(exc)
    if isinstance(exc, grpc.RpcError) and hasattr(exc, "code"):
        details = (exc.details() or "").strip().splitlines()
        java = [l.strip() for l in server_log if "Exception" in l or "Error" in l]
        said = (details[0] if details else _cause(java) if java
                else "no details; the job server's log says why (rerun with --debug)")
        return RunnerError(f"the {runner} job service refused the job ({exc.code().name}): {said}")
    failed = re.search(r"Pipeline \S+ failed in state (\w+): (.*)", text, re.S)
    if failed:
        lines = [l.strip() for l in failed.group(2).splitlines() if l.strip()]
        return RunnerError(f"the job failed on {runner} ({failed.group(1)}): "
                           + (_cause(lines) if lines else "no message; rerun with --debug"))
    if runner not in LOCAL_RUNNERS and re.search(r"Service failed to start|Job server|job server", text):
        return RunnerError(f"{runner}'s job server did not start: {text.strip().splitlines()[0]}")
    return None


def _cause(lines: list[str]) -> str:
    """The most telling line of a Java or Python failure: a Python traceback's exception (the
    worker's own error, which the engine wraps), else the last 'Caused by', else the first line."""
    if any(l.startswith("Traceback") for l in lines):
        raised = [l for l in lines if re.match(r"^[\w.]*(Error|Exception|Interrupt)\b.*:", l)]
        if raised:
            return raised[-1][:400]
    causes = [l for l in lines if l.startswith("Caused by:")]
    return (causes[-1][len("Caused by:"):].strip() if causes else lines[0])[:400]


class progress:
    """Prints a line as work units finish, from the summary files they leave."""

    def __init__(self, tmp: str, total: int, log):
        self.tmp, self.total, self.log = tmp, total, log
        self._stop = threading.Event()

    def __enter__(self):
        self.started = time.time()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        done = 0
        while not self._stop.wait(1.0):
            now = len(match(FileSystems.join(self.tmp, "_units", "*.json")))
            if now != done and now < self.total:
                done = now
                self.log(f"  {done}/{self.total} work units done ({time.time() - self.started:.0f} s)")

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.log(f"  pipeline finished in {time.time() - self.started:.1f} s")
        return False
