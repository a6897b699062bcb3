"""Three days of `tfpipe run` in one workdir per table: does the second day's gate promote what it should and hold what it should?

    python benchmarks/bench_rollout.py                                  penguins_raw, breast_cancer, ames
    python benchmarks/bench_rollout.py --tables wine,hitters --workdir runs/bench-rollout --out results.json

For each table of the gallery (benchmarks/gallery.py) it runs, as a user would, in one fresh
workdir W (WORKDIR/NAME/work, wiped at the start):

  day 1          `tfpipe run --workdir W --input FILE --label LABEL` on the first half of the rows
                 (every second row), published as the first version;
  day 2          the same command on all the rows: the candidate is judged against day 1's version;
  day 2 shuffled the same command on all the rows with the labels of a random fifth of them permuted
                 among themselves (a fixed seed): judged against the version served after day 2 (day
                 2's own if it was promoted).

Each file is the gallery file read with pandas (every field as text, as written) and written back
the same way (CSV only: the three default tables are CSV). Every run gets
`--set loadtest.duration=1s`: its load test and skew steps are not what is measured, only kept
short. Exit status 0 or 1 (1: the gate held the candidate, or another step's check missed) is an
outcome; any other status, a timeout, or a step the run's manifest.json marks failed (a bug also
exits 1) stops the benchmark with the tail of that step's log.

One row per day: the exit status, the run's wall time, the export's (offline gate's) decision, the
rollout step's final one with the serving gate's round-by-round p99 and CPU-per-request ratios (new
over served; none when the offline gate already decided), the shadow round's agreement (the share of
rows whose class flipped, or a regression's median relative difference), its served CPU per request
over the served rounds' ("shadow x") and the goal for that ratio (1.1 plus the new version's own
TensorFlow call, CPU per call measured in this process, over the served CPU per request), the
version served after it, and, from the new
version's assets.extra/export.json, the gate's overall checks (slice
None) on the new test split and on the previous one (the test split the baseline kept): rows, the
candidate's and the baseline's metric (accuracy, or RMSE for regression) and the paired test's
p-value (McNemar's exact test, or a paired bootstrap of the RMSE). Day 1 has no baseline: its new
test split columns show the version's own test record (rows and metric). The table is printed as
it goes, then in Markdown, and written as JSON to --out.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import gallery  # noqa: E402
from bench_tables import run_bounded  # noqa: E402  (a run in a session of its own, ended on a timeout)

DEFAULT_TABLES = "penguins_raw,breast_cancer,ames"
SHUFFLED_FRACTION = 0.2
SEED = 20240
OVERRIDES = ["loadtest.duration=1s"]
TAIL_LINES = 30
OK_EXITS = (0, 1)
DAYS = ("1 half", "2 all", "2 shuffled")
SETS = (("new", "new test split"), ("prev", "previous test split"))


# ---- the day's files --------------------------------------------------------------------------------

def read_table(path: str):
    """The gallery file as a frame of text: every field as written (no number or NaN parsing), so
    that writing it back changes nothing but the rows chosen."""
    import pandas as pd

    return pd.read_csv(path, dtype=str, keep_default_na=False)


def day_frames(frame, label: str, seed: int = SEED) -> tuple[list, int]:
    """The three days' frames (half, all, all with a fifth of the labels permuted) and how many
    labels the permutation actually changed (a row may draw its own label, or an equal one)."""
    import numpy as np

    half = frame.iloc[::2].reset_index(drop=True)
    shuffled = frame.copy()
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(len(frame), size=int(round(SHUFFLED_FRACTION * len(frame))), replace=False))
    column = shuffled.columns.get_loc(label)
    before = shuffled.iloc[rows, column].to_numpy()
    after = before[rng.permutation(len(rows))]
    shuffled.iloc[rows, column] = after
    return [half, frame, shuffled], int((before != after).sum())


def write_days(written: gallery.Written, out: str) -> tuple[list[str], dict]:
    """Write the three days' files (the gallery's file name in a folder per day: the same model
    name whichever run comes first); returns their paths and what was written."""
    entry = written.entry
    if entry.kind != "csv":
        raise SystemExit(f"{entry.name}: {entry.file} is not CSV; this benchmark writes CSV days only")
    frame = read_table(written.path)
    frames, changed = day_frames(frame, entry.label)
    paths = []
    for i, day in enumerate(frames, 1):
        folder = os.path.join(out, f"day{i}")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, entry.file)
        entry.write(day, path)
        paths.append(path)
    return paths, {"rows": [len(f) for f in frames], "shuffled_rows": int(round(SHUFFLED_FRACTION * len(frame))),
                   "labels_changed": changed}


# ---- running tfpipe ---------------------------------------------------------------------------------

def run_day(workdir: str, path: str, label: str, console: str, timeout: float) -> dict:
    args = ["run", "--workdir", workdir, "--input", path, "--label", label]
    for o in OVERRIDES:
        args += ["--set", o]
    # its cwd the table's folder, so that nothing lands in the tree
    code, wall = run_bounded([sys.executable, "-m", "tfpipe.cli", *args], os.path.dirname(workdir), console, timeout)
    return {"command": "tfpipe " + " ".join(args), "exit": code, "wall_s": round(wall, 1), "console": console}


def tail(path: str, lines: int = TAIL_LINES) -> list[str]:
    with open(path, errors="replace") as f:
        kept = [line.rstrip("\n") for line in f if line.strip()]
    return kept[-lines:]


def failed_steps(workdir: str) -> list[tuple[str, dict]]:
    """The steps this run left failed or interrupted: a bug exits 1, as a held version does, so
    the status alone does not tell them apart."""
    try:
        with open(os.path.join(workdir, "manifest.json")) as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return [("manifest", {"error": "no readable manifest.json"})]
    states = (manifest.get("last_run") or {}).get("states") or {}
    return [(s, manifest["steps"].get(s, {})) for s, state in states.items() if state in ("failed", "interrupted")]


def fail_loudly(table: str, day: str, run: dict, workdir: str, failed: list[tuple[str, dict]]) -> None:
    """Stop the benchmark: the run's console and the tail of the failed step's log (else the newest)."""
    status = "a timeout" if run["exit"] is None else f"exit status {run['exit']}"
    steps = "".join(f"; step {s} {e.get('status', 'failed')}: {e.get('error')}" for s, e in failed)
    print(f"\n!!! {table}, day {day}: `{run['command']}` ended with {status}{steps}", file=sys.stderr)
    print(f"--- console ({run['console']}):", file=sys.stderr)
    for line in tail(run["console"], 15):
        print(f"    | {line}", file=sys.stderr)
    logs = [os.path.join(workdir, e["log"]) for _, e in failed if e.get("log")]
    logs = logs or sorted(glob.glob(os.path.join(workdir, "logs", "*.log")), key=os.path.getmtime)
    if logs:
        print(f"--- {logs[-1]}:", file=sys.stderr)
        for line in tail(logs[-1]):
            print(f"    | {line}", file=sys.stderr)
    raise SystemExit(3)


# ---- what the day recorded --------------------------------------------------------------------------

def day_record(workdir: str) -> dict:
    """The export step of the run just made: the new version, the decision and the gate's overall
    checks from its export.json, and the version served afterwards."""
    from tfpipe import versions

    with open(os.path.join(workdir, "manifest.json")) as f:
        manifest = json.load(f)
    step = manifest["steps"]["export"]
    if manifest["last_run"]["states"].get("export") != "done" or step.get("status") != "done":
        raise SystemExit(f"{workdir}: the export step did not run in this run "
                         f"({manifest['last_run']['states'].get('export')}, {step.get('status')})")
    outputs = step["outputs"]
    model_dir = os.path.dirname(outputs["path"])  # the served version's directory, the new one's or the baseline's
    version = outputs["candidate"] if outputs.get("candidate") is not None else outputs["version"]
    with open(os.path.join(versions.version_path(model_dir, version), "assets.extra", "export.json")) as f:
        export = json.load(f)
    metric = "rmse" if "rmse" in (export.get("test") or {}) else "accuracy"
    sets = {}
    for key, data in SETS:
        found = [c for c in ((export.get("gate") or {}).get("checks") or [])
                 if c["data"] == data and c["slice"] is None and c["p_value"] is not None]
        sets[key] = ({k: found[0][k] for k in ("rows", "metric", "candidate", "baseline", "p_value", "passed")}
                     if found else None)
    if sets["new"] is None and export.get("test"):
        # no baseline (the first day): the version's own test record on the same split
        test = export["test"]
        sets["new"] = {"rows": test["rows"], "metric": metric, "candidate": test[metric], "baseline": None,
                       "p_value": None, "passed": None}
    events = [e for e in versions.history(model_dir) if e.get("version") == export["version"]]
    try:  # the rollout step's verdict: the serving gate's round-by-round ratios, new over served
        with open(os.path.join(workdir, "rollout", "rollout.json")) as f:
            rollout = json.load(f)
    except (OSError, ValueError):
        rollout = {}
    serving = rollout.get("serving") or {}
    ratios = (serving.get("summary") or {}).get("ratios") or {}
    return {"model": export["name"], "version": export["version"], "decision": export.get("decision"),
            "final": rollout.get("decision"), "p99_ratio": ratios.get("p99_ms"), "cpu_ratio": ratios.get("cpu_us"),
            **shadow_figures(serving, versions.version_path(model_dir, export["version"]) if serving else None),
            "last_event": events[-1]["event"] if events else None,
            "reason": export.get("reason"), "baseline": export.get("baseline"), "metric": metric,
            "served_after": versions.served(model_dir), "candidates_after": versions.candidates(model_dir),
            "gate_failed": (export.get("gate") or {}).get("failed") or [],
            "gate_notes": (export.get("gate") or {}).get("notes") or [], **sets}


def shadow_figures(serving: dict, new_dir: str | None) -> dict:
    """The rollout step's shadow round: the agreement (the flipped share, or for a regression the
    median relative difference), the served traffic's CPU per request with the shadow over without
    (the served rounds' median), and the goal for it: 1.1 plus the new version's own TensorFlow call
    (CPU time per call in this process, on its warmup rows, each call handed to a thread as the
    shadow's is: bench_shadow.in_process_cpu) over the served version's CPU per request."""
    shadow = serving.get("shadow") or {}
    records = shadow.get("records") or []
    if not records:
        return {"agreement": None, "shadow_cpu": None, "shadow_goal": None, "mirrored": None}
    s = records[0]["summary"]
    agreement = s["flipped_share"] if s.get("class_rows") else s.get("rel_diff_median")
    served_cpu = ((serving.get("summary") or {}).get("served") or {}).get("cpu_us")
    goal = None
    if new_dir and served_cpu:
        from bench_shadow import in_process_cpu, requests_of

        call = in_process_cpu(new_dir, requests_of(new_dir), 300)[1]
        goal = 1.1 + call * 1e6 / served_cpu
    return {"agreement": agreement, "agreement_kind": "flipped" if s.get("class_rows") else "rel. diff.",
            "shadow_cpu": shadow.get("cpu_ratio"), "shadow_goal": goal,
            "mirrored": records[0]["mirrored"], "skipped": records[0]["skipped"]}


def history_text(workdir: str) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "tfpipe.cli", "history", workdir], capture_output=True, text=True,
                         cwd=os.path.dirname(workdir))
    return (out.stdout + out.stderr).rstrip("\n").splitlines()


# ---- the table --------------------------------------------------------------------------------------

def fig(value, metric: str | None) -> str:
    if value is None:
        return "-"
    if metric == "accuracy":
        return f"{value:.3f}"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def pval(p) -> str:
    return "-" if p is None else f"{p:.3g}"


COLUMNS = ("table", "day", "exit", "run s", "decision", "final", "p99 x", "CPU x", "agree", "shadow x", "goal x",
           "version", "served after", "metric", "new rows", "new cand", "new base", "new p", "prev rows", "prev cand",
           "prev base", "prev p")


def cells(r: dict) -> list[str]:
    m = r.get("metric")
    decision = r.get("decision") or "-"
    if r.get("last_event") and r["last_event"] != decision:  # a later step of the run changed it
        decision += f" ({r['last_event']})"
    ratio = (lambda x: "-" if x is None else f"{x:.2f}")
    out = [r["table"], r["day"], str(r["exit"]), f"{r['wall_s']:.0f}", decision, r.get("final") or "-",
           ratio(r.get("p99_ratio")), ratio(r.get("cpu_ratio")),
           "-" if r.get("agreement") is None else
           (f"{r['agreement']:.1%} flip" if r.get("agreement_kind") == "flipped" else f"{r['agreement']:.3g} rel"),
           ratio(r.get("shadow_cpu")), ratio(r.get("shadow_goal")),
           str(r.get("version", "-")), str(r.get("served_after", "-")), m or "-"]
    for key, _ in SETS:
        s = r.get(key)
        out += ["-"] * 4 if s is None else [str(s["rows"]), fig(s["candidate"], m), fig(s["baseline"], m),
                                            pval(s["p_value"])]
    return out


WIDTHS = (14, 11, 4, 5, 9, 9, 6, 6, 10, 8, 6, 7, 12, 8, 8, 9, 9, 7, 9, 9, 9, 7)


def plain_line(values) -> str:
    return " ".join(f"{v:<{w}}" if i < 2 or i in (4, 5) else f"{v:>{w}}" for i, (v, w) in enumerate(zip(values, WIDTHS)))


def markdown(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cells(r)) + " |" for r in rows]
    return "\n".join(lines)


# ---- main -------------------------------------------------------------------------------------------

def bench_table(written: gallery.Written, root: str, timeout: float, rows: list[dict]) -> dict:
    entry = written.entry
    folder = os.path.join(root, entry.name)
    shutil.rmtree(folder, ignore_errors=True)  # every table starts from no model at all
    os.makedirs(folder)
    workdir = os.path.join(folder, "work")
    paths, files = write_days(written, os.path.join(folder, "input"))
    for day, path in zip(DAYS, paths):
        run = run_day(workdir, path, entry.label, os.path.join(folder, f"console-day{day.replace(' ', '-')}.txt"),
                      timeout)
        failed = failed_steps(workdir) if run["exit"] in OK_EXITS else []
        if run["exit"] not in OK_EXITS or failed:
            fail_loudly(entry.name, day, run, workdir, failed)
        r = {"table": entry.name, "task": entry.task, "day": day, "file": path, **run, **day_record(workdir)}
        rows.append(r)
        print(plain_line(cells(r)), flush=True)
    return {"table": entry.name, "task": entry.task, "label": entry.label, "workdir": workdir, **files,
            "history": history_text(workdir)}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tables", default=DEFAULT_TABLES, metavar="NAME[,NAME]",
                   help=f"comma list of CSV gallery tables (default: {DEFAULT_TABLES})")
    p.add_argument("--workdir", default="runs/bench-rollout", metavar="DIR",
                   help="where the gallery files and each table's folder (NAME/: the days' files, the runs' "
                        "consoles, the run workdir NAME/work) go; a table's folder is wiped at its start "
                        "(default: runs/bench-rollout)")
    p.add_argument("--out", default="runs/bench-rollout/results.json", metavar="PATH",
                   help="the JSON results (default: runs/bench-rollout/results.json)")
    p.add_argument("--timeout", type=float, default=900.0, metavar="S",
                   help="seconds one `tfpipe run` may take before it is stopped, a failure (default: 900)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    import tfpipe

    args = parse_args(argv)
    source = {"path": os.path.dirname(os.path.abspath(tfpipe.__file__)), "version": tfpipe.__version__}
    print(f"tfpipe {source['version']} from {source['path']}", flush=True)
    gallery.select(args.tables)  # an unknown name stops here, before anything is written
    root = os.path.abspath(args.workdir)
    started = time.monotonic()
    written = gallery.write_gallery(os.path.join(root, "gallery"), args.tables)
    rows: list[dict] = []
    tables = []
    print(plain_line(COLUMNS), flush=True)
    for w in written:
        tables.append(bench_table(w, root, args.timeout, rows))
    total = time.monotonic() - started
    print("\n" + markdown(rows))
    print("\nmetric: accuracy, or RMSE for regression; p: the paired test's p-value (the candidate worse than the "
          "baseline); day 1 has no baseline: its new-split columns are its own test record")
    for r in rows:
        if r["decision"] in ("held", "refused"):
            print(f"  {r['table']} day {r['day']}: {r['decision']}: {r['reason']}")
    for t in tables:
        print(f"  {t['table']}: day files {t['rows']} rows; {t['labels_changed']} of the {t['shuffled_rows']} "
              "shuffled rows changed label")
    print(f"\ntotal {total:.0f} s")
    out = os.path.abspath(args.out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"tfpipe": source, "tables": tables, "days": rows, "overrides": OVERRIDES, "seed": SEED,
                   "shuffled_fraction": SHUFFLED_FRACTION, "total_s": round(total, 1)}, f, indent=1)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
