"""Per-model serving settings and server-wide limits, read from a model's TOML config.

A model's ``config.toml`` is one table: the serving keys below are taken out, and every other
key maps onto ``fg.Config`` through ``fusegraph.config_file`` (so a compile config file works
here unchanged)::

    max_batch_size = 8         # 0: no dynamic batching (the default); at most 65536, and with
                               # warmup at most what fits Config.max_arena_bytes
    max_queue_delay_ms = 2.0   # how long the first request of a batch waits for company
    instances = 2              # model instances, each on its own worker thread
    batch_axis = 0             # the axis requests are stacked on (default 0)
    batch_sizes = [1, 4, 8]    # static-shape models: the sizes compiled (default 1, 2, 4, .. max)
    batch_variants = 4         # static-shape models: compiled batch sizes kept (LRU)
    warmup = false             # compile every batch size at start instead of on first use
    max_queue_size = 256       # waiting requests before new ones get 503
    level = "O2"               # ... any fg.Config field

This module only parses and checks; it loads no model. Errors are ``ConfigError`` naming the key.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..config import Config
from ..config_file import config_from_mapping
from ..errors import ConfigError

try:
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]


@dataclass(frozen=True)
class ModelSettings:
    """How one model is served (the fg.Config it is compiled with travels beside it)."""
    max_batch_size: int = 0
    max_queue_delay_ms: float = 2.0
    instances: int = 1
    batch_axis: int = 0
    batch_sizes: tuple[int, ...] = ()
    batch_variants: int = 4
    warmup: bool = False
    max_queue_size: int = 256
    compile: Config = field(default_factory=Config)

    @property
    def batching(self) -> bool:
        return self.max_batch_size > 1


@dataclass(frozen=True)
class ServerLimits:
    """Server-wide protection: body size, time a request may take (its run is stopped past it),
    drain time on SIGTERM, and how long a client may take to send a request's headers and its
    body (the connection is answered 408 and closed past them)."""
    max_request_bytes: int = 64 << 20
    timeout_s: float = 30.0
    drain_s: float = 10.0
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0


_INT_KEYS = {"max_batch_size": 0, "instances": 1, "batch_axis": 0, "batch_variants": 1, "max_queue_size": 1}
MAX_BATCH_SIZE = 1 << 16   # a batch is also bounded by what it allocates (model.ServedModel)


def settings_from_mapping(data: Mapping[str, Any], where: str = "<config>") -> ModelSettings:
    """Split ``data`` into serving keys and ``fg.Config`` keys, checking both."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: a model config must be a table of key = value")
    data = dict(data)
    values: dict[str, Any] = {}
    for key, low in _INT_KEYS.items():
        if key in data:
            value = data.pop(key)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ConfigError(f"{where}: {key} must be an integer >= {low}, got {value!r}")
            values[key] = value
    if "max_queue_delay_ms" in data:
        value = data.pop("max_queue_delay_ms")
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 10_000:
            raise ConfigError(f"{where}: max_queue_delay_ms must be a number of milliseconds in 0..10000, "
                              f"got {value!r}")
        values["max_queue_delay_ms"] = float(value)
    if "batch_sizes" in data:
        value = data.pop("batch_sizes")
        if not isinstance(value, list) or not value or not all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value):
            raise ConfigError(f"{where}: batch_sizes must be a list of positive integers, got {value!r}")
        values["batch_sizes"] = tuple(sorted(set(value)))
    if "warmup" in data:
        value = data.pop("warmup")
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: warmup must be true or false, got {value!r}")
        values["warmup"] = value
    values["compile"] = config_from_mapping(data, where)
    if values.get("max_batch_size", 0) > MAX_BATCH_SIZE:
        raise ConfigError(f"{where}: max_batch_size must be at most {MAX_BATCH_SIZE}, got {values['max_batch_size']}")
    settings = ModelSettings(**values)
    if settings.batch_sizes and max(settings.batch_sizes) > settings.max_batch_size:
        raise ConfigError(f"{where}: batch_sizes {list(settings.batch_sizes)} go above max_batch_size "
                          f"{settings.max_batch_size}")
    return settings


def load_settings(path: str | Path | None, base: ModelSettings | None = None) -> ModelSettings:
    """The settings in the TOML file at ``path`` (``base`` or the defaults when ``path`` is None)."""
    if path is None:
        return base or ModelSettings()
    path = Path(path)
    try:
        if path.stat().st_size > 1 << 20:
            raise ConfigError(f"config file {str(path)!r} is larger than 1 MiB")
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return settings_from_mapping(data, str(path))


def bound_threads(settings: ModelSettings, cpus: int | None = None) -> tuple[int, int]:
    """``(instances, threads per instance)`` with instances x threads <= the machine's cores.

    ``compile.threads`` is the wish per instance; without it the cores are split evenly.
    More instances than cores are cut to the core count (each needs at least one thread)."""
    cpus = max(1, cpus or os.cpu_count() or 1)
    instances = min(settings.instances, cpus)
    wish = settings.compile.threads or max(1, cpus // instances)
    return instances, max(1, min(wish, cpus // instances))


def replace(settings: ModelSettings, **changes) -> ModelSettings:
    return dataclasses.replace(settings, **changes)
