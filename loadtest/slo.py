"""Service level objectives: "p99<20ms,errors<0.1%,rps>100"."""

from __future__ import annotations

import operator
import re

from tfpipe.loadtest.errors import LoadtestError

_METRICS = {"p50", "p90", "p95", "p99", "p99.9", "max", "mean", "errors", "rps"}
_OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}
_TERM = re.compile(r"^\s*(p50|p90|p95|p99\.9|p99|max|mean|errors|rps)\s*(<=|>=|<|>)\s*"
                   r"(\d+(?:\.\d+)?)\s*(us|ms|s|%)?\s*$")


def parse_slo(text: str) -> list[tuple[str, str, float]]:
    """[(metric, op, value)], latencies in ms, errors as a fraction."""
    terms = []
    for part in [p for p in text.split(",") if p.strip()]:
        m = _TERM.match(part)
        if not m:
            raise LoadtestError(f"cannot parse SLO term {part.strip()!r}: use e.g. p99<20ms, errors<0.1%, rps>100 "
                                f"(metrics: {', '.join(sorted(_METRICS))})")
        metric, op, value, unit = m[1], m[2], float(m[3]), m[4]
        if metric == "errors":
            if unit not in ("%", None):
                raise LoadtestError(f"SLO term {part.strip()!r}: errors take % or a fraction")
            value = value / 100 if unit == "%" else value
        elif metric == "rps":
            if unit:
                raise LoadtestError(f"SLO term {part.strip()!r}: rps takes a plain number")
        else:
            if unit is None or unit == "%":
                raise LoadtestError(f"SLO term {part.strip()!r}: give a unit (us, ms or s)")
            value = value * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]
        terms.append((metric, op, value))
    return terms


def _value(metric: str, step: dict) -> float:
    if metric == "errors":
        return step["error_fraction"]
    if metric == "rps":
        return step["rps"]
    return step[f"{metric}_ms"]


def check(terms, step: dict) -> list[str]:
    """The terms a step's results violate, as readable strings."""
    failed = []
    for metric, op, value in terms:
        got = _value(metric, step)
        if not _OPS[op](got, value):
            failed.append(f"{metric} {got:.4g} not {op} {value:g}")
    return failed
