"""Fused transformer ops in domain ``fusegraph`` (version 1), made by the transformer fusion
rules (``passes/fusion/rules_transformer.py``); no frontend creates them.

- ``LinearAct(x, w, b?)``: ``act(x @ w + b)``; ``trans_b`` as ``Linear``; ``activation``
  ``none`` or one of ``ACTIVATIONS``. The op's own kernel: addmm into the output buffer, then
  the activation in place on it (the CPU backend's oneDNN kernels for constant weights:
  ``runtime/backends/cpu/dnnl/linear.py``).
- ``Gelu(x, b?)``: ``gelu(x + b)``; ``approximate`` is ``none`` (erf) or ``tanh``.
- ``LayerNorm(x, gamma?, beta?)``: ``F.layer_norm`` over the last axis, ``epsilon`` (again in
  float64 when float32 sums overflow: ``norm.layer_norm_exact``).
- ``SkipLayerNorm(a, b, gamma?, beta?)``: ``s = a + b``; outputs ``layer_norm(s)`` and,
  when the node has a second output, ``s`` itself (the residual stream of pre-LN models).
  Both norms take ``out_dtype`` (a Cast to a reduced type folded in, ``passes/fold_casts.py``):
  the normalised output computed in float32 and rounded once to it.
- ``MaskedSoftmax(x, mask?)``: ``softmax(x * scale + mask)`` over the last axis;
  ``nan_to_zero`` maps NaN rows to 0 (the exporters' ``Where(IsNaN(p), 0, p)``).
- ``ScaledDotProductAttention(q, k, v, mask?)``: ``softmax(q @ k^T * scale + mask) @ v``;
  ``k_transposed`` says ``k`` comes as ``[..., D, S]``; ``nan_to_zero`` as above. The mask
  must not enlarge the scores (a typed error at run time otherwise, never a silently
  different shape: the output shape is inferred from q, k, v). One query
  row (decoding, L = 1) runs ``F.scaled_dot_product_attention``; longer ones run matmul,
  one add, in-place softmax, matmul (measured faster on CPU there); where the scores of all
  heads would pass ``SCORES_CHUNK_ABOVE`` bytes and a workspace holds them, a group of heads
  at a time whose scores stay within ``SCORES_CHUNK`` (each head's arithmetic unchanged: the
  workspace that long sequences grow stays a few MiB, the softmax reads scores still in the
  cache). Any NaN from the SDPA path falls back to the composed path, so fully-masked and
  non-finite rows follow the graph.
- ``ElementwiseChain(inputs...)``: a linear chain of elementwise ops, ``steps`` a list of
  strings ``"Op a b"`` whose operands are ``iN`` (node input N) or ``p`` (previous result).
  The first step writes the output buffer, every later step updates it in place: one
  buffer, no intermediate allocation, never writing a tensor anyone else reads.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..ir import DType
from ..ir.shape import broadcast_shapes
from ._tensor_util import dense_view
from .activations import gelu as _gelu_fn
from .common import bias_like, product_out_dtype, rounding_to_out_dtype, widened, widens
from .fused_basic import linear_terms
from .norm import layer_norm_exact as layer_norm, layer_norm_range
from .precision_reasons import ACTIVATION, EXPONENTIALS_AND_SUM, MATRIX_PRODUCT
from .registry import FusionKind, NodeContext, Precision, register
from .softmax import softmax_range
from .value_range import Fact, ProductRange, chain_range

DOMAIN = "fusegraph"
SCORES_CHUNK_ABOVE = 4 << 20    # an attention's scores of more bytes run a group of heads at a time ...
SCORES_CHUNK = 5 << 19          # ... whose scores take at most these bytes (one head at least)



ACTIVATIONS = {
    "relu": torch.relu_,
    "gelu": lambda t: _gelu_fn(t, "none", t),
    "gelu_tanh": lambda t: _gelu_fn(t, "tanh", t),
    "sigmoid": torch.sigmoid_,
    "tanh": torch.tanh_,
    "silu": lambda t: F.silu(t, inplace=True),
}


# ---------------------------------------------------------------- LinearAct

def _mm_into(x, w, b, out):
    return torch.mm(x, w, out=out) if b is None else torch.addmm(b, x, w, out=out)


def _linear_act_infer(ctx: NodeContext):
    xs, ws = ctx.shape(0), ctx.shape(1)
    if xs is None or ws is None:
        return [(product_out_dtype(ctx), None)]
    n = ws[0] if ctx.attr("trans_b", 0) else ws[1]
    return [(product_out_dtype(ctx), tuple(xs[:-1]) + (n,))]


@register("LinearAct", domain=DOMAIN, since=1, fusion=FusionKind.OUT_FUSABLE, infer=_linear_act_infer,
          writes_out=True, precision=MATRIX_PRODUCT, value_range=ProductRange(linear_terms))
def _linear_act(ctx: NodeContext):
    trans_b = bool(ctx.attr("trans_b", 0))
    name = ctx.attr("activation")
    if name != "none" and name not in ACTIVATIONS:
        raise ctx.unsupported(f"activation {name!r} (expected none or one of {sorted(ACTIVATIONS)})")
    act = ACTIVATIONS.get(name)
    widen = widens(ctx)

    def kernel(x, w, b=None, out=None):
        if widen:
            x, w, b = widened(x, w, b)
        b = bias_like(b, x)
        wt = w.t() if trans_b else w
        k, n = wt.shape
        x2 = x.reshape(-1, k)
        o2 = x2.new_empty((x2.shape[0], n)) if out is None else out.view(-1, n)
        _mm_into(x2, wt, b, o2)
        if act is not None:
            act(o2)
        return out if out is not None else o2.view(*x.shape[:-1], n)

    return kernel


# ---------------------------------------------------------------- Gelu

@register("Gelu", domain=DOMAIN, since=1, fusion=FusionKind.OPAQUE, writes_out=True, precision=ACTIVATION,
          infer=lambda ctx: [(ctx.dtype(0) or None,
                              broadcast_shapes(ctx.shape(0), ctx.shape(1)) if ctx.has_input(1) else ctx.shape(0))])
def _gelu(ctx: NodeContext):
    approx = ctx.attr("approximate", "none")
    if approx not in ("none", "tanh"):
        raise ctx.unsupported(f"approximate={approx!r}")

    def gelu(x, b=None, out=None):
        if b is None:
            return _gelu_fn(x, approx, out)
        y = torch.add(x, b) if out is None else torch.add(x, b, out=out)
        return _gelu_fn(y, approx, y)

    return gelu


# ---------------------------------------------------------------- LayerNorm / SkipLayerNorm

def _ln_infer(ctx: NodeContext):
    return [(product_out_dtype(ctx), ctx.shape(0))]


@register("LayerNorm", domain=DOMAIN, since=1, fusion=FusionKind.OPAQUE, infer=_ln_infer,
          layout_sensitive=True, value_range=layer_norm_range(1),
          precision=(Precision.KEEP, "normalisation statistics (mean, variance): float32"))
def _layer_norm(ctx: NodeContext):
    eps = float(ctx.attr("epsilon"))
    rounded = rounding_to_out_dtype(ctx)

    def kernel(x, gamma=None, beta=None):
        return rounded(layer_norm(x, x.shape[-1:], gamma, beta, eps))
    return kernel


def _skip_ln_infer(ctx: NodeContext):
    a, b = ctx.shape(0), ctx.shape(1)
    shape = broadcast_shapes(a, b) if a is not None and b is not None else None
    return [(product_out_dtype(ctx), shape), (ctx.dtype(0) or None, shape)][:ctx.n_outputs]


@register("SkipLayerNorm", domain=DOMAIN, since=1, fusion=FusionKind.OPAQUE, infer=_skip_ln_infer,
          layout_sensitive=True, value_range=layer_norm_range(2),
          precision=(Precision.KEEP, "a residual sum and normalisation statistics: float32"))
def _skip_layer_norm(ctx: NodeContext):
    eps = float(ctx.attr("epsilon"))
    both = ctx.n_outputs == 2
    rounded = rounding_to_out_dtype(ctx)

    def skip_ln(a, b, gamma=None, beta=None):
        s = torch.add(a, b)
        y = rounded(layer_norm(s, s.shape[-1:], gamma, beta, eps))
        return (y, s) if both else y

    return skip_ln


# ---------------------------------------------------------------- MaskedSoftmax

def _scaled_plus_mask(x, mask, scale, out):
    """``x * scale + mask`` (either part optional) into ``out`` or a new tensor."""
    if mask is None:
        if scale == 1.0:
            return x.clone() if out is None else out.copy_(x)
        return torch.mul(x, scale) if out is None else torch.mul(x, scale, out=out)
    if out is None:
        return torch.add(mask, x, alpha=scale) if scale != 1.0 else torch.add(x, mask)
    return torch.add(mask, x, alpha=scale, out=out) if scale != 1.0 else torch.add(x, mask, out=out)


def _softmax_(y, nan_to_zero):
    torch._softmax(y, -1, False, out=y)
    if nan_to_zero:
        torch.nan_to_num_(y, nan=0.0)   # a softmax output is never +-inf: only NaN changes
    return y


@register("MaskedSoftmax", domain=DOMAIN, since=1, fusion=FusionKind.OPAQUE, writes_out=True,
          precision=EXPONENTIALS_AND_SUM, value_range=softmax_range,
          infer=lambda ctx: [(ctx.dtype(0) or None,
                              broadcast_shapes(ctx.shape(0), ctx.shape(1)) if ctx.has_input(1) else ctx.shape(0))])
def _masked_softmax(ctx: NodeContext):
    scale = float(ctx.attr("scale", 1.0))
    nan_to_zero = bool(ctx.attr("nan_to_zero", 0))

    def masked_softmax(x, mask=None, out=None):
        return _softmax_(_scaled_plus_mask(x, mask, scale, out), nan_to_zero)

    return masked_softmax


# ---------------------------------------------------------------- ScaledDotProductAttention

def _heads_shape(shape, heads, transposed=False):
    """The [B, H, S, D] (or [B, H, D, S]) shape of an operand given as [B, S, H*D] with ``heads``."""
    if not heads or shape is None:
        return shape
    d = shape[2] // heads if isinstance(shape[2], int) else None
    return (shape[0], heads, shape[1], d)


def _sdpa_infer(ctx: NodeContext):
    split = ctx.attr("qkv_split", None)
    packed = ctx.shape(0)
    if split is not None and packed is not None:
        q_in, v_in = tuple(packed[:-1]) + (int(split[0]),), tuple(packed[:-1]) + (int(split[2]),)
    else:
        q_in, v_in = ctx.shape(0), ctx.shape(2)
    q = _heads_shape(q_in, ctx.attr("q_heads", 0))
    v = _heads_shape(v_in, ctx.attr("v_heads", 0))
    if q is None or v is None:
        return [(ctx.dtype(0) or None, None)]
    if int(ctx.attr("kv_repeat", 1)) > 1:      # k / v heads serve groups of query heads: q's batch
        out = tuple(q[:-2]) + (q[-2], v[-1])
        return [(ctx.dtype(0) or None, _merged(ctx, out))]
    batch = broadcast_shapes(tuple(q[:-2]), tuple(v[:-2]))
    k = None if split is not None else _heads_shape(ctx.shape(1), ctx.attr("k_heads", 0))
    if k is not None and tuple(k[:-2]) != tuple(q[:-2]):
        batch = broadcast_shapes(batch, tuple(k[:-2]))
    out = tuple(batch) + (q[-2], v[-1])
    return [(ctx.dtype(0) or None, _merged(ctx, out))]


def _merged(ctx: NodeContext, out):
    """The output shape ``[..., H, L, Dv]``, or ``[..., L, H*Dv]`` with ``merge_heads``."""
    if ctx.attr("merge_heads", 0):
        h, d = out[-3], out[-1]
        out = tuple(out[:-3]) + (out[-2], h * d if isinstance(h, int) and isinstance(d, int) else None)
    return out


def _grouped(q, kt, v, mask, out, rep: int):
    """Grouped-query attention (``kv_repeat``): q ``[..., H, L, D]`` as ``[..., H/rep, rep, L, D]``,
    k^T / v with one more axis of size 1 there (broadcast over each group of ``rep`` query
    heads), the mask and the ``[..., H, L, Dv]`` output likewise; views, nothing repeated."""
    h = q.shape[-3]
    if h % rep or kt.shape[-3] * rep != h or v.shape[-3] * rep != h:
        raise RuntimeError(f"grouped attention: {h} query heads are not {rep} per k / v head "
                           f"(k^T {tuple(kt.shape)}, v {tuple(v.shape)})")
    q = q.reshape(*q.shape[:-3], h // rep, rep, *q.shape[-2:])
    kt, v = kt.unsqueeze(-3), v.unsqueeze(-3)
    if mask is not None:
        if mask.dim() >= 3 and mask.shape[-3] == h:
            mask = mask.reshape(*mask.shape[:-3], h // rep, rep, *mask.shape[-2:])
        else:
            mask = mask.unsqueeze(-3)
    if out is not None:
        out = out.view(*out.shape[:-3], h // rep, rep, *out.shape[-2:])
    return q, kt, v, mask, out


def _mask_fits(mask, q, kt) -> bool:
    """The mask broadcasts into the scores ``[batch(q, k^T)..., L, S]`` without enlarging them
    (the fused node's output shape is inferred from q, k and v alone)."""
    scores = q[:-1] + kt[-1:]
    if len(kt) > 2 and kt[:-2] != q[:-2]:
        scores = tuple(broadcast_shapes(q[:-2], kt[:-2])) + scores[-2:]
    if len(mask) > len(scores):
        return False
    return all(m == 1 or m == s for m, s in zip(mask[::-1], scores[::-1]))


def split_heads(x, heads):
    """[B, S, H*D] -> [B, H, S, D] (a view)."""
    return x.view(x.shape[0], x.shape[1], heads, -1).transpose(1, 2)


def _sdpa_range(node, ins: list[Fact]) -> list[Fact]:
    """Each output row is a convex combination of v's rows (softmax weights): v's bound; NaN
    where any input holds NaN or inf (unless ``nan_to_zero``)."""
    v = ins[0] if node.attrs.get("qkv_split") else ins[2]
    nan = any(f.nan or f.inf for f in ins if f is not None) and not node.attrs.get("nan_to_zero", 0)
    return [Fact(v.bound, nan or v.nan)]


@register("ScaledDotProductAttention", domain=DOMAIN, since=1, fusion=FusionKind.OPAQUE,
          infer=_sdpa_infer, writes_out=True, value_range=_sdpa_range,
          precision=(Precision.REDUCE, "attention products in the reduced type; its softmax runs in float32 inside"))
def _sdpa(ctx: NodeContext):
    """Attributes: scale; k_transposed (4-D k given as [B, H, D, S]); q_heads / k_heads /
    v_heads (> 0: that operand comes as [B, S, H*D] and is split into heads here, k then
    untransposed); qkv_split [Eq, Ek, Ev] (q, k and v packed along the last axis of input 0,
    inputs 1 and 2 absent); merge_heads (output [B, L, H*D] instead of [B, H, L, D]); nan_to_zero;
    kv_repeat (> 1: k and v have H / kv_repeat heads, each serving kv_repeat consecutive query
    heads, as grouped-query attention's repeat_kv gives them; broadcast, never copied).
    The kernel takes ``out=`` (its output buffer) and ``scores=`` (a buffer of at least the
    scores' bytes, for ``q @ k^T``: a backend's workspace, or a function of the bytes needed
    that returns one; else allocated per call)."""
    scale = float(ctx.attr("scale", 1.0))
    k_transposed = bool(ctx.attr("k_transposed", 0))
    nan_to_zero = bool(ctx.attr("nan_to_zero", 0))
    qh, kh, vh = (int(ctx.attr(f"{t}_heads", 0)) for t in "qkv")
    merge = bool(ctx.attr("merge_heads", 0))
    split = ctx.attr("qkv_split", None)
    split = None if split is None else [int(n) for n in split]
    rep = int(ctx.attr("kv_repeat", 1))
    if rep < 1:
        raise ctx.unsupported(f"kv_repeat={rep}")

    def composed(q, kt, v, mask, scores, out):
        s = y = None
        if scores is not None:
            shape = tuple(broadcast_shapes(tuple(q.shape[:-2]), tuple(kt.shape[:-2]))) + (q.shape[-2], kt.shape[-1])
            nbytes = math.prod(shape) * q.element_size()
            # a strided output (heads merged by its strides) is written from a contiguous
            # product: ATen's product into strided memory sums in an order that depends on the
            # thread count, the contiguous one does not (streams give other thread counts)
            ybytes = -(-(out.numel() * out.element_size()) // 64) * 64 if out is not None and \
                not out.is_contiguous() else 0
            if callable(scores):          # a workspace sized per call
                scores = scores(nbytes + ybytes)
            if scores.numel() * scores.element_size() >= nbytes + ybytes:
                raw = scores.view(torch.uint8)
                s = torch.matmul(q, kt, out=raw[ybytes:ybytes + nbytes].view(q.dtype).view(shape))
                if ybytes:
                    y = raw[:out.numel() * out.element_size()].view(out.dtype).view(out.shape)
        if s is None:
            s = torch.matmul(q, kt)
        if mask is None:
            if scale != 1.0:
                s.mul_(scale)
        else:     # in place: s is this node's own temporary, and the mask never enlarges it
            torch.add(mask, s, alpha=scale, out=s)
        p = _softmax_(s, nan_to_zero)
        if out is None:
            return torch.matmul(p, v)
        if out.is_contiguous():
            return torch.matmul(p, v, out=out)
        return out.copy_(torch.matmul(p, v) if y is None else torch.matmul(p, v, out=y))

    def attention(q, k, v, mask=None, out=None, scores=None):
        if split is not None:
            q, k, v = torch.split(q, split, dim=-1)
        if qh:
            q = split_heads(q, qh)
        if vh:
            v = split_heads(v, vh)
        kt = split_heads(k, kh).transpose(-1, -2) if kh else (k if k_transposed else k.transpose(-1, -2))
        if rep > 1:
            return _grouped_attention(q, kt, v, mask, out, scores, rep)
        if mask is not None and not _mask_fits(tuple(mask.shape), tuple(q.shape), tuple(kt.shape)):
            raise RuntimeError(f"the attention mask {tuple(mask.shape)} broadcasts the scores of q "
                               f"{tuple(q.shape)} and k^T {tuple(kt.shape)} to a larger shape, which the fused "
                               f"attention does not take; compile with disabled_passes=('attention',)")
        heads_out = None
        if out is not None:     # the [B, H, L, D] products written straight into the output's bytes
            heads_out = (out.view(*out.shape[:-1], q.shape[-3], v.shape[-1]).transpose(-3, -2) if merge else out)
        y = None
        # one query row: SDPA, checked for NaN on the host (so the CPU only: a GPU would sync)
        if (nan_to_zero and q.device.type == "cpu" and q.dim() == 4 and q.shape[-2] == 1 and v.dim() == 4
                and q.shape[:2] == v.shape[:2]
                and (mask is None or (mask.dim() <= 4 and mask.is_floating_point()))):
            try:
                y = F.scaled_dot_product_attention(q, kt.transpose(-1, -2), v, attn_mask=mask, scale=scale)
            except RuntimeError:   # a mask SDPA does not broadcast: the composed path does
                y = None
            if y is not None and bool(torch.isnan(y).any()):
                y = None
            if y is not None and heads_out is not None:
                heads_out.copy_(y)
        if y is None and heads_out is not None and scores is not None and q.dim() == 4:
            if _by_head_groups(q, kt, v, mask, scores, heads_out, composed):
                return out
        if y is None:
            y = composed(q, kt, v, mask, scores, heads_out)
        if out is not None:
            return out
        if merge:
            y = y.transpose(-3, -2).reshape(*y.shape[:-3], y.shape[-2], y.shape[-3] * y.shape[-1])
        return y

    def _grouped_attention(q, kt, v, mask, out, scores, rep):
        h, length, dv = q.shape[-3], q.shape[-2], v.shape[-1]
        heads_out = None
        if out is not None:
            heads_out = out.view(*out.shape[:-1], h, dv).transpose(-3, -2) if merge else out
        q, kt, v, mask, heads_out = _grouped(q, kt, v, mask, heads_out, rep)
        if mask is not None and not _mask_fits(tuple(mask.shape), tuple(q.shape), tuple(kt.shape)):
            raise RuntimeError(f"the attention mask {tuple(mask.shape)} broadcasts the scores of q "
                               f"{tuple(q.shape)} and k^T {tuple(kt.shape)} to a larger shape, which the fused "
                               f"attention does not take; compile with disabled_passes=('attention',)")
        y = composed(q, kt, v, mask, scores, heads_out)
        if out is not None:
            return out
        y = y.reshape(*y.shape[:-4], h, length, dv)
        if merge:
            y = y.transpose(-3, -2).reshape(*y.shape[:-3], length, h * dv)
        return y

    attention.scores_bytes = lambda: _scores_bytes(ctx, split, qh, kh, k_transposed)
    return attention


def _by_head_groups(q, kt, v, mask, scores, heads_out, composed) -> bool:
    """Attention of 4-D ``q`` ``[B, H, L, D]`` a group of heads at a time into ``heads_out``,
    where all heads' scores would pass ``SCORES_CHUNK_ABOVE`` bytes: True when done, False
    (nothing written) where they would not, or where an operand does not split by heads."""
    b, h, length = q.shape[0], q.shape[1], q.shape[2]
    per_head = b * length * kt.shape[-1] * q.element_size()
    if h < 2 or per_head * h <= SCORES_CHUNK_ABOVE or kt.dim() != 4 or v.dim() != 4 \
            or kt.shape[1] != h or v.shape[1] != h:
        return False
    heads_of_mask = mask is not None and mask.dim() >= 3 and mask.shape[-3] != 1
    if heads_of_mask and (mask.shape[-3] != h or mask.dim() > 4):
        return False
    group = max(1, SCORES_CHUNK // per_head)
    for h0 in range(0, h, group):
        h1 = min(h, h0 + group)
        part = mask[..., h0:h1, :, :] if heads_of_mask else mask
        composed(q[:, h0:h1], kt[:, h0:h1], v[:, h0:h1], part, scores, heads_out[:, h0:h1])
    return True


def _scores_bytes(ctx: NodeContext, split, qh: int, kh: int, k_transposed: bool) -> int | None:
    """Bytes of the ``q @ k^T`` scores with the node's static shapes (None: not static), and of
    the product written contiguous before the heads merge into the output."""
    q, k = ctx.shape(0), ctx.shape(0 if split is not None else 1)
    dtype = ctx.dtype(0)
    if q is None or k is None or dtype is None or not all(isinstance(d, int) for d in tuple(q) + tuple(k)):
        return None
    if split is not None:
        q, k = tuple(q[:-1]) + (split[0],), tuple(k[:-1]) + (split[1],)
    if qh:
        q = (q[0], qh, q[1], q[2] // qh)
    if kh:
        k = (k[0], kh, k[1], k[2] // kh)
    s_len = k[-1] if (k_transposed and not kh) else k[-2]
    batch = tuple(q[:-2]) if int(ctx.attr("kv_repeat", 1)) > 1 else broadcast_shapes(tuple(q[:-2]), tuple(k[:-2]))
    scores = math.prod(batch) * q[-2] * s_len * dtype.to_torch().itemsize
    out = ctx.node.outputs[0].shape
    if not ctx.attr("merge_heads", 0) or out is None or not all(isinstance(d, int) for d in out):
        return scores
    return scores + -(-math.prod(out) * dtype.to_torch().itemsize // 64) * 64   # the product before its merge


# ---------------------------------------------------------------- ElementwiseChain

UNARY = {"Relu": "torch.clamp_min({0}, 0{o})", "Sigmoid": "torch.sigmoid({0}{o})", "Tanh": "torch.tanh({0}{o})",
         "Exp": "torch.exp({0}{o})", "Log": "torch.log({0}{o})", "Sqrt": "torch.sqrt({0}{o})",
         "Neg": "torch.neg({0}{o})", "Abs": "torch.abs({0}{o})", "Erf": "torch.erf({0}{o})",
         "Reciprocal": "torch.reciprocal({0}{o})"}
BINARY = {"Add": "torch.add({0}, {1}{o})", "Sub": "torch.sub({0}, {1}{o})", "Mul": "torch.mul({0}, {1}{o})",
          "Div": "torch.div({0}, {1}{o})", "Max": "torch.maximum({0}, {1}{o})",
          "Min": "torch.minimum({0}, {1}{o})", "Pow": "torch.pow({0}, {1}{o})"}
_NO_SCALAR = ("Max", "Min")   # torch.maximum / minimum take tensors only


def _chain_infer(ctx: NodeContext):
    """The first activation's type (constants may stay float32 under mixed precision)."""
    shapes = [ctx.shape(i) for i in range(ctx.n_inputs)]
    live = [i for i in range(ctx.n_inputs) if ctx.const(i) is None]
    dtype = ctx.dtype(live[0] if live else 0) or None
    if any(s is None for s in shapes):
        return [(dtype, None)]
    return [(dtype, broadcast_shapes(*shapes))]


def chain_source(steps: list[str], n_inputs: int, scalars: dict[int, float]) -> str:
    """Python source of ``chain(x0.., out=None)``: the first step writes ``out`` (or a new
    tensor), every later step updates that tensor in place; 0-d float constants in second
    operand position are inlined as numbers."""
    params = ", ".join(f"x{i}" for i in range(n_inputs))
    lines = [f"def chain({params}, out=None):"]
    for k, step in enumerate(steps):
        op, *args = str(step).split() or [""]
        form = UNARY.get(op) or BINARY.get(op)
        if form is None or len(args) != (1 if op in UNARY else 2):
            raise ValueError(f"chain step {step!r}")
        if k and "p" not in args:
            raise ValueError("every step after the first must use the previous result")
        names = []
        for pos, a in enumerate(args):
            if a == "p" and not k:
                raise ValueError(f"chain step {step!r}: the first step has no previous result")
            if a != "p" and not (a[:1] == "i" and a[1:].isdigit() and int(a[1:]) < n_inputs):
                raise ValueError(f"chain step {step!r}: operand {a!r} is not 'p' or i0..i{n_inputs - 1}")
            i = None if a == "p" else int(a[1:])
            names.append("p" if i is None else repr(scalars[i]) if pos and i in scalars and op not in _NO_SCALAR
                         else f"x{i}")
        if k == 0:
            lines += ["    if out is None:", "        p = " + form.format(*names, o=""),
                      "    else:", "        p = " + form.format(*names, o=", out=out")]
        else:
            lines.append("    " + form.format(*names, o=", out=p"))
    lines.append("    return p")
    return "\n".join(lines) + "\n"


ROUNDED_BLOCK = 1 << 15      # elements of a reduced-type chain computed in float32 at a time


def _blocks_of(out: torch.Tensor, xs) -> tuple | None:
    """(``out``, then each input) as one-axis views in memory order, where ``out`` is dense
    (``dense_view``) and every input is a 0-d scalar (as it is) or has ``out``'s shape and
    strides; else None."""
    flat_out = dense_view(out)
    if flat_out is None or any(x.dim() and (x.shape != out.shape or x.stride() != out.stride()) for x in xs):
        return None
    return flat_out, [x.as_strided((x.numel(),), (1,)) if x.dim() else x for x in xs]


@register("ElementwiseChain", domain=DOMAIN, since=1, fusion=FusionKind.OPAQUE, writes_out=True,
          infer=_chain_infer, value_range=chain_range,
          precision=(Precision.FOLLOW, "a fused elementwise chain: reads and writes the reduced type, computes every "
                                       "step in float32 with its float32 constants and rounds once (a chain with a "
                                       "KEEP step stays float32)"))
def _chain(ctx: NodeContext):
    scalars = {}
    for i in range(ctx.n_inputs):
        c = ctx.const(i)
        if c is not None and c.dim() == 0 and c.is_floating_point() and math.isfinite(float(c)):
            scalars[i] = float(c.item())
    try:
        source = chain_source(list(ctx.attr("steps")), ctx.n_inputs, scalars)
    except ValueError as exc:
        raise ctx.unsupported(str(exc)) from None
    env = {"torch": torch}
    exec(compile(source, f"<fusegraph chain {ctx.name}>", "exec"), env)  # noqa: S102 - source built above
    chain = env["chain"]

    reduced = ctx.node.outputs[0].dtype.to_torch() if ctx.node.outputs[0].dtype in (DType.BFLOAT16, DType.FLOAT16) \
        else None

    def kernel(*xs, out=None):
        return chain(*xs, out=out)

    def rounded_once(*xs, out=None):
        """bf16 / fp16 activations: every step in float32 (with the float32 constants), one
        rounding. Inputs laid out as ``out`` is are taken a block at a time (``ROUNDED_BLOCK``
        elements): float32 copies of whole multi-megabyte tensors would be fresh mappings
        whose pages fault in on every run."""
        blocks = _blocks_of(out, xs) if out is not None and out.numel() > ROUNDED_BLOCK else None
        if blocks is not None:
            flat_out, flats = blocks
            for start in range(0, flat_out.numel(), ROUNDED_BLOCK):
                part = [f[start:start + ROUNDED_BLOCK] if f.dim() else f for f in flats]
                flat_out[start:start + ROUNDED_BLOCK].copy_(
                    chain(*(x.float() if x.dtype == reduced else x for x in part)))
            return out
        y = chain(*(x.float() if x.dtype == reduced else x for x in xs))
        return y.to(reduced) if out is None else out.copy_(y)
    kernel = rounded_once if reduced is not None else kernel
    kernel.source = source
    return kernel
