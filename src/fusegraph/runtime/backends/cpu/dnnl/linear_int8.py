"""``fusegraph::QLinear`` with a constant int8 weight as one oneDNN int8 matmul:
``Q(act(x_scale * w_scale * ((x - x_zp) @ W) + b))``.

``x`` (uint8 / int8, shape ``[..., K]``, row-major) is read as ``[M, K]``; ``W`` (``[K, N]``,
or ``[N, K]`` with ``trans_b``; zero point 0) is reordered once into the blocked layout the
primitive picks and not read from the graph at run time. The integer products are summed
exactly in int32, scaled by the source scale and the per-column weight scales (a mask over
N), the float32 bias added (a row broadcast over M), the Relu applied
(``int8_support.relu_post_op``), the clamp of ``y_clip`` (``int8_support.clip_post_ops``)
and the bias after it (``post_bias``: ``int8_support.post_bias_post_ops``), and the result
quantised with the output scale and zero point (rounded half to even,
saturated), or written as float32 (on the quantisation grid
with ``y_grid``: ``int8_support.grid_post_ops``), or (MatMulInteger's form) as the exact
int32 sum. With ``mid_activation`` the result goes onto the ``mid`` grid and through the GELU
in the epilogue before its quantisation (``int8_support.mid_post_ops``). Only on a CPU whose
int8 kernels sum exactly (``int8_support.int8_exact``); elsewhere ``int8_float.py`` runs the
node on float32 kernels, from the same checked plan (``qlinear_plan``). Products under
``SERIAL_MACS`` multiply-adds with weights under ``PARALLEL_WEIGHTS`` elements are made for one
thread.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ...protocol import Decline
from ..threading_policy import PARALLEL_WEIGHTS, SERIAL_MACS, threads_for
from . import capi
from .call import DnnlKernel, Slot
from .conv_int8 import INPUTS, int8_attr, int8_node, weight_scales_ok
from .int8_support import clip_post_ops, epilogue_bound, grid_post_ops, mid_post_ops, post_bias_post_ops, relu_post_op
from .layouts import contiguous, static_shape, strides_of
from .memory import MemDesc, Memory
from .primitive import create


@dataclass
class QLinearPlan:
    """What a QLinear node asks of a product kernel, checked: the int8 matmul here and the
    float32 form (``int8_float.py``) read the same operands and run the same post-ops."""
    out: torch.dtype
    quantised: bool
    weight: torch.Tensor                 # int8 [K, N], [N, K] under ``trans_b`` (a placeholder where the store holds it)
    trans_b: bool
    bias: torch.Tensor | None
    x_shape: tuple
    y_shape: tuple
    x_dtype: torch.dtype
    mkn: tuple
    post: list
    post_args: list
    post_keep: list
    w_mask: int
    bound: float                         # the epilogue's largest magnitude (``epilogue_bound``)
    small: bool                          # made for one thread (``threading_policy``)


def qlinear_plan(ctx, got) -> QLinearPlan | Decline:
    """The checked plan of QLinear node ``ctx`` (``got``: ``quantised_node``'s answer)."""
    node = ctx.node
    out, quantised, activation = got
    accumulate = out == torch.int32
    trans_b = bool(ctx.attr("trans_b", 0))
    w, b = ctx.const(1), ctx.const(3) if ctx.has_input(3) else None
    x_v, y_v = node.inputs[0], node.outputs[0]
    xs, ys = static_shape(x_v), static_shape(y_v)
    if w is None or w.device.type not in ("cpu", "meta") or w.dtype != torch.int8 or w.dim() != 2 \
            or (ctx.has_input(3) and b is None):
        return Decline("weight or bias is not a constant (int8 weight, 2-D)", "dnnl")
    if xs is None or ys is None or len(xs) < 1:
        return Decline("needs static shapes", "dnnl")
    x_dtype = x_v.dtype.to_torch() if x_v.dtype is not None else None
    if x_dtype not in INPUTS:
        return Decline(f"a {x_dtype} input (uint8 / int8)", "dnnl")
    if strides_of(x_v) != contiguous(xs) or strides_of(y_v) != contiguous(ys):
        return Decline("needs row-major input and output", "dnnl")
    n, k = (w.shape[0], w.shape[1]) if trans_b else (w.shape[1], w.shape[0])
    m = math.prod(xs[:-1])
    if xs[-1] != k or ys[-1] != n or math.prod(ys[:-1]) != m or (b is not None and b.numel() != n):
        return Decline("operand sizes do not match", "dnnl")
    if b is not None and accumulate:
        return Decline("an int32 sum with a bias", "dnnl")
    why = weight_scales_ok(ctx, n)
    if why is not None:
        return why
    bias = None if b is None else b.to(torch.float32).contiguous()
    x_scale = float(ctx.attr("x_scale", 1.0))
    post = [relu_post_op(k, x_scale, ctx.const(2), bias)] if activation == "relu" else []
    bound = epilogue_bound(k, x_scale, ctx.const(2), bias)
    mid = mid_post_ops(ctx, 2, len(post), bound)
    if isinstance(mid, Decline):          # (check_mid refuses mid_* beside an activation too)
        return mid
    post += mid[0]
    clip = clip_post_ops(ctx, bound)
    if isinstance(clip, Decline):
        return clip
    post += clip
    after = post_bias_post_ops(ctx, n, len(post), bound)     # after the clamp: within it, plus a finite row
    if isinstance(after, Decline):
        return after
    post += after[0]
    bound = after[3]
    grid = grid_post_ops(ctx, 2, len(post), bound)       # |gelu(v)| <= |v|: the bound holds after it
    if isinstance(grid, Decline):
        return grid
    post += grid[0]
    post_args = mid[1] + after[1] + grid[1]              # the post-ops' constant operands
    post_keep = mid[2] + after[2] + grid[2]
    w_mask = 0 if ctx.const(2).numel() == 1 else 2          # per column N of the [K, N] operand
    return QLinearPlan(out, quantised, w, trans_b, bias, xs, ys, x_dtype, (m, k, n), post, post_args, post_keep,
                       w_mask, bound, m * n * k < SERIAL_MACS and n * k < PARALLEL_WEIGHTS)


def linear_int8_kernel(ctx, store, resources):
    """The oneDNN kernel of one QLinear node, or a ``Decline`` saying why not."""
    node = ctx.node
    got = int8_node(ctx)
    if isinstance(got, Decline):
        return got
    plan = qlinear_plan(ctx, got)
    if isinstance(plan, Decline):
        return plan
    m, k, n = plan.mkn
    w, bias, trans_b, out = plan.weight, plan.bias, plan.trans_b, plan.out
    attr, qargs = int8_attr(ctx, plan.quantised, out == torch.int32, plan.w_mask, plan.post)
    x_md, y_md = MemDesc.of((m, k), plan.x_dtype), MemDesc.of((m, n), out)
    w_any = MemDesc.tagged([k, n], capi.S8, capi.TAG_ANY)
    b_md = MemDesc.of((1, n), torch.float32) if bias is not None else None
    lib = capi.load()
    try:
        with threads_for(plan.small):
            prim = create("int8 matmul", lambda pd: lib.matmul_primitive_desc_create(
                pd, lib.engine, x_md.handle, w_any.handle, b_md.handle if b_md is not None else None,
                y_md.handle, attr.handle))
    except capi.DnnlError as exc:
        return Decline(f"oneDNN has no int8 matmul for this node: {exc}", "dnnl")
    if prim.is_reference:
        return Decline(f"oneDNN offers only its reference int8 matmul ({prim.impl})", "dnnl")
    w_md = prim.md(capi.Q_WEIGHTS_MD)
    plain = w if w.device.type == "meta" else w.contiguous()
    plain_md = MemDesc.of((k, n), torch.int8, (1, k) if trans_b else (n, 1))   # the operand is W^T under trans_b
    packed = store.form(node.inputs[1].name, plain, (1, 0) if trans_b else (0, 1), plain_md, w_md)
    consts = [(capi.ARG_WEIGHTS, Memory(w_md, packed.data_ptr()))] + qargs.args + plan.post_args
    keep = [packed, w_md, attr, *qargs.keep, *plan.post_keep]
    if bias is not None:
        consts.append((capi.ARG_BIAS, Memory(b_md, bias.data_ptr())))
        keep.append(bias)
    x_slot = Slot(capi.ARG_SRC, plan.x_shape, contiguous(plan.x_shape), plan.x_dtype, x_md)
    y_slot = Slot(capi.ARG_DST, plan.y_shape, contiguous(plan.y_shape), out, y_md)
    return DnnlKernel(prim, [x_slot], y_slot, consts, resources, (0,), keep=tuple(keep))
