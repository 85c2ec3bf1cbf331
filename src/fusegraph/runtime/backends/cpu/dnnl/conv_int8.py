"""``fusegraph::QConv`` as one oneDNN int8 convolution:
``Q(act(x_scale * w_scale * conv(x - x_zp, w) + b + z_scale * (z - z_zp)))``.

Made at bind time for a 2-D convolution with static shapes over uint8 / int8 activations and
a constant int8 weight (zero point 0; any group count), on a CPU whose int8 kernels sum
exactly (``int8_support.int8_exact``; elsewhere ``int8_float.py`` runs the node on float32
kernels, from the same checked plan: ``qconv_plan``). The weight is reordered once into the
blocked layout the primitive picks (with the compensation oneDNN keeps beside it for a
non-zero source zero point). The quantisation is
the primitive's own arithmetic: the integer products are summed exactly in int32, scaled by
the source scale and the per-channel weight scales (``Attr(scales=...)``: a mask over the
output channels), the float32 bias added, then the post-ops: the clamp of ``conv_clip``,
the residual as a ``sum`` post-op reading the destination's bytes as quantised values
(``z_scale * (dst - z_zp)``, the planner puts the output in place over ``z``, else it is
copied there first), the Relu
(``int8_support.relu_post_op``: oneDNN's relu where the constants rule NaN out, else ``elu``
with alpha 0, which keeps a NaN bias's NaN), the clamp of ``y_clip``
(``int8_support.clip_post_ops``), and the output scale and zero point, rounded half to even
and saturated to uint8 / int8 (or a float32 result, on the quantisation grid
with ``y_grid``: ``int8_support.grid_post_ops``; or, ConvInteger's form, the exact int32
sum). Input and output in the layouts the layout pass chose (channels-last in
conv nets: the brgemm VNNI kernels; an NCHW graph input is staged). Small convolutions are
made for one thread (``threading_policy.py``). Anything else declines with the reason.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .....ir import DType
from .....ops.conv import ConvGeometry
from .....ops.fused_cnn import conv_macs
from ...protocol import Decline
from ..threading_policy import PARALLEL_MACS, threads_for
from . import capi
from .call import DnnlKernel, Slot
from .capi import Dims
from .int8_support import (NOT_EXACT, QuantArgs, clip_post_ops, epilogue_bound, grid_declines, grid_post_ops,
                           int8_exact, relu_post_op)
from .layouts import channels_last, contiguous, static_shape, strides_of
from .memory import DTYPES, MemDesc, Memory
from .primitive import Attr, create

ACTIVATIONS = ("", "relu")
INPUTS = (torch.uint8, torch.int8)
OUTPUTS = {DType.UINT8: torch.uint8, DType.INT8: torch.int8, DType.FLOAT: torch.float32, DType.INT32: torch.int32}


def int8_node(ctx):
    """(output torch dtype, whether it is quantised with a scale, activation) of a QConv /
    QLinear node this CPU runs on oneDNN's int8 kernels, or a ``Decline`` saying why not."""
    if not int8_exact():
        return Decline(NOT_EXACT, "dnnl")
    return quantised_node(ctx)


def quantised_node(ctx):
    """``int8_node`` without the CPU's question: what the node's attributes ask of a kernel
    (also of ``int8_float.py``'s float32 form), or a ``Decline`` saying why no kernel runs them."""
    yt = DType(int(ctx.attr("y_type", int(DType.UINT8))))
    if yt not in OUTPUTS:
        return Decline(f"an output of type {yt.name}", "dnnl")
    why = grid_declines(ctx, yt)
    if why is not None:
        return why
    activation = str(ctx.attr("activation", ""))
    if activation not in ACTIVATIONS:
        return Decline(f"activation {activation!r}", "dnnl")
    if ctx.node.op_type != "QLinear" and any(k.startswith("mid_") for k in ctx.node.attrs):
        return Decline(f"mid_* attributes on a {ctx.node.op_type}", "dnnl")
    return OUTPUTS[yt], yt in (DType.UINT8, DType.INT8), activation


def int8_attr(ctx, quantised: bool, accumulate: bool, w_mask: int, post_ops) -> tuple[Attr, QuantArgs]:
    """The attribute of an int8 convolution / product of ``ctx``'s node and its constant
    scale / zero-point arguments (``accumulate``: int32 output, the exact sum, no scale)."""
    scales, zps, q = {}, {}, QuantArgs()
    if not accumulate:
        scales = {capi.ARG_SRC: 0, capi.ARG_WEIGHTS: w_mask}
        q.scales(capi.ARG_SRC, [float(ctx.attr("x_scale"))])
        q.scales(capi.ARG_WEIGHTS, ctx.const(2).to(torch.float32))
        if quantised:
            scales[capi.ARG_DST] = 0
            q.scales(capi.ARG_DST, [float(ctx.attr("y_scale"))])
            if int(ctx.attr("y_zero_point", 0)):
                zps[capi.ARG_DST] = 0
                q.zero_point(capi.ARG_DST, int(ctx.attr("y_zero_point")))
    if int(ctx.attr("x_zero_point", 0)):
        zps[capi.ARG_SRC] = 0
        q.zero_point(capi.ARG_SRC, int(ctx.attr("x_zero_point")))
    return Attr(post_ops, scales=scales, zero_points=zps), q


def weight_scales_ok(ctx, channels: int) -> Decline | None:
    ws = ctx.const(2)
    if ws is None or ws.device.type not in ("cpu",) or ws.numel() not in (1, channels):
        return Decline("weight scales are not a constant per tensor or per output channel", "dnnl")
    return None


@dataclass
class QConvPlan:
    """What a QConv node asks of a convolution kernel, checked: the int8 primitive here and
    the float32 form (``int8_float.py``) read the same operands and run the same post-ops.
    ``post`` is in the int8 primitive's terms (the residual a ``sum`` reading quantised
    destination bytes at ``residual_at``); ``post_args`` / ``post_keep`` the post-ops'
    constant arguments and what they point at."""
    out: torch.dtype
    quantised: bool
    weight: torch.Tensor                 # int8 [co, ci/g, kh, kw] (a placeholder where the store holds it)
    bias: torch.Tensor | None
    x_shape: tuple
    y_shape: tuple
    x_dtype: torch.dtype
    x_strides: tuple
    y_strides: tuple
    weight_dims: list                    # the operand's dims: [g, co/g, ci/g, kh, kw] when grouped
    geometry: tuple                      # strides, dilations (ONNX's: oneDNN's are one less), pads begin / end
    post: list
    post_args: list
    post_keep: list
    residual_at: int | None
    w_mask: int
    bound: float                         # the epilogue's largest magnitude (``epilogue_bound``)
    small: bool                          # made for one thread (``threading_policy``)

    def md(self, which: str) -> MemDesc:
        """The source's ("x") or destination's descriptor, in its planned layout and type."""
        if which == "x":
            return MemDesc.of(self.x_shape, self.x_dtype, self.x_strides)
        return MemDesc.of(self.y_shape, self.out, self.y_strides)


def qconv_plan(ctx, got) -> QConvPlan | Decline:
    """The checked plan of QConv node ``ctx`` (``got``: ``quantised_node``'s answer)."""
    node = ctx.node
    out, quantised, activation = got
    accumulate = out == torch.int32
    w, b = ctx.const(1), ctx.const(3) if ctx.has_input(3) else None
    x_v, y_v = node.inputs[0], node.outputs[0]
    z_v = node.input(4)
    xs, ys = static_shape(x_v), static_shape(y_v)
    if w is None or w.device.type not in ("cpu", "meta") or w.dtype != torch.int8 or (ctx.has_input(3) and b is None):
        return Decline("weights or bias are not constant CPU tensors (int8 weights)", "dnnl")
    if xs is None or ys is None or len(xs) != 4 or w.dim() != 4:
        return Decline("needs a 2-D convolution with static shapes", "dnnl")
    x_dtype = x_v.dtype.to_torch() if x_v.dtype is not None else None
    if x_dtype not in INPUTS:
        return Decline(f"a {x_dtype} input (uint8 / int8)", "dnnl")
    if z_v is not None and (static_shape(z_v) != ys or z_v.dtype.to_torch() != out or not quantised):
        return Decline("the residual does not have the output's static shape and type", "dnnl")
    co, cig, kh, kw = (int(v) for v in w.shape)
    why = weight_scales_ok(ctx, co)
    if why is not None:
        return why
    geo = ConvGeometry(ctx)
    s, d, begin, end = geo.resolve(tuple(xs[2:]), tuple(w.shape[2:]))
    if min(begin + end) < 0:
        return Decline("negative pads", "dnnl")
    g = geo.group
    y_strides = strides_of(y_v)
    x_strides = channels_last(xs) if y_v.layout == "nhwc" else contiguous(xs)
    wdims = [co, cig, kh, kw] if g == 1 else [g, co // g, cig, kh, kw]
    bias = None if b is None else b.to(torch.float32).contiguous()
    if bias is not None and (accumulate or bias.numel() != co):
        return Decline("a bias that is not one float per output channel", "dnnl")
    terms, x_scale = cig * kh * kw, float(ctx.attr("x_scale", 1.0))
    z_scale = float(ctx.attr("z_scale")) if z_v is not None else 0.0
    bound = epilogue_bound(terms, x_scale, ctx.const(2), bias, z_scale)
    conv_clip, clip = clip_post_ops(ctx, bound, "conv_clip"), clip_post_ops(ctx, bound)
    for got in (conv_clip, clip):
        if isinstance(got, Decline):
            return got
    post = list(conv_clip)          # the convolution's own range, before the residual
    residual_at = None
    if z_v is not None:
        residual_at = len(post)
        post.append(("sum", float(ctx.attr("z_scale")), int(ctx.attr("z_zero_point", 0)), DTYPES[out]))
    if activation == "relu":
        post.append(relu_post_op(terms, x_scale, ctx.const(2), bias, z_scale))
    post += clip
    grid = grid_post_ops(ctx, 4, len(post), bound)
    if isinstance(grid, Decline):
        return grid
    grid_ops, grid_args, grid_keep = grid
    post += grid_ops
    w_mask = 0 if ctx.const(2).numel() == 1 else (1 if g == 1 else 3)
    macs = conv_macs(ctx, w)
    return QConvPlan(out, quantised, w, bias, xs, ys, x_dtype, x_strides, y_strides, wdims, (s, d, begin, end),
                     post, grid_args, grid_keep, residual_at, w_mask, bound, macs is not None and macs < PARALLEL_MACS)


def conv_int8_kernel(ctx, store, resources):
    """The oneDNN kernel of one QConv node, or a ``Decline`` saying why not."""
    node = ctx.node
    got = int8_node(ctx)
    if isinstance(got, Decline):
        return got
    plan = qconv_plan(ctx, got)
    if isinstance(plan, Decline):
        return plan
    accumulate = plan.out == torch.int32
    x_md, y_md = plan.md("x"), plan.md("y")
    w_any = MemDesc.tagged(plan.weight_dims, capi.S8, capi.TAG_ANY)
    bias, w = plan.bias, plan.weight
    b_md = MemDesc.of((bias.numel(),), torch.float32) if bias is not None else None
    attr, qargs = int8_attr(ctx, plan.quantised, accumulate, plan.w_mask, plan.post)
    lib = capi.load()
    s, d, begin, end = plan.geometry
    try:
        with threads_for(plan.small):
            prim = create("int8 convolution", lambda pd: lib.convolution_forward_primitive_desc_create(
                pd, lib.engine, capi.FORWARD_INFERENCE, capi.CONVOLUTION_DIRECT, x_md.handle, w_any.handle,
                b_md.handle if b_md is not None else None, y_md.handle, Dims(*s), Dims(*[v - 1 for v in d]),
                Dims(*begin), Dims(*end), attr.handle))
    except capi.DnnlError as exc:
        return Decline(f"oneDNN has no int8 convolution for this node: {exc}", "dnnl")
    if prim.is_reference:
        return Decline(f"oneDNN offers only its reference int8 convolution ({prim.impl})", "dnnl")
    w_md = prim.md(capi.Q_WEIGHTS_MD)
    wdims = plan.weight_dims
    plain_md = MemDesc.tagged(wdims, capi.S8, capi.TAG_ABCD if len(wdims) == 4 else capi.TAG_ABCDE)
    packed = store.form(node.inputs[1].name, w if w.device.type == "meta" else w.contiguous(), range(4),
                        plain_md, w_md)
    consts = [(capi.ARG_WEIGHTS, Memory(w_md, packed.data_ptr()))] + qargs.args + plan.post_args
    keep = [packed, w_md, attr, *qargs.keep, *plan.post_keep]
    if bias is not None:
        consts.append((capi.ARG_BIAS, Memory(b_md, bias.data_ptr())))
        keep.append(bias)
    x_slot = Slot(capi.ARG_SRC, plan.x_shape, plan.x_strides, plan.x_dtype, x_md)
    y_slot = Slot(capi.ARG_DST, plan.y_shape, plan.y_strides, plan.out, y_md)
    if plan.residual_at is None:
        return DnnlKernel(prim, [x_slot], y_slot, consts, resources, (0,), keep=tuple(keep))
    # in place or not, the residual is read from the destination's bytes (copied there when not)
    return DnnlKernel(prim, [x_slot, None], y_slot, consts, resources, (0, 4), prefill=1, keep=tuple(keep))
