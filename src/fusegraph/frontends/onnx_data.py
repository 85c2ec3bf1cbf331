"""Reading ONNX tensors into torch, including external data confined to the model's folder.

Hostile files are the concern here: external-data paths that are absolute, climb out with
``..`` or follow a symlink out of the model's folder are refused, and so is any tensor whose
declared size disagrees with the bytes behind it.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from ..errors import ModelLoadError
from ..ir import DType
from ..ir.arrays import NUMPY_OK, numpy_to_torch

_MAX_ELEMENTS = 1 << 40


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 40


def check_tensor_bytes(name: str, nbytes: int, dims, where: str) -> None:
    """Refuse a tensor that could never be held: more bytes than this machine's memory."""
    limit = _physical_memory()
    if nbytes > limit:
        raise ModelLoadError(f"{where}: tensor {name!r} declares {nbytes} bytes (dims {list(dims)}), "
                             f"more than this machine's {limit} bytes of memory")


def _declared_numel(t: onnx.TensorProto, where: str) -> int:
    n = 1
    for d in t.dims:
        if d < 0:
            raise ModelLoadError(f"{where}: tensor {t.name!r} declares a negative dim {d}")
        n *= d
    if n > _MAX_ELEMENTS:
        raise ModelLoadError(f"{where}: tensor {t.name!r} declares {n} elements (dims {list(t.dims)}), "
                             f"more than any real model holds")
    return n


def _confined_path(base_dir: Path | None, location: str, where: str, tensor: str) -> Path:
    if base_dir is None:
        raise ModelLoadError(f"{where}: tensor {tensor!r} uses external data ({location!r}) but the "
                             f"model was not loaded from a file; load it by path")
    if "\x00" in location:
        raise ModelLoadError(f"{where}: tensor {tensor!r} has external data at {location!r}: a path "
                             f"with a NUL byte is refused")
    if not location or os.path.isabs(location) or location.startswith(("/", "\\")) or ":" in location:
        raise ModelLoadError(f"{where}: tensor {tensor!r} has external data at {location!r}: absolute "
                             f"paths are refused; it must be relative to the model's folder")
    parts = Path(location.replace("\\", "/")).parts
    if ".." in parts:
        raise ModelLoadError(f"{where}: tensor {tensor!r} has external data at {location!r}: '..' "
                             f"is refused; the file must lie inside the model's folder")
    root = base_dir.resolve()
    path = (root / location).resolve()
    if root != path and root not in path.parents:
        raise ModelLoadError(f"{where}: tensor {tensor!r} has external data at {location!r}, which "
                             f"resolves (through a symlink) outside the model's folder {root}")
    if not path.is_file():
        raise ModelLoadError(f"{where}: external data file {location!r} for tensor {tensor!r} is missing")
    return path


def _read_external(t: onnx.TensorProto, base_dir: Path | None, where: str) -> np.ndarray:
    info = {e.key: e.value for e in t.external_data}
    path = _confined_path(base_dir, info.get("location", ""), where, t.name)
    try:
        offset = int(info.get("offset", 0))
        length = int(info["length"]) if "length" in info else None
    except ValueError:
        raise ModelLoadError(f"{where}: tensor {t.name!r} has a malformed external-data offset/length") from None
    dtype = DType(t.data_type)
    np_dtype = dtype.to_numpy()
    numel = _declared_numel(t, where)
    need = numel * np_dtype.itemsize
    size = path.stat().st_size
    if length is None:
        length = size - offset
    if offset < 0 or length != need or offset + length > size:
        raise ModelLoadError(f"{where}: tensor {t.name!r} declares {need} bytes (dims {list(t.dims)}, "
                             f"{dtype.name}) but its external data holds {length} bytes at offset "
                             f"{offset} of a {size}-byte file")
    check_tensor_bytes(t.name, need, t.dims, where)
    try:
        arr = np.empty(numel, dtype=np_dtype)  # read straight into the tensor's memory: one copy
        with open(path, "rb") as f:
            f.seek(offset)
            got = f.readinto(arr.view(np.uint8)) if need else 0
    except (MemoryError, OSError) as exc:
        raise ModelLoadError(f"{where}: external data of tensor {t.name!r} ({need} bytes in "
                             f"{path.name!r}) could not be read: {type(exc).__name__}: {exc}") from None
    if got != need:
        raise ModelLoadError(f"{where}: external data file {path.name!r} ended after {got} of the "
                             f"{need} bytes of tensor {t.name!r}")
    return arr.reshape(tuple(t.dims))


def tensor_to_torch(t: onnx.TensorProto, base_dir: Path | None, where: str) -> torch.Tensor:
    """Convert a TensorProto to a torch tensor, checking declared size against the data."""
    try:
        dtype = DType(t.data_type)
    except ValueError:
        raise ModelLoadError(f"{where}: tensor {t.name!r} has unknown data type {t.data_type}") from None
    if dtype == DType.STRING:
        raise ModelLoadError(f"{where}: tensor {t.name!r} holds strings, which fusegraph cannot run")
    numel = _declared_numel(t, where)
    if t.data_location == onnx.TensorProto.EXTERNAL:
        arr = _read_external(t, base_dir, where)
    else:
        if t.raw_data:
            itemsize = dtype.to_numpy().itemsize if dtype in NUMPY_OK else None
            if itemsize is not None and len(t.raw_data) != numel * itemsize:
                raise ModelLoadError(f"{where}: tensor {t.name!r} declares dims {list(t.dims)} "
                                     f"({numel * itemsize} bytes of {dtype.name}) but holds "
                                     f"{len(t.raw_data)} bytes")
        try:
            arr = numpy_helper.to_array(t)
        except Exception as exc:  # malformed payloads: wrong counts, bad types
            raise ModelLoadError(f"{where}: tensor {t.name!r} could not be read: {exc}") from None
    return numpy_to_torch(arr, where, t.name)


