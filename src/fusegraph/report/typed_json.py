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
"""
from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, Union

from ..errors import ArtifactError


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _name(tp: Any) -> str:
    if tp is type(None):
        return "None"
    if isinstance(tp, type) and typing.get_origin(tp) is None:
        return "object" if dataclasses.is_dataclass(tp) or typing.is_typeddict(tp) else tp.__name__
    return str(tp).replace("typing.", "")


def _refuse(tp: Any, data: Any, path: str) -> ArtifactError:
    shown = repr(data)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return ArtifactError(f"{path}: expected {_name(tp)}, got {type(data).__name__} {shown}")


def typed(tp: Any, data: Any, path: str) -> Any:
    """``data`` (decoded JSON) as a value of annotation ``tp``; an ``ArtifactError`` naming
    ``path`` when it is not one."""
    if tp is Any:
        return data
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        options = [o for o in typing.get_args(tp) if _takes(o, data)]
        if len(options) == 1:          # the one the data's JSON kind fits: its own error, deep
            return typed(options[0], data, path)
        for option in options:
            try:
                return typed(option, data, path)
            except ArtifactError:
                continue
        raise _refuse(tp, data, path)
    if origin is list:
        if not isinstance(data, list):
            raise _refuse(tp, data, path)
        (item,) = typing.get_args(tp) or (Any,)
        return [typed(item, x, f"{path}[{i}]") for i, x in enumerate(data)]
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(data, list) or len(data) != len(args):
            raise _refuse(tp, data, path)
        return tuple(typed(a, x, f"{path}[{i}]") for i, (a, x) in enumerate(zip(args, data)))
    if origin is dict:
        key, value = typing.get_args(tp) or (str, Any)
        if not isinstance(data, dict):
            raise _refuse(tp, data, path)
        return {_key(key, k, path): typed(value, v, f"{path}[{k[:40]!r}]") for k, v in data.items()}
    if dataclasses.is_dataclass(tp):
        return _dataclass(tp, data, path)
    if typing.is_typeddict(tp):
        return _typeddict(tp, data, path)
    return _scalar(tp, data, path)


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


def _key(tp: Any, key: str, path: str) -> Any:
    if tp is int:        # JSON writes int keys as strings
        if isinstance(key, str) and key.lstrip("-").isdigit() and len(key) < 20:
            return int(key)
        raise ArtifactError(f"{path}: key {key[:40]!r} is not an integer")
    return typed(tp, key, f"{path} key")


def _scalar(tp: Any, data: Any, path: str) -> Any:
    if tp is type(None) or tp is None:
        if data is None:
            return None
    elif tp is bool:
        if isinstance(data, bool):
            return data
    elif tp is int:
        if isinstance(data, int) and not isinstance(data, bool):
            return data
    elif tp is float:
        if isinstance(data, (int, float)) and not isinstance(data, bool):
            return float(data)
    elif tp is str:
        if isinstance(data, str):
            return data
    else:
        raise ArtifactError(f"{path}: a report field of type {_name(tp)} cannot be read from JSON")
    raise _refuse(tp, data, path)


def _dataclass(cls: type, data: Any, path: str) -> Any:
    if not isinstance(data, dict):
        raise _refuse(cls, data, path)
    hints = _hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if f.name in data:
            kwargs[f.name] = typed(hints[f.name], data[f.name], f"{path}.{f.name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ArtifactError(f"{path}: field {f.name!r} is missing")
    return cls(**kwargs)


def _typeddict(cls: type, data: Any, path: str) -> dict:
    if not isinstance(data, dict):
        raise _refuse(cls, data, path)
    hints = _hints(cls)
    missing = sorted(k for k in cls.__required_keys__ if k not in data)
    if missing:
        raise ArtifactError(f"{path}: key {missing[0]!r} is missing")
    return {k: typed(hints[k], v, f"{path}.{k}") if k in hints else v for k, v in data.items()}
