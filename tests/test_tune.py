"""`tfpipe tune`: the coarse-to-fine search on tables, and the command on a small model, killed
after its first trial and resumed, writing a batching.config the server served with."""

from __future__ import annotations

import json
import os
import signal
import statistics
import time
from dataclasses import replace

import pytest
from conftest import run_cli, spawn_cli


def _search(budget: int, score, cores: int = 2, workers: bool = False):
    """Run the search to its end with `score(candidate)` standing in for a measurement."""
    from tfpipe.tune.search import CoarseToFine

    search = CoarseToFine(cores, budget, workers)
    while (proposal := search.propose()) is not None:
        stage, candidate = proposal
        search.record(stage, candidate, score(candidate))
    return search


def _peak(c) -> float:
    """A made-up landscape: best at max_batch_size 64, 4000 us, 1 thread, no padding."""
    return (1000 - abs(c.max_batch_size - 64) - abs(c.batch_timeout_micros - 4000) / 20
            - 50 * abs(c.num_batch_threads - 1) - (30 if c.allowed_batch_sizes else 0)
            - (10 if c.max_enqueued_batches < 100 else 0))


@pytest.mark.parametrize("budget,stages", [
    (1, ["start"]),
    (4, ["start", "coarse", "coarse", "coarse"]),  # too small to keep two trials back for the confirmation
    (6, ["start", "coarse", "coarse", "coarse", "confirm", "confirm"]),
    (20, ["start"] + ["coarse"] * 8 + ["fine"] * 4 + ["threads"] * 2 + ["queue", "padding", "confirm", "confirm"]),
])
def test_stages_fill_the_budget_and_keep_the_confirmation(budget, stages):
    search = _search(budget, _peak)
    assert [s for s, _, _ in search.trials] == stages
    assert len(search.trials) <= budget
    first = search.trials[0][1]
    assert (first.max_batch_size, first.batch_timeout_micros, first.num_batch_threads) == (32, 0, 2)
    measured = [c for s, c, _ in search.trials if s != "confirm"]
    assert len(measured) == len(set(measured)), "a candidate measured twice outside the confirmation"


@pytest.mark.parametrize("cores, workers, stages", [
    (2, True, ["start"] + ["coarse"] * 8 + ["fine"] * 4 + ["threads"] * 2 + ["workers", "queue", "padding",
                                                                             "confirm", "confirm"]),
    # one core: no workers stage (and one threads trial: 1 thread is the start's own)
    (1, True, ["start"] + ["coarse"] * 8 + ["fine"] * 4 + ["threads", "queue", "padding", "confirm", "confirm"]),
])
def test_a_workers_stage_serves_the_leader_on_one_process_per_core(cores, workers, stages):
    search = _search(21, _peak, cores=cores, workers=workers)
    assert [stage for stage, _, _ in search.trials] == stages
    tried = [c for stage, c, _ in search.trials if stage == "workers"]
    assert all(c.workers == cores and c.num_batch_threads >= 1 for c in tried)
    if tried:  # the leader before the stage (the best mean of the trials so far), its batch halved for 2
        before = [(c, s) for stage, c, s in search.trials[:[st for st, _, _ in search.trials].index("workers")]]
        means = {c: sum(x for d, x in before if d == c) / sum(1 for d, _ in before if d == c) for c, _ in before}
        leader = max(means, key=means.get)
        assert tried == [replace(leader, workers=2, max_batch_size=max(1, leader.max_batch_size // 2),
                                 num_batch_threads=max(1, leader.num_batch_threads // 2), allowed_batch_sizes=())]
    assert all("workers=" in c.label() for c in tried) and "workers" not in search.start.label()
    # a winner on two workers is what the search returns when two workers score best
    faster = _search(21, lambda c: _peak(c) + (500 if c.workers > 1 else 0), cores=2, workers=True)
    assert faster.best().workers == 2


def test_the_search_climbs_towards_the_peak_and_ranks_by_the_mean():
    from tfpipe.tune.search import Candidate

    search = _search(20, _peak)
    best = search.best()
    # coarse: (32, 2000) leads; fine: doubling its timeout to 4000 beats (64, 2000); threads: 1;
    # the short queue and the padding both lose
    assert best == Candidate(32, 4000, 1)
    stages = {}
    for stage, c, _ in search.trials:
        stages.setdefault(stage, []).append(c)
    assert set(stages["fine"]) == {Candidate(16, 2000, 2), Candidate(64, 2000, 2), Candidate(32, 1000, 2),
                                   Candidate(32, 4000, 2)}
    assert stages["queue"] == [Candidate(32, 4000, 1, 1)]
    assert stages["padding"] == [Candidate(32, 4000, 1, allowed_batch_sizes=(1, 2, 4, 8, 16, 32))]
    scores = search.scores()
    assert search.best() == max(scores, key=lambda c: statistics.fmean(scores[c]))
    confirmed = [c for s, c, _ in search.trials if s == "confirm"]
    assert confirmed[0] == search.start and len(scores[search.start]) == 2
    # a candidate that was lucky once and not again ranks by its mean, below the steady leader
    lucky = Candidate(256, 16000, 4)
    search.record("confirm", lucky, 1500)
    assert search.best() == lucky
    search.record("confirm", lucky, 100)
    assert search.best() == best


def test_a_candidate_leading_on_one_measurement_is_measured_again():
    """Every candidate reads 200 req/s lower the second time: the confirmed leader falls behind
    single measurements one after another, and each new leader is measured again, until the
    leader is one measured twice."""
    def fading():
        seen: dict = {}

        def score(c) -> float:
            seen[c] = seen.get(c, 0) + 1
            return _peak(c) - (200 if seen[c] > 1 else 0)
        return score

    search = _search(30, fading())
    scores = search.scores()
    extra = [c for _, c, _ in search.trials[19:]]  # beyond start, coarse ... padding and the first two confirmations
    assert len(extra) == 3 and all(s == "confirm" for s, _, _ in search.trials[17:])
    assert all(len(scores[c]) == 2 for c in extra)  # each measured once before, once again here
    assert len(scores[search.best()]) == 2 and len(search.trials) < 30
    # a budget that runs out first stops the re-measuring
    assert len(_search(20, fading()).trials) == 20
    # with a steady landscape nothing is measured beyond the first confirmation
    assert len(_search(24, _peak).trials) == 19


def test_nothing_meeting_the_slo_leaves_the_start():
    search = _search(8, lambda c: 0.0)
    assert search.best() == search.start


@pytest.mark.parametrize("n,sizes", [(1, (1,)), (2, (1, 2)), (6, (1, 2, 4, 6)), (32, (1, 2, 4, 8, 16, 32))])
def test_padding_sizes_end_at_the_batch_size(n, sizes):
    from tfpipe.tune.search import powers_of_two_up_to

    assert powers_of_two_up_to(n) == sizes


@pytest.mark.parametrize("values,levels", [
    ({}, [8.0, 16.0, 32.0]),
    ({"clients": 4}, [1.0, 2.0, 4.0]),
    ({"clients": 1}, [1.0]),
    ({"rate": 100}, [25.0, 50.0, 75.0, 100.0]),
    ({"levels": "16,2,8"}, [2.0, 8.0, 16.0]),
    ({"rate": 10, "levels": "5,2.5"}, [2.5, 5.0]),
])
def test_load_levels(values, levels):
    from tfpipe.tune.config import TuneConfig

    assert TuneConfig(**values).load_levels() == levels


@pytest.mark.parametrize("values,message", [
    ({"clients": 4, "rate": 10}, "not both"),
    ({"slo": "p99 under 20"}, "cannot parse SLO"),
    ({"levels": "4,-1"}, "positive"),
    ({"trials": 21}, "less than or equal to 20"),
])
def test_bad_options_are_refused(values, message):
    from pydantic import ValidationError

    from tfpipe.tune.config import TuneConfig

    with pytest.raises(ValidationError, match=message):
        TuneConfig(**values)


def test_the_candidate_is_a_batching_parameters_file_the_server_reads(tmp_path):
    from tfpipe.serve.core.batching import BatchOptions
    from tfpipe.serve.tfserving.configs import read_text_proto, write_text_proto
    from tfpipe.serve.tfserving.protos import BatchingParameters
    from tfpipe.tune.search import Candidate

    c = Candidate(16, 0, 3, 7, (1, 2, 4, 8, 16))
    path = write_text_proto(str(tmp_path / "batching.config"), c.to_proto())
    options = BatchOptions.from_proto(read_text_proto(path, BatchingParameters(), "--batching_parameters_file"))
    assert (options.max_batch_size, options.batch_timeout_micros, options.num_batch_threads,
            options.max_enqueued_batches, options.allowed_batch_sizes) == (16, 0, 3, 7, (1, 2, 4, 8, 16))
    assert Candidate.from_json(json.loads(json.dumps(c.to_json()))) == c


@pytest.mark.parametrize("args,message", [
    (["--model_name", "m", "--model_base_path", "{tmp}/nothing", "--payload", "{tmp}/body.json"], "not a directory"),
    (["--model_name", "m", "--model_base_path", "{tmp}", "--payload", "{tmp}/body.json"], "no numbered version"),
    (["--model_name", "m", "--model_base_path", "{model}"], "--data"),
    (["--model_base_path", "{model}", "--payload", "{tmp}/body.json"], "--model_name"),
    (["--model_name", "m", "--model_base_path", "{model}", "--payload", "{tmp}/body.json", "--out", "{tmp}"],
     "not a tfpipe tune output"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    model = tmp_path / "model"
    (model / "1").mkdir(parents=True)
    (tmp_path / "body.json").write_text('{"instances": [1.0]}')
    res = run_cli("tune", *[a.format(tmp=tmp_path, model=model) for a in args])
    assert res.returncode == 2, res.stdout + res.stderr
    assert message in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_without_data_or_payload_the_warmup_records_are_the_requests(tmp_path):
    """tfpipe tune on a SavedModel alone: the newest version's assets.extra warmup records (40 Predict
    requests of one row each, more than a batch of the start's 32 holds) are the load, a row per
    request; one short trial runs on them without errors."""
    from serving_models import save_half

    save_half(str(tmp_path / "half" / "1"))  # no warmup records: not chosen
    save_half(str(tmp_path / "half" / "2"), warmup=40)
    out = tmp_path / "tuned"
    res = run_cli("tune", "--model_name", "half", "--model_base_path", str(tmp_path / "half"), "--levels", "2",
                  "--trials", "1", "--duration", "0.3s", "--warmup", "0.1s", "--slo", "p99<2000ms", "--out", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"requests: the 40 row(s) of {tmp_path / 'half' / '2' / 'assets.extra'}" in res.stdout
    (trial,) = json.loads((out / "tune.json").read_text())["trials"]
    (level,) = trial["levels"]
    assert level["requests"] > 0 and level["errors"] == 0
    from tfpipe.tune.job import result  # what `tfpipe run` and the CLI's exit code read of it

    done = result(str(out))
    label = json.loads((out / "tune.json").read_text())["best"]["label"]
    assert (done.code, done.outputs.path, done.outputs.best) == (0, str(out), label)
    assert done.summary.startswith(f"1 trial(s); best {label}: ") and done.summary.endswith("req/s within the SLO")


def test_warmup_rows_come_out_as_rest_instances(tmp_path):
    from serving_models import save_half

    from tfpipe.loadtest.errors import LoadtestError
    from tfpipe.loadtest.payloads import resolve_saved_model, rows_from_warmup

    save_half(str(tmp_path / "half" / "7"), warmup=2)
    save_half(str(tmp_path / "half" / "10"), warmup=3)
    assert resolve_saved_model(str(tmp_path / "half"), None) == str(tmp_path / "half" / "10")  # by number
    assert rows_from_warmup(str(tmp_path / "half" / "10")) == [{"x": 0.0}, {"x": 1.0}, {"x": 2.0}]
    with pytest.raises(LoadtestError, match="no Predict request to 'other'"):
        rows_from_warmup(str(tmp_path / "half" / "10"), "other")
    save_half(str(tmp_path / "bare" / "1"))
    with pytest.raises(LoadtestError, match="has no warmup records"):
        rows_from_warmup(str(tmp_path / "bare" / "1"))


def _servers_of(path: str) -> list:
    import psutil

    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(path in part for part in p.info["cmdline"] or ()):
                found.append(p)
        except psutil.Error:
            pass
    return found


@pytest.mark.long
def test_tune_killed_after_a_trial_resumes_and_writes_a_config_the_server_served(tmp_path):
    from serving_models import save_half

    from tfpipe.serve.tfserving.configs import read_text_proto
    from tfpipe.serve.tfserving.protos import BatchingParameters

    save_half(str(tmp_path / "half" / "1"))
    (tmp_path / "body.json").write_text('{"instances": [{"x": 1.0}, {"x": 2.0}]}')
    out = tmp_path / "tuned"
    args = ["tune", "--model_name", "half", "--model_base_path", str(tmp_path / "half"), "--payload",
            str(tmp_path / "body.json"), "--levels", "2", "--trials", "2", "--duration", "0.3s", "--warmup", "0.1s",
            "--slo", "p99<2000ms", "--out", str(out)]
    first = spawn_cli(*args)
    lines = []
    deadline = time.time() + 120
    while time.time() < deadline:
        line = first.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("trial  1/2"):
            break
    assert lines and lines[-1].startswith("trial  1/2"), "".join(lines) + (first.stderr.read() or "")
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    # the killed tune's trial servers went with it (PR_SET_PDEATHSIG), within a few seconds
    work = str(tmp_path / ".tuned.resume")
    deadline = time.time() + 30
    while _servers_of(work) and time.time() < deadline:
        time.sleep(0.2)
    assert not _servers_of(work), "a trial server outlived the killed tune"
    assert not out.exists()

    res = run_cli(*args)
    assert res.returncode == 0, res.stdout + res.stderr
    trial_lines = [ln for ln in res.stdout.splitlines() if ln.startswith("trial ")]
    assert len(trial_lines) == 2 and "(measured before this resume)" in trial_lines[0], res.stdout
    assert "(measured before" not in trial_lines[1]
    result = json.loads((out / "tune.json").read_text())
    assert [t["trial"] for t in result["trials"]] == [1, 2]
    assert [t["stage"] for t in result["trials"]] == ["start", "coarse"]
    for t in result["trials"]:
        (level,) = t["levels"]
        assert level["requests"] > 0 and level["errors"] == 0 and t["score_rps"] == pytest.approx(level["rps"], 0.01)
    best = result["best"]  # which trial wins is the search's to choose: tested above on a made-up landscape
    # the published config is the best trial's file, which a server started with and served from
    (trial,) = best["trials"]
    trial_dir = out / "trials" / f"{trial:02d}"
    assert (out / "batching.config").read_text() == (trial_dir / "batching.config").read_text()
    params = read_text_proto(str(out / "batching.config"), BatchingParameters(), "batching")
    assert params.max_batch_size.value == best["candidate"]["max_batch_size"]
    assert "--enable_batching=true" in (trial_dir / "server.log").read_text()
    html = (out / "tune.html").read_text()
    assert "Batching tuned by measurement" in html and html.count("<tr>") == 3  # header + 2 trials
    assert not os.path.exists(tmp_path / ".tuned.resume")


@pytest.mark.parametrize("options", [
    {"max_batch_size": 64, "batch_timeout_micros": 500, "num_batch_threads": 3, "max_enqueued_batches": 7,
     "allowed_batch_sizes": (16, 64)},
    {"max_batch_size": 256, "batch_timeout_micros": 0, "num_batch_threads": 1, "max_enqueued_batches": 1000,
     "enable_large_batch_splitting": True, "max_execution_batch_size": 64, "allowed_batch_sizes": (32, 64)},
])
def test_batching_options_are_written_whole_by_one_serialiser(options):
    """BatchOptions' own JSON is what tune.json's candidates and a run's [serve] section carry:
    every field, the splitting ones too, and a candidate's workers."""
    from tfpipe.serve.config import ServeConfig
    from tfpipe.serve.core.batching import BatchOptions
    from tfpipe.tune.search import Candidate

    o = BatchOptions(**options)
    assert BatchOptions.from_json(o.to_json()) == o
    c = Candidate(**options, workers=2)
    assert Candidate.from_json(c.to_json()) == c and c.to_json()["workers"] == 2
    assert ServeConfig().with_batching(o).batch_options() == o
