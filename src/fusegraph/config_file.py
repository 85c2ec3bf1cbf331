"""Config files: a TOML document maps one-to-one onto ``fg.Config``.

Every top-level key is a ``Config`` field name, with the field's value::

    level = "O2"
    streams = 2
    memory = "tight"
    disabled_passes = ["cse"]
    tensor_lifetimes = [["x", 0, 3]]
    reuse_groups = [["a", "b"]]
    op_precision = { Conv_0 = "fp16" }     # or [["Conv_0", "fp16"]]

An unknown key, a nested table where a value belongs, or a value of the wrong type is a
``ConfigError`` that names the key. Types are checked against ``Config``'s annotations, so a new
field needs no change here. ``None`` has no TOML form: leave the key out to keep the default.
This module reads and writes text only; the values themselves are validated by ``Config``.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from pathlib import Path
from typing import Any, Mapping

from .config import Config
from .errors import ConfigError

try:
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

_MAX_FILE_BYTES = 1 << 20


def load_config(path: str | Path) -> Config:
    """Read a TOML config file into a ``Config``."""
    path = Path(path)
    try:
        if path.stat().st_size > _MAX_FILE_BYTES:
            raise ConfigError(f"config file {str(path)!r} is larger than 1 MiB")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc}") from None
    return config_from_toml(text, where=str(path))


def config_from_toml(text: str, where: str = "<config>") -> Config:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: not valid TOML: {exc}") from None
    return config_from_mapping(data, where)


def config_from_mapping(data: Any, where: str = "<config>") -> Config:
    """A ``Config`` from plain data (TOML, JSON), every value type-checked against the field."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: a config must be a table of field = value, got {type(data).__name__}")
    hints = _hints()
    fields = {f.name for f in dataclasses.fields(Config)}
    values = {}
    for key, value in data.items():
        if key not in fields:
            try:
                Config.from_dict({key: value})  # raises the ConfigError naming the key
            except ConfigError as exc:
                raise ConfigError(f"{where}: {exc}") from None
        values[key] = _check(value, hints[key], key, where)
    try:
        return Config(**values)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


@functools.lru_cache(maxsize=1)
def _hints() -> dict:
    return typing.get_type_hints(Config)


def _type_name(tp) -> str:
    if typing.get_origin(tp) is None and hasattr(tp, "__name__"):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _check(value: Any, tp, key: str, where: str) -> Any:
    """``value`` converted to ``tp`` (lists become tuples), or a ConfigError naming ``key``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        for option in args:
            try:
                return _check(value, option, key, where)
            except ConfigError:
                continue
        raise ConfigError(f"{where}: {key} must be {_type_name(tp)}, got {value!r}")
    if tp is type(None):
        if value is None:
            return None
    elif origin is tuple:
        if isinstance(value, Mapping) and len(args) == 2 and args[1] is Ellipsis \
                and typing.get_origin(args[0]) is tuple:
            value = [list(kv) for kv in value.items()]  # {name = "fp16"} for pairs
        if isinstance(value, (list, tuple)):
            if len(args) == 2 and args[1] is Ellipsis:
                return tuple(_check(v, args[0], f"{key}[{i}]", where) for i, v in enumerate(value))
            if len(value) == len(args):
                return tuple(_check(v, a, f"{key}[{i}]", where) for i, (v, a) in enumerate(zip(value, args)))
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp in (str, bool, float):
        if isinstance(value, tp):
            return value
    elif tp is Any:
        return value
    if isinstance(value, Mapping):
        raise ConfigError(f"{where}: {key} must be {_type_name(tp)}, got a table "
                          f"(unknown key(s): {', '.join(f'{key}.{k}' for k in value)})")
    raise ConfigError(f"{where}: {key} must be {_type_name(tp)}, got {value!r}")


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise ConfigError(f"cannot write a {type(value).__name__} to TOML")


def config_to_toml(config: Config) -> str:
    """The TOML text of ``config`` (fields left at ``None`` are omitted); inverse of the reader."""
    lines = [f"{k} = {_toml_value(v)}" for k, v in config.to_dict().items() if v is not None]
    return "\n".join(lines) + "\n"
