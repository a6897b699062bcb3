"""`tfpipe promote` and `tfpipe rollback`: which version of a model is served, changed by hand on
the model base path (tfpipe/versions.py holds the layout and the rules), and the model's history
as `tfpipe show` prints it. A server polling the base path, tfpipe's or `tensorflow_model_server`,
follows within its poll interval, loading the version it now wants before unloading the other.
`tfpipe shadow DIR`: how a candidate answered the live requests mirrored to it (`tfpipe serve
--shadow`), from every server process's report file (serve/shadow_report.py holds the format)."""

from __future__ import annotations

import argparse
import json
import os

from tfpipe import versions
from tfpipe.rollout.errors import RolloutError


def model_dir_of(path: str) -> str:
    """The model base path's model directory (BASE/NAME) that `path` names: that directory itself,
    or a `tfpipe run` workdir whose export/models holds one model."""
    models = os.path.join(path, "export", "models")
    if os.path.isdir(models):
        names = sorted(d for d in os.listdir(models) if os.path.isdir(os.path.join(models, d)))
        if len(names) == 1:
            return os.path.join(models, names[0])
        raise RolloutError(f"{models} holds {len(names)} models ({', '.join(names) or 'none'}): name one of them, "
                          f"e.g. {os.path.join(models, names[0] if names else 'NAME')}")
    if not os.path.isdir(path):
        raise RolloutError(f"{path} does not exist: name a model directory (BASE/NAME, the one holding its "
                          "numbered versions) or a tfpipe run workdir")
    if not versions.numeric_versions(path) and not versions.candidates(path):
        raise RolloutError(f"{path} holds no model versions (numbered directories, or candidates/): name a model "
                          "directory BASE/NAME or a tfpipe run workdir")
    return path


def _configs(args: argparse.Namespace, model_dir: str):
    """With --models-config: the step that moves that file (and the --server running it) to the new
    version once it is in the served range, before the old one leaves it (rollout/tfserving.py)."""
    if not args.models_config:
        if args.server:
            raise RolloutError("--server needs --models-config: the file the server runs, whose labels move")
        if args.label != "stable":
            raise RolloutError(f"--label {args.label} needs --models-config: the file whose version label moves")
        return None
    from tfpipe.rollout.tfserving import move_stable

    name = args.name or os.path.basename(os.path.normpath(model_dir))
    return lambda before, version: move_stable(args.models_config, name, before, version, args.server, print,
                                               args.label)


def _change(args: argparse.Namespace, action, target: int | None, default_reason: str) -> tuple[str, dict]:
    """(the model directory, the history entry) of `action` (versions.promote or rollback) on MODEL."""
    model_dir = model_dir_of(args.model)
    try:
        return model_dir, action(model_dir, target, args.reason or default_reason, _configs(args, model_dir))
    except versions.VersionError as e:
        raise RolloutError(str(e)) from None


def cmd_promote(args: argparse.Namespace, extra: list[str]) -> int:
    model_dir, entry = _change(args, versions.promote, args.version, "promoted by hand")
    print(f"{model_dir}: version {entry['version']} is served (was {entry['served_before']}); a server polling "
          "the base path follows within its poll interval")
    return 0


def cmd_rollback(args: argparse.Namespace, extra: list[str]) -> int:
    model_dir, entry = _change(args, versions.rollback, args.to, "rolled back by hand")
    print(f"{model_dir}: version {entry['version']} is served again; version {entry['rolled_back_from']} is kept "
          f"in {versions.CANDIDATES}/ (tfpipe promote {args.model} --version {entry['rolled_back_from']} serves it "
          "again)")
    return 0


def history_lines(model_dir: str) -> list[str]:
    """The model's versions and history as `tfpipe show` prints them."""
    now = versions.served(model_dir)
    held = versions.candidates(model_dir)
    lines = [f"model {os.path.basename(model_dir)} ({model_dir}): "
             + (f"version {now} served" if now is not None else "no version served")
             + (f"; candidates {', '.join(map(str, held))}" if held else "")]
    events = versions.history(model_dir)
    if not events:
        lines.append("  no history recorded")
    for e in events:
        before, event = e.get("served_before"), e.get("event", "?")
        if event == "rolled back":  # the version named is the one served again
            what = f"rolled back to version {e.get('version')} (from {e.get('rolled_back_from', before)})"
        else:
            change = f" (served before: {before})" if before is not None and before != e.get("version") else ""
            what = f"{event:<14} version {e.get('version')}{change}"
        lines.append(f"  {e.get('time', '?')}  {what}: {e.get('reason', '')}")
    return lines


def cmd_history(args: argparse.Namespace, extra: list[str]) -> int:
    for line in history_lines(model_dir_of(args.model)):
        print(line)
    return 0


def _add_config_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models-config", metavar="FILE", help="also move this models.config (TF Serving's text proto) "
                   "to the version: a `specific` version policy and the label (--label) on it")
    p.add_argument("--server", metavar="HOST:PORT", help="with --models-config: the gRPC address of the server "
                   "running it (tensorflow_model_server or tfpipe serve), sent each step of the move "
                   "(HandleReloadConfigRequest): the new version loads beside the old one, then the label moves")
    p.add_argument("--name", metavar="NAME", help="the model's name in the models.config (default: the model "
                   "directory's name)")
    p.add_argument("--label", metavar="LABEL", default="stable", help="with --models-config: the version label "
                   "that moves to the version served (TF Serving's version_labels; default: stable)")


def cmd_shadow(args: argparse.Namespace, extra: list[str]) -> int:
    from tfpipe.serve.shadow_report import merge_reports, report_lines

    if not os.path.isdir(args.dir):
        raise RolloutError(f"{args.dir} is not a directory: name the --shadow_report_dir the server wrote to")
    try:
        merged = merge_reports(args.dir)
    except (FileNotFoundError, ValueError) as e:
        raise RolloutError(str(e)) from None
    if args.json:
        print(json.dumps(merged, indent=1))
    else:
        for line in report_lines(merged):
            print(line)
    return 0


# the commands that change the served version: name, handler, (target flag, its help), help, description, epilog
_CHANGES = (
    ("promote", cmd_promote, ("--version", "the version to serve (default: the newest candidate)"),
     "serve a version kept as a candidate (or any older one)",
     "Makes --version N the version served from the model base path: a candidate (one a gate held, or one "
     "rolled back from, in BASE/NAME/candidates/N) is renamed into the served range, and any higher version is "
     "moved to candidates/ (kept, promotable again). Recorded in the model's history with --reason. A server "
     "polling the base path (tfpipe serve, tensorflow_model_server) loads it, then unloads the one it replaces: "
     "no request fails.",
     "example: tfpipe promote runs/penguins --version 3 --reason 'checked by hand'"),
    ("rollback", cmd_rollback, ("--to", "the version to serve (default: the one served before)"),
     "serve the version served before the current one again",
     "Serves again the version that was served before the current one (or --to N): the current version is "
     "moved to BASE/NAME/candidates/ (kept: `tfpipe promote` serves it again). Versions a rollback may return "
     "to are never removed by `tfpipe export --keep`.",
     "example: tfpipe rollback runs/penguins --reason 'p99 doubled'"),
)


def add_rollout_commands(sub, common: argparse.ArgumentParser) -> None:
    """The `promote`, `rollback`, `history` and `shadow` subcommands (no config file: they take a model
    or a folder and change or show its versions; `common`'s --config would mean nothing to them)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", help="show the traceback of an error")
    where = ("a model directory BASE/NAME (the one holding its numbered versions), or a tfpipe run workdir "
             "(its export/models/NAME)")
    for name, handler, target, help_, description, epilog in _CHANGES:
        p = sub.add_parser(name, parents=[common], help=help_, description=description, epilog=epilog)
        p.add_argument("model", metavar="MODEL", help=where)
        p.add_argument(target[0], type=int, metavar="N", help=target[1])
        p.add_argument("--reason", metavar="TEXT", help="why, for the history")
        _add_config_flags(p)
        p.set_defaults(handler=handler)
    h = sub.add_parser(
        "history", parents=[common], help="which version of a model served when, and why",
        description="Prints the model's served version, its candidates, and every event of its history "
                    "(published, passed offline, promoted, held, refused, rolled back) with the reason recorded.")
    h.add_argument("model", metavar="MODEL", help=where)
    h.set_defaults(handler=cmd_history)
    s = sub.add_parser(
        "shadow", parents=[common], help="how a candidate answered the live requests mirrored to it (serve --shadow)",
        description="Merges the report files every server process wrote in DIR (tfpipe serve --shadow=SHARE "
                    "--shadow_report_dir=DIR: DIR/shadow-MODEL-PID.json) and prints, per model, candidate and served "
                    "version, API and signature: the requests mirrored and skipped, the share of rows whose class "
                    "flipped, the relative differences of float outputs (median, p90, p99, max), the candidate's "
                    "errors, both versions' latency (p50, p99), the same per value of --shadow_slice's input, and "
                    "the rows that differ most with their inputs and both answers.",
        epilog="example: tfpipe shadow /var/log/tfpipe/shadow --json")
    s.add_argument("dir", metavar="DIR", help="the directory given to tfpipe serve --shadow_report_dir")
    s.add_argument("--json", action="store_true", help="print the merged report as JSON")
    s.set_defaults(handler=cmd_shadow)
