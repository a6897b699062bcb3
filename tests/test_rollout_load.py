"""Promote and rollback under load lose no request: REST and gRPC clients predict without pause while
a candidate is promoted (`versions.promote`, `tfpipe promote`) and then rolled back (`versions.rollback`,
`tfpipe rollback`), against a real server polling the base path, in one process and with `--workers 2`.

Every request is counted, failures included (a refused or cut connection is a failed request, never
passed over); every one must succeed and answer from version 1 (y = 3.0) or version 2 (y = 4.0). A
request that ended before the promotion answers 3.0; one started after the server says the promotion
has settled (version 2 AVAILABLE, version 1 no longer: in every worker) answers 4.0, until the
rollback; one started after the rollback has settled answers 3.0 again: no stale answer, with no
index offset to allow for. In one process, each client's own answers go 3.0, 4.0, 3.0 and never back.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import requests
from conftest import run_cli, start_cli_server

pytestmark = pytest.mark.xdist_group("rollout_load")

V1, V2 = 3.0, 4.0  # y = 0.5 * 2 + b of version 1 (b=2) and version 2 (b=3)
ANSWER = {1: V1, 2: V2}
WINDOW = 20  # answers each API gives in each settled stretch (before, promoted, rolled back)
SETTLE = 30.0  # seconds a switch may take before the test fails (it takes one base-path poll and one load)


@dataclass
class Request:
    api: str  # "rest" or "grpc"
    client: str  # which client thread sent it
    started: float  # time.monotonic() before it was sent
    ended: float  # ... once its answer (or its failure) was in
    outcome: str  # "OK"; else "HTTP <status>", a gRPC code's name, or the exception's name
    value: float | None = None  # y
    version: int | None = None  # the version that answered (gRPC says; REST does not)
    detail: str = ""


class Load:
    """Client threads that predict x=2 until `finish()`, each request recorded as it ends. A
    keep-alive client holds one connection (a requests.Session, a gRPC channel of its own) for the
    whole run; a fresh one opens a connection per request (with several workers, the kernel deals
    each to either)."""

    def __init__(self, grpc_port: int, rest_port: int, keep_alive: int, fresh: int = 0):
        self.url = f"http://127.0.0.1:{rest_port}/v1/models/half:predict"
        self.target = f"127.0.0.1:{grpc_port}"
        self.done: list[Request] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=run, args=(f"{api}-{kind}{i}", kind == "fresh"), daemon=True)
                        for api, run in (("rest", self._rest), ("grpc", self._grpc))
                        for kind, n in (("keep", keep_alive), ("fresh", fresh)) for i in range(n)]

    def start(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def finish(self) -> None:
        """Stop the clients; each ends the request it is sending first (and records it)."""
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)
        hung = [t.name for t in self.threads if t.is_alive()]
        assert not hung, f"client threads still waiting for an answer after 60 s: {hung}; {self.summary()}"

    def _record(self, request: Request) -> None:
        self.done.append(request)  # list.append is atomic: the clients share the list

    def _rest(self, client: str, fresh: bool) -> None:
        session = None
        try:
            while not self.stop.is_set():
                session = session or requests.Session()
                req = Request("rest", client, time.monotonic(), 0.0, "OK")
                try:
                    r = session.post(self.url, json={"instances": [2.0]}, timeout=30)
                    if r.status_code == 200:
                        req.value = float(r.json()["predictions"][0])
                    else:
                        req.outcome, req.detail = f"HTTP {r.status_code}", r.text[:300]
                except Exception as e:  # noqa: BLE001 (a refused or cut connection, a bad body: a failed request)
                    req.outcome, req.detail = type(e).__name__, repr(e)[:300]
                req.ended = time.monotonic()
                self._record(req)
                if fresh:
                    session.close()
                    session = None
        except BaseException as e:  # the client itself broke: seen as a failure, not as silence
            self._record(Request("rest", client, time.monotonic(), time.monotonic(), "client crashed", detail=repr(e)))
            raise
        finally:
            if session is not None:
                session.close()

    def _grpc(self, client: str, fresh: bool) -> None:
        import grpc
        from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

        request = predict_pb2.PredictRequest()
        request.model_spec.name = "half"
        request.inputs["x"].dtype, request.inputs["x"].float_val[:] = 1, [2.0]  # DT_FLOAT
        request.inputs["x"].tensor_shape.dim.add().size = 1
        channel = None
        try:
            while not self.stop.is_set():
                if channel is None:  # a connection of its own: channels to one address share one otherwise
                    channel = grpc.insecure_channel(self.target, options=[("grpc.use_local_subchannel_pool", 1)])
                    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
                req = Request("grpc", client, time.monotonic(), 0.0, "OK")
                try:
                    out = stub.Predict(request, timeout=30)
                    req.value, req.version = out.outputs["y"].float_val[0], out.model_spec.version.value
                except grpc.RpcError as e:
                    req.outcome, req.detail = e.code().name, (e.details() or "")[:300]
                except Exception as e:  # noqa: BLE001
                    req.outcome, req.detail = type(e).__name__, repr(e)[:300]
                req.ended = time.monotonic()
                self._record(req)
                if fresh:
                    channel.close()
                    channel = None
        except BaseException as e:
            self._record(Request("grpc", client, time.monotonic(), time.monotonic(), "client crashed", detail=repr(e)))
            raise
        finally:
            if channel is not None:
                channel.close()

    def of(self, api: str) -> list[Request]:
        return [r for r in list(self.done) if r.api == api]

    def answered_since(self, t: float) -> int:
        """The fewest answers either API has given to requests sent after `t`."""
        return min(sum(r.started > t and r.outcome == "OK" for r in self.of(api)) for api in ("rest", "grpc"))

    def summary(self) -> str:
        """Each API's outcomes and answers, counted, and its first failures."""
        parts = []
        for api in ("rest", "grpc"):
            done = self.of(api)
            failed = [f"{r.client} {r.outcome}: {r.detail}" for r in done if r.outcome != "OK"][:3]
            parts.append(f"{api}: {len(done)} requests, outcomes {dict(Counter(r.outcome for r in done))}, "
                         f"answers {dict(Counter(r.value for r in done if r.outcome == 'OK'))}"
                         + (f", first failures {failed}" if failed else ""))
        return "; ".join(parts)


def _until(what: str, ready: Callable[[], bool], why: Callable[[], str], timeout: float = SETTLE) -> float:
    """Poll `ready()` until it holds; the time.monotonic() it was seen to. AssertionError after `timeout`."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s; {why()}"
        time.sleep(0.05)  # the polling interval, not the synchronisation
    return time.monotonic()


def _switched(states: dict[int, str], new: int, old: int) -> bool:
    """Version `new` serves and `old` no longer takes requests (UNLOADING, END, or gone)."""
    return states.get(new) == "AVAILABLE" and states.get(old) != "AVAILABLE"


def _model_dir(tmp_path) -> str:
    """half's base path: version 1 (b=2) served, version 2 (b=3) a candidate."""
    from serving_models import save_half

    from tfpipe import versions

    model_dir = tmp_path / "half"
    save_half(str(model_dir / "1"), b=2.0)
    save_half(versions.candidate_path(str(model_dir), 2), b=3.0)
    assert (versions.numeric_versions(str(model_dir)), versions.candidates(str(model_dir))) == ([1], [2])
    return str(model_dir)


def _promote_and_roll_back(load: Load, promote: Callable[[], None], rollback: Callable[[], None],
                           settled: Callable[[int, int], bool], why: Callable[[], str]) -> dict[str, float]:
    """Under `load`: promote, wait until `settled(2, 1)` and WINDOW answers per API after it; roll
    back, wait until `settled(1, 2)` and WINDOW more. The times of each step (time.monotonic())."""
    def report() -> str:
        return f"{load.summary()}; {why()}"

    load.start()
    _until("the first answers", lambda: load.answered_since(0.0) >= WINDOW, report)
    marks = {"promote": time.monotonic()}
    promote()
    marks["on v2"] = _until("promotion settled", lambda: settled(2, 1), report)
    _until("answers after the promotion", lambda: load.answered_since(marks["on v2"]) >= WINDOW, report)
    marks["rollback"] = time.monotonic()
    rollback()
    marks["on v1"] = _until("rollback settled", lambda: settled(1, 2), report)
    _until("answers after the rollback", lambda: load.answered_since(marks["on v1"]) >= WINDOW, report)
    return marks


def _check(load: Load, marks: dict[str, float], strict_order: bool) -> None:
    """Every request OK, > 100 per API, answers only 3.0 and 4.0, and each settled stretch answered
    by its version alone. `strict_order`: each client's answers also go 3.0, 4.0, 3.0 and never back
    (one process: a client's requests resolve one after another against one model manager)."""
    summary = load.summary()
    for api in ("rest", "grpc"):
        done = load.of(api)
        outcomes = Counter(r.outcome for r in done)
        assert set(outcomes) == {"OK"} and len(done) > 100, f"{api} (all OK, > 100 wanted): {summary}"
        assert {r.value for r in done} <= {V1, V2}, f"{api} (answers 3.0 or 4.0 only): {summary}"
        if api == "grpc":
            wrong = [(r.version, r.value) for r in done if ANSWER.get(r.version) != r.value]
            assert not wrong, f"gRPC answers from another version than they name: {Counter(wrong)}"
        stretches = {
            "ended before the promotion": ([r for r in done if r.ended < marks["promote"]], V1),
            "sent once the promotion settled, ended before the rollback": (
                [r for r in done if r.started > marks["on v2"] and r.ended < marks["rollback"]], V2),
            "sent once the rollback settled": ([r for r in done if r.started > marks["on v1"]], V1),
        }
        for what, (stretch, want) in stretches.items():
            values = Counter(r.value for r in stretch)
            assert len(stretch) >= WINDOW and set(values) == {want}, \
                f"{api}, requests {what}: want {want} only, got {dict(values)}; {summary}"
        if strict_order:
            for client in sorted({r.client for r in done}):
                seen = [r.value for r in sorted((r for r in done if r.client == client), key=lambda r: r.started)]
                runs = tuple(v for i, v in enumerate(seen) if i == 0 or v != seen[i - 1])
                assert runs in {(V1,), (V1, V2), (V1, V2, V1)}, f"{client}'s answers went {runs}; {summary}"


def _rest_status(rest_port: int) -> dict[int, str]:
    r = requests.get(f"http://127.0.0.1:{rest_port}/v1/models/half", timeout=10)
    return {int(v["version"]): v["state"] for v in r.json()["model_version_status"]}


def _grpc_status(grpc_port: int) -> dict[int, str]:
    """GetModelStatus on a fresh connection (with several workers, the kernel picks one for it)."""
    import grpc
    from tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}", options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
        req = get_model_status_pb2.GetModelStatusRequest()
        req.model_spec.name = "half"
        out = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(req, timeout=10)
        return {v.version: get_model_status_pb2.ModelVersionStatus.State.Name(v.state)
                for v in out.model_version_status}


def test_promote_and_rollback_under_load_lose_no_request_in_one_process(tmp_path):
    """One server process: `versions.promote` then `versions.rollback` while 3 REST and 3 gRPC
    keep-alive clients predict; not one request fails, and each answer is from the version served."""
    from tfpipe import versions
    from tfpipe.serve.flags import ServeOptions
    from tfpipe.serve.server import ServerThread

    model_dir = _model_dir(tmp_path)
    log: list[str] = []
    opts = ServeOptions(host="127.0.0.1", port=-1, rest_api_port=-1, model_name="half", model_base_path=model_dir,
                        file_system_poll_wait_seconds=1)
    with ServerThread(opts, log=log.append) as s:
        load = Load(s.grpc_port, s.rest_port, keep_alive=3)
        try:
            marks = _promote_and_roll_back(
                load, promote=lambda: versions.promote(model_dir, 2), rollback=lambda: versions.rollback(model_dir),
                settled=lambda new, old: _switched(_rest_status(s.rest_port), new, old),
                why=lambda: f"status {_rest_status(s.rest_port)}; server log {log[-10:]}")
        finally:
            load.finish()
        # the version rolled back from is unloaded, not only passed over
        _until("version 2 unloaded", lambda: _rest_status(s.rest_port) == {1: "AVAILABLE", 2: "END"},
               lambda: f"status {_rest_status(s.rest_port)}; server log {log[-10:]}")
    _check(load, marks, strict_order=True)
    assert (versions.served(model_dir), versions.candidates(model_dir)) == (1, [2])
    assert [(e["event"], e["version"], e["served_before"]) for e in versions.history(model_dir)] == [
        ("promoted", 2, 1), ("rolled back", 1, 2)]


@pytest.mark.long
def test_tfpipe_promote_and_rollback_under_load_lose_no_request_with_two_workers(tmp_path):
    """`tfpipe serve --workers 2`, `tfpipe promote --version 2` then `tfpipe rollback` while REST and
    gRPC clients predict, each on a connection it keeps (3 per API) or on a new connection per request
    (1 per API, so that both workers take requests whatever the kernel deals out). A switch has settled
    once both workers say they unloaded the old version and 8 status calls in a row, each on a new
    connection, agree; not one request fails."""
    from tfpipe import versions

    model_dir = _model_dir(tmp_path)
    proc, grpc_port, rest_port = start_cli_server("--workers=2", "--model_name=half", f"--model_base_path={model_dir}",
                                                  "--file_system_poll_wait_seconds=1")
    said: dict[str, str] = {}
    since = [proc.output.mark()]  # where the server's lines about the latest switch start

    def cli(*args: str) -> None:
        since.append(proc.output.mark())
        res = run_cli(*args, timeout=60)
        assert res.returncode == 0, (args, res.stdout, res.stderr)
        said[args[0]] = res.stdout

    def settled(new: int, old: int) -> bool:
        gone = {m[1] for line in proc.output.lines[since[-1]:]
                if (m := re.search(rf"^\[worker (\d+)\] .*unloaded half version {old} \(", line))}
        return gone == {"0", "1"} and all(_switched(_grpc_status(grpc_port), new, old) for _ in range(8))

    def why() -> str:
        return f"status on 4 connections {[_grpc_status(grpc_port) for _ in range(4)]}; " \
               f"server said {proc.output.lines[-12:]}"

    try:
        load = Load(grpc_port, rest_port, keep_alive=3, fresh=1)
        try:
            marks = _promote_and_roll_back(load, promote=lambda: cli("promote", model_dir, "--version", "2"),
                                           rollback=lambda: cli("rollback", model_dir),
                                           settled=settled, why=why)
        finally:
            load.finish()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0
    _check(load, marks, strict_order=False)
    assert "version 2 is served (was 1)" in said["promote"] and "version 1 is served again" in said["rollback"], said
    assert (versions.served(model_dir), versions.candidates(model_dir)) == (1, [2])
