"""Private helpers of the tensor-manipulation family (shape, indexing, generators, resize).

Build-time readers of attributes / constant inputs, symbolic-shape arithmetic for ``infer=``
functions, a per-device cache for index tensors computed once at build time, and seeded
random generators. No op is registered here. The two layout views, ``settled_strides`` and
``dense_view``, are also read by the fused ops and the CPU backend.
"""
from __future__ import annotations

import torch

from ..ir import DType
from .common import const_ints, normalize_axis
from .registry import NodeContext

INT64_MAX = (1 << 63) - 1


def ints_input_or_attr(ctx: NodeContext, i: int, attr: str, since: int):
    """(known, values) for an int list given as attribute before opset ``since``, as input after.

    ``known`` is False when the input exists but is not constant (read it at run time);
    ``values`` is None when neither attribute nor input is given.
    """
    if ctx.version < since:
        v = ctx.attr(attr, None)
        return True, None if v is None else [int(a) for a in v]
    if not ctx.has_input(i):
        return True, None
    vals = const_ints(ctx, i)
    return vals is not None, vals


def runtime_ints(t: torch.Tensor | None) -> list[int] | None:
    return None if t is None else [int(v) for v in t.reshape(-1).tolist()]


def settled_strides(x: torch.Tensor) -> torch.Tensor:
    """``x`` with the stride of each size-1 dim set to the span of the dims inside it (the
    bytes seen are the same). A view's size-1 dims may carry any stride (a reshape of a
    transposed tensor gives a batch of one the channel count's), and torch's memory-format
    test reads them: channels-last data with such a batch stride is taken for a strided
    tensor, and ``interpolate`` then runs its slow generic kernel instead of its channels-last
    one."""
    if x.dim() < 2 or 1 not in x.shape:
        return x
    strides = list(x.stride())
    spans = [st * n for st, n in zip(strides, x.shape) if n > 1]
    span = max(spans, default=1)
    for d in range(x.dim()):
        if x.shape[d] == 1:
            strides[d] = span
    return x if tuple(strides) == x.stride() else x.as_strided(x.shape, strides)


def rank_of(ctx: NodeContext, i: int = 0) -> int | None:
    s = ctx.shape(i)
    return None if s is None else len(s)


def static_dims(ctx: NodeContext, i: int = 0) -> tuple | None:
    """Input ``i``'s shape when every dim is a known int, else None."""
    s = ctx.shape(i)
    if s is None or not all(isinstance(d, int) for d in s):
        return None
    return tuple(s)


def mul_dims(dims) -> object:
    """Product of dims: an int when all static, a symbol for one symbol times 1, else None."""
    prod, sym = 1, None
    for d in dims:
        if isinstance(d, int):
            prod *= d
        elif d is None or sym is not None:
            return None
        else:
            sym = d
    if sym is None:
        return prod
    if prod == 0:
        return 0
    return sym if prod == 1 else None


def dtype_or_none(ctx: NodeContext, i: int = 0):
    d = ctx.dtype(i)
    return d if d != DType.UNDEFINED else None


def norm_axes(axes, rank: int) -> list[int]:
    return [normalize_axis(int(a), rank) for a in axes]


class DeviceCache:
    """Tensors computed once at build time (on CPU), copied once to each device used."""

    __slots__ = ("_cpu", "_by_dev")

    def __init__(self, *tensors: torch.Tensor | None):
        self._cpu = tensors
        self._by_dev: dict = {}

    def get(self, device: torch.device) -> tuple:
        got = self._by_dev.get(device)
        if got is None:
            if device.type == "meta":
                return tuple(None if t is None else t.to("meta") for t in self._cpu)
            got = tuple(None if t is None else t.to(device) for t in self._cpu)
            self._by_dev[device] = got
        return got


class SeededGenerators:
    """One torch.Generator per device, seeded from the ONNX ``seed`` attribute (None: global RNG)."""

    __slots__ = ("seed", "_gens")

    def __init__(self, seed):
        self.seed = None if seed is None else int(float(seed) * 1000003) & 0x7FFFFFFFFFFFFFFF
        self._gens: dict = {}

    def get(self, device: torch.device):
        if self.seed is None or device.type == "meta":
            return None
        g = self._gens.get(device)
        if g is None:
            g = torch.Generator(device=device)
            g.manual_seed(self.seed)
            self._gens[device] = g
        return g


def onnx_dtype_attr(ctx: NodeContext, name: str = "dtype", default: DType | None = None) -> DType | None:
    code = ctx.attr(name, None)
    if code is None:
        return default
    try:
        dt = DType(int(code))
        dt.to_torch()
    except (ValueError, TypeError):
        raise ctx.unsupported(f"{name}={code} is not a dtype torch can hold") from None
    return dt


_SIGNED_TWIN = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}


def unsigned_safe(ctx: NodeContext, kernel, inputs=(0,), outputs=(0,), ordered: bool = False):
    """Wrap a data-movement kernel so that uint16/32/64 tensors, which many torch kernels
    (index_select, gather, scatter, where, triu, cumsum) lack, travel as same-width signed
    views: the bits are unchanged, and wrap-around add/mul give the same bits either way.
    ``ordered`` also flips the sign bit, which maps unsigned order onto signed order (for
    max / min). ``inputs`` are the argument positions converted, ``outputs`` the results
    turned back. A no-op for every other dtype.
    """
    dt = ctx.dtype(inputs[0])
    if dt == DType.UNDEFINED or dt.to_torch() not in _SIGNED_TWIN:
        return kernel
    udt = dt.to_torch()
    flip = torch.iinfo(_SIGNED_TWIN[udt]).min

    def to_signed(t):
        if t is None or t.dtype != udt:
            return t
        s = t.view(_SIGNED_TWIN[udt])
        return s ^ flip if ordered else s

    def back(t):
        return (t ^ flip if ordered else t).view(udt)

    def wrapped(*args):
        out = kernel(*[to_signed(a) if i in inputs else a for i, a in enumerate(args)])
        if isinstance(out, tuple):
            return tuple(back(o) if k in outputs else o for k, o in enumerate(out))
        return back(out)
    return wrapped


def dense_view(t: torch.Tensor) -> torch.Tensor | None:
    """``t``'s elements as a one-axis view when its bytes are dense in some axis order (a
    channels-last activation), else None (the guard measures through it, the CPU backend's
    ``quantize.py`` lays its workspace out by it, a reduced-type chain takes its blocks by it)."""
    if t.is_contiguous():
        return t.view(-1)
    dims = sorted(range(t.dim()), key=lambda d: t.stride(d))
    step = 1
    for d in dims:
        if t.size(d) != 1 and t.stride(d) != step:
            return None
        step *= t.size(d)
    return t.as_strided((t.numel(),), (1,))
