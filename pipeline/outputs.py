"""What both data jobs (rows and images) read back and publish after their Beam pipeline: the
work units' summaries, per-split statistics and dead-letter files, the counts checked, data.json
written, the temporary output directory published atomically (locally or on a remote
filesystem), and the stage's result."""

from __future__ import annotations

import json
import os
import shutil
import time
from datetime import datetime, timezone
from typing import Callable

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from tfpipe import __version__
from tfpipe.files import publish_dir, temp_dir, temp_sibling
from tfpipe.pipeline.errors import DataError
from tfpipe.pipeline.inputs import is_remote
from tfpipe.stage import DataOutputs, StageResult


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


def result(out: str) -> StageResult:
    """The data stage's output: its counts in one line, its fingerprint."""
    m = read_data_manifest(out)
    if m is None:
        raise DataError(f"{out} holds no data.json: not a data stage's output")
    c = m["counts"]
    noun = "images" if m.get("kind") == "images" else "rows"
    summary = (f"{c['read']:,} {noun} -> " + ", ".join(f"{k} {v:,}" for k, v in c["splits"].items())
               + (f"; {c['unlabelled']:,} unlabelled set aside" if c.get("unlabelled") else "")
               + f"; {c['bad']:,} dead-lettered")
    return StageResult(FileSystems.join(out, "data.json"), summary, DataOutputs(out, m["fingerprint"]),
                       notes=tuple(m.get("notices") or ()))
