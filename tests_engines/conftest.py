"""What the engine tests share: the inputs and the reference outputs tests_engines/run.sh made
(the reference with FnApiRunner in the main environment: Beam 2.77 beside TensorFlow), running
`tfpipe data` as a user does, and comparing two data dirs."""

from __future__ import annotations

import collections
import gzip
import json
import os
import struct
import subprocess
import sys

import pytest

INPUTS = os.environ.get("TFPIPE_ENGINE_INPUTS", "")
REFERENCE = os.environ.get("TFPIPE_ENGINE_REFERENCE", "")
# the options tests_engines/run.sh gave the reference runs
TAXI_ARGS = os.environ.get("TFPIPE_ENGINE_TAXI_ARGS", "").split()
IMAGE_ARGS = os.environ.get("TFPIPE_ENGINE_IMAGE_ARGS", "").split()


@pytest.fixture(scope="session")
def inputs() -> str:
    assert os.path.isdir(INPUTS) and os.path.isdir(REFERENCE), "run the engine tests with tests_engines/run.sh"
    return INPUTS


def tfpipe(command: str, *args: str, python: str = sys.executable, env: dict | None = None, timeout: float = 600,
           cwd: str | None = None) -> subprocess.CompletedProcess:
    """`tfpipe COMMAND ARGS` as a user runs it, with `python`'s environment (this one by default),
    which must succeed; `cwd` away from the repository for workers that must not find its tfpipe/
    folder on their path."""
    res = subprocess.run([python, "-m", "tfpipe.cli", command, *args], capture_output=True, text=True,
                         timeout=timeout, stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})}, cwd=cwd)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res


def tfpipe_data(*args: str, **options) -> subprocess.CompletedProcess:
    return tfpipe("data", *args, **options)


def records(path: str) -> list[bytes]:
    """The records of one gzip TFRecord file (length, its CRC, data, its CRC), without TensorFlow."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    out, at = [], 0
    while at < len(data):
        (length,) = struct.unpack_from("<Q", data, at)
        out.append(data[at + 12: at + 12 + length])
        at += 12 + length + 4
    return out


def contents(data_dir: str) -> dict:
    """What must not depend on the runner: each split's records as a multiset of serialized
    Examples, the dead-letter rows as a multiset, schema.json and stats.json as bytes, and
    data.json's counts."""
    with open(os.path.join(data_dir, "data.json")) as f:
        manifest = json.load(f)
    splits = {name: collections.Counter(r for f in files for r in records(os.path.join(data_dir, f["file"])))
              for name, files in manifest["outputs"]["splits"].items()}
    dead = collections.Counter()
    for name in manifest["outputs"]["deadletter"]:
        with open(os.path.join(data_dir, name), encoding="utf-8") as f:
            dead.update(f.read().splitlines())
    with open(os.path.join(data_dir, "schema.json"), "rb") as f:
        schema = f.read()
    with open(os.path.join(data_dir, "stats.json"), "rb") as f:
        stats = f.read()
    return {"splits": splits, "deadletter": dead, "schema": schema, "stats": stats, "counts": manifest["counts"]}


def assert_same_output(got_dir: str, want_dir: str) -> dict:
    got, want = contents(got_dir), contents(want_dir)
    for name in want["splits"]:
        assert got["splits"][name] == want["splits"][name], f"split {name} differs"
    assert got["deadletter"] == want["deadletter"], "dead-letter rows differ"
    assert got["schema"] == want["schema"], "schema.json differs"
    assert got["counts"] == want["counts"], (got["counts"], want["counts"])
    assert got["stats"] == want["stats"], "stats.json differs"
    assert sum(want["deadletter"].values()) > 0 and all(want["splits"].values())  # the comparison compared something
    with open(os.path.join(got_dir, "data.json")) as f:
        return json.load(f)
