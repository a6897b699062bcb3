"""One load step, run by locust as a library in its own process (locust's gevent
monkey-patching stays out of the caller's process).

    python -m loadtest.generate SPEC.json RESULT.json

SPEC: target kind (rest/grpc), address, payloads, users, rate (open model) or none
(closed model), warmup, duration, max_requests. RESULT: a microsecond histogram of every
answered request, error counts by type, requests, elapsed time, the generator's CPU use.
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import base64  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import gevent  # noqa: E402
import psutil  # noqa: E402
from locust import FastHttpUser, User, constant, task  # noqa: E402
from locust.env import Environment  # noqa: E402

from loadtest.histogram import LatencyHistogram  # noqa: E402


class Schedule:
    """Open model: request k is due at start + k / rate; latency counts from that time, so
    a slow server cannot hide queueing by delaying the generator (coordinated omission)."""

    def __init__(self, rate: float):
        self.rate = rate
        self.start: float | None = None  # set by the first request, so no backlog builds before
        self.counter = itertools.count()

    def next_slot(self) -> float:
        if self.start is None:
            self.start = time.perf_counter()
        slot = self.start + next(self.counter) / self.rate
        delay = slot - time.perf_counter()
        if delay > 0:
            gevent.sleep(delay)
        return slot


def rest_user(spec: dict, schedule: Schedule | None):
    bodies = [b.encode() for b in spec["bodies"]]
    counter = itertools.count()
    headers = {"Content-Type": "application/json"}

    class RestUser(FastHttpUser):
        host = spec["address"]
        wait_time = constant(0)

        @task
        def predict(self):
            body = bodies[next(counter) % len(bodies)]
            if schedule is None:
                with self.client.post(spec["path"], data=body, headers=headers, name="predict",
                                      catch_response=True) as r:
                    if r.status_code != 200:
                        r.failure(f"HTTP {r.status_code}")
                return
            slot = schedule.next_slot()
            error = None
            try:
                r = self.client.post(spec["path"], data=body, headers=headers, name="predict")
                if r.status_code != 200:
                    error = Exception(f"HTTP {r.status_code}")
            except Exception as e:  # connection errors count, they do not stop the user
                error = e
            self.environment.events.request.fire(request_type="POST", name="predict(open)",
                                                 response_time=(time.perf_counter() - slot) * 1000,
                                                 response_length=0, exception=error, context={})

    return RestUser


def grpc_user(spec: dict, schedule: Schedule | None):
    import grpc
    import grpc.experimental.gevent as grpc_gevent
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    grpc_gevent.init_gevent()
    requests = [predict_pb2.PredictRequest.FromString(base64.b64decode(r)) for r in spec["requests"]]
    counter = itertools.count()

    class GrpcUser(User):
        wait_time = constant(0)

        def on_start(self):
            self.stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(spec["address"]))

        @task
        def predict(self):
            req = requests[next(counter) % len(requests)]
            start = schedule.next_slot() if schedule else time.perf_counter()
            error = None
            try:
                self.stub.Predict(req, timeout=30)
            except grpc.RpcError as e:
                error = Exception(f"gRPC {e.code().name}")
            self.environment.events.request.fire(request_type="grpc", name="Predict",
                                                 response_time=(time.perf_counter() - start) * 1000,
                                                 response_length=0, exception=error, context={})

    return GrpcUser


class Recorder:
    """Every answer, by wall-clock second (whole seconds line up across worker processes)."""

    def __init__(self):
        self.seconds: dict[int, dict] = {}

    def on_request(self, response_time, exception, **_):
        now = time.time()
        sec = self.seconds.setdefault(int(now), {"hist": LatencyHistogram(), "errors": {}, "requests": 0})
        sec["requests"] += 1
        if exception is None:
            sec["hist"].add(response_time / 1000)
        else:
            kind = str(exception).splitlines()[0][:120] or type(exception).__name__
            sec["errors"][kind] = sec["errors"].get(kind, 0) + 1

    def pop_completed(self) -> dict[str, dict]:
        """Finished seconds, serialisable (for the report a worker sends its master)."""
        done = {}
        for k in [k for k in self.seconds if k < int(time.time())]:
            sec = self.seconds.pop(k)
            done[str(k)] = {"hist": sec["hist"].to_json(), "errors": sec["errors"], "requests": sec["requests"]}
        return done


def _summarise_window(seconds: dict[str, dict], first: int, last: int) -> dict:
    hist, errors, requests, series = LatencyHistogram(), {}, 0, []
    for k in range(first, last):
        sec = seconds.get(str(k))
        if sec is None:
            series.append({"second": k - first, "answered": 0, "p99_ms": None})
            continue
        h = LatencyHistogram.from_json(sec["hist"])
        hist.merge(h)
        for kind, c in sec["errors"].items():
            errors[kind] = errors.get(kind, 0) + c
        requests += sec["requests"]
        series.append({"second": k - first, "answered": h.n, "p99_ms": h.percentile(99) if h.n else None})
    return {"histogram": hist.to_json(), "requests": requests, "errors": errors, "elapsed_s": float(last - first), "series": series}


def _user_class(spec: dict, share: float):
    rate = spec.get("rate")
    schedule = Schedule(rate * share) if rate else None
    return rest_user(spec, schedule) if spec["kind"] == "rest" else grpc_user(spec, schedule)


def _tree_cpu(proc: psutil.Process) -> float:
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += sum(p.cpu_times()[:2])
        except psutil.Error:
            pass
    return total


def run(spec: dict) -> dict:
    """One step: load for warmup + duration; measure whole seconds after the warmup."""
    workers = spec.get("workers", 1)
    env = Environment(user_classes=[_user_class(spec, 1.0)] if workers <= 1 else [_user_class(spec, 1.0 / workers)])
    merged: dict[str, dict] = {}
    recorder = Recorder()
    procs = []
    if workers <= 1:
        env.events.request.add_listener(recorder.on_request)
        runner = env.create_local_runner()
    else:
        import socket
        import subprocess

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        runner = env.create_master_runner("127.0.0.1", port)
        env.events.worker_report.add_listener(lambda client_id, data: merged.update(data.get("tfpipe", {})))
        procs = [subprocess.Popen([sys.executable, "-m", "loadtest.generate", "--worker", str(port), sys.argv[1]])
                 for _ in range(workers)]
        deadline = time.time() + 120
        while runner.worker_count < workers and time.time() < deadline:
            gevent.sleep(0.1)
        if runner.worker_count < workers:
            raise SystemExit(f"only {runner.worker_count} of {workers} locust workers connected")
    if spec.get("web_port") is not None:
        env.create_web_ui("127.0.0.1", spec["web_port"])
    stop = []
    gevent.signal_handler(signal.SIGINT, lambda: stop.append(True))  # stop early, keep whole seconds
    users = spec["users"]
    runner.start(users, spawn_rate=max(users, 1) * 10)
    started = time.time()
    first = math.ceil(started + spec["warmup"])
    last = first + max(1, math.ceil(spec["duration"]))
    me = psutil.Process()
    cpu0, next_report = None, 0.0
    while time.time() < last:
        now = time.time()
        if cpu0 is None and now >= first:
            cpu0 = _tree_cpu(me)
        if stop:
            last = max(first, int(now))
            break
        # Answers in the window so far: this process's own (one process) or the workers' reports.
        seconds = [*recorder.seconds.items(), *((int(k), v) for k, v in merged.items())]
        if sum(v["requests"] for k, v in seconds if first <= k < last) >= spec["max_requests"]:
            last = int(now) + 1
            break
        if now >= next_report:  # for the parent's progress bar
            print(f"PROGRESS {now - started:.1f} {sum(v['requests'] for _, v in seconds)}", flush=True)
            next_report = now + 0.5
        gevent.sleep(0.05)
    gevent.sleep(max(0.0, last - time.time()))
    cpu = (_tree_cpu(me) - cpu0) / (last - first) if cpu0 is not None and last > first else 0.0
    if workers > 1:
        gevent.sleep(WORKER_REPORT_INTERVAL * 2.5)  # the workers' reports of the last second
    else:
        merged.update(recorder.pop_completed())
    runner.quit()
    if env.web_ui is not None:
        env.web_ui.stop()
    for p in procs:
        p.wait(timeout=30)
    result = _summarise_window(merged, first, last)
    result["generator_cpu"] = cpu
    result["workers"] = workers
    result["interrupted"] = bool(stop)
    return result


def worker(port: int, spec: dict) -> None:
    """A locust worker: runs users for its master, reports finished seconds every interval."""
    import locust.runners

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the master decides when workers stop
    locust.runners.WORKER_REPORT_INTERVAL = WORKER_REPORT_INTERVAL
    env = Environment(user_classes=[_user_class(spec, 1.0 / spec["workers"])])
    recorder = Recorder()
    env.events.request.add_listener(recorder.on_request)
    env.events.report_to_master.add_listener(lambda client_id, data: data.update({"tfpipe": recorder.pop_completed()}))
    runner = env.create_worker_runner("127.0.0.1", port)
    runner.greenlet.join()


WORKER_REPORT_INTERVAL = 0.5


def main() -> None:
    if sys.argv[1] == "--worker":
        worker(int(sys.argv[2]), json.load(open(sys.argv[3])))
        return
    spec = json.load(open(sys.argv[1]))
    result = run(spec)
    with open(sys.argv[2], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
