"""`tfpipe run`: data -> train -> export -> serve -> loadtest -> skew in one workdir.

Each step is cached: its fingerprint is its config section, the hashes of its inputs (the
previous steps' manifests, or the raw input files for data) and the tfpipe version. A step
whose fingerprint and output are unchanged is skipped; one that ran reruns everything after
it through the changed hashes. manifest.json records every step (fingerprint, inputs,
outputs, times, status, log) and so the lineage of the model being served.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.resources
import json
import os
import re
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from tfpipe import __version__
from tfpipe.config import Config
from tfpipe.console import Console, error_line, output_into, plain_text, shown
from tfpipe.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USER_ERROR, ConfigError, RunError, UserError
from tfpipe.files import cache_key, digest, file_sha256, write_json
from tfpipe.manifest import read_manifest
from tfpipe.steps import BY_NAME, STEPS, StepInputs

# the demo `tfpipe run` runs without --config: examples/penguins.toml, installed with the package
DEMO_CONFIG = str(importlib.resources.files("tfpipe.examples") / "penguins.toml")


class StepFailed(Exception):
    """A step raised; carries the step so the run can say where and point at the log."""

    def __init__(self, step: str, error: BaseException):
        super().__init__(f"{step}: {error}")
        self.step, self.error = step, error


@dataclass
class RunRequest:
    config: Config
    config_path: str | None
    workdir: str
    from_step: str | None = None
    only: str | None = None
    force: bool = False
    serve_after: bool = False
    debug: bool = False
    command: list[str] = field(default_factory=lambda: list(sys.argv))


def default_workdir(config: Config, config_path: str | None) -> str:
    if config.run.workdir:
        return config.run.workdir
    stem = os.path.splitext(os.path.basename(config_path or DEMO_CONFIG))[0]
    return os.path.join("runs", stem)


def own_data_name(inputs: list[str]) -> str:
    """The name of a run on the user's own files (`tfpipe run --input FILE`): the first file's stem,
    without its compression's suffix either (its folder's name for a pattern such as raw/*.csv or a pkg:// path's file), as a model name
    may spell it."""
    first = inputs[0].rstrip("/")
    stem = os.path.basename(first)
    if stem.lower().endswith((".gz", ".gzip", ".bz2", ".zst")):  # x.csv.gz is x, not x.csv
        stem = os.path.splitext(stem)[0]
    stem = os.path.splitext(stem)[0]
    if not stem or any(c in stem for c in "*?["):
        stem = os.path.basename(os.path.dirname(first)) or "data"
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", stem).strip("._") or "data"
    return name


def exported_model_name(workdir: str) -> str | None:
    """The name of the model a run in `workdir` exported, if one did."""
    outputs = ((read_manifest(workdir) or {}).get("steps", {}).get("export") or {}).get("outputs") or {}
    return outputs.get("name")


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# ---- the run ---------------------------------------------------------------------------------------

class Run:
    """One `tfpipe run`: decides per step whether it is cached, runs the others, keeps the manifest."""

    def __init__(self, req: RunRequest):
        self.req, self.cfg = req, req.config
        self.workdir = os.path.abspath(req.workdir)
        self.manifest: dict[str, Any] = {}
        self.states: dict[str, str] = {}
        self.deployment = None  # the embedded server, once the serve or loadtest step needs it

    # paths -------------------------------------------------------------------------------------
    def path(self, *parts: str) -> str:
        return os.path.join(self.workdir, *parts)

    # fingerprints ------------------------------------------------------------------------------
    def fingerprint(self, step: str) -> tuple[str, dict[str, Any]]:
        """The step's settings, what it reads (its files outside the workdir, else the hashes of the
        manifests of the steps it needs) and the tfpipe version: their digest, and them."""
        s = BY_NAME[step]
        inputs = (s.sources(self.cfg) if s.sources else
                  {need: self.manifest["steps"][need]["outputs"]["sha256"] for need in s.needs})
        settings = s.settings(self.cfg)
        parts = {"config": digest(settings), "inputs": inputs, "tfpipe": __version__}  # what why_run names
        return cache_key(settings, inputs), parts

    def why_run(self, step: str, fp: str, parts: dict[str, Any]) -> str | None:
        """None when the step is cached; otherwise why it runs, in a few words."""
        req = self.req
        if req.force:
            return "--force"
        if req.from_step and STEPS.index(step) >= STEPS.index(req.from_step):
            return f"--from {req.from_step}"
        prev = self.manifest.get("steps", {}).get(step)
        if not prev:
            return "first run"
        status = prev.get("status")
        if status == "running":
            return "the last run stopped during this step"
        if status in ("failed", "interrupted"):
            return f"{status} last time"
        if prev.get("fingerprint") != fp:
            old = prev.get("parts", {})
            if old.get("tfpipe") != parts["tfpipe"]:
                return "tfpipe version changed"
            if old.get("config") != parts["config"]:
                return f"[{step}] config changed"
            if BY_NAME[step].sources:
                return "input files changed"
            changed = [k for k, v in parts["inputs"].items() if old.get("inputs", {}).get(k) != v]
            return f"{', '.join(changed) or 'an input'} output changed"
        if file_sha256(prev["outputs"]["manifest"]) != prev["outputs"]["sha256"]:
            return "its output is missing or was changed"
        return None

    # manifest ----------------------------------------------------------------------------------
    def save_manifest(self) -> None:
        self.manifest["updated"] = now()
        write_json(self.path("manifest.json"), self.manifest)

    # the server --------------------------------------------------------------------------------
    def serving(self):
        """The serve stage's Deployment on this workdir's configs (its server not started yet)."""
        if self.deployment is None:
            from tfpipe.serve.deploy import Deployment

            self.deployment = Deployment(self.cfg.serve, self.path("serve"), self.path("logs", "server.log"))
        return self.deployment

    def stop_server(self) -> None:
        if self.deployment is not None:
            self.deployment.stop()

    # the steps ---------------------------------------------------------------------------------
    def execute(self, console: Console) -> int:
        req = self.req
        os.makedirs(self.path("logs"), exist_ok=True)
        self.manifest = read_manifest(self.workdir)
        stopped = [s for s, v in self.manifest.get("steps", {}).items() if v.get("status") != "done"]
        if stopped:
            console.print(f"resuming: the last run stopped at {stopped[0]} "
                          f"({self.manifest['steps'][stopped[0]]['status']})")
        self.manifest.update({"tfpipe_version": __version__, "workdir": self.workdir,
                              "config_path": os.path.abspath(req.config_path) if req.config_path else None,
                              "config": self.cfg.model_dump(mode="json", by_alias=True)})
        self.manifest.setdefault("steps", {})
        self.manifest["last_run"] = {"command": req.command, "started": now(), "states": self.states}
        selected = [req.only] if req.only else list(STEPS)
        if req.only:
            missing = [n for n in BY_NAME[req.only].needs if self.manifest["steps"].get(n, {}).get("status") != "done"]
            if missing:
                raise RunError(f"--only {req.only} needs the output of {', '.join(missing)}: "
                               f"run without --only first")
        code = 0
        for step in selected:
            try:
                fp, parts = self.fingerprint(step)
            except Exception as e:  # e.g. the data's input files are missing
                self.fail(step, {"started": now(), "reason": "fingerprint"}, time.monotonic(), e, console)
            why = self.why_run(step, fp, parts)
            prev = self.manifest["steps"].get(step, {})
            if why is None:
                self.states[step] = "cached"
                console.print(f"  {step:<9}cached   {0:6.1f}s  {prev.get('summary', '')}")
                code = max(code, prev.get("code", 0))  # a cached verdict stands (a missed SLO, a skew)
                continue
            code = max(code, self.run_step(step, fp, parts, why, console))
        self.manifest["last_run"]["ended"] = now()
        self.save_manifest()
        return code

    def run_step(self, step: str, fp: str, parts: dict[str, Any], why: str, console: Console) -> int:
        log_path = self.path("logs", f"{step}.log")
        entry = {"status": "running", "fingerprint": fp, "parts": parts, "started": now(),
                 "log": os.path.relpath(log_path, self.workdir), "reason": why}
        self.manifest["steps"][step] = entry
        self.states[step] = "running"
        self.save_manifest()
        started = time.monotonic()
        with open(log_path, "a") as f:
            f.write(f"\n=== {step} {entry['started']} ({why}) ===\n")
        try:
            with console.running(step, why), output_into(log_path, not self.req.debug):
                done = BY_NAME[step].run(self.cfg, self.inputs(step), lambda line: print(line, flush=True))
        except BaseException as e:
            self.fail(step, entry, started, e, console)
        entry.update(status="done", ended=now(), elapsed_s=round(time.monotonic() - started, 2),
                     outputs={"manifest": done.manifest, "sha256": file_sha256(done.manifest),
                              **done.outputs.as_json()}, summary=done.summary, code=done.code, error=None)
        self.states[step] = "done"
        self.save_manifest()
        console.print(f"  {step:<9}done     {entry['elapsed_s']:6.1f}s  {done.summary}")
        for note in done.notes:
            console.print(f"  {'':<9}         {'':6} - {note}")
        return done.code

    def inputs(self, step: str) -> StepInputs:
        """The workdir, the typed outputs of the steps `step` needs (run now or cached) and the server."""
        s = BY_NAME[step]
        return StepInputs(self.workdir, {need: BY_NAME[need].outputs.from_json(self.manifest["steps"][need]["outputs"])
                                         for need in s.needs}, self.serving)

    def fail(self, step: str, entry: dict[str, Any], started: float, e: BaseException, console: Console):
        """Record the failure (or interruption) in the manifest and the step's log, say so, raise StepFailed."""
        log_path = self.path("logs", f"{step}.log")
        interrupted = isinstance(e, KeyboardInterrupt)
        entry.update(status="interrupted" if interrupted else "failed", ended=now(),
                     elapsed_s=round(time.monotonic() - started, 2), log=os.path.relpath(log_path, self.workdir),
                     error=None if interrupted else f"{type(e).__name__}: {plain_text(str(e))}")
        self.manifest["steps"][step] = entry
        self.states[step] = entry["status"]
        self.save_manifest()
        with open(log_path, "a") as f:
            if isinstance(e, UserError):
                f.write(f"error: {e}\n")
            else:
                traceback.print_exception(e, file=f)
        reason = "" if interrupted else error_line(e)
        console.print(f"  {step:<9}{entry['status']:<8} {entry['elapsed_s']:6.1f}s  {reason}")
        console.print(f"  log: {shown(log_path)}")
        raise StepFailed(step, e) from e


def _load(path: str) -> dict[str, Any]:
    with open(path) as f:
        return json.load(f)


@contextlib.contextmanager
def workdir_lock(workdir: str) -> Iterator[None]:
    """One `tfpipe run` per workdir at a time; the OS drops the lock when the process dies."""
    os.makedirs(workdir, exist_ok=True)
    f = open(os.path.join(workdir, ".lock"), "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip()
        f.close()
        raise RunError(f"another tfpipe run{' (pid ' + holder + ')' if holder else ''} is using {workdir}") from None
    f.seek(0)
    f.truncate()
    f.write(str(os.getpid()))
    f.flush()
    try:
        yield
    finally:
        f.close()


def run(req: RunRequest) -> int:
    """Run the pipeline; 0 when every step is done (and an SLO, if any, met), 1 when the SLO is
    missed, 2 on a user error, 130 when interrupted."""
    if req.from_step and req.from_step not in STEPS:
        raise ConfigError(f"--from {req.from_step}: steps are {', '.join(STEPS)}")
    if req.only and req.only not in STEPS:
        raise ConfigError(f"--only {req.only}: steps are {', '.join(STEPS)}")
    if req.only and req.from_step:
        raise ConfigError("give --from or --only, not both")
    console = Console()
    try:
        with workdir_lock(os.path.abspath(req.workdir)):
            return _run_locked(Run(req), console)
    finally:
        console.close()


def _run_locked(r: Run, console: Console) -> int:
    req, started = r.req, time.monotonic()
    d = req.config.data
    source = (shown(req.config_path) if req.config_path
              else f"{', '.join(d.input)} ("
                   + ("images, one folder per class" if d.format == "images" else f"label {d.label!r}")
                   + f", model {req.config.export.name!r})")
    console.print(f"tfpipe run: {source} -> {shown(r.workdir)}")
    try:
        code = r.execute(console)
    except StepFailed as e:
        r.stop_server()
        _finish_report(r, console)
        if isinstance(e.error, KeyboardInterrupt):
            console.print("interrupted: run the same command again to resume from this step")
            return EXIT_INTERRUPTED
        if req.debug:
            raise e.error from None
        known = isinstance(e.error, UserError)
        console.print(f"tfpipe run: {e.step} failed" + ("" if known else " (a bug: the traceback is in its log)")
                      + "; fix the cause and run the same command again to resume from this step")
        return EXIT_USER_ERROR if known else EXIT_FAILED
    except BaseException:
        r.stop_server()
        raise
    try:
        _finish_report(r, console)
        console.print(f"done in {time.monotonic() - started:.0f}s" + _misses(r))
        if req.serve_after:
            serve = r.manifest["steps"].get("serve", {})
            if serve.get("status") != "done":
                raise RunError("--serve-after needs a done serve step")
            with output_into(r.path("logs", "server.log"), not req.debug):  # TensorFlow's import chatter
                r.serving().start()
            r.serving().serve_forever(_load(serve["outputs"]["manifest"]), console.print)
    finally:
        r.stop_server()
    return code


GATES = {"export": "the export did NOT PROMOTE the new version (the served one stays; tfpipe history shows why)",
         "rollout": "the new version was NOT PROMOTED by the serving gate (the served one stays; tfpipe history "
                    "shows why)",
         "loadtest": "the load test MISSED its SLO", "skew": "the served traffic is SKEWED from the training data"}


def _misses(r: Run) -> str:
    """What made the run exit 1: the steps whose gate failed (their exit code, run or cached)."""
    steps = r.manifest.get("steps", {})
    return "".join(f"; {GATES.get(name, name + ' failed its check')}" for name in STEPS
                   if steps.get(name, {}).get("code"))


def _finish_report(r: Run, console: Console) -> None:
    from tfpipe.report import write_run_report

    path = r.path("report.html")
    write_run_report(r.workdir, r.manifest, path)
    console.print(f"report: {shown(path)}")
