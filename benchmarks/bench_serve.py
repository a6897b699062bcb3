"""Benchmark `tfpipe serve` (the embedded server) in one run, on the Chicago taxi model.

    python benchmarks/bench_serve.py [--seconds 8] [--calls 300] [--rounds 7] [--only-latency]
    python benchmarks/bench_serve.py --images [--only-batching]     the image CNN instead

Needs the model bench_export.py writes (.bench/export/models/taxi); runs that first when it
is missing. Requests are the model's own warmup records (real eval rows, one row each).
Prints:
  * batch-1 p50 latency at concurrency 1 over calling the same SavedModel in-process, for
    gRPC and REST (targets: overhead <= 0.5 ms gRPC, <= 1 ms REST). The in-process call, the
    servers and an empty-answer gRPC server (the floor) take turns for --rounds rounds, and
    the overhead is the median of the rounds' differences: this shared host's speed drifts
    by tens of percent within minutes, more than the differences measured;
  * throughput at 32 concurrent gRPC clients, batching on vs off (target >= 3x), both with
    --grpc_max_threads=32 so that every client's request is in the server at once;
  * throughput at 32 concurrent clients against a plain single-threaded grpcio server
    (benchmarks/plain_grpc_server.py; target >= 2x);
  * tail latency at 32 concurrent clients, batching on: p50, p99, p99.9 and the largest for
    REST (a raw-socket keep-alive client here, and wrk when it is installed, as an independent
    check) and gRPC (target: p99.9 within 3x p99 on both). The server runs twice: as shipped,
    and with TFPIPE_GC_FREEZE=0, which leaves TensorFlow's import-time objects to Python's
    full garbage collections (the cause of REST's 200-250 ms stalls). This process freezes
    and disables its own collector while it measures, so that its pauses are not counted.
Servers run as separate processes on 127.0.0.1; clients share this machine's cores.

--only-cpu --against TREE compares this tree's server with TREE's (a checkout of an earlier commit
with its own .venv), one worker: the two servers run at once and the load goes to each in turn,
in pairs of short bursts: the before-and-after of a change, in one run.

--only-cpu measures the server's CPU time per request (read from /proc, summed over its
processes) and its throughput at --clients, with clients that cost little CPU of their own:
wrk (or hey) for REST :predict and ghz (`go install github.com/bojand/ghz/cmd/ghz@latest`) for
gRPC Predict, for --workers 1 and 2 with batching on (max 32 divided among the workers, 2 ms,
one thread each) and off, --grpc_max_threads=32. Beside it the same
load against an empty handler on the same stack, the floor: aiohttp answering a fixed body
(benchmarks/noop_endpoint.py) and grpc.aio, the stack of the server's gRPC APIs, answering a
fixed response (benchmarks/noop_grpc_endpoint.py --aio); grpcio's thread-pool server beside it.

--images serves the image CNN that `bench_export.py --images 4000` writes (.bench/export/
models/images; run first when missing), with one encoded JPEG per request: a compute-bound
model, where batching is meant to pay. --only-batching measures only its throughput with
batching on and off.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import http.client
import json
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import grpc  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow_serving.apis import prediction_log_pb2, prediction_service_pb2_grpc  # noqa: E402

MODELS = os.path.join(ROOT, ".bench", "export", "models")
NAME = "taxi"  # or "images" (--images)


def model_dir() -> str:
    base = os.path.join(MODELS, NAME)
    versions = sorted((int(v) for v in os.listdir(base) if v.isdigit()), reverse=True) if os.path.isdir(base) else []
    if not versions:
        extra = ["--images", "4000"] if NAME == "images" else []
        subprocess.run([sys.executable, os.path.join(HERE, "bench_export.py"), *extra], check=True)
        return model_dir()
    return os.path.join(base, str(versions[0]))


def payloads(path: str):
    records = tf.data.TFRecordDataset(os.path.join(path, "assets.extra", "tf_serving_warmup_requests"))
    out = []
    for r in records:
        req = prediction_log_pb2.PredictionLog.FromString(r.numpy()).predict_log.request
        req.model_spec.name = NAME
        out.append(req)
    return out


def rest_body(req) -> str:
    row = {}
    for k, v in req.inputs.items():
        x = tf.make_ndarray(v)[0]
        if k.endswith("_bytes"):  # binary: base64, as TF Serving's REST API wants it
            row[k] = {"b64": base64.b64encode(x).decode()}
        else:
            row[k] = x.decode() if isinstance(x, bytes) else x.item()
    return json.dumps({"instances": [row]})


def start(cmd: list[str], pattern: str, count: int, groups: int = 1, root: str = ROOT) -> tuple[subprocess.Popen, list[int]]:
    proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    ports, deadline = [], time.time() + 180
    while len(ports) < count and time.time() < deadline and proc.poll() is None:
        try:
            m = re.search(pattern, lines.get(timeout=1))
        except queue.Empty:
            continue
        if m:
            ports += [int(m[g]) for g in range(1, groups + 1)]
    if len(ports) < count * groups:
        proc.kill()
        raise SystemExit(f"server did not start: {' '.join(cmd)}")
    return proc, ports


def serve(path: str, batching: bool, tmp: str, threads: int = 1, timeout_us: int = 2000,
          grpc_threads: int = 0, extra: tuple[str, ...] = (), max_batch: int = 32,
          tree: str = ROOT, launcher: tuple[str, ...] = ()) -> tuple[subprocess.Popen, int, int]:
    """`tfpipe serve` on 127.0.0.1, from `tree` (a checkout with its own .venv when not this one).
    `launcher`: arguments of the interpreter's before the module's (call_counts.py's cProfile)."""
    flags = ["--host=127.0.0.1", "--port=-1", "--rest_api_port=-1", f"--model_name={NAME}",
             f"--model_base_path={os.path.dirname(path)}", "--file_system_poll_wait_seconds=0", *extra]
    if grpc_threads:
        flags.append(f"--grpc_max_threads={grpc_threads}")
    if batching:
        cfg = os.path.join(tmp, "batching.config")
        with open(cfg, "w") as f:
            f.write(f"max_batch_size {{ value: {max_batch} }}\nbatch_timeout_micros {{ value: {timeout_us} }}\n"
                    f"num_batch_threads {{ value: {threads} }}\nmax_enqueued_batches {{ value: 1000 }}\n")
        flags += ["--enable_batching", f"--batching_parameters_file={cfg}"]
    workers = next((int(f.split("=", 1)[1]) for f in extra if f.startswith("--workers=")), 1)
    python = sys.executable if tree == ROOT else os.path.join(tree, ".venv", "bin", "python")
    if workers > 1:  # the supervisor's line, once every worker serves: "... serving gRPC H:P, REST H:P"
        proc, ports = start([python, *launcher, "-m", "tfpipe.cli", "serve", *flags],
                            r"workers .* serving gRPC [\d.]+:(\d+), REST [\d.]+:(\d+)", 1, groups=2, root=tree)
    else:
        proc, ports = start([python, *launcher, "-m", "tfpipe.cli", "serve", *flags], r"at:?\s*[\d.]+:(\d+)", 2,
                            root=tree)
    return proc, ports[0], ports[1]


def p50_ms(times: list[float]) -> float:
    return float(np.median(times)) * 1e3


class InProcess:
    """The same SavedModel called in this process the public way:
    `tf.saved_model.load(path).signatures["serving_default"](**tensors)`."""

    def __init__(self, path: str, reqs):
        self.fn = tf.saved_model.load(path).signatures["serving_default"]
        self.inputs = [{k: tf.make_ndarray(v) for k, v in r.inputs.items()} for r in reqs]

    def __call__(self, i: int):
        self.fn(**{k: tf.constant(v) for k, v in self.inputs[i % len(self.inputs)].items()})


class GrpcCaller:
    def __init__(self, port: int, reqs):
        self.stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
        self.reqs = reqs

    def __call__(self, i: int):
        self.stub.Predict(self.reqs[i % len(self.reqs)], timeout=30)


class RestCaller:
    """http.client on one keep-alive connection: the lightest Python client, so the figure is
    the server's cost rather than a client library's."""

    def __init__(self, port: int, bodies: list[str]):
        self.conn, self.bodies = http.client.HTTPConnection("127.0.0.1", port), bodies

    def __call__(self, i: int):
        self.conn.request("POST", "/v1/models/taxi:predict", body=self.bodies[i % len(self.bodies)],
                          headers={"Content-Type": "application/json"})
        r = self.conn.getresponse()
        body = r.read()
        assert r.status == 200, body


def p50_of(call, calls: int) -> float:
    times = []
    for i in range(calls + 20):
        t0 = time.perf_counter()
        call(i)
        if i >= 20:
            times.append(time.perf_counter() - t0)
    return p50_ms(times)


def interleaved_rounds(callers: dict, calls: int, rounds: int) -> dict[str, list[float]]:
    """Each caller's p50 per round, the callers taking turns call by call (A B C A B C ...):
    for differences of a few percent, which the machine's drift over one caller's whole
    round would swamp."""
    out: dict[str, list[float]] = {k: [] for k in callers}
    for _ in range(rounds):
        times: dict[str, list[float]] = {k: [] for k in callers}
        for i in range(calls + 20):
            for name, call in callers.items():
                t0 = time.perf_counter()
                call(i)
                if i >= 20:
                    times[name].append(time.perf_counter() - t0)
        for name, t in times.items():
            out[name].append(p50_ms(t))
    return out


def latency_rounds(callers: dict, calls: int, rounds: int) -> dict[str, list[float]]:
    """Each caller's p50 per round, the callers taking turns round after round, so that the
    machine's drift (this host is shared; its speed moves by tens of percent over minutes)
    falls on all of them alike and each round's differences are fair."""
    out: dict[str, list[float]] = {k: [] for k in callers}
    for _ in range(rounds):
        for name, call in callers.items():
            out[name].append(p50_of(call, calls))
    return out


def grpc_throughput(port: int, reqs, clients: int, seconds: float) -> tuple[float, float]:
    """Requests/s and p50 latency (ms) with `clients` concurrent callers, each one request at a time."""
    async def run():
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            for r in reqs[:10]:
                await stub.Predict(r, timeout=30)
            done, times, failures = 0, [], 0
            end = time.perf_counter() + seconds

            async def client(k: int):
                nonlocal done, failures
                i = k
                while time.perf_counter() < end:
                    t0 = time.perf_counter()
                    try:
                        await stub.Predict(reqs[i % len(reqs)], timeout=30)
                        done += 1
                        times.append(time.perf_counter() - t0)
                    except grpc.aio.AioRpcError:
                        failures += 1
                    i += clients

            t0 = time.perf_counter()
            await asyncio.gather(*(client(k) for k in range(clients)))
            if failures:
                print(f"  ({failures} failed requests)")
            return done / (time.perf_counter() - t0), p50_ms(times)
    return asyncio.run(run())


def percentiles(times: list[float]) -> dict[str, float]:
    ms = np.sort(np.asarray(times)) * 1e3
    return {"n": len(ms), "p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99)),
            "p99.9": float(np.percentile(ms, 99.9)), "max": float(ms[-1])}


def rest_tail(port: int, bodies: list[str], clients: int, seconds: float) -> dict[str, float]:
    """`clients` keep-alive connections, each one request at a time, prebuilt bytes; every
    answer timed from write to the end of its body (Content-Length)."""
    requests_ = [(f"POST /v1/models/taxi:predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(b)}\r\n\r\n{b}").encode() for b in bodies]

    async def run():
        times: list[float] = []
        end = time.perf_counter() + seconds

        async def client(k: int):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            i = k
            while time.perf_counter() < end:
                t0 = time.perf_counter()
                writer.write(requests_[i % len(requests_)])
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(re.search(rb"(?i)content-length: *(\d+)", head)[1])
                await reader.readexactly(length)
                times.append(time.perf_counter() - t0)
                if not head.startswith(b"HTTP/1.1 200"):
                    raise SystemExit(f"REST answered {head[:40]!r}")
                i += clients
            writer.close()

        await asyncio.gather(*(client(k) for k in range(clients)))
        return times
    return percentiles(asyncio.run(run()))


def wrk_tail(port: int, body: str, clients: int, seconds: float, tmp: str) -> dict[str, float] | None:
    """The same load from wrk (Debian's package), if installed: its own latency percentiles."""
    import shutil as _shutil

    if _shutil.which("wrk") is None:
        return None
    script = os.path.join(tmp, "post.lua")
    with open(os.path.join(tmp, "body.json"), "w") as f:
        f.write(body)
    with open(script, "w") as f:
        f.write(f'wrk.method = "POST"\nwrk.body = io.open("{tmp}/body.json"):read("*a")\n'
                'wrk.headers["Content-Type"] = "application/json"\n'
                "done = function(summary, latency, requests)\n"
                "  for _, p in ipairs({50, 99, 99.9}) do io.write(string.format(\"tail p%g %d\\n\", p, "
                "latency:percentile(p))) end\n"
                '  io.write(string.format("tail max %d\\ntail n %d\\n", latency.max, summary.requests))\n'
                "end\n")
    out = subprocess.run(["wrk", "-t2", f"-c{clients}", f"-d{int(seconds)}s", "-s", script,
                          f"http://127.0.0.1:{port}/v1/models/taxi:predict"], capture_output=True, text=True,
                         timeout=seconds + 60).stdout
    got = dict(re.findall(r"^tail (\S+) (\d+)$", out, re.M))
    return {k: (int(v) if k == "n" else int(v) / 1e3) for k, v in got.items()}


def grpc_tail(port: int, reqs, clients: int, seconds: float) -> dict[str, float]:
    async def run():
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            times: list[float] = []
            end = time.perf_counter() + seconds

            async def client(k: int):
                i = k
                while time.perf_counter() < end:
                    t0 = time.perf_counter()
                    await stub.Predict(reqs[i % len(reqs)], timeout=30)
                    times.append(time.perf_counter() - t0)
                    i += clients

            await asyncio.gather(*(client(k) for k in range(clients)))
            return times
    return percentiles(asyncio.run(run()))


def tail_latency(path: str, reqs, bodies: list[str], tmp: str, clients: int, seconds: float) -> dict:
    """Per server variant (as shipped; TFPIPE_GC_FREEZE=0): REST, REST by wrk, gRPC."""
    import gc

    out = {}
    for variant, freeze in (("shipped", "1"), ("gc freeze off", "0")):
        os.environ["TFPIPE_GC_FREEZE"] = freeze
        try:
            proc, gport, rport = serve(path, batching=True, tmp=tmp, grpc_threads=clients)
        finally:
            os.environ.pop("TFPIPE_GC_FREEZE", None)
        try:
            rest_tail(rport, bodies, clients, 2.0)  # warm every connection's path
            gc.collect()
            gc.freeze()
            gc.disable()
            try:
                out[variant] = {"REST": rest_tail(rport, bodies, clients, seconds),
                                "REST (wrk)": wrk_tail(rport, bodies[0], clients, seconds, tmp),
                                "gRPC": grpc_tail(gport, reqs, clients, seconds)}
            finally:
                gc.enable()
        finally:
            proc.terminate()
            proc.wait()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--calls", type=int, default=300, help="calls per latency measurement (default 300)")
    ap.add_argument("--rounds", type=int, default=7, help="latency rounds, the callers taking turns (default 7)")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--batch-threads", type=int, default=1, help="num_batch_threads (default 1)")
    ap.add_argument("--batch-timeout-us", type=int, default=2000, help="batch_timeout_micros (default 2000)")
    ap.add_argument("--only-latency", action="store_true", help="measure only the concurrency-1 latencies")
    ap.add_argument("--only-tail", action="store_true", help="measure only the tail latency at --clients")
    ap.add_argument("--tail-seconds", type=float, default=30.0, help="seconds per tail-latency run (default 30)")
    ap.add_argument("--images", action="store_true", help="the image CNN of bench_export.py --images 4000")
    ap.add_argument("--only-batching", action="store_true", help="measure only throughput, batching on and off")
    ap.add_argument("--workers", type=lambda t: [int(x) for x in t.split(",")], default=[1, 2],
                    help="with --only-cpu: the --workers values to measure (default 1,2)")
    ap.add_argument("--only-cpu", action="store_true",
                    help="measure only the server's CPU per request and req/s at --clients (wrk or hey, ghz), "
                         "against the empty-handler floor")
    ap.add_argument("--against", metavar="TREE", help="with --only-cpu: this tree's server against TREE's (another "
                    "checkout of tfpipe with its own .venv, e.g. a git worktree of an earlier commit), taking turns")
    ap.add_argument("--cpu-rounds", type=int, default=9, help="with --against: pairs of bursts, each tree one "
                    "--seconds burst a pair (default 9)")
    ap.add_argument("--only-logging", action="store_true",
                    help="measure only request logging's cost: p50 at concurrency 1 and throughput at --clients, "
                         "every request logged (sampling_rate 1.0) against logging off")
    args = ap.parse_args()
    global NAME
    NAME = "images" if args.images else "taxi"
    path = model_dir()
    reqs = payloads(path)
    bodies = [rest_body(r) for r in reqs]
    print(f"model {path}: {len(reqs)} one-row requests from its warmup records")
    if args.only_batching:
        with tempfile.TemporaryDirectory() as tmp:
            off, off_p50, on, on_p50 = batching_on_off(path, reqs, tmp, args)
        print_batching(off, off_p50, on, on_p50, args)
        one, many = in_process_ceiling(path, reqs, 32)
        print(f"  in process, no server: {one:8.0f} rows/s one at a time, {many:8.0f} rows/s 32 at a time: "
              f"batching can gain at most {many / one:.2f}x on this machine")
        return
    if args.only_logging:
        with tempfile.TemporaryDirectory() as tmp:
            logging_cost(path, reqs, bodies, tmp, args)
        return
    if args.only_cpu:
        with tempfile.TemporaryDirectory() as tmp:
            if args.against:
                cpu_against(path, reqs, bodies[0], tmp, args)
            else:
                cpu_per_request(path, reqs, bodies[0], tmp, args)
        return
    if args.only_tail:
        with tempfile.TemporaryDirectory() as tmp:
            print_tail(tail_latency(path, reqs, bodies, tmp, args.clients, args.tail_seconds), args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        try:
            proc, gport, rport = serve(path, batching=False, tmp=tmp)
            procs.append(proc)
            proc, ports = start([sys.executable, os.path.join(HERE, "plain_grpc_server.py"), "echo", "0"],
                                r"at 127.0.0.1:(\d+)", 1)
            procs.append(proc)
            lat = latency_rounds({"in-process": InProcess(path, reqs), "grpc": GrpcCaller(gport, reqs),
                                  "rest": RestCaller(rport, bodies), "floor": GrpcCaller(ports[0], reqs)},
                                 args.calls, args.rounds)
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait()
        if not args.only_latency:
            off, off_p50, on, on_p50 = batching_on_off(path, reqs, tmp, args)
            proc, ports = start([sys.executable, os.path.join(HERE, "plain_grpc_server.py"), path, "0"],
                                r"at 127.0.0.1:(\d+)", 1)
            try:
                plain, plain_p50 = grpc_throughput(ports[0], reqs, args.clients, args.seconds)
            finally:
                proc.terminate()
                proc.wait()
            tails = tail_latency(path, reqs, bodies, tmp, args.clients, args.tail_seconds)
    med = {k: float(np.median(v)) for k, v in lat.items()}
    over = {k: float(np.median(np.subtract(lat[k], lat["in-process"]))) for k in ("grpc", "rest")}
    print(f"\nbatch-1 p50 latency, concurrency 1: {args.rounds} rounds of {args.calls} calls each, taking turns;"
          " medians over the rounds")
    print("  round p50s (ms): " + "; ".join(f"{k} " + " ".join(f"{x:.3f}" for x in v) for k, v in lat.items()))
    print(f"  SavedModel in-process  {med['in-process']:7.3f} ms")
    print(f"  gRPC                   {med['grpc']:7.3f} ms   overhead {over['grpc']:+.3f} ms (target <= 0.5)")
    print(f"  (gRPC floor: the same request to a server that answers an empty response: {med['floor']:.3f} ms)")
    print(f"  REST                   {med['rest']:7.3f} ms   overhead {over['rest']:+.3f} ms (target <= 1.0)")
    print("  (overhead: the median over rounds of that round's p50 minus its in-process p50)")
    if args.only_latency:
        return
    print_batching(off, off_p50, on, on_p50, args)
    print(f"  plain grpcio server    {plain:8.0f} req/s  (p50 {plain_p50:.2f} ms)   "
          f"embedded+batching/plain {on / plain:.2f}x (target >= 2)")
    print_tail(tails, args)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tree_cpu_seconds(pid: int) -> float:
    """User plus system CPU of a process and its children, as /proc counts it."""
    import psutil

    procs = [psutil.Process(pid)]
    procs += procs[0].children(recursive=True)
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def rest_client(port: int, path: str, body: str, clients: int, seconds: float, tmp: str) -> tuple[int, float, str]:
    """(answers, p99 ms, client) from wrk, else hey: C and Go clients that leave the cores to the server."""
    import shutil as _shutil

    with open(os.path.join(tmp, "body.json"), "w") as f:
        f.write(body)
    url = f"http://127.0.0.1:{port}{path}"
    if _shutil.which("wrk"):
        script = os.path.join(tmp, "post.lua")
        with open(script, "w") as f:
            f.write(f'wrk.method = "POST"\nwrk.body = io.open("{tmp}/body.json"):read("*a")\n'
                    'wrk.headers["Content-Type"] = "application/json"\n'
                    "done = function(summary, latency, requests)\n"
                    '  io.write(string.format("cpu n %d\\ncpu p99 %d\\ncpu errors %d\\n", summary.requests, '
                    "latency:percentile(99), summary.errors.status + summary.errors.connect + summary.errors.read))\n"
                    "end\n")
        out = subprocess.run(["wrk", "-t2", f"-c{clients}", f"-d{int(seconds)}s", "-s", script, url],
                             capture_output=True, text=True, timeout=seconds + 60).stdout
        got = dict(re.findall(r"^cpu (\S+) (\d+)$", out, re.M))
        if int(got.get("errors", 0)):
            raise SystemExit(f"wrk saw errors: {out}")
        return int(got["n"]), int(got["p99"]) / 1e3, "wrk"
    if not _shutil.which("hey"):
        raise SystemExit("--only-cpu needs wrk or hey (Debian: apt-get install wrk hey)")
    out = subprocess.run(["hey", "-z", f"{seconds}s", "-c", str(clients), "-m", "POST", "-T", "application/json",
                          "-D", os.path.join(tmp, "body.json"), url], capture_output=True, text=True,
                         timeout=seconds + 60).stdout
    n = int(re.search(r"\[200\]\s+(\d+)", out)[1])
    return n, float(re.search(r"99% in ([\d.]+)", out)[1]) * 1000, "hey"


def ghz_client(port: int, req, clients: int, seconds: float, tmp: str) -> tuple[int, float, str]:
    """(answers, p99 ms, "ghz") from ghz, a Go gRPC load client, sending `req` (a PredictRequest)."""
    import shutil as _shutil

    from google.protobuf import descriptor_pb2

    ghz = _shutil.which("ghz") or os.path.expanduser("~/go/bin/ghz")
    if not os.path.exists(ghz):
        raise SystemExit("--only-cpu needs ghz: go install github.com/bojand/ghz/cmd/ghz@latest")
    files, seen = descriptor_pb2.FileDescriptorSet(), set()

    def add(fd) -> None:  # the service's .proto files, dependencies first, as ghz reads them
        if fd.name in seen:
            return
        for dep in fd.dependencies:
            add(dep)
        seen.add(fd.name)
        fd.CopyToProto(files.file.add())

    from tensorflow_serving.apis import prediction_service_pb2

    add(prediction_service_pb2.DESCRIPTOR)
    protoset, data = os.path.join(tmp, "serving.protoset"), os.path.join(tmp, "request.bin")
    with open(protoset, "wb") as f:
        f.write(files.SerializeToString())
    with open(data, "wb") as f:
        f.write(req.SerializeToString())
    out = subprocess.run([ghz, "--insecure", "--protoset", protoset, "--call",
                          "tensorflow.serving.PredictionService/Predict", "--binary-file", data, "-c", str(clients),
                          "--connections", str(clients), "-z", f"{seconds}s", f"127.0.0.1:{port}"],
                         capture_output=True, text=True, timeout=seconds + 60).stdout
    ok = re.search(r"\[OK\]\s+(\d+)", out)
    if not ok:
        raise SystemExit(f"ghz got no answer: {out}")
    p99 = re.search(r"99 % in ([\d.]+) (\w+)", out)
    return int(ok[1]), float(p99[1]) * (1 if p99[2] == "ms" else 1e-3 if p99[2] in ("µs", "us") else 1000), "ghz"


def children_cpu_seconds() -> float:
    """User plus system CPU of this process's finished children (the load clients once run)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def client_run(proto: str, port: int, url: str, body: str, req, clients: int, seconds: float, warm_seconds: float,
               tmp: str):
    """`run(warm)` for `measured`: wrk (or hey) POSTing `body` to `url` for "rest", ghz sending `req`
    (a PredictRequest) for "grpc"; `warm_seconds` long when warm, else `seconds`."""
    def run(warm: bool):
        s = warm_seconds if warm else seconds
        if proto == "rest":
            return rest_client(port, url, body, clients, s, tmp)
        return ghz_client(port, req, clients, s, tmp)
    return run


def measured(pid: int, run) -> tuple[int, float, str, float, float]:
    """A warm-up second, then `run()` -> (answers, p99 ms, client) with the server tree's CPU per
    answer (us) and the client's CPU seconds."""
    run(warm=True)
    before, client_before = tree_cpu_seconds(pid), children_cpu_seconds()
    n, p99, client = run(warm=False)
    server = tree_cpu_seconds(pid) - before
    return n, p99, client, server / max(n, 1) * 1e6, children_cpu_seconds() - client_before


def cpu_per_request(path: str, reqs, body: str, tmp: str, args) -> None:
    """Server CPU per request and throughput, REST and gRPC, against the empty-handler floor."""
    rows = []
    secs = args.seconds

    def load(proto: str, port: int, url: str = "/v1/models/taxi:predict"):
        return client_run(proto, port, url, body, reqs[0], args.clients, secs, 2.0, tmp)

    for batching, workers in [(b, w) for b in (True, False) for w in args.workers]:
        # each worker sees 1/N of the clients: a batch as large as one process's would wait out its timeout
        proc, gport, rport = serve(path, batching=batching, tmp=tmp, grpc_threads=32,
                                   extra=(f"--workers={workers}",), max_batch=32 // workers)
        try:
            for proto, port in (("rest", rport), ("grpc", gport)):
                n, p99, client, cpu, client_cpu = measured(proc.pid, load(proto, port))
                rows.append((f"--workers {workers}, batching {'on' if batching else 'off'}, {proto.upper()}", client,
                             n / secs, p99, cpu, (cpu * n / 1e6 + client_cpu) / secs))
        finally:
            proc.terminate()
            proc.wait()
    floors = (("floor: aiohttp, fixed answer", ("noop_endpoint.py",), "rest", "/v1/models/noop:predict"),
              ("floor: grpc.aio, fixed answer", ("noop_grpc_endpoint.py", "--aio"), "grpc", ""),
              ("floor: grpcio thread pool, fixed answer", ("noop_grpc_endpoint.py",), "grpc", ""))
    for what, (script, *flags), proto, url in floors:  # the same load on an empty handler of each stack
        proc, ports = start([sys.executable, os.path.join(HERE, script), str(free_port()), *flags],
                            r"at 127.0.0.1:(\d+)", 1)
        try:
            n, p99, client, cpu, client_cpu = measured(proc.pid, load(proto, ports[0], url))
            rows.append((what, client, n / secs, p99, cpu, (cpu * n / 1e6 + client_cpu) / secs))
        finally:
            proc.terminate()
            proc.wait()
    print(f"\nserver CPU per request at {args.clients} clients, {secs:g} s each (batching: max 32 split among the "
          f"workers, 2 ms, 1 thread per worker; CPU summed over the server's processes; {os.cpu_count()} cores shared with the client)")
    print(f"  {'tfpipe serve / floor':42s} {'client':6s} {'req/s':>8s} {'p99 ms':>8s} {'CPU us/req':>11s} {'busy cores':>11s}")
    for what, client, rps, p99, cpu, busy in rows:
        print(f"  {what:42s} {client:6s} {rps:8.0f} {p99:8.2f} {cpu:11.0f} {busy:11.2f}")
    print(f"  (busy cores: the server's and the client's CPU seconds per second, of the {os.cpu_count()} there are)")
    one = {r[0].split(", ", 1)[1]: r[2] for r in rows if r[0].startswith("--workers 1,")}
    for what, _, rps, _, _, _ in rows:
        if what.startswith("--workers") and not what.startswith("--workers 1,") and what.split(", ", 1)[1] in one:
            print(f"  {what}: {rps / one[what.split(', ', 1)[1]]:.2f}x the throughput of one worker")


def cpu_against(path: str, reqs, body: str, tmp: str, args) -> None:
    """Server CPU per request, this tree's server against `args.against`'s (another checkout of
    tfpipe with its own .venv): one worker, batching on and off, REST and gRPC. Both trees' servers
    run at once and the load goes to each in turn, --cpu-rounds short bursts of --seconds (the
    tree going first alternates), so that each burst of this tree has one of the other beside it
    in time: this shared host's speed drifts within minutes, and a pair's ratio is what the drift
    touches least. Printed: the medians of each tree's bursts, the median of the pairs' ratios,
    and in how many pairs this tree cost more."""
    import statistics

    trees = {"this tree": ROOT, "--against": os.path.abspath(args.against)}
    found: dict[tuple[str, str], dict[str, list[float]]] = {}
    for batching in (True, False):
        servers = {}
        try:
            for name, tree in trees.items():
                servers[name] = serve(path, batching=batching, tmp=tmp, grpc_threads=32, extra=("--workers=1",),
                                      max_batch=32, tree=tree)

            def burst(name: str, proto: str, seconds: float) -> float:
                proc, gport, rport = servers[name]
                return measured(proc.pid, client_run(proto, rport if proto == "rest" else gport,
                                                     "/v1/models/taxi:predict", body, reqs[0], args.clients,
                                                     seconds, 1.0, tmp))[3]

            for name in trees:  # warm: the first seconds of a server cost more than the rest
                for proto in ("rest", "grpc"):
                    burst(name, proto, 2.0)
            for i in range(args.cpu_rounds):
                for proto in ("rest", "grpc"):
                    key = (f"batching {'on' if batching else 'off'}", proto.upper())
                    for name in (list(trees) if i % 2 == 0 else list(trees)[::-1]):
                        found.setdefault(key, {}).setdefault(name, []).append(burst(name, proto, args.seconds))
        finally:
            for proc, *_ in servers.values():
                proc.terminate()
                proc.wait()
    print(f"\nserver CPU per request (us), --workers 1, {args.clients} clients, {args.cpu_rounds} pairs of "
          f"{args.seconds:g} s bursts taking turns; --against {args.against}")
    print(f"  {'':22s} {'this tree':>10s} {'--against':>10s} {'ratio':>7s} {'pairs':>6s} {'above':>6s}")
    for (batching, proto), by in found.items():
        this, other = by["this tree"], by["--against"]
        pairs = [a / b for a, b in zip(this, other)]
        print(f"  {batching + ', ' + proto:22s} {statistics.median(this):10.0f} {statistics.median(other):10.0f} "
              f"{statistics.median(this) / statistics.median(other):7.2f} {statistics.median(pairs):6.2f} "
              f"{sum(r > 1 for r in pairs):>3d}/{len(pairs)}")
    print("  (ratio: of the medians; pairs: the median of each pair's ratio; above: the pairs in which this "
          "tree cost more)")


def batching_on_off(path: str, reqs, tmp: str, args) -> tuple[float, float, float, float]:
    """gRPC throughput and p50 at --clients clients: the server without batching, then with it."""
    results = []
    for batching in (False, True):
        proc, gport, _ = serve(path, batching=batching, tmp=tmp, threads=args.batch_threads,
                               timeout_us=args.batch_timeout_us, grpc_threads=args.clients)
        try:
            results += grpc_throughput(gport, reqs, args.clients, args.seconds)
        finally:
            proc.terminate()
            proc.wait()
    return tuple(results)


def logging_cost(path: str, reqs, bodies: list[str], tmp: str, args) -> None:
    """Two servers, one logging every request to TFRecord files (--request_log_prefix, rate 1.0),
    one not: their p50s at concurrency 1 taking turns for --rounds rounds (gRPC and REST), then
    gRPC throughput at --clients clients, each server in turn; and the records the log holds."""
    from tfpipe.prediction_logs import read_log

    prefix = os.path.join(tmp, "logs", NAME)
    procs, callers = [], {}
    try:
        for name, extra in (("off", ()), ("on", (f"--request_log_prefix={prefix}",))):
            proc, gport, rport = serve(path, batching=False, tmp=tmp, extra=extra)
            procs.append(proc)
            callers[f"grpc {name}"] = GrpcCaller(gport, reqs)
            callers[f"rest {name}"] = RestCaller(rport, bodies)
        lat = interleaved_rounds(callers, args.calls, args.rounds)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait()
    through: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
    for order in (("off", "on"), ("on", "off"), ("off", "on")):  # each first in turn: drift falls on both
        for name in order:
            extra = (f"--request_log_prefix={prefix}",) if name == "on" else ()
            proc, gport, _ = serve(path, batching=False, tmp=tmp, grpc_threads=args.clients, extra=extra)
            try:
                through[name].append(grpc_throughput(gport, reqs, args.clients, args.seconds))
            finally:
                proc.terminate()
                proc.wait()
    logged = len(read_log(prefix).records)
    sent = 2 * args.rounds * (args.calls + 20) + 10
    print(f"\nrequest logging, every request (sampling_rate 1.0) to TFRecord files, against logging off:"
          f" {args.rounds} rounds of {args.calls} calls each, the servers taking turns call by call; "
          "medians over the rounds")
    for api in ("grpc", "rest"):
        on, off = lat[f"{api} on"], lat[f"{api} off"]
        ratio = float(np.median(np.divide(on, off)))
        print(f"  {api:4s} p50 off {np.median(off):7.3f} ms   on {np.median(on):7.3f} ms   "
              f"overhead {100 * (ratio - 1):+.1f}% (target < 5%)   round ratios "
              + " ".join(f"{a / b:.3f}" for a, b in zip(on, off, strict=True)))
    rates = {k: [r for r, _ in v] for k, v in through.items()}
    print(f"  gRPC throughput, {args.clients} clients, {args.seconds:g} s per run, three runs each, alternating "
          f"which goes first: off " + " ".join(f"{r:.0f}" for r in rates["off"]) + " req/s, on "
          + " ".join(f"{r:.0f}" for r in rates["on"]) + f" req/s: on/off {np.median(rates['on']) / np.median(rates['off']):.3f}x"
          " (medians)")
    print(f"  records in the log: {logged} (the logging server answered at least {sent} at concurrency 1)")


def in_process_ceiling(path: str, reqs, batch: int, seconds: float = 5.0) -> tuple[float, float]:
    """Rows/s of the SavedModel called in this process one row at a time and `batch` rows at a
    time, one call after another: what batching could gain at most, with no server around it."""
    fn = tf.saved_model.load(path).signatures["serving_default"]
    rows = [{k: tf.make_ndarray(v) for k, v in r.inputs.items()} for r in reqs]
    rates = []
    for size in (1, batch):
        feeds = [{k: tf.constant(np.concatenate([rows[(i + j) % len(rows)][k] for j in range(size)]))
                  for k in rows[0]} for i in range(0, len(rows), size)]
        fn(**feeds[0])
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            fn(**feeds[n % len(feeds)])
            n += 1
        rates.append(n * size / (time.perf_counter() - t0))
    return rates[0], rates[1]


def print_batching(off: float, off_p50: float, on: float, on_p50: float, args) -> None:
    print(f"\nthroughput, {args.clients} concurrent gRPC clients, one {'image' if args.images else 'row'} per "
          f"request, {args.seconds:g} s each, --grpc_max_threads={args.clients}")
    print(f"  embedded, batching off {off:8.0f} req/s  (p50 {off_p50:.2f} ms)")
    print(f"  embedded, batching on  {on:8.0f} req/s  (p50 {on_p50:.2f} ms)   on/off {on / off:.2f}x (target >= 3)")


def print_tail(tails: dict, args) -> None:
    print(f"\ntail latency, {args.clients} concurrent clients, batching on (max 32, 2 ms timeout, 1 thread), one row "
          f"per request, {args.tail_seconds:g} s each (ms)")
    for variant, rows in tails.items():
        for api, r in rows.items():
            if r is None:
                print(f"  {variant:14s} {api:11s} (wrk is not installed)")
                continue
            print(f"  {variant:14s} {api:11s} n={r['n']:6d}  p50 {r['p50']:7.2f}  p99 {r['p99']:7.2f}  "
                  f"p99.9 {r['p99.9']:7.2f}  max {r['max']:7.2f}   p99.9/p99 {r['p99.9'] / r['p99']:.2f}x"
                  + (" (target <= 3)" if variant == "shipped" else ""))


if __name__ == "__main__":
    main()
