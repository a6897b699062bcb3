"""Hot reloads as a user makes them, for the reload test and benchmarks/bench_reload.py: publish
a new version directory by rename, wait until the server has swapped to it, read its metrics."""

from __future__ import annotations

import os
import re
import shutil
import time

import requests


def metric(text: str, name: str) -> list[float]:
    """Every value of a Prometheus metric (all label sets) in an exposition text."""
    return [float(m) for m in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)]


def publish_and_wait(source: str, base: str, version: int, url: str, model: str, timeout: float = 60) -> None:
    """Copy `source` to BASE/VERSION through a staging rename (no server sees it half-written) and
    wait until that version is AVAILABLE and every other one has ended; AssertionError if not."""
    staging = os.path.join(os.path.dirname(base), "staging")
    shutil.copytree(source, staging)
    os.rename(staging, os.path.join(base, str(version)))
    wait_version(url, model, version, timeout)


def wait_version(url: str, model: str, version: int, timeout: float = 60) -> None:
    """Until the server at `url` (REST) serves `version` of `model` AVAILABLE and every other version
    has ended; AssertionError after `timeout` seconds."""
    deadline, states = time.time() + timeout, {}
    while time.time() < deadline:
        status = requests.get(f"{url}/v1/models/{model}", timeout=30).json()["model_version_status"]
        states = {int(s["version"]): s["state"] for s in status}
        if states.get(version) == "AVAILABLE" and all(s == "END" for v, s in states.items() if v != version):
            return
        time.sleep(0.1)
    raise AssertionError(f"version {version} did not take over: {states}")


def metrics_readings(url: str, n: int = 3) -> list[str]:
    """`n` readings of the Prometheus page, 0.1 s apart: RSS moves with the requests in flight,
    so callers take the least of them."""
    texts = []
    for _ in range(n):
        time.sleep(0.1)
        texts.append(requests.get(f"{url}/monitoring/prometheus/metrics", timeout=30).text)
    return texts
