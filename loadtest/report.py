"""A self-contained report.html: tables and inline SVG charts, no scripts or network, so it
opens from the file system anywhere."""

from __future__ import annotations

import html
import math
import re

W, H, PAD = 560, 260, 48
TOP = PAD + 8  # a line chart's plot starts here, under the title and the legend row


def _legend(entries: list[tuple[str, str]], y: float = TOP - 20) -> list[str]:
    """A legend in one row from the left (name, colour): a swatch and the name each, clear of the plot."""
    parts, x = [], PAD
    for name, color in entries:
        parts.append(f'<rect x="{x}" y="{y - 9}" width="10" height="10" fill="{color}"/>'
                     f'<text x="{x + 14}" y="{y}" font-size="11">{html.escape(name)}</text>')
        x += 24 + 6.5 * len(name)
    return parts


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


def tick(v: float) -> str:
    """An axis label short enough for the margin: 62.4k rather than 62,364."""
    return f"{v / 1000:.3g}k" if abs(v) >= 10_000 else plain(v)


def _ticks(lo: float, hi: float, integer: bool) -> list[float]:
    """Three ticks over [lo, hi]; on an integer axis (epochs, steps, seconds) whole numbers evenly
    spaced by 1, 2 or 5 times a power of ten, at most seven of them."""
    if not integer:
        return [lo + f * (hi - lo) for f in (0, 0.5, 1)]
    first, last = math.ceil(lo - 1e-9), math.floor(hi + 1e-9)
    if last <= first:
        return [float(first)]
    step = 1
    while (last - first) / step > 6:
        step = step * 5 // 2 if str(step)[0] == "2" else step * 2  # 1, 2, 5, 10, 20, 50, ...
    return [float(v) for v in range(math.ceil(first / step) * step, last + 1, step)]


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
        return H - PAD + 10 - (y - y0) / (y1 - y0) * (H - PAD + 10 - TOP)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" role="img" '
             f'aria-label="{html.escape(title)}">',
             f'<text x="{W / 2}" y="16" text-anchor="middle" font-weight="bold">{html.escape(title)}</text>',
             f'<line x1="{PAD}" y1="{H - PAD + 10}" x2="{W - PAD}" y2="{H - PAD + 10}" stroke="#333"/>',
             f'<line x1="{PAD}" y1="{TOP}" x2="{PAD}" y2="{H - PAD + 10}" stroke="#333"/>',
             f'<text x="{W / 2}" y="{H - 8}" text-anchor="middle">{html.escape(xlabel)}</text>',
             f'<text x="12" y="{H / 2}" transform="rotate(-90 12 {H / 2})" text-anchor="middle">'
             f'{html.escape(ylabel)}</text>']
    sides = ["left"] + (["right"] if right else [])
    if right:
        parts += [f'<line x1="{W - PAD}" y1="{TOP}" x2="{W - PAD}" y2="{H - PAD + 10}" stroke="#333"/>',
                  f'<text x="{W - 10}" y="{H / 2}" transform="rotate(90 {W - 10} {H / 2})" text-anchor="middle">'
                  f'{html.escape(right_label or "")}</text>']
    for side in sides:
        lo, hi = scales[side]
        x, anchor = (PAD - 4, "end") if side == "left" else (W - PAD + 4, "start")
        for yv in _ticks(lo, hi, integer=False):
            parts.append(f'<text x="{x}" y="{py(yv, side) + 4:.1f}" text-anchor="{anchor}" font-size="10">'
                         f'{tick(yv)}</text>')
    for xv in _ticks(x0, x1, integer=integer_x and not log_x):
        label = 10 ** xv if log_x else xv
        parts.append(f'<text x="{PAD + (xv - x0) / (x1 - x0) * (W - 2 * PAD):.1f}" y="{H - PAD + 24}" '
                     f'text-anchor="middle" font-size="10">{plain(label)}</text>')
    for name, color, pts, *side in series:
        side = "right" if side else "left"
        coords = " ".join(f"{px(p[0]):.1f},{py(p[1], side):.1f}" for p in pts)
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{coords}"/>')
        parts += [f'<circle cx="{px(p[0]):.1f}" cy="{py(p[1], side):.1f}" r="3" fill="{color}"/>' for p in pts]
        parts += [f'<text x="{px(p[0]) + 5:.1f}" y="{py(p[1], side) - 5:.1f}" font-size="10" fill="{color}">'
                  f'{html.escape(str(p[2]))}</text>' for p in pts if len(p) > 2]
    parts += _legend([(name + (" (right axis)" if side else ""), color) for name, color, _, *side in series])
    parts.append("</svg>")
    return "".join(parts)


def _bar_frame(title: str, ylabel: str, base: float, height: int = H) -> list[str]:
    """A bar chart's opening: the svg element, the title, the baseline and the y-axis label."""
    return [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" role="img" '
            f'aria-label="{html.escape(title)}">',
            f'<text x="{W / 2}" y="16" text-anchor="middle" font-weight="bold">{html.escape(title)}</text>',
            f'<line x1="{PAD}" y1="{base}" x2="{W - PAD}" y2="{base}" stroke="#333"/>',
            f'<text x="12" y="{height / 2}" transform="rotate(-90 12 {height / 2})" text-anchor="middle">'
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
    """Bars side by side per label, one colour per series (name, colour, values), with a legend and
    a y axis ticked at 0, half and the top: two distributions over the same bins. The labels are
    slanted under the bars, with room below for up to 18 characters."""
    if not labels:
        return f"<p>{html.escape(title)}: no data</p>"
    top = max((v for _, _, values in series for v in values), default=0.0) or 1.0
    slot = (W - 2 * PAD) / len(labels)
    width = slot * 0.8 / len(series)
    height = H + 40
    base, span = H - PAD + 10, H - PAD + 10 - TOP
    parts = _bar_frame(title, ylabel, base, height)
    parts.append(f'<line x1="{PAD}" y1="{TOP}" x2="{PAD}" y2="{base}" stroke="#333"/>')
    for f in (0.0, 0.5, 1.0):
        y = base - f * span
        parts.append(f'<line x1="{PAD - 3}" y1="{y:.1f}" x2="{PAD}" y2="{y:.1f}" stroke="#333"/>'
                     f'<text x="{PAD - 5}" y="{y + 4:.1f}" text-anchor="end" font-size="10">{tick(f * top)}</text>')
    parts += _legend([(name, color) for name, color, _ in series])
    for k, (name, color, values) in enumerate(series):
        for i, value in enumerate(values):
            h = value / top * span
            x = PAD + i * slot + slot * 0.1 + k * width
            parts.append(f'<rect x="{x:.1f}" y="{base - h:.1f}" width="{width:.1f}" height="{h:.1f}" fill="{color}">'
                         f'<title>{html.escape(name)} {html.escape(labels[i])}: {plain(value)}</title></rect>')
    for i, label in enumerate(labels):
        x = PAD + (i + 0.5) * slot
        shown = label if len(label) <= 18 else label[:17] + "…"
        parts.append(f'<text x="{x:.1f}" y="{base + 14}" text-anchor="end" font-size="11" '
                     f'transform="rotate(-35 {x:.1f} {base + 14})"><title>{html.escape(label)}</title>'
                     f'{html.escape(shown)}</text>')
    parts.append("</svg>")
    return "".join(parts)


STYLE = ("body{font-family:sans-serif;margin:2em;max-width:1200px}table{border-collapse:collapse;margin:.5em 0}"
         "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}th{background:#f4f4f4}td.n,th.n{text-align:right}"
         "svg{margin:8px;border:1px solid #eee}.ok{color:#1a7f37}.bad{color:#c62828;font-weight:bold}"
         "pre{white-space:pre-wrap;word-break:break-all;background:#f7f7f7;padding:6px}")

_NUMBER = re.compile(r"^[-+]?(\d[\d,]*\.?\d*|\.\d+)(e[-+]?\d+)?\s*(%|ms|s|x|MiB|KB|B)?$|^-$|^$")


def _numeric_column(rows: list[list], j: int) -> bool:
    """A column of figures (numbers, '-' or empty, with a unit such as % or ms), at least one a number."""
    cells = [str(r[j]).strip() for r in rows if j < len(r)]
    return any(c not in ("", "-") for c in cells) and all(_NUMBER.match(c) for c in cells)


def table_html(header: list[str] | None, rows: list[list], text: bool = False) -> str:
    """An escaped table whose columns of figures are right-aligned, headers included, and every
    other column left-aligned; `text` left-aligns all of them; no header row when None."""
    width = max([len(header or [])] + [len(r) for r in rows])
    numeric = [not text and _numeric_column(rows, j) for j in range(width)]

    def cls(j: int) -> str:
        return ' class="n"' if j < width and numeric[j] else ""

    head = ("<tr>" + "".join(f"<th{cls(j)}>{html.escape(h)}</th>" for j, h in enumerate(header)) + "</tr>"
            if header else "")
    body = "".join("<tr>" + "".join(f"<td{cls(j)}>{html.escape(str(v))}</td>" for j, v in enumerate(row)) + "</tr>"
                   for row in rows)
    return f"<table>{head}{body}</table>"


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
