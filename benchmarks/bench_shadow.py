"""What shadow traffic costs the server: CPU time per request with `--shadow=1` against without it,
side by side in one run, on the penguins model.

    python benchmarks/bench_shadow.py [--rounds 4] [--requests 800] [--clients 2]

The model (cached in .bench/shadow/): palmerpenguins' CSV through `tfpipe data`, trained twice by
`tfpipe train` (the served version 20 epochs, seed 42; the candidate 2 epochs, seed 7, so that some
answers differ), exported by `tfpipe export` as version 1 and as a candidate
(`--promote never`: BASE/penguins/candidates/2). The requests are version 1's warmup records (eval
rows, one row each), sent as gRPC Predicts without a version, from --clients threads of this
process, each on a channel of its own.

How the two are compared: two server processes (`tfpipe serve --workers=1`) run at once on the same
base path, one with `--shadow=1`, one without, both warmed up; they take turns, off, on, off, on
(--rounds pairs), each round --requests requests to one server while the other idles. A round's
CPU is the server process's user + system time over the round (from /proc); per request, the
round's CPU over its requests. The ratio is the median of the rounds' on/off ratios, each shadow
round over the plain round just before it, so that a machine slowing down for both does not count
against the shadow (the same reasoning as the serving gate's rounds). Alternating processes rather
than one server switched on and off: the flag is read at start, and two processes that stay up
keep their caches warm and their memory laid out once, so the rounds differ only by the shadow.

The goal is that shadowing costs no more than 10% plus the candidate's own TensorFlow time: that
time is estimated in this process by calling the candidate's SavedModel (through tfpipe's
Servable, as the shadow thread does, the inputs checked) on the same rows, CPU time per call, two
ways: in a tight loop on one thread (TensorFlow's threads stay warm: the least it costs), and each
call handed to a thread of its own and waited for (a thread's wake-up, and TensorFlow's inter-op
threads woken from idle, count). Both goals are printed. The shadow answers mirrored requests
that wait together with one call of the candidate (serve/core/shadow.py), so under load its own
calls cost less per request than either reference; the references stay one row a call, the cost
the goal allows. The shadow server's mirrored and skipped requests (its Prometheus page) are
printed with each round: a request drawn when 1,024 rows already wait is skipped, which would
lower the cost.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from bench_serve import start, tree_cpu_seconds  # noqa: E402

WORK = os.path.join(ROOT, ".bench", "shadow")
NAME = "penguins"


def tfpipe(*args: str, ok: tuple[int, ...] = (0,)) -> None:
    r = subprocess.run([sys.executable, "-m", "tfpipe.cli", *args], cwd=ROOT, capture_output=True, text=True)
    if r.returncode not in ok:
        raise SystemExit(f"tfpipe {' '.join(args)} failed ({r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}")


def build() -> str:
    """The penguins model base path with version 1 served and version 2 a candidate (built once)."""
    import palmerpenguins

    base = os.path.join(WORK, "models")
    if os.path.isdir(os.path.join(base, NAME, "candidates", "2")):
        return base
    import shutil

    shutil.rmtree(WORK, ignore_errors=True)
    csv = os.path.join(os.path.dirname(palmerpenguins.__file__), "data", "penguins.csv")
    data = os.path.join(WORK, "data")
    t0 = time.time()
    tfpipe("data", "--input", csv, "--label", "species", "--out", data)
    for out, epochs, seed in (("served", "20", "42"), ("candidate", "2", "7")):
        tfpipe("train", "--data", data, "--out", os.path.join(WORK, out), "--epochs", epochs, "--seed", seed,
               "--learning-rate", "0.01")
    tfpipe("export", "--model", os.path.join(WORK, "served"), "--data", data, "--base", base, "--name", NAME,
           "--tflite", "")
    tfpipe("export", "--model", os.path.join(WORK, "candidate"), "--data", data, "--base", base, "--name", NAME,
           "--tflite", "", "--promote", "never", ok=(0, 1))  # held as a candidate: exit 1
    if not os.path.isdir(os.path.join(base, NAME, "candidates", "2")):
        raise SystemExit(f"the candidate's export did not land in {base}/{NAME}/candidates/2")
    print(f"built {base} in {time.time() - t0:.0f} s (data, two trainings, two exports)")
    return base


def requests_of(version_dir: str) -> list:
    """The version's warmup records as PredictRequests naming the model and no version."""
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    out = []
    for r in tf.data.TFRecordDataset(os.path.join(version_dir, "assets.extra", "tf_serving_warmup_requests")):
        log = prediction_log_pb2.PredictionLog.FromString(r.numpy())
        if log.WhichOneof("log_type") == "predict_log":
            req = log.predict_log.request
            req.model_spec.name = NAME
            req.model_spec.ClearField("version")
            out.append(req)
    if not out:
        raise SystemExit(f"{version_dir} has no Predict warmup records to send")
    return out


def in_process_cpu(version_dir: str, reqs, calls: int) -> tuple[float, float]:
    """CPU seconds per call of a version's SavedModel in this process, as the shadow thread calls a
    candidate (signature, checked inputs, run), on the requests' rows in turn: called in a loop on
    one thread, and each call handed to a thread of its own and waited for (as the shadow's
    executor gets each mirrored call: the thread's wake-up and TensorFlow's then-idle threads count)."""
    from concurrent.futures import ThreadPoolExecutor

    from tfpipe.serve.codecs.tensor_proto import predict_inputs
    from tfpipe.serve.core.servable import Servable

    servable = Servable(NAME, 0, version_dir)
    inputs = [predict_inputs(r) for r in reqs]
    sig = servable.signature(reqs[0].model_spec.signature_name)

    def call(i: int) -> None:
        servable.run(sig, servable.check_inputs(sig, inputs[i % len(inputs)]))

    out = []
    with ThreadPoolExecutor(1) as thread:
        for run in (call, lambda i: thread.submit(call, i).result()):
            for i in range(50):
                run(i)
            t0 = time.process_time()
            for i in range(calls):
                run(i)
            out.append((time.process_time() - t0) / calls)
    return out[0], out[1]


def serve(base: str, *flags: str):
    mon = os.path.join(tempfile.mkdtemp(prefix="bench-shadow-"), "monitoring.config")
    with open(mon, "w") as f:
        f.write('prometheus_config { enable: true path: "/metrics" }')
    proc, ports = start([sys.executable, "-m", "tfpipe.cli", "serve", "--workers=1", "--host=127.0.0.1", "--port=-1",
                         "--rest_api_port=-1", f"--model_name={NAME}", f"--model_base_path={os.path.join(base, NAME)}",
                         f"--monitoring_config_file={mon}", *flags], r"at:?\s*[\d.]+:(\d+)", 2)
    return proc, ports[0], ports[1]


def candidate_loaded(rest_port: int, timeout: float = 120) -> None:
    """Wait until the shadow server mirrors to the candidate (it loads after the ports open)."""
    import requests

    deadline = time.monotonic() + timeout
    while "tfpipe_serving_shadow_candidate_version{" not in requests.get(
            f"http://127.0.0.1:{rest_port}/metrics", timeout=30).text:
        if time.monotonic() > deadline:
            raise SystemExit(f"the shadow server did not load the candidate within {timeout:g} s")
        time.sleep(0.05)


def drawn(rest_port: int) -> dict[str, float]:
    """The shadow server's mirrored and skipped requests so far (its Prometheus page)."""
    import requests

    page = requests.get(f"http://127.0.0.1:{rest_port}/metrics", timeout=30).text
    out = {"mirrored": 0.0, "skipped": 0.0}
    for outcome, n in re.findall(r'^tfpipe_serving_shadow_requests_total\{[^}]*outcome="(\w+)"\} (\S+)$', page, re.M):
        out[outcome] += float(n)
    return out


def settled(rest_port: int, before: dict[str, float], n: int, timeout: float = 60) -> None:
    """Wait until the round's n requests are each mirrored (the candidate answered) or skipped."""
    deadline = time.monotonic() + timeout
    while True:
        after = drawn(rest_port)
        if after["mirrored"] + after["skipped"] - before["mirrored"] - before["skipped"] >= n:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"the shadow server's mirrored calls did not settle within {timeout:g} s")
        time.sleep(0.01)


def load(grpc_port: int, reqs, n: int, clients: int) -> None:
    """n Predicts from `clients` threads, each on a channel of its own; every answer must be OK."""
    import grpc
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    counter = iter(range(n))
    lock, errors = threading.Lock(), []

    def client() -> None:
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}", options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(ch)
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                try:
                    stub.Predict(reqs[i % len(reqs)], timeout=30)
                except grpc.RpcError as e:
                    errors.append(e.code().name)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit(f"{len(errors)} request(s) failed: {sorted(set(errors))}")


def rounds(servers: dict, reqs, args) -> dict[str, list[float]]:
    """CPU microseconds per request, round by round: off, on, off, on, ..."""
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    for name, (proc, grpc_port, _) in servers.items():  # warm both: first calls, the candidate's too
        load(grpc_port, reqs, 200, args.clients)
    for r in range(args.rounds):
        for name in ("off", "on"):
            proc, grpc_port, rest_port = servers[name]
            before = drawn(rest_port) if name == "on" else None
            t0, w0 = tree_cpu_seconds(proc.pid), time.perf_counter()
            load(grpc_port, reqs, args.requests, args.clients)
            if before is not None:  # the round's mirrored calls finish on the shadow thread
                settled(rest_port, before, args.requests)
            used, wall = tree_cpu_seconds(proc.pid) - t0, time.perf_counter() - w0
            cpu[name].append(used / args.requests * 1e6)
            extra = ""
            if before is not None:
                after = drawn(rest_port)
                extra = (f"; mirrored {after['mirrored'] - before['mirrored']:.0f}, "
                         f"skipped {after['skipped'] - before['skipped']:.0f}")
            print(f"  round {r + 1} shadow {name:<3}: {cpu[name][-1]:7.0f} us CPU/request, "
                  f"{args.requests / wall:6.0f} requests/s{extra}", flush=True)
    return cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4, help="off/on pairs (default 4)")
    ap.add_argument("--requests", type=int, default=800, help="requests per round (default 800)")
    ap.add_argument("--clients", type=int, default=2, help="concurrent gRPC clients (default 2)")
    args = ap.parse_args()
    base = build()
    reqs = requests_of(os.path.join(base, NAME, "1"))
    served_cpu = in_process_cpu(os.path.join(base, NAME, "1"), reqs, 2000)
    candidate_cpu = in_process_cpu(os.path.join(base, NAME, "candidates", "2"), reqs, 2000)
    servers = {"off": serve(base), "on": serve(base, "--shadow=1")}
    try:
        candidate_loaded(servers["on"][2])
        print(f"penguins, gRPC Predict, 1 row a request, {args.clients} clients, {args.requests} requests a round, "
              f"{args.rounds} rounds each (one server process each, taking turns)")
        cpu = rounds(servers, reqs, args)
    finally:
        for proc, _, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=60)
    ratios = [on / off for off, on in zip(cpu["off"], cpu["on"], strict=True)]
    off, on = statistics.median(cpu["off"]), statistics.median(cpu["on"])
    ratio = statistics.median(ratios)
    print(f"server CPU per request: shadow off {off:.0f} us, on {on:.0f} us (medians); on/off by round: "
          + ", ".join(f"{r:.2f}" for r in ratios) + f"; median {ratio:.2f}; extra {on - off:.0f} us a request")
    print(f"the candidate's TensorFlow call in-process: {candidate_cpu[0] * 1e6:.0f} us CPU in a loop, "
          f"{candidate_cpu[1] * 1e6:.0f} us handed to a thread of its own each (the served version's: "
          f"{served_cpu[0] * 1e6:.0f} us, {served_cpu[1] * 1e6:.0f} us)")
    for how, c in (("in a loop", candidate_cpu[0]), ("handed to a thread", candidate_cpu[1])):
        goal = 1.1 + c * 1e6 / off
        print(f"goal, the candidate's call {how}: ratio within 1.1 + {c * 1e6:.0f}/{off:.0f} = {goal:.2f}: "
              f"{'met' if ratio <= goal else 'NOT met'}")

if __name__ == "__main__":
    main()
