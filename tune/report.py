"""tune.html: what `tfpipe tune` measured, every trial shown."""

from __future__ import annotations

import html
import json
from typing import Any

from tfpipe.loadtest.report import STYLE, bar_chart, line_chart, table_html
from tfpipe.tune.search import Candidate


def _level(lv: dict | None) -> str:
    if lv is None:
        return "-"
    text = f"{lv['rps']:.0f}/s, {lv['p99_ms']:.1f} ms"
    if lv["errors"]:
        return text + f", {lv['errors']} errors"
    return text + (" MISS" if lv["slo_ok"] is False else "")


def tune_section(result: dict[str, Any]) -> str:
    """The verdict, the chosen batching.config, each trial's score and levels, as an HTML fragment
    (also used by `tfpipe run`'s report)."""
    cfg, start, best = result["config"], result["start"], result["best"]
    unit = "requests/s" if result["load"]["model"] == "open" else "clients"
    levels = ", ".join(f"{v:g}" for v in result["load"]["levels"])
    ratio = f"{result['ratio']:.2f}x" if result["ratio"] else "n/a (the start met the SLO at no level)"
    rows = []
    for r in result["trials"]:
        c = Candidate.from_json(r["candidate"])
        by_level = {lv["level"]: lv for lv in r["levels"]}
        rows.append([r["trial"], r["stage"], c.max_batch_size, c.batch_timeout_micros, c.num_batch_threads,
                     c.max_enqueued_batches, ",".join(map(str, c.allowed_batch_sizes)) or "-",
                     f"{r['score_rps']:.0f}", *(_level(by_level.get(v)) for v in result["load"]["levels"])])
    header = ["trial", "stage", "batch", "timeout µs", "threads", "queue", "allowed", "score req/s",
              *(f"{v:g} {unit}" for v in result["load"]["levels"])]
    bars = [(f"{r['trial']}", r["score_rps"]) for r in result["trials"]]

    key = {json.dumps(start["candidate"], sort_keys=True): "#999", json.dumps(best["candidate"], sort_keys=True):
           "#1a7f37"}  # the start grey, the best green (when it is not the start), the rest light blue

    def colour(r: dict) -> str:
        return key.get(json.dumps(r["candidate"], sort_keys=True), "#9ecae1")

    curves = [(f"trial {r['trial']}", colour(r), [(lv["rps"], lv["p99_ms"]) for lv in r["levels"]])
              for r in result["trials"]]
    best_proto = html.escape(str(Candidate.from_json(best["candidate"]).to_proto()))
    return f"""<h2>Batching tuned by measurement</h2>
<p>Model <code>{html.escape(str(cfg['model_name']))}</code> on the {html.escape(cfg['backend'])} server over
{html.escape(cfg['protocol'].upper())}; each trial restarts it with one candidate and steps through {unit}
{html.escape(levels)} until a level misses the SLO <code>{html.escape(cfg['slo'] or 'none')}</code>. A trial's score
is the highest throughput of a level that met the SLO with no errors; a candidate's is the mean of its trials.</p>
<p>Start (the TF Serving batching guide's CPU starting point, {html.escape(start['label'])}):
<b>{start['score_rps']:.0f} req/s</b>. Best: <b>{best['score_rps']:.0f} req/s</b>, {ratio} the start, in
{len(result['trials'])} trials.</p>
<p>batching.config:</p><pre>{best_proto}</pre>
<p>Columns: max_batch_size, batch_timeout_micros, num_batch_threads, max_enqueued_batches, allowed_batch_sizes;
then the score, and each load level's throughput and p99.</p>
{table_html(header, rows)}
<div>{bar_chart("score of each trial (req/s within the SLO)", "req/s", bars)}
{line_chart("p99 against throughput, each trial's levels (grey: the start, green: the best)", "req/s", "p99 ms",
            curves)}</div>"""


def write_html(result: dict[str, Any], path: str) -> None:
    name = html.escape(str(result["config"]["model_name"]))
    doc = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>tfpipe tune: {name}</title>
<style>{STYLE}</style>
</head><body>
<h1>tfpipe tune</h1>
{tune_section(result)}
<p>Command: <code>{html.escape(' '.join(result.get('command', [])))}</code></p>
</body></html>
"""
    with open(path, "w") as f:
        f.write(doc)
