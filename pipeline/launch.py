"""What both data jobs (rows and images) do around their Beam pipeline: Beam's options and
runner, the temporary output directory and its atomic publication, the progress lines, and
reading back what the work units left (their summaries, per-split statistics, dead-letter
files) into the published JSON documents."""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from typing import Callable, TypeVar

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from tfpipe import __version__
from tfpipe.files import publish_dir, temp_dir, temp_sibling
from tfpipe.machine import cores
from tfpipe.pipeline.errors import DataError, RunnerError, find_data_error
from tfpipe.pipeline.inputs import is_remote
from tfpipe.stage import DataOutputs, StageResult

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
    proc = subprocess.Popen([python, "-m", STAGE_MODULES[stage]], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
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


def read_unit_summaries(indices: list[int], tmp: str) -> list[dict]:
    """The summary each work unit left in `_units/`; a missing one fails the job."""
    summaries = []
    for index in indices:
        path = FileSystems.join(tmp, "_units", f"unit-{index:05d}.json")
        try:
            with FileSystems.open(path) as f:
                summaries.append(json.loads(f.read()))
        except Exception:
            raise RuntimeError(f"work unit {index} finished without its summary ({path})") from None
    return summaries


def read_split_stats(tmp: str, split: str) -> dict | None:
    path = FileSystems.join(tmp, "_stats", f"{split}.json")
    if not FileSystems.exists(path):
        return None  # no row reached that split
    with FileSystems.open(path) as f:
        return json.loads(f.read())


def split_files(summaries: list[dict], splits: list[str]) -> dict[str, list[dict]]:
    """Per split, its shard files with their record and byte counts, in name order."""
    files_out: dict[str, list] = {name: [] for name in splits}
    for s in summaries:
        for fname, info in s["files"].items():
            files_out[info["split"]].append({"file": fname, "records": info["records"], "bytes": info["bytes"]})
    for name in files_out:
        files_out[name].sort(key=lambda x: x["file"])
    return files_out


def deadletter_files(tmp: str, folder: str = "deadletter") -> list[str]:
    """The JSON Lines files in `folder` of the output (`deadletter`, or `unlabelled`), relative to it."""
    return [f"{folder}/{d}" for d in sorted(os.path.basename(m.path)
                                            for m in match(FileSystems.join(tmp, folder, "*.jsonl")))]


def write_outputs(tmp: str, documents: dict[str, object]) -> None:
    """Write the JSON documents (schema, stats, data.json) and delete the pipeline's scratch files."""
    for name, content in documents.items():
        with FileSystems.create(FileSystems.join(tmp, name)) as f:
            f.write(json.dumps(content, indent=2, ensure_ascii=False).encode())
    # Scratch files of the pipeline: deleted file by file, since object stores have no folders.
    scratch = match(FileSystems.join(tmp, "_units", "*")) + match(FileSystems.join(tmp, "_stats", "*"))
    FileSystems.delete([m.path for m in scratch])
    if not is_remote(tmp):
        for folder in ("_units", "_stats"):
            shutil.rmtree(os.path.join(tmp, folder), ignore_errors=True)


def tally(summaries: list[dict], splits: list[str], rows: bool = True) -> dict:
    """The units' counts added up: read, written (per split and in all), dead-lettered and, for
    `rows` (an image always has its class folder or label), unlabelled."""
    per_split = {name: sum(s["splits"][name] for s in summaries) for name in splits}
    counts = {"read": sum(s["read"] for s in summaries), "written": sum(per_split.values()),
              "bad": sum(s["bad"] for s in summaries)}
    if rows:
        counts["unlabelled"] = sum(s.get("unlabelled", 0) for s in summaries)
    return {**counts, "splits": per_split}


def bad_fraction(counts: dict) -> float:
    """The share of bad rows among those that had a label: unlabelled rows are set aside, not bad."""
    labelled = counts["read"] - counts.get("unlabelled", 0)
    return counts["bad"] / labelled if labelled else 0.0


def check_counts(config, counts: dict, summaries: list[dict], noun: str, place: Callable[[dict], str],
                 inputs: int | None = None) -> None:
    """Every input is written, dead-lettered or set aside as unlabelled (and, when the launcher
    knows how many there are, `inputs` of them were read), and no more than --max-bad-fraction of
    the labelled ones are bad; otherwise the job fails and nothing is published. `place` names a
    bad entry in the error."""
    read, written, bad, unlabelled = counts["read"], counts["written"], counts["bad"], counts.get("unlabelled", 0)
    if read != written + bad + unlabelled or (inputs is not None and read != inputs):
        raise RuntimeError(f"{noun} accounting failed: read {read} != written {written} + bad {bad} + "
                           f"unlabelled {unlabelled}" + (f" (inputs: {inputs})" if inputs is not None else ""))
    if unlabelled and read == unlabelled:
        raise DataError(f"none of the {read} {noun} has a label (all were set aside in unlabelled/); "
                        "nothing was written")
    fraction = bad_fraction(counts)
    if fraction > config.max_bad_fraction or written == 0:
        first_bad = [b for s in summaries for b in s["first_bad"]][:5]
        reasons = "\n".join(f"  {place(b)}: {b['reason']}" for b in first_bad)
        labelled = f"{read - unlabelled} labelled {noun}" if unlabelled else f"{read} {noun}"
        raise DataError(f"{bad} of {labelled} are bad ({fraction:.2%}), over --max-bad-fraction "
                        f"{config.max_bad_fraction:g}; nothing was written. First bad {noun}:\n{reasons}")


def data_manifest(config, summaries: list[dict], counts: dict, tmp: str, started: float, *, fingerprint: str,
                  settings: dict, inputs: list[dict], runner: str, workers: int, shards: int, **extra) -> dict:
    """data.json: what was read, how, what was written and dead-lettered, and how long it took."""
    elapsed = time.time() - started
    return {
        "stage": "data",
        **extra,
        "tfpipe_version": __version__,
        "fingerprint": fingerprint,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": config.model_dump(mode="json", by_alias=True),
        "settings": settings,
        "inputs": inputs,
        "beam": {"runner": runner, "workers": workers, "args": list(config.beam_args), "version": beam.__version__},
        "shards": shards,
        "counts": counts,
        "bad_fraction": bad_fraction(counts),
        "outputs": {"schema": "schema.json", "stats": "stats.json",
                    "splits": split_files(summaries, list(config.split)), "deadletter": deadletter_files(tmp),
                    **({"unlabelled": deadletter_files(tmp, "unlabelled")} if "unlabelled" in counts else {})},
        "elapsed_s": round(elapsed, 3),
        "rows_per_s": round(counts["read"] / elapsed, 1) if elapsed > 0 else None,
    }


def read_data_manifest(out: str) -> dict | None:
    """The data.json of an earlier output at `out`, None if there is none; a directory that holds
    other files and no data.json is refused rather than replaced."""
    path = FileSystems.join(out, "data.json")
    try:
        with FileSystems.open(path) as f:
            return json.loads(f.read())
    except Exception:
        if not is_remote(out) and os.path.isdir(out) and os.listdir(out):
            raise DataError(f"{out} exists and is not a tfpipe data output (no readable data.json); "
                            "choose another --out or remove it") from None
        return None


def published_names(manifest: dict) -> list[str]:
    names = [f["file"] for files in manifest["outputs"]["splits"].values() for f in files]
    return (names + manifest["outputs"]["deadletter"] + manifest["outputs"].get("unlabelled", [])
            + ["schema.json", "stats.json", "data.json"])


def human_bytes(n: float) -> str:
    unit = "B"
    for bigger in ("KB", "MB", "GB"):
        if n < 1000:
            break
        n, unit = n / 1000, bigger
    return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"


def print_summary(manifest: dict, out: str, log) -> None:
    c = manifest["counts"]
    noun = "images" if manifest.get("kind") == "images" else "rows"
    by_split: dict[str, list[int]] = {}
    for name, files in manifest["outputs"]["splits"].items():
        by_split[name] = [len(files), sum(f["bytes"] for f in files)]
    rows = [("split", noun, "files", "MB")]
    for name, n in c["splits"].items():
        rows.append((name, f"{n:,}", str(by_split[name][0]), f"{by_split[name][1] / 1e6:.2f}"))
    rows.append(("dead-letter", f"{c['bad']:,}", str(len(manifest["outputs"]["deadletter"])), ""))
    unlabelled = c.get("unlabelled", 0)
    if unlabelled:
        rows.append(("unlabelled", f"{unlabelled:,}", str(len(manifest["outputs"].get("unlabelled", []))), ""))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        log("  " + "  ".join(v.ljust(widths[0]) if i == 0 else v.rjust(widths[i]) for i, v in enumerate(r)))
    aside = f" + unlabelled {unlabelled:,}" if unlabelled else ""
    log(f"{noun} read {c['read']:,} = written {c['written']:,} + dead-letter {c['bad']:,}{aside}; "
        f"{manifest['elapsed_s']:.1f} s, {manifest['rows_per_s']:,.0f} {noun}/s")
    if unlabelled:
        log(f"{unlabelled:,} {noun} with no label were set aside in unlabelled/ (not trained on, not counted as bad)")
    log(f"wrote {out}")


def temp_output_dir(out: str) -> str:
    if is_remote(out):
        return temp_sibling(out)  # an object store's: no stale ones are looked for (their PIDs are other machines')
    parent = os.path.dirname(os.path.abspath(out.rstrip(os.sep)))
    os.makedirs(parent, exist_ok=True)
    if not os.access(parent, os.W_OK):
        raise DataError(f"cannot write to {parent}")
    tmp = temp_dir(out.rstrip(os.sep))  # those left by killed runs go first
    os.makedirs(os.path.join(tmp, "deadletter"))
    return tmp


def publish(tmp: str, out: str, names: list[str]) -> None:
    """Move the finished output into place; a reader sees the old or the new one, never half.

    `names` lists every output file relative to `tmp`, data.json last."""
    if is_remote(out):
        # Object stores have no directory rename: the old output goes first, then the new
        # files move one by one with data.json last, so a reader that trusts data.json
        # never sees a partial output.
        old = [m.path for m in match(FileSystems.join(out, "*")) + match(FileSystems.join(out, "deadletter", "*"))
               + match(FileSystems.join(out, "unlabelled", "*"))]
        if old:
            FileSystems.delete(old)
        for name in names:
            FileSystems.rename([FileSystems.join(tmp, name)], [FileSystems.join(out, name)])
        remove(tmp)
        return
    publish_dir(tmp, out)


def remove(tmp: str) -> None:
    if is_remote(tmp):
        try:
            FileSystems.delete([tmp.rstrip("/") + "/"])
        except Exception:
            pass
    else:
        shutil.rmtree(tmp, ignore_errors=True)


def match(pattern: str):
    try:
        return FileSystems.match([pattern])[0].metadata_list
    except Exception:
        return []


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


def result(out: str) -> StageResult:
    """The data stage's output: its counts in one line, its fingerprint."""
    path = FileSystems.join(out, "data.json")
    with FileSystems.open(path) as f:
        m = json.loads(f.read())
    c = m["counts"]
    noun = "images" if m.get("kind") == "images" else "rows"
    summary = (f"{c['read']:,} {noun} -> " + ", ".join(f"{k} {v:,}" for k, v in c["splits"].items())
               + (f"; {c['unlabelled']:,} unlabelled set aside" if c.get("unlabelled") else "")
               + f"; {c['bad']:,} dead-lettered")
    return StageResult(path, summary, DataOutputs(out, m["fingerprint"]),
                       notes=tuple(m.get("notices") or ()))
