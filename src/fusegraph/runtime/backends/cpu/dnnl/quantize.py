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
  other added as a binary post-op: a constant one dequantised once, a run-time one by a
  reorder into this thread's buffer first (``QAddKernel``).

An integer source makes no NaN, so ``Requantize`` and ``QAdd`` write int8 too (``Requantize``
unless a step's constant is not finite or divides by zero). Every kernel reads and writes the
values' own layouts (channels-last activations too). A scale or zero point computed at run
time, another type, a per-axis or blocked scale, a symbolic shape, an input that broadcasts at
run time, or only oneDNN's reference implementation decline with the reason.
"""
from __future__ import annotations

import ctypes as C
import math
from threading import get_ident
from typing import NamedTuple

import torch

from .....ir import DType
from .....ops.quant import dynamic_quantize_params
from .....ops.quantized import QUANTISED, affine_steps
from ...protocol import Decline
from . import capi
from .call import DnnlKernel, Slot
from .capi import ExecArg
from .layouts import static_shape, strides_of
from .memory import MemDesc, Memory
from .primitive import Attr, Primitive, create


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
    x_dtype = ctx.dtype(0).to_torch()
    dq = _dequantizer(xs, x_strides, x_dtype, y_strides, *params)
    if isinstance(dq, Decline):
        return dq
    return DnnlKernel(dq.prim, [Slot(capi.ARG_SRC, xs, x_strides, x_dtype, dq.src_md)],
                      Slot(capi.ARG_DST, xs, y_strides, torch.float32, dq.dst_md), dq.consts, resources, (0,),
                      keep=dq.held)


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
        lo, hi = (float(v) for v in torch.aminmax(x)) if x.numel() else (0.0, 0.0)
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
    a_md, y_md = MemDesc.of(ys, a_dtype, strides_of(a_v)), MemDesc.of(ys, y_dtype, y_strides)
    if b_const is not None:         # dequantised once, as the op's own kernel does it every run
        shift = ((b_const.to(torch.float32) - b_z) * b_s).contiguous()
        shift = shift.reshape((1,) * (len(ys) - shift.dim()) + tuple(shift.shape))
        b_md = MemDesc.of(tuple(shift.shape), torch.float32)
        dequantise_b = None
    else:
        shift = None
        b_md = MemDesc.of(ys, torch.float32, strides_of(b_v))
        dequantise_b = _dequantizer(ys, strides_of(b_v), b_v.dtype.to_torch(), strides_of(b_v), b_s, b_z)
        if isinstance(dequantise_b, Decline):
            return dequantise_b
    alg, operand, head = _dequantising_head(a_z, a_s)
    post = head + [("add", b_md)] + ([("eltwise", "relu", 0.0, 0.0)] if act else []) + \
        _quantising_tail(float(ctx.attr("y_scale")), float(ctx.attr("y_zero_point", 0)))
    made = _binary(len(ys), a_md, alg, operand, post, y_md, "qadd")
    if isinstance(made, Decline):
        return made
    prim, consts, held = made
    return QAddKernel(prim, consts, held, len(head), (first, second), (ys, strides_of(a_v), a_dtype),
                      (ys, y_strides, y_dtype), a_md, y_md, b_md, shift, dequantise_b, resources)


class Dequantizer(NamedTuple):
    prim: Primitive
    consts: list              # (argument, Memory) of the scale and zero point
    src_md: MemDesc
    dst_md: MemDesc
    geometry: tuple           # the source's (shape, strides, dtype)
    held: tuple               # what the constant arguments point at


def _dequantizer(shape, x_strides, x_dtype, y_strides, scale: float, zero: float):
    """The reorder that dequantises an integer tensor into float32 (``(x - zero) * scale``,
    rounded once), or a Decline."""
    x_md, y_md = MemDesc.of(shape, x_dtype, x_strides), MemDesc.of(shape, torch.float32, y_strides)
    attr = Attr(scales={capi.ARG_SRC: 0}, zero_points={capi.ARG_SRC: 0} if zero else {})
    lib = capi.load()
    pd = capi.vp()
    status = lib.reorder_primitive_desc_create(C.byref(pd), x_md.handle, lib.engine, y_md.handle, lib.engine,
                                               attr.handle)
    if status != 0:
        return Decline(f"oneDNN has no reorder for this dequantisation (status {status})", "dnnl")
    prim = Primitive(pd, "dequantize")
    if prim.impl.startswith(("simple", "ref")):
        return Decline(f"oneDNN offers only its generic reorder here ({prim.impl})", "dnnl")
    scale_t = torch.tensor([scale], dtype=torch.float32)
    zero_t = torch.tensor([int(zero)], dtype=torch.int32)
    scale_md, zero_md = MemDesc.of((1,), torch.float32), MemDesc.of((1,), torch.int32)
    consts = [(capi.ARG_ATTR_SCALES | capi.ARG_SRC, Memory(scale_md, scale_t.data_ptr()))]
    if zero:
        consts.append((capi.ARG_ATTR_ZERO_POINTS | capi.ARG_SRC, Memory(zero_md, zero_t.data_ptr())))
    return Dequantizer(prim, consts, x_md, y_md, (tuple(shape), tuple(x_strides), x_dtype),
                       (scale_t, zero_t, scale_md, zero_md, attr))


class QAddKernel:
    """The QAdd primitive (and, for a run-time second input, the reorder that dequantises it
    into this thread's buffer first), called with the node's inputs and its planned output."""
    writes_out = True

    def __init__(self, prim, consts, held, post_index: int, order: tuple[int, int], a_geometry, y_geometry,
                 a_md: MemDesc, y_md: MemDesc, b_md: MemDesc, shift, dequantise_b, resources):
        self.prim, self.impl = prim, prim.impl
        self._order = order
        self._a_geometry, self._y_geometry = a_geometry, y_geometry        # (shape, strides, dtype)
        self._a, self._y = Memory(a_md, 0), Memory(y_md, 0)
        self._b = Memory(b_md, shift.data_ptr() if shift is not None else 0)     # the float32 summand
        steps = []
        if dequantise_b is not None:
            self._b_src = Memory(dequantise_b.src_md, 0)
            self._b_geometry = dequantise_b.geometry
            steps.append((dequantise_b.prim, [(capi.ARG_SRC, self._b_src), (capi.ARG_DST, self._b)] +
                          dequantise_b.consts))
        steps.append((prim, [(capi.ARG_SRC, self._a), (capi.ARG_DST, self._y)] + consts +
                      [(capi.arg_post_op_src1(post_index), self._b)]))
        self._steps = steps
        self._keep = (held, shift, a_md, y_md, b_md, dequantise_b)
        self._b_bytes = 0 if shift is not None else 4 * math.prod(y_geometry[0])
        self._scratch = -(-max(p.scratchpad_bytes for p, _ in steps) // 64) * 64
        self.resources = resources
        resources.need(self._scratch + self._b_bytes)
        self._exec = capi.load().execute
        self._tid = self._stream = self._calls = None

    def _thread(self) -> None:
        """This thread's stream, scratchpad and buffer (the dequantised summand after the
        scratchpad bytes), and the argument arrays over them."""
        self._tid = get_ident()
        self._stream, scratch = self.resources.for_thread(self._scratch + self._b_bytes)
        extra = [(capi.ARG_SCRATCHPAD, scratch)] if self._scratch else []
        if self._b_bytes:
            self._b.point(scratch.ptr + self._scratch)
        self._calls = []
        for prim, pairs in self._steps:
            args = [ExecArg(arg, mem.handle) for arg, mem in pairs + extra]
            self._calls.append((prim.handle, (ExecArg * len(args))(*args), len(args)))

    def __call__(self, *inputs, out=None):
        a, b = inputs[self._order[0]], inputs[self._order[1]]
        a = _laid_out(a, self._a_geometry)
        target = out if out is not None and _fits(out, self._y_geometry) else _empty(self._y_geometry)
        if self._tid != get_ident():
            self._thread()
        self._a.point(a.data_ptr())
        self._y.point(target.data_ptr())
        if len(self._steps) == 2:
            self._b_src.point(_laid_out(b, self._b_geometry).data_ptr())
        for handle, args, n in self._calls:
            status = self._exec(handle, self._stream, n, args)
            if status:
                raise capi.DnnlError("execute qadd", status)
        if out is not None and target is not out:
            out.copy_(target)
            return out
        return target


def _fits(t: torch.Tensor, geometry) -> bool:
    shape, strides, dtype = geometry
    return t.dtype == dtype and tuple(t.shape) == tuple(shape) and \
        all(a == b for a, b, n in zip(t.stride(), strides, shape) if n != 1)


def _empty(geometry) -> torch.Tensor:
    shape, strides, dtype = geometry
    size = 1 + sum((n - 1) * st for n, st in zip(shape, strides))
    return torch.empty(max(size, 1), dtype=dtype).as_strided(shape, strides)


def _laid_out(t: torch.Tensor, geometry) -> torch.Tensor:
    """``t`` where it has the layout the primitive was made for, else a copy in that layout."""
    if _fits(t, geometry):
        return t
    fixed = _empty(geometry)
    fixed.copy_(t)
    return fixed
