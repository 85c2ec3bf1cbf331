"""Decoding a request's JSON in bounded time slices and bounded memory (the HTTP front end
runs it on a worker thread, so the event loop keeps answering meanwhile).

A KServe JSON body is small apart from its tensors' ``data`` arrays; ``json.loads`` parses the
whole document in one call into C (run on the event loop, nothing else was answered
meanwhile) and makes a Python float object of every number (figures: benchmarks/RESULTS.md,
"Decoding a large JSON request"). ``loads`` walks the structure itself: objects and
small values through the json module's C scanner, and every long flat array of numbers
through numpy (``np.fromstring``, which parses without holding the interpreter, into 8 bytes
per number), in slices of ``SLICE`` characters. Such an array comes back as a float64 (any
``.``, ``e`` or ``E`` in it) or int64 numpy array; its numbers are read as numpy reads them
(``+1``, ``.5`` and ``1.`` pass, which strict JSON refuses; a token numpy cannot read fails the
count check). Integers of 19 digits or more take the exact path (Python ints). Documents nested
deeper than ``MAX_DEPTH`` are refused (``ValueError``) before the interpreter's recursion
limit. Everything else is what ``json.loads`` accepts (``NaN`` and ``Infinity`` tokens too).
"""
from __future__ import annotations

import codecs
import json
import re
import warnings
from json import scanner as _json_scanner
from typing import Any

import numpy as np

MAX_DEPTH = 64
SLICE = 1 << 18              # characters parsed per call into C: each call holds the GIL briefly
SMALL = 4096                 # flat arrays shorter than this go through json's C scanner whole

_WS = re.compile(r"[ \t\n\r]*")
_NUMBERS = re.compile(r"[-+0-9.eE, \t\n\r]*")
_LONG_INT = re.compile(r"[0-9]{19}")
_C_SCAN = _json_scanner.make_scanner(json.JSONDecoder())   # C when available

# np.fromstring says so (once per call site) when a token is not a number; the count check
# below refuses such an array, so the warning is only noise in the server's log
warnings.filterwarnings("ignore", message="string or file could not be read to its end",
                        category=DeprecationWarning)


def loads(body: bytes | str) -> Any:
    """The JSON document ``body`` (UTF-8 bytes or text); ``ValueError`` when it is not JSON."""
    text = _text(body) if isinstance(body, (bytes, bytearray, memoryview)) else body
    value, end = _value(text, 0, 0)
    end = _WS.match(text, end).end()
    if end != len(text):
        raise ValueError(f"extra data at character {end}")
    return value


def _text(body) -> str:
    """UTF-8 bytes to text, a slice at a time."""
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    data = memoryview(body)
    parts = [decoder.decode(data[i:i + 4 * SLICE]) for i in range(0, len(data), 4 * SLICE)]
    parts.append(decoder.decode(b"", final=True))
    return "".join(parts)


def _value(s: str, i: int, depth: int):
    i = _WS.match(s, i).end()
    c = s[i:i + 1]
    if c == "[":
        return _array(s, i + 1, depth + 1)
    if c == "{":
        return _object(s, i + 1, depth + 1)
    try:
        return _C_SCAN(s, i)
    except StopIteration:
        raise ValueError(f"expecting a value at character {i}") from None


def _deep(depth: int, i: int) -> None:
    if depth > MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels at character {i}")


def _object(s: str, i: int, depth: int):
    _deep(depth, i)
    out: dict[str, Any] = {}
    i = _WS.match(s, i).end()
    if s[i:i + 1] == "}":
        return out, i + 1
    while True:
        i = _WS.match(s, i).end()
        if s[i:i + 1] != '"':
            raise ValueError(f"expecting a property name in double quotes at character {i}")
        key, i = _C_SCAN(s, i)
        i = _WS.match(s, i).end()
        if s[i:i + 1] != ":":
            raise ValueError(f"expecting ':' at character {i}")
        out[key], i = _value(s, i + 1, depth)
        i = _WS.match(s, i).end()
        c = s[i:i + 1]
        if c == "}":
            return out, i + 1
        if c != ",":
            raise ValueError(f"expecting ',' or '}}' at character {i}")
        i += 1


def _array(s: str, i: int, depth: int):
    _deep(depth, i)
    stop = _numbers_end(s, i)
    if s[stop:stop + 1] == "]":                    # a flat array of numbers (or an empty one)
        floating = any(s.find(c, i, stop) >= 0 for c in ".eE")
        if stop - i < SMALL or (not floating and _LONG_INT.search(s, i, stop)):
            try:
                return json.loads(s[i - 1:stop + 1]), stop + 1
            except ValueError as exc:
                raise ValueError(f"{exc} (in the array at character {i - 1})") from None
        return _numbers(s, i, stop, floating), stop + 1
    out: list = []
    i = _WS.match(s, i).end()
    if s[i:i + 1] == "]":
        return out, i + 1
    while True:
        item, i = _value(s, i, depth)
        out.append(item)
        i = _WS.match(s, i).end()
        c = s[i:i + 1]
        if c == "]":
            return out, i + 1
        if c != ",":
            raise ValueError(f"expecting ',' or ']' at character {i}")
        i += 1


def _numbers_end(s: str, i: int) -> int:
    """Where the run of number characters from ``i`` ends (matched a slice at a time)."""
    while True:
        limit = min(len(s), i + 4 * SLICE)
        end = _NUMBERS.match(s, i, limit).end()
        if end < limit or limit == len(s):
            return end
        i = end


def _numbers(s: str, start: int, stop: int, floating: bool) -> np.ndarray:
    """The numbers between ``start`` and ``stop`` (a comma-separated list), parsed by numpy a
    slice at a time as float64 (``floating``) or int64; every element must parse (the count is
    checked)."""
    dtype = np.float64 if floating else np.int64
    parts, i, count = [], start, 0
    while i < stop:
        j = stop if stop - i <= SLICE else s.rfind(",", i, i + SLICE) + 1
        if j <= i:
            raise ValueError(f"a number of more than {SLICE} characters at character {i}")
        piece = s[i:j - 1] if j < stop else s[i:j]       # (the comma a slice ends at is dropped)
        want = piece.count(",") + 1 if piece.strip() else 0
        try:
            got = np.fromstring(piece, dtype=dtype, sep=",") if want else np.empty(0, dtype)
        except ValueError:
            got = None
        if got is None or got.size != want:
            raise ValueError(f"invalid number in the array at character {start - 1}")
        parts.append(got)
        count += want
        i = j
    return np.concatenate(parts) if len(parts) != 1 else parts[0]
