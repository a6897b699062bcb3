"""The rollout step's serving gate: a new version load-tested beside the served one on the same
requests, in alternating rounds, held when slower or costlier beyond the allowed share and the
served version's own spread; the checks on figures (table-driven), then a real slow candidate on a
real server, held on latency while the served version keeps answering."""

from __future__ import annotations

import json
import os
import time

import pytest

from tfpipe import versions
from tfpipe.rollout.config import RolloutConfig
from tfpipe.rollout.job import checks, spread, summarise


def figures(p99: float, cpu: float, errors: int = 0, slo_ok: bool | None = None, p99_spread: float = 0.0,
            cpu_spread: float = 0.0) -> dict:
    return {"p99_ms": p99, "cpu_us": cpu, "errors": errors, "slo_ok": slo_ok, "p99_spread": p99_spread,
            "cpu_spread": cpu_spread, "requests": 1000}


@pytest.mark.parametrize("served,new,slo,failed", [
    (figures(10, 100), figures(14, 120), False, []),  # within +50% p99, +25% CPU
    (figures(10, 100), figures(16, 100), False, ["p99"]),
    (figures(10, 100), figures(10, 130), False, ["CPU"]),
    (figures(10, 100, p99_spread=0.8), figures(17, 100), False, []),  # the served version's own spread is wider
    (figures(10, 100), figures(10, 100, errors=3), False, ["errors"]),
    (figures(10, 100, errors=3), figures(10, 100, errors=3), False, []),
    (figures(10, 100, slo_ok=True), figures(10, 100, slo_ok=False), True, ["slo"]),
    (figures(0, 0), figures(5, 5), False, []),  # nothing measured on the served side: no bound to hold
    (figures(10, 100), {**figures(0, 0), "unmeasured": ["no step measured any request"]}, False, ["measured"]),
])
def test_serving_checks(served, new, slo, failed):
    found = checks(RolloutConfig(), {"served": served, "new": new}, slo)
    assert [c["check"] for c in found if not c["passed"]] == failed
    assert all(c["text"] for c in found)


@pytest.mark.parametrize("values,want", [([10.0], 0.0), ([10.0, 12.0], 0.2), ([0.0, 5.0], 0.0), ([4.0, 5.0, 6.0], 0.5)])
def test_spread(values, want):
    assert spread(values) == pytest.approx(want)


def test_the_ratio_is_taken_round_by_round():
    from tfpipe.rollout.job import paired_ratio

    # the machine slowed down in round 2 for both: the pairs still say 1.1x
    served = [{"p99_ms": 10.0}, {"p99_ms": 30.0}, {"p99_ms": 10.0}]
    new = [{"p99_ms": 11.0}, {"p99_ms": 33.0}, {"p99_ms": 11.0}]
    assert paired_ratio(new, served, "p99_ms") == pytest.approx(1.1)
    ratios = {"p99_ms": 1.1, "cpu_us": 1.0}
    summary = {"served": figures(16.7, 100), "new": figures(18.3, 100), "ratios": ratios}
    assert all(c["passed"] for c in checks(RolloutConfig(max_p99_rise=0.2), summary, False))
    summary["ratios"] = {"p99_ms": 1.3, "cpu_us": 1.0}
    assert [c["check"] for c in checks(RolloutConfig(max_p99_rise=0.2), summary, False) if not c["passed"]] == ["p99"]
    assert paired_ratio(new, [{"p99_ms": 0.0}] * 3, "p99_ms") is None


def test_summarise_takes_medians_and_all_rounds_for_the_slo():
    rounds = [{"p99_ms": 10.0, "cpu_us": 90.0, "errors": 0, "requests": 100, "slo_ok": True},
              {"p99_ms": 30.0, "cpu_us": 110.0, "errors": 1, "requests": 120, "slo_ok": False},
              {"p99_ms": 12.0, "cpu_us": 100.0, "errors": 0, "requests": 90, "slo_ok": True}]
    s = summarise(rounds)
    assert (s["p99_ms"], s["cpu_us"], s["errors"], s["requests"], s["slo_ok"]) == (12.0, 100.0, 1, 310, False)
    assert s["p99_spread"] == pytest.approx(2.0)


@pytest.mark.long
def test_a_slower_candidate_is_held_on_latency_and_the_served_version_stays(tmp_path):
    from serving_models import save_busy, save_half

    from tfpipe.rollout.job import Target, Versions, result, run
    from tfpipe.serve.flags import ServeOptions
    from tfpipe.serve.server import ServerThread
    from tfpipe.serve.tfserving.configs import add_candidate, write_text_proto
    from tensorflow_serving.config import model_server_config_pb2

    model = tmp_path / "models" / "half"
    save_half(str(model / "1"), b=2.0)
    save_busy(str(model / versions.CANDIDATES / "2"))  # tens of milliseconds of CPU a call
    config = model_server_config_pb2.ModelServerConfig()
    config.model_config_list.config.add(name="half", base_path=str(model), model_platform="tensorflow")
    models_config = write_text_proto(str(tmp_path / "models.config"), config)
    add_candidate(models_config, "half", str(model), 2)
    payload = tmp_path / "payload.json"
    payload.write_text(json.dumps({"instances": [2.0]}))
    opts = ServeOptions(host="127.0.0.1", port=-1, rest_api_port=-1, model_config_file=models_config)
    with ServerThread(opts) as server:
        target = Target(f"http://127.0.0.1:{server.rest_port}",
                        lambda name: sum(n for (m, _, _), n in list(server.metrics.requests.items()) if m == name),
                        None, 2, "", payload=str(payload), shadowing=server.shadowing)
        seen = Versions(str(model), "half", 1, 2, "passed", "passed offline")
        out = str(tmp_path / "rollout")
        run(RolloutConfig(rounds=1, duration="1s", warmup="0.5s"), seen, target, out, log=lambda _: None)
        assert server.manager.shadowed() == {} and server.inference.shadow is None  # switched off after
    r = result(out)
    assert r.code == 1 and r.outputs.decision == "held" and r.outputs.served == 1
    record = json.load(open(os.path.join(out, "rollout.json")))
    served, new = record["serving"]["summary"]["served"], record["serving"]["summary"]["new"]
    assert new["p99_ms"] > served["p99_ms"] and served["requests"] > 0 and new["requests"] > 0
    assert served["cpu_us"] > 0 and new["cpu_us"] > served["cpu_us"]  # the busy loop costs CPU too
    assert "p99" in record["reason"] and "too slow" in record["reason"]
    # The shadow round: the served version's requests mirrored to the new one, which answers the same
    # (x + 1 = 0.5x + 2 at x = 2) but costs the served traffic CPU; reported, not a gate.
    shadow = record["serving"]["shadow"]
    (mirrored,) = shadow["records"]
    assert mirrored["mirrored"] > 0 and mirrored["summary"]["errors"] == 0, mirrored
    assert mirrored["summary"]["rel_diff_max"] == 0 and mirrored["summary"]["float_rows"] == mirrored["mirrored"]
    assert shadow["cpu_ratio"] > 1 and shadow["round"]["requests"] > 0, shadow
    assert "request(s) mirrored" in shadow["lines"][0] and "relative difference median 0" in shadow["lines"][0]
    assert versions.served(str(model)) == 1 and versions.candidates(str(model)) == [2]
    assert versions.history(str(model))[-1]["event"] == "held"


def test_promote_and_rollback_move_a_models_config_label_on_a_running_server_without_a_failed_request(tmp_path):
    """A server running a models.config with a `specific` policy and the label `stable` (what
    tensorflow_model_server takes): `tfpipe promote --models-config --server` loads the new version
    beside the old one, then moves the label; clients calling by label and unversioned are answered
    all along; the file parses with the official protos and says what the server serves."""
    from tfpipe.serve.flags import ServeOptions
    from tfpipe.serve.server import ServerThread

    path, model = _labelled_models(tmp_path)
    with ServerThread(ServeOptions(host="127.0.0.1", port=-1, rest_api_port=-1, model_config_file=str(path))) as s:
        _move_the_label_under_load(path, model, s.grpc_port, s.rest_port)


@pytest.mark.long
def test_a_models_config_label_moves_on_every_worker_without_a_failed_request(tmp_path):
    """The same with `tfpipe serve --workers 2`: the reload the promotion sends reaches one worker,
    which hands the config to the other before it answers; clients on fresh and kept connections,
    whichever worker the kernel gives them, are answered all along and end on the version labelled."""
    from conftest import start_cli_server

    path, model = _labelled_models(tmp_path)
    proc, grpc_port, rest_port = start_cli_server("--workers=2", f"--model_config_file={path}")
    try:
        _move_the_label_under_load(path, model, grpc_port, rest_port, fresh=True)
    finally:
        proc.terminate()
        proc.wait(60)


def _labelled_models(tmp_path):
    from serving_models import save_half

    model = tmp_path / "half"
    save_half(str(model / "1"), b=2.0)
    save_half(str(model / versions.CANDIDATES / "2"), b=3.0)
    path = tmp_path / "models.config"
    path.write_text('model_config_list { config { name: "half" base_path: "%s" model_platform: "tensorflow" '
                    'model_version_policy { specific { versions: 1 } } version_labels { key: "stable" value: 1 } } }'
                    % model)
    return path, model


def _move_the_label_under_load(path, model, grpc_port: int, rest_port: int, fresh: bool = False) -> None:
    """Promote version 2 and roll back while clients call by label and unversioned (`fresh`: one
    more of each that opens a connection per request); every answer 200, the last ones version 1's."""
    import threading

    import requests
    from conftest import run_cli
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    url, stop, answers = f"http://127.0.0.1:{rest_port}/v1/models/half", threading.Event(), []

    def client(route: str, new_connections: bool) -> None:
        session = requests.Session()
        while not stop.is_set():
            post = requests.post if new_connections else session.post
            r = post(f"{url}{route}:predict", json={"instances": [2.0]}, timeout=30)
            answers.append((route, r.status_code, r.json().get("predictions", [r.text])[0]))

    kinds = [(route, new) for route in ("", "/labels/stable") for new in ((False, True) if fresh else (False,))]
    clients = [threading.Thread(target=client, args=kind) for kind in kinds]
    for t in clients:
        t.start()
    try:
        flags = ("--models-config", str(path), "--server", f"127.0.0.1:{grpc_port}")
        res = run_cli("promote", str(model), "--version", "2", *flags)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "loads version 2 beside 1" in res.stdout
        promoted = len(answers)
        res = run_cli("rollback", str(model), *flags)
        assert res.returncode == 0, res.stdout + res.stderr
        rolled = len(answers)
        deadline = time.monotonic() + 30
        while len(answers) < rolled + 20 * len(kinds) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        for t in clients:
            t.join()
    codes = [code for _, code, _ in answers]
    assert set(codes) == {200} and len(answers) > 50, ({c: codes.count(c) for c in set(codes)},
                                                       [(i, a) for i, a in enumerate(answers) if a[1] != 200][:3],
                                                       (promoted, rolled))
    assert {y for _, _, y in answers[promoted - 5:promoted]} <= {3.0, 4.0}
    assert {y for _, _, y in answers[rolled + 5 * len(kinds):]} == {3.0}  # back on version 1, by label and unversioned
    config = text_format.Parse(path.read_text(), model_server_config_pb2.ModelServerConfig())
    entry = config.model_config_list.config[0]
    assert list(entry.model_version_policy.specific.versions) == [1] and dict(entry.version_labels) == {"stable": 1}
    assert versions.served(str(model)) == 1 and versions.candidates(str(model)) == [2]


def test_the_configs_for_a_label_and_a_candidate_parse_with_the_official_protos(tmp_path):
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    from tfpipe.rollout.tfserving import pinned, write_config
    from tfpipe.serve.tfserving.configs import add_candidate

    config = model_server_config_pb2.ModelServerConfig()
    config.model_config_list.config.add(name="taxi", base_path="/m/taxi", model_platform="tensorflow")
    path = str(tmp_path / "models.config")
    write_config(path, pinned(config, "taxi", [3, 4], {"stable": 3}))
    add_candidate(path, "taxi", "/m/taxi", 5)
    parsed = text_format.Parse(open(path).read(), model_server_config_pb2.ModelServerConfig())
    served, candidate = parsed.model_config_list.config
    assert (served.name, list(served.model_version_policy.specific.versions), dict(served.version_labels)) == (
        "taxi", [3, 4], {"stable": 3})
    assert (candidate.name, candidate.base_path, list(candidate.model_version_policy.specific.versions)) == (
        "taxi-candidate", os.path.join("/m/taxi", versions.CANDIDATES), [5])
    with pytest.raises(Exception, match="no model 'other'"):
        pinned(config, "other", [1], {})
    from tfpipe.serve.tfserving.configs import remove_candidate

    assert remove_candidate(path, "taxi") and not remove_candidate(path, "taxi")
    (left,) = text_format.Parse(open(path).read(), model_server_config_pb2.ModelServerConfig()).model_config_list.config
    assert left.name == "taxi" and dict(left.version_labels) == {"stable": 3}


@pytest.mark.parametrize("label", ["stable", "prod"])
def test_a_promotion_moves_the_label_it_is_told_to_in_a_models_config(tmp_path, label):
    """`tfpipe promote MODEL --version 2 --models-config FILE --label L` (no --server: the file alone,
    for a server started on it): the file serves version 2 alone, L on it; without --models-config a
    label other than stable is refused with the reason."""
    from conftest import run_cli
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    model = tmp_path / "taxi"
    for v in (1,):
        (model / str(v)).mkdir(parents=True)
    (model / versions.CANDIDATES / "2").mkdir(parents=True)
    path = tmp_path / "models.config"
    path.write_text('model_config_list { config { name: "taxi" base_path: "%s" model_platform: "tensorflow" '
                    'model_version_policy { specific { versions: 1 } } version_labels { key: "%s" value: 1 } } }'
                    % (model, label))
    res = run_cli("promote", str(model), "--version", "2", "--models-config", str(path), "--label", label)
    assert res.returncode == 0, res.stdout + res.stderr
    (entry,) = text_format.Parse(path.read_text(), model_server_config_pb2.ModelServerConfig()).model_config_list.config
    assert list(entry.model_version_policy.specific.versions) == [2] and dict(entry.version_labels) == {label: 2}
    assert versions.served(str(model)) == 2
    res = run_cli("rollback", str(model), "--label", "prod")
    assert res.returncode != 0 and "--label prod needs --models-config" in res.stderr, res.stderr
    assert versions.served(str(model)) == 2


def test_a_labelled_version_is_kept_until_its_label_moves(tmp_path):
    """A config that moves a label to a version this server has yet to load is refused until it has
    loaded it (FAILED_PRECONDITION, and the promotion sends it again); meanwhile the version the
    label still names keeps answering the label, though the config no longer lists it: it is not
    unloaded until the label has moved (it was, and the label's requests got 404)."""
    from google.protobuf import text_format
    from serving_models import save_half
    from tensorflow_serving.config import model_server_config_pb2

    from tfpipe.serve.errors import ServingError
    from tfpipe.serve.flags import ServeOptions
    from tfpipe.serve.server import ServerThread

    path, model = _labelled_models(tmp_path)
    save_half(str(model / "2"), b=3.0)  # on disk, not yet in the config
    opts = ServeOptions(host="127.0.0.1", port=-1, rest_api_port=-1, model_config_file=str(path),
                        file_system_poll_wait_seconds=0, num_load_threads=1)
    final = text_format.Parse(
        'model_config_list { config { name: "half" base_path: "%s" model_platform: "tensorflow" '
        'model_version_policy { specific { versions: 2 } } version_labels { key: "stable" value: 2 } } }' % model,
        model_server_config_pb2.ModelServerConfig())
    with ServerThread(opts) as server:
        manager = server.manager
        assert manager.resolve("half", label="stable").version == 1
        with pytest.raises(ServingError) as refused:  # 2 loads on its own thread, after the labels are tried
            manager.set_config(final)
        assert refused.value.code.name == "FAILED_PRECONDITION"
        deadline = time.monotonic() + 60
        while 2 not in {s.version for s in manager.status("half") if s.state == "AVAILABLE"}:
            assert time.monotonic() < deadline, manager.status("half")
            time.sleep(0.05)
        manager.poll()  # what the poller does next: 1 is no longer wanted
        assert manager.resolve("half", label="stable").version == 1  # still there for its label
        manager.set_config(final)  # sent again: taken now
        assert manager.resolve("half", label="stable").version == 2
        deadline = time.monotonic() + 60
        while 1 in {s.version for s in manager.status("half") if s.state == "AVAILABLE"}:
            assert time.monotonic() < deadline, manager.status("half")  # and 1 goes once the label has moved
            time.sleep(0.05)
