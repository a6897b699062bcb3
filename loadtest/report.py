"""A self-contained report.html: tables and inline SVG charts, no scripts or network, so it
opens from the file system anywhere."""

from __future__ import annotations

import html
import math

W, H, PAD = 560, 260, 48


def _scale(values, lo_zero=True):
    finite = [v for v in values if v is not None and math.isfinite(v)]
    lo = 0.0 if lo_zero or not finite else min(finite)
    hi = max(finite) if finite else 1.0
    return lo, hi if hi > lo else lo + 1.0


def plain(v: float) -> str:
    """A tick label as people write numbers: 1,024 and 20.5 and 0.0012, never 1.02e+03."""
    if v != 0 and abs(v) >= 1000:
        return f"{v:,.0f}"
    text = f"{v:.3g}"
    if "e" in text:  # tiny values: positional, trimmed
        text = f"{v:.8f}".rstrip("0").rstrip(".")
    return text


def _ticks(lo: float, hi: float, integer: bool) -> list[float]:
    """Three ticks over [lo, hi]; whole numbers only on an integer axis (epochs, steps)."""
    ticks = [lo + f * (hi - lo) for f in (0, 0.5, 1)]
    return sorted({float(round(t)) for t in ticks if lo - 1e-9 <= round(t) <= hi + 1e-9}) if integer else ticks


def line_chart(title: str, xlabel: str, ylabel: str, series: list[tuple], log_x: bool = False,
               integer_x: bool = False, right_label: str | None = None) -> str:
    """Lines with points, axes scaled to the data. Each series is (name, colour, points) or
    (name, colour, points, "right") for one drawn against a second y axis on the right,
    labelled `right_label` (quantities of another unit: req/s beside p99 ms). A point is
    (x, y) or (x, y, label), the label written beside it."""
    xs = [p[0] for _, _, pts, *_ in series for p in pts]
    if not xs:
        return f"<p>{html.escape(title)}: no data</p>"
    fx = (lambda v: math.log10(max(v, 1e-9))) if log_x else (lambda v: v)
    x0, x1 = _scale([fx(x) for x in xs], lo_zero=False)
    left = [p[1] for _, _, pts, *side in series if not side for p in pts]
    right = [p[1] for _, _, pts, *side in series if side for p in pts]
    scales = {"left": _scale(left), "right": _scale(right)}

    def px(x):
        return PAD + (fx(x) - x0) / (x1 - x0) * (W - 2 * PAD)

    def py(y, side="left"):
        y0, y1 = scales[side]
        return H - PAD + 10 - (y - y0) / (y1 - y0) * (H - 2 * PAD)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" role="img" '
             f'aria-label="{html.escape(title)}">',
             f'<text x="{W / 2}" y="16" text-anchor="middle" font-weight="bold">{html.escape(title)}</text>',
             f'<line x1="{PAD}" y1="{H - PAD + 10}" x2="{W - PAD}" y2="{H - PAD + 10}" stroke="#333"/>',
             f'<line x1="{PAD}" y1="{PAD - 10}" x2="{PAD}" y2="{H - PAD + 10}" stroke="#333"/>',
             f'<text x="{W / 2}" y="{H - 8}" text-anchor="middle">{html.escape(xlabel)}</text>',
             f'<text x="12" y="{H / 2}" transform="rotate(-90 12 {H / 2})" text-anchor="middle">'
             f'{html.escape(ylabel)}</text>']
    sides = ["left"] + (["right"] if right else [])
    if right:
        parts += [f'<line x1="{W - PAD}" y1="{PAD - 10}" x2="{W - PAD}" y2="{H - PAD + 10}" stroke="#333"/>',
                  f'<text x="{W - 10}" y="{H / 2}" transform="rotate(90 {W - 10} {H / 2})" text-anchor="middle">'
                  f'{html.escape(right_label or "")}</text>']
    for side in sides:
        lo, hi = scales[side]
        x, anchor = (PAD - 4, "end") if side == "left" else (W - PAD + 4, "start")
        for yv in _ticks(lo, hi, integer=False):
            parts.append(f'<text x="{x}" y="{py(yv, side) + 4:.1f}" text-anchor="{anchor}" font-size="10">'
                         f'{plain(yv)}</text>')
    for xv in _ticks(x0, x1, integer=integer_x and not log_x):
        label = 10 ** xv if log_x else xv
        parts.append(f'<text x="{PAD + (xv - x0) / (x1 - x0) * (W - 2 * PAD):.1f}" y="{H - PAD + 24}" '
                     f'text-anchor="middle" font-size="10">{plain(label)}</text>')
    for i, (name, color, pts, *side) in enumerate(series):
        side = "right" if side else "left"
        coords = " ".join(f"{px(p[0]):.1f},{py(p[1], side):.1f}" for p in pts)
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{coords}"/>')
        parts += [f'<circle cx="{px(p[0]):.1f}" cy="{py(p[1], side):.1f}" r="3" fill="{color}"/>' for p in pts]
        parts += [f'<text x="{px(p[0]) + 5:.1f}" y="{py(p[1], side) - 5:.1f}" font-size="9" fill="{color}">'
                  f'{html.escape(str(p[2]))}</text>' for p in pts if len(p) > 2]
        parts.append(f'<text x="{W - PAD}" y="{PAD - 10 + 14 * i}" text-anchor="end" fill="{color}" '
                     f'font-size="11">{html.escape(name)}{" (right axis)" if side == "right" else ""}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _bar_frame(title: str, ylabel: str, base: float) -> list[str]:
    """A bar chart's opening: the svg element, the title, the baseline and the y-axis label."""
    return [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" role="img" '
            f'aria-label="{html.escape(title)}">',
            f'<text x="{W / 2}" y="16" text-anchor="middle" font-weight="bold">{html.escape(title)}</text>',
            f'<line x1="{PAD}" y1="{base}" x2="{W - PAD}" y2="{base}" stroke="#333"/>',
            f'<text x="12" y="{H / 2}" transform="rotate(-90 12 {H / 2})" text-anchor="middle">'
            f'{html.escape(ylabel)}</text>']


def bar_chart(title: str, ylabel: str, bars: list[tuple[str, float]], color: str = "#1f77b4") -> str:
    """Labelled vertical bars with their values written on top."""
    if not bars:
        return f"<p>{html.escape(title)}: no data</p>"
    top = max(v for _, v in bars) or 1.0
    slot = (W - 2 * PAD) / len(bars)
    base = H - PAD + 10
    parts = _bar_frame(title, ylabel, base)
    for i, (label, value) in enumerate(bars):
        h = value / top * (H - 2 * PAD)
        x = PAD + i * slot + slot * 0.15
        parts.append(f'<rect x="{x:.1f}" y="{base - h:.1f}" width="{slot * 0.7:.1f}" height="{h:.1f}" fill="{color}"/>')
        shown = f"{value:,.0f}" if float(value).is_integer() else plain(value)
        parts.append(f'<text x="{x + slot * 0.35:.1f}" y="{base - h - 4:.1f}" text-anchor="middle" '
                     f'font-size="11">{shown}</text>')
        parts.append(f'<text x="{x + slot * 0.35:.1f}" y="{base + 16}" text-anchor="middle" '
                     f'font-size="11">{html.escape(label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def paired_bar_chart(title: str, ylabel: str, labels: list[str], series: list[tuple[str, str, list[float]]]) -> str:
    """Bars side by side per label, one colour per series (name, colour, values), with a legend:
    two distributions over the same bins."""
    if not labels:
        return f"<p>{html.escape(title)}: no data</p>"
    top = max((v for _, _, values in series for v in values), default=0.0) or 1.0
    slot = (W - 2 * PAD) / len(labels)
    width = slot * 0.8 / len(series)
    base = H - PAD + 10
    parts = _bar_frame(title, ylabel, base)
    parts.append(f'<text x="{PAD}" y="{base - (H - 2 * PAD) - 2:.1f}" font-size="10">{plain(top)}</text>')
    for k, (name, color, values) in enumerate(series):
        parts.append(f'<rect x="{W - PAD - 110}" y="{24 + 14 * k}" width="10" height="10" fill="{color}"/>'
                     f'<text x="{W - PAD - 96}" y="{33 + 14 * k}" font-size="11">{html.escape(name)}</text>')
        for i, value in enumerate(values):
            h = value / top * (H - 2 * PAD)
            x = PAD + i * slot + slot * 0.1 + k * width
            parts.append(f'<rect x="{x:.1f}" y="{base - h:.1f}" width="{width:.1f}" height="{h:.1f}" fill="{color}">'
                         f'<title>{html.escape(name)} {html.escape(labels[i])}: {plain(value)}</title></rect>')
    size = 11 if len(labels) <= 8 else 8
    for i, label in enumerate(labels):
        x = PAD + (i + 0.5) * slot
        parts.append(f'<text x="{x:.1f}" y="{base + 14}" text-anchor="end" font-size="{size}" '
                     f'transform="rotate(-30 {x:.1f} {base + 14})">{html.escape(label[:16])}</text>')
    parts.append("</svg>")
    return "".join(parts)


STYLE = ("body{font-family:sans-serif;margin:2em;max-width:1200px}table{border-collapse:collapse;margin:.5em 0}"
         "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f4f4f4}"
         "svg{margin:8px;border:1px solid #eee}.ok{color:#1a7f37}.bad{color:#c62828;font-weight:bold}"
         "td:first-child{text-align:left}.text td{text-align:left}pre{white-space:pre-wrap;word-break:break-all;background:#f7f7f7;padding:6px}")


def table_html(header: list[str] | None, rows: list[list], text: bool = False) -> str:
    """An escaped table; `text` left-aligns cells (prose rather than figures); no header row when None."""
    head = "<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>" if header else ""
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>" for row in rows)
    cls = ' class="text"' if text else ""
    return f"<table{cls}>{head}{body}</table>"


def loadtest_section(results: dict) -> str:
    """The steps table, latency-vs-throughput, the latency distribution, per-step time series and
    the SLO verdict, as an HTML fragment (also used by `tfpipe run`'s report)."""
    steps = results["steps"]
    rows = [[s["step"], s["users"], s["rate"] or "-", s["requests"], s["errors"], f"{s['rps']:.1f}",
             f"{s['p50_ms']:.3f}", f"{s['p90_ms']:.3f}", f"{s['p95_ms']:.3f}", f"{s['p99_ms']:.3f}",
             f"{s['p99.9_ms']:.3f}", f"{s['max_ms']:.3f}",
             "-" if s["slo_ok"] is None else ("ok" if s["slo_ok"] else "missed: " + "; ".join(s["slo_failures"])),
             s["generator_note"] or ""] for s in steps]
    by_rps = sorted(steps, key=lambda s: s["rps"])  # a line along the throughput axis; points name their step
    curve = line_chart("Latency vs throughput (points: step)", "requests/s", "ms",
                       [(f"p{p}", c, [(s["rps"], s[f"p{p}_ms"], s["step"]) for s in by_rps])
                        for p, c in (("50", "#1f77b4"), ("99", "#d62728"), ("99.9", "#9467bd"))])
    last = steps[-1]
    hist = last["histogram"]
    total = sum(hist["counts"]) or 1
    cumulative, pts = 0, []
    for us, c in zip(hist["us"], hist["counts"], strict=True):
        cumulative += c
        pts.append((us / 1000, cumulative / total * 100))
    distribution = line_chart(f"Latency distribution, step {last['step']} (cumulative)", "ms (log)",
                              "% of requests", [("answered", "#2ca02c", pts)], log_x=True)
    series = [line_chart(f"Step {s['step']} over time", "second", "req/s",
                         [("req/s", "#1f77b4", [(p["second"], p["answered"]) for p in s["series"]]),
                          ("p99 ms", "#d62728", [(p["second"], p["p99_ms"]) for p in s["series"]
                                                 if p["p99_ms"] is not None], "right")],
                         integer_x=True, right_label="p99 ms")
              for s in steps if s.get("series")]
    verdict = ("" if results["slo_passed"] is None else
               f'<p class="{"ok" if results["slo_passed"] else "bad"}"><b>SLO {html.escape(results["slo"])}: '
               f'{"met" if results["slo_passed"] else "MISSED"}</b></p>')
    knee = results.get("knee")
    knee_html = (f"<p>Knee: step {knee['step']}, {knee['rps']:.0f} requests/s with p99 {knee['p99_ms']:.2f} ms</p>"
                 if knee and len(steps) > 1 else "")
    cfg = results["config"]
    base = results.get("baseline")
    base_html = (f"<p>In-process SavedModel on the same payloads ({html.escape(base['path'])}): p50 "
                 f"{base['p50_ms']:.3f} ms, p99 {base['p99_ms']:.3f} ms over {base['calls']} calls. Serving "
                 f"overhead at p50: " + ", ".join(f"step {s['step']} {s['overhead_p50_ms']:+.3f} ms" for s in steps)
                 + ".</p>") if base else ""
    replay = results.get("replay")
    if replay:
        rec, rep = replay["recorded"], replay["replayed"]
        lat = rec.get("server_latency") or {}
        fmt = lambda v, unit: "-" if v is None else f"{v:.3f} {unit}"  # noqa: E731
        base_html += (f"<p>Replay of the request log <code>{html.escape(replay['prefix'])}</code> at "
                      f"{replay['speed']:g}x: {replay['count_ratio']:.3f}x its request count"
                      + (f", {replay['rate_ratio']:.3f}x its rate" if replay.get("rate_ratio") else "") + ".</p>"
                      + table_html(["", "requests", "req/s", "p50", "p99", "measured as"], [
                          ["recorded", rec["requests"], fmt(rec["rate"], ""), fmt(lat.get("p50_ms"), "ms"),
                           fmt(lat.get("p99_ms"), "ms"), "server time, as logged"],
                          ["replayed", rep["requests"], fmt(rep["rate"], ""), fmt(rep["p50_ms"], "ms"),
                           fmt(rep["p99_ms"], "ms"), "client time from each request's due time"]]))
    partial = ('<p class="bad">Interrupted: the last step is partial (whole seconds measured before the stop).</p>'
               if results.get("interrupted") else "")
    return f"""{partial}<p>Target {html.escape(str(cfg.get('target')))}, model {html.escape(str(cfg.get('model')))}, signature
{html.escape(str(cfg.get('signature')))}, {cfg.get('batch_size')} row(s) per request,
{'open model (rate)' if cfg.get('rate') else 'closed model (users)'}.</p>
{verdict}{knee_html}{base_html}
{table_html(["step", "users", "rate", "requests", "errors", "req/s", "p50 ms", "p90 ms", "p95 ms", "p99 ms",
             "p99.9 ms", "max ms", "SLO", "generator"], rows)}
<div>{curve}{distribution}</div>
<div>{''.join(series)}</div>"""


def write_report(results: dict, path: str) -> None:
    cfg = results["config"]
    doc = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>tfpipe loadtest: {html.escape(str(cfg.get('model')))}</title>
<style>{STYLE}</style>
</head><body>
<h1>tfpipe loadtest</h1>
{loadtest_section(results)}
<p>Command: <code>{html.escape(' '.join(results.get('command', [])))}</code></p>
</body></html>
"""
    with open(path, "w") as f:
        f.write(doc)
