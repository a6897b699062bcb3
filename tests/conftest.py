from __future__ import annotations

import glob
import json
import os
import re
import socket
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHICAGO = os.path.join(ROOT, "examples", "data", "chicago_taxi", "data.csv")  # shipped with the project


@pytest.fixture(scope="session")
def penguins_csv() -> str:
    import palmerpenguins

    return os.path.join(os.path.dirname(palmerpenguins.__file__), "data", "penguins.csv")


@pytest.fixture(scope="session")
def chicago_csv() -> str:
    assert os.path.exists(CHICAGO), f"the Chicago taxi sample ships with the project at {CHICAGO}"
    return CHICAGO


def free_port() -> int:
    """A port on 127.0.0.1 that the OS has just handed out (for command lines that name one)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `tfpipe` as a user would, in a fresh process."""
    return subprocess.run([sys.executable, "-m", "tfpipe.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, stdin=subprocess.DEVNULL)


def read_split(out: str, split: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Read a split back with tf.data; returns {column: (values, present)} from schema.json."""
    import tensorflow as tf

    schema = json.load(open(os.path.join(out, "schema.json")))
    dtypes = {"int": tf.int64, "float": tf.float32, "string": tf.string}
    columns = [*schema["features"], {"name": schema["label"]["name"], "type": schema["label"]["type"]}]
    spec = {c["name"]: tf.io.VarLenFeature(dtypes[c["type"]]) for c in columns}
    files = sorted(glob.glob(os.path.join(out, f"{split}-*.tfrecord.gz")))
    ds = tf.data.TFRecordDataset(files, compression_type="GZIP").batch(4096).map(
        lambda batch: tf.io.parse_example(batch, spec))
    parts: dict[str, list] = {c["name"]: [] for c in columns}
    for batch in ds:
        for c in columns:
            sparse = batch[c["name"]]
            n = int(sparse.dense_shape[0])
            present = np.zeros(n, dtype=bool)
            present[sparse.indices[:, 0].numpy()] = True
            default = b"" if c["type"] == "string" else 0
            dense = tf.sparse.to_dense(sparse, default_value=default).numpy()
            values = dense[:, 0] if dense.shape[1] else np.full(n, default)
            parts[c["name"]].append((values, present))
    out_cols = {}
    for name, chunks in parts.items():
        if chunks:
            out_cols[name] = (np.concatenate([v for v, _ in chunks]), np.concatenate([p for _, p in chunks]))
        else:
            out_cols[name] = (np.zeros(0), np.zeros(0, dtype=bool))
    return out_cols


def raw_records(out: str, split: str) -> list[bytes]:
    """The serialized Examples of a split, in file order."""
    import tensorflow as tf

    files = sorted(glob.glob(os.path.join(out, f"{split}-*.tfrecord.gz")))
    return [r.numpy() for r in tf.data.TFRecordDataset(files, compression_type="GZIP")]


@pytest.fixture(scope="session")
def penguins_trained(tmp_path_factory, penguins_csv) -> tuple[str, str]:
    """(data dir, train dir) of a penguins model trained through the CLI; shared by stages' tests."""
    from tfpipe.pipeline.config import DataConfig
    from tfpipe.pipeline.job import run as run_data

    root = tmp_path_factory.mktemp("trained")
    data = run_data(DataConfig(input=[penguins_csv], label="species", out=str(root / "data")), log=lambda _: None)
    res = run_cli("train", "--data", data, "--out", str(root / "train"), "--epochs", "20")
    assert res.returncode == 0, res.stderr
    return data, str(root / "train")



def pytest_configure(config) -> None:
    """Refuse to run where `--dist loadgroup` would not group. pytest-xdist tags a grouped test's
    node id with `@GROUP`; with pytest 9.2 and pytest-xdist 3.8 the tag no longer takes
    (pytest-dev/pytest-xdist#1386) and every test is dealt out on its own. The grouped files'
    session fixtures (servers, whole runs) are then built once per worker: the suite passes, a
    minute slower, and nobody notices."""
    from importlib.metadata import version

    def release(name: str) -> tuple[int, ...]:
        return tuple(int(p) for p in re.findall(r"\d+", version(name))[:2])

    if hasattr(config, "workerinput") or config.getoption("dist", "no") != "loadgroup":
        return
    if release("pytest") >= (9, 2) and release("pytest-xdist") <= (3, 8):
        raise pytest.UsageError(
            f"pytest {version('pytest')} with pytest-xdist {version('pytest-xdist')} ignores --dist loadgroup "
            "(pytest-dev/pytest-xdist#1386): install the dev extras' pytest (pip install -e '.[dev]'), "
            "or run with -n 0")
