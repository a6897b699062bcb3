"""What a column costs the server: REST throughput and server CPU per request for models of 10, 100
and 300 numeric columns, measured side by side in one run.

    python benchmarks/bench_columns.py [--columns 10,100,300] [--seconds 5] [--rounds 3] [--clients 8]

Each table (cached in .bench/columns/): 2,000 synthetic rows of N float columns named as R data
frames name them (`x.c0`, `x.c1`, ...: TensorFlow renames such a signature argument to x_c0), a
binary label from a linear combination of them, through `tfpipe data`, `tfpipe train --epochs 3`
and `tfpipe export --tflite ''`. One server process per model (`tfpipe serve`, batching off, one
worker), all started before the first round; the rounds take them in turn (10, 100, 300, 10, ...)
so that the machine's drift meets every model alike. Each measurement is a warm-up second, then
wrk (`apt-get install wrk`) posting one row a request from --clients connections for --seconds:
answers per second, p99, and the server process's CPU time (from /proc) per answer. Printed per
model: the medians over rounds; and against the first (narrowest) model the ratios of throughput
and of CPU per request, beside the ratio of the request bodies' bytes. The goal: the
300-column model's throughput within 3x of the 10-column model's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from bench_serve import measured, rest_client, start  # noqa: E402

WORK = os.path.join(ROOT, ".bench", "columns")
ROWS = 2000


def tfpipe(*args: str) -> None:
    r = subprocess.run([sys.executable, "-m", "tfpipe.cli", *args], cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"tfpipe {' '.join(args)} failed ({r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}")


def build(columns: int) -> tuple[str, dict]:
    """The model base path of the N-column model (built when missing), and one row to send."""
    import numpy as np

    folder = os.path.join(WORK, str(columns))
    base = os.path.join(folder, "models")
    rng = np.random.default_rng(columns)
    names = [f"x.c{i}" for i in range(columns)]
    x = rng.normal(0, 1, (ROWS, columns))
    row = {n: round(float(v), 4) for n, v in zip(names, x[0])}
    if not os.path.isdir(os.path.join(base, "wide", "1")):
        os.makedirs(folder, exist_ok=True)
        y = (x @ rng.normal(0, 1, columns) > 0).astype(int)
        csv = os.path.join(folder, "table.csv")
        with open(csv, "w") as f:
            f.write(",".join(names + ["label"]) + "\n")
            for values, label in zip(x, y):
                f.write(",".join(f"{v:.4f}" for v in values) + f",{'yes' if label else 'no'}\n")
        data, train = os.path.join(folder, "data"), os.path.join(folder, "train")
        tfpipe("data", "--input", csv, "--label", "label", "--out", data)
        tfpipe("train", "--data", data, "--out", train, "--epochs", "3")
        tfpipe("export", "--model", train, "--data", data, "--base", base, "--name", "wide", "--tflite", "")
    return os.path.join(base, "wide"), row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--columns", default="10,100,300")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=8)
    args = ap.parse_args()
    widths = [int(c) for c in args.columns.split(",")]
    models = {c: build(c) for c in widths}
    servers = {}
    try:
        for c, (base, _) in models.items():
            proc, ports = start([sys.executable, "-m", "tfpipe.cli", "serve", "--host=127.0.0.1", "--port=-1",
                                 "--rest_api_port=-1", "--model_name=wide", f"--model_base_path={base}",
                                 "--file_system_poll_wait_seconds=0"], r"at:?\s*[\d.]+:(\d+)", 2)
            servers[c] = (proc, ports[1])
        figures: dict[int, list[tuple[float, float, float]]] = {c: [] for c in widths}
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(args.rounds):
                for c in widths:
                    proc, port = servers[c]
                    body = json.dumps({"instances": [models[c][1]]})

                    def run(warm: bool, port=port, body=body):
                        return rest_client(port, "/v1/models/wide:predict", body, args.clients,
                                           1.0 if warm else args.seconds, tmp)
                    n, p99, client, cpu_us, _ = measured(proc.pid, run)
                    figures[c].append((n / args.seconds, p99, cpu_us))
                    print(f"  round {r + 1}, {c:>4} columns: {n / args.seconds:8,.0f} requests/s, p99 {p99:7.2f} ms, "
                          f"{cpu_us:8,.0f} us CPU/request ({client})", flush=True)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=60)
    first = widths[0]
    rps0 = statistics.median(f[0] for f in figures[first])
    cpu0 = statistics.median(f[2] for f in figures[first])
    bytes0 = len(json.dumps({"instances": [models[first][1]]}))
    print(f"\nREST :predict, one row a request, {args.clients} connections, {args.rounds} rounds of "
          f"{args.seconds:g} s (medians):")
    for c in widths:
        rps = statistics.median(f[0] for f in figures[c])
        p99 = statistics.median(f[1] for f in figures[c])
        cpu = statistics.median(f[2] for f in figures[c])
        size = len(json.dumps({"instances": [models[c][1]]}))
        print(f"  {c:>4} columns: {rps:8,.0f} requests/s, p99 {p99:6.2f} ms, {cpu:7,.0f} us CPU/request; against "
              f"{first} columns: throughput 1/{rps0 / rps:.2f}, CPU {cpu / cpu0:.2f}x, body {size / bytes0:.1f}x "
              f"({size:,} bytes)")
    widest = widths[-1]
    ratio = rps0 / statistics.median(f[0] for f in figures[widest])
    print(f"goal: {widest} columns' throughput within 3x of {first} columns': {ratio:.2f}x, "
          + ("met" if ratio <= 3 else "NOT met"))


if __name__ == "__main__":
    main()
