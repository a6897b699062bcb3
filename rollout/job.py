"""The rollout step of `tfpipe run`: the one verdict on a new version, and the promotion it decides.

A new version that passed the export's offline gate sits in BASE/NAME/candidates/ and the run's
server serves it beside the served version (as NAME-candidate, `tfpipe.versions.candidate_model`).
The serving gate load-tests both on the same requests in alternating rounds (served, new, served,
new: both meet the same machine, whose speed drifts) with the load test of `tfpipe loadtest`, and
measures the server's CPU time per request over each round (the run's process hosts the server;
the load generators are processes of their own). The new version is served only if it meets the
load test's SLO, answers no more errors, and its p99 latency and CPU per request exceed the served
version's by no more than the allowed share, nor by more than the served version's own spread
between rounds (the machine's noise). Otherwise it is held: kept in candidates/, exit status 1.
Either way the decision and why go into the model's history and `rollout.json`.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

from tfpipe import versions
from tfpipe.files import publish, read_json, write_json
from tfpipe.rollout.config import RolloutConfig
from tfpipe.stage import RolloutOutputs, StageResult

Log = Callable[[str], None]


@dataclass(frozen=True)
class Versions:
    """What the export decided: the model directory, its name, the served version, the new one
    (None when it made none to judge) and the export's decision and reason."""

    model_dir: str
    name: str
    served: int
    new: int | None
    decision: str
    reason: str


@dataclass(frozen=True)
class Target:
    """Where the rounds send their load: the server's address (http://... or grpc://...), its
    request counts by model (the server in this process), and the load test's settings."""

    address: str
    requests: Callable[[str], int]
    data: str | None
    users: int
    slo: str
    payload: str | None = None  # a JSON request body file, instead of rows from `data`
    # (model, candidate version, report dir) -> a context in which the server mirrors that model's
    # requests to the candidate (EmbeddedServer.shadowing); None: no shadow round
    shadowing: Callable[[str, int, str], Any] | None = None


def run(config: RolloutConfig, seen: Versions, target: Target | None, out: str, log: Log = print,
        data: str | None = None, models_config: str | None = None) -> str:
    """Decide, promote or hold, and publish `out` (rollout.json, and the rounds' load tests); its
    result (code 1 when this step held the new version). `data`:
    the new data directory, compared with the served version's data (reported, not a gate).
    `models_config`: the run's generated models.config, whose NAME-candidate entry goes once the
    new version is judged (a server started on it later, or tensorflow_model_server, would look
    for a version no longer in candidates/ after a promotion)."""
    from tfpipe.rollout.drift import drift_line, new_data_against_served

    with publish(out) as tmp:
        record: dict[str, Any] = {"stage": "rollout", "model": seen.name, "served_before": seen.served,
                                  "new": seen.new, "export_decision": seen.decision, "drift": None}
        act = seen.decision == "passed"  # whether this step promotes or holds the new version itself
        if data and seen.new is not None and seen.decision != "published":
            record["drift"] = new_data_against_served(data, versions.version_path(seen.model_dir, seen.served))
            log(drift_line(record["drift"]))
        if seen.decision != "passed" or seen.new is None:
            # the export published the first version, or held or refused the new one itself
            record.update(decision=seen.decision, reason=seen.reason, serving=None)
        elif seen.new not in versions.candidates(seen.model_dir):  # a rerun after it was promoted, or removed
            now = versions.served(seen.model_dir)
            record.update(decision="promoted" if now == seen.new else "held", serving=None,
                          reason=f"version {seen.new} is no longer a candidate (version {now} is served): "
                                 "nothing left to judge")
            act = False
        elif not config.serving_gate or target is None:
            record.update(decision="promoted", serving=None,
                          reason=f"passed the offline gate ({seen.reason}); the serving gate is off")
        else:
            serving = serving_gate(config, seen, target, tmp, log)
            record["serving"] = serving
            failed = [c["text"] for c in serving["checks"] if not c["passed"]]
            record.update(decision="held" if failed else "promoted",
                          reason="; ".join(failed) if failed else
                          f"passed the offline gate ({seen.reason}) and the serving gate")
        if act and record["decision"] == "promoted":
            with versions.locked(seen.model_dir):
                versions.serve_version(seen.model_dir, seen.new, "promoted", record["reason"])
        elif act and record["decision"] == "held":
            with versions.locked(seen.model_dir):
                versions.record(seen.model_dir, "held", seen.new, record["reason"], served_before=seen.served)
        record["served"] = versions.served(seen.model_dir)
        if models_config and seen.new is not None:
            from tfpipe.serve.tfserving.configs import remove_candidate

            remove_candidate(models_config, seen.name)
        log(f"{record['decision']}: {record['reason']}")
        write_json(os.path.join(tmp, "rollout.json"), record)
    return result(out)


def serving_gate(config: RolloutConfig, seen: Versions, target: Target, out: str, log: Log) -> dict[str, Any]:
    """Alternating load-test rounds of the served and the new version; their figures and checks."""
    names = {"served": seen.name, "new": versions.candidate_model(seen.name)}
    rounds: dict[str, list[dict[str, Any]]] = {"served": [], "new": []}
    for r in range(config.rounds):
        for arm, model in names.items():
            rounds[arm].append(one_round(config, model, target, os.path.join(out, f"round{r + 1}-{arm}"), log))
            row = rounds[arm][-1]
            log(f"  round {r + 1}, {arm} (version {seen.served if arm == 'served' else seen.new}): "
                f"{row['requests']:,} requests, p99 {row['p99_ms']:.2f} ms, {row['cpu_us']:.0f} us CPU per request"
                + (f", {row['errors']} errors" if row["errors"] else ""))
    summary = {arm: summarise(rs) for arm, rs in rounds.items()}
    summary["ratios"] = {key: paired_ratio(rounds["new"], rounds["served"], key) for key in ("p99_ms", "cpu_us")}
    shadow = None
    if config.shadow and target.shadowing is not None:
        shadow = shadow_round(config, seen, target, out, log, summary["served"])
    return {"rounds": rounds, "summary": summary, "checks": checks(config, summary, bool(target.slo)),
            "slo": target.slo, "shadow": shadow}


def shadow_round(config: RolloutConfig, seen: Versions, target: Target, out: str, log: Log,
                 served: dict[str, Any]) -> dict[str, Any]:
    """One more round of the served version, each request mirrored to the new one: the agreement of
    their answers on those requests, the new version's errors, and the served traffic's CPU per
    request with the shadow over its median without (reported, not a gate)."""
    from tfpipe.serve.shadow_report import agreement_text, merge_reports

    report_dir = os.path.join(out, "shadow")
    try:
        with target.shadowing(seen.name, seen.new, report_dir):
            row = one_round(config, seen.name, target, os.path.join(out, "round-shadow"), log)
        merged = merge_reports(report_dir)
    except (RuntimeError, OSError, ValueError) as e:
        log(f"  shadow round: not measured: {e}")
        return {"failed": str(e)}
    records = [r for r in merged["models"].get(seen.name, {}).get("records", [])
               if r["candidate_version"] == seen.new]
    cost = row["cpu_us"] / served["cpu_us"] if served["cpu_us"] and row["cpu_us"] else None
    lines = [f"{r['api']} {r['signature']}: {r['mirrored']:,} request(s) mirrored, {r['skipped']:,} skipped, "
             f"{r['summary']['errors']} error(s) of the new version; {agreement_text(r['summary'])}"
             for r in records]
    text = (f"shadow round (served version {seen.served}, every request mirrored to version {seen.new}): "
            f"{row['requests']:,} requests, {row['cpu_us']:.0f} us CPU per request"
            + (f", {cost:.2f}x the served rounds' median" if cost else ""))
    log("  " + text)
    for line in lines:
        log("    " + line)
    return {"round": row, "cpu_ratio": cost, "records": records, "text": text, "lines": lines}


def paired_ratio(new: list[dict[str, Any]], served: list[dict[str, Any]], key: str) -> float | None:
    """The median over rounds of the new version's figure over the served one's in the round just
    before it: each pair met the machine at nearly the same time, so a drift of its speed over the
    rounds cancels out. None when the served version measured nothing."""
    ratios = [n[key] / s[key] for n, s in zip(new, served) if s[key] > 0]
    return statistics.median(ratios) if ratios else None


def one_round(config: RolloutConfig, model: str, target: Target, out: str, log: Log) -> dict[str, Any]:
    """One closed-model load test of `model`: its p99, requests, errors and SLO verdict, and the
    server's CPU time per request over it (this process's CPU while the round ran, over the
    server's count of that model's requests in the same window, warmup included in both)."""
    from tfpipe.loadtest.config import LoadtestConfig
    from tfpipe.loadtest.job import run as loadtest

    cfg = LoadtestConfig(target=target.address, model=model, data=None if target.payload else target.data,
                         payload=target.payload, users=target.users, duration=config.duration,
                         warmup=config.warmup, slo=target.slo, out=out)
    marks: dict[str, tuple[float, int]] = {}

    def watch(line: str) -> None:  # the load test says when a step starts and when it is measured
        if line.startswith("step ") and "start" not in marks:  # its summary table starts "step" too
            marks["start"] = (time.process_time(), target.requests(model))
        elif line.startswith("  ") and "start" in marks and "end" not in marks:
            marks["end"] = (time.process_time(), target.requests(model))

    from tfpipe.loadtest.errors import LoadtestError

    try:
        loadtest(cfg, log=watch)
    except LoadtestError as e:  # e.g. no request answered within the round: a version too slow to measure
        log(f"  {model}: {e}")
        return {"requests": 0, "errors": 0, "p99_ms": 0.0, "rps": 0.0, "slo_ok": False, "cpu_us": 0.0,
                "failed": str(e)}
    step = (read_json(os.path.join(out, "results.json")) or {}).get("steps", [{}])[0]
    cpu = marks["end"][0] - marks["start"][0] if "end" in marks else 0.0
    served = marks["end"][1] - marks["start"][1] if "end" in marks else 0
    return {"requests": int(step.get("requests", 0)), "errors": int(step.get("errors", 0)),
            "p99_ms": float(step.get("p99_ms", 0.0)), "rps": float(step.get("rps", 0.0)),
            "slo_ok": step.get("slo_ok"), "cpu_us": cpu / served * 1e6 if served else 0.0}


def summarise(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """A version's figures over its rounds: the median p99 and CPU per request, and their spread
    (largest over smallest, minus one: how far the same version moves between rounds)."""
    p99 = [r["p99_ms"] for r in rounds]
    cpu = [r["cpu_us"] for r in rounds]
    return {"p99_ms": statistics.median(p99), "cpu_us": statistics.median(cpu),
            "p99_spread": spread(p99), "cpu_spread": spread(cpu),
            "errors": sum(r["errors"] for r in rounds), "requests": sum(r["requests"] for r in rounds),
            "slo_ok": all(r["slo_ok"] is not False for r in rounds),
            "unmeasured": [r["failed"] for r in rounds if r.get("failed")]}


def spread(values: list[float]) -> float:
    positive = [v for v in values if v > 0]
    return max(positive) / min(positive) - 1.0 if len(positive) > 1 else 0.0


def checks(config: RolloutConfig, summary: dict[str, dict[str, Any]], slo: bool) -> list[dict[str, Any]]:
    """The serving gate's checks on the two versions' figures, each with its line."""
    served, new = summary["served"], summary["new"]
    out = []
    for arm, figures in (("new", new), ("served", served)):
        if figures.get("unmeasured"):  # nothing to compare: the new version cannot be shown to keep up
            out.append({"check": "measured", "passed": False,
                        "text": f"the {arm} version could not be measured: {figures['unmeasured'][0]}"})
    if out:
        return out
    if slo:
        out.append({"check": "slo", "passed": new["slo_ok"],
                    "text": "the new version meets the load test's SLO" if new["slo_ok"]
                    else "the new version misses the load test's SLO"})
    out.append({"check": "errors", "passed": new["errors"] <= served["errors"],
                "text": f"errors: new {new['errors']}, served {served['errors']}"})
    ratios = summary.get("ratios") or {}
    for key, unit, limit in (("p99_ms", "ms", config.max_p99_rise), ("cpu_us", "us CPU per request",
                                                                     config.max_cpu_rise)):
        allowed = max(limit, served[key.replace("_ms", "_spread").replace("_us", "_spread")])
        ratio = ratios.get(key, new[key] / served[key] if served[key] else None)
        passed = ratio is None or ratio <= 1 + allowed
        what = "p99" if key == "p99_ms" else "CPU"
        out.append({"check": what, "passed": passed, "allowed_rise": allowed, "ratio": ratio,
                    "text": f"{what} {new[key]:.2f} {unit} against the served version's {served[key]:.2f}"
                            + (f", {ratio:.2f}x round by round" if ratio is not None else "")
                            + f" (allowed: +{allowed:.0%})" + ("" if passed else ": too slow")})
    return out


def result(out: str) -> StageResult:
    """The rollout step's outputs for `tfpipe run`: the decision and the version served; exit
    status 1 when the serving gate held the new version."""
    path = os.path.join(out, "rollout.json")
    r = read_json(path)
    if r is None:
        raise FileNotFoundError(path)
    held_here = r["decision"] == "held" and r["export_decision"] == "passed"
    if r["new"] is None or r["export_decision"] == "published":
        summary = f"{r['model']} version {r['served']} served (published by the export)"
    elif r["export_decision"] in ("held", "refused"):
        summary = f"{r['model']} version {r['new']} {r['export_decision']} by the export; version {r['served']} served"
    else:
        summary = f"{r['model']} version {r['new']} {r['decision'].upper()}: {r['reason']}; version {r['served']} served"
    drift = r.get("drift")
    if drift is not None:
        summary += (f"; the new data: {', '.join(drift['drifted'])} moved against the served version's"
                    if drift["drifted"] else "; the new data: no feature moved beyond the noise")
    return StageResult(path, summary, RolloutOutputs(out, r["decision"], r["served"]), code=1 if held_here else 0)
