"""One load step, run with locust as a library in a process of its own, after gevent's
monkey-patching (tfpipe.loadtest.generate is the entry point that patches, then imports this
module). Reads a StepSpec, writes the step's result: a microsecond histogram of every
answered request per second, error counts by type, requests, elapsed time, the generator's
CPU use. While it runs, it prints Progress and Waiting messages (tfpipe.loadtest.protocol)."""

from __future__ import annotations

import base64
import itertools
import math
import signal
import socket
import subprocess
import sys
import time
import uuid

import gevent
import psutil
from locust import User, constant, task
from locust.env import Environment

from tfpipe.children import module_argv
from tfpipe.loadtest.errors import LoadtestError
from tfpipe.loadtest.histogram import LatencyHistogram
from tfpipe.loadtest.http_client import HttpError, TimedConnection, build_request
from tfpipe.loadtest.protocol import Progress, StepSpec, Waiting, encode

WORKER_REPORT_INTERVAL = 0.5  # seconds between a worker's reports to its master


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


def _post(conn: TimedConnection, raw: bytes) -> tuple[Exception | None, int, float, float]:
    """One POST on a keep-alive connection: (error, response length, seconds, when it went out).
    A status other than 200 and a failed connection are errors; neither stops the user."""
    error, length, start = None, 0, time.perf_counter()
    try:
        status, length, seconds, start = conn.request(raw)
        if status != 200:
            error = Exception(f"HTTP {status}")
    except (OSError, HttpError) as e:
        error, seconds = e, time.perf_counter() - start
    return error, length, seconds, start


def _call(method, request) -> Exception | None:
    """One gRPC call; its status as the error, None when OK."""
    import grpc

    try:
        method(request, timeout=30)
    except grpc.RpcError as e:
        return Exception(f"gRPC {e.code().name}")
    return None


def _report(user: User, request_type: str, name: str, seconds: float, length: int, error: Exception | None) -> None:
    """Locust's request event, as its own users fire it: what the recorder and the master count."""
    user.environment.events.request.fire(request_type=request_type, name=name, response_time=seconds * 1000,
                                         response_length=length, exception=error, context={})


def rest_user(spec: StepSpec, schedule: Schedule | None):
    requests = [build_request(spec.address, "POST", spec.path, b.encode()) for b in spec.bodies]
    counter = itertools.count()
    name = "predict" if schedule is None else "predict(open)"

    class RestUser(User):
        """POSTs the payloads on one keep-alive connection (loadtest/http_client.py) and fires
        locust's request event with each answer's time, as locust's own HTTP users do."""
        wait_time = constant(0)

        def on_start(self):
            self.conn = TimedConnection(spec.address)

        def on_stop(self):
            self.conn.close()

        @task
        def predict(self):
            slot = schedule.next_slot() if schedule else None
            error, length, seconds, start = _post(self.conn, requests[next(counter) % len(requests)])
            if slot is not None:  # open model: from the time the request was due
                seconds += start - slot
            _report(self, "POST", name, seconds, length, error)

    return RestUser


def grpc_user(spec: StepSpec, schedule: Schedule | None):
    import grpc
    import grpc.experimental.gevent as grpc_gevent
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    grpc_gevent.init_gevent()
    requests = [predict_pb2.PredictRequest.FromString(base64.b64decode(r)) for r in spec.requests]
    counter = itertools.count()

    class GrpcUser(User):
        wait_time = constant(0)

        def on_start(self):
            self.stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(spec.address))

        @task
        def predict(self):
            start = schedule.next_slot() if schedule else time.perf_counter()
            error = _call(self.stub.Predict, requests[next(counter) % len(requests)])
            _report(self, "grpc", "Predict", time.perf_counter() - start, 0, error)

    return GrpcUser


class ReplayClock:
    """Replay: request i is due at start + offset_i / speed, start being the next whole second
    (where the measured window begins). Records when each request actually went out."""

    def __init__(self, items: list[list], speed: float):
        self.offsets = [item[0] / speed for item in items]
        self.counter = itertools.count()
        self.start: float | None = None
        self.sent: list[float] = []  # perf_counter at each send, in the order taken

    def take(self) -> tuple[int, float] | None:
        """(index, due time) of the next request, after sleeping until it is due; None when all are taken."""
        if self.start is None:
            now_wall, now = time.time(), time.perf_counter()
            self.start = now + (math.ceil(now_wall) - now_wall)
        i = next(self.counter)
        if i >= len(self.offsets):
            return None
        due = self.start + self.offsets[i]
        delay = due - time.perf_counter()
        if delay > 0:
            gevent.sleep(delay)
        self.sent.append(time.perf_counter())
        return i, due

    def summary(self) -> dict:
        if not self.sent or self.start is None:
            return {"sent": 0}
        sent = sorted(self.sent)
        return {"sent": len(sent), "send_span_s": sent[-1] - sent[0], "first_send_late_s": sent[0] - self.start}


def replay_user(spec: StepSpec, clock: ReplayClock):
    """Sends the logged requests, each over the API and protocol it came in on, at its due time;
    latency counts from that time."""
    import grpc
    import grpc.experimental.gevent as grpc_gevent
    from locust.exception import StopUser
    from tensorflow_serving.apis import (classification_pb2, inference_pb2, predict_pb2,
                                         prediction_service_pb2_grpc, regression_pb2)

    grpc_gevent.init_gevent()
    messages = {"Predict": predict_pb2.PredictRequest, "Classify": classification_pb2.ClassificationRequest,
                "Regress": regression_pb2.RegressionRequest, "MultiInference": inference_pb2.MultiInferenceRequest}
    prepared = []
    for _, protocol, where, body in spec.replay:
        if protocol == "rest":
            prepared.append(("rest", where, build_request(spec.address, "POST", where, body.encode())))
        else:
            prepared.append(("grpc", where, messages[where].FromString(base64.b64decode(body))))

    class ReplayUser(User):
        wait_time = constant(0)

        def on_start(self):
            self.conn = TimedConnection(spec.address) if spec.address else None
            self.stub = (prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(spec.grpc_address))
                         if spec.grpc_address else None)

        def on_stop(self):
            if self.conn is not None:
                self.conn.close()

        @task
        def send(self):
            taken = clock.take()
            if taken is None:
                raise StopUser()
            i, due = taken
            protocol, where, payload = prepared[i]
            if protocol == "rest":
                error, length, _, _ = _post(self.conn, payload)
            else:
                error, length = _call(getattr(self.stub, where), payload), 0
            _report(self, protocol, where, time.perf_counter() - due, length, error)

    return ReplayUser


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


def _summarise_window(sources: list[dict[str, dict]], first: int, last: int) -> dict:
    """Whole seconds [first, last) merged over every source (a process's finished seconds)."""
    hist, errors, requests, series = LatencyHistogram(), {}, 0, []
    for k in range(first, last):
        h = LatencyHistogram()
        for sec in [src[str(k)] for src in sources if str(k) in src]:
            h.merge(LatencyHistogram.from_json(sec["hist"]))
            for kind, c in sec["errors"].items():
                errors[kind] = errors.get(kind, 0) + c
            requests += sec["requests"]
        hist.merge(h)
        series.append({"second": k - first, "answered": h.n, "p99_ms": h.percentile(99) if h.n else None})
    return {"histogram": hist.to_json(), "requests": requests, "errors": errors, "elapsed_s": float(last - first),
            "series": series}


def _user_class(spec: StepSpec, share: float, clock: ReplayClock | None = None):
    if spec.kind == "replay":
        return replay_user(spec, clock)
    rate = spec.rate
    schedule = Schedule(rate * share) if rate else None
    return rest_user(spec, schedule) if spec.kind == "rest" else grpc_user(spec, schedule)


def _tree_cpu(proc: psutil.Process) -> float:
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += sum(p.cpu_times()[:2])
        except psutil.Error:
            pass
    return total


def run(spec: StepSpec) -> dict:
    """One step: load for warmup + duration; measure whole seconds after the warmup.

    One process (workers 1, none expected from elsewhere) runs the users itself (`_Local`).
    Otherwise this process is a locust master (`Master`): `workers` local worker processes plus
    `expect_workers` started on other machines (`tfpipe loadtest --worker`) connect to it,
    receive the spec (target, payloads, their share of an open-model rate) as a custom message,
    say they are ready, and report finished seconds that are merged here."""
    total = spec.workers + spec.expect_workers
    clock = ReplayClock(spec.replay, spec.speed) if spec.kind == "replay" else None
    if total <= 1 and not spec.expect_workers:
        step: _Local | Master = _Local(spec, clock)
    else:
        step = Master(Environment(user_classes=[_user_class(spec, 1.0 / total)]), spec, spec.workers,
                      spec.expect_workers)
        step.start()
    if spec.web_port is not None:
        step.env.create_web_ui("127.0.0.1", spec.web_port)
    stop = []
    gevent.signal_handler(signal.SIGINT, lambda: stop.append(True))  # stop early, keep whole seconds
    step.wait_ready(stop)
    step.runner.start(spec.users, spawn_rate=max(spec.users, 1) * 10)
    started = time.time()
    first = math.ceil(started + spec.warmup)
    last = first + max(1, math.ceil(spec.duration))
    opened, next_report = False, 0.0
    while time.time() < last:
        now = time.time()
        if not opened and now >= first:
            step.window_opens()
            opened = True
        if stop:
            last = max(first, int(now))
            break
        answered = [(int(k), v["requests"]) for src in step.seconds() for k, v in src.items()]
        if sum(n for k, n in answered if first <= k < last) >= spec.max_requests:
            last = int(now) + 1
            break
        if now >= next_report:  # for the parent's progress bar
            print(encode(Progress(round(now - started, 1), sum(n for _, n in answered))), flush=True)
            next_report = now + 0.5
        gevent.sleep(0.05)
    gevent.sleep(max(0.0, last - time.time()))
    result = step.close(first, last, more=not stop and not spec.last_step)
    if step.env.web_ui is not None:
        step.env.web_ui.stop()
    result["workers"] = total
    result["interrupted"] = bool(stop)
    if clock is not None:
        result["replay"] = clock.summary()
    return result


class _Local:
    """A step in this one process: it runs the users itself and records their answers."""

    def __init__(self, spec: StepSpec, clock: ReplayClock | None):
        self.env = Environment(user_classes=[_user_class(spec, 1.0, clock)])
        self.recorder = Recorder()
        self.env.events.request.add_listener(self.recorder.on_request)
        self.runner = self.env.create_local_runner()
        self._me, self._cpu0 = psutil.Process(), None

    def wait_ready(self, stop: list) -> None:
        pass  # the users are this process's own

    def window_opens(self) -> None:
        self._cpu0 = _tree_cpu(self._me)

    def seconds(self) -> list[dict[str, dict]]:
        """Answers per finished second so far."""
        return [self.recorder.seconds]

    def close(self, first: int, last: int, more: bool) -> dict:
        """The window's summary, with the cores this process used; the users stop."""
        cpu = (_tree_cpu(self._me) - self._cpu0) / (last - first) if self._cpu0 is not None and last > first else 0.0
        result = _summarise_window([self.recorder.pop_completed()], first, last)
        result["generator_cpu"] = cpu
        self.runner.quit()
        return result


def _unused_port(bind: str) -> int:
    with socket.socket() as sock:
        sock.bind((bind, 0))
        return sock.getsockname()[1]


class Master:
    """The master side of a distributed step: binds, starts the local workers, hands every
    worker the spec, waits until all are ready, merges their reports per worker."""

    def __init__(self, env: Environment, spec: StepSpec, local: int, remote: int):
        self.env, self.spec, self.local = env, spec, local
        self.expected, self.remote = local + remote, remote
        self.wait_s = spec.worker_wait_s
        self.token = uuid.uuid4().hex  # this step, as workers tell masters apart
        self.worker_spec = spec.for_worker(share=1.0 / self.expected, token=self.token).to_json()
        self.ready: set[str] = set()
        self.reports: dict[str, dict[str, dict]] = {}  # worker -> second -> its answers
        self.cpu_reports: dict[str, list[tuple[float, float]]] = {}  # worker -> (time, its CPU seconds)
        self.address, self.procs, self.runner = "", [], None  # set by start()

    def start(self) -> None:
        """Listen for workers and start the local ones."""
        env, spec, local = self.env, self.spec, self.local
        bind = spec.master_bind or "127.0.0.1"
        # A port of our choosing is one the OS just handed out and let go, which any outgoing
        # connection may take before zmq binds it: such a port is chosen again, a given one is not.
        self.address = f"{bind}:{spec.master_port or 0}"
        for _ in range(1 if spec.master_port else 5):
            try:
                port = spec.master_port or _unused_port(bind)
                self.address = f"{bind}:{port}"
                self.runner = env.create_master_runner(bind, port)
                break
            except Exception as e:  # a port in use, or an address not on this machine (zmq's error or the OS's)
                error = e
        else:
            raise LoadtestError(f"cannot listen for workers on {self.address}: {error}") from None
        # A worker asks once its handlers are in place (a spec sent on connect could arrive first).
        self.runner.register_message(
            "tfpipe_hello", lambda msg, **_: self.runner.send_message("tfpipe_spec", self.worker_spec, msg.data))
        self.runner.register_message("tfpipe_ready", lambda msg, **_: self.ready.add(msg.data))
        env.events.worker_report.add_listener(self._on_report)
        local_host = "127.0.0.1" if bind in ("0.0.0.0", "*", "") else bind
        self.procs = [subprocess.Popen(module_argv("tfpipe.loadtest.generate", "worker",
                                                    f"{local_host}:{port}", "--once")) for _ in range(local)]

    def _on_report(self, client_id: str, data: dict) -> None:
        self.reports.setdefault(client_id, {}).update(data.get("tfpipe", {}))
        if "tfpipe_cpu" in data:
            self.cpu_reports.setdefault(client_id, []).append((time.time(), data["tfpipe_cpu"]))

    def wait_ready(self, stop: list) -> None:
        timeout = self.wait_s
        deadline, said = time.time() + timeout, -1
        while len(self.ready) < self.expected and time.time() < deadline and not stop:
            if self.remote and len(self.ready) != said:
                said = len(self.ready)
                print(encode(Waiting(said, self.expected, self.address)), flush=True)
            gevent.sleep(0.1)
        if len(self.ready) < self.expected:
            self.finish(more=False)
            raise LoadtestError(f"only {len(self.ready)} of {self.expected} locust workers connected to "
                                f"{self.address} within {timeout:.0f}s")

    def window_opens(self) -> None:
        pass  # the workers report their own CPU

    def seconds(self) -> list[dict[str, dict]]:
        """Each worker's answers per finished second, as reported so far."""
        return list(self.reports.values())

    def close(self, first: int, last: int, more: bool) -> dict:
        """The window's summary merged over the workers; they are told whether another step follows."""
        gevent.sleep(WORKER_REPORT_INTERVAL * 2.5)  # the workers' reports of the last second
        result = _summarise_window(list(self.reports.values()), first, last)
        result["generator_cpu"] = self.cpu(first, last)
        result["per_worker"] = {w: _summarise_window([r], first, last)["requests"] for w, r in self.reports.items()}
        self.finish(more)
        return result

    def cpu(self, first: int, last: int) -> float:
        """Cores the workers used in the window, from the CPU seconds each reported."""
        total = 0.0
        for points in self.cpu_reports.values():
            inside = [(t, c) for t, c in points if first <= t <= last + WORKER_REPORT_INTERVAL * 2.5]
            if len(inside) >= 2 and inside[-1][0] > inside[0][0]:
                total += (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])
        return total

    def finish(self, more: bool) -> None:
        """Tell the workers whether another step follows (remote ones reconnect for it), stop."""
        self.runner.send_message("tfpipe_bye", {"more": more, "token": self.token})
        gevent.sleep(0.1)
        self.runner.quit()
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except Exception:
                p.kill()


def worker(master: str, once: bool) -> int:
    """A locust worker for a tfpipe master at HOST:PORT. It runs users for the master's steps,
    reporting finished seconds every interval; after a step it reconnects for the next one,
    unless `once` or the master said that was the last. 0 when the master ended the run."""
    import locust.runners

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the master decides when workers stop
    locust.runners.WORKER_REPORT_INTERVAL = WORKER_REPORT_INTERVAL
    host, _, port = master.rpartition(":")
    me = psutil.Process()
    finished: set[str] = set()  # steps done: a master still closing one must not be joined again
    while True:
        env = Environment(user_classes=[])
        recorder = Recorder()
        state: dict = {"more": None, "stale": False}
        env.events.request.add_listener(recorder.on_request)

        def report(client_id, data, recorder=recorder):
            data.update({"tfpipe": recorder.pop_completed(), "tfpipe_cpu": sum(me.cpu_times()[:2])})

        env.events.report_to_master.add_listener(report)
        try:
            runner = env.create_worker_runner(host, int(port))
        except ConnectionError:
            print(f"no tfpipe loadtest master answered at {master}", file=sys.stderr, flush=True)
            return 1

        def on_spec(msg, env=env, runner=runner, state=state, **_):
            if msg.data["token"] in finished:  # the last step's master, not yet gone: try again shortly
                state["stale"] = True
                gevent.spawn(runner.greenlet.kill)
                return
            if not env.user_classes:
                spec = StepSpec.from_json(msg.data)
                env.user_classes = [_user_class(spec, spec.share)]
            runner.send_message("tfpipe_ready", runner.client_id)

        def on_bye(msg, state=state, **_):
            finished.add(msg.data["token"])
            state["more"] = msg.data["more"]

        runner.register_message("tfpipe_spec", on_spec)
        runner.register_message("tfpipe_bye", on_bye)
        runner.send_message("tfpipe_hello", runner.client_id)
        runner.greenlet.join()
        runner.client.close(linger=0)
        if state["stale"]:
            gevent.sleep(0.5)
            continue
        if state["more"] is None:
            print(f"lost the master at {master} during a step", file=sys.stderr, flush=True)
            return 1
        if once or not state["more"]:
            return 0

