"""Prometheus text pages of a server's worker processes merged into the one page a scrape gets:
counters, histograms, queue depths and memory summed, every other sample's largest shown, and a
page's counters kept once its worker has exited (serve/workers.py says why)."""

from __future__ import annotations

import re


# Samples a scrape sums over the workers; every other sample (a model's versions, a version's
# load size) is the same in every worker once they have all moved, and the largest is shown.
SUMMED = ("tfpipe_serving_requests_total", "tfpipe_serving_request_latency_seconds", "tfpipe_serving_batch_size",
          "tfpipe_serving_batch_padding_rows_total", "tfpipe_serving_batch_queue_depth",
          "tfpipe_serving_batch_queues", "tfpipe_serving_request_log_records_total",
          "tfpipe_serving_request_log_queue_depth", "tfpipe_serving_live_servables", "process_resident_memory_bytes",
          "tfpipe_serving_shadow_requests_total", "tfpipe_serving_shadow_errors_total",
          "tfpipe_serving_shadow_class_rows_total", "tfpipe_serving_shadow_flipped_rows_total",
          "tfpipe_serving_shadow_latency_seconds", "tfpipe_serving_canary_requests_total")


SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$")


def merge_prometheus(texts: list[str]) -> str:
    """Prometheus text pages of the workers as one: samples with the same name and labels summed
    for SUMMED metrics (and their _bucket/_sum/_count), the largest otherwise; comments and the
    order of the first page kept."""
    order: list[str] = []
    values: dict[str, float] = {}
    comments: dict[str, list[str]] = {}
    for text in texts:
        for pending, line, m in _samples(text):
            key = line.rsplit(" ", 1)[0]
            value = float(m[3])
            if key not in values:
                order.append(key)
                comments[key] = pending
                values[key] = value
            elif _family(m[1]) in SUMMED:  # a histogram's series sum as it does
                values[key] += value
            else:
                values[key] = max(values[key], value)
    out = []
    for key in order:
        out += [c for c in comments[key] if c]
        v = values[key]
        out.append(f"{key} {int(v) if v.is_integer() else repr(v)}")
    return "\n".join(out) + "\n"


def counters_of(page: str) -> str:
    """The samples of a Prometheus page's counters and histograms (by its # TYPE lines), with their
    comments."""
    kept = {m[1] for m in re.finditer(r"^# TYPE (\S+) (?:counter|histogram)$", page, re.M)}
    out: list[str] = []
    for pending, line, m in _samples(page):
        if m[1] in kept or _family(m[1]) in kept:
            out += pending + [line]
    return "\n".join(out) + "\n" if out else ""


def _samples(page: str):
    """Each sample of a Prometheus text page: (the comment lines before it, its line, SAMPLE's match)."""
    pending: list[str] = []
    for line in page.splitlines():
        if not line or line.startswith("#"):
            pending.append(line)
            continue
        m = SAMPLE.match(line)
        if m is not None:
            yield pending, line, m
            pending = []


def _family(name: str) -> str:
    """The metric a sample belongs to: a histogram's _bucket, _sum and _count series are its own."""
    return re.sub(r"_(bucket|sum|count)$", "", name)


def rss_of(page: str) -> int:
    m = re.search(r"^process_resident_memory_bytes (\d+)$", page, re.M)
    return int(m[1]) if m else 0
