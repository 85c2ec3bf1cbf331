"""NumPy arrays to torch tensors, including the types NumPy holds only through ml_dtypes
(bfloat16, float8): what a frontend reads from a model file and what ``run`` is fed.

``NUMPY_OK`` lists the dtypes torch takes straight from NumPy; the others go through their
bits. Read-only or non-contiguous arrays are copied (torch must not write into a caller's
read-only memory). Nothing here knows a framework.
"""
from __future__ import annotations

import numpy as np
import torch

from ..errors import FusegraphError, ModelLoadError
from .dtype import DType

NUMPY_OK = frozenset({DType.FLOAT, DType.FLOAT16, DType.DOUBLE, DType.INT8, DType.INT16, DType.INT32,
                      DType.INT64, DType.UINT8, DType.UINT16, DType.UINT32, DType.UINT64, DType.BOOL,
                      DType.COMPLEX64, DType.COMPLEX128})


def numpy_to_torch(arr: np.ndarray, where: str = "model", name: str = "",
                   error: type[FusegraphError] = ModelLoadError) -> torch.Tensor:
    """NumPy (including ml_dtypes' bfloat16 / float8) to torch, without sharing read-only memory."""
    dtype = DType.from_numpy(arr.dtype)
    if not arr.flags.writeable or not arr.flags.c_contiguous:
        arr = np.array(arr, copy=True, order="C")  # keeps 0-d arrays 0-d (ascontiguousarray doesn't)
    if dtype in NUMPY_OK:
        return torch.from_numpy(arr)
    try:
        tdt = dtype.to_torch()
    except TypeError:
        raise error(f"{where}: tensor {name!r} has type {dtype.name}, which torch cannot hold") from None
    raw = torch.from_numpy(arr.view(np.uint8 if arr.dtype.itemsize == 1 else np.int16))
    return raw.view(tdt)
