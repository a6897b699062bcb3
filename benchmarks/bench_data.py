"""Benchmark `tfpipe data` against a plain single-process CSV -> TFRecord loop, in one run.

    python benchmarks/bench_data.py                 # 1M rows (generated once into .bench/)
    python benchmarks/bench_data.py --rows 1000000 3000000
    python benchmarks/bench_data.py --images 20000      # labelled 64x64 JPEGs instead of rows
    python benchmarks/bench_data.py --runner FlinkRunner  # an engine against FnApiRunner (engine environment)

For each size it generates a CSV with 20 mixed columns, then runs, each as a subprocess
whose whole process tree is sampled for memory:
  * tfpipe data (FnApiRunner, 2 workers): validation, dead-letter, hash split, stats and
    sharded gzip TFRecords;
  * the plain loop: csv.reader -> typed values -> tf.train.Example filled in place ->
    tf.io.TFRecordWriter(GZIP), one file, no validation, split or stats.
It prints rows/s, MB/s written, peak RSS and the speed ratio (tfpipe / plain).

With --runner FlinkRunner or SparkRunner (in the engine environment, engines/setup.sh, inside a
network namespace: see docs/benchmarks.md) it runs `tfpipe data` on the same CSV with that engine
and with FnApiRunner, at parallelism 1 and 2 and the same shard count, and each once more on 1,000
rows for the fixed start-up cost; it prints rows/s, the start-up seconds, and the peak RSS of the
Java job server and of the Python side (launcher and workers, which LOOPBACK keeps in one process).

With --images N it generates N 64x64 JPEGs of shapes on textured backgrounds in four class
folders, and compares `tfpipe data --format images` (every image decoded and checked, hash
split, dead-letter, statistics, sharded gzip TFRecords) with a plain loop that reads each
file, decodes it with Pillow and writes a tf.train.Example with the same keys to one GZIP
TFRecord file.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import psutil  # the engine environment has it only when installed for this script: pip install psutil

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# 20 columns: 8 float, 6 int, 5 string, 1 binary label.
FLOATS = [f"f{i}" for i in range(8)]
INTS = [f"i{i}" for i in range(6)]
STRINGS = [f"s{i}" for i in range(5)]
COLUMNS = FLOATS + INTS + STRINGS + ["label"]


def generate(path: str, rows: int, seed: int = 0) -> None:
    """Write a CSV with realistic mixes: gaps in some floats, wide and narrow ints, categories."""
    rng = np.random.default_rng(seed)
    cards = [3, 12, 50, 400, 5000]
    vocab = [[f"cat{c}_{j}" for j in range(card)] for c, card in enumerate(cards)]
    tmp = path + ".part"
    with open(tmp, "w") as f:
        f.write(",".join(COLUMNS) + "\n")
        step = 100_000
        for start in range(0, rows, step):
            n = min(step, rows - start)
            cols = []
            for i in range(8):
                v = np.round(rng.normal(i * 10, 3 + i, n), 4).astype(str)
                if i % 3 == 0:
                    v[rng.random(n) < 0.05] = ""  # 5% missing
                cols.append(v)
            ranges = [24, 7, 100, 10_000, 1_000_000, 2_000_000_000]
            cols += [rng.integers(0, r, n).astype(str) for r in ranges]
            for c, card in enumerate(cards):
                cols.append(np.array(vocab[c], dtype=object)[rng.zipf(1.3, n) % card])
            cols.append((rng.random(n) < 0.3).astype(int).astype(str))
            f.write("\n".join(",".join(row) for row in zip(*cols)) + "\n")
    os.replace(tmp, path)


PLAIN_LOOP = r'''
import csv, sys, time
import tensorflow as tf
src, dst = sys.argv[1], sys.argv[2]
floats, ints = set(sys.argv[3].split(",")), set(sys.argv[4].split(","))
t = time.perf_counter()
with open(src, newline="") as f, tf.io.TFRecordWriter(dst, options="GZIP") as w:
    reader = csv.reader(f)
    header = next(reader)
    kinds = ["f" if h in floats else "i" if h in ints else "s" for h in header]
    n = 0
    for row in reader:
        ex = tf.train.Example()
        feature = ex.features.feature
        for name, kind, v in zip(header, kinds, row):
            if v == "":
                continue
            if kind == "f":
                feature[name].float_list.value.append(float(v))
            elif kind == "i":
                feature[name].int64_list.value.append(int(v))
            else:
                feature[name].bytes_list.value.append(v.encode())
        w.write(ex.SerializeToString())
        n += 1
print(n, time.perf_counter() - t)
'''


PLAIN_IMAGE_LOOP = r'''
import io, os, sys, time
import tensorflow as tf
from PIL import Image
src, dst = sys.argv[1], sys.argv[2]
t = time.perf_counter()
classes = sorted(os.listdir(src))
n = 0
with tf.io.TFRecordWriter(dst, options="GZIP") as w:
    for label, name in enumerate(classes):
        folder = os.path.join(src, name)
        for fname in sorted(os.listdir(folder)):
            data = open(os.path.join(folder, fname), "rb").read()
            image = Image.open(io.BytesIO(data))
            image.load()
            ex = tf.train.Example()
            f = ex.features.feature
            f["image/encoded"].bytes_list.value.append(data)
            f["image/format"].bytes_list.value.append(image.format.lower().encode())
            f["image/height"].int64_list.value.append(image.height)
            f["image/width"].int64_list.value.append(image.width)
            f["image/class/label"].int64_list.value.append(label)
            f["image/class/text"].bytes_list.value.append(name.encode())
            w.write(ex.SerializeToString())
            n += 1
print(n, time.perf_counter() - t)
'''

CLASSES = ("circle", "square", "stripes", "noise")


def generate_images(root: str, n: int, size: int = 64, seed: int = 0) -> None:
    """N JPEGs in four class folders: a shape (or pattern) over a random texture."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    tmp = root + ".part"
    shutil.rmtree(tmp, ignore_errors=True)
    for c in CLASSES:
        os.makedirs(os.path.join(tmp, c))
    for i in range(n):
        c = CLASSES[i % len(CLASSES)]
        base = rng.integers(0, 256, 3)
        pixels = np.clip(base + rng.normal(0, 25, (size, size, 3)), 0, 255).astype(np.uint8)
        image = Image.fromarray(pixels)
        draw = ImageDraw.Draw(image)
        color = tuple(int(v) for v in rng.integers(0, 256, 3))
        a, b = sorted(rng.integers(4, size - 4, 2))
        if c == "circle":
            draw.ellipse([a, a, b + 4, b + 4], fill=color)
        elif c == "square":
            draw.rectangle([a, a, b + 4, b + 4], fill=color)
        elif c == "stripes":
            for x in range(0, size, 8):
                draw.rectangle([x, 0, x + 3, size], fill=color)
        image.save(os.path.join(tmp, c, f"{i:07d}.jpg"), quality=90)
    os.replace(tmp, root)


def image_data_dir(n: int, size: int = 64) -> str:
    """N generated JPEGs of SIZExSIZE through `tfpipe data --format images`, both kept in .bench
    (bench_train.py, bench_export.py and bench_serve.py --images start from this)."""
    from tfpipe.pipeline.config import DataConfig
    from tfpipe.pipeline.job import run

    src = os.path.join(ROOT, ".bench", f"images-{n}" + (f"-{size}px" if size != 64 else ""))
    out = src + "-data"
    if not os.path.exists(src):
        generate_images(src, n, size=size)
    if not os.path.exists(os.path.join(out, "data.json")):
        run(DataConfig(input=[src], format="images", out=out), log=lambda _: None)
    return out


def bench_images(n: int, workdir: str, workers: int) -> dict:
    src = os.path.join(workdir, f"images-{n}")
    if not os.path.exists(src):
        print(f"generating {src} ...", flush=True)
        generate_images(src, n)
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(src) for f in fs)
    out = os.path.join(workdir, f"out-images-{n}")
    shutil.rmtree(out, ignore_errors=True)
    t_beam, rss_beam, log = measure([sys.executable, "-m", "tfpipe.cli", "data", "--format", "images", "--input", src,
                                     "--out", out, "--force", f"--direct_num_workers={workers}",
                                     "--direct_running_mode=multi_processing"])
    plain_out = os.path.join(workdir, f"plain-images-{n}.tfrecord.gz")
    t_plain, rss_plain, plain_log = measure([sys.executable, "-c", PLAIN_IMAGE_LOOP, src, plain_out])
    assert int(plain_log.split()[-2]) == n, plain_log
    return {"images": n, "input_mb": size / 1e6, "beam_s": t_beam, "plain_s": t_plain,
            "beam_rss_mb": rss_beam / 2**20, "plain_rss_mb": rss_plain / 2**20, "ratio": t_plain / t_beam,
            "beam_log_tail": "\n".join(log.strip().splitlines()[-8:])}


def measure(cmd: list[str], split_java: bool = False, also: tuple[int, ...] = ()):
    """Run a command; return (wall seconds, peak RSS of its process tree in bytes, stdout), or with
    `split_java` (wall seconds, peak RSS of its Java processes, of the others, stdout). The trees
    of the processes `also` names (a worker pool) count as the command's; `measure.cpu_seconds`
    is then the CPU time of all of them."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    root = psutil.Process(proc.pid)
    peak = peak_java = peak_other = 0
    cpu: dict[int, float] = {}  # the last CPU seconds (user + system) seen of each process of the tree
    output: list[str] = []
    import threading

    reader = threading.Thread(target=lambda: output.extend(proc.stdout), daemon=True)
    reader.start()
    while proc.poll() is None:
        java = other = 0
        try:
            extra = [psutil.Process(pid) for pid in also]
            for p in [root, *root.children(recursive=True), *extra, *(c for e in extra for c in e.children(True))]:
                try:
                    rss = p.memory_info().rss
                    times = p.cpu_times()
                    cpu[p.pid] = times.user + times.system
                    if p.name() == "java":
                        java += rss
                    else:
                        other += rss
                except psutil.Error:
                    pass
        except psutil.Error:
            pass
        peak, peak_java, peak_other = max(peak, java + other), max(peak_java, java), max(peak_other, other)
        time.sleep(0.05)
    elapsed = time.perf_counter() - start
    reader.join()
    out = "".join(output)
    if proc.returncode != 0:
        sys.exit(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{out}")
    measure.cpu_seconds = sum(cpu.values())
    return (elapsed, peak_java, peak_other, out) if split_java else (elapsed, peak, out)


ENGINE_OPTIONS = {
    "FnApiRunner": lambda p: [f"--direct_num_workers={p}", "--direct_running_mode=multi_processing"] if p > 1 else
    ["--direct_num_workers=1"],
    # --sdk_worker_parallelism: one SDK worker (a process, with EXTERNAL) per task slot; Beam's
    # default is one per task manager, which all slots share
    "FlinkRunner": lambda p: ["--runner=FlinkRunner", "--flink_master=[local]", f"--parallelism={p}",
                              f"--sdk_worker_parallelism={p}"],
    "SparkRunner": lambda p: ["--runner=SparkRunner", f"--spark_master_url=local[{p}]", f"--sdk_worker_parallelism={p}"],
}


class WorkerPool:
    """Beam's Python worker pool as a process of its own (EXTERNAL): each worker a process, where
    LOOPBACK runs them all as threads of the submitting process."""

    def __enter__(self):
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
        self.proc = subprocess.Popen([sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main",
                                      f"--service_port={self.port}"], env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        import grpc

        with grpc.insecure_channel(f"localhost:{self.port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=60)
        return self

    def options(self) -> list[str]:
        return ["--environment_type=EXTERNAL", f"--environment_config=localhost:{self.port}"]

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait()


def bench_engine(runner: str, rows: int, workdir: str, shards: int, repeat: int) -> list[dict]:
    """`tfpipe data` on `runner` (its workers in the submitting process, LOOPBACK, and in a worker
    pool, EXTERNAL) and on FnApiRunner, parallelism 1 and 2, on `rows` rows and on 1,000 (the fixed
    cost); the same shard count everywhere; `repeat` rounds, the runners taking turns."""
    results = []
    for n in (1000, rows):
        path = os.path.join(workdir, f"bench-{n}.csv")
        if not os.path.exists(path):
            print(f"generating {path} ...", flush=True)
            generate(path, n)
    for _ in range(repeat):
        for parallelism in (1, 2):
            for name, pool in (("FnApiRunner", False), (runner, False), (runner, True)):
                row = {"runner": name, "parallelism": parallelism, "workers": "EXTERNAL" if pool else "LOOPBACK"}
                for n, key in ((1000, "startup"), (rows, "full")):
                    out = os.path.join(workdir, f"out-{name}-{parallelism}-{n}")
                    shutil.rmtree(out, ignore_errors=True)
                    cmd = [sys.executable, "-m", "tfpipe.cli", "data", "--input",
                           os.path.join(workdir, f"bench-{n}.csv"), "--label", "label", "--out", out, "--force",
                           "--shards", str(shards), *ENGINE_OPTIONS[name](parallelism)]
                    if pool:
                        with WorkerPool() as workers:
                            seconds, java, other, log = measure(cmd + workers.options(), split_java=True,
                                                                also=(workers.proc.pid,))
                    else:
                        seconds, java, other, log = measure(cmd, split_java=True)
                    row[key] = {"s": seconds, "cpu_s": measure.cpu_seconds, "java_mb": java / 2**20,
                                "python_mb": other / 2**20}
                    shutil.rmtree(out, ignore_errors=True)
                full, startup = row["full"], row["startup"]
                label = name if name == "FnApiRunner" else f"{name} {row['workers']}"
                print(f"{label:>21} p={parallelism}: {rows:,} rows {full['s']:6.1f} s, "
                      f"{rows / full['s']:>7,.0f} rows/s, {full['cpu_s']:5.1f} CPU s; 1,000 rows {startup['s']:5.1f} s; "
                      f"peak RSS job server {full['java_mb']:4.0f} MB, Python {full['python_mb']:4.0f} MB; "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)
                results.append(row)
    return results


def bench(rows: int, workdir: str, workers: int) -> dict:
    csv_path = os.path.join(workdir, f"bench-{rows}.csv")
    if not os.path.exists(csv_path):
        print(f"generating {csv_path} ...", flush=True)
        generate(csv_path, rows)
    size = os.path.getsize(csv_path)
    out = os.path.join(workdir, f"out-{rows}")
    shutil.rmtree(out, ignore_errors=True)
    tfpipe = [sys.executable, "-m", "tfpipe.cli", "data", "--input", csv_path, "--label", "label",
              "--out", out, "--force", f"--direct_num_workers={workers}",
              "--direct_running_mode=multi_processing"]
    t_beam, rss_beam, log = measure(tfpipe)
    written_beam = sum(os.path.getsize(p) for p in glob.glob(os.path.join(out, "*.tfrecord.gz")))
    plain_out = os.path.join(workdir, f"plain-{rows}.tfrecord.gz")
    t_plain, rss_plain, plain_log = measure(
        [sys.executable, "-c", PLAIN_LOOP, csv_path, plain_out, ",".join(FLOATS), ",".join(INTS + ["label"])])
    written_plain = os.path.getsize(plain_out)
    n_plain = int(plain_log.split()[-2])
    assert n_plain == rows, plain_log
    return {
        "rows": rows, "input_mb": size / 1e6,
        "beam_s": t_beam, "beam_rows_s": rows / t_beam, "beam_mb_s": written_beam / 1e6 / t_beam,
        "beam_rss_mb": rss_beam / 2**20,
        "plain_s": t_plain, "plain_rows_s": rows / t_plain, "plain_mb_s": written_plain / 1e6 / t_plain,
        "plain_rss_mb": rss_plain / 2**20,
        "ratio": t_plain / t_beam,
        "beam_log_tail": "\n".join(log.strip().splitlines()[-8:]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1_000_000])
    ap.add_argument("--images", type=int, nargs="+", help="benchmark labelled images (this many) instead of rows")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--workdir", default=os.path.join(ROOT, ".bench"))
    ap.add_argument("--runner", choices=["FlinkRunner", "SparkRunner"],
                    help="compare this engine with FnApiRunner (in the engine environment)")
    ap.add_argument("--shards", type=int, default=8, help="with --runner: shards (work units) per split")
    ap.add_argument("--repeat", type=int, default=1, help="with --runner: rounds, the runners taking turns")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    if args.runner:
        bench_engine(args.runner, args.rows[0], args.workdir, args.shards, args.repeat)
        return
    if args.images:
        for r in [bench_images(n, args.workdir, args.workers) for n in args.images]:
            print(f"\n--- {r['images']:,} images, {r['input_mb']:.0f} MB of JPEG ---\n{r['beam_log_tail']}")
            for who, name in (("beam", "tfpipe"), ("plain", "plain")):
                print(f"{r['images']:>8,} {name:>6} {r[who + '_s']:>7.1f} s {r['images'] / r[who + '_s']:>8,.0f} images/s"
                      f" peak RSS {r[who + '_rss_mb']:>5.0f} MB")
            print(f"{'':>8} ratio tfpipe/plain (speed): {r['ratio']:.2f}x")
        return
    results = [bench(n, args.workdir, args.workers) for n in args.rows]
    for r in results:
        print(f"\n--- {r['rows']:,} rows, {r['input_mb']:.0f} MB CSV ---\n{r['beam_log_tail']}")
    print(f"\n{'rows':>10} {'':>6} {'seconds':>8} {'rows/s':>9} {'MB/s out':>8} {'peak RSS':>9}")
    for r in results:
        for who in ("beam", "plain"):
            name = "tfpipe" if who == "beam" else "plain"
            print(f"{r['rows']:>10,} {name:>6} {r[who + '_s']:>8.1f} {r[who + '_rows_s']:>9,.0f} "
                  f"{r[who + '_mb_s']:>8.1f} {r[who + '_rss_mb']:>7.0f}MB")
        print(f"{'':>10} ratio tfpipe/plain (speed): {r['ratio']:.2f}x")
    if len(results) > 1:
        a, b = results[0], results[-1]
        print(f"\npeak RSS of tfpipe at {b['rows']:,} vs {a['rows']:,} rows: "
              f"{b['beam_rss_mb']:.0f} MB vs {a['beam_rss_mb']:.0f} MB ({b['beam_rss_mb'] / a['beam_rss_mb']:.2f}x "
              f"for {b['rows'] / a['rows']:.0f}x the rows)")


if __name__ == "__main__":
    main()
