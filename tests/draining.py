"""Requests in flight on both APIs when a server gets SIGTERM, and what became of each
(tests/test_serve.py on one process, tests/test_serve_workers.py on two workers).

The load, against a model whose answer is x + 1 (serving_models.Slow):
- gRPC callers, each on a connection of its own, one Predict after another;
- REST callers on keep-alive connections, one small predict after another (and, if asked, callers
  that open a new connection for each);
- REST callers that pipeline: each writes PIPELINED small predicts at once on its connection, then
  reads their answers in order (a request behind the one being answered when the drain begins has
  been received too);
- large REST requests whose whole body but its last KiB is sent before the signal, and the rest
  once the server says it is shutting down: bodies still coming in while the drain runs;
- large REST requests sent whole just before the signal, so the server is busy with them as it
  begins to drain (calls wait in grpc core's queue meanwhile).
A request counts as sent before the signal when the client had written it (REST) or started the
call (gRPC) before `signal()` took the time. Every one of those must be answered OK.
"""

from __future__ import annotations

import http.client
import json
import signal
import socket
import threading
import time

import grpc
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

BIG_ROWS = 40_000  # a large request's rows (0.24 MB of JSON), within BATCHING's max_batch_size
# the servers' batching config: a large request fits in a batch, two threads run batches
PIPELINED = 3  # the requests a pipelining caller writes at once
BATCHING = "max_batch_size { value: 65536 }\nbatch_timeout_micros { value: 2000 }\nnum_batch_threads { value: 2 }\n"


def _predict_bytes(model: str, x: float) -> bytes:
    body = json.dumps({"instances": [x]}).encode()
    return (f"POST /v1/models/{model}:predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


class _Answers:
    """A connection's answers for http.client.HTTPResponse to read one at a time: one buffer for
    them all (a buffer per answer would lose the bytes of the next one read ahead), which an
    answer's end does not close."""

    def __init__(self, sock: socket.socket):
        self.file = sock.makefile("rb")

    def makefile(self, mode: str) -> _Answers:
        return self

    def readline(self, *args):
        return self.file.readline(*args)

    def read(self, *args):
        return self.file.read(*args)

    def readinto(self, buffer):
        return self.file.readinto(buffer)

    def close(self) -> None:
        pass  # the next answer comes on the same connection


class DrainLoad:
    def __init__(self, grpc_port: int, rest_port: int, model: str, grpc_callers: int = 6, rest_callers: int = 3,
                 uploads: int = 3, large: int = 3, fresh_callers: int = 0, pipelining: int = 2,
                 rows: int = BIG_ROWS, connectors: int = 0):
        self.grpc_port, self.rest_port, self.model, self.rows = grpc_port, rest_port, model, rows
        self.signalled_at: float | None = None
        self.release = threading.Event()  # the uploads may send the rest of their bodies
        self.stop = threading.Event()  # the callers stop (the server has exited)
        self.results: list[tuple[str, float, float, str]] = []  # (kind, sent, answered, "OK" or what failed)
        self._lock = threading.Lock()
        self._answered: dict[str, int] = {}
        self._partial_sent = threading.Semaphore(0)
        self._large_sent = threading.Semaphore(0)
        callers = [(self._grpc_caller, (f"g{i}",)) for i in range(grpc_callers)]
        callers += [(self._rest_caller, (f"r{i}", False)) for i in range(rest_callers)]
        callers += [(self._rest_caller, (f"f{i}", True)) for i in range(fresh_callers)]
        callers += [(self._pipelining_caller, (f"p{i}",)) for i in range(pipelining)]
        callers += [(self._connector, ()) for _ in range(connectors)]
        callers += [(self._upload, (True,)) for _ in range(uploads)]
        self.threads = [threading.Thread(target=target, args=args) for target, args in callers]
        self._large = [threading.Thread(target=self._upload, args=(False,)) for _ in range(large)]
        self._callers = grpc_callers + rest_callers + fresh_callers + pipelining
        self._uploads = uploads

    # ---- the clients ---------------------------------------------------------------------------

    def _record(self, kind: str, who: str | None, sent: float, outcome: str) -> None:
        with self._lock:
            self.results.append((kind, sent, time.monotonic(), outcome))
            if who is not None and outcome == "OK":
                self._answered[who] = self._answered.get(who, 0) + 1

    def _grpc_caller(self, who: str) -> None:
        # a connection of its own (channels to one address share one otherwise), so that callers
        # spread over a group's workers
        with grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}",
                                   options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            x = 0.0
            while not self.stop.is_set():
                x += 1.0
                req = predict_pb2.PredictRequest()
                req.model_spec.name = self.model
                req.inputs["x"].dtype, req.inputs["x"].float_val[:] = 1, [x]
                req.inputs["x"].tensor_shape.dim.add().size = 1
                call = stub.Predict.future(req, timeout=90)
                sent = time.monotonic()  # the call has started
                try:
                    out = call.result()
                    outcome = "OK" if list(out.outputs["y"].float_val) == [x + 1.0] else f"wrong answer {out}"
                except grpc.RpcError as e:
                    outcome = f"{e.code().name}: {e.details()}"
                self._record("grpc", who, sent, outcome)
                if outcome != "OK" and self.signalled_at is not None:
                    return  # refused after the signal: the server stops taking calls

    def _rest_caller(self, who: str, fresh: bool) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.rest_port, timeout=90)
        x = 0.0
        try:
            while not self.stop.is_set():
                x += 1.0
                sent = None
                if fresh:
                    conn.close()  # http.client opens a new one for the request
                try:
                    conn.request("POST", f"/v1/models/{self.model}:predict", json.dumps({"instances": [x]}),
                                 {"Content-Type": "application/json"})
                    sent = time.monotonic()  # written: the server has it
                    resp = conn.getresponse()
                    body = resp.read()
                    outcome = "OK" if resp.status == 200 and json.loads(body) == {"predictions": [x + 1.0]} \
                        else f"HTTP {resp.status} {body[:200]!r}"
                except (OSError, http.client.HTTPException) as e:
                    outcome = f"{type(e).__name__}: {e}"
                    conn.close()
                sent = sent if sent is not None else time.monotonic()
                self._record("rest-new" if fresh else "rest", who, sent, outcome)
                if outcome != "OK" and self.signalled_at is not None:
                    return
        finally:
            conn.close()

    def _connector(self) -> None:
        """From the signal until the server has exited: a new connection, a request written on it,
        its answer read, again and again (a millisecond apart). Each attempt after the signal is
        recorded as "connector": "refused" (connect failed), "OK" or the HTTP status (answered), or
        "reset after sent: ..." when the request was written and the connection then reset or
        closed without an answer, what a client must never see."""
        request = _predict_bytes(self.model, 1.0)
        while self.signalled_at is None and not self.stop.is_set():
            time.sleep(0.005)
        while not self.stop.is_set():
            sent = time.monotonic()
            try:
                sock = socket.create_connection(("127.0.0.1", self.rest_port), timeout=90)
            except OSError:
                self._record("connector", None, sent, "refused")
                time.sleep(0.001)
                continue
            try:
                sock.sendall(request)
                sent = time.monotonic()
                resp = http.client.HTTPResponse(sock)
                resp.begin()
                resp.read()
                outcome = "OK" if resp.status == 200 else f"HTTP {resp.status}"
            except (OSError, http.client.HTTPException) as e:
                outcome = f"reset after sent: {type(e).__name__}: {e}"
            finally:
                sock.close()
            self._record("connector", None, sent, outcome)
            time.sleep(0.001)

    def resets_after_sent(self) -> list[str]:
        """What the connectors saw that is neither a refusal nor an answer."""
        return [outcome for kind, _, _, outcome in self.results
                if kind == "connector" and outcome.startswith("reset after sent")]

    def _pipelining_caller(self, who: str) -> None:
        sock = socket.create_connection(("127.0.0.1", self.rest_port), timeout=90)
        answers = _Answers(sock)
        x = 0.0
        try:
            while not self.stop.is_set():
                xs = [x + i for i in range(1, PIPELINED + 1)]
                x = xs[-1]
                sent = None
                try:
                    sock.sendall(b"".join(_predict_bytes(self.model, v) for v in xs))
                    sent = time.monotonic()  # all written: the server has them
                except OSError as e:
                    outcomes = [f"{type(e).__name__}: {e}"] * PIPELINED
                else:
                    outcomes = []
                    for v in xs:
                        try:
                            resp = http.client.HTTPResponse(answers)
                            resp.begin()
                            body = resp.read()
                            ok = resp.status == 200 and json.loads(body) == {"predictions": [v + 1.0]}
                            outcomes.append("OK" if ok else f"HTTP {resp.status} {body[:200]!r}")
                        except (OSError, http.client.HTTPException) as e:
                            outcomes.append(f"{type(e).__name__}: {e}")
                sent = sent if sent is not None else time.monotonic()
                for outcome in outcomes:
                    self._record("rest-pipelined", who, sent, outcome)
                if any(o != "OK" for o in outcomes):
                    return  # the connection is gone
        finally:
            answers.file.close()
            sock.close()

    def _upload(self, in_two_parts: bool) -> None:
        """A large predict. `in_two_parts`: all but the body's last KiB now, the rest once released."""
        body = json.dumps({"instances": [float(i % 100) for i in range(self.rows)]}).encode()
        conn = http.client.HTTPConnection("127.0.0.1", self.rest_port, timeout=90)
        sent = time.monotonic()
        try:
            conn.putrequest("POST", f"/v1/models/{self.model}:predict")
            conn.putheader("Content-Type", "application/json")
            conn.putheader("Content-Length", str(len(body)))
            conn.endheaders()
            if in_two_parts:
                conn.send(body[:-1024])
                sent = time.monotonic()  # before the signal, by start(); its end comes after
                self._partial_sent.release()
                self.release.wait(120)
                conn.send(body[-1024:])
            else:
                conn.send(body)
                sent = time.monotonic()
                self._large_sent.release()
            resp = conn.getresponse()
            answer = resp.read()
            ok = resp.status == 200 and json.loads(answer)["predictions"] == [float(i % 100) + 1.0
                                                                              for i in range(self.rows)]
            outcome = "OK" if ok else f"HTTP {resp.status} {answer[:200]!r}"
        except (OSError, http.client.HTTPException) as e:
            outcome = f"{type(e).__name__}: {e}"
        finally:
            conn.close()
        self._record("upload" if in_two_parts else "large", None, sent, outcome)

    # ---- the test's steps ------------------------------------------------------------------------

    def start(self, timeout: float = 60) -> None:
        """Start every client; return once each caller has had an answer and each upload has sent
        all but the end of its body (the server is busy with them all)."""
        for t in self.threads:
            t.start()
        deadline = time.monotonic() + timeout
        for _ in range(self._uploads):
            assert self._partial_sent.acquire(timeout=max(0.0, deadline - time.monotonic())), "an upload did not start"
        while True:
            with self._lock:
                if len(self._answered) == self._callers:
                    break
                failed = [r for r in self.results if r[3] != "OK"]
            assert not failed and time.monotonic() < deadline, (failed[:5], self._answered)
            time.sleep(0.02)  # polls a condition the clients set, with a deadline

    def signal(self, proc, timeout: float = 60) -> None:
        """The large requests sent whole, then SIGTERM at once, while the server reads them."""
        for t in self._large:
            t.start()
        for _ in self._large:
            assert self._large_sent.acquire(timeout=timeout), "a large request was not sent"
        self.signalled_at = time.monotonic()
        proc.send_signal(signal.SIGTERM)

    def finish(self, proc, timeout: float = 90) -> int:
        """Once the server exits: stop the callers, wait for every client; the exit code."""
        try:
            code = proc.wait(timeout=timeout)
        finally:
            self.release.set()
            self.stop.set()
            for t in self.threads + self._large:
                t.join(timeout=120)
        return code

    def lost(self) -> list[tuple[str, float, str]]:
        """Every request sent before the signal that was not answered OK (kind, seconds before the
        signal it was sent, what came back)."""
        return [(kind, round(self.signalled_at - sent, 3), outcome) for kind, sent, _, outcome in self.results
                if sent < self.signalled_at and outcome != "OK"]

    def in_flight(self) -> dict[str, int]:
        """How many requests of each kind were sent before the signal and answered after it."""
        out: dict[str, int] = {}
        for kind, sent, answered, _ in self.results:
            if sent < self.signalled_at < answered:
                out[kind] = out.get(kind, 0) + 1
        return out
