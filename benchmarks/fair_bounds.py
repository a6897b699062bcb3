"""What the server's fairness bounds cost the clients they bound: throughput with each bound and
without it, measured in one run, as ratios.

    python benchmarks/fair_bounds.py [--seconds 6]

- streams: one gRPC channel keeping 64 Predicts of one row in flight, with batching on and off,
  against a server with the default `--grpc_max_concurrent_streams` (32: the client queues the
  other 32) and with `--grpc_max_concurrent_streams=0` (no bound). Answers a second.
- large: four REST clients each sending bodies of 10,000 rows (1.4 MB, a large request) as fast as
  they are answered, batching off, with the default `--large_requests_at_once` (half the cores)
  and with `--large_requests_at_once=64` (as many as come). Bodies a second.
- calls: 32 gRPC channels each keeping one Predict in flight, batching off, with the default
  `--max_concurrent_model_calls` (four a core) and with 64 (no bound here), then with one a core
  (what the server ran before). Answers a second.

The penguins model of benchmarks/hostile.py (built into .bench/hostile/ on the first run). Each
case runs the default server and the other in turns, `--rounds` times, and prints each round's
figures and the ratio of the medians (default over other: below 1, the default costs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import hostile  # noqa: E402  (the model, the server's start, the row)
from tfpipe.machine import cores  # noqa: E402


def calls(grpc_port: int, seconds: float, channels: int, in_flight: int) -> float:
    """Answers a second to `channels` channels, each keeping `in_flight` Predicts in flight."""
    import grpc
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    request = hostile.row_request()

    async def run() -> float:
        opened = [grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") for _ in range(channels)]
        stubs = [prediction_service_pb2_grpc.PredictionServiceStub(c) for c in opened]
        await asyncio.gather(*[s.Predict(request, timeout=60) for s in stubs])
        answered, until = 0, time.perf_counter() + seconds

        async def one(stub):
            nonlocal answered
            while time.perf_counter() < until:
                await stub.Predict(request, timeout=60)
                answered += 1
        await asyncio.gather(*[one(s) for s in stubs for _ in range(in_flight)])
        for c in opened:
            await c.close()
        return answered / seconds
    return asyncio.run(run())


def large_bodies(rest_port: int, seconds: float) -> float:
    """Bodies a second answered to four clients sending 10,000-row bodies back to back."""
    import requests

    body = json.dumps({"instances": [hostile.ROW] * 10_000}).encode()
    url = f"http://127.0.0.1:{rest_port}/v1/models/penguins:predict"
    requests.post(url, data=body, timeout=120).raise_for_status()
    answered, lock, until = [0], threading.Lock(), time.perf_counter() + seconds

    def client():
        with requests.Session() as s:
            while time.perf_counter() < until:
                s.post(url, data=body, timeout=120).raise_for_status()
                with lock:
                    answered[0] += 1
    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answered[0] / seconds


CASES = [  # name, batching, the default server's flags, the other's, measure(grpc, rest, seconds)
    ("streams, batching on", True, [], ["--grpc_max_concurrent_streams=0"], lambda g, r, s: calls(g, s, 1, 64)),
    ("streams, batching off", False, [], ["--grpc_max_concurrent_streams=0"], lambda g, r, s: calls(g, s, 1, 64)),
    ("large, batching off", False, [], ["--large_requests_at_once=64"], lambda g, r, s: large_bodies(r, s)),
    ("calls, against none", False, [], ["--max_concurrent_model_calls=64"], lambda g, r, s: calls(g, s, 32, 1)),
    ("calls, against 1 a core", False, [], [f"--max_concurrent_model_calls={cores()}"],
     lambda g, r, s: calls(g, s, 32, 1)),
]


def measure(base: str, batching: bool, flags: list[str], fn, seconds: float) -> float:
    proc, grpc_port, rest_port = hostile.start_server(base, 1, batching, flags)
    try:
        return fn(grpc_port, rest_port, seconds)
    finally:
        proc.terminate()
        proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    base = hostile.model_base()
    print(f"{'case':<24} {'default':>9} {'other':>10} {'ratio':>6}  rounds (default / other)")
    for name, batching, bounded, unbounded, fn in CASES:
        got: dict[str, list[float]] = {"b": [], "u": []}
        for _ in range(args.rounds):
            got["b"].append(measure(base, batching, bounded, fn, args.seconds))
            got["u"].append(measure(base, batching, unbounded, fn, args.seconds))
        b, u = statistics.median(got["b"]), statistics.median(got["u"])
        rounds = " ".join(f"{x:.1f}" for x in got["b"]) + " / " + " ".join(f"{x:.1f}" for x in got["u"])
        print(f"{name:<24} {b:>9.1f} {u:>10.1f} {b / u:>6.2f}  {rounds}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
