"""Dates and times as a column holds them: ISO-8601 text, or Parquet's date and timestamp types.

A date column is stored as text in the TFRecords and served as text, the value as the user has
it; the model parses it inside its graph (`train.kinds`) by the same rules this module states,
and a test holds the two to the same answers. What is a date:

  YYYY-MM-DD
  YYYY-MM-DD[T or space]HH:MM[:SS[.fraction]][Z or +HH:MM or +HHMM or -...]

A time without an offset is taken as UTC. Anything else in a date column is a bad row.
"""

from __future__ import annotations

import calendar
import datetime as _dt
import re
from typing import Any

import numpy as np

# The one pattern, for Python's re and TensorFlow's RE2 alike (no look-arounds, no back-references).
ISO_PATTERN = (r"(\d{4})-(\d{2})-(\d{2})"
               r"(?:[T ](\d{2}):(\d{2})(?::(\d{2})(?:\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?)?")
_ISO = re.compile(ISO_PATTERN)


def parse_seconds(text: str) -> float | None:
    """Seconds since 1970-01-01T00:00:00Z of an ISO-8601 date or time, whole seconds (a fraction
    is dropped); None when `text` is not one, or names a day that does not exist."""
    m = _ISO.fullmatch(text.strip())
    if not m:
        return None
    year, month, day = int(m[1]), int(m[2]), int(m[3])
    hour, minute, second = int(m[4] or 0), int(m[5] or 0), int(m[6] or 0)
    if not (1 <= month <= 12 and 1 <= day <= calendar.monthrange(year, month)[1]
            and hour <= 23 and minute <= 59 and second <= 59):
        return None
    offset = 0
    zone = m[7]
    if zone and zone != "Z":
        digits = zone[1:].replace(":", "")
        offset = (int(digits[:2]) * 60 + int(digits[2:])) * 60 * (1 if zone[0] == "+" else -1)
    days = days_from_civil(year, month, day)
    return float(days * 86400 + hour * 3600 + minute * 60 + second - offset)


def days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm; the graph
    computes the same integer steps)."""
    y = year - (1 if month <= 2 else 0)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def months_of_days(days: np.ndarray) -> np.ndarray:
    """The month (1-12) of each day since 1970-01-01: days_from_civil's inverse, in the integer
    steps the graph takes (train.kinds)."""
    z = days + 719468
    era = np.floor_divide(z, 146097)
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    return np.where(mp < 10, mp + 3, mp - 9)


def is_date_value(value: Any) -> bool:
    """A Parquet/JSON value of a date type (datetime.date or datetime.datetime)."""
    return isinstance(value, (_dt.date, _dt.datetime))


def iso_text(value: Any) -> str:
    """A date or timestamp value as the ISO-8601 text a date column stores: a date as
    YYYY-MM-DD; a time as YYYY-MM-DDTHH:MM:SS, converted to UTC and marked Z when it carries
    a time zone; a pandas Timestamp likewise."""
    if isinstance(value, _dt.datetime):
        if value.tzinfo is not None:
            return value.astimezone(_dt.timezone.utc).replace(tzinfo=None).isoformat(timespec="seconds") + "Z"
        return value.isoformat(timespec="seconds")
    return value.isoformat()
