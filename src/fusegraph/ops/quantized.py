"""Quantised ops in domain ``fusegraph`` (version 1): what a QDQ model's int8 groups become
(``passes/quantize_qdq.py``), each one node with its quantisation parameters as attributes.

- ``QConv(x, w, w_scale, b?, z?)``: ``Q(act(conv(DQ(x), DQ(w)) + b + DQ(z)))``. ``x`` uint8 /
  int8 activations (``x_scale``, ``x_zero_point``), ``w`` an int8 weight of symmetric
  quantisation (zero point 0) with ``w_scale`` one float per output channel or one for all,
  ``b`` a float32 bias, ``z`` an optional quantised residual of the output's shape
  (``z_scale``, ``z_zero_point``) added before the activation (``activation``: "" or
  "relu"). The ONNX Conv attributes. The output type ``y_type`` (a ``DType`` code): uint8 /
  int8 quantised with ``y_scale`` / ``y_zero_point``; float32 (the dequantised result, for a
  float consumer); int32 (ConvInteger: the exact accumulator ``(x - x_zero_point) * w``, no
  scale, no bias, no residual). With ``y_grid`` (the DType code of uint8 / int8; 0 or absent:
  none) a float32 output is the result snapped to that type's quantisation grid,
  ``DQ(Q(y))`` with ``y_scale`` / ``y_zero_point``: what a product quantised for a float
  consumer's ``DequantizeLinear`` gives that consumer, in one node. With ``y_clip`` (two
  floats ``[lo, hi]``) the result is clamped to that range before its output's quantisation:
  the range of a quantisation the model made between the product and this one, which
  ``requantize_product`` took over (a value the model clamped there stays clamped). A QConv's
  ``conv_clip`` clamps the convolution's result, its bias included, before the residual is
  added: the range of the convolution's own quantisation, which ``qdq_residual`` took over.
- ``QLinear(x, w, w_scale, b?)``: the same over a product ``x @ w`` (``w`` [K, N], or [N, K]
  with ``trans_b``; ``w_scale`` one per column N or one), ``x`` of any rank >= 1. With
  ``mid_activation`` ("gelu" / "gelu_tanh", ONNX Gelu's two forms) and a quantised output,
  the result is first snapped to the grid of ``mid_grid`` (a DType code of uint8 / int8)
  with ``mid_scale`` / ``mid_zero_point``, that activation applied in float32, and the
  result quantised with ``y_*`` (or put on their grid, ``y_grid``): ``Q(gelu(DQ(Q_mid(y))))``,
  a transformer's first FFN product and its GELU between a DequantizeLinear and a
  QuantizeLinear, in one node. With ``post_bias`` (N floats, beside a ``y_clip``, without an
  activation) the clamped result has that bias added per column before its quantisation:
  ``Q(clamp(y, y_clip) + post_bias)``, a product quantised by the model, dequantised and given
  a bias before the next quantisation, which ``qdq_bias`` took over where the second range
  reaches beyond the first (the clamp comes before that bias).
- ``Requantize(x, c1?, c2? ...)``: ``Q(DQ(x))`` from (``x_scale``, ``x_zero_point``) to
  (``y_scale``, ``y_zero_point``, ``y_type``); with ``steps`` (``"Mul 1"``, ``"Add 2"`` ...:
  an op of ``AFFINE_STEPS`` and the input holding its float32 constant), ``Q(DQ(x) op c1 op
  c2 ...)``, each step in float32 in order with the running value first (a pre-activation
  BatchNorm between two int8 convolutions); the constants broadcast over ``x`` without
  enlarging it.
- ``QAdd(a, b)``: ``Q(act(DQ(a) + DQ(b)))`` (numpy broadcasting), ``a_*`` / ``b_*`` / ``y_*``.
- ``QMatMul(a, b)``: ``Q(DQ(a) @ DQ(b))`` of two quantised activations (attention's scores and
  its weighted sum in a QDQ transformer), ``a_*`` / ``b_*`` / ``y_*``, an int8 / uint8 output,
  or float32 on a grid (``y_grid``, as the products).

Each op's own kernel is its reference form, portable ATen: dequantise in float32 as
``DequantizeLinear`` does (``(x - zero point) * scale``), compute in float32, quantise as
``QuantizeLinear`` does (``x / scale`` rounded half to even, plus the zero point, saturated);
int32 outputs are exact integer sums. An int8 backend kernel (``runtime/backends/cpu/dnnl/
conv_int8.py``, ``linear_int8.py``) sums the integer products exactly and scales in float32:
within one quantisation step of this form (a rounding tie may fall the other way). A group
whose intermediate was quantised twice in the model (a product's output requantised for a
residual add or a concat) rounds once here: ``passes/quantize_qdq.py`` states the bound.
Registry facts: data-movement class none (they compute), no precision class (the policy's
default keeps float32: their integer types are the model's, and the precision pass only
casts float values), a value-range transfer (``QuantisedRange``: an integer output holds its
type's range). No pass logic here.
"""
from __future__ import annotations

import math

import torch

from ..ir import DType
from .conv import ConvGeometry, check_rank, conv_call, conv_infer, int_conv
from .fused_cnn import conv_terms
from .fused_basic import linear_terms
from .linalg import int_matmul
from .registry import FusionKind, NodeContext, register
from .value_range import Fact

DOMAIN = "fusegraph"
QUANTISED = (DType.UINT8, DType.INT8)
OUT_TYPES = (DType.UINT8, DType.INT8, DType.FLOAT, DType.INT32)
ACTIVATIONS = ("", "relu")
MID_ACTIVATIONS = {"gelu": "none", "gelu_tanh": "tanh"}      # mid_activation -> torch's ``approximate``
RANGE = {DType.UINT8: (0, 255), DType.INT8: (-128, 127)}


# ---------------------------------------------------------------- shared pieces

def y_type(ctx_or_attrs) -> DType:
    attrs = ctx_or_attrs.node.attrs if isinstance(ctx_or_attrs, NodeContext) else ctx_or_attrs
    return DType(int(attrs.get("y_type", int(DType.UINT8))))


def dequantize(x: torch.Tensor, scale: float, zero_point: int) -> torch.Tensor:
    """``DequantizeLinear`` with a per-tensor scale: ``(x - zp) * scale`` in float32."""
    xf = x.to(torch.float32)
    if zero_point:
        xf = xf - float(zero_point)
    return xf * torch.tensor(scale, dtype=torch.float32)


def quantize(y: torch.Tensor, scale: float, zero_point: int, dt: DType) -> torch.Tensor:
    """``QuantizeLinear`` of float32 ``y`` with a per-tensor scale: ``y / scale`` rounded half
    to even, plus the zero point, saturated to ``dt``."""
    lo, hi = RANGE[dt]
    q = torch.round(y / torch.tensor(scale, dtype=torch.float32))
    if zero_point:
        q = q + float(zero_point)
    return q.clamp_(lo, hi).to(dt.to_torch())


def _output(y: torch.Tensor, yt: DType, grid: DType | None, scale: float, zero_point: int,
            clip: tuple[float, float] | None = None, after_clip: torch.Tensor | None = None) -> torch.Tensor:
    """A product's float32 result ``y`` as the node's output: clamped to ``clip`` (NaN stays
    NaN) and ``after_clip`` added (a bias along the last axis), then quantised to ``yt``,
    snapped to ``grid``'s quantisation grid (``DQ(Q(y))``), or as it is."""
    if clip is not None:
        y = y.clamp(clip[0], clip[1])
    if after_clip is not None:
        y = y + after_clip
    if grid is not None:
        return dequantize(quantize(y, scale, zero_point, grid), scale, zero_point)
    return y if yt == DType.FLOAT else quantize(y, scale, zero_point, yt)


def _write(result: torch.Tensor, out):
    if out is None:
        return result
    out.copy_(result)
    return out


def _qparams(ctx: NodeContext, name: str, default_scale: float | None = None) -> tuple[float, int]:
    """The ``{name}_scale`` / ``{name}_zero_point`` attributes (zero point 0 when absent; the
    scale ``default_scale`` when given, else required)."""
    scale = ctx.attr(f"{name}_scale") if default_scale is None else ctx.attr(f"{name}_scale", default_scale)
    return float(scale), int(ctx.attr(f"{name}_zero_point", 0))


def _grid(ctx_or_attrs, key: str) -> DType | None:
    """The 8-bit integer type whose code the attribute ``key`` holds, or None."""
    attrs = ctx_or_attrs.node.attrs if isinstance(ctx_or_attrs, NodeContext) else ctx_or_attrs
    code = int(attrs.get(key, 0))
    return DType(code) if code in [int(t) for t in QUANTISED] else None


def clip_range(ctx_or_attrs, key: str = "y_clip") -> tuple[float, float] | None:
    """The ``[lo, hi]`` a product's result is clamped to before its output's quantisation
    (``key`` "conv_clip": a QConv's result before its residual), or None; ``ValueError``
    naming the attribute where it is not two finite numbers with ``lo <= hi``."""
    attrs = ctx_or_attrs.node.attrs if isinstance(ctx_or_attrs, NodeContext) else ctx_or_attrs
    clip = attrs.get(key)
    if clip is None:
        return None
    try:
        lo, hi = (float(v) for v in clip)
    except (TypeError, ValueError):
        raise ValueError(f"{key} {clip!r} (two numbers)") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
        raise ValueError(f"{key} {clip!r} (a finite [lo, hi], lo <= hi)")
    return lo, hi


def post_bias(ctx_or_attrs, n: int) -> torch.Tensor | None:
    """A QLinear's ``post_bias`` as ``n`` float32 values, or None; ``ValueError`` naming the
    attribute where it is not ``n`` finite numbers or comes without a ``y_clip``."""
    attrs = ctx_or_attrs.node.attrs if isinstance(ctx_or_attrs, NodeContext) else ctx_or_attrs
    values = attrs.get("post_bias")
    if values is None:
        return None
    try:
        t = torch.tensor([float(v) for v in values], dtype=torch.float32)
    except (TypeError, ValueError):
        raise ValueError(f"post_bias (a list of {n} numbers)") from None
    if t.numel() != n or not bool(torch.isfinite(t).all()):
        raise ValueError(f"post_bias of {t.numel()} values (want {n} finite numbers, one per column)")
    if attrs.get("y_clip") is None:
        raise ValueError("post_bias without a y_clip (a bias before no clamp belongs in the bias input)")
    return t


def y_grid(ctx_or_attrs) -> DType | None:
    """The integer type whose quantisation grid a float32 output is snapped to, or None."""
    return _grid(ctx_or_attrs, "y_grid")


def mid_grid(ctx_or_attrs) -> DType | None:
    """The integer type whose grid a product's result is snapped to before its
    ``mid_activation`` (``QLinear``), or None."""
    return _grid(ctx_or_attrs, "mid_grid")


def check_mid(ctx: NodeContext, yt: DType) -> None:
    """The ``mid_*`` attributes of a QLinear: all or none, on a quantised output (or one on
    its ``y_grid``) without a Relu, an activation of ``MID_ACTIVATIONS``, a grid of an 8-bit type."""
    act = str(ctx.attr("mid_activation", ""))
    if not act and not any(ctx.attr(f"mid_{k}", None) is not None for k in ("grid", "scale", "zero_point")):
        return
    if act not in MID_ACTIVATIONS:
        raise ctx.unsupported(f"mid_activation {act!r} (known: {sorted(MID_ACTIVATIONS)})")
    if (yt not in QUANTISED and y_grid(ctx) is None) or str(ctx.attr("activation", "")):
        raise ctx.unsupported("mid_activation on an output neither quantised nor on a grid, or with an activation")
    grid = mid_grid(ctx)
    if grid is None:
        raise ctx.unsupported(f"mid_grid {ctx.attr('mid_grid', None)} (the code of uint8 or int8)")
    s = float(ctx.attr("mid_scale", math.nan))
    if not (math.isfinite(s) and s > 0):
        raise ctx.unsupported(f"mid_scale {s} is not a positive finite number")
    lo, hi = RANGE[grid]
    if not lo <= int(ctx.attr("mid_zero_point", 0)) <= hi:
        raise ctx.unsupported(f"mid_zero_point outside {grid.name}")


def _check_common(ctx: NodeContext, inputs=("x",), grid_ok: bool = False, mid_ok: bool = False,
                  clip_ok: bool = False) -> DType:
    """The output type, after checking the attributes every quantised op reads (``y_grid``
    only where ``grid_ok``: the products; ``mid_*`` only where ``mid_ok``: QLinear; ``y_clip``
    only where ``clip_ok``: QConv and QLinear)."""
    yt = y_type(ctx)
    if yt not in OUT_TYPES:
        raise ctx.unsupported(f"y_type {yt.name} (uint8, int8, float32 or int32)")
    for key in ("y_clip", "conv_clip"):
        try:
            clip = clip_range(ctx, key)
        except ValueError as exc:
            raise ctx.unsupported(str(exc)) from None
        ok = clip_ok and (key == "y_clip" or ctx.node.op_type == "QConv")
        if clip is not None and (not ok or yt == DType.INT32):
            raise ctx.unsupported(f"{key} on a {ctx.node.op_type} with a {yt.name} output (only on a QConv"
                                  f"{'' if key == 'conv_clip' else ' / QLinear'} output that is quantised or float32)")
    if ctx.node.attrs.get("post_bias") is not None and (ctx.node.op_type != "QLinear" or yt == DType.INT32
                                                      or str(ctx.attr("activation", ""))
                                                      or ctx.attr("mid_activation", None) is not None):
        raise ctx.unsupported("post_bias (only on a QLinear without an activation, its output quantised or float32)")
    if mid_ok:
        check_mid(ctx, yt)
    elif any(k.startswith("mid_") for k in ctx.node.attrs):
        raise ctx.unsupported(f"mid_* attributes ({ctx.node.op_type} has no mid_activation)")
    grid = int(ctx.attr("y_grid", 0))
    if grid and (not grid_ok or yt != DType.FLOAT or y_grid(ctx) is None):
        raise ctx.unsupported(f"y_grid {grid} (the code of uint8 or int8, on a product's float32 output)")
    for name in inputs:
        s = float(ctx.attr(f"{name}_scale"))
        if not (math.isfinite(s) and s > 0):
            raise ctx.unsupported(f"{name}_scale {s} is not a positive finite number")
    qt = y_grid(ctx) or yt
    if qt in QUANTISED:
        s = float(ctx.attr("y_scale"))
        if not (math.isfinite(s) and s > 0):
            raise ctx.unsupported(f"y_scale {s} is not a positive finite number")
        lo, hi = RANGE[qt]
        if not lo <= int(ctx.attr("y_zero_point", 0)) <= hi:
            raise ctx.unsupported(f"y_zero_point outside {qt.name}")
    if str(ctx.attr("activation", "")) not in ACTIVATIONS:
        raise ctx.unsupported(f"activation {ctx.attr('activation')!r} (known: {ACTIVATIONS})")
    return yt


def _infer_as(shape_of):
    def infer(ctx: NodeContext):
        return [(y_type(ctx), shape_of(ctx))]
    return infer


class QuantisedRange:
    """The value-range transfer of a quantised op: an integer output holds its type's range;
    a float32 output is bounded by the dequantised input bound times the weight's gain
    (``terms`` products of at most 128 times the largest weight scale), plus the bias and the
    residual (``inputs``: the attribute prefixes of the dequantised inputs)."""

    def __init__(self, terms=None, inputs=("x",)):
        self.terms, self.inputs = terms, inputs

    def __call__(self, node, ins):
        yt, grid = y_type(node.attrs), y_grid(node.attrs)
        if grid in RANGE:        # a float32 output on the grid: the grid's extreme points
            lo, hi = RANGE[grid]
            zp = int(node.attrs.get("y_zero_point", 0))
            return [Fact(float(max(abs(lo - zp), abs(hi - zp))) * float(node.attrs.get("y_scale", math.inf)))]
        if yt in RANGE:
            lo, hi = RANGE[yt]
            return [Fact(float(max(abs(lo), abs(hi))))]
        if yt == DType.INT32:
            return [Fact(2.0 ** 31)]
        xb = [255.0 * float(node.attrs.get(f"{p}_scale", math.inf)) for p in self.inputs]
        if self.terms is None:
            return [Fact(sum(xb))]
        n = self.terms(node)
        w = ins[2] if len(ins) > 2 else Fact(math.inf)
        bound = xb[0] * 128.0 * w.bound * (math.inf if n is None else n)
        b = ins[3] if len(ins) > 3 else Fact(0.0)
        z = 255.0 * float(node.attrs.get("z_scale", 0.0)) if len(ins) > 4 else 0.0
        after = max((abs(float(v)) for v in node.attrs.get("post_bias") or ()), default=0.0)
        return [Fact(bound + b.bound + z + after, w.nan or b.nan, w.inf or b.inf)]


def _weight_cache():
    """The float32 weight ``w * w_scale`` of the last call, kept while both are unchanged
    (a reference kernel dequantises its constant weight once, not on every run)."""
    held: dict = {}

    def dequantized(w: torch.Tensor, w_scale: torch.Tensor, shape) -> torch.Tensor:
        key = (w.data_ptr(), w._version, tuple(w.shape), w_scale.data_ptr(), w_scale._version)
        if held.get("key") != key:
            held["key"] = key
            held["w"] = w.to(torch.float32) * w_scale.to(torch.float32).reshape(shape)
        return held["w"]
    return dequantized


# ---------------------------------------------------------------- QConv

def _qconv_infer(ctx: NodeContext):
    return [(y_type(ctx), conv_infer(ctx)[0][1])]


@register("QConv", domain=DOMAIN, since=1, fusion=FusionKind.OPAQUE, layout_sensitive=True, infer=_qconv_infer,
          writes_out=True, inplace=((4, 0),), value_range=QuantisedRange(conv_terms))
def _qconv(ctx: NodeContext):
    check_rank(ctx)
    yt = _check_common(ctx, grid_ok=True, clip_ok=True)
    geo = ConvGeometry(ctx)
    (xs, xzp), (ys, yzp), (zs, zzp) = _qparams(ctx, "x"), _qparams(ctx, "y", 1.0), _qparams(ctx, "z", 1.0)
    relu = str(ctx.attr("activation", "")) == "relu"
    grid, clip, conv_clip = y_grid(ctx), clip_range(ctx), clip_range(ctx, "conv_clip")
    weight = _weight_cache()

    def qconv(x, w, w_scale, b=None, z=None, out=None):
        if yt == DType.INT32:
            zp = torch.tensor([xzp], dtype=torch.int32) if xzp else None
            return _write(int_conv(x, w, zp, None, geo).to(torch.int32), out)
        lead = (-1,) + (1,) * (w.dim() - 1)
        wf = weight(w, w_scale, lead if w_scale.numel() > 1 else ())
        s, d, begin, end = geo.resolve(tuple(x.shape[2:]), tuple(w.shape[2:]))
        y = conv_call(dequantize(x, xs, xzp), wf, None if b is None else b.to(torch.float32),
                      s, d, geo.group, begin, end)
        if conv_clip is not None:
            y = y.clamp(conv_clip[0], conv_clip[1])
        if z is not None:
            y = y + dequantize(z, zs, zzp)
        if relu:
            y = y.relu_()
        return _write(_output(y, yt, grid, ys, yzp, clip), out)
    return qconv


# ---------------------------------------------------------------- QLinear

def _qlinear_shape(ctx: NodeContext):
    xs, ws = ctx.shape(0), ctx.shape(1)
    if ws is not None and len(ws) != 2:
        raise ValueError(f"QLinear weight must be 2-D, got rank {len(ws)}")
    if xs is None or ws is None:
        return None
    return tuple(xs[:-1]) + (ws[0] if ctx.attr("trans_b", 0) else ws[1],)


@register("QLinear", domain=DOMAIN, since=1, fusion=FusionKind.OPAQUE, infer=_infer_as(_qlinear_shape),
          writes_out=True, value_range=QuantisedRange(linear_terms))
def _qlinear(ctx: NodeContext):
    yt = _check_common(ctx, grid_ok=True, mid_ok=True, clip_ok=True)
    trans_b = bool(ctx.attr("trans_b", 0))
    (xs, xzp), (ys, yzp) = _qparams(ctx, "x"), _qparams(ctx, "y", 1.0)
    relu = str(ctx.attr("activation", "")) == "relu"
    grid, clip = y_grid(ctx), clip_range(ctx)
    ws = ctx.shape(1)
    try:
        after = None if ws is None else post_bias(ctx, ws[0] if trans_b else ws[1])
    except ValueError as exc:
        raise ctx.unsupported(str(exc)) from None
    if after is None and ctx.node.attrs.get("post_bias") is not None:
        raise ctx.unsupported("post_bias on a QLinear whose weight shape is not known")
    mid = MID_ACTIVATIONS.get(str(ctx.attr("mid_activation", "")))
    if mid is not None:
        (ms, mzp), mgrid = _qparams(ctx, "mid"), mid_grid(ctx)
    weight = _weight_cache()

    def qlinear(x, w, w_scale, b=None, out=None):
        wt = w.t() if trans_b else w                   # [K, N]
        if yt == DType.INT32:
            zp = torch.tensor([xzp], dtype=torch.int32) if xzp else None
            return _write(int_matmul(x, wt, zp, None).to(torch.int32), out)
        wf = weight(w, w_scale, ((-1, 1) if trans_b else (1, -1)) if w_scale.numel() > 1 else ())
        y = torch.matmul(dequantize(x, xs, xzp), wf.t() if trans_b else wf)
        if b is not None:
            y = y + b.to(torch.float32)
        if relu:
            y = y.relu_()
        if mid is not None:
            y = torch.nn.functional.gelu(_output(y, DType.FLOAT, mgrid, ms, mzp), approximate=mid)
        return _write(_output(y, yt, grid, ys, yzp, clip, after), out)
    return qlinear


# ---------------------------------------------------------------- Requantize, QAdd

@register("Requantize", domain=DOMAIN, since=1, fusion=FusionKind.ELEMENTWISE,
          infer=_infer_as(lambda ctx: ctx.shape(0)), writes_out=True,
          value_range=QuantisedRange())
def _requantize(ctx: NodeContext):
    yt = _check_common(ctx)
    if yt not in QUANTISED:
        raise ctx.unsupported(f"Requantize to {yt.name}")
    (xs, xzp), (ys, yzp) = _qparams(ctx, "x"), _qparams(ctx, "y")
    try:
        steps = affine_steps(ctx.attr("steps", []), ctx.n_inputs)
    except ValueError as exc:
        raise ctx.unsupported(str(exc)) from None

    def requantize(x, *constants, out=None):
        y = dequantize(x, xs, xzp)
        for op, k in steps:
            y = AFFINE_STEPS[op](y, constants[k - 1].to(torch.float32))
        return _write(quantize(y, ys, yzp, yt), out)
    return requantize


AFFINE_STEPS = {"Mul": torch.mul, "Add": torch.add, "Sub": torch.sub, "Div": torch.div}


def affine_steps(steps, n_inputs: int) -> list[tuple[str, int]]:
    """``Requantize``'s ``steps`` as (op, input index) pairs; ``ValueError`` naming a step
    that is not an op of ``AFFINE_STEPS`` and an input index in 1..n_inputs - 1."""
    out = []
    for step in steps:
        parts = str(step).split()
        if len(parts) != 2 or parts[0] not in AFFINE_STEPS or not parts[1].isdigit() \
                or not 1 <= int(parts[1]) < n_inputs:
            raise ValueError(f"Requantize step {step!r}: expected '<{'|'.join(AFFINE_STEPS)}> <input 1..{n_inputs - 1}>'")
        out.append((parts[0], int(parts[1])))
    return out


def _qadd_shape(ctx: NodeContext):
    from ..ir.shape import broadcast_shapes
    return broadcast_shapes(ctx.shape(0), ctx.shape(1))


@register("QAdd", domain=DOMAIN, since=1, fusion=FusionKind.BROADCAST, infer=_infer_as(_qadd_shape),
          writes_out=True, value_range=QuantisedRange(inputs=("a", "b")))
def _qadd(ctx: NodeContext):
    yt = _check_common(ctx, ("a", "b"))
    (a_s, a_zp), (b_s, b_zp), (ys, yzp) = _qparams(ctx, "a"), _qparams(ctx, "b"), _qparams(ctx, "y", 1.0)
    relu = str(ctx.attr("activation", "")) == "relu"
    if yt == DType.INT32:
        raise ctx.unsupported("QAdd to int32")

    def qadd(a, b, out=None):
        y = dequantize(a, a_s, a_zp) + dequantize(b, b_s, b_zp)
        if relu:
            y = y.relu_()
        return _write(y if yt == DType.FLOAT else quantize(y, ys, yzp, yt), out)
    return qadd


# ---------------------------------------------------------------- QMatMul

def _qmatmul_shape(ctx: NodeContext):
    from .linalg import matmul_shape
    return matmul_shape(ctx.shape(0), ctx.shape(1))


@register("QMatMul", domain=DOMAIN, since=1, fusion=FusionKind.OPAQUE, infer=_infer_as(_qmatmul_shape),
          writes_out=True, value_range=QuantisedRange(inputs=("a", "b")))
def _qmatmul(ctx: NodeContext):
    yt = _check_common(ctx, ("a", "b"), grid_ok=True)
    grid = y_grid(ctx)
    if yt not in QUANTISED and grid is None:
        raise ctx.unsupported(f"QMatMul to {yt.name} (uint8 / int8, or float32 on a grid)")
    (a_s, a_zp), (b_s, b_zp), (ys, yzp) = _qparams(ctx, "a"), _qparams(ctx, "b"), _qparams(ctx, "y")

    def qmatmul(a, b, out=None):
        y = torch.matmul(dequantize(a, a_s, a_zp), dequantize(b, b_s, b_zp))
        return _write(_output(y, yt, grid, ys, yzp), out)
    return qmatmul
