"""Parse an ONNX file without copying its large weights: a walk over the protobuf wire format.

Parsing a file with inline weights the ordinary way holds them twice (the file's bytes and the
parsed message) before a third copy, the torch tensors, is even made (vgg19's peak:
benchmarks/RESULTS.md, "Figures moved out of docstrings"). ``parse_without_weights`` instead
maps the file, walks ``ModelProto.graph.initializer`` (fields 7 and 5) and leaves every
``raw_data`` (TensorProto field 9) of at least ``min_bytes`` in the file: the message it parses
holds, in its place, an external-data reference into the model file itself (``location`` = the
file's name, ``offset``, ``length``), which ``onnx_data`` reads straight into the tensor's own
memory, under the same confinement and size checks as any external data. Only headers are read;
the weight pages are never touched here.

Anything unusual (a malformed or truncated file, groups, a tensor that already has external
data, a type without a whole number of bytes per element, a symlinked file, a big-endian host)
returns None, and the caller parses the file the ordinary way, which reports errors as before.
Nothing here builds IR.
"""
from __future__ import annotations

import mmap
import sys
from pathlib import Path

_MODEL_GRAPH, _GRAPH_INITIALIZER = 7, 5
_TENSOR_DATA_TYPE, _TENSOR_RAW_DATA, _TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION = 2, 9, 13, 14
# element types with a whole number of bytes per element and a numpy dtype (onnx_data reads
# external data through numpy): float, (u)int8-64, bool, float16, double, complex
_BYTE_TYPES = frozenset({1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15})


class _Unusual(Exception):
    """The walk met something it does not handle; the caller falls back to a plain parse."""


def parse_without_weights(path: Path, min_bytes: int = 1 << 16) -> bytes | None:
    """The serialized ModelProto of ``path`` with large inline weights turned into references
    to ``path`` itself; None when the file should be parsed the ordinary way."""
    if sys.byteorder != "little" or path.is_symlink() or ":" in path.name:
        return None
    with open(path, "rb") as f:
        if path.stat().st_size == 0:
            return None
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            try:
                out, moved = _model(mm, path.name, min_bytes)
            except _Unusual:
                return None
    return bytes(out) if moved else None


def _varint(buf, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise _Unusual
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def _fields(buf, start: int, end: int):
    """(field number, wire type, value start, value end, header start) of each field."""
    pos = start
    while pos < end:
        head = pos
        key, pos = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, stop = _varint(buf, pos, end)
        elif wire == 1:
            stop = pos + 8
        elif wire == 2:
            length, pos = _varint(buf, pos, end)
            stop = pos + length
        elif wire == 5:
            stop = pos + 4
        else:  # groups (3, 4) and invalid wire types
            raise _Unusual
        if stop > end or number == 0:
            raise _Unusual
        yield number, wire, pos, stop, head
        pos = stop


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _encode_varint(number << 3 | 2) + _encode_varint(len(payload)) + payload


def _model(mm, location: str, min_bytes: int) -> tuple[bytearray, int]:
    out, moved = bytearray(), 0
    for number, wire, start, stop, head in _fields(mm, 0, len(mm)):
        if number == _MODEL_GRAPH and wire == 2:
            graph, n = _graph(mm, start, stop, location, min_bytes)
            out += _field(number, graph)
            moved += n
        else:
            out += mm[head:stop]
    return out, moved


def _graph(mm, start: int, stop: int, location: str, min_bytes: int) -> tuple[bytes, int]:
    out, moved = bytearray(), 0
    for number, wire, s, e, head in _fields(mm, start, stop):
        if number == _GRAPH_INITIALIZER and wire == 2:
            tensor = _tensor(mm, s, e, location, min_bytes)
            if tensor is not None:
                out += _field(number, tensor)
                moved += 1
                continue
        out += mm[head:e]
    return bytes(out), moved


def _tensor(mm, start: int, stop: int, location: str, min_bytes: int) -> bytes | None:
    """The tensor with its raw_data replaced by a reference, or None to keep it as it is."""
    fields = list(_fields(mm, start, stop))
    numbers = [f[0] for f in fields]
    if _TENSOR_EXTERNAL_DATA in numbers or _TENSOR_DATA_LOCATION in numbers:
        return None
    raw = [f for f in fields if f[0] == _TENSOR_RAW_DATA and f[1] == 2]
    if len(raw) != 1 or raw[0][3] - raw[0][2] < min_bytes:
        return None
    types = [_varint(mm, f[2], f[3])[0] for f in fields if f[0] == _TENSOR_DATA_TYPE and f[1] == 0]
    if len(types) != 1 or types[0] not in _BYTE_TYPES:
        return None
    _, _, offset, end, _ = raw[0]
    out = bytearray()
    for number, _, _, e, head in fields:
        if number != _TENSOR_RAW_DATA:
            out += mm[head:e]
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(end - offset))):
        out += _field(_TENSOR_EXTERNAL_DATA, _field(1, key.encode()) + _field(2, value.encode()))
    out += _encode_varint(_TENSOR_DATA_LOCATION << 3 | 0) + _encode_varint(1)  # EXTERNAL
    return bytes(out)
