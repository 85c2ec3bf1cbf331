"""torch tensors back to NumPy, including types NumPy lacks (bfloat16, float8 via ml_dtypes);
sequences (lists of tensors) to lists of fresh arrays, an empty optional to None."""
from __future__ import annotations

import numpy as np
import torch

_VIA_BITS = {
    torch.bfloat16: ("bfloat16", torch.int16),
    torch.float8_e4m3fn: ("float8_e4m3fn", torch.uint8),
    torch.float8_e5m2: ("float8_e5m2", torch.uint8),
    torch.float8_e4m3fnuz: ("float8_e4m3fnuz", torch.uint8),
    torch.float8_e5m2fnuz: ("float8_e5m2fnuz", torch.uint8),
    torch.float8_e8m0fnu: ("float8_e8m0fnu", torch.uint8),
}
_UNSIGNED = {torch.uint16: np.uint16, torch.uint32: np.uint32, torch.uint64: np.uint64}


def to_numpy(t: torch.Tensor) -> np.ndarray:
    if t.device.type != "cpu":
        t = t.cpu()
    via = _VIA_BITS.get(t.dtype)
    if via is not None:
        import ml_dtypes
        return t.contiguous().view(via[1]).numpy().view(getattr(ml_dtypes, via[0]))
    if t.dtype in _UNSIGNED:
        return t.contiguous().view({torch.uint16: torch.int16, torch.uint32: torch.int32,
                                    torch.uint64: torch.int64}[t.dtype]).numpy().view(_UNSIGNED[t.dtype])
    return t.numpy()


def to_host(x):
    """A run's output that is not a tensor: a sequence becomes a list of arrays (copies: the
    caller never shares memory with a feed or a constant), an empty optional None."""
    if x is None:
        return None
    if isinstance(x, (list, tuple)):
        return [to_host(t) for t in x]
    return to_numpy(x.detach().clone())
