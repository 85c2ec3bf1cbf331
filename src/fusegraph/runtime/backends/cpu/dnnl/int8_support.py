"""What the int8 kernels (``conv_int8.py``, ``linear_int8.py``) need from oneDNN beyond a
primitive: whether its int8 products are exact on this CPU, and the constant arguments that
carry a node's scales and zero points.

``int8_exact()``: oneDNN sums uint8 x int8 products exactly in int32 where the CPU has int8
dot products (AVX512-VNNI, AVX-VNNI, AMX). Without them (AVX2, AVX-512 without VNNI) its int8
kernels multiply in 16 bits and halve every weight to stay clear of saturation: a weight of
odd value is rounded, and the results of a quantised model move by several quantisation
steps (a 3x3x64 convolution of full-range inputs: up to 33 steps). One small convolution and
one small product of full-range values, checked against the exact sums, say which kind of
CPU this is (asked once); where they are not exact the int8 kernels decline and the ops run
in float32 on the dequantised values (``int8_float.py`` on oneDNN's float32 kernels, else their
reference form: ``ops/quantized.py``).

``QuantArgs``: the execution arguments of a primitive made with ``Attr(scales=...,
zero_points=...)``: float32 scales and int32 zero points, each a memory over a tensor it
keeps alive.

``grid_post_ops``: the steps that put a product's float32 result on its quantisation grid
(``DQ(Q(y))`` in the epilogue: ``y_grid``), taken only where the epilogue cannot hold NaN;
``mid_post_ops``: a QLinear's grid and GELU before its output's quantisation (``mid_*``).

``clip_post_ops``: a product's ``y_clip`` as oneDNN's ``clip`` before its output's
quantisation (a QConv's ``conv_clip`` before its residual's ``sum``), taken only where the
epilogue cannot hold NaN (oneDNN's clip maps it to a bound); ``post_bias_post_ops``: a
QLinear's ``post_bias`` after that clip, a binary ``add`` of one value per column.

``relu_post_op``: a fused Relu as oneDNN's ``relu`` (one max per value) where the kernel's
float epilogue cannot hold NaN, else as ``elu`` with alpha 0, which keeps NaN (oneDNN's relu
maps it to 0) at the price of an exponential per value. The epilogue's inputs are integers,
so it can hold NaN only through its constants (a NaN scale or bias) or an overflow; both are
ruled out at bind time from the constants themselves. Where it cannot, the two agree on every
value but a negative one, where ``relu`` gives ONNX's +0 and ``elu`` gives -0.
"""
from __future__ import annotations

import functools
import math

import torch

from .....errors import UnsupportedOpError
from .....ir import DType
from .....ops.quantized import RANGE, check_mid, clip_range, mid_grid, post_bias, y_grid, y_type
from ...protocol import Decline
from . import capi
from .capi import Dims
from .memory import MemDesc, Memory
from .primitive import Attr, create, reorder, thread_stream


def _run(prim, args: dict[int, tuple[MemDesc, torch.Tensor]]) -> None:
    scratch = torch.empty(max(prim.scratchpad_bytes, 1), dtype=torch.uint8)
    mems = [(arg, Memory(md, t.data_ptr())) for arg, (md, t) in args.items()]
    if prim.scratchpad_bytes:
        mems.append((capi.ARG_SCRATCHPAD, Memory(MemDesc.tagged([scratch.numel()], capi.U8, capi.TAG_A),
                                                   scratch.data_ptr())))
    arr = (capi.ExecArg * len(mems))(*[capi.ExecArg(a, m.handle) for a, m in mems])
    capi.check(capi.load().execute(prim.handle, thread_stream(), len(mems), arr), "execute int8 probe")


def _operands(k: int):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(200, 256, (4, k), dtype=torch.uint8, generator=g)
    w = torch.randint(-128, 128, (k, 16), dtype=torch.int8, generator=g) | 1      # odd weights, both signs
    return x, w


def _matmul_exact(lib) -> bool:
    x, w = _operands(64)
    x_md, y_md = MemDesc.of(x.shape, torch.uint8), MemDesc.of((4, 16), torch.int32)
    w_any = MemDesc.tagged([64, 16], capi.S8, capi.TAG_ANY)
    attr = Attr()
    prim = create("matmul", lambda pd: lib.matmul_primitive_desc_create(
        pd, lib.engine, x_md.handle, w_any.handle, None, y_md.handle, attr.handle))
    w_md = prim.md(capi.Q_WEIGHTS_MD)
    packed = torch.empty(max(w_md.size, 1), dtype=torch.uint8)
    reorder(MemDesc.of(w.shape, torch.int8), w.data_ptr(), w_md, packed.data_ptr())
    y = torch.empty((4, 16), dtype=torch.int32)
    _run(prim, {capi.ARG_SRC: (x_md, x), capi.ARG_WEIGHTS: (w_md, packed), capi.ARG_DST: (y_md, y)})
    return torch.equal(y.to(torch.int64), x.to(torch.int64) @ w.to(torch.int64))


def _conv_exact(lib) -> bool:
    x8, w8 = _operands(64)
    x = x8[:1].reshape(1, 64, 1, 1).expand(1, 64, 3, 3).contiguous(memory_format=torch.channels_last)
    w = w8.t().reshape(16, 64, 1, 1).repeat(1, 1, 3, 3).contiguous()
    ys = (1, 16, 1, 1)
    x_md, y_md = MemDesc.of(x.shape, torch.uint8, x.stride()), MemDesc.of(ys, torch.int32)
    w_any = MemDesc.tagged(list(w.shape), capi.S8, capi.TAG_ANY)
    attr = Attr()
    prim = create("convolution", lambda pd: lib.convolution_forward_primitive_desc_create(
        pd, lib.engine, capi.FORWARD_INFERENCE, capi.CONVOLUTION_DIRECT, x_md.handle, w_any.handle, None,
        y_md.handle, Dims(1, 1), Dims(0, 0), Dims(0, 0), Dims(0, 0), attr.handle))
    w_md = prim.md(capi.Q_WEIGHTS_MD)
    packed = torch.empty(max(w_md.size, 1), dtype=torch.uint8)
    reorder(MemDesc.tagged(list(w.shape), capi.S8, capi.TAG_ABCD), w.data_ptr(), w_md, packed.data_ptr())
    y = torch.empty(ys, dtype=torch.int32)
    _run(prim, {capi.ARG_SRC: (x_md, x), capi.ARG_WEIGHTS: (w_md, packed), capi.ARG_DST: (y_md, y)})
    exact = (x.to(torch.int64) * w.to(torch.int64)).sum(dim=(1, 2, 3))
    return torch.equal(y.reshape(-1).to(torch.int64), exact)


@functools.cache
def int8_exact() -> bool:
    """Whether oneDNN's int8 convolutions and products sum exactly on this CPU."""
    lib = capi.load()
    if lib is None:
        return False
    try:
        return _matmul_exact(lib) and _conv_exact(lib)
    except capi.DnnlError:
        return False


NOT_EXACT = ("oneDNN's int8 kernels on this CPU (no int8 dot products: AVX512-VNNI / AVX-VNNI / AMX) round "
             "odd weights; the reference form (float32 on the dequantised values) runs instead")


class QuantArgs:
    """Constant execution arguments for scales (float32) and zero points (int32)."""

    def __init__(self):
        self.args: list[tuple[int, Memory]] = []
        self.keep: list = []

    def scales(self, arg: int, values) -> None:
        t = torch.as_tensor(values, dtype=torch.float32).reshape(-1).contiguous()
        self._add(capi.ARG_ATTR_SCALES | arg, t)

    def zero_point(self, arg: int, value: int) -> None:
        self._add(capi.ARG_ATTR_ZERO_POINTS | arg, torch.tensor([int(value)], dtype=torch.int32))

    def _add(self, arg: int, t: torch.Tensor) -> None:
        md = MemDesc.of((t.numel(),), t.dtype)
        self.args.append((arg, Memory(md, t.data_ptr())))
        self.keep.extend([t, md])


EPILOGUE_LIMIT = 1e37       # a float32 magnitude the epilogue's sums stay under, with room to round


def epilogue_bound(terms: int, x_scale: float, w_scales: torch.Tensor, bias: torch.Tensor | None = None,
                   z_scale: float = 0.0, w_range: int = 128) -> float:
    """The largest magnitude ``x_scale * w_scale * sum + bias + z_scale * (z - z_zp)`` of an
    int8 convolution or product over ``terms`` products a sum (input channels x kernel taps,
    or K) can reach for any integer inputs, the second operand's ``|w - w_zp|`` at most
    ``w_range`` (128: a weight; 255: an activation); inf where a constant is not finite."""
    ws = w_scales.detach().to(torch.float64).abs()
    b = bias.detach().to(torch.float64).abs() if bias is not None and bias.numel() else torch.zeros(1, dtype=torch.float64)
    constants = (x_scale, z_scale, float(ws.max()) if ws.numel() else 0.0, float(b.max()))
    if not all(math.isfinite(c) for c in constants):
        return math.inf
    # |x - x_zp| <= 255 and |w - w_zp| <= w_range: the int32 sum's bound; |z - z_zp| <= 255
    return abs(x_scale) * constants[2] * terms * 255 * w_range + constants[3] + abs(z_scale) * 255


def relu_post_op(terms: int, x_scale: float, w_scales: torch.Tensor, bias: torch.Tensor | None = None,
                 z_scale: float = 0.0) -> tuple:
    """The eltwise post-op of a Relu fused into an int8 convolution or product: ``relu`` where
    its epilogue is finite for every integer input (``epilogue_bound`` under
    ``EPILOGUE_LIMIT``), ``elu`` with alpha 0 otherwise (NaN stays NaN)."""
    if epilogue_bound(terms, x_scale, w_scales, bias, z_scale) < EPILOGUE_LIMIT:
        return ("eltwise", "relu", 0.0, 0.0)
    return ("eltwise", "elu", 0.0, 0.0)


def grid_declines(ctx, out_type: DType) -> Decline | None:
    """Why a node's ``y_grid`` cannot be run (no 8-bit type's code, or on an output that is not
    float32: the reference form refuses it with the reason), or None."""
    if int(ctx.attr("y_grid", 0)) and (out_type != DType.FLOAT or y_grid(ctx) is None):
        return Decline(f"y_grid {ctx.attr('y_grid')} (uint8's or int8's code, on a float32 output)", "dnnl")
    return None


def grid_post_ops(ctx, rank: int, first: int, bound: float, prefix: str = "y") -> tuple[list, list, list] | Decline:
    """The post-ops that snap an int8 kernel's float32 result to its node's quantisation grid
    (``y_grid``: ``DQ(Q(y))`` with ``y_scale`` / ``y_zero_point``; with ``prefix`` "mid", a
    QLinear's ``mid_grid`` before its ``mid_activation``, ``mid_post_ops``), starting at
    post-op index ``first``: a binary ``div`` by the scale (a true division, as
    QuantizeLinear's), rounded half to even, clipped to the grid type's range less the zero
    point (saturation), times the scale (DequantizeLinear's product of the exact integer ``q -
    zp``). Returns (post-ops, constant execution arguments, what they point at); ([], [], [])
    without a grid; a ``Decline`` where the epilogue's ``bound`` (``epilogue_bound``) lets it
    hold NaN, which these steps would not quantise as QuantizeLinear does."""
    grid = y_grid(ctx) if prefix == "y" else mid_grid(ctx)
    if grid is None:
        return [], [], []
    if not bound < EPILOGUE_LIMIT:
        return Decline("a result on a quantisation grid whose epilogue could hold NaN", "dnnl")
    scale, zero = float(ctx.attr(f"{prefix}_scale")), int(ctx.attr(f"{prefix}_zero_point", 0))
    lo, hi = RANGE[grid]
    scalar_md = MemDesc.of((1,) * rank, torch.float32)
    divisor = torch.tensor([scale], dtype=torch.float32).reshape((1,) * rank)
    post = [("binary", "div", scalar_md), ("eltwise", "round", 0.0, 0.0),
            ("eltwise", "clip", float(lo - zero), float(hi - zero)), ("eltwise", "linear", scale, 0.0)]
    return post, [(capi.arg_post_op_src1(first), Memory(scalar_md, divisor.data_ptr()))], [divisor, scalar_md]


def clip_post_ops(ctx, bound: float, key: str = "y_clip") -> list | Decline:
    """The node's ``y_clip`` (or ``key``: a QConv's ``conv_clip``) as oneDNN's ``clip`` (``[]``
    without one); a ``Decline`` where the epilogue's ``bound`` (``epilogue_bound``) lets it
    hold NaN, which the op's own clamp keeps."""
    try:
        clip = clip_range(ctx, key)
    except ValueError as exc:             # the op's own check refuses it with the same reason
        return Decline(str(exc), "dnnl")
    if clip is None:
        return []
    if not bound < EPILOGUE_LIMIT:
        return Decline("a clipped result whose epilogue could hold NaN", "dnnl")
    return [("eltwise", "clip", clip[0], clip[1])]


def post_bias_post_ops(ctx, n: int, first: int, bound: float = 0.0) -> tuple[list, list, list, float] | Decline:
    """A QLinear's ``post_bias`` (added after its ``y_clip``) as a binary ``add`` of a ``[1,
    n]`` float32 row at post-op index ``first``: (post-ops, constant execution arguments, what
    they point at, the epilogue's ``bound`` with the row's largest magnitude added); ([], [],
    [], bound) without one; a ``Decline`` with the op's own reason where it is not one the op
    takes."""
    try:
        row = post_bias(ctx, n)
    except ValueError as exc:             # the op's own check refuses it with the same reason
        return Decline(str(exc), "dnnl")
    if row is None:
        return [], [], [], bound
    row = row.reshape(1, n).contiguous()
    md = MemDesc.of((1, n), torch.float32)
    return ([("binary", "add", md)], [(capi.arg_post_op_src1(first), Memory(md, row.data_ptr()))], [row, md],
            bound + float(row.abs().max()))


MID_ELTWISE = {"gelu": "gelu_erf", "gelu_tanh": "gelu_tanh"}      # mid_activation -> oneDNN's eltwise


def mid_post_ops(ctx, rank: int, first: int, bound: float) -> tuple[list, list, list] | Decline:
    """A QLinear's ``mid_*`` as post-ops from index ``first``: its grid (``grid_post_ops``)
    and its GELU as oneDNN's eltwise, which computes ATen's GELU on finite values (the grid
    keeps them finite: it declines where the epilogue could not be); the output's own
    quantisation (``y_*``) follows, as the destination's scale and zero point or as its
    grid's post-ops (``y_grid``). ([], [], []) without ``mid_*`` attributes; a ``Decline``
    with the op's own reason where they are not ones it runs."""
    try:
        check_mid(ctx, y_type(ctx))
    except UnsupportedOpError as exc:     # the op's own kernel refuses the node with the reason
        return Decline(str(exc), "dnnl")
    act = str(ctx.attr("mid_activation", ""))
    if not act:                           # (check_mid admits no other mid_* without it)
        return [], [], []
    grid = grid_post_ops(ctx, rank, first, bound, prefix="mid")
    if isinstance(grid, Decline):
        return grid
    ops, args, keep = grid
    return ops + [("eltwise", MID_ELTWISE[act], 0.0, 0.0)], args, keep
