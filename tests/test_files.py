"""tfpipe.files: the publishing, hashing and JSON every stage uses."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

from tfpipe import files


def dead_pid() -> int:
    """The id of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_pid_alive():
    assert files.pid_alive(os.getpid())
    assert not files.pid_alive(dead_pid())


@pytest.mark.parametrize("a,b,same", [
    ({"x": 1, "y": [1, 2]}, {"y": [1, 2], "x": 1}, True),  # key order does not matter
    ({"x": 1}, {"x": 2}, False),
    ({"x": 1.0}, {"x": 1}, False),
    ({"p": "a/b"}, {"p": "a/b"}, True),
])
def test_digest(a, b, same):
    assert (files.digest(a) == files.digest(b)) is same
    assert len(files.digest(a)) == 64


def test_file_sha256_and_json(tmp_path):
    p = tmp_path / "f.json"
    files.write_json(str(p), {"a": 1, "b": [1, 2]})
    assert files.read_json(str(p)) == {"a": 1, "b": [1, 2]}
    assert files.file_sha256(str(p)) == hashlib.sha256(p.read_bytes()).hexdigest()
    assert files.file_sha256(str(tmp_path / "missing")) is None
    assert files.read_json(str(tmp_path / "missing")) is None
    (tmp_path / "bad.json").write_text("{not json")
    assert files.read_json(str(tmp_path / "bad.json")) is None


def test_temp_dir_removes_only_dead_runs_leftovers(tmp_path):
    out = tmp_path / "data"
    dead = tmp_path / f".data.tmp-{dead_pid()}-abcd1234"
    live = tmp_path / f".data.tmp-{os.getpid()}-abcd1234"
    other = tmp_path / f".other.tmp-{dead_pid()}-abcd1234"
    for d in (dead, live, other):
        d.mkdir()
    tmp = files.temp_dir(str(out))
    assert os.path.isdir(tmp) and os.path.basename(tmp).startswith(f".data.tmp-{os.getpid()}-")
    assert not dead.exists() and live.exists() and other.exists()


@pytest.mark.parametrize("existing", [False, True])
def test_publish_dir_replaces_the_output_whole(tmp_path, existing):
    out = tmp_path / "out"
    if existing:
        out.mkdir()
        (out / "old.txt").write_text("old")
    tmp = files.temp_dir(str(out))
    with open(os.path.join(tmp, "new.txt"), "w") as f:
        f.write("new")
    files.publish_dir(tmp, str(out))
    assert sorted(os.listdir(out)) == ["new.txt"]
    assert not os.path.exists(tmp)
    assert [p for p in os.listdir(tmp_path) if p != "out"] == []  # no temp or old directory left


@pytest.mark.parametrize("path, prefix", [
    ("/work/runs/data", "/work/runs/.data.tmp-{pid}-"),
    ("/work/runs/data/", "/work/runs/.data.tmp-{pid}-"),
    ("gs://bucket/runs/data", "gs://bucket/runs/.data.tmp-{pid}-"),
    ("s3://bucket/runs/data/", "s3://bucket/runs/.data.tmp-{pid}-"),
])
def test_one_temporary_naming_scheme_for_local_paths_and_object_stores(path, prefix):
    name = files.temp_sibling(path)
    assert name.startswith(prefix.format(pid=os.getpid())) and len(name) == len(prefix.format(pid=os.getpid())) + 8
    assert files.temp_sibling(path) != name  # a new one each time


@pytest.mark.parametrize("durable", [True, False])
def test_atomic_file_is_written_whole_or_not_at_all(tmp_path, durable):
    path = tmp_path / "table.csv"
    path.write_text("old\n")
    with pytest.raises(ValueError):
        with files.atomic_file(str(path), "w", durable=durable) as f:
            f.write("half")
            raise ValueError("the writer failed")
    assert path.read_text() == "old\n" and os.listdir(tmp_path) == ["table.csv"]  # no temporary file left
    with files.atomic_file(str(path), "w", durable=durable, newline="") as f:
        f.write("new\r\n")
    assert path.read_bytes() == b"new\r\n" and os.listdir(tmp_path) == ["table.csv"]
