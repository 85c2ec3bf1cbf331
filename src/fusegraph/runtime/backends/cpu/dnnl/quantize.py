"""A QDQ file's per-tensor quantisation nodes of static shape as oneDNN primitives, each one
pass over its tensor in the reference's float32 steps and order (the CPU backend's torch
kernels, ``../quantize.py``, make three to ten; they run what declines here):

- ``QuantizeLinear`` (float32 to uint8): ``x / scale`` by a binary primitive's division (a true
  division, as ONNX writes it: a reciprocal would round some ties the other way), then post-ops
  ``round`` (half to even) and ``+ zero point`` (exact on integers), and the conversion to
  uint8, which saturates (an infinity too). ``DynamicQuantizeLinear`` runs the same primitive
  after its range (one ``aminmax``), its scale and zero point refilled per call. A NaN becomes 0,
  as the op's own kernel gives it. An int8 output declines: oneDNN converts NaN to 127 there,
  the op's own kernel to 0.
- ``DequantizeLinear`` (uint8 / int8 to float32): a reorder with a source scale and zero point,
  ``(x - zp) * scale`` rounded once (oneDNN's binary primitive has only its reference kernel
  from an 8-bit source to float32 here).
- fusegraph's ``Requantize`` (``Q(DQ(x) [op c ...])``): a binary primitive over the integer
  source, ``x - zp`` (or ``x * scale``), then binary post-ops: the scale, the steps by their
  constants, ``/ y_scale``, and the quantising tail above.
- fusegraph's ``QAdd`` (``Q(act(DQ(a) + DQ(b)))``): the same over the full-shaped input, the
  other added as a binary post-op: a constant one dequantised once, a run-time one by the
  dequantising reorder into this thread's buffer first (``QAddKernel``).

An integer source makes no NaN, so ``Requantize`` and ``QAdd`` write int8 too (``Requantize``
unless a step's constant is not finite or divides by zero). Every kernel reads and writes the
values' own layouts (channels-last activations too). A scale or zero point computed at run
time, another type, a per-axis or blocked scale, a symbolic shape, an input that broadcasts at
run time, or only oneDNN's reference implementation decline with the reason.
"""
from __future__ import annotations

import math

import torch

from .....ir import DType
from .....ops.quant import dynamic_quantize_params
from .....ops.quantized import QUANTISED, affine_steps
from ...protocol import Decline
from ..guard import extremes
from . import capi
from .call import DnnlKernel, Slot
from .int8_support import QuantArgs
from .layouts import static_shape, strides_of
from .memory import MemDesc, Memory
from .primitive import Attr, create


def _constant_scalar(ctx, index: int, what: str):
    """The constant one-element input ``index`` as a float, 0.0 where it is absent, or a
    Decline."""
    if not ctx.has_input(index):
        return 0.0
    t = ctx.const(index)
    if t is None:
        return Decline(f"{what} is computed at run time", "dnnl")
    if t.numel() != 1:
        return Decline(f"{what} is not one value for the whole tensor (shape {tuple(t.shape)})", "dnnl")
    return float(t.reshape(()))


def _parameters(ctx):
    """(scale, zero point) as floats, or a Decline."""
    if int(ctx.attr("block_size", 0)) or int(ctx.attr("precision", 0)):
        return Decline("a block size or precision attribute", "dnnl")
    scale = _constant_scalar(ctx, 1, "the scale")
    zero = _constant_scalar(ctx, 2, "the zero point")
    for p in (scale, zero):
        if isinstance(p, Decline):
            return p
    if ctx.has_input(1) and ctx.dtype(1) != DType.FLOAT:
        return Decline(f"the scale is {ctx.dtype(1)}, not float32", "dnnl")
    if not math.isfinite(scale) or scale == 0.0:
        return Decline(f"scale {scale}", "dnnl")
    return scale, zero


def _static_geometry(ctx):
    """(shape, input strides, output strides) of a node whose input and output have one static
    shape, or a Decline."""
    x_v, y_v = ctx.node.inputs[0], ctx.node.outputs[0]
    xs = static_shape(x_v)
    if xs is None or not xs or static_shape(y_v) != xs:
        return Decline("needs an input and output of one static shape (rank 1 or more)", "dnnl")
    return xs, strides_of(x_v), strides_of(y_v)


def _quantising_tail(y_scale: float, y_zero: float) -> list:
    """The post-ops that quantise a float32 value: ``/ y_scale`` (a binary ``div`` by a scalar,
    whose operand ``_binary`` binds), rounded half to even, the zero point added."""
    return [("div", y_scale), ("eltwise", "round", 0.0, 0.0)] + \
        ([("eltwise", "linear", 1.0, float(y_zero))] if y_zero else [])


def _binary(rank: int, src0: MemDesc, alg: str, operand, post: list, dst: MemDesc, what: str):
    """A binary primitive ``src0 alg operand`` (a scalar) with ``post``: eltwise post-ops as
    ``Attr`` takes them, ``(alg, scalar)`` binary ones by a scalar, ``(alg, MemDesc)`` binary
    ones by a tensor given at run time. A scalar is a number, or a one-element float32 tensor
    of ``rank`` dims that the caller may refill between calls. Returns (primitive, its
    constant arguments, what they point at) or a Decline."""
    scalar_shape = (1,) * rank
    scalar_md = MemDesc.of(scalar_shape, torch.float32)

    def scalar(v) -> torch.Tensor:
        if isinstance(v, torch.Tensor):
            return v
        return torch.tensor([float(v)], dtype=torch.float32).reshape(scalar_shape)
    held = [scalar(operand), scalar_md]
    consts = [(capi.ARG_SRC_1, Memory(scalar_md, held[0].data_ptr()))]
    post_ops = []
    for j, op in enumerate(post):
        if op[0] == "eltwise":
            post_ops.append(op)
        elif isinstance(op[1], MemDesc):
            post_ops.append(("binary", op[0], op[1]))
        else:
            t = scalar(op[1])
            held.append(t)
            post_ops.append(("binary", op[0], scalar_md))
            consts.append((capi.arg_post_op_src1(j), Memory(scalar_md, t.data_ptr())))
    attr = Attr(post_ops)
    held.append(attr)
    lib = capi.load()
    try:
        prim = create(what, lambda pd: lib.binary_primitive_desc_create(
            pd, lib.engine, capi.BINARY[alg], src0.handle, scalar_md.handle, dst.handle, attr.handle))
    except capi.DnnlError as exc:
        return Decline(f"oneDNN has no binary primitive for this node: {exc}", "dnnl")
    if prim.is_reference:
        return Decline(f"oneDNN offers only its reference binary primitive ({prim.impl})", "dnnl")
    return prim, consts, tuple(held)


def _dequantising_head(zero: float, scale: float) -> tuple[str, float, list]:
    """(algorithm, operand, post-ops) that dequantise an integer source in float32:
    ``(x - zero) * scale``, or ``x * scale`` without a zero point."""
    return ("sub", zero, [("mul", scale)]) if zero else ("mul", scale, [])


def quantize_kernel(ctx, resources):
    """``QuantizeLinear`` float32 -> uint8 as one binary primitive, or a Decline."""
    if ctx.dtype(0) != DType.FLOAT:
        return Decline(f"input is {ctx.dtype(0)}, not float32", "dnnl")
    out_type = ctx.node.outputs[0].dtype
    if out_type != DType.UINT8:
        return Decline(f"output type {out_type}: oneDNN converts NaN to the largest int8, the op to 0 "
                       f"(only uint8 runs here)", "dnnl")
    params = _parameters(ctx)
    if isinstance(params, Decline):
        return params
    scale, zero = params
    if not 0 <= zero <= 255:
        return Decline(f"zero point {zero} outside uint8", "dnnl")
    return _uint8_quantiser(ctx, resources, scale, zero)


def _uint8_quantiser(ctx, resources, scale, zero):
    """The node's float32 input quantised into uint8 by one binary primitive: ``x / scale``,
    rounded half to even, ``+ zero`` (each a number, or a one-element tensor of the input's
    rank refilled between calls), saturated; a ``DnnlKernel`` or a Decline."""
    geometry = _static_geometry(ctx)
    if isinstance(geometry, Decline):
        return geometry
    xs, x_strides, y_strides = geometry
    x_md, y_md = MemDesc.of(xs, torch.float32, x_strides), MemDesc.of(xs, torch.uint8, y_strides)
    post = [("eltwise", "round", 0.0, 0.0)] + ([("add", zero)] if isinstance(zero, torch.Tensor) or zero else [])
    made = _binary(len(xs), x_md, "div", scale, post, y_md, "quantize")
    if isinstance(made, Decline):
        return made
    prim, consts, held = made
    return DnnlKernel(prim, [Slot(capi.ARG_SRC, xs, x_strides, torch.float32, x_md)],
                      Slot(capi.ARG_DST, xs, y_strides, torch.uint8, y_md), consts, resources, (0,), keep=held)


def dequantize_kernel(ctx, resources):
    """``DequantizeLinear`` uint8 / int8 -> float32 as one reorder with a source scale and zero
    point, or a Decline."""
    if ctx.dtype(0) not in (DType.UINT8, DType.INT8):
        return Decline(f"input type {ctx.dtype(0)}, not int8 / uint8", "dnnl")
    if ctx.node.outputs[0].dtype != DType.FLOAT:
        return Decline(f"output type {ctx.node.outputs[0].dtype}, not float32", "dnnl")
    params = _parameters(ctx)
    if isinstance(params, Decline):
        return params
    geometry = _static_geometry(ctx)
    if isinstance(geometry, Decline):
        return geometry
    xs, x_strides, y_strides = geometry
    return _dequantizer(xs, x_strides, ctx.dtype(0).to_torch(), y_strides, *params, resources)


def dynamic_quantize_kernel(ctx, opdef, resources):
    """``DynamicQuantizeLinear`` of a float32 input of static shape: its range by one
    ``aminmax``, the scale and zero point as the reference computes them
    (``ops/quant.py``'s ``dynamic_quantize_params``), then one binary primitive whose scalar
    operands (the scale, the zero point) are refilled each call; or a Decline."""
    if ctx.dtype(0) != DType.FLOAT:
        return Decline(f"input is {ctx.dtype(0)}, not float32", "dnnl")
    rank = len(ctx.shape(0) or ())
    scale_t, zero_t = torch.ones((1,) * rank), torch.zeros((1,) * rank)
    kernel = _uint8_quantiser(ctx, resources, scale_t, zero_t)
    if isinstance(kernel, Decline):
        return kernel
    return DynamicQuantizer(kernel, scale_t, zero_t, opdef.build(ctx))


class DynamicQuantizer:
    """``DynamicQuantizeLinear``'s kernel: (uint8 values, scale, zero point). A range with a NaN
    or an infinity runs the op's own kernel for that call (what it gives there is the op's)."""
    writes_out = True

    def __init__(self, kernel: DnnlKernel, scale_t: torch.Tensor, zero_t: torch.Tensor, portable):
        self.kernel, self.impl = kernel, kernel.impl
        self._scale, self._zero, self._portable = scale_t, zero_t, portable

    def __call__(self, x, out=None):
        lo, hi = extremes(x) if x.numel() else (0.0, 0.0)
        if not (math.isfinite(lo) and math.isfinite(hi)):
            got = self._portable(x)
            if out is None:
                return got
            for o, g in zip(out, got):
                o.copy_(g)
            return out
        scale, zero = dynamic_quantize_params(lo, hi)
        self._scale.fill_(float(scale))
        self._zero.fill_(zero)
        y, s, z = out if out is not None else (None, torch.empty((), dtype=torch.float32),
                                               torch.empty((), dtype=torch.uint8))
        y = self.kernel(x, out=y)
        s.fill_(float(scale))
        z.fill_(int(zero))
        return y, s, z


# ---------------------------------------------------------------- fusegraph's Requantize and QAdd

def _requantized_type(ctx):
    """The output's DType (int8 / uint8, as the node's ``y_type`` says), or a Decline."""
    out_type = DType(int(ctx.attr("y_type", int(DType.UINT8))))
    if out_type not in QUANTISED or ctx.node.outputs[0].dtype != out_type:
        return Decline(f"output type {out_type.name}, not int8 / uint8", "dnnl")
    return out_type


def requantize_kernel(ctx, resources):
    """``Requantize`` (``Q(DQ(x) [op c ...])``) as one binary primitive: the source dequantised
    (``_dequantising_head``), its steps as binary post-ops by their constants (bound once, in
    their broadcast shapes), then quantised (``_quantising_tail``). An integer source with
    finite, nonzero constants makes no NaN: int8 outputs run too."""
    out_type = _requantized_type(ctx)
    if isinstance(out_type, Decline):
        return out_type
    if ctx.dtype(0) not in QUANTISED:
        return Decline(f"input type {ctx.dtype(0)}, not int8 / uint8", "dnnl")
    geometry = _static_geometry(ctx)
    if isinstance(geometry, Decline):
        return geometry
    xs, x_strides, y_strides = geometry
    x_dtype, y_dtype = ctx.dtype(0).to_torch(), out_type.to_torch()
    try:
        steps = affine_steps(ctx.attr("steps", []), ctx.n_inputs)
    except ValueError as exc:
        return Decline(str(exc), "dnnl")
    constants = []
    for op, k in steps:
        c = ctx.const(k)
        if c is None or c.dtype != torch.float32 or c.dim() > len(xs) or \
                any(d not in (1, n) for d, n in zip(reversed(tuple(c.shape)), reversed(xs))):
            return Decline(f"step input {k} is not a float32 constant broadcasting over the input", "dnnl")
        if out_type == DType.INT8 and not bool(torch.isfinite(c).all() and (op != "Div" or (c != 0).all())):
            return Decline("int8 output after steps whose constants could make a NaN (oneDNN converts it to "
                           "the largest int8, the op to 0)", "dnnl")
        c = c.contiguous().reshape((1,) * (len(xs) - c.dim()) + tuple(c.shape))
        constants.append((c, MemDesc.of(tuple(c.shape), torch.float32)))
    alg, operand, head = _dequantising_head(float(ctx.attr("x_zero_point", 0)), float(ctx.attr("x_scale")))
    middle = [(op.lower(), md) for (op, _k), (_c, md) in zip(steps, constants)]
    tail = _quantising_tail(float(ctx.attr("y_scale")), float(ctx.attr("y_zero_point", 0)))
    x_md, y_md = MemDesc.of(xs, x_dtype, x_strides), MemDesc.of(xs, y_dtype, y_strides)
    made = _binary(len(xs), x_md, alg, operand, head + middle + tail, y_md, "requantize")
    if isinstance(made, Decline):
        return made
    prim, consts, held = made
    first = len(head)
    consts = consts + [(capi.arg_post_op_src1(first + j), Memory(md, c.data_ptr()))
                       for j, (c, md) in enumerate(constants)]
    held = held + tuple(constants)
    return DnnlKernel(prim, [Slot(capi.ARG_SRC, xs, x_strides, x_dtype, x_md)],
                      Slot(capi.ARG_DST, xs, y_strides, y_dtype, y_md), consts, resources, (0,), keep=held)


def qadd_kernel(ctx, resources):
    """``QAdd`` (``Q(act(DQ(a) + DQ(b)))``) as one binary primitive over the full-shaped input:
    dequantised, the other input added as a binary post-op (a constant one dequantised once
    here, with its own broadcast shape; a run-time one of the full shape dequantised first by
    a reorder into this thread's buffer), an optional ReLU, then quantised. The float32 steps
    are the reference's, in its order; the sum is the same either way round."""
    out_type = _requantized_type(ctx)
    if isinstance(out_type, Decline):
        return out_type
    if ctx.dtype(0) not in QUANTISED or ctx.dtype(1) not in QUANTISED:
        return Decline("inputs that are not int8 / uint8", "dnnl")
    act = str(ctx.attr("activation", ""))
    if act not in ("", "relu"):
        return Decline(f"activation {act!r}", "dnnl")
    node = ctx.node
    ys = static_shape(node.outputs[0])
    if ys is None or not ys:
        return Decline("needs an output of static shape", "dnnl")
    full = [static_shape(node.inputs[i]) == ys for i in (0, 1)]
    if not any(full):
        return Decline("both inputs broadcast to the output's shape", "dnnl")
    first = 0 if full[0] else 1
    second = 1 - first
    a_v, b_v = node.inputs[first], node.inputs[second]
    b_const = ctx.const(second)
    if b_const is None and not full[second]:
        return Decline("a run-time input that broadcasts", "dnnl")
    a_s, a_z = float(ctx.attr("ab"[first] + "_scale")), float(ctx.attr("ab"[first] + "_zero_point", 0))
    b_s, b_z = float(ctx.attr("ab"[second] + "_scale")), float(ctx.attr("ab"[second] + "_zero_point", 0))
    y_strides = strides_of(node.outputs[0])
    a_dtype, y_dtype = a_v.dtype.to_torch(), out_type.to_torch()
    a_strides, b_strides = strides_of(a_v), strides_of(b_v)
    a_md, y_md = MemDesc.of(ys, a_dtype, a_strides), MemDesc.of(ys, y_dtype, y_strides)
    if b_const is not None:         # dequantised once, as the op's own kernel does it every run
        shift = ((b_const.to(torch.float32) - b_z) * b_s).contiguous()
        shift = shift.reshape((1,) * (len(ys) - shift.dim()) + tuple(shift.shape))
        b_md = MemDesc.of(tuple(shift.shape), torch.float32)
    else:
        dequantise_b = _dequantizer(ys, b_strides, b_v.dtype.to_torch(), b_strides, b_s, b_z, resources)
        if isinstance(dequantise_b, Decline):
            return dequantise_b
        b_md = MemDesc.of(ys, torch.float32, b_strides)
    alg, operand, head = _dequantising_head(a_z, a_s)
    post = head + [("add", b_md)] + ([("eltwise", "relu", 0.0, 0.0)] if act else []) + \
        _quantising_tail(float(ctx.attr("y_scale")), float(ctx.attr("y_zero_point", 0)))
    made = _binary(len(ys), a_md, alg, operand, post, y_md, "qadd")
    if isinstance(made, Decline):
        return made
    prim, consts, held = made
    summand = capi.arg_post_op_src1(len(head))
    a_slot, y_slot = Slot(capi.ARG_SRC, ys, a_strides, a_dtype, a_md), Slot(capi.ARG_DST, ys, y_strides, y_dtype, y_md)
    if b_const is not None:
        return DnnlKernel(prim, [a_slot], y_slot, consts + [(summand, Memory(b_md, shift.data_ptr()))], resources,
                          (first,), keep=(*held, shift, b_md))
    add = DnnlKernel(prim, [a_slot, Slot(summand, ys, b_strides, torch.float32, b_md)], y_slot, consts, resources,
                     (0, 1), keep=held)
    return QAddKernel(add, dequantise_b, (first, second), b_strides, resources)


def _dequantizer(shape, x_strides, x_dtype, y_strides, scale: float, zero: float, resources):
    """The reorder that dequantises an integer tensor into float32 (``(x - zero) * scale``,
    rounded once), as a ``DnnlKernel``, or a Decline."""
    x_md, y_md = MemDesc.of(shape, x_dtype, x_strides), MemDesc.of(shape, torch.float32, y_strides)
    attr = Attr(scales={capi.ARG_SRC: 0}, zero_points={capi.ARG_SRC: 0} if zero else {})
    lib = capi.load()
    try:
        prim = create("dequantize", lambda pd: lib.reorder_primitive_desc_create(
            pd, x_md.handle, lib.engine, y_md.handle, lib.engine, attr.handle))
    except capi.DnnlError as exc:
        return Decline(f"oneDNN has no reorder for this dequantisation: {exc}", "dnnl")
    if prim.impl.startswith(("simple", "ref")):
        return Decline(f"oneDNN offers only its generic reorder here ({prim.impl})", "dnnl")
    q = QuantArgs()
    q.scales(capi.ARG_SRC, [scale])
    if zero:
        q.zero_point(capi.ARG_SRC, int(zero))
    return DnnlKernel(prim, [Slot(capi.ARG_SRC, shape, x_strides, x_dtype, x_md)],
                      Slot(capi.ARG_DST, shape, y_strides, torch.float32, y_md), q.args, resources, (0,),
                      keep=(attr, *q.keep))


class QAddKernel:
    """``QAdd`` over a run-time second input: its reorder dequantises it into this thread's
    buffer (past the two primitives' scratchpad), then the QAdd primitive reads it there as
    its binary post-op's operand."""
    writes_out = True

    def __init__(self, add: DnnlKernel, dequantise: DnnlKernel, order: tuple[int, int], b_strides, resources):
        self.kernel, self.impl = add, add.impl
        self._dequantise, self._order, self.resources = dequantise, order, resources
        self._shape, self._strides = dequantise.output.shape, tuple(b_strides)
        self._at = -(-max(add.prim.scratchpad_bytes, dequantise.prim.scratchpad_bytes) // 64) * 64
        self._bytes = 4 * math.prod(self._shape)
        resources.need(self._at + self._bytes)

    def __call__(self, *inputs, out=None):
        a, b = inputs[self._order[0]], inputs[self._order[1]]
        summand = self.resources.temporary(self._at, self._bytes).view(torch.float32).as_strided(
            self._shape, self._strides)
        self._dequantise(b, out=summand)
        return self.kernel(a, summand, out=out)
