"""A REST request's JSON body read as TF Serving's ParseJson (rapidjson) reads it: rapidjson's error
texts for what does not parse, its limits (integers too long to be numbers, lone surrogates), and
a long document read in pieces so that no one call holds Python's interpreter lock for long. What
the parsed values mean to a signature is rest_json.py's."""

from __future__ import annotations

import json
import re

from tfpipe.serve.codecs.rest_json import TOO_BIG, json_debug
from tfpipe.serve.errors import invalid

# Python's json messages -> rapidjson's (GetParseError_En), which TF Serving reports.
_PARSE_ERRORS = [
    ("Expecting value", "Invalid value."),
    ("Expecting property name", "Missing a name for object member."),
    ("Expecting ':' delimiter", "Missing a colon after a name of object member."),
    ("Unterminated string", "Missing a closing quotation mark in string."),
    ("Invalid control character", "Invalid encoding in string."),
    ("Invalid \\escape", "Invalid escape character in string."),
    ("Invalid \\u", "Incorrect hex digit after \\u escape in string."),
]


_DECODER = json.JSONDecoder()  # raw_decode keeps no state: one for every request
_LONG_INTEGER = re.compile(r"-?\d{4301,}")  # beyond sys.get_int_max_str_digits(), Python's default limit


def parse_json(raw: bytes):
    """A request body as TF Serving's ParseJson reads it: rapidjson's error texts, and
    anything after the first complete value ignored (kParseStopWhenDoneFlag)."""
    if not raw:
        raise invalid("JSON Parse error: The document is empty")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise invalid(f"JSON Parse error: Invalid encoding in string. at offset: {e.start}") from None
    start = len(text) - len(text.lstrip(" \t\r\n"))
    if start == len(text):
        raise invalid(f"JSON Parse error: The document is empty. at offset: {start}")
    try:
        value, end = _decode(text, start)
    except json.JSONDecodeError as e:
        raise invalid(f"JSON Parse error: {_rapidjson_message(e)} at offset: {e.pos}") from None
    except ValueError:  # an integer literal of more digits than Python converts: far beyond a double
        long = _LONG_INTEGER.search(text, start)
        raise invalid(f"JSON Parse error: {TOO_BIG} at offset: {long.start() if long else 0}") from None
    except RecursionError:
        raise invalid("JSON Parse error: Terminate parsing due to Handler error. at offset: 0") from None
    if "\\u" in text:  # only an escaped code point can be half of a surrogate pair
        bad = _lone_surrogate(text, start, end)
        if bad is not None:  # Python would keep it in a str that no UTF-8 encoder takes
            raise invalid(f"JSON Parse error: The surrogate pair in string is invalid. at offset: {bad}")
    if not isinstance(value, dict):
        raise invalid(f"JSON Value: {json_debug(value)} Is not object")
    return value


# A document longer than this (characters) is parsed value by value (below); one json call on a
# shorter one holds Python's GIL for no longer than a thread switch or two.
PIECES_CHARS = 1 << 20
_SPACE = re.compile(r"[ \t\n\r]*")


def _decode(text: str, start: int):
    """(the value at `start`, where it ends), as _DECODER.raw_decode gives them. A long document is
    read in pieces, a top-level object's members one by one and each of a long array's values by a
    call of its own, so that the parse, on a REST thread, lets the loop (and every other connection)
    run between its pieces: one json call holds the GIL until it returns. A document the pieces do
    not read (an error anywhere, or another shape) is read again whole, for the same answer or error."""
    if len(text) > PIECES_CHARS:
        try:
            return _object_in_pieces(text, start)
        except Exception:  # noqa: BLE001 (read again whole: its error, with its words, is raised there)
            pass
    return _DECODER.raw_decode(text, start)


def _object_in_pieces(text: str, pos: int):
    scan = _DECODER.scan_once
    if text[pos] != "{":
        raise ValueError("not an object")
    value, (pos, done) = {}, _first_item(text, pos, "}")
    while not done:
        if text[pos] != '"':
            raise ValueError("not a key")
        key, pos = scan(text, pos)
        pos = _SPACE.match(text, pos).end()
        if text[pos] != ":":
            raise ValueError("no colon")
        pos = _SPACE.match(text, pos + 1).end()
        value[key], pos = _array_in_pieces(text, pos) if text[pos] == "[" else scan(text, pos)
        pos, done = _next_item(text, pos, "}")
    return value, pos


def _array_in_pieces(text: str, pos: int):
    scan, items = _DECODER.scan_once, []
    pos, done = _first_item(text, pos, "]")
    while not done:
        item, pos = scan(text, pos)
        items.append(item)
        pos, done = _next_item(text, pos, "]")
    return items, pos


def _first_item(text: str, pos: int, close: str) -> tuple[int, bool]:
    """At an object's or array's opening: (where its first item begins, False), or (past `close`,
    True) when it is empty."""
    pos = _SPACE.match(text, pos + 1).end()
    return (pos + 1, True) if text[pos] == close else (pos, False)


def _next_item(text: str, pos: int, close: str) -> tuple[int, bool]:
    """After an item: (where the next begins, False), or (past `close`, True)."""
    pos = _SPACE.match(text, pos).end()
    if text[pos] == close:
        return pos + 1, True
    if text[pos] != ",":
        raise ValueError("no comma")
    return _SPACE.match(text, pos + 1).end(), False


_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|.)")  # every escape of a parsed document, in order


def _lone_surrogate(text: str, start: int, end: int) -> int | None:
    """The offset of the first escaped surrogate of the document at text[start:end] that is not
    half of a pair (a high one not followed at once by an escaped low one, or a low one on its
    own), as rapidjson refuses it."""
    high_end, high_at = None, None
    for m in _ESCAPE.finditer(text, start, end):
        code = int(m[1], 16) if m[1] else None
        is_low = code is not None and 0xDC00 <= code <= 0xDFFF
        if high_at is not None:
            if not (is_low and m.start() == high_end):
                return high_at
            high_at = None
            continue
        if is_low:
            return m.start()
        if code is not None and 0xD800 <= code <= 0xDBFF:
            high_end, high_at = m.end(), m.start()
    return high_at


def _rapidjson_message(e: json.JSONDecodeError) -> str:
    if e.msg.startswith("Expecting ',' delimiter"):
        return ("Missing a comma or '}' after an object member." if _innermost(e.doc, e.pos) == "{"
                else "Missing a comma or ']' after an array element.")
    for python, rapidjson in _PARSE_ERRORS:
        if e.msg.startswith(python):
            return rapidjson
    return "Invalid value."


def _innermost(doc: str, pos: int) -> str:
    """The bracket open at `pos` ('{' or '['), strings skipped."""
    stack, in_string, escaped = [], False, False
    for ch in doc[:pos]:
        if in_string:
            escaped = not escaped and ch == "\\"
            if ch == '"' and not escaped:
                in_string = False
            continue
        if ch == '"':
            in_string, escaped = True, False
        elif ch in "[{":
            stack.append(ch)
        elif ch in "]}" and stack:
            stack.pop()
    return stack[-1] if stack else ""
