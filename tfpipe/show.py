"""`tfpipe show`: a run's manifest as text, ending with the lineage of the model it serves."""

from __future__ import annotations

import contextlib
import json
import os

from tfpipe.errors import RunError
from tfpipe.files import file_sha256
from tfpipe.manifest import read_manifest
from tfpipe.rollout.commands import history_lines
from tfpipe.steps import STEPS
from tfpipe.versions import VersionError, served, version_path


def show(workdir: str, as_json: bool = False) -> int:
    manifest = read_manifest(workdir)
    if not manifest:
        raise RunError(f"{workdir} holds no manifest.json: it is not a tfpipe run workdir (run `tfpipe run` first)")
    if as_json:
        print(json.dumps(manifest, indent=2))
        return 0
    print(f"workdir  {manifest['workdir']}")
    print(f"config   {manifest.get('config_path') or '(none)'}; tfpipe {manifest.get('tfpipe_version')}")
    last = manifest.get("last_run", {})
    print(f"last run {last.get('started')} -> {last.get('ended', 'did not finish')}: {' '.join(last.get('command', []))}")
    print()
    steps = manifest.get("steps", {})
    for name in STEPS:
        e = steps.get(name)
        if not e:
            print(f"{name:<9} not run")
            continue
        intact = ""
        if e.get("status") == "done" and file_sha256(e["outputs"]["manifest"]) != e["outputs"]["sha256"]:
            intact = "  (its output was changed or removed since)"
        print(f"{name:<9} {e['status']:<11} {e.get('started')}  {e.get('elapsed_s', 0):.1f}s  "
              f"fingerprint {e.get('fingerprint', '')[:16]}{intact}")
        inputs = e.get("parts", {}).get("inputs", {})
        if "files" in inputs:
            for f in inputs["files"]:
                print(f"          input  {f['path']} ({f['size']:,} bytes)")
        elif "images" in inputs:  # an image listing: its digest stands for the files
            print(f"          input  {inputs['count']:,} images in {len(inputs['classes'])} classes, "
                  f"listing sha256 {inputs['images'][:16]}")
        else:
            for need, sha in inputs.items():
                print(f"          input  {need} output, manifest sha256 {sha[:16]}")
        if e.get("status") == "done":
            print(f"          output {e['outputs'].get('path')}")
            print(f"          {e.get('summary', '')}")
        elif e.get("error"):
            print(f"          error  {e['error']}")
        print(f"          log    {os.path.join(manifest['workdir'], e.get('log', ''))}")
    print()
    for line in lineage(manifest):
        print(line)
    export = steps.get("export", {})
    if export.get("status") == "done" and export.get("outputs", {}).get("path"):
        print()
        for line in history_lines(os.path.dirname(export["outputs"]["path"])):
            print(line)
    return 0


def lineage(manifest: dict) -> list[str]:
    """Which data made the model this workdir serves: version <- train run <- data snapshot <- files."""
    steps = manifest.get("steps", {})
    export = steps.get("export", {})
    if export.get("status") != "done":
        return ["lineage: no model exported yet"]
    try:
        with open(export["outputs"]["manifest"]) as f:
            e = json.load(f)
        with open(steps["data"]["outputs"]["manifest"]) as f:
            d = json.load(f)
    except (OSError, KeyError, ValueError):
        return ["lineage: the exported model's or the data's manifest is gone"]
    where, state = e["path"], ""
    if e.get("model_dir"):  # promotions and rollbacks move a version's folder: where it is now
        with contextlib.suppress(VersionError):
            where = version_path(e["model_dir"], e["version"])
        now = served(e["model_dir"])
        state = ", served" if now == e["version"] else f", not served (version {now} is)"
    lines = [f"lineage: model {e['name']} version {e['version']} ({where}){state}",
             f"  <- train run {e['lineage']['train_fingerprint'][:16]} ({e['lineage']['train']})",
             f"  <- data snapshot {e['lineage']['data_fingerprint'][:16]} ({d['counts']['read']:,} "
             f"{'images' if d.get('kind') == 'images' else 'rows'} read, "
             + (f"{d['counts']['unlabelled']:,} unlabelled, " if d["counts"].get("unlabelled") else "")
             + f"{d['counts']['bad']:,} dead-lettered)"]
    for i in d.get("inputs", []):
        if "path" in i:
            lines.append(f"  <- {i['path']} sha256 {i['sha256'][:16]}")
        else:  # images: a folder of class folders (where it was written, for a bundled set) or a manifest
            where = i.get("folder") or i.get("manifest")
            lines.append(f"  <- {where}" + (f" (written to {i['written_to']})" if i.get("written_to") else "")
                         + f", {i.get('images', 0):,} images")
    return lines
