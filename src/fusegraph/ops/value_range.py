"""Value ranges: how a magnitude bound on an op's inputs bounds its outputs, and whether they
may hold NaN or +-inf. Each op registers its transfer with the op (``register(...,
value_range=...)``); the walk that applies them over a graph, and where the constants' facts
come from, belong to whoever asks (the CPU backend's ``runtime/backends/cpu/finite.py``).

A ``Fact`` is a magnitude bound of every finite element and two flags: the value may hold NaN,
it may hold +-inf, even when the graph inputs are finite. A transfer is a function
``(node, input facts) -> output facts`` (one per output; an absent optional input's fact is
``Fact(0.0)``) that reads only the node's attributes, shapes and its inputs' facts: a
constant input's fact is measured from its bytes by the walk (NaN anywhere in a weight makes
it NaN-carrying; its magnitudes unknown), so a convolution's gain, a clip's limits and a layer
norm's scale carry their constants' NaN and infinities along. A transfer may raise on a node
it cannot read (a malformed attribute): the walk then gives its outputs ``UNKNOWN``.

Shared transfers: ``FactLaw`` wraps a law over the inputs' facts alone (``SAME_AS_INPUT``,
``UNION``, ``SUM``, ``PRODUCT``, ``UNIT_BOUNDED``); an elementwise chain applies its steps' laws
(``chain_fact``), so a chain step is bounded exactly as the op it names. ``ProductRange`` is a
convolution's or product's: its pre-activation (the input bound times the weight's largest
magnitude times the terms each output sums, plus the bias and a residual) and then its fused
activation (``ACT_BOUND``). An op that only moves data and registers no transfer of its own
takes its data-movement class's (``transfer_of``). An op with neither is unknown: no bound
follows through it. Bounds are conservative; a bound at or above what the value's type holds
overflows to +-inf (``cap``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import torch

from ..ir import DType, Node
from .registry import Movement, OpDef, lookup

LIMIT = 1e38                     # below float32's largest (3.4e38): room for rounding
ROUNDING = 1.0 + 2.0 ** -7       # a bfloat16 / float16 rounding moves a value by at most 2^-8 of it
F16_MAX = 65504.0
FLOAT32_MAX = 3.4028234663852886e38


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


def cap(f: Fact, dtype: DType | None) -> Fact:
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


def number_fact(x: float) -> Fact:
    """One number's fact (an attribute's value)."""
    if math.isnan(x):
        return Fact(math.inf, True, True)
    return Fact(math.inf, False, True) if math.isinf(x) else Fact(abs(x))


def union(*facts: Fact) -> Fact:
    """Each element is one of the inputs' elements (a join, a maximum, a selection)."""
    return Fact(max(f.bound for f in facts), any(f.nan for f in facts), any(f.inf for f in facts))


def sum_fact(*facts: Fact) -> Fact:
    """A sum (or difference) of the inputs: inf - inf is NaN."""
    inf = any(f.inf for f in facts)
    return Fact(sum(f.bound for f in facts), any(f.nan for f in facts) or inf, inf)


def product(a: Fact, b: Fact, k: float = 1.0) -> Fact:
    """``k`` terms ``x * y`` summed: an inf times anything may be NaN."""
    inf = a.inf or b.inf
    return Fact(k * a.bound * b.bound, a.nan or b.nan or inf, inf)


# ---------------------------------------------------------------- shared transfers

Transfer = Callable[[Node, "list[Fact]"], "list[Fact]"]


@dataclass(frozen=True)
class FactLaw:
    """A transfer that reads only its inputs' facts: every output gets ``law(*facts)``. An
    elementwise chain applies the law of the op each step names (``chain_fact``)."""
    name: str
    law: Callable[..., Fact]

    def __call__(self, node: Node, ins: list[Fact]) -> list[Fact]:
        return [self.law(*ins)] * len(node.outputs)


SAME_AS_INPUT = FactLaw("same as input 0", lambda x, *_: x)     # every output element is an input 0 element
UNION = FactLaw("union of the inputs", union)
SUM = FactLaw("sum of the inputs", sum_fact)
PRODUCT = FactLaw("product of two inputs", lambda a, b: product(a, b))
UNIT_BOUNDED = FactLaw("within [-1, 1]", lambda x, *_: Fact(1.0, x.nan))   # sigmoid, tanh, erf: NaN stays NaN

# the transfer of an op that only moves data and registers none of its own, by its class
# (a pad's fill is part of its value: a PAD op registers its own)
BY_MOVEMENT: dict[Movement, Transfer] = {
    Movement.VIEW: SAME_AS_INPUT, Movement.PERMUTE: SAME_AS_INPUT, Movement.SELECT: SAME_AS_INPUT,
    Movement.REPLICATE: SAME_AS_INPUT, Movement.CAST: SAME_AS_INPUT,   # a float's rounding and range: ``cap``
    Movement.JOIN: UNION,
}


def transfer_of(opdef: OpDef | None) -> Transfer | None:
    """The op's registered transfer, else its data-movement class's; None: unknown."""
    if opdef is None:
        return None
    return opdef.value_range or BY_MOVEMENT.get(opdef.movement)


# ---------------------------------------------------------------- activations, products

def _hardtanh(f: Fact, p: list[float]) -> Fact:
    if len(p) != 2:
        return f
    if any(math.isnan(x) for x in p):
        return UNKNOWN
    return Fact(max(abs(p[0]), abs(p[1])), f.nan)


def leaky_relu_fact(f: Fact, slope: float) -> Fact:
    """A leaky relu's: a slope steeper than 1 enlarges the negative side."""
    if math.isnan(slope):
        return UNKNOWN
    return f if abs(slope) <= 1.0 else Fact(f.bound * abs(slope), f.nan, f.inf)


ACT_BOUND: dict[str, Callable[[Fact, list[float]], Fact]] = {   # activation -> output fact from the pre-activation's
    "": lambda f, p: f, "none": lambda f, p: f, "relu": lambda f, p: f, "leaky_relu": lambda f, p: leaky_relu_fact(f, p[0] if p else 0.01),
    "swish": lambda f, p: f, "silu": lambda f, p: f, "hardswish": lambda f, p: f,
    "gelu": lambda f, p: f, "gelu_tanh": lambda f, p: f,
    "sigmoid": lambda f, p: Fact(1.0, f.nan), "tanh": lambda f, p: Fact(1.0, f.nan),
    "hardsigmoid": lambda f, p: Fact(1.0, f.nan),
    "hardtanh": _hardtanh,
}


@dataclass(frozen=True)
class ProductRange:
    """A convolution's or product's transfer: ``act(x * w + b + z)``. ``terms(node)``: the
    terms each output sums (from the weight's shape; None when unknown). The weight's gain,
    its largest magnitude times the terms, bounds every row's L1 norm in any layout, and
    carries the weight's NaN / inf flags: a NaN weight makes the product NaN-carrying."""
    terms: Callable[[Node], "int | None"]
    activation: bool = True      # reads the ``activation`` / ``activation_params`` attributes

    def pre(self, node: Node, ins: list[Fact]) -> Fact:
        """The fact of the result before its activation."""
        n = self.terms(node)
        w = ins[1] if len(ins) > 1 else UNKNOWN
        gain = Fact(math.inf if n is None else w.bound * n, w.nan, w.inf)
        pre = product(ins[0], gain)
        b = ins[2] if len(ins) > 2 else Fact(0.0)
        pre = Fact(pre.bound + b.bound, pre.nan or b.nan, pre.inf or b.inf)
        return sum_fact(pre, ins[3]) if len(ins) > 3 else pre     # a residual summand

    def __call__(self, node: Node, ins: list[Fact]) -> list[Fact]:
        act = str(node.attrs.get("activation", "")) if self.activation else ""
        params = [float(p) for p in node.attrs.get("activation_params", [])] if self.activation else []
        return [ACT_BOUND.get(act, lambda f, p: UNKNOWN)(self.pre(node, ins), params)]


def pre_activation_fact(node: Node, ins: list[Fact], opdef: OpDef | None) -> Fact:
    """The fact of a convolution's or product's result before its fused activation
    (``UNKNOWN`` for an op that is not one)."""
    t = transfer_of(opdef)
    return t.pre(node, ins) if isinstance(t, ProductRange) else UNKNOWN


# ---------------------------------------------------------------- elementwise chains

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


def step_law(op: str) -> Callable[..., Fact] | None:
    """The law of the ONNX op a chain step names, when its transfer reads only facts."""
    t = transfer_of(lookup("", op, 1 << 30))
    return t.law if isinstance(t, FactLaw) else None


def chain_fact(steps, ins: list[Fact]) -> Fact:
    """An elementwise chain's value, step by step (steps as ``ops/fused_transformer.chain_source``)."""
    parsed = _parsed(tuple(str(x) for x in steps))
    if parsed is None or any(a >= len(ins) for _, args in parsed for a in args):
        return UNKNOWN
    prev = None
    for op, args in parsed:
        xs = [prev if a < 0 else ins[a] for a in args]
        law = step_law(op)
        if law is None or any(x is None for x in xs):
            return UNKNOWN
        try:
            prev = law(*xs)
        except TypeError:            # the wrong number of operands for the op
            return UNKNOWN
    return prev or UNKNOWN


def chain_range(node: Node, ins: list[Fact]) -> list[Fact]:
    """``ElementwiseChain``'s transfer."""
    return [chain_fact(node.attrs.get("steps", ()), ins)]
