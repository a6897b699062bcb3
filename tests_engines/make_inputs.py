"""The engine tests' inputs, written into the folder given: `taxi.csv`, the shipped Chicago taxi
sample with bad rows mixed in, and `images/`, class folders of small PNG and JPEG files with
corrupt ones among them. Runs in either environment (it needs Pillow and numpy only)."""

from __future__ import annotations

import io
import os
import sys

import numpy as np
from PIL import Image

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TAXI = os.path.join(ROOT, "examples", "data", "chicago_taxi", "data.csv")


def taxi(path: str) -> None:
    with open(TAXI) as f:
        header, *rows = f.read().splitlines()
    width = header.count(",") + 1
    bad = ["1,2,3",                                     # too few columns
           ",".join(["x"] * width),                     # nothing parses where numbers belong
           ",".join(["1"] * (width + 2))]               # too many columns
    out = [header]
    for i, row in enumerate(rows):
        out.append(row)
        if i % 1500 == 700:
            out.append(bad[(i // 1500) % len(bad)])
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def images(folder: str) -> None:
    rng = np.random.default_rng(36)
    for label in ("cat", "dog", "owl"):
        os.makedirs(os.path.join(folder, label), exist_ok=True)
        for i in range(40):
            h, w = int(rng.integers(12, 40)), int(rng.integers(12, 40))
            pixels = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
            buf = io.BytesIO()
            Image.fromarray(pixels).save(buf, format="PNG" if i % 2 else "JPEG", quality=90)
            data = buf.getvalue()
            if i % 13 == 5:
                data = data[: len(data) // 2]  # truncated
            elif i % 13 == 9:
                data = b"not an image at all"
            with open(os.path.join(folder, label, f"{i:03d}.{'png' if i % 2 else 'jpg'}"), "wb") as f:
                f.write(data)


if __name__ == "__main__":
    where = sys.argv[1]
    os.makedirs(where, exist_ok=True)
    taxi(os.path.join(where, "taxi.csv"))
    images(os.path.join(where, "images"))
