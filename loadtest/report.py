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


def _chart(title: str, xlabel: str, ylabel: str, series: list[tuple[str, str, list[tuple[float, float]]]],
           log_x: bool = False) -> str:
    xs = [x for _, _, pts in series for x, _ in pts]
    ys = [y for _, _, pts in series for _, y in pts]
    if not xs:
        return f"<p>{html.escape(title)}: no data</p>"
    fx = (lambda v: math.log10(max(v, 1e-9))) if log_x else (lambda v: v)
    x0, x1 = _scale([fx(x) for x in xs], lo_zero=False)
    y0, y1 = _scale(ys)

    def px(x):
        return PAD + (fx(x) - x0) / (x1 - x0) * (W - 2 * PAD)

    def py(y):
        return H - PAD + 10 - (y - y0) / (y1 - y0) * (H - 2 * PAD)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" role="img" '
             f'aria-label="{html.escape(title)}">',
             f'<text x="{W / 2}" y="16" text-anchor="middle" font-weight="bold">{html.escape(title)}</text>',
             f'<line x1="{PAD}" y1="{H - PAD + 10}" x2="{W - PAD}" y2="{H - PAD + 10}" stroke="#333"/>',
             f'<line x1="{PAD}" y1="{PAD - 10}" x2="{PAD}" y2="{H - PAD + 10}" stroke="#333"/>',
             f'<text x="{W / 2}" y="{H - 8}" text-anchor="middle">{html.escape(xlabel)}</text>',
             f'<text x="12" y="{H / 2}" transform="rotate(-90 12 {H / 2})" text-anchor="middle">'
             f'{html.escape(ylabel)}</text>']
    for frac in (0, 0.5, 1):
        yv = y0 + frac * (y1 - y0)
        parts.append(f'<text x="{PAD - 4}" y="{py(yv) + 4:.1f}" text-anchor="end" font-size="10">{yv:.3g}</text>')
        xv = x0 + frac * (x1 - x0)
        label = 10 ** xv if log_x else xv
        parts.append(f'<text x="{PAD + frac * (W - 2 * PAD):.1f}" y="{H - PAD + 24}" text-anchor="middle" '
                     f'font-size="10">{label:.3g}</text>')
    for i, (name, color, pts) in enumerate(series):
        coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{coords}"/>')
        parts += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{color}"/>' for x, y in pts]
        parts.append(f'<text x="{W - PAD}" y="{PAD - 10 + 14 * i}" text-anchor="end" fill="{color}" '
                     f'font-size="11">{html.escape(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def write_report(results: dict, path: str) -> None:
    steps = results["steps"]
    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in (
            s["step"], s["users"], s["rate"] or "-", s["requests"], s["errors"], f"{s['rps']:.1f}",
            f"{s['p50_ms']:.3f}", f"{s['p90_ms']:.3f}", f"{s['p95_ms']:.3f}", f"{s['p99_ms']:.3f}",
            f"{s['p99.9_ms']:.3f}", f"{s['max_ms']:.3f}",
            "-" if s["slo_ok"] is None else ("ok" if s["slo_ok"] else "missed: " + "; ".join(s["slo_failures"])),
            s["generator_note"] or "")) + "</tr>" for s in steps)
    curve = _chart("Latency vs throughput", "requests/s", "ms",
                   [(f"p{p}", c, [(s["rps"], s[f"p{p}_ms"]) for s in steps])
                    for p, c in (("50", "#1f77b4"), ("99", "#d62728"), ("99.9", "#9467bd"))])
    last = steps[-1]
    hist = last["histogram"]
    total = sum(hist["counts"]) or 1
    cumulative, pts = 0, []
    for us, c in zip(hist["us"], hist["counts"], strict=True):
        cumulative += c
        pts.append((us / 1000, cumulative / total * 100))
    distribution = _chart(f"Latency distribution, step {last['step']} (cumulative)", "ms (log)", "% of requests",
                          [("answered", "#2ca02c", pts)], log_x=True)
    series = [_chart(f"Step {s['step']} over time", "second", "req/s and p99 ms",
                     [("req/s", "#1f77b4", [(p["second"], p["answered"]) for p in s["series"]]),
                      ("p99 ms", "#d62728", [(p["second"], p["p99_ms"]) for p in s["series"]
                                             if p["p99_ms"] is not None])])
              for s in steps if s.get("series")]
    verdict = ("" if results["slo_passed"] is None else
               f"<p><b>SLO {html.escape(results['slo'])}: {'met' if results['slo_passed'] else 'MISSED'}</b></p>")
    knee = results.get("knee")
    knee_html = (f"<p>Knee: step {knee['step']}, {knee['rps']:.0f} requests/s with p99 {knee['p99_ms']:.2f} ms</p>"
                 if knee and len(steps) > 1 else "")
    cfg = results["config"]
    doc = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>tfpipe loadtest: {html.escape(str(cfg.get('model')))}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1200px}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}svg{{margin:8px;border:1px solid #eee}}</style>
</head><body>
<h1>tfpipe loadtest</h1>
<p>Target {html.escape(str(cfg.get('target')))}, model {html.escape(str(cfg.get('model')))}, signature
{html.escape(str(cfg.get('signature')))}, {cfg.get('batch_size')} row(s) per request,
{'open model (rate)' if cfg.get('rate') else 'closed model (users)'}.</p>
{verdict}{knee_html}
<table><tr><th>step</th><th>users</th><th>rate</th><th>requests</th><th>errors</th><th>req/s</th><th>p50 ms</th>
<th>p90 ms</th><th>p95 ms</th><th>p99 ms</th><th>p99.9 ms</th><th>max ms</th><th>SLO</th><th>generator</th></tr>
{rows}</table>
<div>{curve}{distribution}</div>
<div>{''.join(series)}</div>
<p>Command: <code>{html.escape(' '.join(results.get('command', [])))}</code></p>
</body></html>
"""
    with open(path, "w") as f:
        f.write(doc)
