"""Prometheus metrics in the text exposition format (no client library needed)."""

from __future__ import annotations

import bisect
import os
import threading
from collections import defaultdict

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class _Histogram:
    def __init__(self, buckets):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0
        self.n = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.n += 1


def _labels(pairs) -> str:
    return "{" + ",".join(f'{k}="{str(v)}"' for k, v in pairs) + "}" if pairs else ""


class Metrics:
    """Request counts by model, API and status; latency and batch-size histograms; queue depth;
    loaded versions (filled in at scrape time by the server)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.requests: dict[tuple, int] = defaultdict(int)
        self.latency: dict[tuple, _Histogram] = {}
        self.batch_sizes = _Histogram(BATCH_BUCKETS)
        self.padded_rows = 0
        self.request_logs: dict[tuple, int] = defaultdict(int)
        self.request_log_depth = lambda: 0  # set by the server's RequestLogs
        # whether a name is one of the server's models (set by the server): a request naming any
        # other counts under model="", so that clients' names (any number, any length) are not kept
        self.known_model = lambda name: True
        self.grpc_in_flight = 0  # gRPC calls in a handler now (on the event loop: no lock), for the drain
        # shadow traffic (--shadow), by (model, api, signature): requests by outcome (mirrored, skipped),
        # the candidate's errors by status, its rows with a class output and those flipped, its latency
        self.shadow_requests: dict[tuple, int] = defaultdict(int)
        self.shadow_errors: dict[tuple, int] = defaultdict(int)
        self.shadow_rows: dict[tuple, list[int]] = {}
        self.shadow_latency: dict[tuple, _Histogram] = {}
        # canary (--canary), by (model, candidate version, outcome): requests the candidate answered
        # ("candidate"), or failed and the served version answered ("fallback")
        self.canary_requests: dict[tuple, int] = defaultdict(int)

    def request(self, model: str, api: str, status: str, seconds: float) -> None:
        if not self.known_model(model):
            model = ""
        with self._lock:
            self.requests[(model, api, status)] += 1
            key = (model, api)
            if key not in self.latency:
                self.latency[key] = _Histogram(LATENCY_BUCKETS_S)
            self.latency[key].observe(seconds)

    def request_log(self, model: str, status: str) -> None:
        """A sampled request's log record: written, dropped (queue full) or failed (write error)."""
        with self._lock:
            self.request_logs[(model, status)] += 1

    def shadow_skipped(self, model: str, api: str, signature: str) -> None:
        """A request drawn for shadow traffic and not mirrored: the candidate's calls in flight were at their bound."""
        with self._lock:
            self.shadow_requests[(model, api, signature, "skipped")] += 1

    def shadow_mirrored(self, model: str, api: str, signature: str, seconds: float, error: str | None,
                        class_rows: int, flipped: int, requests: int = 1) -> None:
        """Mirrored requests (`requests` of them, answered by one call) the candidate answered in
        `seconds`: the error status (None: it answered and its outputs compared), and their rows
        with a class output, and of them those that flipped."""
        key = (model, api, signature)
        with self._lock:
            self.shadow_requests[(*key, "mirrored")] += requests
            if error is not None:
                self.shadow_errors[(*key, error)] += requests
            rows = self.shadow_rows.setdefault(key, [0, 0])
            rows[0] += class_rows
            rows[1] += flipped
            if key not in self.shadow_latency:
                self.shadow_latency[key] = _Histogram(LATENCY_BUCKETS_S)
            for _ in range(requests):
                self.shadow_latency[key].observe(seconds)

    def canary(self, model: str, version: int, outcome: str) -> None:
        """A canary request: answered by the candidate `version` ("candidate"), or by the served version
        after the candidate failed it ("fallback")."""
        with self._lock:
            self.canary_requests[(model, version, outcome)] += 1

    def batch(self, rows: int, padded: int) -> None:
        with self._lock:
            self.batch_sizes.observe(rows)
            self.padded_rows += padded - rows

    def render(self, loaded: dict[str, list[int]], queue_depth: int, queues: int = 0,
               load_bytes: dict[tuple[str, int], int] | None = None, live_servables: int = 0,
               shadowed: dict[str, int | None] | None = None) -> str:
        """The Prometheus page; `live_servables`: versions not yet freed (unloaded ones that requests
        or batch queues still hold count too); `shadowed`: with --shadow, each model with a
        candidates/ folder and the candidate it mirrors to now."""
        out = []
        with self._lock:
            out += ["# HELP tfpipe_serving_requests_total Requests by model, API and final status.",
                    "# TYPE tfpipe_serving_requests_total counter"]
            for (model, api, status), n in sorted(self.requests.items()):
                out.append(f"tfpipe_serving_requests_total{_labels([('model', model), ('api', api), ('status', status)])} {n}")
            out += ["# HELP tfpipe_serving_request_latency_seconds Time from request received to response ready.",
                    "# TYPE tfpipe_serving_request_latency_seconds histogram"]
            for (model, api), h in sorted(self.latency.items()):
                out += _histogram("tfpipe_serving_request_latency_seconds", [("model", model), ("api", api)], h)
            out += ["# HELP tfpipe_serving_batch_size Rows per executed batch (before padding).",
                    "# TYPE tfpipe_serving_batch_size histogram"]
            out += _histogram("tfpipe_serving_batch_size", [], self.batch_sizes)
            out += ["# HELP tfpipe_serving_batch_padding_rows_total Rows added to reach an allowed batch size.",
                    "# TYPE tfpipe_serving_batch_padding_rows_total counter",
                    f"tfpipe_serving_batch_padding_rows_total {self.padded_rows}",
                    "# HELP tfpipe_serving_batch_queue_depth Rows waiting in batch queues.",
                    "# TYPE tfpipe_serving_batch_queue_depth gauge",
                    f"tfpipe_serving_batch_queue_depth {queue_depth}",
                    "# HELP tfpipe_serving_batch_queues Batch queues (one per version, signature and input shapes).",
                    "# TYPE tfpipe_serving_batch_queues gauge",
                    f"tfpipe_serving_batch_queues {queues}"]
            if self.request_logs:
                out += ["# HELP tfpipe_serving_request_log_records_total Sampled requests' log records by model and "
                        "outcome: written, dropped (the log queue was full) or failed (a write error).",
                        "# TYPE tfpipe_serving_request_log_records_total counter"]
                for (model, status), n in sorted(self.request_logs.items()):
                    out.append(f"tfpipe_serving_request_log_records_total"
                               f"{_labels([('model', model), ('status', status)])} {n}")
            if shadowed is not None:
                out += self._shadow_lines(shadowed)
            if self.canary_requests:
                out += ["# HELP tfpipe_serving_canary_requests_total Requests routed to a model's candidate by "
                        "--canary, by candidate version and outcome: answered by the candidate, or by the served "
                        "version after the candidate failed (a fallback rolls the candidate back).",
                        "# TYPE tfpipe_serving_canary_requests_total counter"]
                for (model, version, outcome), n in sorted(self.canary_requests.items()):
                    out.append(f"tfpipe_serving_canary_requests_total"
                               f"{_labels([('model', model), ('version', version), ('outcome', outcome)])} {n}")
        out += ["# HELP tfpipe_serving_request_log_queue_depth Log records waiting for the writer threads.",
                "# TYPE tfpipe_serving_request_log_queue_depth gauge",
                f"tfpipe_serving_request_log_queue_depth {self.request_log_depth()}"]
        out += ["# HELP tfpipe_serving_live_servables Loaded model versions still in memory (serving, or "
                "unloaded but held by in-flight requests).",
                "# TYPE tfpipe_serving_live_servables gauge",
                f"tfpipe_serving_live_servables {live_servables}",
                "# HELP process_resident_memory_bytes Resident memory size in bytes.",
                "# TYPE process_resident_memory_bytes gauge",
                f"process_resident_memory_bytes {rss_bytes()}",
                "# HELP tfpipe_serving_model_load_rss_bytes How much the process grew while a loaded version "
                "loaded and warmed up (its memory footprint, give or take concurrent requests).",
                "# TYPE tfpipe_serving_model_load_rss_bytes gauge"]
        for (model, version), n in sorted((load_bytes or {}).items()):
            out.append(f"tfpipe_serving_model_load_rss_bytes{_labels([('model', model), ('version', version)])} {n}")
        out += ["# HELP tfpipe_serving_loaded_versions Versions loaded and AVAILABLE per model.",
                "# TYPE tfpipe_serving_loaded_versions gauge"]
        for model, versions in sorted(loaded.items()):
            out.append(f"tfpipe_serving_loaded_versions{_labels([('model', model)])} {len(versions)}")
            for v in versions:
                out.append(f"tfpipe_serving_version_available{_labels([('model', model), ('version', v)])} 1")
        return "\n".join(out) + "\n"


    def _shadow_lines(self, shadowed: dict[str, int | None]) -> list[str]:
        """Shadow traffic's series (called holding the lock)."""
        out = ["# HELP tfpipe_serving_shadow_requests_total Requests drawn for shadow traffic by model, API, signature "
               "and outcome: mirrored to the candidate, or skipped (its calls in flight were at their bound).",
               "# TYPE tfpipe_serving_shadow_requests_total counter"]
        for (model, api, sig, outcome), n in sorted(self.shadow_requests.items()):
            labels = _labels([("model", model), ("api", api), ("signature", sig), ("outcome", outcome)])
            out.append(f"tfpipe_serving_shadow_requests_total{labels} {n}")
        out += ["# HELP tfpipe_serving_shadow_errors_total Mirrored requests the candidate failed, by status (its "
                "own, or MISSING_OUTPUT, SHAPE_MISMATCH, DTYPE_MISMATCH against the served answer).",
                "# TYPE tfpipe_serving_shadow_errors_total counter"]
        for (model, api, sig, status), n in sorted(self.shadow_errors.items()):
            labels = _labels([("model", model), ("api", api), ("signature", sig), ("status", status)])
            out.append(f"tfpipe_serving_shadow_errors_total{labels} {n}")
        rows = sorted(self.shadow_rows.items())
        out += ["# HELP tfpipe_serving_shadow_class_rows_total Rows of mirrored requests with a class output "
                "(string or int) compared.", "# TYPE tfpipe_serving_shadow_class_rows_total counter"]
        out += [f"tfpipe_serving_shadow_class_rows_total{_shadow_labels(k)} {n}" for k, (n, _) in rows]
        out += ["# HELP tfpipe_serving_shadow_flipped_rows_total Of those rows, the ones whose class the candidate "
                "answers differently.", "# TYPE tfpipe_serving_shadow_flipped_rows_total counter"]
        out += [f"tfpipe_serving_shadow_flipped_rows_total{_shadow_labels(k)} {n}" for k, (_, n) in rows]
        out += ["# HELP tfpipe_serving_shadow_latency_seconds The candidate's model call for a mirrored request.",
                "# TYPE tfpipe_serving_shadow_latency_seconds histogram"]
        for key, h in sorted(self.shadow_latency.items()):
            out += _histogram("tfpipe_serving_shadow_latency_seconds", _shadow_pairs(key), h)
        out += ["# HELP tfpipe_serving_shadow_candidate_version The candidate each model's shadow traffic goes to "
                "(none: the model has a candidates/ folder and no candidate newer than its served versions loaded).",
                "# TYPE tfpipe_serving_shadow_candidate_version gauge"]
        out += [f"tfpipe_serving_shadow_candidate_version{_labels([('model', m)])} {v}"
                for m, v in sorted(shadowed.items()) if v is not None]
        return out


def _shadow_pairs(key: tuple) -> list[tuple[str, str]]:
    return [("model", key[0]), ("api", key[1]), ("signature", key[2])]


def _shadow_labels(key: tuple) -> str:
    return _labels(_shadow_pairs(key))


def rss_bytes() -> int:
    """This process's resident memory."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import psutil

        return psutil.Process().memory_info().rss


def _histogram(name: str, labels: list, h: _Histogram) -> list[str]:
    lines, cumulative = [], 0
    for bound, count in zip([*h.buckets, "+Inf"], h.counts, strict=True):
        cumulative += count
        lines.append(f"{name}_bucket{_labels(labels + [('le', bound)])} {cumulative}")
    lines.append(f"{name}_sum{_labels(labels)} {h.total:.6f}")
    lines.append(f"{name}_count{_labels(labels)} {h.n}")
    return lines
