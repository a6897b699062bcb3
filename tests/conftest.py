from __future__ import annotations

import atexit
import contextlib
import fcntl
import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import select
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

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


def _port_slice() -> range:
    """This worker's own ports, below the kernel's ephemeral range.

    A port the OS hands out for bind(0) comes from the range outgoing connections also draw
    from, so between closing it and the server binding it, any client socket on the machine
    could take it (CI saw exactly that: "address already in use"). Ports below the range are
    never taken that way; each xdist worker gets its own slice, starting at a random offset so
    that two test runs at once on a shared machine rarely meet, and none is handed out twice."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    worker = re.sub(r"\D", "", os.environ.get("PYTEST_XDIST_WORKER", "")) or "0"
    size = 1500
    start = low - size * (int(worker) % 8 + 1)
    return range(max(start, 1024), max(start + size, 1024))


_PORTS: list[int] = []


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on, for command lines that must name one.

    Taken from this worker's slice below the ephemeral range (see _port_slice), checked by
    binding it, and never handed out twice in a session."""
    if not _PORTS:
        ports = list(_port_slice())
        if not ports:  # an unusual kernel range: fall back to the OS's choice
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                return s.getsockname()[1]
        cut = int.from_bytes(os.urandom(2), "big") % len(ports)
        _PORTS.extend(reversed(ports[cut:] + ports[:cut]))
    while _PORTS:
        port = _PORTS.pop()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("this test worker has used every port in its slice")


def run_cli(*args: str, timeout: float = 300, fresh: bool = False) -> subprocess.CompletedProcess:
    """Run `tfpipe ARGS` as a user would, in a new process, and collect its exit code and output.

    The process is forked from this worker's CLI host (`tests/cli_host.py`), which has imported
    TensorFlow once; `fresh=True` starts `python -m tfpipe.cli` from nothing instead."""
    if fresh:
        return subprocess.run([sys.executable, "-m", "tfpipe.cli", *args], capture_output=True, text=True,
                              timeout=timeout, cwd=ROOT, stdin=subprocess.DEVNULL)
    proc = spawn_cli(*args)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


# Read when a process starts (glibc, the loader, the interpreter, TensorFlow's import), so a
# child forked from the host would not see a new value: such commands get a fresh interpreter.
_READ_AT_START = re.compile(r"^(MALLOC_|LD_|PYTHON|TF_(?!CONFIG$))")


def spawn_cli(*args: str, env: dict[str, str] | None = None, stdout=subprocess.PIPE,
              stderr=subprocess.PIPE, start_new_session: bool = False) -> "HostedProcess | subprocess.Popen":
    """Start `tfpipe ARGS` like `subprocess.Popen([python, -m, tfpipe.cli, ...], text=True)`:
    forked from the CLI host, or a fresh interpreter when `env` changes what a process reads
    at its start. `stdout`/`stderr` take PIPE, STDOUT (stderr only), DEVNULL or a file;
    `start_new_session`: the process leads a session and process group of its own (its pid)."""
    if args and args[0] == "serve" and not any(a.startswith("--workers") for a in args):
        # one process per test server (a test about workers says --workers=N): the default, one per
        # core, would multiply the suite's memory and start-up time on a machine with more cores
        args = (*args, "--workers=1")
    env = dict(os.environ if env is None else env)
    changed = {k for k in set(env) | set(os.environ) if env.get(k) != os.environ.get(k)}
    if any(_READ_AT_START.match(k) for k in changed):
        return subprocess.Popen([sys.executable, "-m", "tfpipe.cli", *args], cwd=ROOT, env=env, text=True,
                                stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                                start_new_session=start_new_session)
    return HostedProcess(list(args), env, stdout, stderr, start_new_session)


def spawn_script(script: str, *args: str, stdout=subprocess.PIPE, stderr=subprocess.PIPE) -> HostedProcess:
    """`python SCRIPT ARGS` (a test helper that imports tfpipe's stages), forked from the CLI host as
    `spawn_cli` forks a command, so that it does not import TensorFlow again."""
    return HostedProcess(list(args), dict(os.environ), stdout, stderr, script=script)


class ServerOutput:
    """Every line a server process prints, kept as it comes, and waits for lines it prints (the
    signals a test waits on, rather than a fixed time)."""

    def __init__(self, stream):
        self.lines: list[str] = []
        self.closed = False
        self._changed = threading.Condition()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream) -> None:
        for line in stream:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self.closed = True
            self._changed.notify_all()

    def mark(self) -> int:
        """Where the lines printed from now on start (for `after`)."""
        with self._changed:
            return len(self.lines)

    def wait_for(self, pattern: str, timeout: float = 120, after: int = 0, count: int = 1) -> list[re.Match]:
        """The first `count` lines from index `after` on that match `pattern` (re.search), once the
        server has printed them; AssertionError with what it printed if it has not within `timeout`
        seconds, or has exited."""
        deadline = time.time() + timeout
        with self._changed:
            while True:
                found = [m for m in map(re.compile(pattern).search, self.lines[after:]) if m]
                if len(found) >= count:
                    return found[:count]
                left = deadline - time.time()
                if self.closed or left <= 0:
                    raise AssertionError(f"no {count} line(s) matching {pattern!r} "
                                         f"({'the server exited' if self.closed else f'in {timeout:g} s'}); "
                                         "it printed:\n" + "\n".join(self.lines[-60:]))
                self._changed.wait(min(left, 1.0))


def start_cli_server(*flags: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, int, int]:
    """`tfpipe serve` in a subprocess on free ports (-1), which it prints as TF Serving does. The
    process's `output` (a ServerOutput) holds what it prints."""
    proc = spawn_cli("serve", "--host=127.0.0.1", "--port=-1", "--rest_api_port=-1", *flags,
                     env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    proc.output = ServerOutput(proc.stdout)
    try:
        ports = {m[1]: int(m[2]) for m in proc.output.wait_for(r"(gRPC ModelServer|HTTP/REST API) at:?\s*[\d.]+:(\d+)",
                                                               count=2)}
    except AssertionError as e:
        proc.kill()
        raise AssertionError(f"server did not start: {e}") from None
    return proc, ports["gRPC ModelServer"], ports["HTTP/REST API"]


def skew_after(proc, workdir: str, prefix: str, out: str) -> tuple[subprocess.CompletedProcess, dict]:
    """Stop a server started with request logging (SIGTERM drains and flushes its log), then run
    `tfpipe skew` on what it logged against the training split of WORKDIR/data: the process and
    skew.json."""
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    res = run_cli("skew", "--data", os.path.join(workdir, "data"), "--logs", prefix, "--out", out)
    path = os.path.join(out, "skew.json")
    return res, (json.load(open(path)) if os.path.exists(path) else {})


def skew_of_predictions(workdir: str, model: str, rows: list[dict],
                        tmp_path) -> tuple[subprocess.CompletedProcess, dict]:
    """WORKDIR's exported MODEL served with request logging, ROWS sent to its REST :predict ten at a
    time (each answered 200), then `skew_after`."""
    import requests

    prefix = str(tmp_path / "logs" / model)
    proc, _, rest_port = start_cli_server(f"--model_name={model}", f"--model_base_path={workdir}/export/models/{model}",
                                          f"--request_log_prefix={prefix}")
    try:
        for i in range(0, len(rows), 10):
            r = requests.post(f"http://127.0.0.1:{rest_port}/v1/models/{model}:predict",
                              json={"instances": rows[i:i + 10]}, timeout=30)
            assert r.status_code == 200, r.text
    finally:
        result = skew_after(proc, workdir, prefix, str(tmp_path / "skew"))
    return result


class HostedProcess:
    """A `tfpipe` process forked by the CLI host, with the parts of Popen's interface the tests use."""

    def __init__(self, argv: list[str], env: dict[str, str], stdout, stderr, start_new_session: bool = False,
                 script: str | None = None):
        self.args = [sys.executable, *([script] if script else ["-m", "tfpipe.cli"]), *argv]
        self.returncode: int | None = None
        self.stdout = self.stderr = None
        ends, to_close = [], []
        for which, target in enumerate((stdout, stderr)):
            if which == 1 and target == subprocess.STDOUT:
                ends.append(ends[0])
            elif target == subprocess.PIPE:
                read, write = os.pipe()
                ends.append(write)
                to_close.append(write)
                pipe = open(read, "r", encoding="utf-8", errors="replace")
                if which == 0:
                    self.stdout = pipe
                else:
                    self.stderr = pipe
            elif target == subprocess.DEVNULL or target is None:
                fd = os.open(os.devnull, os.O_WRONLY)
                ends.append(fd)
                to_close.append(fd)
            else:
                ends.append(target.fileno() if hasattr(target, "fileno") else target)
        body = json.dumps({"argv": argv, "cwd": ROOT, "env": env, "new_session": start_new_session,
                           "script": script}).encode()
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._conn.connect(_cli_host().path)
            socket.send_fds(self._conn, [len(body).to_bytes(8, "big")], ends)
            self._conn.sendall(body)
        finally:
            for fd in to_close:
                os.close(fd)
        self._answers = self._conn.makefile("rb")
        self.pid = json.loads(self._answers.readline())["pid"]

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._conn], [], [], 0)[0]:
            self._finish()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self._conn], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._finish()
        return self.returncode

    def _finish(self) -> None:
        line = self._answers.readline()
        if not line:
            raise RuntimeError(f"the CLI host's waiter for {self.args[3:]} died: see {_cli_host().log}")
        self.returncode = json.loads(line)["returncode"]
        self._answers.close()
        self._conn.close()

    def communicate(self, timeout: float | None = None) -> tuple[str | None, str | None]:
        """Read the pipes to their end (each on its own thread, so neither can fill up), then wait."""
        found: dict[str, str] = {}
        readers = [threading.Thread(target=lambda n=name, f=f: found.__setitem__(n, f.read()), daemon=True)
                   for name, f in (("out", self.stdout), ("err", self.stderr)) if f is not None]
        for t in readers:
            t.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in readers:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return found.get("out"), found.get("err")

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


@dataclass
class _Host:
    proc: subprocess.Popen
    folder: str
    path: str
    log: str


_host: _Host | None = None


def _cli_host() -> _Host:
    """This process's CLI host, started on first use and stopped when the process exits."""
    global _host
    if _host is None or _host.proc.poll() is not None:
        folder = tempfile.mkdtemp(prefix="tfpipe-cli-host-")
        path, log = os.path.join(folder, "host.sock"), os.path.join(folder, "host.log")
        with open(log, "w") as log_file:
            proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "cli_host.py"), path], cwd=ROOT,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log_file, text=True)
        if proc.stdout.readline().strip() != "ready":
            proc.kill()
            raise RuntimeError(f"the CLI host did not start:\n{open(log).read()[-3000:]}")
        _host = _Host(proc, folder, path, log)
        atexit.register(_stop_host, _host)
    return _host


def _stop_host(host: _Host) -> None:
    host.proc.terminate()
    try:
        host.proc.wait(10)
    except subprocess.TimeoutExpired:
        host.proc.kill()
    shutil.rmtree(host.folder, ignore_errors=True)


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


def backup_epoch(out) -> int:
    """The last epoch `tfpipe train --out OUT`'s BackupAndRestore has saved (0: none yet)."""
    path = os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.resume", "backup",
                        "training_metadata.json")
    try:
        with open(path) as f:
            return json.load(f)["epoch"]
    except (OSError, ValueError, KeyError):
        return 0


def kill_after_epochs(proc, out, epochs: int, timeout: float = 120) -> int:
    """SIGKILL a running `tfpipe train --out OUT` once `epochs` epochs are backed up; returns
    the epoch its backup holds."""
    deadline = time.time() + timeout
    while backup_epoch(out) < epochs and time.time() < deadline:
        assert proc.poll() is None, "the training ended before it could be killed"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return backup_epoch(out)


def built_once(tmp_path_factory, name: str, build: Callable[[Path], Any]) -> Any:
    """`build(folder)`'s result, built by whichever xdist worker asks first; the other workers wait
    for it and reuse the same files (session fixtures are otherwise built once per worker).
    The result must be JSON: it is kept beside the folder."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's temporary root, shared by the workers
    folder, done = root / f"built-{name}", root / f"built-{name}.json"
    with open(root / f"built-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return json.loads(done.read_text())
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        result = build(folder)
        done.write_text(json.dumps(result))
        return result


@pytest.fixture(scope="session")
def penguins_data(tmp_path_factory, penguins_csv) -> str:
    """The penguins CSV through the data stage, 2 shards per split (the multi-worker test reads
    one shard per worker)."""
    def build(folder: Path) -> str:
        from tfpipe.pipeline.config import DataConfig
        from tfpipe.pipeline.job import run

        return run(DataConfig(input=[penguins_csv], label="species", out=str(folder / "data"), shards=2),
                   log=lambda _: None).outputs.path

    return built_once(tmp_path_factory, "penguins-data", build)


@pytest.fixture(scope="session")
def penguins_trained(tmp_path_factory, penguins_data) -> tuple[str, str]:
    """(data dir, train dir) of a penguins model trained through the CLI; shared by stages' tests."""
    def build(folder: Path) -> list[str]:
        res = run_cli("train", "--data", penguins_data, "--out", str(folder / "train"), "--epochs", "20",
                      "--learning-rate", "0.01")  # test accuracy 0.98-1.0 (0.89-0.96 at the default 1e-3)
        assert res.returncode == 0, res.stderr
        return [penguins_data, str(folder / "train")]

    return tuple(built_once(tmp_path_factory, "penguins-trained", build))


@pytest.fixture(scope="session")
def first_export(tmp_path_factory, penguins_trained) -> str:
    """A base path after the first SavedModel-only export of the suite's penguins model (BASE/penguins,
    version 1), made once for both workers and only read: a test that exports again or changes it
    works on its own copy."""
    def build(folder: Path) -> str:
        data, train = penguins_trained
        res = run_cli("export", "--model", train, "--data", data, "--base", str(folder), "--name", "penguins",
                      "--tflite", "")
        assert res.returncode == 0, res.stderr
        return str(folder)

    return built_once(tmp_path_factory, "penguins-first-export", build)


KEYWORD_HEADER = ["from", "class", "lambda", "wind speed", "Sepal.Length", "day", "import", "label"]


def keyword_table(path: str, rows: int = 200) -> str:
    """A CSV whose headers are Python keywords, with a space and with a dot. The label is "hi" when
    `Sepal.Length` is over 5 or `import` is True (pandas' spelling of a boolean, every fourth row);
    `from` a category (shop), `day` a date (every 17th one missing), the others numbers and a
    second category."""
    import csv
    import datetime

    start = datetime.date(2020, 1, 1)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(KEYWORD_HEADER)
        for i in range(rows):
            x = (i * 37 % 100) / 10
            day = (start + datetime.timedelta(days=i * 3)).isoformat() if i % 17 else ""
            flag = i % 4 == 1
            w.writerow([["north", "south", "east"][i % 3], ["a", "b"][i % 2], i % 7, round(x * 1.5, 2), x, day,
                        str(flag), "hi" if x > 5 or flag else "lo"])
    return path


@pytest.fixture(scope="session")
def keyword_model(tmp_path_factory) -> str:
    """keyword_table's 200 rows through data, train and export (in-process): the model base path
    (BASE/kw, version 1)."""
    def build(folder: Path) -> str:
        from tfpipe.export.config import ExportConfig
        from tfpipe.export.job import run as export
        from tfpipe.pipeline.config import DataConfig
        from tfpipe.pipeline.job import run as data_stage
        from tfpipe.train.config import TrainConfig
        from tfpipe.train.job import run as train

        quiet = lambda _: None  # noqa: E731
        data = data_stage(DataConfig(input=[keyword_table(str(folder / "t.csv"))], label="label",
                                     out=str(folder / "data")), log=quiet).outputs.path
        model = train(TrainConfig(data=data, out=str(folder / "train"), epochs=20, learning_rate=0.05),
                      log=quiet).outputs.path
        export(ExportConfig(model=model, data=data, base=str(folder / "models"), name="kw", tflite=""), log=quiet)
        return str(folder / "models" / "kw")

    return built_once(tmp_path_factory, "keyword-model", build)


def _compile_the_project() -> None:
    """Write the bytecode of tfpipe's own modules (and the tests' helpers) before any test process
    starts, even where PYTHONDONTWRITEBYTECODE is set, as many container images set it. Without it
    every interpreter the suite starts (servers, worker pools, the load generator, Beam's workers)
    compiles the same modules again. The folders are the wheel's package-dir table in
    pyproject.toml."""
    import compileall
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        folders = tomllib.load(f)["tool"]["setuptools"]["package-dir"].values()
    for folder in [*folders, "tests"]:
        compileall.compile_dir(os.path.join(ROOT, folder), quiet=1)


def rewritten_test_modules() -> list[Path]:
    """The modules of this folder whose asserts pytest rewrites: the test files and this one."""
    return [p for p in sorted(Path(ROOT, "tests").glob("*.py")) if p.name.startswith("test_") or p.name == "conftest.py"]


def _rewrite_the_tests(config) -> None:
    """Write pytest's assertion-rewritten bytecode of the test modules, as `_compile_the_project`
    writes the project's: each worker would otherwise rewrite every test module itself (seconds of
    CPU before its first test, where PYTHONDONTWRITEBYTECODE keeps pytest from caching them). The
    functions are pytest's own, not its public API: where they change, nothing is written and the
    workers rewrite as before (tests/test_imports.py then fails, naming the modules)."""
    from _pytest.assertion.rewrite import _rewrite_test, _write_pyc, assertstate_key, get_cache_dir, PYC_TAIL

    state = config.stash[assertstate_key]
    for path in rewritten_test_modules():
        cache = get_cache_dir(path)
        cache.mkdir(exist_ok=True)
        source_stat, code = _rewrite_test(path, config)
        _write_pyc(state, code, source_stat, cache / (path.name[:-3] + PYC_TAIL))


def pytest_configure(config) -> None:
    """Write the project's bytecode (`_compile_the_project`) and the tests' rewritten bytecode
    (`_rewrite_the_tests`), once, in the process that starts the workers. Then refuse to run where
    `--dist loadgroup` would not group. pytest-xdist tags a grouped test's node id with `@GROUP`;
    with pytest 9.2 and pytest-xdist 3.8 the tag no longer takes (pytest-dev/pytest-xdist#1386) and
    every test is dealt out on its own. The grouped files' session fixtures (servers, whole runs)
    are then built once per worker: the suite passes, a minute slower, and nobody notices."""
    from importlib.metadata import version

    if not hasattr(config, "workerinput"):
        _compile_the_project()
        if config.getoption("assertmode") == "rewrite":
            with contextlib.suppress(ImportError, AttributeError, KeyError, TypeError):
                _rewrite_the_tests(config)

    def release(name: str) -> tuple[int, ...]:
        return tuple(int(p) for p in re.findall(r"\d+", version(name))[:2])

    if hasattr(config, "workerinput") or config.getoption("dist", "no") != "loadgroup":
        return
    if release("pytest") >= (9, 2) and release("pytest-xdist") <= (3, 8):
        raise pytest.UsageError(
            f"pytest {version('pytest')} with pytest-xdist {version('pytest-xdist')} ignores --dist loadgroup "
            "(pytest-dev/pytest-xdist#1386): install the dev extras' pytest (pip install -e '.[dev]'), "
            "or run with -n 0")
