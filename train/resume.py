"""A killed `tfpipe train` resumed: the run works in `.NAME.resume` beside --out
(`tfpipe.files.resume_dir`), kept while its key (the settings a resume may reuse, the data's
fingerprint) matches; a backup the kill cut short gives way to the one before it, metrics.jsonl is
trimmed to the epoch the backup restores, and the directory is published as --out at the end."""

from __future__ import annotations

import json
import os
import shutil
from typing import Callable

from tfpipe.files import cache_key, publish_dir, read_json, resume_dir, write_json
from tfpipe.train.config import TrainConfig
from tfpipe.train.datadir import DataDir


def work_dir(out: str, config: TrainConfig, data: DataDir, worker: int, log: Callable[[str], None]) -> str:
    """The run's work directory (one per worker of a multi-worker run): kept, with its backup
    repaired and its metrics trimmed, when its key matches this run's; made anew otherwise."""
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    work = resume_dir(out, f"-worker{worker}" if worker else "")
    key = cache_key(config.resume_fields(), {"data": data.manifest["fingerprint"]})  # what a resume may reuse
    marker = os.path.join(work, "resume.json")
    if read_json(marker) != {"key": key}:
        shutil.rmtree(work, ignore_errors=True)  # another model or data: nothing to resume
        os.makedirs(os.path.join(work, "checkpoints"))
        write_json(marker, {"key": key})
    else:
        repair_backup(os.path.join(work, "backup"), log)
        if os.path.exists(os.path.join(work, "metrics.jsonl")):
            _trim_metrics(work)
    return work


def repair_backup(backup: str, log: Callable[[str], None]) -> None:
    """A backup a killed run left half-written gives way to the one before it (`NAME.bkp`, kept
    by double_checkpoint), so that the resume and metrics.jsonl's trim agree on the epoch; with
    no earlier one, the backup goes and training starts over. Both cases are said."""
    from tfpipe.train.multiworker import BACKUP_META, BACKUP_WEIGHTS  # BackupAndRestore's names

    weights, meta = os.path.join(backup, BACKUP_WEIGHTS), os.path.join(backup, BACKUP_META)
    if not os.path.exists(meta) or _readable(weights, meta):
        return
    if _readable(weights + ".bkp", meta + ".bkp"):
        for path in (weights, meta):
            shutil.copyfile(path + ".bkp", path)
        log(f"the last backup in {backup} was cut short (the run was killed while writing it): "
            "resuming from the one before")
    else:
        shutil.rmtree(backup, ignore_errors=True)
        log(f"the backup in {backup} was cut short and no earlier one is kept: training starts over")


def _readable(weights: str, meta: str) -> bool:
    """Whether a weights file opens as HDF5 and its metadata parses as JSON."""
    import h5py

    try:
        with h5py.File(weights, "r"):
            pass
        with open(meta) as f:
            int(json.load(f)["epoch"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return True


def _trim_metrics(work: str) -> None:
    """Keep metrics.jsonl in step with the backup: drop epochs after the one it restores."""
    last = resumed_epoch(work) or 0
    path = os.path.join(work, "metrics.jsonl")
    rows = [json.loads(line) for line in open(path) if line.strip()]
    with open(path, "w") as f:
        for r in rows:
            if r["epoch"] <= last:
                f.write(json.dumps(r) + "\n")


def resumed_epoch(work: str) -> int | None:
    meta = read_json(os.path.join(work, "backup", "training_metadata.json"))
    return int(meta["epoch"]) if meta else None


def publish_work(work: str, out: str) -> None:
    """The finished run's directory published as --out, its resume marker removed first: a
    published output is nothing to resume."""
    os.remove(os.path.join(work, "resume.json"))
    publish_dir(work, out)
