"""Magnitude bounds of every value: where NaN / Inf cannot occur.

Induction: if every float graph input is finite with ``max |x| <= M``, and an op's inputs are
finite with known magnitude bounds, its output is finite with a bound that follows from
them, unless the op can overflow or create NaN itself (a division, a logarithm ...). For a
given ``M`` ``propagate`` walks the graph once and gives every value a ``Fact``: a magnitude
bound and whether it may hold NaN or +-inf. ``guard_plan.py`` uses the facts to decide which
kernels may run their fast (NaN-inexact) form, under which ``M``.

Bounds are conservative: a convolution or product multiplies its input bound by its largest
weight magnitude times the terms each output sums (every partial sum is then below it too;
computable from the packed bytes alone, so a loaded model derives the same limits from its
own weights and trusts nothing the file says about them), an addition adds bounds,
LayerNorm (over the last axis, the channels or groups) and softmax reset them, clip / sigmoid / tanh cap them, a Cast keeps them (a value
stored in bfloat16 or float16 may round up by 2^-8 of itself, float16 overflows above 65504:
``_cap``). Ops the table does not
know give "unknown": no guarded node downstream admits any ``M`` through them. Integer and
boolean values are finite by nature. A transfer function reads only node attributes and
constants; nothing here mutates the graph.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch

from ....ir import DType, Graph, Node, Value

LIMIT = 1e38                     # below float32's largest (3.4e38): room for rounding
ROUNDING = 1.0 + 2.0 ** -7       # a bfloat16 / float16 rounding moves a value by at most 2^-8 of it
F16_MAX = 65504.0
FLOAT32_MAX = 3.4028234663852886e38
# Input magnitudes tried; the last: any finite one. Denser where feeds are: normalised data
# (a few units), raw pixels (up to 255), token embeddings' scale.
GRID = [1.0, 1e1, 1e2, 1e3, 1e4, 1e8, 1e16, 1e32, FLOAT32_MAX]


@dataclass(frozen=True)
class Fact:
    bound: float          # |v| <= bound for every finite element (math.inf: unknown)
    nan: bool = False     # may hold NaN even when the graph inputs are finite
    inf: bool = False     # may hold +-inf even when the graph inputs are finite

    @property
    def finite(self) -> bool:
        return not (self.nan or self.inf) and self.bound < LIMIT


UNKNOWN = Fact(math.inf, True, True)
INTEGER = Fact(2.0 ** 63)


def _cap(f: Fact, dtype: DType | None) -> Fact:
    """A bound at or above what the value's type holds overflows to +-inf (float16: 65504). A
    value stored in a reduced type (bfloat16, float16) may round up: its bound grows by
    ``ROUNDING``."""
    if dtype in (DType.BFLOAT16, DType.FLOAT16) and math.isfinite(f.bound):
        f = Fact(f.bound * ROUNDING, f.nan, f.inf)
    top = F16_MAX if dtype == DType.FLOAT16 else LIMIT
    if f.bound >= top:
        return Fact(math.inf, f.nan or f.inf, True)
    return f


def tensor_fact(t: torch.Tensor) -> Fact:
    """A tensor's fact, in one pass (``aminmax`` propagates NaN)."""
    if not t.is_floating_point():
        return INTEGER
    if t.device.type == "meta":
        return UNKNOWN
    if t.numel() == 0:
        return Fact(0.0)
    lo, hi = (float(x) for x in torch.aminmax(t.detach().reshape(-1)))
    if math.isnan(lo) or math.isnan(hi):
        return Fact(math.inf, True, True)          # NaN somewhere: its magnitudes unknown too
    bound = max(abs(lo), abs(hi))
    return Fact(bound, False, True) if math.isinf(bound) else Fact(bound)


def _union(*facts: Fact) -> Fact:
    return Fact(max(f.bound for f in facts), any(f.nan for f in facts), any(f.inf for f in facts))


def sum_fact(*facts: Fact) -> Fact:
    inf = any(f.inf for f in facts)
    return Fact(sum(f.bound for f in facts), any(f.nan for f in facts) or inf, inf)


def _product(a: Fact, b: Fact, k: float = 1.0) -> Fact:
    """``k`` terms ``x * y`` summed: an inf times anything may be NaN."""
    inf = a.inf or b.inf
    return Fact(k * a.bound * b.bound, a.nan or b.nan or inf, inf)


def _abs_max(t: torch.Tensor | None) -> float:
    if t is None:
        return 0.0
    return tensor_fact(t).bound


ACT_BOUND = {   # activation -> output fact from the pre-activation's
    "": lambda f, p: f, "none": lambda f, p: f, "relu": lambda f, p: f, "leaky_relu": lambda f, p: f,
    "swish": lambda f, p: f, "silu": lambda f, p: f, "hardswish": lambda f, p: f,
    "gelu": lambda f, p: f, "gelu_tanh": lambda f, p: f,
    "sigmoid": lambda f, p: Fact(1.0, f.nan), "tanh": lambda f, p: Fact(1.0, f.nan),
    "hardsigmoid": lambda f, p: Fact(1.0, f.nan),
    "hardtanh": lambda f, p: Fact(max(abs(p[0]), abs(p[1])), f.nan) if len(p) == 2 else f,
}



class Weights:
    """Per node, the gain of its weight (the largest |w| times the terms each output sums: an
    upper bound of every row's L1 norm, computable from the weight's bytes in any layout) and
    the bound of its bias, measured once (they do not depend on ``M``). ``absmax(value)`` gives
    a constant's largest magnitude (math.inf when unknown)."""

    def __init__(self, absmax=None):
        self.absmax = absmax or (lambda v: _abs_max(v.const))
        self._cache: dict[str, tuple[float, float]] = {}
        self._consts: dict[int, Fact] = {}

    def const(self, v: Value) -> Fact:
        got = self._consts.get(id(v))
        if got is None:
            got = self._consts[id(v)] = tensor_fact(v.const) if v.const.device.type != "meta" \
                else (Fact(self.absmax(v)) if v.const.is_floating_point() else INTEGER)
        return got

    def gain(self, node: Node) -> tuple[float, float]:
        got = self._cache.get(node.name)
        if got is None:
            w = node.inputs[1] if len(node.inputs) > 1 else None
            b = node.inputs[2] if len(node.inputs) > 2 else None
            if w is None or not w.is_const or (b is not None and not b.is_const) or w.shape is None:
                got = (math.inf, math.inf)
            else:
                shape = [int(d) for d in w.shape]
                if node.op_type in ("FusedConv", "Conv"):
                    terms = math.prod(shape[1:])
                else:
                    terms = shape[1] if node.attrs.get("trans_b") else shape[0]
                got = (self.absmax(w) * terms, 0.0 if b is None else self.absmax(b))
            self._cache[node.name] = got
        return got


def pre_activation_fact(node: Node, ins: list[Fact], weights: Weights) -> Fact:
    """The fact of a convolution's or product's result before its activation."""
    gain, bias = weights.gain(node)
    pre = _product(ins[0], Fact(gain), 1.0)
    pre = Fact(pre.bound + bias, pre.nan, pre.inf)
    if node.op_type == "FusedConv" and len(ins) > 3 and node.inputs[3] is not None:
        pre = sum_fact(pre, ins[3])
    return pre


def _transfer(node: Node, ins: list[Fact], weights: Weights) -> list[Fact]:
    op, attrs = node.op_type, node.attrs
    same = lambda: [ins[0]] * len(node.outputs)                         # noqa: E731
    if op in PASS_THROUGH:
        return same()
    if op == "Cast":          # a float's type changes (its rounding and range: ``_cap``), an integer's bound holds
        return same()
    if op in ("Concat", "Max", "Min", "Sum", "Where"):
        return [_union(*(ins[1:] if op == "Where" else ins))]
    if op in ("Add", "Sub"):
        return [sum_fact(*ins)]
    if op == "Mul":
        return [_product(ins[0], ins[1])]
    if op in ("FusedConv", "LinearAct", "Linear"):
        act = str(attrs.get("activation", "")) if op != "Linear" else ""
        params = [float(p) for p in attrs.get("activation_params", [])]
        pre = pre_activation_fact(node, ins, weights)
        return [ACT_BOUND.get(act, lambda f, p: UNKNOWN)(pre, params)]
    if op in ("Relu", "LeakyRelu", "Neg", "Abs"):
        return same()
    if op in ("Sigmoid", "Tanh", "Erf", "HardSigmoid"):
        return [Fact(1.0, ins[0].nan)]
    if op == "Clip":
        lo, hi = (_abs_max(node.inputs[i].const) if len(node.inputs) > i and node.inputs[i] is not None
                  else math.inf for i in (1, 2))
        return [Fact(min(ins[0].bound, max(lo, hi)), ins[0].nan, ins[0].inf and math.isinf(max(lo, hi)))]
    if op in ("Softmax", "MaskedSoftmax"):
        nan = any(f.nan or f.inf for f in ins) and not attrs.get("nan_to_zero", 0)
        return [Fact(1.0, nan)]
    if op in ("LayerNorm", "SkipLayerNorm", "LayerNormalization"):
        data = ins[:2] if op == "SkipLayerNorm" else ins[:1]
        d = node.outputs[0].shape[-1] if node.outputs[0].shape else None
        first = 2 if op == "SkipLayerNorm" else 1
        gamma = node.inputs[first].const if len(node.inputs) > first and node.inputs[first] is not None else None
        beta = node.inputs[first + 1].const if len(node.inputs) > first + 1 and node.inputs[first + 1] is not None \
            else None
        if not isinstance(d, int) or (len(node.inputs) > first and gamma is None):
            return [UNKNOWN] * len(node.outputs)
        g = 1.0 if gamma is None else _abs_max(gamma)
        y = Fact(math.sqrt(d) * g + _abs_max(beta), any(f.nan or f.inf for f in data))
        return [y, sum_fact(*data)][:len(node.outputs)]
    if op in ("ChannelLayerNorm", "GroupNorm"):     # |normalised| <= sqrt(elements normalised together)
        shape = node.outputs[0].shape
        if shape is None or len(shape) < 2 or not all(isinstance(d, int) for d in shape[1:]):
            return [UNKNOWN]
        n = shape[1]
        if op == "GroupNorm":
            n = n // max(int(attrs.get("groups", 1)), 1) * math.prod(shape[2:])
        params = [node.inputs[i].const if len(node.inputs) > i and node.inputs[i] is not None else None
                  for i in (1, 2)]
        if any(len(node.inputs) > i and node.inputs[i] is not None and t is None for i, t in zip((1, 2), params)):
            return [UNKNOWN]
        g = 1.0 if params[0] is None else _abs_max(params[0])
        return [Fact(math.sqrt(n) * g + _abs_max(params[1]), ins[0].nan or ins[0].inf)]
    if op == "ScaledDotProductAttention":
        v = ins[0] if attrs.get("qkv_split") else ins[2]
        nan = any(f.nan or f.inf for f in ins if f is not None) and not attrs.get("nan_to_zero", 0)
        return [Fact(v.bound, nan or v.nan)]
    if op == "LRN":
        bias = float(attrs.get("bias", 1.0))
        beta = float(attrs.get("beta", 0.75))
        return [Fact(ins[0].bound / bias ** beta if bias > 0 else math.inf, ins[0].nan or ins[0].inf)]
    if op == "ElementwiseChain":
        return [chain_fact(node, ins)]
    return [UNKNOWN] * len(node.outputs)


PASS_THROUGH = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Transpose", "ChannelShuffle",
                "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Slice", "Split", "Gather",
                "Expand", "Dropout", "Tile", "Pad", "SpaceToDepth", "DepthToSpace"}
_CHAIN_BOUNDED = {"Sigmoid": 1.0, "Tanh": 1.0, "Erf": 1.0}


@lru_cache(maxsize=4096)
def _parsed(steps: tuple) -> tuple | None:
    """A chain's steps as (op, argument indices: -1 the previous step's result), parsed once;
    None when a step is malformed (a re-sealed artifact may say anything)."""
    out = []
    for step in steps:
        words = str(step).split()
        if not words:
            return None
        op, args = words[0], words[1:]
        if not all(a == "p" or (a[:1] == "i" and a[1:].isdigit()) for a in args):
            return None
        out.append((op, tuple(-1 if a == "p" else int(a[1:]) for a in args)))
    return tuple(out)


def chain_fact(node: Node, ins: list[Fact]) -> Fact:
    """An elementwise chain, step by step (steps as ``ops/fused_transformer.chain_source``)."""
    steps = _parsed(tuple(str(x) for x in node.attrs.get("steps", ())))
    if steps is None or any(a >= len(ins) for _, args in steps for a in args):
        return UNKNOWN
    prev = None
    for op, args in steps:
        xs = [prev if a < 0 else ins[a] for a in args]
        if any(x is None for x in xs):
            return UNKNOWN
        if op in ("Relu", "Neg", "Abs"):
            prev = xs[0]
        elif op in _CHAIN_BOUNDED:
            prev = Fact(_CHAIN_BOUNDED[op], xs[0].nan)
        elif op in ("Add", "Sub"):
            prev = sum_fact(*xs)
        elif op == "Mul":
            prev = _product(xs[0], xs[1])
        elif op in ("Max", "Min"):
            prev = _union(*xs)
        else:
            return UNKNOWN
    return prev or UNKNOWN


def propagate_init(graph: Graph, m: float, weights: Weights) -> dict[int, Fact]:
    """The facts before any node: float graph inputs ``Fact(m)``, constants their own."""
    facts: dict[int, Fact] = {}
    for v in graph.inputs:
        facts[id(v)] = INTEGER if v.dtype is not None and not v.dtype.is_float else Fact(m)
    for v in graph.constants.values():
        facts[id(v)] = weights.const(v)
    return facts


def record_facts(node: Node, ins: list[Fact], facts: dict[int, Fact], weights: Weights) -> None:
    """One node's output facts into ``facts``, from its inputs' (``ins``; an absent optional
    input's is ``Fact(0.0)``)."""
    try:
        outs = _transfer(node, ins, weights) if not node.inputs or node.inputs[0] is not None \
            else [UNKNOWN] * len(node.outputs)
    except (IndexError, TypeError, ValueError, KeyError):
        outs = [UNKNOWN] * len(node.outputs)
    for o, f in zip(node.outputs, outs):
        if o.dtype is not None and not o.dtype.is_float:
            f = INTEGER
        facts[id(o)] = _cap(f, o.dtype)


def propagate(graph: Graph, m: float, weights: Weights | None = None) -> dict[int, Fact]:
    """``{id(value): Fact}`` for float graph inputs finite with ``max |x| <= m``."""
    weights = weights or Weights()
    facts = propagate_init(graph, m, weights)
    for node in graph.nodes:
        record_facts(node, [Fact(0.0) if v is None else facts.get(id(v), UNKNOWN) for v in node.inputs], facts, weights)
    return facts
