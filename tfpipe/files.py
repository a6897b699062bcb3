"""Files as every stage writes them: a directory or a file published atomically and durably,
stale temporary directories of killed runs cleaned up, hashes, cache keys and JSON. A leaf: it
imports only the standard library and the package's version, so that every stage may import it
(docs/architecture.md)."""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from typing import IO, Any

from tfpipe import __version__


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (it may belong to another user)."""
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def digest(payload: Any) -> str:
    """sha256 of the payload as canonical JSON (sorted keys; non-JSON values as str)."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def cache_key(settings: dict[str, Any], inputs: Any) -> str:
    """The one cache key of a stage's output or a run's step: the settings that decide the result,
    what it reads by content (files' sha256, or the keys and hashes of the outputs it reads), and
    tfpipe's version. An output that recorded the key a new run computes is that run's output."""
    return digest({"settings": settings, "inputs": inputs, "tfpipe": __version__})


def file_sha256(path: str) -> str | None:
    """The file's sha256, or None when it cannot be read."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except OSError:
        return None
    return h.hexdigest()


def read_json(path: str) -> Any:
    """A JSON file's content, or None when it is missing or unreadable."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_json(path: str, payload: Any) -> None:
    """Write JSON (indented, keys in the given order) atomically and durably (`write_atomic`)."""
    write_atomic(path, json.dumps(payload, indent=2, default=str) + "\n")


def write_atomic(path: str, content: str | bytes, durable: bool = True) -> None:
    """Replace the file `path` with `content`, whole or not at all (`atomic_file`)."""
    with atomic_file(path, "wb", durable=durable) as f:
        f.write(content.encode() if isinstance(content, str) else content)


@contextlib.contextmanager
def atomic_file(path: str, mode: str = "w", durable: bool = True, **open_args) -> Iterator[IO]:
    """The file `path` written whole or not at all: yields a temporary sibling of the one naming
    scheme (`.NAME.tmp-PID-RANDOM`) open with `mode`; when the block ends normally it is synced and
    renamed over `path`, and the folder synced; when the block raises it is removed and `path` is
    left as it was. A reader sees the old file or the new one, never a part; a crash leaves at most
    the temporary file, which the next write of `path` removes once its process is gone.
    `durable=False` skips the syncs, for files that live no longer than the processes that share
    them (a server's worker group): still whole for their readers, not meant to outlive a crash of
    the machine."""
    tmp = _temp_name(path)
    try:
        with open(tmp, mode, **open_args) as f:
            yield f
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    if durable:
        _sync_dir(os.path.dirname(os.path.abspath(path)))


def _temp_name(out: str) -> str:
    """A new temporary name beside `out`, those of killed processes for the same name removed first."""
    parent, name = os.path.split(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    clean_stale(parent, f".{name}.tmp-")
    return temp_sibling(out)


def temp_sibling(path: str) -> str:
    """The one temporary naming scheme, `.NAME.tmp-PID-RANDOM` beside `path`, a local path or an
    object store's URL (`gs://bucket/runs/data`); only the name: nothing is made or removed."""
    if "://" in path:
        parent, _, name = path.rstrip("/").rpartition("/")
        return f"{parent}/.{name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    parent, name = os.path.split(os.path.abspath(path))
    return os.path.join(parent, f".{name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def resume_dir(out: str, suffix: str = "") -> str:
    """Where a stage that resumes after a kill keeps its work, beside `out`: `.NAME.resume`
    (and `suffix`, one per process of a stage that runs several). Unlike a temporary directory it
    outlives a killed process, for the next run to resume from; the stage publishes it as `out`,
    or removes it, when it ends."""
    parent, name = os.path.split(os.path.abspath(out.rstrip(os.sep)))
    return os.path.join(parent, f".{name}.resume{suffix}")


def writable_dir(path: str) -> str | None:
    """Create the directory `path` if it is missing; None when this process can write in it, else
    why not, in a few words for an error message."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        return f"cannot create it: {e.strerror}"
    return None if os.access(path, os.W_OK) else "not writable by this user"


def temp_dir(out: str) -> str:
    """A new empty directory beside `out` (`.NAME.tmp-PID-RANDOM`) to build it in. Those left
    by runs that were killed (their process is gone) are removed first."""
    tmp = _temp_name(out)
    os.makedirs(tmp)
    return tmp


@contextlib.contextmanager
def publish(out: str) -> Iterator[str]:
    """Build the directory `out` whole or not at all: yields a new temporary sibling
    (`temp_dir`); when the block ends normally it is synced and put in place of `out`
    (`publish_dir`), when it raises it is removed and `out` is left as it was."""
    tmp = temp_dir(out)
    try:
        yield tmp
        publish_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def move(src: str, dst: str) -> None:
    """Rename `src` to `dst` (a path that must not exist) and sync both folders: after it returns
    a crash leaves `dst`, never both or neither."""
    if os.path.lexists(dst):
        raise FileExistsError(f"{dst} already exists")
    os.rename(src, dst)
    for folder in {os.path.dirname(os.path.abspath(src)), os.path.dirname(os.path.abspath(dst))}:
        _sync_dir(folder)


def clean_stale(parent: str, prefix: str) -> list[str]:
    """Remove `parent/PREFIX<pid>-...` directories and files whose process is gone; returns them."""
    removed = []
    for path in glob.glob(os.path.join(glob.escape(parent), glob.escape(prefix) + "*")):
        pid = os.path.basename(path)[len(prefix):].split("-", 1)[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.remove(path)
            removed.append(path)
    return removed


def sync_tree(path: str) -> None:
    """fsync every file and directory under `path`, so that a rename after it publishes data
    that is on disk (a crash cannot leave a published directory with empty files)."""
    for root, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _sync_dir(root)


def publish_dir(tmp: str, out: str) -> None:
    """Put the finished directory `tmp` in place of `out`, durably: synced first, then
    renamed, so a reader sees the old `out` or the new one, never a mix or a partial one."""
    sync_tree(tmp)
    if os.path.exists(out):
        old = f"{out}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        os.rename(out, old)
        os.rename(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, out)
    _sync_dir(os.path.dirname(os.path.abspath(out)))


def _sync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
