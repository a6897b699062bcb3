"""Python function calls a REST Predict costs the server, counted exactly: a measure of a change's
cost that this shared host's drifting speed does not touch (bench_serve.py --only-cpu --against
times it).

    python benchmarks/call_counts.py [--against TREE] [--requests 1000]

The server (`tfpipe serve`, one worker, batching on as bench_serve.py sets it) runs under cProfile
twice, answering 300 requests and then 300 + --requests, from 8 client threads; a request's calls
are the difference between the two runs' totals over --requests (start-up and shutdown cancel
out). --against TREE counts the same for another checkout of tfpipe with its own .venv (e.g. a git
worktree of an earlier commit). Needs the taxi model bench_serve.py serves (.bench/export).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import pstats
import signal
import sys
import tempfile
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_serve  # noqa: E402  (its model, requests and server start)


def calls(tree: str, requests: int, body: bytes, path: str, tmp: str) -> int:
    """Every Python call (cProfile's count) of one server run from `tree` answering `requests`."""
    profile = os.path.join(tmp, f"server-{requests}.prof")
    proc, _, rest = bench_serve.serve(path, batching=True, tmp=tmp, tree=tree,
                                      launcher=("-m", "cProfile", "-o", profile))
    url = f"http://127.0.0.1:{rest}/v1/models/{bench_serve.NAME}:predict"

    def one(_):
        request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            answer.read()

    try:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(one, range(requests)))
    finally:
        proc.send_signal(signal.SIGTERM)  # a drain: the server returns and cProfile writes its file
        proc.wait(timeout=120)
    return sum(stat[1] for stat in pstats.Stats(profile).stats.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", metavar="TREE", help="also count another checkout of tfpipe with its own .venv")
    ap.add_argument("--requests", type=int, default=1000, help="requests counted (default 1000)")
    args = ap.parse_args()
    path = bench_serve.model_dir()
    body = bench_serve.rest_body(bench_serve.payloads(path)[0]).encode()
    trees = {"this tree": bench_serve.ROOT}
    if args.against:
        trees["--against"] = os.path.abspath(args.against)
    print(f"Python calls per REST Predict ({bench_serve.NAME} model, batching on, 8 client threads; "
          f"{args.requests} requests counted)")
    for name, tree in trees.items():
        with tempfile.TemporaryDirectory() as tmp:
            base = calls(tree, 300, body, path, tmp)
            more = calls(tree, 300 + args.requests, body, path, tmp)
        print(f"  {name:10s} {(more - base) / args.requests:8.1f}   ({tree})")


if __name__ == "__main__":
    main()
