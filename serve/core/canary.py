"""Canary (--canary=SHARE): a share of the requests that name no version or label is answered by the
model's candidate, which is promoted once it has answered enough of them within bounds and rolled
back at once when it does not stay within them.

Which candidate: the one shadow traffic mirrors to (`ModelManager.candidate`: the newest in
BASE/NAME/candidates/, newer than the served range), unless a canary rolled it back before (the
history's CANARY_ROLLED_BACK events: no server canaries or shadows it again).

Which requests: Predict, Classify and Regress that name no version and no label. With the
`--canary_key` header (REST) or metadata key (gRPC), a client's value is hashed: the same client
always lands on the same side (sticky) while the candidate is on trial; without it, each request
is drawn with probability SHARE.

What the clients get: the candidate's answer (its version in the response), unless the candidate
fails the request or answers NaN or infinity where the served version does not; then the served
version answers the same request, and the candidate is rolled back. A request both versions fail
(a client's error) is answered with the served version's error and does not count against the
candidate.

The bounds, judged on what this server process saw (with --workers N each worker judges its own
share; the first decision moves the directories and the others follow at their next poll):
  * errors: one request failed by the candidate alone rolls it back, at once;
  * agreement: the served version answers every canary request too, on the canary's own thread after
    the client is answered (at most AGREEMENT_IN_FLIGHT at once; more are not compared), and the
    answers are compared as shadow traffic compares them: the share of rows whose class flips, or
    for a model without class outputs the median relative difference, must stay within
    --canary_max_disagreement; a flip share beyond it with 99% confidence rolls back before the end;
  * latency: the candidate's model-call p99 over the served version's model calls of the same time
    (the requests it answered and its comparison calls), within --canary_max_p99_rise.
Promotion once the candidate has answered --canary_requests (and --canary_min_seconds have
passed) within them: `tfpipe promote`'s move (versions.promote), which every server polling the
base path follows. Both decisions, and why, go to the model's history (`tfpipe history`).
"""

from __future__ import annotations

import dataclasses
import math
import random
import threading
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from tfpipe import versions
from tfpipe.serve.core.manager import ModelManager
from tfpipe.serve.core.servable import Servable
from tfpipe.serve.core.shadow import Mismatch, compare
from tfpipe.serve.errors import ServeError
from tfpipe.serve.metrics import Metrics
from tfpipe.serve.shadow_report import Agreement, latency_histogram

AGREEMENT_IN_FLIGHT = 2  # the served version's comparison calls waiting or running at once
EARLY_Z = 2.576  # a flip share beyond the bound by this many standard errors (99%) rolls back before the end


@dataclasses.dataclass(frozen=True)
class CanaryOptions:
    share: float = 0.0
    key: str = "x-canary-key"
    requests: int = 1000
    min_seconds: float = 0.0
    max_p99_rise: float = 0.5
    max_disagreement: float = 0.1

    @classmethod
    def of(cls, opts) -> CanaryOptions:
        """From ServeOptions (the --canary* flags), checked."""
        o = cls(opts.canary, opts.canary_key.strip().lower(), opts.canary_requests, opts.canary_min_seconds,
                opts.canary_max_p99_rise, opts.canary_max_disagreement)
        if not 0.0 <= o.share <= 1.0:
            raise ServeError(f"--canary={o.share:g}: the share of requests answered by a candidate must be within "
                             "0 and 1 (0: off)")
        if o.requests < 1:
            raise ServeError(f"--canary_requests={o.requests}: a candidate is promoted after at least 1 request")
        for flag, value in (("canary_min_seconds", o.min_seconds), ("canary_max_p99_rise", o.max_p99_rise),
                            ("canary_max_disagreement", o.max_disagreement)):
            if not value >= 0:
                raise ServeError(f"--{flag}={value:g}: must be 0 or more")
        return o


def non_finite(outputs: dict[str, np.ndarray]) -> str | None:
    """Why an answer is not one to give a client: the first float output holding NaN or infinity."""
    for name, v in outputs.items():
        if v.dtype.kind == "f" and not np.isfinite(v).all():
            return f"output {name!r} holds NaN or infinity"
    return None


def disagreement(a: Agreement) -> tuple[float, str] | None:
    """The figure the bound applies to, and how to say it: the flipped share of the rows with a class
    output, else the median relative difference of the float ones; None with no row compared."""
    if a.class_rows:
        share = a.flipped / a.class_rows
        return share, f"class flipped in {a.flipped} of {a.class_rows} rows ({share:.1%})"
    if a.float_rows:
        median = a.rel_diff.quantile(0.5) or 0.0
        return median, f"median relative difference {median:.3g} over {a.float_rows} rows"
    return None


class _Trial:
    """One candidate's canary in this process."""

    def __init__(self, version: int):
        self.version = version
        self.started = time.monotonic()
        self.answered = 0
        self.failure: str | None = None
        self.decided = False
        self.candidate_latency = latency_histogram()
        self.served_latency = latency_histogram()
        self.agreement = Agreement()

    def summary(self) -> dict[str, Any]:
        c99, s99 = self.candidate_latency.quantile(0.99), self.served_latency.quantile(0.99)
        d = disagreement(self.agreement)
        return {"requests": self.answered, "seconds": round(time.monotonic() - self.started, 1),
                "candidate_p99_ms": None if c99 is None else round(c99 * 1e3, 3),
                "served_p99_ms": None if s99 is None else round(s99 * 1e3, 3),
                "rows_compared": self.agreement.rows, "disagreement": None if d is None else round(d[0], 6)}


class Canary:
    """Routes canary requests (`pick`), takes what happened to them (`answered`, `failed`,
    `served`), and decides at every base-path poll (`polled`). `draw()` is the random draw."""

    def __init__(self, manager: ModelManager, options: CanaryOptions, metrics: Metrics,
                 log: Callable[[str], None] = print, draw: Callable[[], float] = random.random):
        self.manager, self.options, self.metrics, self.log, self.draw = manager, options, metrics, log, draw
        self._trials: dict[str, _Trial] = {}
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="tfpipe-canary")
        self._in_flight = 0
        self._said_none = False

    # ---- on the request's path: cheap, never blocking -------------------------------------

    def goes(self, client: str | None) -> bool:
        """Whether this request is a canary one: the client's hashed key, else a draw."""
        if client:
            return zlib.crc32(client.encode("utf-8", "surrogatepass")) / 2 ** 32 < self.options.share
        return self.draw() < self.options.share

    def pick(self, served: Servable, client: str | None) -> Servable | None:
        """The candidate that answers this request, or None: the served version answers it."""
        if not self.goes(client):
            return None
        candidate = self.manager.candidate(served.name)
        if candidate is None:
            return None
        with self._lock:
            trial = self._trials.get(served.name)
            if trial is None or trial.version != candidate.version:
                trial = self._trials[served.name] = _Trial(candidate.version)
                self.log(f"canary: {served.name} candidate {candidate.version} takes {self.options.share:g} of the "
                         f"requests that name no version (served: version {served.version})")
            return None if trial.decided or trial.failure else candidate

    def served(self, served: Servable, seconds: float) -> None:
        """The served version answered a request that named no version: its model call's time."""
        trial = self._trials.get(served.name)
        if trial is not None and not trial.decided:
            with self._lock:
                trial.served_latency.add(seconds)

    def answered(self, served: Servable, candidate: Servable, outputs: dict[str, np.ndarray], seconds: float,
                 served_call: Callable[[], dict[str, np.ndarray]]) -> str | None:
        """The candidate answered a canary request: None when its answer stands (the served version
        then answers it too off the path, `served_call`, for the agreement), else why it does not."""
        bad = non_finite(outputs)
        if bad is not None:
            return bad
        trial = self._trials.get(served.name)
        if trial is None or trial.version != candidate.version:
            return None
        with self._lock:
            trial.answered += 1
            trial.candidate_latency.add(seconds)
            go = self._in_flight < AGREEMENT_IN_FLIGHT
            if go:
                self._in_flight += 1
        self.metrics.canary(served.name, candidate.version, "candidate")
        if go:
            try:
                self._executor.submit(self._compare, trial, served_call, outputs)
            except RuntimeError:  # shut down meanwhile
                self._done()
        return None

    def failed(self, served: Servable, candidate: Servable, reason: str,
               served_outputs: dict[str, np.ndarray] | None = None) -> None:
        """The candidate failed a canary request that the served version then answered
        (`served_outputs`): it is rolled back, unless its failure was a non-finite answer and the
        served version's is one too (the request's own doing)."""
        if served_outputs is not None and non_finite(served_outputs) is not None:
            return
        self.metrics.canary(served.name, candidate.version, "fallback")
        trial = self._trials.get(served.name)
        if trial is not None and trial.version == candidate.version:
            with self._lock:
                trial.failure = trial.failure or f"it failed a request the served version answered: {reason}"

    # ---- on the canary's thread ----------------------------------------------------------

    def _compare(self, trial: _Trial, served_call, outputs: dict[str, np.ndarray]) -> None:
        try:
            t0 = time.perf_counter()
            try:
                served = served_call()
            except Exception:  # noqa: BLE001 (the served version's own failure says nothing of the candidate)
                return
            seconds = time.perf_counter() - t0
            try:
                flips, rel = compare(served, outputs)
            except Mismatch as e:
                with self._lock:
                    trial.failure = trial.failure or f"its answer cannot stand for the served version's: {e.reason}"
                return
            rows = len(flips) if flips is not None else len(rel) if rel is not None else 0
            with self._lock:
                trial.served_latency.add(seconds)
                trial.agreement.add(rows, None if flips is None else int(np.count_nonzero(flips)), rel)
                a = trial.agreement
                if a.class_rows and trial.failure is None:
                    share = a.flipped / a.class_rows
                    low = share - EARLY_Z * math.sqrt(max(share * (1 - share), 1e-12) / a.class_rows)
                    if low > self.options.max_disagreement:
                        trial.failure = (f"class flipped in {a.flipped} of {a.class_rows} rows ({share:.1%}), beyond "
                                         f"--canary_max_disagreement={self.options.max_disagreement:g} "
                                         "with 99% confidence")
        except Exception as e:  # noqa: BLE001 (a bug here must not kill the canary's thread)
            self.log(f"canary: comparing an answer failed: {type(e).__name__}: {e}")
        finally:
            self._done()

    def _done(self) -> None:
        with self._lock:
            self._in_flight -= 1

    # ---- at each poll (the manager's poller thread), and at stop --------------------------------

    def polled(self) -> None:
        """Roll back the trials that failed; promote or roll back those that are done."""
        shadowed = self.manager.shadowed()
        if not shadowed and not self._said_none:
            self.log(f"--canary={self.options.share:g}: no model's base path has a candidates/ folder "
                     "(BASE/NAME/candidates/N): every request goes to the served version (looked for again at "
                     "each base-path poll)")
        self._said_none = not shadowed
        with self._lock:
            trials = [(name, t) for name, t in self._trials.items() if not t.decided]
        for name, trial in trials:
            base = self.manager.base_path(name)
            if base is None or shadowed.get(name) != trial.version:  # moved on: promoted elsewhere, a newer one
                with self._lock:
                    self._trials.pop(name, None)
                continue
            if trial.failure is not None:
                self._roll_back(name, base, trial, trial.failure)
            elif trial.answered >= self.options.requests and \
                    time.monotonic() - trial.started >= self.options.min_seconds:
                why = self.verdict(trial)
                if why is None:
                    self._promote(name, base, trial)
                else:
                    self._roll_back(name, base, trial, why)

    def verdict(self, trial: _Trial) -> str | None:
        """Why a trial that has answered its requests is not promoted; None: it is."""
        o = self.options
        with self._lock:
            c99, s99 = trial.candidate_latency.quantile(0.99), trial.served_latency.quantile(0.99)
            d = disagreement(trial.agreement)
        if c99 is not None and s99 is not None and c99 > s99 * (1 + o.max_p99_rise):
            return (f"its model-call p99 {c99 * 1e3:.3g} ms is over the served version's {s99 * 1e3:.3g} ms by more "
                    f"than --canary_max_p99_rise={o.max_p99_rise:g}")
        if d is None:
            return "none of its answers could be compared with the served version's"
        if d[0] > o.max_disagreement:
            return f"{d[1]}, beyond --canary_max_disagreement={o.max_disagreement:g}"
        return None

    def _roll_back(self, name: str, base: str, trial: _Trial, why: str) -> None:
        trial.decided = True
        self.manager.reject(name, trial.version)
        reason = f"canary: {why}"
        try:
            with versions.locked(base):
                if trial.version not in versions.canary_rolled_back(base):  # another worker's may be there
                    versions.record(base, versions.CANARY_ROLLED_BACK, trial.version, reason, canary=trial.summary())
        except OSError as e:
            self.log(f"canary: cannot record the rollback in {base}: {e}")
        self.log(f"canary: {name} candidate {trial.version} ROLLED BACK after {trial.answered} request(s): {why}; "
                 f"it stays in {versions.candidate_path(base, trial.version)}")

    def _promote(self, name: str, base: str, trial: _Trial) -> None:
        trial.decided = True
        s = trial.summary()
        d = disagreement(trial.agreement)
        reason = (f"canary: {trial.answered} request(s) in {s['seconds']:g} s, none failed; model-call p99 "
                  f"{s['candidate_p99_ms']} ms vs {s['served_p99_ms']} ms served; {d[1] if d else 'not compared'}")
        try:
            versions.promote(base, trial.version, reason, canary=s)
        except (versions.VersionError, OSError) as e:  # another worker's promotion, or a read-only base path
            self.log(f"canary: {name} candidate {trial.version} passed, but was not promoted: {e}")
            return
        self.log(f"canary: {name} candidate {trial.version} PROMOTED: {reason}")

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
