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
        self.start = time.perf_counter()
        self.counter = itertools.count()

    def next_slot(self) -> float:
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


def run(spec: dict) -> dict:
    rate = spec.get("rate")
    schedule = Schedule(rate) if rate else None
    user = rest_user(spec, schedule) if spec["kind"] == "rest" else grpc_user(spec, schedule)
    env = Environment(user_classes=[user])
    hist, errors = LatencyHistogram(), {}
    state = {"measuring": False, "requests": 0, "t0": 0.0}
    series: dict[int, list[float]] = {}  # second of the step -> response times (ms) answered in it

    def on_request(response_time, exception, **_):
        if not state["measuring"]:
            return
        state["requests"] += 1
        if exception is None:
            hist.add(response_time / 1000)
            series.setdefault(int(time.perf_counter() - state["t0"]), []).append(response_time)
        else:
            kind = str(exception).splitlines()[0][:120] or type(exception).__name__
            errors[kind] = errors.get(kind, 0) + 1
        if state["requests"] >= spec["max_requests"]:
            gevent.spawn(runner.quit)

    env.events.request.add_listener(on_request)
    runner = env.create_local_runner()
    users = spec["users"]
    runner.start(users, spawn_rate=max(users, 1) * 10)
    gevent.sleep(spec["warmup"])
    if schedule:  # restart the schedule so warmup backlog does not count
        schedule.start, schedule.counter = time.perf_counter(), itertools.count()
    me = psutil.Process()
    cpu0, t0 = sum(me.cpu_times()[:2]), time.perf_counter()
    state["t0"] = t0
    state["measuring"] = True
    deadline = t0 + spec["duration"]
    while time.perf_counter() < deadline and state["requests"] < spec["max_requests"]:
        gevent.sleep(0.05)
    state["measuring"] = False
    elapsed = time.perf_counter() - t0
    cpu = (sum(me.cpu_times()[:2]) - cpu0) / elapsed
    runner.quit()
    return {"histogram": hist.to_json(), "n": hist.n, "total_us": hist.total_us, "max_us": hist.max_us,
            "requests": state["requests"], "errors": errors, "elapsed_s": elapsed, "generator_cpu": cpu,
            "series": [{"second": k, "answered": len(v), "p99_ms": sorted(v)[max(0, -(-99 * len(v) // 100) - 1)]}
                       for k, v in sorted(series.items()) if k < int(elapsed + 0.999)]}


def main() -> None:
    spec = json.load(open(sys.argv[1]))
    result = run(spec)
    with open(sys.argv[2], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
