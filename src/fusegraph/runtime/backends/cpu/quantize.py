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

fusegraph's own ``QAdd`` (two int8 / uint8 tensors dequantised, added, an optional ReLU,
quantised) and ``Requantize`` (``Q(DQ(x))`` from one scale to another) run the same steps in
the same order in that workspace: each dequantised in float32 as above, the sum, then the
quantising steps. A constant second input of ``QAdd`` (a per-channel shift) is dequantised
once, when the kernel is made.

oneDNN's kernels (``dnnl/quantize.py``, one pass each) take these nodes first where their
shapes are static and their parameters constants; these run the rest (symbolic shapes, a scale
or zero point computed at run time, a quantisation to int8). Per-axis or blocked scales, other
types, a ``precision`` or ``output_dtype`` other than the default, a scale that is not one
float32 value, or a ``Requantize`` with steps decline with the reason (the op's own kernel
runs).
"""
from __future__ import annotations

import math

import torch

from ....ir import DType
from ....ops._tensor_util import dense_view
from ..protocol import Decline

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
        torch.div(x, float(s) if scale == "run" else scale, out=y)
        z = (0 if zp is None else int(zp)) if zero == "run" else (zero or 0)
        return _round_saturate_into(y, _like(buf[4 * n:], x, torch.int32), z, lo, hi, torch_type, out)
    quantize.writes_out = True
    return quantize


def _round_saturate_into(y, whole, zero: int, lo: int, hi: int, torch_type, out):
    """The rest of ``QuantizeLinear`` after the division, in place in float32 ``y``: rounded
    half to even, the zero point added, saturated; through int32 ``whole`` into ``out``."""
    y.round_()
    if zero:
        y.add_(zero)
    y.clamp_(lo, hi)
    whole.copy_(y)
    if out is None:
        out = torch.empty_like(whole, dtype=torch_type)
    out.copy_(whole)
    return out


def _dequantize_into(y, x, scale: float, zero: int):
    """``DequantizeLinear`` of ``x`` into float32 ``y`` (``y`` may broadcast ``x``)."""
    y.copy_(x)
    if zero:
        y.sub_(zero)
    y.mul_(scale)
    return y


def _requantized_type(ctx):
    """(output DType, its range) of a QAdd / Requantize, or a Decline."""
    out_type = DType(int(ctx.attr("y_type", int(DType.UINT8))))
    if out_type not in RANGES or ctx.node.outputs[0].dtype != out_type:
        return Decline(f"output type {out_type.name}, not int8 / uint8", "cpu")
    return out_type, RANGES[out_type]


def requantize_kernel(ctx, workspace):
    """fusegraph's ``Requantize``: ``Q(DQ(x))`` into planned memory, or a Decline."""
    got = _requantized_type(ctx)
    if isinstance(got, Decline):
        return got
    out_type, (lo, hi) = got
    if ctx.dtype(0) not in RANGES:
        return Decline(f"input type {ctx.dtype(0)}, not int8 / uint8", "cpu")
    if ctx.attr("steps", []):
        return Decline("steps between the dequantisation and the quantisation (the op's own kernel runs them)", "cpu")
    xs, xz = float(ctx.attr("x_scale")), int(ctx.attr("x_zero_point", 0))
    ys, yz = float(ctx.attr("y_scale")), int(ctx.attr("y_zero_point", 0))
    torch_type = out_type.to_torch()

    def requantize(x, out=None):
        n = x.numel()
        buf = workspace.at_least(8 * max(n, 1))
        y = _dequantize_into(_like(buf, x, torch.float32), x, xs, xz)
        y.div_(ys)
        return _round_saturate_into(y, _like(buf[4 * n:], x, torch.int32), yz, lo, hi, torch_type, out)
    requantize.writes_out = True
    return requantize


def qadd_kernel(ctx, workspace):
    """fusegraph's ``QAdd``: ``Q(act(DQ(a) + DQ(b)))`` into planned memory, or a Decline. One
    input has the output's shape; the other may broadcast."""
    got = _requantized_type(ctx)
    if isinstance(got, Decline):
        return got
    out_type, (lo, hi) = got
    if ctx.dtype(0) not in RANGES or ctx.dtype(1) not in RANGES:
        return Decline("inputs that are not int8 / uint8", "cpu")
    whole_shape = tuple(ctx.node.outputs[0].shape or ())
    full = [ctx.shape(i) is not None and tuple(ctx.shape(i)) == whole_shape for i in (0, 1)]
    if not any(full):
        return Decline("both inputs broadcast to the output's shape", "cpu")
    first = 0 if full[0] else 1          # the sum is the same either way round: the full-shaped one first
    second = 1 - first
    a_s, a_z = float(ctx.attr("ab"[first] + "_scale")), int(ctx.attr("ab"[first] + "_zero_point", 0))
    b_s, b_z = float(ctx.attr("ab"[second] + "_scale")), int(ctx.attr("ab"[second] + "_zero_point", 0))
    ys, yz = float(ctx.attr("y_scale")), int(ctx.attr("y_zero_point", 0))
    act = str(ctx.attr("activation", ""))
    if act not in ("", "relu"):
        return Decline(f"activation {act!r}", "cpu")
    torch_type = out_type.to_torch()
    b_const = ctx.const(second)
    shift = None
    if b_const is not None:       # dequantised once, as the op's own kernel does it every run
        shift = _dequantize_into(torch.empty(b_const.shape, dtype=torch.float32), b_const, b_s, b_z)

    def qadd(*inputs, out=None):
        a, b = inputs[first], inputs[second]
        n = a.numel()
        wide = shift is None and b.numel() == n
        buf = workspace.at_least((12 if wide else 8) * max(n, 1))
        y = _dequantize_into(_like(buf, a, torch.float32), a, a_s, a_z)
        if shift is not None:
            y.add_(shift)
        elif wide:
            y.add_(_dequantize_into(_like(buf[8 * n:], b, torch.float32), b, b_s, b_z))
        else:
            y.add_(_dequantize_into(torch.empty(b.shape, dtype=torch.float32), b, b_s, b_z))
        if act:
            y.relu_()
        y.div_(ys)
        return _round_saturate_into(y, _like(buf[4 * n:], a, torch.int32), yz, lo, hi, torch_type, out)
    qadd.writes_out = True
    return qadd


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
        z = (0 if zp is None else int(zp)) if zero == "run" else (zero or 0)
        return _dequantize_into(out, x, float(s) if scale == "run" else scale, z)
    dequantize.writes_out = True
    return dequantize
