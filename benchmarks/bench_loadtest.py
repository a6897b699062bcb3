"""Benchmark the load generator itself, in one run.

    python benchmarks/bench_loadtest.py [--seconds 8] [--users 16]

1. Requests/s sustained against a no-op REST endpoint (benchmarks/noop_endpoint.py):
   `tfpipe loadtest --workers 2` against one plain locust process with an `HttpUser`
   (benchmarks/plain_locustfile.py), same users (target >= 2x).
2. Percentile error against an endpoint that holds every request 5 ms: loadtest's p50 and
   p99 against the endpoint's own record of how long it held each request (target: within
   0.2 ms).
Everything runs on this machine and 127.0.0.1; the endpoint shares the cores.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import queue
import socket
import subprocess
import sys
import tempfile
import threading
import urllib.request

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def endpoint(delay_ms: float) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "noop_endpoint.py"), str(port), str(delay_ms)],
                            stdout=subprocess.PIPE, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    lines.get(timeout=60)
    return proc, f"http://127.0.0.1:{port}"


def tfpipe_loadtest(url: str, tmp: str, users: int, workers: int, seconds: float) -> dict:
    body = os.path.join(tmp, "body.json")
    with open(body, "w") as f:
        json.dump({"instances": [1.0]}, f)
    out = os.path.join(tmp, f"out-{workers}")
    subprocess.run([sys.executable, "-m", "tfpipe.cli", "loadtest", "--target", url, "--model", "noop",
                    "--payload", body, "--users", str(users), "--workers", str(workers), "--duration",
                    f"{seconds}s", "--warmup", "2s", "--out", out], cwd=ROOT, check=True, capture_output=True)
    with open(os.path.join(out, "results.json")) as f:
        return json.load(f)["steps"][0]


def plain_locust(url: str, tmp: str, users: int, seconds: float) -> float:
    prefix = os.path.join(tmp, "plain")
    subprocess.run([sys.executable, "-m", "locust", "-f", os.path.join(HERE, "plain_locustfile.py"), "--headless",
                    "-u", str(users), "-r", str(users * 10), "-t", f"{int(seconds) + 2}s", "--host", url,
                    "--csv", prefix, "--only-summary"], cwd=ROOT, check=True, capture_output=True)
    with open(prefix + "_stats.csv") as f:
        row = next(r for r in csv.DictReader(f) if r["Name"] == "Aggregated")
    return float(row["Requests/s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--users", type=int, default=16)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = endpoint(0)
        try:
            plain = plain_locust(url, tmp, args.users, args.seconds)
            one = tfpipe_loadtest(url, tmp, args.users, 1, args.seconds)
            two = tfpipe_loadtest(url, tmp, args.users, 2, args.seconds)
        finally:
            proc.terminate()
        proc, url = endpoint(5.0)
        try:
            step = tfpipe_loadtest(url, tmp, 4, 1, args.seconds)
            with urllib.request.urlopen(url + "/held") as r:
                held = np.array(json.load(r))
        finally:
            proc.terminate()
    print(f"no-op endpoint, {args.users} users, {args.seconds:g} s")
    print(f"  plain locust HttpUser, 1 process     {plain:8.0f} req/s")
    print(f"  tfpipe loadtest, 1 process           {one['rps']:8.0f} req/s   {one['rps'] / plain:.2f}x plain")
    print(f"  tfpipe loadtest, --workers 2         {two['rps']:8.0f} req/s   {two['rps'] / plain:.2f}x plain "
          "(target >= 2)")
    t50, t99 = np.percentile(held, 50), np.percentile(held, 99)
    print(f"\nendpoint holding each request 5 ms, 4 users: {step['requests']} measured requests")
    print(f"  p50: loadtest {step['p50_ms']:.3f} ms, endpoint held {t50:.3f} ms, "
          f"difference {step['p50_ms'] - t50:+.3f} ms (target within 0.2)")
    print(f"  p99: loadtest {step['p99_ms']:.3f} ms, endpoint held {t99:.3f} ms, "
          f"difference {step['p99_ms'] - t99:+.3f} ms (target within 0.2)")


if __name__ == "__main__":
    main()
