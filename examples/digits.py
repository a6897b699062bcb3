"""The digits demo's images: scikit-learn's 1,797 handwritten digits (8x8 pixels, 17 grey levels,
from the UCI ML hand-written digits data set) written out as PNG files, one folder per digit.

    python -m tfpipe.examples.digits DIR      write DIR/0/0000.png ... DIR/9/1796.png

`tfpipe data --format images --input sklearn://digits` (what examples/digits.toml says) writes
them once into tfpipe's cache folder and reads that folder like any other class-folder input.
The files are the same on every machine: same pixels, names and PNG bytes.
"""

from __future__ import annotations

import io
import os
import shutil
import sys
import tempfile

SOURCE = "sklearn://digits"


def write_pngs(out: str, replace: bool = True) -> int:
    """Write every digit as OUT/LABEL/INDEX.png (grey levels 0-16 stretched to 0-255); returns
    the number of files. The folder is built beside OUT and renamed into place; an existing OUT
    is replaced, or with `replace=False` kept (another process wrote the same files first)."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise RuntimeError("the digits demo needs scikit-learn: pip install scikit-learn") from None
    import numpy as np
    from PIL import Image

    digits = load_digits()
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".digits-", dir=parent)
    try:
        for index, (image, label) in enumerate(zip(digits.images, digits.target)):
            pixels = np.rint(image * (255 / 16)).astype(np.uint8)
            folder = os.path.join(tmp, str(int(label)))
            os.makedirs(folder, exist_ok=True)
            buffer = io.BytesIO()
            Image.fromarray(pixels, mode="L").save(buffer, format="PNG", optimize=False)
            with open(os.path.join(folder, f"{index:04d}.png"), "wb") as f:
                f.write(buffer.getvalue())
        if os.path.isdir(out) and replace:
            shutil.rmtree(out)
        try:
            os.rename(tmp, out)
        except OSError:
            if replace or not os.path.isdir(out):
                raise
            shutil.rmtree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return len(digits.images)


def cached_folder() -> str:
    """The PNG folder in tfpipe's cache ($TFPIPE_CACHE, else ~/.cache/tfpipe), written on first use."""
    import sklearn

    root = os.environ.get("TFPIPE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "tfpipe")
    folder = os.path.join(root, f"sklearn-digits-{sklearn.__version__}")
    if not os.path.isdir(folder):
        write_pngs(folder, replace=False)
    return folder


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python -m tfpipe.examples.digits DIR", file=sys.stderr)
        return 2
    n = write_pngs(args[0])
    print(f"wrote {n} PNG files into {args[0]}/0 ... {args[0]}/9")
    return 0


if __name__ == "__main__":
    sys.exit(main())
