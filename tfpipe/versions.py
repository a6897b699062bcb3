"""A model base path's versions and which one serves: the layout every stage, the server's configs
and `tfpipe promote`/`rollback` share. A leaf: it imports only the standard library and
`tfpipe.files`, so that the export (which publishes), the serve room (which writes TF Serving's
configs) and the command line may all import it.

    BASE/NAME/<N>/              versions a server polling the base path may serve; the highest is
                                the one served (TF Serving's default policy, and ours)
    BASE/NAME/candidates/<N>/   versions on disk that no server serves: a candidate the gate held
                                or refused, a version rolled back from (non-numeric: TF Serving
                                passes over the folder)
    BASE/NAME/rollout.jsonl     the history: one JSON line per event (published, promoted, held,
                                refused, rolled back), with the version served before and after

The contract: the version served is the highest numeric directory. Promotion renames a candidate
into the numeric range (and any higher numeric version out of it); a rollback renames the served
version out, so that the one it replaced is the highest again. A server polling the path loads
the version it now wants before it unloads the other (TF Serving's availability-preserving
policy, and the embedded manager's `_settle`): no request fails for the swap. Every change holds
a lock on `BASE/NAME/.rollout.lock`, so two promotions never interleave.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import Any

from tfpipe.files import move

CANDIDATES = "candidates"
HISTORY = "rollout.jsonl"
_LOCK = ".rollout.lock"
CANARY_ROLLED_BACK = "canary rolled back"  # a history event: the canary of a candidate failed its bounds


def candidate_model(name: str) -> str:
    """The model name under which a server serves a candidate beside the served version (a second
    entry of models.config whose base path is BASE/NAME/candidates, with a `specific` policy)."""
    return f"{name}-candidate"


class VersionError(Exception):
    """A promotion or rollback that cannot be done (no such version, nothing to roll back to)."""


def numeric_versions(model_dir: str) -> list[int]:
    """The versions a server polling the base path may serve, in order."""
    try:
        return sorted(int(d) for d in os.listdir(model_dir) if d.isdigit())
    except FileNotFoundError:
        return []


def served(model_dir: str) -> int | None:
    """The version served from this model base path (the highest numeric one), or None."""
    present = numeric_versions(model_dir)
    return present[-1] if present else None


def candidates(model_dir: str) -> list[int]:
    """The versions kept beside the served ones, in `candidates/`, that no server serves."""
    folder = os.path.join(model_dir, CANDIDATES)
    try:
        return sorted(int(d) for d in os.listdir(folder) if d.isdigit())
    except FileNotFoundError:
        return []


def candidate_path(model_dir: str, version: int) -> str:
    return os.path.join(model_dir, CANDIDATES, str(version))


def version_path(model_dir: str, version: int) -> str:
    """Where a version is now: its numeric directory, or its candidate one."""
    numeric = os.path.join(model_dir, str(version))
    if os.path.isdir(numeric):
        return numeric
    candidate = candidate_path(model_dir, version)
    if os.path.isdir(candidate):
        return candidate
    raise VersionError(f"{model_dir} has no version {version} (versions: {_listing(model_dir)})")


def _listing(model_dir: str) -> str:
    served_ = numeric_versions(model_dir)
    held = candidates(model_dir)
    parts = [f"served range {', '.join(map(str, served_))}" if served_ else "none served"]
    if held:
        parts.append(f"candidates {', '.join(map(str, held))}")
    return "; ".join(parts)


def history(model_dir: str) -> list[dict[str, Any]]:
    """Every event recorded for this model, oldest first (a torn last line is passed over)."""
    events = []
    try:
        with open(os.path.join(model_dir, HISTORY), encoding="utf-8") as f:
            for line in f:
                with contextlib.suppress(ValueError):
                    events.append(json.loads(line))
    except FileNotFoundError:
        pass
    return events


def record(model_dir: str, event: str, version: int | None, reason: str, **extra: Any) -> dict[str, Any]:
    """Append one event to the history, synced: `event` (published, promoted, held, refused,
    rolled back), the version it is about, why, and what else the caller knows."""
    entry = {"time": datetime.now(timezone.utc).isoformat(timespec="seconds"), "event": event,
             "version": version, "served": served(model_dir), "reason": reason, **extra}
    path = os.path.join(model_dir, HISTORY)
    with open(path, "ab") as f:
        if f.tell() and _last_byte(path) != b"\n":  # a line a crash cut short ends here, not glued to ours
            f.write(b"\n")
        f.write((json.dumps(entry, default=str) + "\n").encode("utf-8"))
        f.flush()
        os.fsync(f.fileno())
    return entry


def _last_byte(path: str) -> bytes:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1)


@contextlib.contextmanager
def locked(model_dir: str) -> Iterator[None]:
    """Hold the model's rollout lock (one change at a time, across processes)."""
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, _LOCK), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def serve_version(model_dir: str, version: int, event: str, reason: str,
                  prepare: Callable[[int | None, int], None] | None = None, **extra: Any) -> dict[str, Any]:
    """Make `version` the one served: a candidate is renamed into the numeric range, and every
    numeric version above it is renamed out to `candidates/` (kept, promotable again). Records
    `event` with the version served before; returns the entry. Call it holding `locked`.
    `prepare(before, version)` runs once `version` is in the numeric range and before any version
    leaves it (a models.config moved to the new version: rollout/tfserving.py)."""
    before = served(model_dir)
    if version not in numeric_versions(model_dir):
        source = candidate_path(model_dir, version)
        if not os.path.isdir(source):
            raise VersionError(f"{model_dir} has no version {version} (versions: {_listing(model_dir)})")
        move(source, os.path.join(model_dir, str(version)))
        with contextlib.suppress(OSError):  # no candidate left: no empty folder beside the versions
            os.rmdir(os.path.join(model_dir, CANDIDATES))
    if prepare is not None:
        prepare(before, version)
    # The wanted version first, then the higher ones out: a poller between the two renames sees
    # the higher one still (it keeps serving), never no version at all.
    for higher in [v for v in numeric_versions(model_dir) if v > version]:
        os.makedirs(os.path.join(model_dir, CANDIDATES), exist_ok=True)
        move(os.path.join(model_dir, str(higher)), candidate_path(model_dir, higher))
    return record(model_dir, event, version, reason, served_before=before, **extra)


def promote(model_dir: str, version: int | None = None, reason: str = "promoted by hand",
            prepare: Callable[[int | None, int], None] | None = None, **extra: Any) -> dict[str, Any]:
    """Serve `version` (default: the newest candidate); returns the history entry (`prepare`: see
    serve_version; `extra`: recorded with it)."""
    with locked(model_dir):
        if version is None:
            held = candidates(model_dir)
            if not held:
                raise VersionError(f"{model_dir} has no candidate to promote ({_listing(model_dir)})")
            version = held[-1]
        if version == served(model_dir):
            raise VersionError(f"version {version} is already the one served from {model_dir}")
        return serve_version(model_dir, version, "promoted", reason, prepare, **extra)


def previous(model_dir: str) -> int | None:
    """The version served before the one served now (the rollback target): the newest history
    entry that promoted the current version names it (a rollback to it does not: rolling back
    twice goes two versions back, not forth again); without one, the next lower numeric version."""
    now = served(model_dir)
    present = set(numeric_versions(model_dir)) | set(candidates(model_dir))
    for entry in reversed(history(model_dir)):
        if entry.get("event") in ("promoted", "published") and entry.get("version") == now:
            before = entry.get("served_before")
            if before is not None and before != now and before in present:
                return int(before)
            break
    lower = [v for v in numeric_versions(model_dir) if now is not None and v < now]
    return lower[-1] if lower else None


def rollback(model_dir: str, to: int | None = None, reason: str = "rolled back by hand",
             prepare: Callable[[int | None, int], None] | None = None) -> dict[str, Any]:
    """Serve `to` (default: the version served before the current one) in place of the current
    one, which is kept in `candidates/`; returns the history entry (`prepare`: see serve_version)."""
    with locked(model_dir):
        now = served(model_dir)
        if now is None:
            raise VersionError(f"{model_dir} serves no version: nothing to roll back")
        target = previous(model_dir) if to is None else to
        if target is None:
            raise VersionError(f"{model_dir} serves version {now} and has no earlier version to roll back to")
        if target == now:
            raise VersionError(f"version {target} is already the one served from {model_dir}")
        return serve_version(model_dir, target, "rolled back", reason, prepare, rolled_back_from=now)


def canary_rolled_back(model_dir: str) -> set[int]:
    """The candidates a server's canary rolled back (event CANARY_ROLLED_BACK): no server canaries
    or shadows them again. They stay in `candidates/`, and `tfpipe promote` may still serve one."""
    return {int(e["version"]) for e in history(model_dir)
            if e.get("event") == CANARY_ROLLED_BACK and isinstance(e.get("version"), int)}


def protected(model_dir: str) -> set[int]:
    """Versions never pruned: the one served, and the one a rollback would return to."""
    keep = {served(model_dir), previous(model_dir)}
    return {v for v in keep if v is not None}


def prune(model_dir: str, keep: int) -> list[int]:
    """Which versions `--keep N` removes: beyond the newest N of the numeric range, and beyond the
    newest N candidates, but never a protected one. Returns them (the caller removes them)."""
    spare = protected(model_dir)
    old = [v for v in numeric_versions(model_dir)[:-keep] if v not in spare]
    held = [v for v in candidates(model_dir)[:-keep] if v not in spare]
    return sorted(old + held)
