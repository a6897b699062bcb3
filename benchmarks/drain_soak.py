"""SIGTERM under a hostile client's load (many connections, slow and pipelined requests), again and again: what became of every
request in flight.

    python benchmarks/drain_soak.py [--runs 5] [--workers 1 2]

Each run starts `tfpipe serve` (batching, request logging, --drain_seconds 30) on a model whose
answer takes some tenths of a second (y = x + 1 after a busy loop), loads it with
tests/draining.py's DrainLoad at a larger scale than the suite's tests (16 gRPC callers, 8 REST
callers on keep-alive connections, 4 opening a connection per request, 4 pipelining 3 requests at a
time on theirs, 6 REST bodies still being sent when the signal comes, 12 large requests of 200,000
rows sent just before it), sends SIGTERM,
and counts the requests sent before the signal that were not answered OK (lost), per kind, and
what the calls after it got. Prints a line per run and the totals; exit 1 if any was lost.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))  # the load the drain tests use, and their model

from draining import DrainLoad  # noqa: E402

ROWS = 200_000
BATCHING = "max_batch_size { value: 262144 }\nbatch_timeout_micros { value: 2000 }\nnum_batch_threads { value: 2 }\n"


def start_server(workers: int, root: str) -> tuple[subprocess.Popen, list[str], int, int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tfpipe.cli", "serve", "--host=127.0.0.1", "--port=-1", "--rest_api_port=-1",
         f"--workers={workers}", "--model_name=slow", f"--model_base_path={root}/slow",
         "--file_system_poll_wait_seconds=0", "--enable_model_warmup=false", "--enable_batching",
         f"--batching_parameters_file={root}/batching.config", f"--request_log_prefix={root}/logs/slow",
         "--drain_seconds=30", "--rest_api_timeout_in_ms=60000"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: [lines.append(line.rstrip("\n")) for line in proc.stdout], daemon=True).start()
    deadline, port_line = time.monotonic() + 300, re.compile(r"(gRPC ModelServer|HTTP/REST API) at:?\s*[\d.]+:(\d+)")
    while time.monotonic() < deadline and proc.poll() is None:
        ports = dict(m.groups() for m in map(port_line.search, list(lines)) if m)
        if len(ports) == 2:
            return proc, lines, int(ports["gRPC ModelServer"]), int(ports["HTTP/REST API"])
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("the server did not start:\n" + "\n".join(lines[-30:]))


def run_once(workers: int, root: str) -> dict:
    proc, lines, grpc_port, rest_port = start_server(workers, root)
    load = DrainLoad(grpc_port, rest_port, "slow", grpc_callers=16, rest_callers=8, fresh_callers=4, pipelining=4,
                     uploads=6, large=12, rows=ROWS)
    load.start(timeout=300)
    load.signal(proc, timeout=300)
    deadline = time.monotonic() + 120
    while sum("shutting down" in line for line in list(lines)) < workers and time.monotonic() < deadline:
        time.sleep(0.01)
    load.release.set()
    code = load.finish(proc, timeout=180)
    drained = time.monotonic() - load.signalled_at
    before = collections.Counter(kind for kind, sent, _, _ in load.results if sent < load.signalled_at)
    after = collections.Counter(outcome.split(":")[0] for _, sent, _, outcome in load.results
                                if sent >= load.signalled_at)
    return {"code": code, "drained": drained, "before": before, "lost": load.lost(), "after": after,
            "cut": [line for line in lines if "cut off" in line or "killed" in line]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="drain-soak-")
    from serving_models import save_busy

    save_busy(os.path.join(root, "slow", "1"), steps=60000)  # the model its figures were measured on
    with open(os.path.join(root, "batching.config"), "w") as f:
        f.write(BATCHING)
    try:
        lost_total = soak(args.runs, args.workers, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if lost_total else 0


def soak(runs: int, worker_counts: list[int], root: str) -> int:
    """Print each run and each worker count's totals; how many requests were lost in all."""
    lost_total = 0
    for workers in worker_counts:
        sent, lost = collections.Counter(), []
        for run in range(1, runs + 1):
            r = run_once(workers, root)
            sent.update(r["before"])
            lost += r["lost"]
            print(f"--workers {workers} run {run}: {sum(r['before'].values())} requests sent before SIGTERM "
                  f"({', '.join(f'{k} {n}' for k, n in sorted(r['before'].items()))}), lost {len(r['lost'])}; "
                  f"after it: {dict(r['after'])}; drained in {r['drained']:.1f} s, exit {r['code']}"
                  + (f"; {r['cut']}" if r["cut"] else ""), flush=True)
            for item in r["lost"][:10]:
                print(f"  lost: {item}", flush=True)
        lost_total += len(lost)
        how = collections.Counter(f"{kind} {outcome.split(':')[0].split(' b')[0]}" for kind, _, outcome in lost)
        print(f"--workers {workers}: {len(lost)} of {sum(sent.values())} requests sent before SIGTERM lost over "
              f"{runs} runs ({', '.join(f'{k} {n}' for k, n in sorted(sent.items()))})"
              + (f": {', '.join(f'{k} {n}' for k, n in sorted(how.items()))}" if lost else ""), flush=True)
    return lost_total


if __name__ == "__main__":
    sys.exit(main())
