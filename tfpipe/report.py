"""One self-contained report.html per `tfpipe run`: each step's state, the lineage of the model,
and per stage the figures people would rather look at than read. Inline SVG, no scripts and no
network, so it opens from the file system anywhere."""

from __future__ import annotations

import contextlib
import html
import json
import os
from typing import Any

from tfpipe.files import read_json, write_atomic
from tfpipe.versions import VersionError, version_path
from tfpipe.loadtest.report import STYLE, bar_chart, line_chart, loadtest_section, table_html

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e")


def _esc(v: Any) -> str:
    return html.escape(str(v))


def _fmt(v: Any, digits: int = 4) -> str:
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return "-" if v is None else str(v)


def _done(manifest: dict, step: str) -> dict | None:
    entry = manifest.get("steps", {}).get(step)
    return entry if entry and entry.get("status") == "done" else None


def steps_section(manifest: dict) -> str:
    states = manifest.get("last_run", {}).get("states", {})
    rows = []
    for name, entry in manifest.get("steps", {}).items():
        rows.append([name, states.get(name, "-"), entry.get("status"), f"{entry.get('elapsed_s', 0):.1f}s",
                     entry.get("reason", "") if states.get(name) not in (None, "cached") else "unchanged",
                     entry.get("summary") or entry.get("error") or "", entry.get("fingerprint", "")[:12],
                     entry.get("log", "")])
    return table_html(["step", "this run", "status", "took", "why", "result", "fingerprint", "log"], rows, text=True)


def lineage_section(manifest: dict) -> str:
    export, train, data = (_done(manifest, s) for s in ("export", "train", "data"))
    if not (export and train and data):
        return "<p>No exported model yet.</p>"
    e = read_json(export["outputs"]["manifest"]) or {}
    d = read_json(data["outputs"]["manifest"]) or {}
    inputs = "".join(_input_item(i) for i in d.get("inputs", []))
    where = e.get("path")
    if e.get("model_dir"):  # promotions and rollbacks move a version's folder: where it is now
        with contextlib.suppress(VersionError):
            where = version_path(e["model_dir"], e["version"])
    return (f"<p>Model <b>{_esc(e.get('name'))}</b> version <b>{_esc(e.get('version'))}</b> "
            f"(<code>{_esc(where)}</code>) was exported from the train run with fingerprint "
            f"<code>{_esc(e.get('lineage', {}).get('train_fingerprint', '')[:16])}</code>, which was trained on the "
            f"data snapshot <code>{_esc(e.get('lineage', {}).get('data_fingerprint', '')[:16])}</code> made from:</p>"
            f"<ul>{inputs}</ul>")


def _input_item(i: dict) -> str:
    if "path" in i:
        return f"<li><code>{_esc(i['path'])}</code>, {i['size']:,} bytes, sha256 {_esc(i['sha256'][:16])}</li>"
    where = i.get("folder") or i.get("manifest")  # images: a class-folder tree or a manifest
    written = f" (written to <code>{_esc(i['written_to'])}</code>)" if i.get("written_to") else ""
    return f"<li><code>{_esc(where)}</code>{written}, {i.get('images', 0):,} images</li>"


def image_data_section(entry: dict, d: dict, stats: dict, schema: dict) -> str:
    """Images per split and class, their sizes and formats, the channel statistics."""
    c = d["counts"]
    splits = stats.get("splits", {})
    bars = bar_chart("Images per split", "images", [*c["splits"].items(), ("dead-letter", c["bad"])])
    classes = schema.get("label", {}).get("classes", [])
    per_class = [[k, *(s.get("classes", {}).get(k, 0) for s in splits.values())] for k in classes]
    sizes = []
    for name, s in splits.items():
        if not s.get("images"):
            continue
        mid = len(s["height"]["quantiles"]) // 2
        ch = s.get("channels", {})
        sizes.append([name, s["images"], ", ".join(f"{k} {v}" for k, v in s.get("formats", {}).items()),
                      f"{s['height']['quantiles'][0]:g}-{s['height']['quantiles'][-1]:g}",
                      f"{s['width']['quantiles'][0]:g}-{s['width']['quantiles'][-1]:g}",
                      f"{s['height']['quantiles'][mid]:g}x{s['width']['quantiles'][mid]:g}",
                      " / ".join(f"{m:.3f}" for m in ch.get("mean", [])),
                      " / ".join(f"{v:.3f}" for v in ch.get("std", []))])
    dead = (f"<p>{c['bad']:,} of {c['read']:,} images went to the dead-letter output ({d['bad_fraction']:.2%}); "
            f"every file is accounted for: {sum(c['splits'].values()):,} written + {c['bad']:,} dead-lettered = "
            f"{c['read']:,} read.</p>")
    return (f"<p>{len(classes)} classes; Beam runner {_esc(d['beam']['runner'])}; {d['elapsed_s']:.1f}s.</p>"
            f"{dead}<div>{bars}</div><h3>Images per class</h3>"
            + table_html(["class", *splits], per_class)
            + "<h3>Sizes, formats and pixel statistics</h3>"
            + table_html(["split", "images", "formats", "height", "width", "median size", "mean (R/G/B, 0-1)",
                          "std (R/G/B)"], sizes))


def data_section(entry: dict, d: dict) -> str:
    stats = read_json(os.path.join(entry["outputs"]["path"], "stats.json")) or {}
    schema = read_json(os.path.join(entry["outputs"]["path"], "schema.json")) or {}
    if schema.get("kind") == "images":
        return image_data_section(entry, d, stats, schema)
    c = d["counts"]
    unlabelled = c.get("unlabelled", 0)
    bars = bar_chart("Rows per split", "rows", [*c["splits"].items(), ("dead-letter", c["bad"])]
                     + ([("unlabelled", unlabelled)] if unlabelled else []))
    dead = d["outputs"].get("deadletter") or []
    aside = f" + {unlabelled:,} unlabelled (set aside in <code>unlabelled/</code>)" if unlabelled else ""
    dead_html = (f"<p>{c['bad']:,} of {c['read'] - unlabelled:,} labelled rows went to the dead-letter output "
                 f"({d['bad_fraction']:.2%}); every row is accounted for: "
                 f"{sum(c['splits'].values()):,} written + {c['bad']:,} dead-lettered{aside} = {c['read']:,} read.</p>")
    if dead:
        dead_html += "<p>Dead-letter files: " + ", ".join(f"<code>{_esc(x)}</code>" for x in dead) + "</p>"
    split = "train" if "train" in stats.get("splits", {}) else next(iter(stats.get("splits", {})), None)
    rows = []
    for name, f in (stats["splits"][split]["features"].items() if split else []):
        if f["kind"] == "numeric":
            q = f.get("quantiles", {})
            rows.append([name, "numeric", f["count"], f["missing"], _fmt(f.get("mean")), _fmt(f.get("std")),
                         _fmt(f.get("min")), _fmt(q.get("0.5")), _fmt(f.get("max")), ""])
        else:
            top = ", ".join(f"{v} ({n})" for v, n in f.get("top", [])[:5])
            rows.append([name, f["kind"], f["count"], f["missing"], "", "", "", "", "", top])
    label = schema.get("label", {})
    return (f"<p>Label <b>{_esc(label.get('name'))}</b> ({_esc(label.get('task'))}); "
            f"{len(schema.get('features', []))} features; Beam runner {_esc(d['beam']['runner'])}; "
            f"{d['elapsed_s']:.1f}s.</p>{dead_html}<div>{bars}</div>"
            f"<h3>Features ({_esc(split)} split)</h3>"
            + table_html(["feature", "kind", "count", "missing", "mean", "std", "min", "median", "max",
                          "most frequent"], rows))


def train_section(entry: dict, t: dict) -> str:
    epochs = []
    try:
        with open(os.path.join(entry["outputs"]["path"], "metrics.jsonl")) as f:
            epochs = [json.loads(line) for line in f if line.strip()]
    except OSError:
        pass
    charts = [line_chart("Loss per epoch", "epoch", "loss",
                         [(k, COLORS[i], [(e["epoch"], e[k]) for e in epochs if k in e])
                          for i, k in enumerate(("loss", "val_loss"))], integer_x=True)]
    skip = {"epoch", "loss", "seconds", "steps", "step_seconds", "examples_per_s"}
    for metric in [k for k in (epochs[0] if epochs else {}) if k not in skip and not k.startswith("val_")]:
        charts.append(line_chart(f"{metric.capitalize()} per epoch", "epoch", metric,
                                 [(k, COLORS[i], [(e["epoch"], e[k]) for e in epochs if k in e])
                                  for i, k in enumerate((metric, f"val_{metric}"))], integer_x=True))
    # epoch 1 traces and compiles the step: its throughput, a small fraction of the rest, is left out
    # (train.json's figures leave it out too)
    timed = [e for e in epochs if "examples_per_s" in e]
    steady = timed[1:] if len(timed) > 1 and timed[0]["epoch"] == 1 else timed
    charts.append(line_chart("Throughput per epoch" + (" (epoch 1 compiles: left out)" if steady != timed else ""),
                             "epoch", "examples/s", [("examples/s", COLORS[2],
                                                      [(e["epoch"], e["examples_per_s"]) for e in steady])],
                             integer_x=True))
    gpus = t["devices"]["gpus"]
    device = (", ".join(f"{g['name']}" for g in gpus) if gpus else f"CPU only ({t['devices']['cpus']} cores)")
    facts = [["device", device], ["precision", f"{t['precision']['policy']} ({t['precision']['why']})"],
             ["XLA", f"{'on' if t['xla']['jit_compile'] else 'off'} ({t['xla']['why']})"],
             ["strategy", f"{t['strategy']['name']}, global batch {t['strategy']['global_batch']}"],
             ["epochs", f"{t['epochs_run']}" + (f" (resumed after epoch {t['resumed_from_epoch']})"
                                               if t.get("resumed_from_epoch") else "")],
             ["throughput", f"{t.get('examples_per_s', 0):,.0f} examples/s, step {t.get('mean_step_s', 0) * 1000:.2f} ms"],
             ["input wait", f"{t.get('input_wait_fraction', 0):.1%} of step time"],
             ["took", f"{t['elapsed_s']:.1f}s"]]
    if t.get("gpu_utilization"):
        facts.append(["GPU utilisation", json.dumps(t["gpu_utilization"])])
    names = sorted({k for m in t["metrics"].values() for k in m})
    metrics = [[split, *(_fmt(m.get(k)) for k in names)] for split, m in t["metrics"].items()]
    return (table_html(None, facts, text=True)
            + "<h3>Final metrics</h3>" + table_html(["split", *names], metrics)
            + f"<div>{''.join(charts)}</div>")


def export_section(entry: dict, e: dict) -> str:
    quality = "accuracy" if any("accuracy" in v for v in e["variants"]) else "rmse"
    rows = [[v["variant"], f"{v['bytes']:,}", _fmt(v.get("ratio_bytes_vs_float32")), _fmt(v.get(quality)),
             _fmt(v.get("drop")), _fmt(v.get("latency_ms_p50")), _fmt(v.get("latency_ms_p99")),
             "dropped: too inaccurate" if v.get("dropped") else "kept"]
            for v in e["variants"]]
    sizes = bar_chart("Size per variant", "KB", [(v["variant"], v["bytes"] / 1024) for v in e["variants"]])
    return (f"<p>{_esc(e['name'])} version {e['version']} at <code>{_esc(e['path'])}</code>; signatures "
            f"{_esc(', '.join(e['signatures']))}; {e['warmup_records']} warmup records; reloaded SavedModel "
            f"matches Keras within {e['reload_check']['max_abs_diff']:.1e} on {e['reload_check']['rows']:,} rows.</p>"
            + baseline_paragraph(e.get("test"))
            + (table_html(["variant", "bytes", "size vs float32", quality, "drop", "p50 ms", "p99 ms", "verdict"], rows)
               + f"<div>{sizes}</div>" if rows else "<p>No TFLite variant was built.</p>")
            + samples_section(e) + gate_section(e))


def gate_section(e: dict) -> str:
    """The second day: the new version against the version served before it, side by side on the
    same rows (overall and per slice), the signature check, and the decision with its reason."""
    gate = e.get("gate")
    decision = e.get("decision", "published")
    if not gate:
        return ""
    verdict = {"promoted": "PROMOTED", "held": "HELD", "refused": "REFUSED"}.get(decision, decision)
    css = "" if decision == "promoted" else " class='bad'"
    rows = [[c["data"], c["slice"] or "all rows", f"{c['rows']:,}", c["metric"], _fmt(c["candidate"]),
             _fmt(c["baseline"]), _fmt(c["p_value"]), c["rule"], "pass" if c["passed"] else "FAIL"]
            for c in gate["checks"]]
    breaks = "".join(f"<li>{_esc(b)}</li>" for b in gate["breaking_changes"])
    notes = "".join(f"<li>{_esc(n)}</li>" for n in gate["notes"])
    return (f"<h3>Against version {_esc(e.get('baseline'))}, the version served before</h3>"
            f"<p{css}><b>{verdict}</b>: {_esc(e.get('reason'))}</p>"
            + table_html(["rows", "slice", "count", "metric", f"version {e['version']}",
                          f"version {e.get('baseline')}", "p", "rule", "verdict"], rows)
            + (f"<p class='bad'>Signature changes that would break the served version's clients:</p><ul>{breaks}</ul>"
               if breaks else "<p>The new version serves every input and output of the served one.</p>")
            + (f"<ul>{notes}</ul>" if notes else ""))


def rollout_section(entry: dict, r: dict) -> str:
    """The one verdict on a new version: the decision and why, the serving gate's rounds side by side,
    and how the new data compares with the served version's."""
    if r.get("new") is None or r.get("export_decision") == "published":
        return f"<p>Version {_esc(r.get('served'))} published: the first version of {_esc(r.get('model'))}.</p>"
    css = "" if r["decision"] == "promoted" else " class='bad'"
    body = (f"<p{css}><b>Version {_esc(r['new'])} {_esc(r['decision'].upper())}</b>: {_esc(r['reason'])}. "
            f"Version {_esc(r['served'])} is served.</p>")
    serving = r.get("serving")
    if serving:
        rows = [[f"{arm} {i + 1}", f"{x['requests']:,}", _fmt(x["p99_ms"]), _fmt(x["cpu_us"]), str(x["errors"])]
                for i in range(len(serving["rounds"]["served"]))
                for arm, x in (("served", serving["rounds"]["served"][i]), ("new", serving["rounds"]["new"][i]))]
        body += (table_html(["round", "requests", "p99 ms", "CPU us/request", "errors"], rows)
                 + "<ul>" + "".join(f"<li>{_esc(c['text'])}</li>" for c in serving["checks"]) + "</ul>")
        shadow = serving.get("shadow")
        if shadow and shadow.get("failed"):
            body += f"<p>Shadow round: not measured ({_esc(shadow['failed'])}).</p>"
        elif shadow:
            body += (f"<h3>Shadow traffic</h3><p>{_esc(shadow['text'])}. Reported, not a gate.</p><ul>"
                     + "".join(f"<li>{_esc(line)}</li>" for line in shadow["lines"]) + "</ul>")
    drift = r.get("drift")
    if drift:
        rows = [[f["name"], f["measure"], _fmt(f["distance"]), _fmt(f["noise_bound"]), f["verdict"]]
                for f in drift["features"]]
        body += (f"<h3>The new data against the served version's</h3><p>{_esc(drift['sample'])} against "
                 f"{_esc(drift['reference'])}; a feature moved when its distance is over {drift['threshold']:g} "
                 "and beyond the two-sample noise bound. Reported, not a gate.</p>"
                 + table_html(["feature", "measure", "distance", "noise bound", "verdict"], rows))
    return body


def baseline_paragraph(test: dict | None) -> str:
    """The served model's test metric against the trivial baseline's (export.json's `test`), with
    a warning when the model is no better."""
    if not test:
        return ""
    from tfpipe.export.baseline import better_than_baseline

    metric = "rmse" if "rmse" in test else "accuracy"
    model, base = test[metric], test["baseline"][metric]
    weak = not better_than_baseline(test, test["baseline"])
    interval = test.get("interval")
    ci = (f" ({interval['level']:.0%} confidence interval {_fmt(interval['low'])} to {_fmt(interval['high'])}, "
          f"{_esc(interval['method'])})" if interval else "")
    text = (f"On the {_esc(test['split'])} split ({test['rows']:,} rows) the SavedModel's {metric} is {_fmt(model)}"
            f"{ci}; {_esc(test['baseline']['predicts'])} gives {_fmt(base)}.")
    if weak:
        return f"<p class='bad'><b>Warning: the model is no better than this trivial baseline.</b> {text}</p>"
    return f"<p>{text}</p>"


def samples_section(e: dict) -> str:
    """Test images with the class the exported model gives them (export's samples.json)."""
    samples = read_json(os.path.join(e["path"], "assets.extra", "samples.json")) if e.get("image") else None
    if not samples:
        return ""
    cells = []
    for s in samples["images"]:
        ok = s["predicted"] == s["label"]
        cells.append(f'<figure class="sample"><img alt="test image {_esc(s["index"])}" '
                     f'src="data:image/{_esc(s["format"])};base64,{s["b64"]}">'
                     f'<figcaption>{_esc(s["predicted"])} ({s["probability"]:.0%})'
                     + ("" if ok else f'<br><b>true: {_esc(s["label"])}</b>') + "</figcaption></figure>")
    wrong = sum(s["predicted"] != s["label"] for s in samples["images"])
    return (f"<h3>Sample test images and the class the SavedModel gives them</h3>"
            f"<p>{len(samples['images'])} images of the {_esc(samples['split'])} split, misclassified ones first "
            f"({wrong} shown, their true class in bold), then images spread over the split.</p>"
            f"<style>.sample{{display:inline-block;margin:4px;text-align:center;font-size:12px}}"
            f".sample img{{width:64px;height:64px;image-rendering:pixelated;border:1px solid #ccc}}</style>"
            f"<div>{''.join(cells)}</div>")


def _images(check: dict) -> bool:
    return any(isinstance(v, dict) and "b64" in v for v in check.get("example", {}).get("instance", {}).values())


def serve_section(entry: dict, s: dict) -> str:
    c = s["check"]
    # shown as serve/models.config, ...: where they sit in the workdir
    configs = ", ".join(f"<code>{_esc(os.path.relpath(p, os.path.dirname(os.path.dirname(p))))}</code>"
                        for p in s["configs"].values())
    return (f"<p>{_esc(s['model'])} version {s['version']} served by the embedded server. The same "
            f"{c['rows']} {'test images' if _images(c) else 'eval rows'} sent over {' and '.join(c['apis'])} got the SavedModel's own answers "
            f"(outputs {_esc(', '.join(c['outputs']))}; largest difference {c['max_abs_diff']:.1e}, "
            f"tolerance {c['tolerance']:g}).</p>"
            f"<p>TF Serving configs: {configs}. The same model with real TensorFlow Serving:</p>"
            f"<pre>{_esc(' '.join(s['tensorflow_model_server']))}</pre>" + _tuned(s))


def _tuned(s: dict) -> str:
    """The batching tune that chose batching.config, when [serve] batching = "tune"."""
    result = read_json(s["tune"]) if s.get("tune") else None
    if not result:
        return ""
    from tfpipe.tune.report import tune_section

    return tune_section(result).replace("<h2>", "<h3>").replace("</h2>", "</h3>")


def load_section(entry: dict, results: dict) -> str:
    return loadtest_section(results)


def skew_report_section(entry: dict, result: dict) -> str:
    if result.get("skipped"):
        return f"<p>Skipped: {_esc(result['skipped'])}.</p>"
    from tfpipe.skew.job import skew_section

    return skew_section(result)


def write_run_report(workdir: str, manifest: dict, path: str) -> None:
    sections = [("Data", "data", data_section), ("Training", "train", train_section),
                ("Export", "export", export_section), ("Serving", "serve", serve_section),
                ("Load test", "loadtest", load_section), ("Training/serving skew", "skew", skew_report_section),
                ("Rollout", "rollout", rollout_section)]
    body = ""
    for title, step, fn in sections:
        entry = _done(manifest, step)
        doc = read_json(entry["outputs"]["manifest"]) if entry else None
        body += f"<h2>{title}</h2>" + (fn(entry, doc) if doc else "<p>Not run.</p>")
    run = manifest.get("last_run", {})
    doc = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>tfpipe run: {_esc(os.path.basename(workdir))}</title>
<style>{STYLE}</style>
</head><body>
<h1>tfpipe run: {_esc(os.path.basename(workdir))}</h1>
<p>Workdir <code>{_esc(workdir)}</code>; tfpipe {_esc(manifest.get('tfpipe_version'))}; last run started
{_esc(run.get('started'))}: <code>{_esc(' '.join(run.get('command', [])))}</code></p>
{steps_section(manifest)}
<h2>Lineage</h2>{lineage_section(manifest)}
{body}
</body></html>
"""
    write_atomic(path, doc)
