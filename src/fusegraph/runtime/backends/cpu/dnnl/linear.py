"""``fusegraph::LinearAct`` / ``fusegraph::Linear`` with a constant weight as one oneDNN matmul:
``act(x @ W + b)``.

``x`` of shape ``[..., K]`` is read as ``[M, K]`` (row-major, as the layout pass leaves
non-4-D values; another layout is staged; float16 data is computed as float32, as for
convolutions: ``conv.py``); ``W`` (``[K, N]``, or ``[N, K]`` with ``trans_b``)
is reordered once into the blocked layout the primitive picks and not read from the graph at
run time (where that is the plain layout, oneDNN's gemm on a CPU without a brgemm matmul for
the type, with each row one cache line longer if its bytes are a multiple of
``SET_ALIASING_BYTES``: ``matmul_primitive``); ``b`` is broadcast over rows. The activation
is a post-op where oneDNN's eltwise is exact on NaN / Inf (relu as ``elu`` with alpha 0,
sigmoid, tanh, silu as ``swish``); GELU's eltwise gives NaN for +-inf, so it runs after the
product in place with torch, unless ``Config.fast_math``. Products under ``SERIAL_MACS``
multiply-adds with weights under ``PARALLEL_WEIGHTS`` elements are made for one thread. A
bfloat16 product whose node has a float32 output (``out_dtype``: a Cast folded in,
``passes/fold_casts.py``) writes float32, the accumulations unrounded.

Rows in pieces (``row_pieces_plan``): oneDNN's AMX brgemm matmul splits more than
``AMX_ROW_BLOCK`` rows into blocks of that many and gives each thread whole blocks, so 257
rows on two threads take as long as 512 (one thread runs a block of 256 alone), where a call
of at most that many rows splits its columns between the threads. A bfloat16 product of one
block and a small rest (a vision transformer's 256 patches and its class token) runs as a
call of the block and one of the rest: the same arithmetic per row, the same packed weight
(the pieces' primitives must pick its layout, else one call runs).
"""
from __future__ import annotations

import math

import torch

from .....ops.fused_transformer import ACTIVATIONS
from ...protocol import Decline
from ..threading_policy import PARALLEL_WEIGHTS, SERIAL_MACS, threads_for
from . import capi
from .call import DnnlKernel, Slot
from .compute import compute_dtype
from .layouts import contiguous, dtype_of, static_shape, strides_of
from .memory import DTYPES, TORCH_OF, MemDesc, Memory
from .primitive import Attr, create, exact_post_ops

TYPES = (torch.float32, torch.bfloat16, torch.float16)
WIDENED = (torch.bfloat16, torch.float32)   # bfloat16 products written as float32 (``out_dtype``)
EXACT = {"none": [], "relu": [("eltwise", "elu", 0.0, 0.0)], "sigmoid": [("eltwise", "logistic", 0.0, 0.0)],
         "tanh": [("eltwise", "tanh", 0.0, 0.0)], "silu": [("eltwise", "swish", 1.0, 0.0)]}
FAST = {"relu": [("eltwise", "relu", 0.0, 0.0)], "gelu": [("eltwise", "gelu_erf", 0.0, 0.0)],
        "gelu_tanh": [("eltwise", "gelu_tanh", 0.0, 0.0)]}
SET_ALIASING_BYTES = 1024    # a plain weight row of a multiple of these bytes is held one line longer
LINE_BYTES = 64


def product_operands(ctx) -> tuple[str, bool, torch.Tensor, torch.Tensor | None] | Decline:
    """(activation, trans_b, weight, bias) of a Linear / LinearAct node whose activation oneDNN
    can run and whose weight (2-D) and bias are constants, or a ``Decline`` saying which is
    not (shared with the run-time-rows kernel, ``linear_runtime.py``)."""
    node = ctx.node
    activation = str(ctx.attr("activation", "none")) if node.op_type == "LinearAct" else "none"
    if activation != "none" and activation not in ACTIVATIONS:
        return Decline(f"activation {activation!r}", "dnnl")
    w, b = ctx.const(1), ctx.const(2)
    if w is None or w.device.type not in ("cpu", "meta") or w.dim() != 2 or \
            (len(node.inputs) > 2 and node.inputs[2] is not None and b is None):
        return Decline("weight or bias is not a constant 2-D / 1-D tensor", "dnnl")
    return activation, bool(ctx.attr("trans_b", 0)), w, b


def linear_kernel(ctx, store, resources, exact: bool = True):
    node = ctx.node
    got = product_operands(ctx)
    if isinstance(got, Decline):
        return got
    activation, trans_b, w, b = got
    x_v, y_v = node.inputs[0], node.outputs[0]
    xs, ys = static_shape(x_v), static_shape(y_v)
    if xs is None or ys is None or len(xs) < 1:
        return Decline("needs static shapes", "dnnl")
    dtype = dtype_of(x_v)
    y_dtype = y_v.dtype.to_torch()
    if dtype not in TYPES or w.dtype != dtype or (y_dtype != dtype and (dtype, y_dtype) != WIDENED):
        return Decline(f"needs float32, bfloat16 or float16 data and weight (got {dtype}, {w.dtype})", "dnnl")
    compute = compute_dtype(dtype)      # float16 (and bfloat16 without its arithmetic): stored, not computed
    out = y_dtype if y_dtype != dtype else compute
    if strides_of(x_v) != contiguous(xs) or strides_of(y_v) != contiguous(ys):
        return Decline("needs row-major input and output", "dnnl")
    n, k = (w.shape[0], w.shape[1]) if trans_b else (w.shape[1], w.shape[0])
    m = math.prod(xs[:-1])
    if xs[-1] != k or ys[-1] != n or math.prod(ys[:-1]) != m or (b is not None and b.numel() != n):
        return Decline("operand sizes do not match", "dnnl")
    post = (EXACT if exact else {**EXACT, **FAST}).get(activation)
    after = None
    if post is None:
        post, after = [], _after(activation)
    w_any = MemDesc.tagged([k, n], DTYPES[compute], capi.TAG_ANY)
    bias = None if b is None else b.to(torch.float32 if compute == torch.float32 else b.dtype).contiguous()
    b_md = MemDesc.of((1, n), bias.dtype) if bias is not None else None
    serial = m * n * k < SERIAL_MACS and n * k < PARALLEL_WEIGHTS

    def make(rows, post_ops):
        """(primitive, source md, destination md) of ``rows`` rows."""
        x_md, y_md = MemDesc.of((rows, k), compute), MemDesc.of((rows, n), out)
        return matmul_primitive(x_md, w_any, b_md, y_md, post_ops, serial), x_md, y_md
    try:
        prim, x_md, y_md = make(m, post)
        if exact and post and not exact_post_ops(prim.impl):   # an epilogue not checked on NaN / Inf
            post, after = [], _after(activation)
            prim, x_md, y_md = make(m, post)
    except capi.DnnlError as exc:
        return Decline(f"oneDNN has no matmul for this node: {exc}", "dnnl")
    if prim.is_reference:
        return Decline(f"oneDNN offers only its reference matmul ({prim.impl})", "dnnl")
    pieces = row_pieces_plan(m, n, k, prim.impl, torch.get_num_threads())
    piece_prims = {}
    if pieces is not None:
        try:
            piece_prims = {rows: make(rows, post) for rows in set(pieces)}
        except capi.DnnlError:
            piece_prims = {}
        if any(p.md(capi.Q_WEIGHTS_MD) != prim.md(capi.Q_WEIGHTS_MD) or p.impl != prim.impl
               for p, _, _ in piece_prims.values()):
            piece_prims = {}
    consts, keep = weight_arguments(store, node.inputs[1].name, w, trans_b, compute, prim.md(capi.Q_WEIGHTS_MD),
                                    bias, b_md)
    if piece_prims:
        kernels = {rows: DnnlKernel(p, [Slot(capi.ARG_SRC, (rows, k), (k, 1), compute, pxm)],
                                    Slot(capi.ARG_DST, (rows, n), (n, 1), out, pym), consts, resources, (0,),
                                    keep=tuple(keep))
                   for rows, (p, pxm, pym) in piece_prims.items()}
        return RowPieces(pieces, kernels, (m, k), (m, n), xs, ys, after)
    x_slot = Slot(capi.ARG_SRC, xs, contiguous(xs), compute, x_md)
    y_slot = Slot(capi.ARG_DST, ys, contiguous(ys), out, y_md)
    return DnnlKernel(prim, [x_slot], y_slot, consts, resources, (0,), after=after, keep=tuple(keep))


def matmul_primitive(x_md: MemDesc, w_md: MemDesc, b_md: MemDesc | None, y_md: MemDesc, post_ops,
                     serial: bool):
    """A matmul primitive over a constant weight (``w_md`` with ``TAG_ANY``: oneDNN picks its
    layout), made for one thread where ``serial``. Where oneDNN picks the plain ``K x N``
    layout (its gemm, on a CPU without a brgemm matmul for the type) and a row's bytes are a
    multiple of ``SET_ALIASING_BYTES``, the weight is asked for with each row one cache line
    longer (``leading_dimension``), as long as the same implementation takes it."""
    lib = capi.load()
    attr = Attr(post_ops)

    def make(weights: MemDesc):
        with threads_for(serial):
            return create("matmul", lambda pd: lib.matmul_primitive_desc_create(
                pd, lib.engine, x_md.handle, weights.handle, b_md.handle if b_md is not None else None,
                y_md.handle, attr.handle))
    prim = make(w_md)
    longer = longer_rows(prim.md(capi.Q_WEIGHTS_MD))
    if longer is not None:
        try:
            held = make(longer)
        except capi.DnnlError:
            return prim
        if held.impl == prim.impl and held.md(capi.Q_WEIGHTS_MD) == longer:
            return held
    return prim


def leading_dimension(n: int, dtype: torch.dtype) -> int:
    """The row stride (elements) a plain ``K x N`` weight is held with for oneDNN's gemm: ``N``,
    one cache line more where a row's bytes are a multiple of ``SET_ALIASING_BYTES`` (the gemm
    walks a panel of the weight's rows at once, and rows at such a stride fall into the same
    few sets of the L1 cache)."""
    item = dtype.itemsize
    return n + LINE_BYTES // item if (n * item) % SET_ALIASING_BYTES == 0 else n


def longer_rows(chosen: MemDesc) -> MemDesc | None:
    """The layout ``chosen`` (a matmul's weight layout) with each row one cache line longer,
    where it is the plain, dense ``K x N`` layout at a stride that aliases; else None."""
    d = chosen.describe()
    if len(d["dims"]) != 2 or d["blocks"] or d["padded"] != d["dims"]:
        return None
    k, n = d["dims"]
    dtype = TORCH_OF[d["dt"]]
    ld = leading_dimension(n, dtype)
    if d["strides"] != [n, 1] or ld == n or k < 2:
        return None
    return MemDesc.of((k, n), dtype, (ld, 1))


def weight_arguments(store, name: str, w: torch.Tensor, trans_b: bool, compute: torch.dtype, w_md: MemDesc,
                     bias: torch.Tensor | None, b_md: MemDesc | None) -> tuple[list, list]:
    """(constant arguments, tensors they point into) of a matmul primitive: weight ``name``
    (``[K, N]``, or ``[N, K]`` under ``trans_b``) packed once by the store into the primitive's
    layout ``w_md``, and the bias."""
    k, n = (w.shape[1], w.shape[0]) if trans_b else (w.shape[0], w.shape[1])
    plain = w if w.device.type == "meta" else w.to(compute).contiguous()
    plain_md = MemDesc.of((k, n), compute, (1, k) if trans_b else (n, 1))   # the operand is W^T under trans_b
    packed = store.form(name, plain, (1, 0) if trans_b else (0, 1), plain_md, w_md)
    consts = [(capi.ARG_WEIGHTS, Memory(w_md, packed.data_ptr()))]
    keep = [packed, w_md]
    if bias is not None:
        consts.append((capi.ARG_BIAS, Memory(b_md, bias.data_ptr())))
        keep.append(bias)
    return consts, keep


AMX_ROW_BLOCK = 256        # the rows of one of oneDNN 3.2's AMX brgemm matmul blocks, each run by one thread
PIECE_MIN_COLUMNS = 384    # columns enough for a call of one block to share between the threads
PIECE_MIN_WEIGHT = 384 * 384   # weight elements enough for the second call's cost not to matter


def row_pieces_plan(rows: int, cols: int, depth: int, impl: str, threads: int) -> tuple[int, ...] | None:
    """The row counts of the calls that run a product of ``rows`` x ``depth`` by ``depth`` x
    ``cols`` (a block of ``AMX_ROW_BLOCK`` rows, then the rest), or None for one call. One call
    of one block and a rest of at most half a block takes as long as two blocks on one thread;
    a block alone shares its columns between the threads. Measured on two threads (benchmarks/
    RESULTS.md): pieces win there, and lose on narrow or light products and on many blocks (one
    call's partition is better there), so only one block and a small rest, wide and heavy
    enough."""
    full, rest = divmod(rows, AMX_ROW_BLOCK)
    if full != 1 or not 0 < rest <= AMX_ROW_BLOCK // 2 or threads < 2 or not impl.startswith("brg:") \
            or "amx" not in impl or cols < PIECE_MIN_COLUMNS or cols * depth < PIECE_MIN_WEIGHT:
        return None
    return (AMX_ROW_BLOCK, rest)


class RowPieces:
    """A product's rows as consecutive calls of the pieces' kernels, over row views of the
    input and the output (made once per input / output pair: the arena's are the same objects
    on every run, so the pieces' kernels keep their bound pointers)."""
    writes_out = True
    reads = (0,)

    def __init__(self, pieces: tuple[int, ...], kernels: dict, x2d: tuple, y2d: tuple, xs: tuple, ys: tuple,
                 after):
        self.pieces, self.kernels, self.after = pieces, kernels, after
        self.x2d, self.y2d, self.xs, self.ys = x2d, y2d, xs, ys
        self.impl = next(iter(kernels.values())).impl
        self._views: tuple = (None, None, ())

    def __call__(self, x, w=None, b=None, out=None):
        fresh = out is None
        if fresh:
            out = torch.empty(self.ys, dtype=next(iter(self.kernels.values())).output.dtype)
        parts = self._views[2]
        if self._views[0] is not x or self._views[1] is not out:
            if tuple(x.shape) != self.xs or tuple(out.shape) != self.ys or not x.is_contiguous() \
                    or not out.is_contiguous():
                raise TypeError(f"oneDNN matmul in row pieces: input {tuple(x.shape)}, output {tuple(out.shape)}; "
                                f"made for row-major {self.xs} -> {self.ys}")
            xv, ov, start, parts = x.view(self.x2d), out.view(self.y2d), 0, []
            for rows in self.pieces:
                parts.append((self.kernels[rows], xv[start:start + rows], ov[start:start + rows]))
                start += rows
            if not fresh:               # a probe's tensors are not kept alive until the next call
                self._views = (x, out, tuple(parts))
        for kernel, xp, op in parts:
            kernel(xp, out=op)
        if self.after is not None:
            self.after(out, (x,))
        return out


def _after(activation: str):
    act = ACTIVATIONS[activation]
    return lambda y, _inputs: act(y)
