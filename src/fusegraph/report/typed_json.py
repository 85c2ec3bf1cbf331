"""Reading decoded JSON back into the report's records, typed and checked against their annotations.

A stored report is untrusted input (an ``.fgm`` file can be edited and re-sealed), so each
record's ``from_dict`` goes through ``typed(annotation, data, path)``: dataclasses and
``TypedDict`` records field by field, ``list[T]``, ``tuple[A, B]``, ``dict[K, V]`` (``int``
keys, which JSON writes as strings, read back as ints), unions such as ``int | None``, and the
scalars (an ``int`` where a ``float`` is annotated is taken as that float; ``bool`` is never an
``int``). ``Any`` takes any JSON value as it is. Anything else is an ``ArtifactError`` that
names the report part (``report.memory.tensors[3].offset: expected int | None, got 'x'``), so
a malformed report is refused at load rather than crashing whoever reads it later.

Keys a record does not know are skipped (``to_dict`` adds derived ones such as
``ratio_to_lower_bound``); a ``TypedDict`` keeps them as they are, so an older reader keeps the
entries a newer writer added.

Each annotation gets its reader once per process (``_reader``: the annotation's shape taken
apart once, not at every value), and a value's path is a chain of (parent, step) tuples put
into words only for an error: a stored report of thousands of values is read at every load.
"""
from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, Callable, Union

from ..errors import ArtifactError

Reader = Callable[[Any, Any], Any]       # (data, path) -> the typed value


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _name(tp: Any) -> str:
    if tp is type(None):
        return "None"
    if isinstance(tp, type) and typing.get_origin(tp) is None:
        return "object" if dataclasses.is_dataclass(tp) or typing.is_typeddict(tp) else tp.__name__
    return str(tp).replace("typing.", "")


def _path(path: Any) -> str:
    """A path chain in words: ``report.memory.tensors[3].offset``."""
    parts = []
    while not isinstance(path, str):
        path, kind, key = path
        parts.append(f"[{key}]" if kind == "index" else f".{key}" if kind == "field" else
                     f"[{key[:40]!r}]" if kind == "key" else " key")
    return path + "".join(reversed(parts))


def _refuse(tp: Any, data: Any, path: Any) -> ArtifactError:
    shown = repr(data)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return ArtifactError(f"{_path(path)}: expected {_name(tp)}, got {type(data).__name__} {shown}")


def typed(tp: Any, data: Any, path: str) -> Any:
    """``data`` (decoded JSON) as a value of annotation ``tp``; an ``ArtifactError`` naming
    ``path`` when it is not one."""
    return _reader(tp)(data, path)


@functools.cache
def _reader(tp: Any) -> Reader:
    """The reader of annotation ``tp`` (made once; a record's field readers at its first value,
    so a record that refers to itself is read too)."""
    if tp is Any:
        return lambda data, path: data
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return _union(tp)
    if origin is list:
        return _list(tp)
    if origin is tuple:
        return _tuple(tp)
    if origin is dict:
        return _dict(tp)
    if dataclasses.is_dataclass(tp):
        return _dataclass(tp)
    if typing.is_typeddict(tp):
        return _typeddict(tp)
    return _scalar(tp)


def _union(tp: Any) -> Reader:
    options = typing.get_args(tp)
    by_kind: dict[type, tuple] = {}         # the options a JSON kind (its Python type) fits

    def read(data, path):
        fitting = by_kind.get(type(data))
        if fitting is None:
            fitting = by_kind[type(data)] = tuple(_reader(o) for o in options if _takes(o, data))
        if len(fitting) == 1:           # the one the data's JSON kind fits: its own error, deep
            return fitting[0](data, path)
        for option in fitting:
            try:
                return option(data, path)
            except ArtifactError:
                continue
        raise _refuse(tp, data, path)
    return read


def _list(tp: Any) -> Reader:
    (item,) = typing.get_args(tp) or (Any,)
    item_reader = _reader(item)

    def read(data, path):
        if not isinstance(data, list):
            raise _refuse(tp, data, path)
        return [item_reader(x, (path, "index", i)) for i, x in enumerate(data)]
    return read


def _tuple(tp: Any) -> Reader:
    readers = tuple(_reader(a) for a in typing.get_args(tp))

    def read(data, path):
        if not isinstance(data, list) or len(data) != len(readers):
            raise _refuse(tp, data, path)
        return tuple(r(x, (path, "index", i)) for i, (r, x) in enumerate(zip(readers, data)))
    return read


def _dict(tp: Any) -> Reader:
    key, value = typing.get_args(tp) or (str, Any)
    value_reader = _reader(value)
    key_reader = _int_key if key is int else _reader(key)

    def read(data, path):
        if not isinstance(data, dict):
            raise _refuse(tp, data, path)
        return {key_reader(k, (path, "of", None)): value_reader(v, (path, "key", k)) for k, v in data.items()}
    return read


def _int_key(key: Any, path: Any) -> int:
    """A dict's ``int`` key, which JSON writes as a string."""
    if isinstance(key, str) and key.lstrip("-").isdigit() and len(key) < 20:
        return int(key)
    raise ArtifactError(f"{_path(path[0])}: key {key[:40]!r} is not an integer")


def _takes(tp: Any, data: Any) -> bool:
    """Whether ``data``'s JSON kind (object, array, number, string, boolean, null) is one
    annotation ``tp`` reads: which option of a union to read it as."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return True
    if origin is dict or dataclasses.is_dataclass(tp) or typing.is_typeddict(tp):
        return isinstance(data, dict)
    if origin in (list, tuple):
        return isinstance(data, list)
    if tp is type(None) or tp is None:
        return data is None
    if tp is bool:
        return isinstance(data, bool)
    if tp in (int, float):
        return isinstance(data, (int, float)) and not isinstance(data, bool)
    return isinstance(data, str) if tp is str else True


# annotation -> (whether a JSON value is one, how it is read: None as it is): ``bool`` is never
# an ``int``, an ``int`` where a ``float`` is annotated is taken as that float
_SCALARS: dict[Any, tuple[Callable[[Any], bool], Callable[[Any], Any] | None]] = {
    type(None): (lambda d: d is None, None),
    bool: (lambda d: isinstance(d, bool), None),
    int: (lambda d: isinstance(d, int) and not isinstance(d, bool), None),
    float: (lambda d: isinstance(d, (int, float)) and not isinstance(d, bool), float),
    str: (lambda d: isinstance(d, str), None),
}


def _scalar(tp: Any) -> Reader:
    form = _SCALARS.get(type(None) if tp is None else tp)
    if form is None:
        def unreadable(data, path):
            raise ArtifactError(f"{_path(path)}: a report field of type {_name(tp)} cannot be read from JSON")
        return unreadable
    accepts, convert = form

    def read(data, path):
        if accepts(data):
            return data if convert is None else convert(data)
        raise _refuse(tp, data, path)
    return read


def _dataclass(cls: type) -> Reader:
    fields: list[tuple[str, Reader, bool]] = []

    def read(data, path):
        if not isinstance(data, dict):
            raise _refuse(cls, data, path)
        if not fields:
            hints = _hints(cls)
            fields.extend((f.name, _reader(hints[f.name]),
                           f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
                          for f in dataclasses.fields(cls) if f.init)
        kwargs = {}
        for name, field_reader, required in fields:
            if name in data:
                kwargs[name] = field_reader(data[name], (path, "field", name))
            elif required:
                raise ArtifactError(f"{_path(path)}: field {name!r} is missing")
        return cls(**kwargs)
    return read


def _typeddict(cls: type) -> Reader:
    readers: dict[str, Reader] = {}

    def read(data, path):
        if not isinstance(data, dict):
            raise _refuse(cls, data, path)
        if not readers:
            readers.update((k, _reader(t)) for k, t in _hints(cls).items())
        missing = sorted(k for k in cls.__required_keys__ if k not in data)
        if missing:
            raise ArtifactError(f"{_path(path)}: key {missing[0]!r} is missing")
        return {k: readers[k](v, (path, "field", k)) if k in readers else v for k, v in data.items()}
    return read
