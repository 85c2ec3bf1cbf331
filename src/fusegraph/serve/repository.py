"""The model repository: which models a server holds, and where each one's files are.

``fusegraph serve`` takes one of:

* a model file, ``MODEL.fgm`` or ``MODEL.onnx``: one model named after the file's stem, with
  the settings of ``--config`` (or the defaults);
* a folder ``REPO/`` holding one sub-folder per model, ``REPO/<name>/``, each with exactly one
  ``*.fgm`` or ``*.onnx`` file (``model.fgm`` preferred when both are there) and an optional
  ``config.toml`` (``settings.py``); ``--config`` then gives the defaults each model's own
  config file replaces.

Model names are restricted to ``[A-Za-z0-9_.-]`` so they are safe in URLs and metrics labels.
Only discovery lives here; loading is ``model.ServedModel``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, ModelLoadError
from .settings import ModelSettings, load_settings

_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")
_SUFFIXES = (".fgm", ".onnx")


@dataclass(frozen=True)
class ModelEntry:
    name: str
    path: Path
    settings: ModelSettings


def _model_file(folder: Path) -> Path:
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in _SUFFIXES)
    if not files:
        raise ModelLoadError(f"model folder {str(folder)!r} holds no .fgm or .onnx file")
    preferred = [p for p in files if p.name == "model.fgm"] or [p for p in files if p.name == "model.onnx"]
    if preferred:
        return preferred[0]
    if len(files) > 1:
        raise ModelLoadError(f"model folder {str(folder)!r} holds several model files "
                             f"({', '.join(p.name for p in files)}); keep one, or name it model.fgm / model.onnx")
    return files[0]


def _check_name(name: str, where: Path) -> str:
    if not _NAME.match(name):
        raise ConfigError(f"{str(where)!r}: model name {name!r} must be 1-128 of A-Z a-z 0-9 _ . -")
    return name


def discover(path: str | Path, config: str | Path | None = None) -> list[ModelEntry]:
    """The models to serve from ``path`` (a model file or a repository folder)."""
    path = Path(path)
    base = load_settings(config)
    if path.is_file():
        if path.suffix not in _SUFFIXES:
            raise ModelLoadError(f"{str(path)!r}: serve takes an .fgm, an .onnx or a model repository folder")
        return [ModelEntry(_check_name(path.stem, path), path, base)]
    if not path.is_dir():
        raise ModelLoadError(f"{str(path)!r} does not exist")
    entries = []
    for folder in sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".")):
        cfg = folder / "config.toml"
        settings = load_settings(cfg, base) if cfg.is_file() else base
        entries.append(ModelEntry(_check_name(folder.name, folder), _model_file(folder), settings))
    if not entries:
        raise ModelLoadError(f"model repository {str(path)!r} has no model folders (REPO/<name>/model.fgm)")
    return entries
