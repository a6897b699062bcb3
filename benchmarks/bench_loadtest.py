"""Benchmark the load generator itself, in one run.

    python benchmarks/bench_loadtest.py [--seconds 8] [--users 16] [--rounds 5] [--only throughput|rest|grpc]

1. Requests/s sustained against a no-op REST endpoint (benchmarks/noop_endpoint.py):
   `tfpipe loadtest --workers 2` against one plain locust process with an `HttpUser`
   (benchmarks/plain_locustfile.py), same users (target >= 2x).
2. Percentile error against an endpoint that holds every request 5 ms (target: p50 and p99
   within 0.2 ms of the truth), one user. Two truths are printed:
   - the latency a minimal client sees: a blocking socket sending the same bytes and timing
     sendall..last byte with perf_counter, run alternately with `tfpipe loadtest` (--rounds
     rounds each, who goes first swapping every round; the median of the rounds), so the
     difference is what the load tester adds;
   - the endpoint's own record of how long it held each request, which leaves out HTTP
     parsing and the loopback round trip that every client sees.
3. The same for gRPC against benchmarks/noop_grpc_endpoint.py holding each Predict 5 ms: the
   load test's gRPC user against a plain loop of the official stub (grpc, no gevent), in
   alternating rounds (target: p50 and p99 within 0.2 ms).
Everything runs on this machine and 127.0.0.1; the endpoint shares the cores. `--only PART`
runs one of throughput, rest, grpc.
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
import time
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


def grpc_endpoint(delay_ms: float) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "noop_grpc_endpoint.py"), str(port), str(delay_ms)],
                            stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()
    return proc, f"grpc://127.0.0.1:{port}"


def tfpipe_loadtest(url: str, tmp: str, users: int, workers: int, seconds: float) -> dict:
    body = os.path.join(tmp, "body.json")
    with open(body, "w") as f:
        json.dump({"instances": [{"x": 1.0}] if url.startswith("grpc") else [1.0]}, f)
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


def minimal_client(url: str, seconds: float) -> dict:
    """One user on a blocking socket: send the request, read to the last byte, time it."""
    host, port = url.split("//")[1].split(":")
    body = json.dumps({"instances": [1.0]}).encode()
    request = (f"POST /v1/models/noop:predict HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    times = []
    with socket.create_connection((host, int(port))) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        warm_end = time.perf_counter() + 1.0
        end = warm_end + seconds
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            sock.sendall(request)
            data = b""
            while True:
                data += sock.recv(65536)
                head, sep, rest = data.partition(b"\r\n\r\n")
                if sep:
                    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                      if line.lower().startswith(b"content-length")))
                    if len(rest) >= length:
                        break
            if t0 >= warm_end:
                times.append((time.perf_counter() - t0) * 1000)
    return {"p50_ms": float(np.percentile(times, 50)), "p99_ms": float(np.percentile(times, 99)), "n": len(times)}


def minimal_stub(url: str, seconds: float) -> dict:
    """One user in a plain loop of the official stub: build nothing, call Predict, time it."""
    import grpc
    from tensorflow.core.framework import tensor_pb2, types_pb2
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    req = predict_pb2.PredictRequest()
    req.model_spec.name = "noop"
    x = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[1.0])
    x.tensor_shape.dim.add().size = 1
    req.inputs["x"].CopyFrom(x)
    times = []
    with grpc.insecure_channel(url.split("//")[1]) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        warm_end = time.perf_counter() + 1.0
        end = warm_end + seconds
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            stub.Predict(req, timeout=30)
            if t0 >= warm_end:
                times.append((time.perf_counter() - t0) * 1000)
    return {"p50_ms": float(np.percentile(times, 50)), "p99_ms": float(np.percentile(times, 99)), "n": len(times)}


def alternate(reference, url: str, tmp: str, seconds: float, round_no: int) -> tuple[dict, dict]:
    """One round of (reference client, tfpipe loadtest) at one user; the round's number (0, 1,
    2, ...) decides which goes first, so neither always runs on the warmer server."""
    if round_no % 2:
        tool = tfpipe_loadtest(url, tmp, 1, 1, seconds)
        return reference(url, seconds), tool
    ref = reference(url, seconds)
    return ref, tfpipe_loadtest(url, tmp, 1, 1, seconds)


def print_rounds(title: str, rounds: list[tuple[dict, dict]], held: list | None = None) -> None:
    print(f"\n{title}; {len(rounds)} alternating rounds, median of the rounds")
    for q in ("p50", "p99"):
        tool = float(np.median([r[1][f"{q}_ms"] for r in rounds]))
        ref = float(np.median([r[0][f"{q}_ms"] for r in rounds]))
        line = (f"  {q}: loadtest {tool:.3f} ms, reference {ref:.3f} ms: difference {tool - ref:+.3f} ms "
                "(target within 0.2)")
        if held is not None:
            held_q = float(np.median([np.percentile(h, int(q[1:])) for h in held]))
            line += f"; endpoint held {held_q:.3f} ms ({tool - held_q:+.3f})"
        print(line)
    print("  rounds (loadtest / reference p50, p99 ms): " + "; ".join(
        f"{t['p50_ms']:.3f}/{r['p50_ms']:.3f}, {t['p99_ms']:.3f}/{r['p99_ms']:.3f}" for r, t in rounds))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--users", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds of the latency parts")
    ap.add_argument("--only", choices=("throughput", "rest", "grpc"), help="run one part")
    args = ap.parse_args()
    parts = [args.only] if args.only else ["throughput", "rest", "grpc"]
    with tempfile.TemporaryDirectory() as tmp:
        if "throughput" in parts:
            proc, url = endpoint(0)
            try:
                plain = plain_locust(url, tmp, args.users, args.seconds)
                one = tfpipe_loadtest(url, tmp, args.users, 1, args.seconds)
                two = tfpipe_loadtest(url, tmp, args.users, 2, args.seconds)
            finally:
                proc.terminate()
            print(f"no-op endpoint, {args.users} users, {args.seconds:g} s")
            print(f"  plain locust HttpUser, 1 process     {plain:8.0f} req/s")
            print(f"  tfpipe loadtest, 1 process           {one['rps']:8.0f} req/s   {one['rps'] / plain:.2f}x plain")
            print(f"  tfpipe loadtest, --workers 2         {two['rps']:8.0f} req/s   {two['rps'] / plain:.2f}x plain "
                  "(target >= 2)")
        if "rest" in parts:
            proc, url = endpoint(5.0)
            try:
                rounds, held = [], []
                for i in range(args.rounds):
                    rounds.append(alternate(minimal_client, url, tmp, args.seconds, i))
                    with urllib.request.urlopen(url + "/held") as r:
                        held.append(np.array(json.load(r)))
                    urllib.request.urlopen(urllib.request.Request(url + "/reset", method="POST")).read()
            finally:
                proc.terminate()
            print_rounds("REST endpoint holding each request 5 ms, 1 user, reference: a blocking socket", rounds, held)
        if "grpc" in parts:
            proc, url = grpc_endpoint(5.0)
            try:
                rounds = [alternate(minimal_stub, url, tmp, args.seconds, i) for i in range(args.rounds)]
            finally:
                proc.terminate()
            print_rounds("gRPC endpoint holding each request 5 ms, 1 user, reference: a loop of the official stub",
                         rounds)


if __name__ == "__main__":
    main()
