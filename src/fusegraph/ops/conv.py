"""Convolutions: Conv, ConvTranspose, ConvInteger, DeformConv, CausalConvWithState.

Also the spatial geometry helpers (auto_pad resolution, asymmetric padding) shared with
``pool.py`` and ``quant.py``. Convolutions run as ``torch.nn.functional.conv*`` calls (oneDNN
on CPU, cuDNN on CUDA); padding torch cannot express symmetrically is applied with
``F.pad`` first. Geometry depending on the input's spatial size is computed once per shape.
"""
from __future__ import annotations

import math
import operator

import torch
import torch.nn.functional as F

from ..errors import ShapeInferenceError
from .precision_reasons import CONVOLUTION
from .registry import FusionKind, NodeContext, register

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


# ----------------------------------------------------------------------------- geometry
_AT_LEAST = {"strides": 1, "dilations": 1, "kernel_shape": 1, "pads": 0}


def ints_attr(ctx: NodeContext, name: str) -> list[int] | None:
    """An ints attribute; window attributes are checked (strides, dilations, kernel_shape >= 1,
    pads >= 0), so a malformed node (a re-sealed artifact's) is a typed error, not a crash."""
    v = ctx.attr(name, None)
    if v is None:
        return None
    n = ctx.node
    try:
        v = [operator.index(x) for x in v]
    except TypeError:
        raise ShapeInferenceError(f"node {n.name!r} ({n.op_type}): attribute {name!r} must be a list of "
                                  f"integers, got {str(v)[:80]}") from None
    low = _AT_LEAST.get(name)
    if low is not None and any(x < low for x in v):
        raise ShapeInferenceError(f"node {n.name!r} ({n.op_type}): attribute {name!r} is {list(v)}; "
                                  f"every entry must be >= {low}")
    return v


def check_rank(ctx: NodeContext, i: int = 0, ranks=(3, 4, 5)) -> None:
    shape = ctx.shape(i)
    if shape is not None and len(shape) not in ranks:
        raise ctx.unsupported(f"input rank {len(shape)} (supported: {', '.join(map(str, ranks))})")


def auto_pads(auto_pad: str, in_sizes, eff_k, strides, pads) -> tuple[list[int], list[int]]:
    """(begin, end) pads per spatial dim for ``auto_pad`` (SAME_* keeps ceil(in / stride))."""
    n = len(in_sizes)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for i in range(n):
            out = -(-in_sizes[i] // strides[i])
            total = max(0, (out - 1) * strides[i] + eff_k[i] - in_sizes[i])
            head = (total + 1) // 2 if auto_pad == "SAME_LOWER" else total // 2
            begin.append(head)
            end.append(total - head)
        return begin, end
    if auto_pad == "VALID" or not pads:
        return [0] * n, [0] * n
    return list(pads[:n]), list(pads[n:2 * n])


def torch_pad_list(begin, end) -> list[int]:
    """``F.pad`` order (last dim first) from per-dim begin/end pads."""
    out: list[int] = []
    for b, e in zip(reversed(begin), reversed(end)):
        out += [b, e]
    return out


def conv_call(x, w, b, strides, dilations, groups, begin, end):
    """N-d convolution with (possibly asymmetric) zero padding."""
    fn = _CONV[x.dim() - 2]
    if begin == end and min(begin, default=0) >= 0:
        return fn(x, w, b, strides, begin, dilations, groups)
    x = F.pad(x, torch_pad_list(begin, end))
    return fn(x, w, b, strides, 0, dilations, groups)


class ConvGeometry:
    """Conv attributes read once; pads resolved per (input, kernel) spatial shape."""

    def __init__(self, ctx: NodeContext):
        self.auto_pad = ctx.attr("auto_pad", "NOTSET") or "NOTSET"
        self.dilations = ints_attr(ctx, "dilations")
        self.strides = ints_attr(ctx, "strides")
        self.pads = ints_attr(ctx, "pads")
        self.kernel_shape = ints_attr(ctx, "kernel_shape")
        self.group = int(ctx.attr("group", 1))
        self._cache: dict[tuple, tuple] = {}

    def resolve(self, in_sizes: tuple, k_sizes: tuple):
        key = (in_sizes, k_sizes)
        got = self._cache.get(key)
        if got is None:
            n = len(in_sizes)
            k = self.kernel_shape or list(k_sizes)
            d = self.dilations or [1] * n
            s = self.strides or [1] * n
            eff = [(k[i] - 1) * d[i] + 1 for i in range(n)]
            begin, end = auto_pads(self.auto_pad, in_sizes, eff, s, self.pads)
            got = (s, d, begin, end)
            self._cache[key] = got
        return got


def _out_dim(size, k: int, s: int, d: int, pb: int, pe: int, auto_pad: str):
    if not isinstance(size, int):
        return None
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        return -(-size // s)
    return (size + pb + pe - ((k - 1) * d + 1)) // s + 1


def conv_infer(ctx: NodeContext):
    """Conv / FusedConv output: ``[N, M, spatial...]`` by the ONNX size formula (symbolic sizes stay
    unknown); explicit, so inference never runs a meta kernel (torch's imports sympy)."""
    xs, ws = ctx.shape(0), ctx.shape(1)
    dtype = ctx.dtype(0) or None
    if xs is None or ws is None:
        return [(dtype, None)]
    n = len(xs) - 2
    if len(ws) != len(xs):
        raise ValueError(f"weight of rank {len(ws)} for an input of rank {len(xs)}")
    group = ctx.attr("group", 1)
    if isinstance(xs[1], int) and isinstance(ws[1], int) and isinstance(group, int) and xs[1] != ws[1] * group:
        raise ValueError(f"input has {xs[1]} channels, the weight {tuple(ws)} with group {group} takes "
                         f"{ws[1] * group}")
    k = ints_attr(ctx, "kernel_shape") or list(ws[2:])
    s = ints_attr(ctx, "strides") or [1] * n
    d = ints_attr(ctx, "dilations") or [1] * n
    auto_pad = ctx.attr("auto_pad", "NOTSET") or "NOTSET"
    pads = ints_attr(ctx, "pads") if auto_pad in ("NOTSET", "") else None
    pads = pads or [0] * (2 * n)
    if n < 1 or len(k) != n or not all(isinstance(v, int) for v in k):
        return [(dtype, None)]
    spatial = tuple(_out_dim(xs[2 + i], k[i], s[i], d[i], pads[i], pads[n + i], auto_pad) for i in range(n))
    if any(v is not None and v < 1 for v in spatial):
        raise ValueError(f"output size {spatial} from input {tuple(xs)} and kernel {k}")
    return [(dtype, (xs[0], ws[0]) + spatial)]


# ----------------------------------------------------------------------------- Conv
@register("Conv", since=1, fusion=FusionKind.OUT_FUSABLE, layout_sensitive=True, infer=conv_infer,
          precision=CONVOLUTION)
def _conv(ctx: NodeContext):
    check_rank(ctx)
    geo = ConvGeometry(ctx)
    g = geo.group

    def conv(x, w, b=None):
        s, d, begin, end = geo.resolve(tuple(x.shape[2:]), tuple(w.shape[2:]))
        return conv_call(x, w, b, s, d, g, begin, end)
    return conv


# ----------------------------------------------------------------------------- ConvTranspose
@register("ConvTranspose", since=1, fusion=FusionKind.OUT_FUSABLE, layout_sensitive=True, precision=CONVOLUTION)
def _conv_transpose(ctx: NodeContext):
    check_rank(ctx)
    geo = ConvGeometry(ctx)
    out_pad_attr = ints_attr(ctx, "output_padding")
    out_shape_attr = ints_attr(ctx, "output_shape")
    g = geo.group
    cache: dict[tuple, tuple] = {}

    def geometry(in_sizes, k_sizes):
        n = len(in_sizes)
        k = geo.kernel_shape or list(k_sizes)
        d = geo.dilations or [1] * n
        s = geo.strides or [1] * n
        op = (out_pad_attr or [0] * n)[:n]
        eff = [(k[i] - 1) * d[i] + 1 for i in range(n)]
        full = [s[i] * (in_sizes[i] - 1) + eff[i] for i in range(n)]
        target = None
        if out_shape_attr:
            target = out_shape_attr[-n:]
        elif geo.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            target = [in_sizes[i] * s[i] for i in range(n)]
        if target is not None:
            begin, end = [], []
            for i in range(n):
                total = full[i] + op[i] - target[i]
                if geo.auto_pad == "SAME_UPPER":
                    begin.append(total // 2)
                    end.append(total - total // 2)
                else:
                    begin.append(total - total // 2)
                    end.append(total // 2)
        elif geo.auto_pad == "VALID" or not geo.pads:
            begin, end = [0] * n, [0] * n
        else:
            begin, end = list(geo.pads[:n]), list(geo.pads[n:2 * n])
        native = (begin == end and min(begin) >= 0
                  and all(op[i] < max(s[i], d[i]) for i in range(n)))
        return s, d, op, begin, end, native

    def conv_transpose(x, w, b=None):
        key = (tuple(x.shape[2:]), tuple(w.shape[2:]))
        geom = cache.get(key)
        if geom is None:
            geom = cache[key] = geometry(*key)
        s, d, op, begin, end, native = geom
        fn = _CONV_T[x.dim() - 2]
        if native:
            return fn(x, w, b, s, begin, op, g, d)
        y = fn(x, w, None, s, 0, 0, g, d)
        y = F.pad(y, torch_pad_list([-p for p in begin], [op[i] - end[i] for i in range(len(op))]))
        if b is not None:
            y = y + b.reshape((1, -1) + (1,) * (y.dim() - 2))
        return y
    return conv_transpose


# ----------------------------------------------------------------------------- ConvInteger
def exact_float(k: int, device: torch.device) -> torch.dtype:
    """A float type that sums ``k`` products of two 8-bit-range integers exactly.

    float32 only on CPU: on CUDA, TF32 tensor cores may round float32 products."""
    small = k * 255 * 255 < (1 << 24)
    return torch.float32 if small and device.type in ("cpu", "meta") else torch.float64


def per_channel(zp, rank: int):
    """Zero point / scale for conv weights: scalar, or one per output channel (dim 0)."""
    if zp is None or zp.numel() == 1:
        return zp.reshape(()) if zp is not None else None
    return zp.reshape((-1,) + (1,) * (rank - 1))


def int_conv(x, w, xzp, wzp, geo: ConvGeometry):
    """Integer convolution ``(x - xzp) * (w - wzp)`` computed exactly in floats; float result."""
    s, d, begin, end = geo.resolve(tuple(x.shape[2:]), tuple(w.shape[2:]))
    ft = exact_float(math.prod(w.shape[1:]), x.device)
    xf = x.to(ft)
    if xzp is not None:
        xf = xf - xzp.reshape(()).to(ft) if xzp.numel() == 1 else xf - xzp.to(ft)
    wf = w.to(ft)
    if wzp is not None:
        wf = wf - per_channel(wzp, w.dim()).to(ft)
    return conv_call(xf, wf, None, s, d, geo.group, begin, end)


@register("ConvInteger", since=10, fusion=FusionKind.OUT_FUSABLE, layout_sensitive=True)
def _conv_integer(ctx: NodeContext):
    check_rank(ctx)
    geo = ConvGeometry(ctx)

    def conv_integer(x, w, xzp=None, wzp=None):
        return int_conv(x, w, xzp, wzp, geo).to(torch.int32)
    return conv_integer


# ----------------------------------------------------------------------------- DeformConv
def _bilinear_cols(x, py, px):
    """Bilinear samples of ``x`` (N, G, Cg, H, W) at float positions (N, G, P); zero outside.

    Returns (N, G, Cg, P)."""
    n, g, cg, h, w = x.shape
    flat = x.reshape(n, g, cg, h * w)
    y0 = torch.floor(py)
    x0 = torch.floor(px)
    ly, lx = py - y0, px - x0
    y0, x0 = y0.long(), x0.long()
    out = None
    for dy, wy in ((0, 1 - ly), (1, ly)):
        for dx, wx in ((0, 1 - lx), (1, lx)):
            yy, xx = y0 + dy, x0 + dx
            valid = (yy >= 0) & (yy < h) & (xx >= 0) & (xx < w)
            idx = (yy.clamp(0, h - 1) * w + xx.clamp(0, w - 1))
            vals = torch.gather(flat, 3, idx.unsqueeze(2).expand(n, g, cg, idx.shape[-1]))
            term = vals * (wy * wx * valid).unsqueeze(2).to(x.dtype)
            out = term if out is None else out + term
    return out


@register("DeformConv", since=19, fusion=FusionKind.OUT_FUSABLE, layout_sensitive=True)
def _deform_conv(ctx: NodeContext):
    check_rank(ctx, 0, (4,))
    geo = ConvGeometry(ctx)
    og = int(ctx.attr("offset_group", 1))
    group = geo.group

    def deform_conv(x, w, offset, b=None, mask=None):
        n, c, ih, iw = x.shape
        oc, cpg, kh, kw = w.shape
        if geo.kernel_shape:
            kh, kw = geo.kernel_shape
        s, d, begin, _ = geo.resolve((ih, iw), (kh, kw))
        oh, ow = offset.shape[2], offset.shape[3]
        k = kh * kw
        dev = x.device
        ft = torch.float32 if offset.dtype in (torch.float16, torch.bfloat16) else offset.dtype
        ky = (torch.arange(kh, device=dev, dtype=ft) * d[0]).reshape(kh, 1, 1, 1).expand(kh, kw, 1, 1)
        kx = (torch.arange(kw, device=dev, dtype=ft) * d[1]).reshape(1, kw, 1, 1).expand(kh, kw, 1, 1)
        by = (torch.arange(oh, device=dev, dtype=ft) * s[0] - begin[0]).reshape(1, 1, oh, 1)
        bx = (torch.arange(ow, device=dev, dtype=ft) * s[1] - begin[1]).reshape(1, 1, 1, ow)
        off = offset.reshape(n, og, kh, kw, 2, oh, ow).to(ft)
        py = (ky + by) + off[:, :, :, :, 0]          # (n, og, kh, kw, oh, ow)
        px = (kx + bx) + off[:, :, :, :, 1]
        cols = _bilinear_cols(x.reshape(n, og, c // og, ih, iw),
                              py.reshape(n, og, -1), px.reshape(n, og, -1))  # (n, og, c/og, k*L)
        cols = cols.reshape(n, og, c // og, k, oh * ow)
        if mask is not None:
            cols = cols * mask.reshape(n, og, 1, k, oh * ow).to(cols.dtype)
        cols = cols.reshape(n, group, (c // group) * k, oh * ow)
        wm = w.reshape(group, oc // group, cpg * k)
        y = torch.matmul(wm.unsqueeze(0), cols).reshape(n, oc, oh, ow)
        if b is not None:
            y = y + b.reshape(1, -1, 1, 1)
        return y
    return deform_conv


# ----------------------------------------------------------------------------- CausalConvWithState
@register("CausalConvWithState", since=27, fusion=FusionKind.OPAQUE, layout_sensitive=True)
def _causal_conv_with_state(ctx: NodeContext):
    act = (ctx.attr("activation", "none") or "none").lower()
    if act not in ("none", "silu", "swish"):
        raise ctx.unsupported(f"activation {act!r}")
    check_rank(ctx, 0, (3,))

    def causal_conv(x, w, b=None, past=None):
        bsz, ch, _ = x.shape
        k = w.shape[2]
        if past is None:
            past = torch.zeros((bsz, ch, k - 1), dtype=x.dtype, device=x.device)
        padded = torch.cat([past, x], dim=2)
        y = F.conv1d(padded, w, b, 1, 0, 1, ch)
        if act != "none":
            y = F.silu(y.float()).to(x.dtype)
        return y, padded[:, :, padded.shape[2] - (k - 1):]
    return causal_conv
