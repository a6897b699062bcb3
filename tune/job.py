"""`tfpipe tune`: search TF Serving's BatchingParameters for the most throughput within an SLO.

Every trial starts the server (tfpipe's embedded one, or real TF Serving through tfpipe serve
--backend) on the model with one candidate batching.config, load-tests it level by level with
the load generator of `tfpipe loadtest`, and stops it. The candidates come coarse to fine
(tune/search.py). Writes into --out, published whole at the end:
- batching.config: the best candidate, as --batching_parameters_file takes it;
- tune.json: every trial (stage, candidate, each level's throughput and percentiles, score),
  the start (the batching guide's CPU starting point) and the best, and their ratio;
- tune.html: the evidence table and charts;
- trials/NN/: each trial's batching.config, server log and load tests.
A killed tune resumes: the trials measured so far are kept beside --out (.NAME.resume) and
reused when the same command runs again.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import statistics
import sys
from collections.abc import Callable
from typing import Any

from tfpipe.files import cache_key, publish_dir, read_json, resume_dir, write_json
from tfpipe.machine import cores as machine_cores
from tfpipe.stage import StageResult, TuneOutputs
from tfpipe.tune.config import TuneConfig
from tfpipe.tune.errors import TuneError
from tfpipe.tune.search import Candidate, CoarseToFine


def check_inputs(cfg: TuneConfig) -> None:
    """What can be checked before anything starts: the model, a request source, --out."""
    if not cfg.model_name or not cfg.model_base_path:
        raise TuneError("give --model_name and --model_base_path (the model to serve, as for tfpipe serve)")
    base = cfg.model_base_path
    if "://" not in base:
        if not os.path.isdir(base):
            raise TuneError(f"--model_base_path {base} is not a directory")
        versions = [v for v in os.listdir(base) if v.isdigit() and os.path.isdir(os.path.join(base, v))]
        if not versions:
            raise TuneError(f"--model_base_path {base} holds no numbered version directory (e.g. {base}/1/ with a "
                            "SavedModel)")
    if not (cfg.data or cfg.payload or cfg.warmup_records) and "://" not in base:
        from tfpipe.loadtest.payloads import WARMUP_FILE, resolve_saved_model

        newest = resolve_saved_model(base, None)
        if not os.path.exists(os.path.join(newest, WARMUP_FILE)):
            raise TuneError(f"{newest} has no warmup records ({WARMUP_FILE}) to build requests from: give --data (a "
                            "tfpipe data directory) or --payload (a JSON request body)")
    elif not (cfg.data or cfg.payload or cfg.warmup_records):
        raise TuneError("give --data (a tfpipe data directory) or --payload (a JSON request body) for the requests")
    out = cfg.out
    if os.path.exists(out) and (not os.path.isdir(out) or (os.listdir(out)
                                                          and not os.path.exists(os.path.join(out, "tune.json")))):
        raise TuneError(f"--out {out} exists and is not a tfpipe tune output (no tune.json); it would be replaced "
                        "whole: choose another --out or remove it")


def warmup_version(cfg: TuneConfig, log: Callable[[str], None]) -> str:
    """The default request source: the newest version, whose warmup records' rows are the requests
    (what TF Serving users ship in assets.extra); checked to hold some."""
    from tfpipe.loadtest.errors import LoadtestError
    from tfpipe.loadtest.payloads import WARMUP_FILE, resolve_saved_model, rows_from_warmup

    version = resolve_saved_model(cfg.model_base_path, None)
    try:
        rows = rows_from_warmup(version)
    except LoadtestError as e:
        raise TuneError(str(e)) from None
    log(f"requests: the {len(rows)} row(s) of {os.path.join(version, WARMUP_FILE)}")
    return version


def work_dir(out: str) -> str:
    return resume_dir(out)


def fingerprint(cfg: TuneConfig, cores: int) -> str:
    """What decides the trials' outcomes, which a resumed tune reuses only when it matches: the
    settings of the run's step (`fingerprint_fields`) but how many trials and how long a start
    may take (a resumed tune may change them), the cores, the model and the requests."""
    settings = {k: v for k, v in cfg.fingerprint_fields().items() if k not in ("trials", "start_timeout")}
    return cache_key({**settings, "cores": cores},
                     {"model": [cfg.model_name, cfg.model_base_path], "data": cfg.data, "payload": cfg.payload})


def run(cfg: TuneConfig, log: Callable[[str], None] = print) -> StageResult:
    """The trials, published into cfg.out; the result's code: 0 when the best candidate met the SLO
    at some level, 1 when no candidate did."""
    check_inputs(cfg)
    cores = cfg.cores or machine_cores()
    work = work_dir(cfg.out)
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(work, "lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise TuneError(f"another tfpipe tune is writing {cfg.out} (its trials are in {work})") from None
        if not (cfg.data or cfg.payload or cfg.warmup_records):
            cfg = cfg.model_copy(update={"warmup_records": warmup_version(cfg, log)})
        tuned = _tune(cfg, cores, work, log)
    shutil.rmtree(work, ignore_errors=True)
    for line in summary_lines(tuned):
        log(line)
    log(f"wrote {os.path.join(cfg.out, 'batching.config')}, tune.json and tune.html")
    return result(cfg.out)


def result(out: str) -> StageResult:
    """A published tune's best candidate, in one line; code 1 when no candidate met the SLO."""
    path = os.path.join(out, "tune.json")
    r = read_json(path)
    if r is None:
        raise TuneError(f"{out} holds no tune.json (not a tune's output, or an interrupted one)")
    best = r["best"]
    met = best["score_rps"] > 0
    summary = (f"{len(r['trials'])} trial(s); best {best['label']}: "
               + (f"{best['score_rps']:.0f} req/s within the SLO" if met else "no candidate met the SLO"))
    return StageResult(path, summary, TuneOutputs(out, best["label"]), 0 if met else 1)


def _tune(cfg: TuneConfig, cores: int, work: str, log: Callable[[str], None]) -> dict[str, Any]:
    """The trials (those of an interrupted tune with the same settings reused), then the
    published output; returns tune.json's content."""
    from tfpipe.tune.trial import run_trial

    search = CoarseToFine(cores, cfg.trials, workers=not cfg.skip_workers and cfg.backend == "embedded")
    state_path = os.path.join(work, "state.json")
    state = read_json(state_path) or {}
    key = fingerprint(cfg, cores)
    earlier = state.get("trials", []) if state.get("fingerprint") == key else []
    if not earlier:
        for name in os.listdir(work):
            if name != "lock":
                shutil.rmtree(os.path.join(work, name), ignore_errors=True)
    records: list[dict] = []
    levels = ", ".join(f"{v:g}" for v in cfg.load_levels())
    log(f"tuning {cfg.model_name} ({cfg.model_base_path}) on the {cfg.backend} server, {cfg.protocol.upper()}, "
        f"{'rates' if cfg.rate else 'clients'} {levels}, SLO {cfg.slo or 'none'}; at most {cfg.trials} trials, "
        f"num_batch_threads around {cores} core(s)")
    while (proposal := search.propose()) is not None:
        stage, candidate = proposal
        n = len(records) + 1
        if n <= len(earlier) and Candidate.from_json(earlier[n - 1]["candidate"]) == candidate:
            record = earlier[n - 1]
            note = " (measured before this resume)"
        else:
            earlier = []  # from here on, measure
            record = {"trial": n, "stage": stage, **run_trial(cfg, candidate, os.path.join(work, "trials", f"{n:02d}"))}
            note = ""
        search.record(stage, candidate, record["score_rps"])
        records.append(record)
        write_json(state_path, {"fingerprint": key, "trials": records})
        log(f"trial {n:>2}/{cfg.trials} {stage:<7} {candidate.label()}: " + _verdict(cfg, record) + note)
    result = summarise(cfg, cores, search, records)
    tmp = os.path.join(work, "publish")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    if os.path.isdir(os.path.join(work, "trials")):
        shutil.copytree(os.path.join(work, "trials"), os.path.join(tmp, "trials"))
    from tfpipe.serve.tfserving.configs import write_text_proto
    from tfpipe.tune.report import write_html

    write_text_proto(os.path.join(tmp, "batching.config"), Candidate.from_json(result["best"]["candidate"]).to_proto())
    write_html(result, os.path.join(tmp, "tune.html"))
    write_json(os.path.join(tmp, "tune.json"), result)  # last: its presence marks a whole output
    publish_dir(tmp, cfg.out)
    return result


def _verdict(cfg: TuneConfig, record: dict) -> str:
    if record.get("failed"):
        return f"failed: {record['failed']}"
    unit = "req/s" if not cfg.rate else "req/s answered"
    levels = "; ".join(f"{lv['level']:g}: {lv['rps']:.0f} p99 {lv['p99_ms']:.1f} ms"
                       + ("" if lv["slo_ok"] is not False and not lv["errors"] else " MISS") for lv in record["levels"])
    if record["score_rps"]:
        return f"{record['score_rps']:.0f} {unit} within the SLO [{levels}]"
    return f"no level met the SLO [{levels}]"


def summarise(cfg: TuneConfig, cores: int, search: CoarseToFine, records: list[dict]) -> dict[str, Any]:
    scores = search.scores()
    best, start = search.best(), search.start

    def entry(c: Candidate) -> dict:
        runs = scores[c]
        return {"candidate": c.to_json(), "label": c.label(), "score_rps": round(statistics.fmean(runs), 2),
                "runs": len(runs), "trials": [r["trial"] for r in records if Candidate.from_json(r["candidate"]) == c]}

    start_rps, best_rps = statistics.fmean(scores[start]), statistics.fmean(scores[best])
    return {"command": sys.argv, "config": cfg.model_dump(mode="json"), "cores": cores,
            "load": {"model": "open" if cfg.rate else "closed", "levels": cfg.load_levels()},
            "trials": records, "start": entry(start), "best": entry(best),
            "ratio": round(best_rps / start_rps, 3) if start_rps else None,
            "ranking": sorted((entry(c) for c in scores), key=lambda e: -e["score_rps"])}


def summary_lines(result: dict[str, Any]) -> list[str]:
    start, best = result["start"], result["best"]
    lines = [f"start (the batching guide's CPU starting point): {start['score_rps']:.0f} req/s within the SLO "
             f"(mean of {start['runs']} trial(s))",
             f"best: {best['label']}", f"  {best['score_rps']:.0f} req/s within the SLO (mean of {best['runs']} "
             f"trial(s))" + (f", {result['ratio']:.2f}x the start" if result["ratio"] else "")]
    workers = best.get("candidate", {}).get("workers", 1)
    if workers > 1:
        lines.append(f"  serve it with tfpipe serve --workers {workers} and this batching.config (each worker batches "
                     "on its own)")
    if not best["score_rps"]:
        lines.append("no candidate met the SLO at any load level: loosen --slo or lower the load (--clients/--rate)")
    return lines


def best(out: str) -> tuple[Candidate, str]:
    """The best candidate a finished tune in `out` found, and its label (for `tfpipe run`)."""
    entry = read_json(os.path.join(out, "tune.json"))["best"]
    return Candidate.from_json(entry["candidate"]), entry["label"]

