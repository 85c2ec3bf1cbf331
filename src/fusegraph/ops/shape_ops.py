"""Shape and layout ops: Identity, Dropout, Reshape, Transpose, Squeeze, Unsqueeze, Flatten,
Shape, Size, Expand, Tile, DepthToSpace, SpaceToDepth.

Kernels are torch views or copies; shape-carrying inputs are read once at build time when
constant, else at run time with ``.tolist()``. Concat/Split live in ``shape_concat.py``,
Pad/CenterCropPad in ``shape_pad.py``.
"""
from __future__ import annotations

import torch

from ..ir import DType
from ..ir.shape import broadcast_shapes
from ._tensor_util import (SeededGenerators, dtype_or_none, ints_input_or_attr, mul_dims, norm_axes,
                           rank_of, runtime_ints, static_dims)
from .common import const_ints, same_as_input
from .registry import FusionKind, Movement, NodeContext, Precision, register
from .value_range import UNKNOWN, Fact
from .run_limits import check_tensor
from .shape_values import expand_target, shape_vector

INJ = FusionKind.INJECTIVE


def _ident(x, *_):
    return x


@register("Identity", since=1, fusion=INJ, infer=same_as_input(0), alias=((0, 0),), movement=Movement.VIEW)
def _identity(ctx: NodeContext):
    return _ident


# ---------------------------------------------------------------- Dropout

def _dropout_infer(ctx: NodeContext):
    out = [(dtype_or_none(ctx), ctx.shape(0))]
    if ctx.n_outputs > 1:
        out.append((DType.BOOL if ctx.version >= 10 else dtype_or_none(ctx), ctx.shape(0)))
    return out


def _dropout_range(node, ins: list[Fact]) -> list[Fact]:
    """Inference: the identity. Training mode (Dropout-1..6 unless ``is_test``; from opset 12
    a ``training_mode`` input that is not a constant false) scales what it keeps by
    1 / (1 - ratio): unknown."""
    if node.version < 7:
        training = int(node.attrs.get("is_test", 0)) == 0
    elif node.version < 12 or len(node.inputs) < 3 or node.inputs[2] is None:
        training = False
    else:
        flag = node.inputs[2].const
        training = flag is None or flag.device.type == "meta" or bool(flag.reshape(-1)[0])
    return [UNKNOWN if training else ins[0]] * len(node.outputs)


@register("Dropout", since=1, fusion=INJ, infer=_dropout_infer, value_range=_dropout_range)
def _dropout(ctx: NodeContext):
    """Inference: identity (mask all true). Training mode (opset 12+ input) drops at random."""
    v = ctx.version
    ratio_const, train_const = 0.5, False
    ratio_known = train_known = True
    if v < 7:
        train_const = int(ctx.attr("is_test", 0)) == 0
        ratio_const = float(ctx.attr("ratio", 0.5))
    elif v < 12:
        ratio_const = float(ctx.attr("ratio", 0.5))
    else:
        if ctx.has_input(1):
            c = ctx.const(1)
            ratio_known = c is not None
            ratio_const = float(c.reshape(-1)[0]) if ratio_known else 0.5
        if ctx.has_input(2):
            c = ctx.const(2)
            train_known = c is not None
            train_const = bool(c.reshape(-1)[0]) if train_known else False
    want_mask = ctx.n_outputs > 1
    mask_dtype = torch.bool if v >= 10 else ctx.dtype(0).to_torch()
    gens = SeededGenerators(ctx.attr("seed", None))

    def kernel(x, r=None, t=None):
        train = train_const if train_known else bool(t.reshape(-1)[0].item())
        if train:
            ratio = ratio_const if ratio_known else float(r.reshape(-1)[0].item())
            if ratio > 0:
                keep = torch.rand(x.shape, generator=gens.get(x.device), device=x.device) >= ratio
                zero = torch.zeros((), dtype=x.dtype, device=x.device)
                y = torch.where(keep, x * (1.0 / (1.0 - ratio)), zero)
                return (y, keep.to(mask_dtype)) if want_mask else y
        if not want_mask:
            return x
        return x, torch.ones(x.shape, dtype=mask_dtype, device=x.device)
    return kernel


# ---------------------------------------------------------------- Reshape

def _reshape_target(in_shape, spec, allowzero):
    out = list(spec)
    if not allowzero:
        for i, d in enumerate(spec):
            if d == 0:
                out[i] = in_shape[i]
    return out


def _reshape_infer(ctx: NodeContext):
    dt = dtype_or_none(ctx)
    if ctx.version < 5:
        spec = ctx.attr("shape", None)
        spec = None if spec is None else [int(s) for s in spec]
    else:
        spec = const_ints(ctx, 1)
        if spec is None:        # a target built from shapes: its entries may still be known dims
            read = shape_vector(ctx.node.inputs[1])
            spec = read if read is not None and None not in read else None
    if spec is None:
        s1 = ctx.shape(1)
        if s1 is not None and len(s1) == 1 and isinstance(s1[0], int):
            return [(dt, (None,) * s1[0])]
        return [(dt, None)]
    allowzero = int(ctx.attr("allowzero", 0))
    src = ctx.shape(0)
    if src is None:
        return [(dt, tuple(None if d in (0, -1) and not (d == 0 and allowzero) else d for d in spec))]
    out = _reshape_target(src, spec, allowzero)
    if -1 in out:
        k = out.index(-1)
        others = [d for i, d in enumerate(out) if i != k]
        num, den = list(src), list(others)
        for d in list(den):  # cancel symbols present on both sides
            if not isinstance(d, int) and d is not None and d in num:
                num.remove(d)
                den.remove(d)
        n, m = mul_dims(num), mul_dims(den)
        out[k] = n // m if isinstance(n, int) and isinstance(m, int) and m else (
            n if (not isinstance(n, int) and n is not None and m == 1) else None)
    return [(dt, tuple(out))]


@register("Reshape", since=1, fusion=INJ, infer=_reshape_infer, layout_sensitive=True, alias=((0, 0),),
          movement=Movement.VIEW)
def _reshape(ctx: NodeContext):
    allowzero = int(ctx.attr("allowzero", 0))
    if ctx.version < 5:
        spec = ctx.attr("shape", None)
        spec = None if spec is None else [int(s) for s in spec]
    else:
        spec = const_ints(ctx, 1)
    if spec is None:
        def dynamic(x, s=None):
            return x.reshape(_reshape_target(x.shape, runtime_ints(s), allowzero))
        return dynamic
    if allowzero and 0 in spec and -1 in spec:
        raise ctx.unsupported("allowzero=1 with both 0 and -1 in the shape is invalid")
    if allowzero or 0 not in spec:
        target = tuple(spec)
    else:
        src = static_dims(ctx, 0)
        if src is None:
            return lambda x, *_: x.reshape(_reshape_target(x.shape, spec, allowzero))
        target = tuple(_reshape_target(src, spec, allowzero))
    return lambda x, *_: x.reshape(target)


# ---------------------------------------------------------------- Transpose

def _transpose_infer(ctx: NodeContext):
    s = ctx.shape(0)
    if s is None:
        return [(dtype_or_none(ctx), None)]
    perm = ctx.attr("perm", None)
    perm = list(range(len(s)))[::-1] if perm is None else norm_axes(perm, len(s))
    return [(dtype_or_none(ctx), tuple(s[p] for p in perm))]


def _memory_order(v) -> list[int] | None:
    """``v``'s axes from the outermost in memory to the innermost: channels last for a
    channels-last value of rank 3 or 4 (``Value.layout`` "nhwc"), else row-major."""
    if v.shape is None:
        return None
    rank = len(v.shape)
    return [0, *range(2, rank), 1] if v.layout == "nhwc" and rank in (3, 4) else list(range(rank))


def _same_bytes(node) -> bool:
    """A Transpose whose output, in its memory layout, is its input's bytes in its layout: the
    permutation only renames axes (ConvNeXt's channels-last data read as ``[N, H, W, C]``, or a
    permutation of size-1 axes); the planner makes it a view."""
    x, y = node.inputs[0], node.outputs[0] if node.outputs else None
    if x is None or y is None or x.shape is None or y.shape is None or len(x.shape) != len(y.shape):
        return False
    perm = node.attrs.get("perm")
    perm = list(range(len(x.shape) - 1, -1, -1)) if perm is None else [int(p) for p in perm]
    if sorted(perm) != list(range(len(x.shape))):
        return False

    def moving(order):            # the axes that step through memory (a size-1 axis never does)
        return [a for a in order if x.shape[a] != 1]
    return moving([perm[a] for a in _memory_order(y)]) == moving(_memory_order(x))


@register("Transpose", since=1, fusion=INJ, infer=_transpose_infer, layout_sensitive=True, writes_out=True,
          movement=Movement.PERMUTE, view_when=_same_bytes)
def _transpose(ctx: NodeContext):
    """One row-major copy of the permuted input (into ``out=``, the output's planned buffer,
    when given): what reads it next (a Reshape merging heads) is then a view. Where the
    permutation only renames axes (``_same_bytes``), the node is a view and called without
    ``out=``: the permuted input is returned as it is (dense in the output's layout)."""
    perm = ctx.attr("perm", None)
    perm = None if perm is None else [int(p) for p in perm]
    view = _same_bytes(ctx.node)

    def transpose(x, out=None):
        y = x.permute(*range(x.dim() - 1, -1, -1)) if perm is None else x.permute(perm)
        if out is not None:
            return out.copy_(y)
        return y if view else y.contiguous()
    return transpose


# ---------------------------------------------------------------- Squeeze / Unsqueeze / Flatten

def _squeeze_infer(ctx: NodeContext):
    dt = dtype_or_none(ctx)
    known, axes = ints_input_or_attr(ctx, 1, "axes", 13)
    s = ctx.shape(0)
    if s is not None and not known:
        sa = ctx.shape(1)
        if sa is not None and len(sa) == 1 and isinstance(sa[0], int):
            return [(dt, (None,) * (len(s) - sa[0]))]
    if s is None or not known:
        return [(dt, None)]
    if axes is None:
        if not all(isinstance(d, int) for d in s):
            return [(dt, None)]
        return [(dt, tuple(d for d in s if d != 1))]
    drop = set(norm_axes(axes, len(s)))
    return [(dt, tuple(d for i, d in enumerate(s) if i not in drop))]


@register("Squeeze", since=1, fusion=INJ, infer=_squeeze_infer, layout_sensitive=True, alias=((0, 0),),
          movement=Movement.VIEW)
def _squeeze(ctx: NodeContext):
    known, axes = ints_input_or_attr(ctx, 1, "axes", 13)

    def run(x, axes):
        if axes is None:
            return x.reshape([d for d in x.shape if d != 1])
        ax = set(norm_axes(axes, x.dim()))
        for a in ax:
            if x.shape[a] != 1:
                raise ValueError(f"Squeeze: dim {a} has size {x.shape[a]}, not 1")
        return x.reshape([d for i, d in enumerate(x.shape) if i not in ax])
    if not known:
        return lambda x, a=None: run(x, runtime_ints(a))
    return lambda x, *_: run(x, axes)


def _unsqueeze_shape(shape, axes):
    rank = len(shape) + len(axes)
    ax = sorted(set(norm_axes(axes, rank)))
    if len(ax) != len(axes):
        raise ValueError(f"Unsqueeze: repeated axes {axes}")
    out, it = [], iter(shape)
    for i in range(rank):
        out.append(1 if i in ax else next(it))
    return out


def _unsqueeze_infer(ctx: NodeContext):
    dt = dtype_or_none(ctx)
    known, axes = ints_input_or_attr(ctx, 1, "axes", 13)
    s = ctx.shape(0)
    if s is not None and not known:
        sa = ctx.shape(1)
        if sa is not None and len(sa) == 1 and isinstance(sa[0], int):
            return [(dt, (None,) * (len(s) + sa[0]))]
    if s is None or not known or axes is None:
        return [(dt, None)]
    return [(dt, tuple(_unsqueeze_shape(s, axes)))]


@register("Unsqueeze", since=1, fusion=INJ, infer=_unsqueeze_infer, layout_sensitive=True, alias=((0, 0),),
          movement=Movement.VIEW)
def _unsqueeze(ctx: NodeContext):
    known, axes = ints_input_or_attr(ctx, 1, "axes", 13)
    if known and axes is None:
        raise ctx.unsupported("axes are required")
    if not known:
        return lambda x, a=None: x.reshape(_unsqueeze_shape(x.shape, runtime_ints(a)))
    return lambda x, *_: x.reshape(_unsqueeze_shape(x.shape, axes))


def _flatten_axis(ctx: NodeContext, rank: int) -> int:
    axis = int(ctx.attr("axis", 1))
    if not -rank <= axis <= rank:
        raise ValueError(f"Flatten axis {axis} out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def _flatten_infer(ctx: NodeContext):
    s = ctx.shape(0)
    if s is None:
        return [(dtype_or_none(ctx), (None, None))]
    a = _flatten_axis(ctx, len(s))
    return [(dtype_or_none(ctx), (mul_dims(s[:a]), mul_dims(s[a:])))]


@register("Flatten", since=1, fusion=INJ, infer=_flatten_infer, layout_sensitive=True, alias=((0, 0),),
          movement=Movement.VIEW)
def _flatten(ctx: NodeContext):
    axis = int(ctx.attr("axis", 1))

    def kernel(x):
        a = axis + x.dim() if axis < 0 else axis
        lead = 1
        for d in x.shape[:a]:
            lead *= d
        rest = 1
        for d in x.shape[a:]:
            rest *= d
        return x.reshape(lead, rest)
    return kernel


# ---------------------------------------------------------------- Shape / Size

def _shape_range(start: int, end, rank: int):
    end = rank if end is None else int(end)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    return start, max(end, start)


def _shape_infer(ctx: NodeContext):
    r = rank_of(ctx)
    if r is None:
        return [(DType.INT64, (None,))]
    s, e = _shape_range(int(ctx.attr("start", 0)), ctx.attr("end", None), r)
    return [(DType.INT64, (e - s,))]


_SHAPE_READER = (Precision.ANY, "reads only the shape")


@register("Shape", since=1, infer=_shape_infer, layout_sensitive=True, precision=_SHAPE_READER)
def _shape(ctx: NodeContext):
    start, end = int(ctx.attr("start", 0)), ctx.attr("end", None)

    def kernel(x):
        s, e = _shape_range(start, end, x.dim())
        return torch.tensor(list(x.shape[s:e]), dtype=torch.int64, device=x.device)
    return kernel


@register("Size", since=1, infer=lambda ctx: [(DType.INT64, ())], precision=_SHAPE_READER)
def _size(ctx: NodeContext):
    return lambda x: torch.tensor(x.numel(), dtype=torch.int64, device=x.device)


# ---------------------------------------------------------------- Expand / Tile

def _expand_infer(ctx: NodeContext):
    dt = dtype_or_none(ctx)
    shape = const_ints(ctx, 1)
    if shape is None:           # a target built from shapes: its entries may still be known dims
        shape = expand_target(ctx.node.inputs[1])       # (an unknown entry broadcasts to unknown)
    src = ctx.shape(0)
    if shape is None:
        s1 = ctx.shape(1)
        if src is not None and s1 is not None and len(s1) == 1 and isinstance(s1[0], int):
            return [(dt, (None,) * max(len(src), s1[0]))]
        return [(dt, None)]
    if src is None:
        return [(dt, None)]
    return [(dt, broadcast_shapes(tuple(src), tuple(shape)))]


def _expand_splat(ctx: NodeContext, xs):
    return xs[0].reshape(()) if xs[0].numel() == 1 else None


@register("Expand", since=8, fusion=INJ, infer=_expand_infer, layout_sensitive=True, splat=_expand_splat,
          movement=Movement.REPLICATE)
def _expand(ctx: NodeContext):
    shape = const_ints(ctx, 1)
    if shape is None:
        limits, node = ctx.limits, ctx.node

        def kernel(x, s):
            out = broadcast_shapes(x.shape, tuple(runtime_ints(s)))
            check_tensor(limits, node, out, x.dtype)    # a view, but its readers make it whole
            return x.expand(out)
        return kernel
    return lambda x, *_: x.expand(broadcast_shapes(x.shape, tuple(shape)))


def _tile_infer(ctx: NodeContext):
    dt = dtype_or_none(ctx)
    reps = const_ints(ctx, 1)
    s = ctx.shape(0)
    if s is None:
        return [(dt, None)]
    if reps is None:
        return [(dt, (None,) * len(s))]
    return [(dt, tuple(d * r if isinstance(d, int) else (d if r == 1 else None) for d, r in zip(s, reps)))]


@register("Tile", since=6, fusion=INJ, infer=_tile_infer, layout_sensitive=True, movement=Movement.REPLICATE)
def _tile(ctx: NodeContext):
    reps = const_ints(ctx, 1)
    if reps is None:
        limits, node = ctx.limits, ctx.node

        def kernel(x, r):
            rr = runtime_ints(r)
            if len(rr) >= x.dim():     # (fewer repeats than dims: torch refuses)
                dims = [1] * (len(rr) - x.dim()) + list(x.shape)
                check_tensor(limits, node, [d * k for d, k in zip(dims, rr)], x.dtype)
            return x.repeat(rr)
        return kernel
    return lambda x, *_: x.repeat(reps)


# ---------------------------------------------------------------- DepthToSpace / SpaceToDepth

@register("DepthToSpace", since=1, fusion=INJ, layout_sensitive=True, movement=Movement.PERMUTE)
def _depth_to_space(ctx: NodeContext):
    bs = int(ctx.attr("blocksize"))
    mode = ctx.attr("mode", "DCR") if ctx.version >= 11 else "DCR"
    if mode not in ("DCR", "CRD"):
        raise ctx.unsupported(f"mode {mode!r}")

    def kernel(x):
        n, c, h, w = x.shape
        if mode == "DCR":
            y = x.reshape(n, bs, bs, c // (bs * bs), h, w).permute(0, 3, 4, 1, 5, 2)
        else:
            y = x.reshape(n, c // (bs * bs), bs, bs, h, w).permute(0, 1, 4, 2, 5, 3)
        return y.reshape(n, c // (bs * bs), h * bs, w * bs)
    return kernel


@register("SpaceToDepth", since=1, fusion=INJ, layout_sensitive=True, movement=Movement.PERMUTE)
def _space_to_depth(ctx: NodeContext):
    bs = int(ctx.attr("blocksize"))
    mode = ctx.attr("mode", "DCR")
    if mode not in ("DCR", "CRD"):
        raise ctx.unsupported(f"mode {mode!r}")
    perm = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)

    def kernel(x):
        n, c, h, w = x.shape
        y = x.reshape(n, c, h // bs, bs, w // bs, bs).permute(perm)
        return y.reshape(n, c * bs * bs, h // bs, w // bs)
    return kernel
