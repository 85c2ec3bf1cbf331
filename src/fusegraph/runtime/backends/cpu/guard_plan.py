"""Which kernels may run their fast form: the largest input magnitude under which a kernel whose
only difference from ONNX is NaN / Inf (a fused relu, clip, GELU or hard sigmoid, a standalone
GELU, a chain's final Relu, a max pool without its finiteness check, a layer norm (over the last
axis or over channels) without its overflow check)
computes exactly what the exact kernel does, from the bounds of ``finite.py``.

A kernel is *guarded* when its fast form is exact as long as its input (or pre-activation) is
finite (a layer norm: as long as its row's sum of squared deviations is): ``fast_limits``
finds, per guarded node, the largest ``M`` of a short grid (1, 10, .. 1e32) for which that
holds (``math.inf`` when it holds for float32's largest finite value too: for every finite
input; nodes for which it never holds are left out). At run time the backend measures ``M``
on the feeds (NaN and +-inf give NaN, which no limit admits) and runs each guarded node's
fast kernel when ``M <= limit``, its exact kernel otherwise. Deep in a network the bounds
from the graph inputs outgrow every limit: ``guard_plan`` has the values such a node reads
measured at run time where they are made (``GuardPlan.measured``: the producer takes their
``max |x|`` right after it runs, ``backends/cpu/guard.py``), and bounds them, and
everything computed from them, like a graph input.
"""
from __future__ import annotations

import math
from collections import ChainMap
from dataclasses import dataclass

from ....ir import DType, Graph, Node, Value
from ....ir.shape import numel
from ....ops import Movement, movement_ops
from ....ops.value_range import UNKNOWN, Fact, chain_fact, pre_activation_fact, sum_fact
from .finite import GRID, ConstantFacts, op_facts, propagate_init, record_facts

# fast post-op differs from the exact one on NaN / Inf only (relu: oneDNN's maps NaN to 0, the
# exact elu with alpha 0 costs 5-10 % on conv nets)
GUARDED_ACTS = {"relu", "hardtanh", "hardsigmoid", "gelu", "gelu_tanh"}
NORMS = ("LayerNorm", "SkipLayerNorm", "ChannelLayerNorm")
INTEGERS = (DType.UINT8, DType.INT8)


def _guarded(node: Node) -> bool:
    """A node whose fast kernel differs from the exact one on NaN / Inf only (a max pool of
    integers has neither)."""
    return (node.op_type == "MaxPool" and len(node.outputs) == 1 and node.inputs[0].dtype not in INTEGERS) or \
        (node.op_type == "Gelu" and len([v for v in node.inputs if v is not None]) == 1
         and node.inputs[0].dtype in (DType.FLOAT, DType.BFLOAT16)) or \
        (node.op_type in ("FusedConv", "LinearAct") and str(node.attrs.get("activation", "")) in GUARDED_ACTS) or \
        (node.domain == "fusegraph" and node.op_type in NORMS) or _relu_chain(node)


def _relu_chain(node: Node) -> bool:
    """An elementwise chain ending in a Relu (a pre-activation BatchNorm and its ReLU): its fast
    kernel's relu post-op maps NaN to 0."""
    steps = node.attrs.get("steps", []) if node.op_type == "ElementwiseChain" else []
    return len(steps) > 1 and str(steps[-1]).split() == ["Relu", "p"]


def _guard_fact(node: Node, ins: list[Fact]) -> Fact:
    """The fact a guarded node's fast kernel needs finite, from its inputs' facts: a max pool's
    input, a convolution's or product's pre-activation, a chain's value (its Relu keeps NaN in
    the analysis), a layer norm's sum of squared deviations per row."""
    if node.op_type in ("MaxPool", "Gelu"):
        return ins[0]
    if node.op_type == "ElementwiseChain":
        return chain_fact(node.attrs.get("steps", ()), ins)
    if node.op_type in NORMS:         # the row's sum of squared deviations: at most d * (2 max|x|)^2
        x = sum_fact(*ins[:2]) if node.op_type == "SkipLayerNorm" else ins[0]
        shape = node.outputs[0].shape
        axis = 1 if node.op_type == "ChannelLayerNorm" else -1       # the normalised axis
        d = shape[axis] if shape and len(shape) > max(axis, 0) else None
        if not isinstance(d, int):
            return UNKNOWN
        return Fact(4.0 * d * x.bound * x.bound, x.nan, x.inf)
    return pre_activation_fact(node, ins, op_facts(node))


MEASURE_MIN = 1 << 14        # output elements: a smaller guarded node saves less than a measurement costs
# Where a value a weak guarded node reads is measured (``_sources``): through a join or a
# view the parts it is made of (a DenseNet join: its newest part, not the whole join again;
# a view is the same elements, so a measurement before it bounds what it shows); first also
# through a cast and cheap elementwise work (the BatchNorm-ReLU chain in front of a DenseNet
# convolution: the join's parts, not the chain's output), else at the join. Copies that
# reorder, select, replicate or pad are measured where they are made: the pattern this was
# made for has none, and looking through them would move measurements no model has asked to move.
SHALLOW_MOVES = (Movement.VIEW, Movement.JOIN)
DEEP_MOVES = SHALLOW_MOVES + (Movement.CAST,)
DEEP_COMPUTING = frozenset({("fusegraph", "ElementwiseChain"), ("", "Relu")})


def shallow() -> frozenset:
    """(domain, op) the measurement looks through on its second try."""
    return movement_ops(*SHALLOW_MOVES)


def deep() -> frozenset:
    """(domain, op) the measurement looks through on its first try."""
    return movement_ops(*DEEP_MOVES) | DEEP_COMPUTING


@dataclass
class GuardPlan:
    """``limits``: guarded node -> the largest ``M`` its fast kernel admits; ``measured``:
    node -> the indices of its outputs it measures right after it runs (their facts are then
    ``M``-bounded like a graph input's for every reader, and so is everything computed from them)."""
    limits: dict[str, float]
    measured: dict[str, tuple[int, ...]]


def _limit(ok: list[bool]) -> float | None:
    """The largest grid value of the finite prefix (``math.inf`` for the whole grid), or None."""
    n = next((i for i, good in enumerate(ok) if not good), len(ok))
    return None if n == 0 else (math.inf if n == len(GRID) else GRID[n - 1])


def _sources(v: Value | None, anchored: dict[int, Value], out: dict[int, Value], through: frozenset) -> None:
    """Into ``out``: the computed float values to measure so that ``v`` is bounded from
    measurements: ``v`` itself, or, when its producer is one of ``through``, what that reads.
    Graph inputs and constants have facts of their own; measured values are bounded."""
    if v is None or v.is_const or v.producer is None or v.dtype is None or not v.dtype.is_float \
            or id(v) in anchored:
        return
    p = v.producer
    if (p.domain, p.op_type) in through:
        for x in p.inputs:
            _sources(x, anchored, out, through)
    else:
        out[id(v)] = v


def _worth_measuring(node: Node) -> bool:
    n = numel(node.outputs[0].shape) if node.outputs and node.outputs[0].shape is not None else None
    return isinstance(n, int) and n >= MEASURE_MIN


def _anchor(outputs, anchored, table: dict, m: float) -> None:
    for o in outputs:
        if id(o) in anchored:
            table[id(o)] = Fact(m)


def _trial(nodes: list[Node], lo: int, node: Node, hi: int, sources: dict[int, Value], facts: list[dict],
           anchored: dict[int, Value]) -> float | None:
    """``node``'s limit were ``sources`` measured too: the facts of ``nodes[lo:hi]`` downstream
    of them derived again on an overlay of each grid point's table."""
    both = {**anchored, **sources}
    ok = []
    for m, table in zip(GRID, facts):
        over = {k: Fact(m) for k in sources}
        view = ChainMap(over, table)
        for n in nodes[lo:hi]:
            if any(v is not None and id(v) in over for v in n.inputs):
                record_facts(n, [Fact(0.0) if v is None else view.get(id(v), UNKNOWN) for v in n.inputs], over)
                _anchor(n.outputs, both, over, m)
        ins = [Fact(0.0) if v is None else view.get(id(v), UNKNOWN) for v in node.inputs]
        ok.append(_guard_fact(node, ins).finite)
    return _limit(ok)


def _fewest(nodes: list[Node], position: dict, node: Node, i: int, sources: dict[int, Value], lo: int,
            limit: float, facts: list[dict], anchored: dict[int, Value]) -> tuple[dict[int, Value], int]:
    """``sources`` less each value whose measurement the limit does not need (a product's
    output on a quantisation grid is bounded already; measuring it costs a pass over it on
    every run), with the earliest producer position of what is left."""
    for key in list(sources):
        if len(sources) == 1:
            break
        rest = {k: v for k, v in sources.items() if k != key}
        first = min(position[id(v.producer)] for v in rest.values())
        got = _trial(nodes, first + 1, node, i, rest, facts, anchored)
        if got is not None and got >= limit:
            sources, lo = rest, first
    return sources, lo


def record_at_every_point(node: Node, ins: list[list[Fact]], facts: list[dict]) -> None:
    """``record_facts`` of ``node`` into each grid point's table from that point's input facts
    (``ins``); made once and shared where they are the same at every point (a transfer is a
    function of its node and its inputs' facts: its outputs' are then the same too), as they
    are wherever a bound no longer depends on the graph inputs' magnitude."""
    first = ins[0]
    if all(x == first for x in ins[1:]):
        record_facts(node, first, facts[0])
        made = [(id(o), facts[0][id(o)]) for o in node.outputs]
        for table in facts[1:]:
            table.update(made)
        return
    for table, x in zip(facts, ins):
        record_facts(node, x, table)


def guard_plan(graph: Graph, const_fact=None, measure_below: float | None = None) -> GuardPlan:
    """Every guarded node's limit, in one walk evaluating the whole grid at once. With
    ``measure_below``, a guarded node admitted only below it (or not at all) has values it
    depends on measured where they are made (``_sources``, deep then shallow: right after
    their producer runs, before any reader) when that admits it further (``_trial``); the walk
    then resumes at the earliest such producer, so every reader of a measured value, and
    everything downstream, is bounded by the measurement. ``const_fact(value)``: the fact of a
    constant whose plain tensor the backend released (``finite.ConstantFacts``)."""
    constants = ConstantFacts(const_fact)
    nodes = list(graph.nodes)
    position = {id(n): i for i, n in enumerate(nodes)}
    facts = [propagate_init(graph, m, constants) for m in GRID]
    limits: dict[str, float] = {}
    anchored: dict[int, Value] = {}           # id(value) -> value measured after its producer runs
    i = 0
    while i < len(nodes):
        node = nodes[i]
        ins = [[Fact(0.0) if v is None else t.get(id(v), UNKNOWN) for v in node.inputs] for t in facts]
        if _guarded(node):
            limits.pop(node.name, None)
            limit = _limit([_guard_fact(node, x).finite for x in ins])
            if measure_below is not None and (limit is None or limit < measure_below) and _worth_measuring(node):
                restart = None
                for through in (deep(), shallow()):
                    new: dict[int, Value] = {}
                    for v in node.inputs:
                        _sources(v, anchored, new, through)
                    if not new:
                        continue
                    lo = min(position[id(v.producer)] for v in new.values())
                    better = _trial(nodes, lo + 1, node, i, new, facts, anchored)
                    if better is not None and (limit is None or better > limit):
                        new, lo = _fewest(nodes, position, node, i, new, lo, better, facts, anchored)
                        anchored.update(new)
                        restart = lo
                        break
                if restart is not None:
                    i = restart
                    continue
            if limit is not None:
                limits[node.name] = limit
        record_at_every_point(node, ins, facts)
        for m, table in zip(GRID, facts):
            _anchor(node.outputs, anchored, table, m)
        i += 1
    measured: dict[str, tuple[int, ...]] = {}
    for v in anchored.values():
        p = v.producer
        k = next(k for k, o in enumerate(p.outputs) if o is v)
        measured[p.name] = tuple(sorted({*measured.get(p.name, ()), k}))
    return GuardPlan(limits, measured)


def fast_limits(graph: Graph, const_fact=None) -> dict[str, float]:
    """``{node name: largest M}`` for the guarded nodes whose fast kernel is exact while
    ``max |float input| <= M`` (``math.inf``: for every finite input, as far as the grid
    tells); ``const_fact(value)``: a released constant's fact (default: unknown)."""
    return guard_plan(graph, const_fact).limits
