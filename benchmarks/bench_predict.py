"""Batch inference (`tfpipe predict`) against the other ways to score a file, on the Chicago taxi model.

    python benchmarks/bench_predict.py [--rows 100000,1000000,3000000] [--server-seconds 5]
    python benchmarks/bench_predict.py --engines .venv-predict [--rows 1000000]

The model is bench_serve.py's (.bench/export/models/taxi, made by bench_export.py when missing);
the input, the shipped taxi sample's 15,002 rows repeated to each --rows count as a CSV (cached in
.bench/predict/). For each size, measured one after the other on this machine:

  * tfpipe predict (FnApiRunner, its own defaults: one worker per core on inputs over 16 MB,
    model calls of the size each worker measures as it loads the model), Parquet output;
  * a plain loop: pandas reads the CSV 1,024 rows at a time and each chunk goes to the same
    SavedModel's serving_default, loaded with tf.saved_model.load (what a user writes by hand);
  * at 1,000,000 rows, Beam's own TFModelHandlerTensor in RunInference, as a user would build
    it on FnApiRunner with one worker per core: it does not load the SavedModel (Keras 3's
    load_model refuses the directory; what it says is printed), so it loads the Keras model file
    training wrote, each CSV line parsed into a row of named values and each batch Beam makes
    called as a dict of tensors;

each as its own process: wall seconds, rows/s, CPU seconds of the process and its children, and
peak resident memory (the sum over the process tree, sampled every 0.1 s). Then the embedded
server with batching on (max_batch_size 32, 2 ms), wrk posting one row per REST request from 32
and 64 connections: its best rows/s and its CPU seconds per row. Printed: predict's rows/s per
CPU second against the server's and against the loop's (goals: at least 5x the server,
at least 0.8x the loop, memory flat as the input grows), and against Beam's handler.

With --engines ENV (the environment `bash engines/setup.sh --predict` makes: Beam 2.62,
TensorFlow 2.20), instead: `tfpipe predict` run with that environment's Python on FnApiRunner,
Flink ([local], parallelism 2) and Spark (local[2]), each in a network namespace of its own with
only loopback up (the job servers listen on every interface): start-up, the wall seconds of a
1,000-row file (the job server, the workers and the model load, with almost nothing to score),
and the rows/s of each --rows size.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

WORK = os.path.join(ROOT, ".bench", "predict")
TAXI = os.path.join(ROOT, "examples", "data", "chicago_taxi", "data.csv")

LOOP = r'''
import os, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import numpy as np, pandas as pd, tensorflow as tf
version, path = sys.argv[1], sys.argv[2]
fn = tf.saved_model.load(version).signatures["serving_default"]
_, specs = fn.structured_input_signature
rows = 0
for chunk in pd.read_csv(path, chunksize=1024):
    inputs = {}
    for name, spec in specs.items():
        column = chunk[name]
        if spec.dtype == tf.string:
            inputs[name] = tf.constant(column.fillna("").astype(str).to_numpy(dtype=object))
        else:
            inputs[name] = tf.constant(column.to_numpy(dtype=spec.dtype.as_numpy_dtype, na_value=np.nan)
                                       if spec.dtype.is_floating else column.to_numpy(dtype=spec.dtype.as_numpy_dtype))
    out = fn(**inputs)
    rows += len(chunk)
print("rows", rows)
'''


def input_csv(rows: int) -> str:
    """The taxi sample's rows repeated to `rows` data rows (cached)."""
    os.makedirs(WORK, exist_ok=True)
    path = os.path.join(WORK, f"taxi-{rows}.csv")
    if not os.path.exists(path):
        with open(TAXI) as f:
            header, *body = f.read().splitlines()
        with open(path + ".part", "w") as f:
            f.write(header + "\n")
            for i in range(rows):
                f.write(body[i % len(body)] + "\n")
        os.replace(path + ".part", path)
    return path


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants (psutil finds them by parent, whichever
    thread started them: Beam's runner starts its worker processes from a thread of its own)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:  # ended between the listing and the reading
            pass
    return total


def measured_run(cmd: list[str]) -> dict:
    """Runs `cmd` to its end: wall seconds, CPU seconds (it and its children), peak tree RSS."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak = [0]
    done = threading.Event()

    def sample():
        while not done.wait(0.1):
            peak[0] = max(peak[0], tree_rss(proc.pid))
    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    out = proc.communicate()[0]
    done.set()
    watcher.join()
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{out[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "peak_rss_mb": peak[0] / 2**20, "output": out}


def server_rows_per_s(version: str, seconds: float, tmp: str) -> dict:
    """The embedded server with batching on: its best REST rows/s over 32 and 64 connections, one
    row per request (its warmup records' rows), and its CPU seconds per row there."""
    from bench_serve import measured, payloads, rest_body, rest_client, serve

    body = rest_body(payloads(version)[0])
    proc, _, rest = serve(version, batching=True, tmp=tmp)
    try:
        best = None
        for clients in (32, 64):
            def run(warm: bool, clients=clients):
                return rest_client(rest, "/v1/models/taxi:predict", body, clients, 1.0 if warm else seconds, tmp)
            n, p99, client, cpu_us, _ = measured(proc.pid, run)
            figure = {"clients": clients, "rows_per_s": n / seconds, "cpu_s_per_row": cpu_us / 1e6, "p99_ms": p99}
            print(f"  server, {clients} connections: {figure['rows_per_s']:,.0f} rows/s, "
                  f"{cpu_us:,.0f} us CPU a row, p99 {p99:.1f} ms ({client})", flush=True)
            if best is None or figure["rows_per_s"] > best["rows_per_s"]:
                best = figure
        return best
    finally:
        proc.terminate()
        proc.wait(30)


BEAM_HANDLER = r'''
import csv, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import numpy as np, tensorflow as tf, keras
import apache_beam as beam
from apache_beam.ml.inference import utils
from apache_beam.ml.inference.base import RunInference
from apache_beam.ml.inference.tensorflow_inference import TFModelHandlerTensor
from apache_beam.options.pipeline_options import PipelineOptions
import tfpipe.train.model  # noqa: F401 (the model's own layers, registered with Keras)

keras_file, path = sys.argv[1], sys.argv[2]
with open(path) as f:
    header = next(csv.reader(f))
inputs = {i.name: i.dtype for i in keras.models.load_model(keras_file).inputs}
at = {name: header.index(name) for name in inputs}
# the model's own layers, by reference: a worker that unpickles the handler imports their module
mine = {k: v for k, v in keras.saving.get_custom_objects().items() if k.startswith("tfpipe>")}

def parse(line):
    fields = next(csv.reader([line]))
    return {k: (fields[i] if inputs[k] == "string" else float(fields[i]) if fields[i] else np.nan)
            for k, i in at.items()}

def columns(model, batch, inference_args, model_id=None):
    tensors = {k: tf.constant([row[k] for row in batch], dtype=inputs[k]) for k in inputs}
    return utils._convert_to_result(batch, model(tensors), model_id)

with beam.Pipeline(options=PipelineOptions(["--runner=apache_beam.runners.portability.fn_api_runner.FnApiRunner",
                                            "--direct_num_workers=2", "--direct_running_mode=multi_processing"])) as p:
    (p | beam.io.ReadFromText(path, skip_header_lines=1) | beam.Map(parse)
       | RunInference(TFModelHandlerTensor(keras_file, inference_fn=columns, load_model_args={"custom_objects": mine}))
       | beam.combiners.Count.Globally() | beam.Map(lambda n: print("rows", n, flush=True)))
'''


def beam_handler(version: str) -> tuple[list[str], str]:
    """Beam's own TFModelHandlerTensor, as a user would run it: on the SavedModel (what it says),
    and on the Keras model file training wrote (its command, to be measured). Its module imports
    tensorflow_hub, which under Keras 3 imports tf_keras (and pkg_resources): installed for it alone, without
    their dependencies, into .bench/predict/beam-handler (on PYTHONPATH for its process only)."""
    target = os.path.join(WORK, "beam-handler")
    if not os.path.isdir(os.path.join(target, "tensorflow_hub")):
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", target,
                        "tensorflow-hub==0.16.*", "tf-keras==2.21.*", "setuptools<81"], check=True)
    env = {**os.environ, "PYTHONPATH": target}
    code = ("from apache_beam.ml.inference.tensorflow_inference import TFModelHandlerTensor\n"
            f"TFModelHandlerTensor(model_uri={version!r}).load_model()\nprint('loaded')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    said = "loads" if r.returncode == 0 else \
        "fails: " + [line for line in r.stderr.strip().splitlines() if line.strip()][-1][:300]
    keras_file = os.path.join(ROOT, ".bench", "export", "train-256,128", "model.keras")
    return ["env", f"PYTHONPATH={env['PYTHONPATH']}", sys.executable, "-c", BEAM_HANDLER, keras_file], said


ENGINES = {"FnApiRunner": [],
           "Flink": ["--runner", "FlinkRunner", "--flink_master=[local]", "--parallelism=2"],
           "Spark": ["--runner", "SparkRunner", "--spark_master_url=local[2]"]}


def engines(env: str, base: str, sizes: list[int]) -> None:
    """tfpipe predict in the predict environment `env` on each engine (see the module's doc)."""
    python = os.path.join(os.path.abspath(env), "bin", "python")
    tf_version = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('tensorflow'), "
                                 "m.version('apache-beam'))"], capture_output=True, text=True, check=True).stdout
    print(f"predict environment {env}: TensorFlow {tf_version.split()[0]}, Beam {tf_version.split()[1]}")
    with tempfile.TemporaryDirectory() as tmp:
        for engine, options in ENGINES.items():
            for rows in [1000, *sizes]:
                out = os.path.join(tmp, f"{engine}-{rows}")
                cmd = [python, "-m", "tfpipe.cli", "predict", "--model", base, "--input", input_csv(rows),
                       "--out", out, *options]
                f = measured_run(["unshare", "--net", "--map-root-user", "bash", "-c",
                                  'ip link set lo up && exec "$@"', "_", *cmd])
                manifest = json.load(open(os.path.join(out, "predict.json")))
                assert manifest["counts"]["read"] == rows, manifest["counts"]
                what = "start-up" if rows == 1000 else f"{rows / f['wall_s']:9,.0f} rows/s"
                print(f"  {engine:<11} {rows:>9,} rows: {f['wall_s']:6.1f} s ({what}), {f['cpu_s']:6.1f} CPU s, "
                      f"{manifest['beam']['workers']} worker(s), {manifest['beam']['units']} work unit(s), "
                      f"peak RSS {f['peak_rss_mb']:7,.0f} MB", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="100000,1000000,3000000",
                    help="input sizes; the goals are judged at 1,000,000 rows (or the largest), memory over all")
    ap.add_argument("--server-seconds", type=float, default=5.0)
    ap.add_argument("--engines", metavar="ENV", help="measure FnApiRunner, Flink and Spark in this predict "
                                                     "environment (engines/setup.sh --predict) instead")
    args = ap.parse_args()
    from bench_serve import model_dir

    version = model_dir()
    base = os.path.dirname(version)
    print(f"model: {version}")
    if args.engines:
        engines(args.engines, base, [int(r) for r in args.rows.split(",")])
        return
    figures = {}
    sizes = [int(r) for r in args.rows.split(",")]
    judged = 1_000_000 if 1_000_000 in sizes else max(sizes)
    beam_cmd, beam_on_savedmodel = beam_handler(version)
    with tempfile.TemporaryDirectory() as tmp:
        for rows in sizes:
            path = input_csv(rows)
            out = os.path.join(tmp, f"scored-{rows}")
            p = measured_run([sys.executable, "-m", "tfpipe.cli", "predict", "--model", base, "--input", path,
                              "--out", out])
            manifest = json.load(open(os.path.join(out, "predict.json")))
            assert manifest["counts"]["read"] == rows, manifest["counts"]
            loop = measured_run([sys.executable, "-c", LOOP, version, path])
            assert f"rows {rows}" in loop["output"], loop["output"][-500:]
            figures[rows] = {"predict": p, "loop": loop, "workers": manifest["beam"]["workers"],
                             "batch_rows": manifest["batch_rows"]}
            runs = [("tfpipe predict", p), ("plain loop", loop)]
            if rows == judged:
                beam_run = measured_run(beam_cmd + [path])
                assert f"rows {rows}" in beam_run["output"], beam_run["output"][-500:]
                figures[rows]["beam"] = beam_run
                runs.append(("Beam's handler", beam_run))
            for name, f in runs:
                print(f"  {rows:>9,} rows, {name:<14}: {f['wall_s']:6.1f} s, {rows / f['wall_s']:9,.0f} rows/s, "
                      f"{f['cpu_s']:6.1f} CPU s ({rows / f['cpu_s']:9,.0f} rows per CPU s), "
                      f"peak RSS {f['peak_rss_mb']:7,.0f} MB", flush=True)
        server = server_rows_per_s(version, args.server_seconds, tmp)
    print(f"  Beam's TFModelHandlerTensor on the SavedModel: {beam_on_savedmodel}")
    p, loop = figures[judged]["predict"], figures[judged]["loop"]
    per_cpu = judged / p["cpu_s"]
    server_per_cpu = 1 / server["cpu_s_per_row"]
    print(f"\n{judged:,} rows: tfpipe predict {judged / p['wall_s']:,.0f} rows/s on {figures[judged]['workers']} "
          f"worker(s), model calls of {' and '.join(f'{b:,}' for b in figures[judged]['batch_rows'])} rows")
    print(f"  rows per CPU second: predict {per_cpu:,.0f}, server (batching on, best of 32/64 connections: "
          f"{server['rows_per_s']:,.0f} rows/s) {server_per_cpu:,.0f}: {per_cpu / server_per_cpu:.1f}x (goal >= 5x)")
    print(f"  against the plain loop: {(judged / p['wall_s']) / (judged / loop['wall_s']):.2f}x its rows/s, "
          f"{per_cpu / (judged / loop['cpu_s']):.2f}x its rows per CPU second (goal >= 0.8x)")
    beam_run = figures[judged]["beam"]
    print(f"  against Beam's TFModelHandlerTensor on the Keras model: {beam_run['wall_s'] / p['wall_s']:.2f}x its rows/s, "
          f"{beam_run['cpu_s'] / p['cpu_s']:.2f}x its rows per CPU second")
    print("  peak RSS (goal: flat as the rows grow): " + ", ".join(
        f"{rows:,} rows {f['predict']['peak_rss_mb']:,.0f} MB ({f['workers']} worker(s))"
        for rows, f in sorted(figures.items())))

if __name__ == "__main__":
    main()
