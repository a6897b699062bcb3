"""The second day's offline gate: a new export (the candidate) against the version served from the
same model base path (the baseline), both answering the same rows.

The rows are the new data's test split and the test split the baseline was itself judged on,
which every version keeps in `assets.extra/test_data/` (a data directory of one split: its
schema, statistics and records), so that yesterday's rows are still there when today's data
directory has replaced yesterday's. Both models answer through their Example signature
(`classification` or `regression`: serialized tf.Examples, what both a tabular and an image
model take), so each parses the records with its own feature spec; a class answer is the class
name with the highest score, compared with the label by name. What is judged, and how, is
`export/gate.py`; whether the candidate still serves the baseline's clients is
`export/signature_diff.py`.
"""

from __future__ import annotations

import glob
import os
import shutil
from typing import Any, Callable

import numpy as np

from tfpipe.files import write_json
from tfpipe.export.gate import Check, compare, parse_threshold, verdict
from tfpipe.export.signature_diff import breaking_changes
from tfpipe.train.datadir import DataDir, load_data_dir
from tfpipe.train.errors import TrainError

TEST_DATA = os.path.join("assets.extra", "test_data")
CHUNK = 4096  # records per signature call
MAX_ROWS = 200_000  # rows judged per split: enough for a tight bound, and memory stays small


def judged_split(data: DataDir) -> str:
    """The split a version is judged on: test, else eval (as the export's own test record)."""
    return "test" if data.count("test") else "eval"


def keep_test_data(version_dir: str, data: DataDir) -> dict[str, Any]:
    """Copy the split this version is judged on into `version_dir/assets.extra/test_data` as a data
    directory of its own (data.json, schema.json, stats.json and the split's records), for the
    gate of the next version; returns what was kept."""
    split = judged_split(data)
    out = os.path.join(version_dir, TEST_DATA)
    os.makedirs(out, exist_ok=True)
    for name in ("schema.json", "stats.json"):
        shutil.copyfile(os.path.join(data.path, name), os.path.join(out, name))
    manifest = dict(data.manifest)
    entries = manifest["outputs"]["splits"][split]
    for e in entries:
        target = os.path.join(out, e["file"])
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(os.path.join(data.path, e["file"]), target)
    manifest["outputs"] = {**manifest["outputs"], "splits": {split: entries}}
    manifest["counts"] = {**manifest["counts"], "splits": {split: data.count(split)}}
    write_json(os.path.join(out, "data.json"), manifest)
    return {"split": split, "rows": data.count(split), "path": TEST_DATA}


def stored_test_data(version_dir: str) -> DataDir | None:
    """The test split a version kept (None for a version exported before versions kept one)."""
    path = os.path.join(version_dir, TEST_DATA)
    if not os.path.isdir(path):
        return None
    try:
        return load_data_dir(path)
    except TrainError:
        return None


class Answers:
    """A SavedModel's answers through its Example signature: class names, or values."""

    def __init__(self, path: str):
        import tensorflow as tf

        self.path = path
        self.loaded = tf.saved_model.load(path)
        sigs = self.loaded.signatures
        self.task_kind = "classification" if "classification" in sigs else "regression"
        if self.task_kind not in sigs:
            raise ValueError(f"{path} has no classification or regression signature to judge it by")
        self.fn = sigs[self.task_kind]

    def __call__(self, records: list[bytes]) -> np.ndarray:
        import tensorflow as tf

        parts = []
        for i in range(0, len(records), CHUNK):
            out = self.fn(inputs=tf.constant(records[i:i + CHUNK]))
            if self.task_kind == "regression":
                parts.append(out["outputs"].numpy().astype(np.float64).reshape(-1))
            else:
                scores, classes = out["scores"].numpy(), out["classes"].numpy()
                best = scores.argmax(axis=1)
                parts.append(np.array([c.decode() for c in classes[np.arange(len(best)), best]], dtype=object))
        return np.concatenate(parts) if parts else np.zeros(0)


def read_split(data: DataDir, split: str, slices: list[str]) -> tuple[list[bytes], np.ndarray, dict[str, np.ndarray]]:
    """The split's serialized records that have a label, their labels (class names as the model
    names them, or values) and the values of the slice columns (None where missing)."""
    import tensorflow as tf

    label = data.schema.label
    regression = label.task == "regression"
    records, labels, columns = [], [], {c: [] for c in slices}
    for raw in tf.data.TFRecordDataset(data.files(split), compression_type="GZIP").take(MAX_ROWS):
        blob = raw.numpy()
        feature = tf.train.Example.FromString(blob).features.feature
        if data.images:
            index = feature[label.name].int64_list.value
            value = label.classes[index[0]] if index else None
        else:
            value = _value(feature.get(label.name))
        if value is None:
            continue
        records.append(blob)
        labels.append(float(value) if regression else str(value))
        for c in slices:
            columns[c].append(_value(feature.get(c)))
    as_array = np.array(labels, dtype=np.float64 if regression else object)
    return records, as_array, {c: np.array(v, dtype=object) for c, v in columns.items()}


def _value(feature) -> Any:
    """One value of a tf.train.Feature (text decoded), or None when absent or empty."""
    if feature is None:
        return None
    kind = feature.WhichOneof("kind")
    values = getattr(feature, kind).value if kind else []
    if not values:
        return None
    v = values[0]
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else v


def judge(candidate_dir: str, baseline_dir: str, data: DataDir, config, log: Callable[[str], None]) -> dict[str, Any]:
    """The gate's record: the signature differences that would break the baseline's clients, and
    every check (overall and per slice) on the new test split and on the baseline's own test split,
    with the decision: promoted, held or refused, and why."""
    thresholds = [parse_threshold(t) for t in config.thresholds]
    breaks = breaking_changes(baseline_dir, candidate_dir)
    candidate = Answers(candidate_dir)
    try:
        baseline = Answers(baseline_dir)
    except ValueError as e:  # a served version tfpipe did not make: nothing to answer the rows through
        why = f"the served version cannot be judged against: {e}"
        return {"baseline_path": baseline_dir, "data": [], "checks": [], "breaking_changes": [b.text() for b in breaks],
                "passed": False, "failed": [why], "notes": [why], "confidence": config.gate_confidence,
                "thresholds": list(config.thresholds), "slices": list(config.slice)}
    task = data.schema.label.task
    sets = [("new test split", data, judged_split(data))]
    previous = stored_test_data(baseline_dir)
    notes = []
    if previous is None:
        notes.append("the baseline kept no test split (exported before versions kept theirs): judged on the new "
                     "data's alone")
    elif previous.schema.label.task != task:
        notes.append(f"the baseline's test split is a {previous.schema.label.task} task, the candidate's {task}: "
                     "judged on the new data's alone")
    else:
        sets.append(("previous test split", previous, judged_split(previous)))
    checks: list[Check] = []
    summary = []
    for name, source, split in sets:
        records, labels, columns = read_split(source, split, [s for s in config.slice if _has(source, s)])
        if not len(labels):
            notes.append(f"the {name} has no labelled rows")
            continue
        try:
            base = baseline(records)
        except Exception as e:  # the baseline cannot parse these rows (a column retyped): judged on the candidate
            notes.append(f"the baseline cannot answer the {name} ({type(e).__name__}): its value thresholds only")
            base = None
        cand = candidate(records)
        found = compare(name, task, labels, cand, base, thresholds, config.gate_confidence, columns,
                        min_slice_rows=config.slice_min_rows)
        checks.extend(found)
        summary.append({"data": name, "split": split, "rows": int(len(labels))})
    missing = [s for s in config.slice if not any(_has(src, s) for _, src, _ in sets)]
    if missing:
        notes.append(f"no column {', '.join(map(repr, missing))} to slice by")
    passed, failed = verdict(checks)
    return {"baseline_path": baseline_dir, "data": summary, "checks": [c.as_json() for c in checks],
            "breaking_changes": [b.text() for b in breaks], "passed": passed, "failed": failed, "notes": notes,
            "confidence": config.gate_confidence, "thresholds": list(config.thresholds), "slices": list(config.slice)}


def _has(data: DataDir, column: str) -> bool:
    return not data.images and any(f.name == column for f in data.schema.features)


def decide(record: dict[str, Any], config) -> tuple[str, str]:
    """(promoted | passed | held | refused, why) from the gate's record and --promote / --breaking-change;
    passed: the offline gate says yes and a serving gate (--serving-gate) decides."""
    if record["breaking_changes"] and not config.breaking_change:
        return "refused", ("the candidate would break the baseline's clients: " + "; ".join(record["breaking_changes"])
                           + " (--breaking-change to allow it)")
    if config.promote == "never":
        return "held", "--promote never: kept as a candidate for a promotion by hand"
    if not record["passed"]:
        if config.promote == "always":
            return "promoted", "--promote always, though " + "; ".join(record["failed"])
        return "held", "; ".join(record["failed"])
    overall = [c for c in record["checks"] if c["slice"] is None and c["p_value"] is not None]
    figures = "; ".join(f"{c['data']} ({c['rows']:,} rows): {c['metric']} {c['candidate']:.4g} vs "
                        f"{c['baseline']:.4g} served, p={c['p_value']:.2g}" for c in overall)
    why = ("not worse than the served version beyond the noise" + (f" ({figures})" if figures else "")
           + (", and every threshold holds" if record["thresholds"] else ""))
    return ("passed" if config.serving_gate else "promoted"), why


def stored_splits(version_dir: str) -> list[str]:
    """The record files a version kept (for tests and `tfpipe show`)."""
    return sorted(glob.glob(os.path.join(version_dir, TEST_DATA, "**", "*.tfrecord.gz"), recursive=True))


def gate_lines(record: dict[str, Any], baseline: int) -> list[str]:
    """The gate's record as the export's log says it: per data set the two models' metric overall,
    then every failed check, breaking change and note."""
    lines = []
    for c in record["checks"]:
        if c["slice"] is None and c["baseline"] is not None and c["p_value"] is not None:
            lines.append(f"  against version {baseline} on the {c['data']} ({c['rows']:,} rows): {c['metric']} "
                         f"{c['candidate']:.4g} vs {c['baseline']:.4g} (p={c['p_value']:.3g})")
    lines += [f"  failed: {text}" for text in record["failed"]]
    lines += [f"  breaking change: {text}" for text in record["breaking_changes"]]
    lines += [f"  note: {text}" for text in record["notes"]]
    return lines
