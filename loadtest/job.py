"""`tfpipe loadtest`: preflight, one locust process per step, microsecond percentiles,
an SLO gate, results.json and results.csv."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from typing import Callable

from loadtest.config import LoadtestConfig, parse_duration
from loadtest.errors import LoadtestError
from loadtest.histogram import LatencyHistogram
from loadtest.payloads import (grpc_requests, model_path, parse_target, rest_bodies, rows_from_data,
                               rows_from_payload, signature_inputs)
from loadtest.slo import check, parse_slo

COLUMNS = ["step", "users", "rate", "requests", "errors", "rps", "p50_ms", "p90_ms", "p95_ms", "p99_ms",
           "p99.9_ms", "max_ms", "mean_ms", "generator_cpu", "slo_ok"]


def run(config: LoadtestConfig, log: Callable[[str], None] = print) -> int:
    """Run every step; write results into config.out; 1 when an SLO is given and missed, else 0."""
    kind, address = parse_target(config.target)
    if not config.model:
        raise LoadtestError("--model is required (the model name on the server)")
    if bool(config.data) == bool(config.payload):
        raise LoadtestError("give --data (a tfpipe data directory) or --payload (a JSON request body)")
    terms = parse_slo(config.slo)
    warmup, duration = parse_duration(config.warmup), parse_duration(config.duration)

    inputs = signature_inputs(kind, address, config.model, config.version, config.label, config.signature)
    if config.data:
        rows = rows_from_data(config.data, inputs, limit=2000)
    else:
        body = rows_from_payload(config.payload)
        rows = body.get("instances") if isinstance(body.get("instances"), list) else None
        if kind == "grpc" and not (rows and all(isinstance(r, dict) for r in rows)):
            raise LoadtestError("for gRPC, --payload needs 'instances' as a list of objects (one per row)")
    spec = {"kind": kind, "address": address, "max_requests": config.max_requests, "workers": config.workers,
            "warmup": warmup, "duration": duration}
    if kind == "rest":
        spec["path"] = model_path(config.model, config.version, config.label) + ":predict"
        spec["bodies"] = (rest_bodies(rows, config.batch_size, config.signature) if config.data
                          else [json.dumps(body)])
    else:
        import base64

        spec["requests"] = [base64.b64encode(r).decode() for r in grpc_requests(
            rows, config.batch_size, inputs, config.model, config.version, config.label, config.signature)]
    _check_accepted(spec)
    log(f"target {config.target}, model {config.model}, signature {config.signature}: "
        f"{len(spec.get('bodies') or spec.get('requests'))} distinct requests of {config.batch_size} row(s)")

    os.makedirs(config.out, exist_ok=True)
    steps = []
    for i, value in enumerate(config.steps()):
        step_spec = dict(spec)
        if config.rate:
            step_spec["rate"] = value
            step_spec["users"] = max(config.users, int(value * 0.05) + 4)  # enough in flight to keep the schedule
        else:
            step_spec["users"] = int(value)
        log(f"step {i + 1}/{len(config.steps())}: "
            + (f"{value:g} requests/s (open model)" if config.rate else f"{int(value)} users (closed model)")
            + f", {warmup:g}s warmup + {duration:g}s")
        result = _run_step(step_spec, timeout=warmup + duration + 120)
        step = _summarise(i + 1, step_spec, result)
        step["slo_failures"] = check(terms, step) if terms else []
        step["slo_ok"] = not step["slo_failures"] if terms else None
        steps.append(step)
        log("  " + _line(step))
        if step["generator_bound"]:
            log(f"  warning: the load generator, not the server, may be the limit here ({step['generator_note']})")

    knee = max((s for s in steps if s["slo_ok"] is not False), key=lambda s: s["rps"], default=None)
    passed = knee is not None if terms else True
    results = {"command": sys.argv, "config": config.model_dump(mode="json"), "target_kind": kind,
               "slo": config.slo, "slo_passed": passed if terms else None,
               "knee": {"step": knee["step"], "rps": knee["rps"], "p99_ms": knee["p99_ms"]} if knee else None,
               "steps": steps}
    with open(os.path.join(config.out, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
    with open(os.path.join(config.out, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(steps)
    from loadtest.report import write_report

    write_report(results, os.path.join(config.out, "report.html"))
    for line in table(steps):
        log(line)
    if knee is not None and len(steps) > 1:
        log(f"knee: step {knee['step']}, {knee['rps']:.0f} req/s with p99 {knee['p99_ms']:.2f} ms")
    if terms:
        log(f"SLO {config.slo}: " + ("met" if passed else "MISSED"))
    log(f"wrote {os.path.join(config.out, 'results.json')}, results.csv and report.html")
    return 0 if passed else 1


def _check_accepted(spec: dict) -> None:
    """One request before any load: a payload the server rejects is a user error."""
    if spec["kind"] == "rest":
        req = urllib.request.Request(spec["address"] + spec["path"], data=spec["bodies"][0].encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        try:
            urllib.request.urlopen(req, timeout=30).read()
        except urllib.error.HTTPError as e:
            raise LoadtestError(f"the server rejects the payload: HTTP {e.code}: {e.read()[:300].decode(errors='replace')}") from None
        except (urllib.error.URLError, OSError) as e:
            raise LoadtestError(f"cannot reach {spec['address']}: {getattr(e, 'reason', e)}") from None
        return
    import base64

    import grpc
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    req = predict_pb2.PredictRequest.FromString(base64.b64decode(spec["requests"][0]))
    try:
        with grpc.insecure_channel(spec["address"]) as channel:
            prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(req, timeout=30)
    except grpc.RpcError as e:
        raise LoadtestError(f"the server rejects the payload: {e.code().name}: {e.details()}") from None


def _run_step(spec: dict, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, result_path = os.path.join(tmp, "spec.json"), os.path.join(tmp, "result.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""),
               "TF_CPP_MIN_LOG_LEVEL": "3"}
        proc = subprocess.run([sys.executable, "-m", "loadtest.generate", spec_path, result_path],
                              capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)
        if proc.returncode != 0 or not os.path.exists(result_path):
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise LoadtestError(f"the load generator failed: {' | '.join(tail)}")
        with open(result_path) as f:
            return json.load(f)


def _summarise(index: int, spec: dict, result: dict) -> dict:
    hist = LatencyHistogram.from_json(result["histogram"])
    errors = sum(result["errors"].values())
    requests = result["requests"]
    step = {"step": index, "users": spec["users"], "rate": spec.get("rate"), "requests": requests,
            "errors": errors, "errors_by_type": result["errors"],
            "error_fraction": errors / requests if requests else 1.0,
            "rps": hist.n / result["elapsed_s"], "elapsed_s": result["elapsed_s"],
            "generator_cpu": round(result["generator_cpu"], 3), **hist.summary(),
            "histogram": result["histogram"], "series": result.get("series", [])}
    notes = []
    per_process = result["generator_cpu"] / max(1, spec.get("workers", 1))
    if per_process > 0.9:
        notes.append(f"each generator process used {per_process:.0%} of a core")
    if spec.get("rate") and requests / result["elapsed_s"] < 0.95 * spec["rate"]:
        notes.append(f"it sent {requests / result['elapsed_s']:.0f} of {spec['rate']:g} requests/s")
    step["generator_bound"], step["generator_note"] = bool(notes), "; ".join(notes)
    return step


def _line(s: dict) -> str:
    return (f"{s['requests']} requests, {s['errors']} errors, {s['rps']:.0f} req/s, p50 {s['p50_ms']:.3f} ms, "
            f"p99 {s['p99_ms']:.3f} ms")


def table(steps: list[dict]) -> list[str]:
    head = f"{'step':>4} {'users':>5} {'rate':>7} {'req/s':>8} {'errors':>7} {'p50 ms':>8} {'p90 ms':>8} " \
           f"{'p99 ms':>8} {'p99.9 ms':>9} {'max ms':>8} {'SLO':>5}"
    lines = [head]
    for s in steps:
        rate = f"{s['rate']:g}" if s["rate"] else "-"
        slo = "-" if s["slo_ok"] is None else ("ok" if s["slo_ok"] else "MISS")
        lines.append(f"{s['step']:>4} {s['users']:>5} {rate:>7} {s['rps']:>8.0f} {s['errors']:>7} "
                     f"{s['p50_ms']:>8.3f} {s['p90_ms']:>8.3f} {s['p99_ms']:>8.3f} {s['p99.9_ms']:>9.3f} "
                     f"{s['max_ms']:>8.3f} {slo:>5}")
    return lines



