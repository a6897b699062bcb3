"""Run `tfpipe run` on every table of both galleries (benchmarks/gallery.py) and score what it served.

    python benchmarks/bench_tables.py                          both galleries, in a temp dir
    python benchmarks/bench_tables.py --gallery 2              the second gallery only
    python benchmarks/bench_tables.py --only iris_r,diamonds   some tables
    python benchmarks/bench_tables.py --workdir-root .bench/tables --json tables.json

For each table it runs `tfpipe run --input FILE --label COLUMN` with no other flag (an image
folder: `tfpipe run --input DIR/`), as a user would, with its working directory in a fresh
scratch folder (the run's workdir is runs/<file stem> there) and a timeout, and records the exit
status, the wall time and, on failure, the last lines of its output.

Then, apart from anything tfpipe reports, it reads tfpipe's own splits (data/{train,test}-*.tfrecord.gz,
described by data/schema.json) and computes on the TEST split:
  * model: the exported SavedModel (export/models/NAME/VERSION, from the run's manifest) loaded with
    tf.saved_model.load, its serving_default signature fed the raw features (a missing number as
    NaN, a missing string as ""): accuracy of its `classes`, or RMSE of its `predictions`;
  * HGB: scikit-learn's HistGradientBoostingClassifier/Regressor (default settings but random_state=0,
    categorical_features="from_dtype", string columns as pandas categories: a column's 250 most
    frequent training values, the others as missing, since HGB takes at most 255 categories)
    fitted on tfpipe's TRAIN split;
  * trivial: the training split's majority class, or its mean.
The verdict checks: exit 0; accuracy within 3 points of HGB's (RMSE at most 1.15x HGB's); better
than trivial; wall time under 180 s. One row per table; `--json PATH` writes every figure.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import gallery  # noqa: E402

ACCURACY_GAP = 0.03  # classification: at most 3 accuracy points under HGB
RMSE_RATIO = 1.15  # regression: RMSE at most 1.15x HGB's
WALL_LIMIT_S = 180.0
HGB_MAX_CATEGORIES = 250  # under HGB's limit of 255 categories a feature (max_bins)
TAIL_LINES = 12
# TensorFlow's and absl's start-up chatter, which says nothing about the run
NOISE = ("I0000 ", "W0000 ", "WARNING: All log messages", "To enable the following instructions")


# ---- running tfpipe ---------------------------------------------------------------------------------

def tfpipe_command() -> list[str]:
    """The `tfpipe` console script beside this interpreter (the same venv), else the one on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "tfpipe")
    return [here] if os.path.exists(here) else [shutil.which("tfpipe") or "tfpipe"]


def output_tail(log: str, lines: int = TAIL_LINES) -> list[str]:
    with open(log, errors="replace") as f:
        kept = [line.rstrip("\n") for line in f if line.strip() and not line.startswith(NOISE)]
    return kept[-lines:]


ERROR_LINE = re.compile(r"^\s*(error: |([\w.]+(Error|Exception)|KeyError|AssertionError)\b)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def step_error(scratch: str, tail: list[str], lines: int = 4, width: int = 240) -> list[str]:
    """The failed step's own words: in the log the run's output points at (`log: runs/.../STEP.log`),
    the last error line and the lines after it (the console shows only the error's first line)."""
    logs = [m.group(1) for m in (re.search(r"^\s*log: (\S+)", t) for t in tail) if m]
    path = os.path.join(scratch, logs[-1]) if logs else None
    if not path or not os.path.exists(path):
        return []
    with open(path, errors="replace") as f:
        text = [ANSI.sub("", line.rstrip()) for line in f if line.strip() and not line.startswith(NOISE)]
    starts = [i for i, line in enumerate(text) if ERROR_LINE.match(line)]
    if not starts:
        return []
    return [line.strip()[:width] for line in text[starts[-1]:starts[-1] + lines]]


def run_tfpipe(written: gallery.Written, scratch: str, timeout: float) -> dict:
    """`tfpipe run` on one gallery file in a fresh `scratch` folder: exit, wall time, output tail."""
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    entry = written.entry
    args = ["run", "--input", written.path + ("/" if entry.kind == "images" else "")]
    if entry.label is not None:
        args += ["--label", entry.label]
    log = os.path.join(scratch, "tfpipe-run.log")
    code, wall = run_bounded(tfpipe_command() + args, scratch, log, timeout)
    tail = output_tail(log)
    return {"command": "tfpipe " + " ".join(args), "exit": code, "timed_out": code is None,
            "wall_s": round(wall, 1), "tail": tail, "log": log,
            "step_error": step_error(scratch, tail) if code != 0 else []}


def run_bounded(command: list[str], cwd: str, log: str, timeout: float) -> tuple[int | None, float]:
    """Run `command` in `cwd` with its output in the file `log`, in a session of its own so that a
    timeout ends the servers and load generators it started too: (its exit status, None on a
    timeout; the wall seconds it took)."""
    started = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(command, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_group(proc)
            code = None
    return code, time.monotonic() - started


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the run's process group, SIGKILL after 15 s."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_workdir(scratch: str) -> str | None:
    """The workdir `tfpipe run` made under scratch/runs/ (one per scratch folder)."""
    found = sorted(d for d in glob.glob(os.path.join(scratch, "runs", "*")) if os.path.isdir(d))
    return found[0] if found else None


def saved_model_dir(workdir: str) -> str | None:
    """The exported version directory: the manifest's export step output, else the newest version
    under export/models/."""
    try:
        with open(os.path.join(workdir, "manifest.json")) as f:
            step = json.load(f)["steps"]["export"]
        if step.get("status") == "done" and os.path.exists(os.path.join(step["outputs"]["path"], "saved_model.pb")):
            return step["outputs"]["path"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    found = glob.glob(os.path.join(workdir, "export", "models", "*", "*", "saved_model.pb"))
    found = [os.path.dirname(p) for p in found if os.path.basename(os.path.dirname(p)).isdigit()]
    return max(found, key=lambda p: int(os.path.basename(p))) if found else None


# ---- reading tfpipe's splits ------------------------------------------------------------------------

def example_value(feature):
    """The one value of a tf.train.Feature (None when absent or empty), text decoded."""
    kind = feature.WhichOneof("kind") if feature is not None else None
    values = list(getattr(feature, kind).value) if kind else []
    if not values:
        return None
    v = values[0]
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else v


def read_split(data_dir: str, split: str, names: list[str]) -> list[dict]:
    """Every Example of a split as {name: value or None} for the given feature names."""
    import tensorflow as tf

    files = sorted(glob.glob(os.path.join(data_dir, f"{split}-*.tfrecord.gz")))
    rows = []
    if not files:
        return rows
    for record in tf.data.TFRecordDataset(files, compression_type="GZIP"):
        features = tf.train.Example.FromString(record.numpy()).features.feature
        rows.append({n: example_value(features.get(n)) for n in names})
    return rows


def load_splits(data_dir: str) -> dict:
    """schema.json and the train and test rows; for images, the encoded bytes and the class text."""
    with open(os.path.join(data_dir, "schema.json")) as f:
        schema = json.load(f)
    if schema.get("kind") == "images":
        keys = schema["keys"]
        names, label, task = [keys["encoded"]], keys["text"], "images"
        import tensorflow as tf  # the image bytes stay bytes: read them apart from the text fields

        files = sorted(glob.glob(os.path.join(data_dir, "test-*.tfrecord.gz")))
        test = []
        for record in tf.data.TFRecordDataset(files, compression_type="GZIP") if files else []:
            fs = tf.train.Example.FromString(record.numpy()).features.feature
            test.append({names[0]: fs[names[0]].bytes_list.value[0], label: example_value(fs.get(label))})
        train = read_split(data_dir, "train", [label])
        return {"schema": schema, "features": names, "label": label, "task": task, "train": train, "test": test}
    label = schema["label"]["name"]
    names = [c["name"] for c in schema["features"]]
    return {"schema": schema, "features": names, "label": label, "task": schema["label"]["task"],
            "types": {c["name"]: c["type"] for c in schema["features"]},
            "train": read_split(data_dir, "train", names + [label]),
            "test": read_split(data_dir, "test", names + [label])}


# ---- the three scores -------------------------------------------------------------------------------

def score(task: str, truth: list, predicted: list) -> float:
    """Accuracy (classes compared as text) or RMSE."""
    if task == "regression":
        return math.sqrt(sum((float(t) - float(p)) ** 2 for t, p in zip(truth, predicted)) / len(truth))
    return sum(str(t) == str(p) for t, p in zip(truth, predicted)) / len(truth)


def model_predictions(version_dir: str, splits: dict, batch: int = 1024) -> list:
    """serving_default's answers for the test rows: `classes` as text, or `predictions`. The
    inputs are fed by the SignatureDef's names, as TF Serving's clients send them (a column's
    own name, `Sepal.Length` or `bill length (mm)`)."""
    import numpy as np
    import tensorflow as tf
    from tensorflow.core.framework import types_pb2

    from tfpipe.loadtest.payloads import saved_model_inputs

    fn = tf.saved_model.load(version_dir).signatures["serving_default"]
    inputs = {k: tf.as_dtype(types_pb2.DataType.Value(d))
              for k, d in (saved_model_inputs(version_dir, "serving_default") or {}).items()}
    if splits["task"] == "images" and len(inputs) == 1:  # the encoded image, whatever the input's name
        column = {next(iter(inputs)): splits["features"][0]}
    else:
        column = {k: k for k in inputs}
    unknown = [k for k in inputs if column[k] not in splits["features"]]
    if unknown:
        raise ValueError(f"serving_default input(s) {unknown} are no column of schema.json")
    rows, out = splits["test"], []
    for start in range(0, len(rows), batch):
        chunk = rows[start:start + batch]
        feeds = {}
        for key, dtype in inputs.items():
            values = [r.get(column[key]) for r in chunk]
            if dtype == tf.string:
                values = [v if isinstance(v, bytes) else ("" if v is None else str(v)).encode() for v in values]
                feeds[key] = tf.constant(np.array(values, dtype=object), tf.string)
            elif dtype.is_floating:
                feeds[key] = tf.constant([math.nan if v is None else float(v) for v in values], dtype)
            else:
                feeds[key] = tf.constant([0 if v is None else int(v) for v in values], dtype)
        answer = fn(**feeds)
        if splits["task"] == "regression":
            out += [float(v) for v in answer["predictions"].numpy().reshape(-1)]
        else:
            out += [v.decode("utf-8", "replace") for v in answer["classes"].numpy().reshape(-1)]
    return out


def hgb_frame(rows: list[dict], splits: dict, categories: dict | None = None):
    """The feature columns as a DataFrame: strings as categories (the training split's most
    frequent HGB_MAX_CATEGORIES values, fixed by `categories` for the test split), the rest floats."""
    import pandas as pd

    frame, categories = {}, dict(categories or {})
    for name in splits["features"]:
        values = [r.get(name) for r in rows]
        if splits["types"][name] == "string":
            if name not in categories:
                counts = pd.Series([v for v in values if v is not None]).value_counts(sort=True)
                categories[name] = sorted(counts.index[:HGB_MAX_CATEGORIES])
            known = set(categories[name])
            frame[name] = pd.Categorical([v if v in known else None for v in values], categories=categories[name])
        else:
            frame[name] = pd.to_numeric(pd.Series(values, dtype="object"), errors="coerce").astype("float64")
    return pd.DataFrame(frame), categories


def hgb_predictions(splits: dict) -> list:
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

    x_train, categories = hgb_frame(splits["train"], splits)
    x_test, _ = hgb_frame(splits["test"], splits, categories)
    y = [r[splits["label"]] for r in splits["train"]]
    if splits["task"] == "regression":
        model = HistGradientBoostingRegressor(categorical_features="from_dtype", random_state=0)
        return [float(v) for v in model.fit(x_train, [float(v) for v in y]).predict(x_test)]
    model = HistGradientBoostingClassifier(categorical_features="from_dtype", random_state=0)
    return list(model.fit(x_train, [str(v) for v in y]).predict(x_test))


def trivial_predictions(splits: dict) -> list:
    from collections import Counter

    y = [r[splits["label"]] for r in splits["train"]]
    if splits["task"] == "regression":
        guess = sum(float(v) for v in y) / len(y)
    else:
        guess = Counter(str(v) for v in y).most_common(1)[0][0]
    return [guess] * len(splits["test"])


def measure(workdir: str | None) -> dict:
    """The three test scores of one run, each computed apart: a part that fails records its error
    and leaves the others (a run whose training failed still has its splits for HGB and trivial)."""
    result: dict = {"metric": None, "model": None, "hgb": None, "trivial": None, "errors": {}}
    data_dir = os.path.join(workdir, "data") if workdir else None
    if not data_dir or not os.path.exists(os.path.join(data_dir, "schema.json")):
        result["errors"]["data"] = "no data/schema.json: the data step wrote no splits"
        return result
    try:
        splits = load_splits(data_dir)
    except Exception as e:  # noqa: BLE001 - a benchmark of broken runs reads what it can
        result["errors"]["data"] = f"{type(e).__name__}: {e}"
        return result
    label = splits["label"]
    for split in ("train", "test"):
        splits[split] = [r for r in splits[split] if r.get(label) is not None]
    result.update(task=splits["task"], train_rows=len(splits["train"]), test_rows=len(splits["test"]),
                  metric="rmse" if splits["task"] == "regression" else "accuracy")
    if not splits["test"] or not splits["train"]:
        result["errors"]["data"] = "an empty train or test split"
        return result
    truth = [r[label] for r in splits["test"]]
    scoring = "regression" if splits["task"] == "regression" else "classes"
    version_dir = saved_model_dir(workdir)
    parts = {"model": (lambda: model_predictions(version_dir, splits)) if version_dir else None,
             "hgb": None if splits["task"] == "images" else (lambda: hgb_predictions(splits)),
             "trivial": lambda: trivial_predictions(splits)}
    for part, predict in parts.items():
        if predict is None:
            result["errors"][part] = "no exported SavedModel" if part == "model" else "not for images"
            continue
        try:
            result[part] = round(score(scoring, truth, predict()), 6)
        except Exception as e:  # noqa: BLE001 - one part failing leaves the others
            result["errors"][part] = f"{type(e).__name__}: {e}"
    result["saved_model"] = version_dir
    result["interval"] = printed_interval(version_dir)
    return result


def printed_interval(version_dir: str | None) -> list[float] | None:
    """The 95% interval tfpipe printed beside its test metric (export.json `test.interval`), or None."""
    try:
        with open(os.path.join(version_dir, "assets.extra", "export.json"), encoding="utf-8") as f:
            interval = json.load(f)["test"]["interval"]
        return [interval["low"], interval["high"]]
    except (TypeError, OSError, KeyError, ValueError):
        return None


def verdict(run: dict, m: dict) -> list[str]:
    """The targets this table misses (none: it passes)."""
    missed = []
    if run["exit"] != 0:
        missed.append("timeout" if run["timed_out"] else f"exit {run['exit']}")
    model, hgb, trivial = m.get("model"), m.get("hgb"), m.get("trivial")
    if model is None:
        missed.append("no model score")
    elif m["metric"] == "rmse":
        if hgb is not None and model > RMSE_RATIO * hgb:
            missed.append(f"RMSE > {RMSE_RATIO}x HGB")
        if trivial is not None and model >= trivial:
            missed.append("not better than trivial")
    else:
        if hgb is not None and model < hgb - ACCURACY_GAP:
            missed.append(f"> {ACCURACY_GAP * 100:.0f} pts under HGB")
        if trivial is not None and model <= trivial:
            missed.append("not better than trivial")
    if run["wall_s"] >= WALL_LIMIT_S:
        missed.append(f"wall >= {WALL_LIMIT_S:.0f}s")
    return missed


# ---- the report -------------------------------------------------------------------------------------

def figure(value, metric) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if metric == "accuracy" else f"{value:,.4g}" if value < 1000 else f"{value:,.0f}"


def interval_text(interval, metric) -> str:
    return "-" if not interval else f"{figure(interval[0], metric)}-{figure(interval[1], metric)}"


HEADER = f"{'table':<18} {'rows':>7} {'task':<10} {'exit':>4} {'wall s':>7} {'metric':<8} {'model':>9} " \
         f"{'tfpipe 95% CI':>19} {'HGB':>9} {'trivial':>9}  verdict"


def row_line(r: dict) -> str:
    m, run = r["measured"], r["run"]
    metric = m.get("metric") or "-"
    code = "T/O" if run["timed_out"] else str(run["exit"])
    return (f"{r['name']:<18} {r['rows']:>7} {r['task']:<10} {code:>4} {run['wall_s']:>7.1f} {metric:<8} "
            f"{figure(m.get('model'), metric):>9} {interval_text(m.get('interval'), metric):>19} "
            f"{figure(m.get('hgb'), metric):>9} "
            f"{figure(m.get('trivial'), metric):>9}  {'PASS' if not r['missed'] else 'FAIL: ' + '; '.join(r['missed'])}")


def print_details(results: list[dict]) -> None:
    """Under the table: each failed run's last output lines, and each score that could not be computed."""
    for r in results:
        run, errors = r["run"], r["measured"]["errors"]
        if run["exit"] != 0 or errors:
            print(f"\n--- {r['name']}: {run['command']}  (exit {'timeout' if run['timed_out'] else run['exit']})")
            if run["exit"] != 0:
                for line in run["tail"]:
                    print(f"    | {line}")
                for line in run["step_error"]:
                    print(f"    step log> {line}")
            for part, error in errors.items():
                print(f"    {part} score: {error}")


def bench_one(written: gallery.Written, root: str, timeout: float) -> dict:
    entry = written.entry
    scratch = os.path.join(root, "runs", entry.name)
    run = run_tfpipe(written, scratch, timeout)
    measured = measure(run_workdir(scratch))
    return {"name": entry.name, "file": written.path, "label": entry.label, "task": entry.task,
            "rows": written.rows, "covers": list(entry.covers), "run": run, "measured": measured,
            "missed": verdict(run, measured)}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", metavar="NAME[,NAME]", help="comma list of gallery entries (default: all; "
                   f"known: {', '.join(e.name for e in gallery.entries())})")
    p.add_argument("--gallery", type=int, choices=gallery.GALLERIES,
                   help="only the entries of this gallery (default: both)")
    p.add_argument("--workdir-root", metavar="DIR", help="where the gallery files (DIR/gallery) and each table's "
                   "scratch folder (DIR/runs/NAME, the run's workdir under it) go, kept afterwards "
                   "(default: a temporary folder, removed at the end)")
    p.add_argument("--timeout", type=float, default=600.0, metavar="S",
                   help="seconds one `tfpipe run` may take before it is stopped (default: 600)")
    p.add_argument("--json", metavar="PATH", help="also write every figure, command and output tail as JSON")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    gallery.select(args.only, args.gallery)  # an unknown name stops here, before anything is written
    root = os.path.abspath(args.workdir_root) if args.workdir_root else tempfile.mkdtemp(prefix="bench-tables-")
    results = []
    try:
        written = gallery.write_gallery(os.path.join(root, "gallery"), args.only, args.gallery)
        print(HEADER, flush=True)
        for w in written:
            r = bench_one(w, root, args.timeout)
            results.append(r)
            print(row_line(r), flush=True)
        print_details(results)
        passed = sum(not r["missed"] for r in results)
        print(f"\n{passed} of {len(results)} tables met every target")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"targets": {"accuracy_gap": ACCURACY_GAP, "rmse_ratio": RMSE_RATIO,
                                       "wall_limit_s": WALL_LIMIT_S}, "results": results}, f, indent=1)
    finally:
        if not args.workdir_root:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
