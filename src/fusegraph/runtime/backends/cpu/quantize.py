"""``QuantizeLinear`` / ``DequantizeLinear`` with one scale and one zero point for the whole
tensor (what a QDQ file writes around every float op between two int8 products), float32 to
int8 / uint8 and back, written into planned memory through the thread's workspace.

The op's own kernels (``ops/quant.py``) make a new tensor at each step: divide, round, add the
zero point, saturate, convert. At an activation of a few megabytes each of those is an
allocation and its page faults, every run. Here, quantising: ``x / scale`` (true division, as
ONNX writes it: a reciprocal would round some ties the other way) into float32 workspace,
rounded half to even, the zero point added and saturated in place, converted through int32
(exact: integers in range; the direct float to 8-bit conversion is the slower one) into the
output's bytes. Dequantising: the integers converted into the output's float32 bytes, less
the zero point, times the scale, in the reference's order (``(x - zp) * scale`` in float32).
NaN and infinities go where the op's own kernel sends them (an infinity saturates).

Per-axis or blocked scales, other types, a ``precision`` or ``output_dtype`` other than the
default, or a scale that is not one float32 value decline with the reason (the op's own kernel
runs).
"""
from __future__ import annotations

import math

import torch

from ....ir import DType
from ..protocol import Decline
from .guard import dense_view

RANGES = {DType.UINT8: (0, 255), DType.INT8: (-128, 127)}


def _scalar(ctx, index: int, what: str, dtypes: tuple[DType, ...]):
    """The constant value of a one-element input as a Python number, None for an absent
    input, or a Decline; an input computed at run time is read at each call (``"run"``)."""
    if not ctx.has_input(index):
        return None
    dt, shape = ctx.dtype(index), ctx.shape(index)
    if dt not in dtypes:
        return Decline(f"{what} is {dt.name if dt is not None else 'of unknown type'}, not "
                       f"{' / '.join(d.name for d in dtypes)}", "cpu")
    if shape is None or not all(isinstance(d, int) for d in shape) or math.prod(shape) != 1:
        return Decline(f"{what} is not one value for the whole tensor (shape {shape})", "cpu")
    t = ctx.const(index)
    if t is None:
        return "run"
    return float(t.reshape(())) if dt == DType.FLOAT else int(t.reshape(()))


def _parameters(ctx, int_type: DType):
    """(scale, zero point) of the node (``_scalar``'s values), or the first one's Decline."""
    scale = _scalar(ctx, 1, "the scale", (DType.FLOAT,))
    zero = _scalar(ctx, 2, "the zero point", (int_type,))
    return next((p for p in (scale, zero) if isinstance(p, Decline)), (scale, zero))


def _like(buf: torch.Tensor, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x.numel()`` elements of ``buf`` as a ``dtype`` tensor laid out as ``x`` (its strides
    where its bytes are dense in some axis order, a channels-last activation; else row-major)."""
    flat = buf[:x.numel() * dtype.itemsize].view(dtype)
    if x.is_contiguous() or dense_view(x) is None:
        return flat.view(x.shape)
    return flat.as_strided(x.shape, x.stride())


def quantize_kernel(ctx, workspace):
    """The node's kernel, or a Decline saying why the op's own runs."""
    if int(ctx.attr("precision", 0)) or int(ctx.attr("block_size", 0)):
        return Decline("a precision or block size attribute", "cpu")
    if ctx.dtype(0) != DType.FLOAT:
        return Decline(f"input is {ctx.dtype(0)}, not float32", "cpu")
    out_type = ctx.node.outputs[0].dtype
    if out_type not in RANGES:
        return Decline(f"output type {out_type}, not int8 / uint8", "cpu")
    params = _parameters(ctx, out_type)
    if isinstance(params, Decline):
        return params
    scale, zero = params
    lo, hi = RANGES[out_type]
    torch_type = out_type.to_torch()

    def quantize(x, s, zp=None, out=None):
        n = x.numel()
        buf = workspace.at_least(8 * max(n, 1))
        y = _like(buf, x, torch.float32)
        whole = _like(buf[4 * n:], x, torch.int32)
        torch.div(x, float(s) if scale == "run" else scale, out=y)
        y.round_()
        z = (0 if zp is None else int(zp)) if zero == "run" else (zero or 0)
        if z:
            y.add_(z)
        y.clamp_(lo, hi)
        whole.copy_(y)
        if out is None:
            out = torch.empty_like(whole, dtype=torch_type)
        out.copy_(whole)
        return out
    quantize.writes_out = True
    return quantize


def dequantize_kernel(ctx):
    """The node's kernel, or a Decline saying why the op's own runs."""
    if int(ctx.attr("block_size", 0)):
        return Decline("a block size attribute", "cpu")
    in_type = ctx.dtype(0)
    if in_type not in RANGES:
        return Decline(f"input type {in_type}, not int8 / uint8", "cpu")
    if ctx.node.outputs[0].dtype != DType.FLOAT:
        return Decline(f"output type {ctx.node.outputs[0].dtype}, not float32", "cpu")
    params = _parameters(ctx, in_type)
    if isinstance(params, Decline):
        return params
    scale, zero = params

    def dequantize(x, s, zp=None, out=None):
        if out is None:
            out = torch.empty_like(x, dtype=torch.float32)
        out.copy_(x)
        z = (0 if zp is None else int(zp)) if zero == "run" else (zero or 0)
        if z:
            out.sub_(z)
        out.mul_(float(s) if scale == "run" else scale)
        return out
    dequantize.writes_out = True
    return dequantize
