"""What one hostile client costs the others: a well-behaved client's latency while each attack below
is sent, and the server's memory.

    python benchmarks/hostile.py [--workers 1 2] [--batching off on] [--seconds 8] [--attacks ...]
                                 [--serve-args=--max_call_rows=0]

A `tfpipe serve` of the penguins model (built once into .bench/hostile/ by the data, train and
export stages) is called by two well-behaved clients, REST and gRPC, one row per request, on a
schedule of 25 requests a second each from the start to the end, each request timed from the
moment its schedule meant it to be sent (so that a stall counts for every request it held up:
Polite._paced). After a quiet window (the baseline), each attack is sent for its window, one after
another:

- gzip-bomb: a gRPC Predict compressed with gzip, 256 MiB of zeros in tensor_content (0.26 MB
  on the wire), sent 4 times;
- fill-out: a gRPC Predict of seven inputs of shape [149796] holding one value each (the most the
  fill-out bound lets a request declare), 4 at once, again and again;
- large-json: a REST body of 330,000 rows (47 MB), 2 at once, again and again;
- huge-int: a REST body whose number has 10,000 digits, again and again;
- br-body: a REST body sent with Content-Encoding: br, again and again;
- burst: 10,000 gRPC Predicts at once over 20 channels, again and again;
- greedy: one connection keeping 64 gRPC Predicts of 32 rows each in flight.

Each attack runs in a process of its own. Per window it prints the attack's requests, their bytes
and answers, the server's resident memory at its peak over the baseline's (the process tree: every
worker), and the well-behaved clients' p50, p99 and maximum (ms) and failures, of the requests due
in the window. The attacker's own requests are not counted: they may be refused (that is what
they should get). Exit 1 if a well-behaved request failed, or if an attack's p99 is more than
--bound-ms beyond the same server's p99 without one (the quiet window): the bound each attack
must keep, measured here rather than in a timed test.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import re
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BENCH = os.path.join(ROOT, ".bench", "hostile")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import grpc  # noqa: E402
import numpy as np  # noqa: E402
import psutil  # noqa: E402
import requests  # noqa: E402
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc  # noqa: E402

ROW = {"island": "Biscoe", "bill_length_mm": 48.0, "bill_depth_mm": 15.0, "flipper_length_mm": 220.0,
       "body_mass_g": 5400.0, "sex": "male", "year": 2008}
PACE_S = 0.04  # each well-behaved client: 25 requests a second


def model_base() -> str:
    """BASE holding the penguins model, built by tfpipe's own stages on the first run."""
    base = os.path.join(BENCH, "models", "penguins")
    if os.path.isdir(base) and any(v.isdigit() for v in os.listdir(base)):
        return base
    import palmerpenguins

    csv = os.path.join(os.path.dirname(palmerpenguins.__file__), "data", "penguins.csv")
    cli = [sys.executable, "-m", "tfpipe.cli"]
    for args in (["data", "--input", csv, "--label", "species", "--out", f"{BENCH}/data"],
                 ["train", "--data", f"{BENCH}/data", "--out", f"{BENCH}/train", "--epochs", "20"],
                 ["export", "--model", f"{BENCH}/train", "--data", f"{BENCH}/data", "--base", f"{BENCH}/models",
                  "--name", "penguins", "--tflite", ""]):
        subprocess.run(cli + args, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return base


def start_server(base: str, workers: int, batching: bool, extra: list[str]) -> tuple[subprocess.Popen, int, int]:
    flags = ["--host=127.0.0.1", "--port=-1", "--rest_api_port=-1", "--model_name=penguins",
             f"--model_base_path={base}", "--file_system_poll_wait_seconds=0", f"--workers={workers}", *extra]
    if batching:
        cfg = os.path.join(BENCH, "batching.config")
        with open(cfg, "w") as f:
            f.write("max_batch_size { value: 32 }\nbatch_timeout_micros { value: 1000 }\n"
                    "max_enqueued_batches { value: 100 }\n")
        flags += ["--enable_batching", f"--batching_parameters_file={cfg}"]
    proc = subprocess.Popen([sys.executable, "-m", "tfpipe.cli", "serve", *flags], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: [lines.append(x) for x in proc.stdout], daemon=True).start()
    one = re.compile(r"(gRPC ModelServer|HTTP/REST API) at:?\s*[\d.]+:(\d+)")
    many = re.compile(r"workers .* serving gRPC [\d.]+:(\d+), REST [\d.]+:(\d+)")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        text = list(lines)
        if workers > 1:
            found = next((m for m in map(many.search, text) if m), None)
            if found:
                return proc, int(found[1]), int(found[2])
        else:
            ports = dict(m.groups() for m in map(one.search, text) if m)
            if len(ports) == 2:
                return proc, int(ports["gRPC ModelServer"]), int(ports["HTTP/REST API"])
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("the server did not start:\n" + "".join(lines[-30:]))


def tree_rss(pid: int) -> int:
    try:
        p = psutil.Process(pid)
        return sum(q.memory_info().rss for q in [p, *p.children(recursive=True)])
    except psutil.Error:
        return 0


def row_request(rows: int = 1) -> predict_pb2.PredictRequest:
    """A Predict of ROW; `rows` > 1: each input declares that many rows and holds one value (TensorFlow's
    fill-out rule repeats it)."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "penguins"
    for k, v in ROW.items():
        t = request.inputs[k]
        t.tensor_shape.dim.add(size=rows)
        if isinstance(v, str):
            t.dtype = 7  # DT_STRING
            t.string_val.append(v.encode())
        elif k == "year":
            t.dtype = 9  # DT_INT64
            t.int64_val.append(int(v))
        else:
            t.dtype = 1  # DT_FLOAT
            t.float_val.append(v)
    return request


class Polite:
    """Two well-behaved clients (REST and gRPC), each timing its requests, for as long as it runs."""

    def __init__(self, grpc_port: int, rest_port: int):
        self.records: list[tuple[float, float, bool]] = []  # (due at, seconds from then to its answer, ok)
        self.lock, self.stop = threading.Lock(), threading.Event()
        self.url = f"http://127.0.0.1:{rest_port}/v1/models/penguins:predict"
        self.request = row_request()
        self.channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        self.threads = [threading.Thread(target=self._rest), threading.Thread(target=self._grpc)]

    def _paced(self, call) -> None:
        """`call()` (True when answered OK) on a fixed schedule, one every PACE_S, each timed from
        the moment the schedule meant it to be sent: a client held up by a slow answer sends what
        it owes at once, and a stall counts for every request it held up, not only for the one
        that met it (the coordinated omission a closed-loop client's own timing has)."""
        due = time.perf_counter() + PACE_S
        while not self.stop.wait(max(0.0, due - time.perf_counter())):
            ok = call()
            with self.lock:
                self.records.append((due, time.perf_counter() - due, ok))
            due += PACE_S

    def _rest(self) -> None:
        session = requests.Session()

        def call() -> bool:
            try:
                return session.post(self.url, json={"instances": [ROW]}, timeout=60).status_code == 200
            except requests.RequestException:
                return False
        self._paced(call)

    def _grpc(self) -> None:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)

        def call() -> bool:
            try:
                stub.Predict(self.request, timeout=60)
                return True
            except grpc.RpcError:
                return False
        self._paced(call)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join()
        self.channel.close()

    def window(self, start: float, end: float) -> dict:
        with self.lock:
            got = [(s, ok) for t0, s, ok in self.records if start <= t0 < end]
        times = np.array([s for s, _ in got]) * 1000
        return {"n": len(got), "failed": sum(not ok for _, ok in got),
                "p50": float(np.percentile(times, 50)) if len(times) else float("nan"),
                "p99": float(np.percentile(times, 99)) if len(times) else float("nan"),
                "max": float(times.max()) if len(times) else float("nan")}


# ---- the attacks: each prepares its requests, then returns what sends them until `until`, giving
# (requests, bytes sent, answers by status) ----

def _grpc_stub(port: int, compression=None):
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", compression=compression,
                                    options=[("grpc.max_send_message_length", -1)])
    return channel, prediction_service_pb2_grpc.PredictionServiceStub(channel)


def gzip_bomb(grpc_port: int, rest_port: int):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "penguins"
    t = request.inputs["bill_length_mm"]
    t.dtype = 1
    t.tensor_shape.dim.add(size=64 << 20)
    t.tensor_content = bytes(256 << 20)
    wire = len(gzip.compress(request.SerializeToString(), 6))
    channel, stub = _grpc_stub(grpc_port, grpc.Compression.Gzip)

    def send(until: float):
        answers, n = collections.Counter(), 0
        with channel:
            while n < 4 and time.perf_counter() < until:
                n += 1
                try:
                    stub.Predict(request, timeout=60)
                    answers["OK"] += 1
                except grpc.RpcError as e:
                    answers[e.code().name] += 1
        return n, n * wire, answers
    return send


def _concurrently(k: int, until: float, send) -> tuple[int, collections.Counter]:
    answers, lock, count = collections.Counter(), threading.Lock(), [0]

    def loop():
        while time.perf_counter() < until:
            status = send()
            with lock:
                answers[status] += 1
                count[0] += 1
    threads = [threading.Thread(target=loop) for _ in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return count[0], answers


def fill_out(grpc_port: int, rest_port: int):
    request = row_request(149_796)
    channel, stub = _grpc_stub(grpc_port)

    def one():
        try:
            stub.Predict(request, timeout=120)
            return "OK"
        except grpc.RpcError as e:
            return e.code().name

    def send(until: float):
        with channel:
            n, answers = _concurrently(4, until, one)
        return n, n * request.ByteSize(), answers
    return send


def _rest(rest_port: int, body: bytes, k: int, headers: dict | None = None):
    url = f"http://127.0.0.1:{rest_port}/v1/models/penguins:predict"
    local = threading.local()

    def one():
        session = getattr(local, "session", None) or requests.Session()
        local.session = session
        try:
            return f"HTTP {session.post(url, data=body, headers=headers or {}, timeout=120).status_code}"
        except requests.RequestException as e:
            return type(e).__name__

    def send(until: float):
        n, answers = _concurrently(k, until, one)
        return n, n * len(body), answers
    return send


def large_json(grpc_port: int, rest_port: int):
    return _rest(rest_port, json.dumps({"instances": [ROW] * 330_000}).encode(), 2)


def huge_int(grpc_port: int, rest_port: int):
    return _rest(rest_port, b'{"instances": [{"year": ' + b"9" * 10_000 + b"}]}", 1)


def br_body(grpc_port: int, rest_port: int):
    body = b"\x1b\x00\x00\x00" * 64  # not brotli either: the server cannot decode it
    return _rest(rest_port, body, 1, {"Content-Encoding": "br"})


def burst(grpc_port: int, rest_port: int):
    """10,000 Predicts at once over 20 channels, then again while the window lasts."""
    import asyncio

    request = row_request()

    def send(until: float):
        answers, n = collections.Counter(), 0

        async def run():
            nonlocal n
            channels = [grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") for _ in range(20)]
            stubs = [prediction_service_pb2_grpc.PredictionServiceStub(c) for c in channels]

            async def one(stub):
                try:
                    await stub.Predict(request, timeout=120)
                    answers["OK"] += 1
                except grpc.aio.AioRpcError as e:
                    answers[e.code().name] += 1
            while time.perf_counter() < until:
                n += 10_000
                await asyncio.gather(*[one(stubs[i % 20]) for i in range(10_000)])
            for c in channels:
                await c.close()
        asyncio.run(run())
        return n, n * request.ByteSize(), answers
    return send


def greedy(grpc_port: int, rest_port: int):
    """One connection keeping 64 Predicts of 32 rows each in flight for the whole window."""
    import asyncio

    request = predict_pb2.PredictRequest()
    request.model_spec.name = "penguins"
    for k, t in row_request().inputs.items():
        request.inputs[k].CopyFrom(t)
        request.inputs[k].tensor_shape.dim[0].size = 32
        for field in ("string_val", "int64_val", "float_val"):
            values = getattr(request.inputs[k], field)
            if len(values):
                values.extend([values[0]] * 31)

    def send(until: float):
        answers, n = collections.Counter(), 0

        async def run():
            async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)

                async def one():
                    nonlocal n
                    while time.perf_counter() < until:
                        n += 1
                        try:
                            await stub.Predict(request, timeout=120)
                            answers["OK"] += 1
                        except grpc.aio.AioRpcError as e:
                            answers[e.code().name] += 1
                await asyncio.gather(*[one() for _ in range(64)])
        asyncio.run(run())
        return n, n * request.ByteSize(), answers
    return send


ATTACKS = {"gzip-bomb": gzip_bomb, "fill-out": fill_out, "large-json": large_json, "huge-int": huge_int,
           "br-body": br_body, "burst": burst, "greedy": greedy}


def run(base: str, workers: int, batching: bool, seconds: float, extra: list[str], only: list[str]) -> list[dict]:
    proc, grpc_port, rest_port = start_server(base, workers, batching, extra)
    rows = []
    try:
        with Polite(grpc_port, rest_port) as polite:
            time.sleep(1.0)  # the clients' first requests (connections, first calls) are not the baseline's
            start = time.perf_counter()
            rss0 = peak = tree_rss(proc.pid)
            while time.perf_counter() - start < seconds:
                peak = max(peak, tree_rss(proc.pid))
                time.sleep(0.05)
            rows.append({"attack": "(none)", "requests": 0, "bytes": 0, "answers": {}, "peak_mb": 0.0,
                         **polite.window(start, time.perf_counter())})
            for name in only:
                # The attacker is a process of its own, as it would be: its own work (compressing,
                # serialising) does not hold the well-behaved clients' GIL. It starts (imports) before
                # the window, and attacks when told.
                sender = subprocess.Popen([sys.executable, __file__, "--attack-alone", name, str(grpc_port),
                                           str(rest_port), str(seconds)], cwd=ROOT, stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, text=True)
                assert sender.stdout.readline().strip() == "ready"
                time.sleep(1.0)  # its start's CPU is not the attack's
                rss0 = peak = tree_rss(proc.pid)
                start = time.perf_counter()
                sender.stdin.write("go\n")
                sender.stdin.flush()
                while sender.poll() is None:
                    peak = max(peak, tree_rss(proc.pid))
                    time.sleep(0.05)
                end = time.perf_counter()
                result = json.loads(sender.stdout.read().strip().splitlines()[-1])
                rows.append({"attack": name, "requests": result["n"], "bytes": result["bytes"],
                             "answers": dict(result["answers"]), "peak_mb": (peak - rss0) / 2**20,
                             **polite.window(start, end)})
                time.sleep(1.0)  # what the attack left queued is answered before the next window
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    return rows


def attack_alone(name: str, grpc_port: int, rest_port: int, seconds: float) -> None:
    """One attack for `seconds`, in this process, once its parent says go; prints its result as one
    JSON line."""
    send = ATTACKS[name](grpc_port, rest_port)
    print("ready", flush=True)
    sys.stdin.readline()
    n, sent, answers = send(time.perf_counter() + seconds)
    print(json.dumps({"n": n, "bytes": sent, "answers": dict(answers)}))


def main() -> None:
    if sys.argv[1:2] == ["--attack-alone"]:
        name, grpc_port, rest_port, seconds = sys.argv[2:6]
        return attack_alone(name, int(grpc_port), int(rest_port), float(seconds))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batching", choices=("off", "on"), nargs="+", default=["off", "on"])
    ap.add_argument("--seconds", type=float, default=8.0, help="each window's length")
    ap.add_argument("--attacks", nargs="+", choices=list(ATTACKS), default=list(ATTACKS))
    ap.add_argument("--serve-args", default="", help="more `tfpipe serve` flags, e.g. --serve-args=--max_call_rows=0")
    ap.add_argument("--bound-ms", type=float, default=100.0,
                    help="how far beyond its quiet p99 an attack may take the well-behaved p99 (default 100)")
    args = ap.parse_args()
    base = model_base()
    failed, over = 0, []
    for workers in args.workers:
        for batching in args.batching:
            print(f"\n--workers={workers}, batching {batching} {args.serve_args}")
            print(f"{'attack':11} {'requests':>8} {'MB sent':>9} {'peak +MB':>9} {'p50 ms':>7} {'p99 ms':>7} "
                  f"{'max ms':>7} {'polite':>7}  attacker's answers")
            quiet = None
            for r in run(base, workers, batching == "on", args.seconds, args.serve_args.split(), args.attacks):
                failed += r["failed"]
                if r["attack"] == "(none)":  # the quiet window, first
                    quiet = r["p99"]
                elif r["p99"] - quiet > args.bound_ms:
                    over.append(f"{r['attack']} (--workers={workers}, batching {batching}): p99 {r['p99']:.1f} ms, "
                                f"{r['p99'] - quiet:.1f} beyond the quiet {quiet:.1f}")
                answers = ", ".join(f"{k} {v}" for k, v in sorted(r["answers"].items()))
                print(f"{r['attack']:11} {r['requests']:8d} {r['bytes'] / 1e6:9.2f} {r['peak_mb']:9.0f} "
                      f"{r['p50']:7.1f} {r['p99']:7.1f} {r['max']:7.1f} {r['n'] - r['failed']:4d}/{r['n']:<4d} "
                      f"{answers}")
    print(f"\nwell-behaved requests failed: {failed}; attacks beyond the quiet p99 by more than "
          f"{args.bound_ms:g} ms: {len(over)}" + "".join(f"\n  {o}" for o in over))
    sys.exit(1 if failed or over else 0)


if __name__ == "__main__":
    main()
