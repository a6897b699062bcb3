"""What `tfpipe data` works out from the input itself, so a user's own file needs no flags:
the CSV delimiter, a decimal comma in numbers, and a folder of class folders of images.

Pure functions of text and of a local directory listing: no Beam, no TensorFlow, so the CLI
can call them before it imports either.
"""

from __future__ import annotations

import csv
import io
import os
import re

# In this order: the first one that fits wins a tie, so a plain comma CSV stays a comma CSV.
DELIMITERS = (",", ";", "\t", "|")
SAMPLE_BYTES = 64 << 10  # the head of a file read to detect its delimiter
SAMPLE_RECORDS = 50  # records after the header that vote on the delimiter
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")
_DECIMAL_COMMA = re.compile(r"^[+-]?\d*,\d+$")
_DELIMITER_NAMES = {"\t": "tab", ",": "comma", ";": "semicolon", "|": "pipe"}


def shown_delimiter(delimiter: str) -> str:
    """The delimiter as a message shows it: ',' ';' '|', and tab as \\t (a literal tab is invisible)."""
    return "'\\t'" if delimiter == "\t" else repr(delimiter)


def delimiter_name(delimiter: str) -> str:
    return _DELIMITER_NAMES.get(delimiter, repr(delimiter))


def _field_counts(text: str, delimiter: str, complete: bool) -> list[int]:
    """Fields per record of `text` split on `delimiter` (quote-aware); the last record is left
    out when the text is a cut-off head of the file (`complete` False), since it may be partial."""
    try:
        rows = list(csv.reader(io.StringIO(text), delimiter=delimiter, strict=False))
    except csv.Error:
        return []
    rows = [r for r in rows if r and r != [""]]
    if not complete and len(rows) > 1:
        rows = rows[:-1]
    return [len(r) for r in rows[: SAMPLE_RECORDS + 1]]


def detect_delimiter(head: str, complete: bool = False, prefer: str = ",") -> str:
    """The delimiter of a CSV whose first bytes are `head` (header line first).

    A candidate fits when it splits the header into more than one field and every sampled record
    into as many as the header; among those that fit, `prefer` (a .tsv file's tab) and then the
    order of DELIMITERS break the tie. When none fits every record, the one that fits most records
    wins; a one-column file is read with a comma."""
    order = [prefer] + [d for d in DELIMITERS if d != prefer]
    best, best_share = ",", 0.0
    for delimiter in order:
        counts = _field_counts(head, delimiter, complete)
        if not counts or counts[0] < 2:
            continue
        rows = counts[1:]
        share = sum(n == counts[0] for n in rows) / len(rows) if rows else 1.0
        if share == 1.0:
            return delimiter
        if share > best_share:
            best, best_share = delimiter, share
    return best


def decimal_comma_number(text: str) -> str | None:
    """'3,5' -> '3.5': a number written with a decimal comma (one comma, digits after it), else None."""
    return text.replace(",", ".") if _DECIMAL_COMMA.match(text) else None


def image_class_folders(path: str) -> list[str]:
    """The class folders of a local directory laid out as one subfolder of images per class
    (Keras's image_dataset_from_directory); [] when `path` is not such a directory."""
    if "://" in path or not os.path.isdir(path):
        return []
    classes = []
    with os.scandir(path) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            if entry.name.startswith(".") or not entry.is_dir():
                continue
            with os.scandir(entry.path) as files:
                if any(f.is_file() and f.name.lower().endswith(IMAGE_EXTENSIONS) for f in files):
                    classes.append(entry.name)
    return classes


def is_image_folder_input(inputs: list[str]) -> bool:
    """Whether --input names one local folder of class folders of images (read as --format images)."""
    return len(inputs) == 1 and bool(image_class_folders(inputs[0]))


def found_format(fmt: str, inputs: list[str]) -> str:
    """The data's format: `fmt` as given, except that auto on one folder of class folders of
    images is images (no --label needed: the folders are the classes)."""
    return "images" if fmt == "auto" and is_image_folder_input(inputs) else fmt
