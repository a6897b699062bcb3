"""`tfpipe loadtest`: preflight, one locust process per step, microsecond percentiles,
an SLO gate, results.json and results.csv."""

from __future__ import annotations

import csv
import json
import math
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import replace
from typing import Callable

from tfpipe import EXIT_INTERRUPTED
from tfpipe.children import module_argv
from tfpipe.files import publish, write_json
from tfpipe.loadtest.config import LoadtestConfig, parse_duration
from tfpipe.loadtest.errors import LoadtestError
from tfpipe.loadtest.histogram import LatencyHistogram
from tfpipe.loadtest.payloads import (chunks, grpc_requests, model_path, parse_target, resolve_saved_model,
                                      rest_bodies, rows_from_data, rows_from_payload, rows_from_warmup,
                                      saved_model_feeds, saved_model_inputs, signature_inputs)
from tfpipe.loadtest.protocol import Progress, StepSpec, Waiting, decode
from tfpipe.loadtest.slo import check, parse_slo
from tfpipe.stage import LoadtestOutputs, StageResult

COLUMNS = ["step", "users", "rate", "requests", "errors", "rps", "p50_ms", "p90_ms", "p95_ms", "p99_ms",
           "p99.9_ms", "max_ms", "mean_ms", "overhead_p50_ms", "generator_cpu", "slo_ok"]

WORKER_WAIT_S = 600.0  # how long each step waits for workers from other machines


def run(config: LoadtestConfig, log: Callable[[str], None] = print) -> StageResult:
    """Run every step; write results into config.out. The result's code: 1 when an SLO is given and
    missed, EXIT_INTERRUPTED when interrupted, else 0."""
    if config.worker:
        return _unreported(config, run_workers(config.master, max(1, config.workers), log),
                           "locust workers for a master elsewhere: the results are the master's")
    if config.replay:
        return run_replay(config, log)
    kind, address = parse_target(config.target)
    if not config.model:
        raise LoadtestError("--model is required (the model name on the server)")
    if sum(map(bool, (config.data, config.payload, config.warmup_records))) != 1:
        raise LoadtestError("give --data (a tfpipe data directory), --payload (a JSON request body) or "
                            "--warmup-records (a SavedModel version directory)")
    terms = parse_slo(config.slo)
    spec, rows = _step_spec(config, kind, address)
    _check_accepted(spec)
    log(f"target {config.target}, model {config.model}, signature {config.signature}: "
        f"{len(spec.bodies or spec.requests)} distinct requests of {config.batch_size} row(s)")
    _check_out(config.out)
    baseline = _baseline(config, rows, log)
    if config.web:
        log(f"locust web UI: http://127.0.0.1:{config.web_port} (while each step runs)")
    if config.expect_workers:
        log(f"each step waits for {config.expect_workers} worker(s) from other machines at {config.master_bind}: "
            f"tfpipe loadtest --worker --master THIS_HOST:{spec.master_port} --workers N")
    steps, interrupted = _run_steps(config, spec, terms, baseline, log)
    if not steps:
        if interrupted:
            log("interrupted before any step measured a whole second: nothing to report")
            return _unreported(config, EXIT_INTERRUPTED, "interrupted before any step measured a whole second")
        raise LoadtestError("no step measured any request")
    return _report(config, kind, steps, interrupted, terms, baseline, log)


def _step_spec(config: LoadtestConfig, kind: str, address: str) -> tuple[StepSpec, list[dict] | None]:
    """What every step sends (REST bodies or serialized gRPC requests, shaped for the signature the
    server reports), and the rows they came from (None for a --payload without instances)."""
    warmup, duration = parse_duration(config.warmup), parse_duration(config.duration)  # before any network call
    inputs = signature_inputs(kind, address, config.model, config.version, config.label, config.signature)
    if config.data:
        rows = rows_from_data(config.data, inputs, limit=2000)
    elif config.warmup_records:
        rows = rows_from_warmup(config.warmup_records, config.signature)
    else:
        body = rows_from_payload(config.payload)
        rows = body.get("instances") if isinstance(body.get("instances"), list) else None
        if kind == "grpc" and not (rows and all(isinstance(r, dict) for r in rows)):
            raise LoadtestError("for gRPC, --payload needs 'instances' as a list of objects (one per row)")
    payloads: dict = {}
    if kind == "rest":
        payloads["path"] = model_path(config.model, config.version, config.label) + ":predict"
        payloads["bodies"] = (rest_bodies(rows, config.batch_size, config.signature) if not config.payload
                              else [json.dumps(body)])
    else:
        import base64

        payloads["requests"] = [base64.b64encode(r).decode() for r in grpc_requests(
            rows, config.batch_size, inputs, config.model, config.version, config.label, config.signature)]
    bind, _, port = (config.master_bind or "").rpartition(":")
    spec = StepSpec(kind=kind, address=address, users=config.users, warmup=warmup, duration=duration,
                    max_requests=config.max_requests,
                    workers=config.workers, expect_workers=config.expect_workers,
                    worker_wait_s=WORKER_WAIT_S if config.expect_workers else 120.0,
                    master_bind=bind or None, master_port=int(port) if port else None,
                    web_port=config.web_port if config.web else None, **payloads)
    return spec, rows


def _baseline(config: LoadtestConfig, rows: list[dict] | None, log: Callable[[str], None]) -> dict | None:
    """With --model-path: the same rows through the SavedModel in this process, the latency floor."""
    if not config.model_path:
        return None
    if not rows:
        raise LoadtestError("--model-path needs rows to replay: give --data, or a --payload with 'instances'")
    baseline = measure_baseline(resolve_saved_model(config.model_path, config.version), rows, config.batch_size,
                                config.signature)
    log(f"in-process SavedModel baseline ({baseline['path']}): p50 {baseline['p50_ms']:.3f} ms, "
        f"p99 {baseline['p99_ms']:.3f} ms over {baseline['calls']} calls")
    return baseline


def _run_steps(config: LoadtestConfig, spec: StepSpec, terms, baseline: dict | None,
               log: Callable[[str], None]) -> tuple[list[dict], bool]:
    """Each load level in turn: (the steps measured, whether a stop signal cut them short)."""
    steps, interrupted = [], False
    levels = config.steps()
    for i, value in enumerate(levels):
        last = i == len(levels) - 1
        if config.rate:  # enough users in flight to keep the schedule
            step_spec = replace(spec, last_step=last, rate=value, users=max(config.users, int(value * 0.05) + 4))
        else:
            step_spec = replace(spec, last_step=last, users=int(value))
        log(f"step {i + 1}/{len(levels)}: "
            + (f"{value:g} requests/s (open model)" if config.rate else f"{int(value)} users (closed model)")
            + f", {spec.warmup:g}s warmup + {spec.duration:g}s")
        wait = spec.worker_wait_s if config.expect_workers else 0  # local workers fit in the 120 s
        result, interrupted = _run_step(step_spec, timeout=spec.warmup + spec.duration + 120 + wait,
                                        label=f"step {i + 1}")
        if result is None or not result["requests"]:
            break  # interrupted before a whole second was measured
        step = _summarise(i + 1, step_spec, result)
        _judge(step, terms, baseline)
        steps.append(step)
        log("  " + _line(step) + (" (interrupted: partial)" if interrupted else ""))
        if step["generator_bound"]:
            log(f"  warning: the load generator, not the server, may be the limit here ({step['generator_note']})")
        if interrupted:
            break
    return steps, interrupted


def knee_of(steps: list[dict]) -> dict | None:
    """The step with the most requests/s among those that met the SLO (all, without one); None
    when every step missed it."""
    return max((s for s in steps if s["slo_ok"] is not False), key=lambda s: s["rps"], default=None)


def _judge(step: dict, terms, baseline: dict | None) -> None:
    """Mark a step against the SLO (when there is one) and the in-process baseline (when measured)."""
    step["slo_failures"] = check(terms, step) if terms else []
    step["slo_ok"] = not step["slo_failures"] if terms else None
    step["overhead_p50_ms"] = round(step["p50_ms"] - baseline["p50_ms"], 4) if baseline else None


def _report(config: LoadtestConfig, kind: str, steps: list[dict], interrupted: bool, terms,
            baseline: dict | None, log: Callable[[str], None], replay: dict | None = None) -> StageResult:
    """Write results.json, results.csv and report.html, print the steps (or the replay's comparison
    with its log); the result's code: 0, 1 when the SLO was missed, EXIT_INTERRUPTED."""
    knee = knee_of(steps)
    passed = knee is not None if terms else True
    if replay is not None:
        knee = None  # one step, no sweep
    results = {"command": sys.argv, "config": config.model_dump(mode="json"), "target_kind": kind,
               "interrupted": interrupted, "baseline": baseline,
               "slo": config.slo, "slo_passed": passed if terms else None,
               "knee": {"step": knee["step"], "rps": knee["rps"], "p99_ms": knee["p99_ms"]} if knee else None,
               "steps": steps, **({"replay": replay} if replay is not None else {})}
    _publish(results, steps, config.out)
    for line in table(steps) if replay is None else replay_lines(replay):
        log(line)
    if knee is not None and len(steps) > 1:
        log(f"knee: step {knee['step']}, {knee['rps']:.0f} req/s with p99 {knee['p99_ms']:.2f} ms")
    if terms:
        log(f"SLO {config.slo}: " + ("met" if passed else "MISSED"))
    if baseline:
        log("serving overhead over the in-process SavedModel at p50: "
            + ", ".join(f"step {st['step']} {st['overhead_p50_ms']:+.3f} ms" for st in steps))
    log(f"wrote {os.path.join(config.out, 'results.json')}, results.csv and report.html"
        + (" (partial: interrupted)" if interrupted else ""))
    return result(config.out, EXIT_INTERRUPTED if interrupted else 0 if passed else 1)


def _unreported(config: LoadtestConfig, code: int, why: str) -> StageResult:
    """A run that wrote no results (no manifest)."""
    return StageResult("", why, LoadtestOutputs(config.out, None), code)


def run_replay(config: LoadtestConfig, log: Callable[[str], None]) -> StageResult:
    """`--replay PREFIX`: one open-model step that sends the logged requests at their recorded
    offsets (divided by --speed); results compare its rate and latency with the log's."""
    from tfpipe.loadtest.replay import read_items

    targets = {}
    for t in (config.target, config.grpc_target):
        if t:
            kind, address = parse_target(t)
            if kind in targets:
                raise LoadtestError(f"--target and --grpc-target are both {kind.upper()} addresses")
            targets[kind] = address
    if config.workers > 1 or config.expect_workers:
        raise LoadtestError("--replay runs in one generator process: leave out --workers and --expect-workers")
    terms = parse_slo(config.slo)
    items, recorded = read_items(config.replay, config.model, config.max_requests)
    needs = sorted({item[1] for item in items})
    missing = [p for p in needs if p not in targets]
    if missing:
        raise LoadtestError(f"the log holds {' and '.join(p.upper() for p in missing)} requests: give "
                            + " and ".join("--target http://HOST:PORT" if p == "rest" else
                                           "--grpc-target grpc://HOST:PORT" for p in missing))
    span = recorded["span_s"] / config.speed
    log(f"replaying {len(items):,} logged requests ({', '.join(f'{k} {v:,}' for k, v in recorded['by_api'].items())})"
        f" recorded over {recorded['span_s']:.1f}s, at {config.speed:g}x: {span:.1f}s")
    _check_out(config.out)
    spec = StepSpec(kind="replay", address=targets.get("rest", ""), grpc_address=targets.get("grpc", ""),
                    users=max(config.users, 8), warmup=0.0, duration=math.ceil(span) + 2.0,
                    max_requests=len(items) + 1, replay=items, speed=config.speed)
    result, interrupted = _run_step(spec, timeout=span + 120, label="replay")
    if result is None or not result["requests"]:
        if interrupted:
            log("interrupted before a whole second was measured: nothing to report")
            return _unreported(config, EXIT_INTERRUPTED, "interrupted before a whole second was measured")
        raise LoadtestError("the replay measured no request")
    step = _summarise(1, spec, result)
    sent = result.get("replay", {})
    step["rate"] = None
    step["replay"] = {"sent": sent.get("sent", 0), "send_span_s": sent.get("send_span_s"),
                      "rate": (sent["sent"] - 1) / sent["send_span_s"] if sent.get("send_span_s") else None}
    _judge(step, terms, None)
    want_rate = recorded["rate"] * config.speed if recorded["rate"] else None
    replay = {"prefix": config.replay, "speed": config.speed, "recorded": recorded,
              "replayed": {"requests": step["requests"], "errors": step["errors"], "rate": step["replay"]["rate"],
                           "p50_ms": step["p50_ms"], "p99_ms": step["p99_ms"], "max_ms": step["max_ms"]},
              "count_ratio": step["requests"] / recorded["requests"],
              "rate_ratio": step["replay"]["rate"] / want_rate if want_rate and step["replay"]["rate"] else None}
    return _report(config, "replay", [step], interrupted, terms, None, log, replay=replay)


def replay_lines(replay: dict) -> list[str]:
    rec, rep = replay["recorded"], replay["replayed"]
    lat = rec.get("server_latency") or {}

    def ms(v):
        return "-" if v is None else f"{v:.3f} ms"

    def rate(v):
        return "-" if v is None else f"{v:.1f} req/s"

    return [f"{'':<10} {'requests':>9} {'rate':>13} {'p50':>11} {'p99':>11}",
            f"{'recorded':<10} {rec['requests']:>9,} {rate(rec['rate']):>13} {ms(lat.get('p50_ms')):>11} "
            f"{ms(lat.get('p99_ms')):>11}  (server time, as logged)",
            f"{'replayed':<10} {rep['requests']:>9,} {rate(rep['rate']):>13} {ms(rep['p50_ms']):>11} "
            f"{ms(rep['p99_ms']):>11}  (client time from each request's due time; {rep['errors']} errors)",
            f"count {replay['count_ratio']:.3f}x the log's"
            + (f", rate {replay['rate_ratio']:.3f}x the log's x {replay['speed']:g}" if replay["rate_ratio"] else "")]


def _check_out(out: str) -> None:
    """--out is replaced whole at the end: refuse a directory that is not a load test's."""
    if os.path.isdir(out) and os.listdir(out) and not os.path.exists(os.path.join(out, "results.json")):
        raise LoadtestError(f"{out} exists and is not a tfpipe loadtest output (no results.json); "
                            "choose another --out or remove it")
    if os.path.exists(out) and not os.path.isdir(out):
        raise LoadtestError(f"--out {out} is a file, not a directory")


def _publish(results: dict, steps: list[dict], out: str) -> None:
    """results.json, results.csv and report.html, built beside `out` and put in its place at
    once, as every stage publishes: a reader sees the previous results or these."""
    from tfpipe.loadtest.report import write_report

    with publish(out) as tmp:
        write_report(results, os.path.join(tmp, "report.html"))
        with open(os.path.join(tmp, "results.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
            w.writeheader()
            w.writerows(steps)
        write_json(os.path.join(tmp, "results.json"), results)  # last: its presence marks a whole output


def measure_baseline(path: str, rows: list[dict], batch_size: int, signature: str, seconds: float = 2.0,
                     most: int = 500) -> dict:
    """The same payloads through the SavedModel in this process, one call at a time: model time
    without any serving, so the report can show serving overhead apart."""
    import tensorflow as tf

    inputs = saved_model_inputs(path, signature)
    if inputs is None:
        raise LoadtestError(f"{path} has no signature {signature!r}")
    fn = tf.saved_model.load(path).signatures[signature]
    feeds = [saved_model_feeds(inputs, chunk) for chunk in chunks(rows, batch_size)]
    fn(**feeds[0])  # the first call traces; not part of the baseline
    hist, started = LatencyHistogram(), time.perf_counter()
    while hist.n < most and (time.perf_counter() - started < seconds or hist.n < 20):
        t0 = time.perf_counter()
        fn(**feeds[hist.n % len(feeds)])
        hist.add(time.perf_counter() - t0)
    s = hist.summary()
    return {"path": path, "calls": hist.n, "p50_ms": s["p50_ms"], "p99_ms": s["p99_ms"], "mean_ms": s["mean_ms"]}


def _check_accepted(spec: StepSpec) -> None:
    """One request before any load: a payload the server rejects is a user error."""
    if spec.kind == "rest":
        req = urllib.request.Request(spec.address + spec.path, data=spec.bodies[0].encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        try:
            urllib.request.urlopen(req, timeout=30).read()
        except urllib.error.HTTPError as e:
            raise LoadtestError(f"the server rejects the payload: HTTP {e.code}: {e.read()[:300].decode(errors='replace')}") from None
        except (urllib.error.URLError, OSError) as e:
            raise LoadtestError(f"cannot reach {spec.address}: {getattr(e, 'reason', e)}") from None
        return
    import base64

    import grpc
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    req = predict_pb2.PredictRequest.FromString(base64.b64decode(spec.requests[0]))
    try:
        with grpc.insecure_channel(spec.address) as channel:
            prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(req, timeout=30)
    except grpc.RpcError as e:
        raise LoadtestError(f"the server rejects the payload: {e.code().name}: {e.details()}") from None


def _run_step(spec: StepSpec, timeout: float, label: str) -> tuple[dict | None, bool]:
    """Run one step's generator; (its result, whether Ctrl-C/SIGTERM cut it short). An interrupted
    generator still writes what it measured in whole seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, result_path = os.path.join(tmp, "spec.json"), os.path.join(tmp, "result.json")
        write_json(spec_path, spec.to_json())
        proc = subprocess.Popen(module_argv("tfpipe.loadtest.generate", "step", spec_path, result_path),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_generator_env(),
                                stdin=subprocess.DEVNULL, start_new_session=True)
        bar = ProgressBar(label, spec.warmup + spec.duration)
        errors: list[str] = []
        progress: queue.Queue[str] = queue.Queue()
        readers = [threading.Thread(target=lambda: errors.extend(proc.stderr), daemon=True),
                   threading.Thread(target=lambda: [progress.put(line) for line in proc.stdout], daemon=True)]
        for t in readers:
            t.start()
        interrupted, deadline = False, time.monotonic() + timeout
        try:
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    proc.kill()
                    raise LoadtestError(f"the load generator did not finish within {timeout:.0f}s")
                try:
                    bar.update(progress.get(timeout=0.2))
                except queue.Empty:
                    pass
        except KeyboardInterrupt:
            # The generator is in its own session (a terminal's Ctrl-C reaches only us): tell it to
            # stop and write its measured seconds, then report them.
            interrupted = True
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        finally:
            bar.close()
        proc.wait()
        for t in readers:
            t.join(timeout=5)  # the generator's last words, for the error message
        if interrupted and not os.path.exists(result_path):
            return None, True
        if proc.returncode != 0 or not os.path.exists(result_path):
            tail = "".join(errors).strip().splitlines()[-3:]
            raise LoadtestError(f"the load generator failed: {' | '.join(tail)}")
        with open(result_path) as f:
            return json.load(f), interrupted


def _generator_env() -> dict[str, str]:
    """The environment of tfpipe.loadtest.generate processes: TensorFlow quiet."""
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}


def run_workers(master: str, processes: int, log: Callable[[str], None]) -> int:
    """`tfpipe loadtest --worker`: locust worker processes for a master on another machine,
    step after step, until the master ends the run (0) or cannot be reached (2)."""
    log(f"{processes} locust worker process(es) for the master at {master}; Ctrl-C stops them")
    procs = [subprocess.Popen(module_argv("tfpipe.loadtest.generate", "worker", master), env=_generator_env(),
                              stdin=subprocess.DEVNULL, start_new_session=True) for _ in range(processes)]
    try:
        codes = [p.wait() for p in procs]
    except KeyboardInterrupt:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()
        return EXIT_INTERRUPTED
    if any(codes):
        raise LoadtestError(f"{sum(1 for c in codes if c)} of {processes} worker(s) lost or never reached the "
                            f"master at {master} (see the lines above)")
    log("the master ended the run")
    return 0


class ProgressBar:
    """One line on a terminal, redrawn as the generator reports its Progress; silent when output
    is not a terminal (logs stay clean). A Waiting message is always shown."""

    def __init__(self, label: str, total: float):
        self.label, self.total, self.tty = label, max(total, 1e-9), sys.stdout.isatty()

    def update(self, line: str) -> None:
        message = decode(line)
        if isinstance(message, Waiting):  # a master waiting for other machines' workers
            self.close()
            print(f"  {self.label}: {message.ready} of {message.expected} workers ready at {message.address}",
                  flush=True)
            return
        if not self.tty or not isinstance(message, Progress):
            return
        filled = int(30 * min(1.0, message.elapsed_s / self.total))
        sys.stdout.write(f"\r  {self.label} [{'#' * filled}{'.' * (30 - filled)}] {message.elapsed_s:4.0f}/"
                         f"{self.total:.0f}s {message.answered:,} answered")
        sys.stdout.flush()

    def close(self) -> None:
        if self.tty:
            sys.stdout.write("\r\033[K")
            sys.stdout.flush()


def _summarise(index: int, spec: StepSpec, result: dict) -> dict:
    hist = LatencyHistogram.from_json(result["histogram"])
    errors = sum(result["errors"].values())
    requests = result["requests"]
    step = {"step": index, "users": spec.users, "rate": spec.rate, "requests": requests,
            "errors": errors, "errors_by_type": result["errors"],
            "error_fraction": errors / requests if requests else 1.0,
            "rps": hist.n / result["elapsed_s"], "elapsed_s": result["elapsed_s"],
            "generator_cpu": round(result["generator_cpu"], 3), "workers": result.get("workers", 1),
            "per_worker": result.get("per_worker"), **hist.summary(),
            "histogram": result["histogram"], "series": result.get("series", [])}
    notes = []
    per_process = result["generator_cpu"] / max(1, result.get("workers", 1))
    if per_process > 0.9:
        notes.append(f"each generator process used {per_process:.0%} of a core")
    if spec.rate and requests / result["elapsed_s"] < 0.95 * spec.rate:
        notes.append(f"it sent {requests / result['elapsed_s']:.0f} of {spec.rate:g} requests/s")
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


def result(out: str, code: int = 0) -> StageResult:
    """A load test's results for `tfpipe run`: its steps, the fastest one's p99 and the SLO verdict."""
    path = os.path.join(out, "results.json")
    with open(path) as f:
        r = json.load(f)
    best = max(r["steps"], key=lambda st: st["rps"])
    summary = (f"{len(r['steps'])} step(s) over {r['target_kind'].upper()}, up to {best['rps']:,.0f} req/s, "
               f"p99 {best['p99_ms']:.2f} ms at that load, {sum(st['errors'] for st in r['steps'])} errors")
    if r["slo_passed"] is not None:
        summary += f"; SLO {r['slo']} " + ("met" if r["slo_passed"] else "MISSED")
    return StageResult(path, summary, LoadtestOutputs(out, r["slo_passed"]), code)
