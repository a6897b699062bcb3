"""Build the wheel Beam's workers install to run the data stage: tfpipe's data code alone.

    python engines/worker_wheel.py DIR      # writes DIR/tfpipe_data-VERSION-py3-none-any.whl

tfpipe's own wheel declares TensorFlow and the other stages' dependencies, which a worker would
download on start (600 MB) or, offline, fail on. This one holds the modules the data job's
workers import (`tfpipe`'s leaves and `tfpipe.pipeline`) and requires only the packages of
engines/requirements.txt besides Beam, which the worker has at its job server's version. Give it
to the job as `--extra_package DIR/tfpipe_data-...whl` (or install it into a worker image).
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import sys
import tomllib
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# what the data job imports on a worker: the package's leaves and the data stage
MODULES = {"tfpipe": ["__init__.py", "files.py", "stage.py"], "tfpipe/pipeline": None}
SOURCES = {"tfpipe": "tfpipe", "tfpipe/pipeline": "pipeline"}


def requirements() -> list[str]:
    with open(os.path.join(ROOT, "engines", "requirements.txt")) as f:
        lines = [line.split("#")[0].strip() for line in f]
    return [r for r in lines if r and not re.match(r"apache-beam\b", r)]


def build(out_dir: str) -> str:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        version = tomllib.load(f)["project"]["version"]
    name = f"tfpipe_data-{version}"
    info = f"{name}.dist-info"
    files: dict[str, bytes] = {}
    for package, only in MODULES.items():
        folder = os.path.join(ROOT, SOURCES[package])
        for fname in sorted(only or [f for f in os.listdir(folder) if f.endswith(".py")]):
            with open(os.path.join(folder, fname), "rb") as f:
                files[f"{package}/{fname}"] = f.read()
    files[f"{info}/METADATA"] = "\n".join(
        ["Metadata-Version: 2.1", "Name: tfpipe-data", f"Version: {version}",
         "Summary: tfpipe's data stage, for the workers of a Beam runner", "Requires-Python: >=3.11,<3.12",
         *[f"Requires-Dist: {r}" for r in requirements()], ""]).encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: tfpipe engines/worker_wheel.py\nRoot-Is-Purelib: true\n" \
                             b"Tag: py3-none-any\n"
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    files[f"{info}/RECORD"] = ("\n".join(record + [f"{info}/RECORD,,"]) + "\n").encode()
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{name}-py3-none-any.whl")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for arcname, data in files.items():
            z.writestr(zipfile.ZipInfo(arcname, date_time=(1980, 1, 1, 0, 0, 0)), data)
    return path


if __name__ == "__main__":
    print(build(sys.argv[1]))
