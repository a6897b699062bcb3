"""Excel workbooks (.xlsx, .xlsm) as data stage inputs: the first sheet is written once as CSV and
read as any CSV is. Its first non-empty row is the header; an empty row is left out; a cell's
value is what Excel last computed (a formula's cached result), dates and times in ISO-8601, a
number as Python writes it (whole numbers without a decimal point). The CSV goes into the temp
directory under the workbook's content hash, so the same workbook is converted once and the data
stage's cache sees the same file."""

from __future__ import annotations

import csv
import datetime as dt
import os
import tempfile

from tfpipe.files import atomic_file, file_sha256
from tfpipe.pipeline.errors import DataError

WORKBOOK_EXTENSIONS = (".xlsx", ".xlsm")
OLD_WORKBOOK_EXTENSIONS = (".xls",)


def is_workbook(path: str) -> bool:
    return path.lower().endswith(WORKBOOK_EXTENSIONS + OLD_WORKBOOK_EXTENSIONS)


def sheet_as_csv(path: str) -> str:
    """The path of a CSV holding the workbook's first sheet (written when missing)."""
    if path.lower().endswith(OLD_WORKBOOK_EXTENSIONS):
        raise DataError(f"input {path} is an Excel 97-2003 workbook (.xls), which tfpipe does not read: save it "
                        "as .xlsx (Excel Workbook) or as CSV UTF-8, and give that file")
    digest = file_sha256(path)
    if digest is None:
        raise DataError(f"input {path} cannot be read")
    stem = os.path.splitext(os.path.basename(path))[0]
    out = os.path.join(tempfile.gettempdir(), "tfpipe-sheets", digest[:24], f"{stem}.csv")
    if os.path.exists(out):
        return out
    import openpyxl

    try:
        book = openpyxl.load_workbook(path, read_only=True, data_only=True)
    except Exception as e:  # a corrupt file, or another format under the extension
        raise DataError(f"input {path} is not a readable Excel workbook: {type(e).__name__}: {e}") from None
    try:
        sheet = book.worksheets[0]
        with atomic_file(out, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            width = None
            for row in sheet.iter_rows(values_only=True):
                if all(v is None or v == "" for v in row):
                    continue
                cells = [_text(v) for v in row]
                if width is None:  # the header: its last named column ends the table
                    while cells and cells[-1] == "":
                        cells.pop()
                    width = len(cells)
                writer.writerow((cells + [""] * width)[:width])
            if width is None:  # nothing is written
                raise DataError(f"input {path}: the first sheet ('{sheet.title}') is empty")
    finally:
        book.close()
    return out


def _text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, dt.datetime):
        return value.date().isoformat() if value.time() == dt.time() else value.isoformat()
    if isinstance(value, (dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 2 ** 53 else repr(value)
    return str(value)
