"""Operator replacement: reductions of broadcast data, and one-input variadic ops.

- expand_reduce: ``ReduceSum / ReduceMean / ReduceMax / ReduceMin(Expand(x, shape))`` ->
  ``fusegraph::ScaledReduce(x)``: the reduction runs over the small ``x`` (viewed at the
  output rank) and, for a sum, is multiplied by the number of copies the Expand made along
  the reduced axes. Condition: every axis the Expand broadcasts is reduced, with a static
  size; ``x``'s dims are known to be 1 or equal to the expanded dims. Mean / max / min:
  exact; sum: equal up to rounding (n * s instead of s + ... + s).
- sum_single: a one-input ``Sum`` / ``Mean`` / ``Max`` / ``Min`` -> ``Identity`` (exact), which
  no-op elimination then removes.
"""
from __future__ import annotations

from ..ir.shape import dims_equal
from .facts import ints_arg, producer
from .rule import FUSEGRAPH_DOMAIN, Decline, Rule

_MODES = {"ReduceSum": ("sum", 13), "ReduceMean": ("mean", 18), "ReduceMax": ("max", 18),
          "ReduceMin": ("min", 18)}


def _expand_reduce(node, ctx):
    exp = producer(node.inputs[0], "Expand")
    if exp is None:
        return None
    mode, since = _MODES[node.op_type]
    x, y = exp.inputs[0], exp.outputs[0]
    if x.shape is None or y.shape is None or len(x.shape) > len(y.shape):
        return Decline("shapes unknown")
    rank = len(y.shape)
    known, axes = ints_arg(node, 1, "axes", since)
    if not known:
        return Decline("axes are not constant")
    if not axes:
        if node.version >= since and int(node.attrs.get("noop_with_empty_axes", 0)):
            return None
        axes = list(range(rank))
    axes = sorted({a + rank if a < 0 else a for a in axes})
    xs = (1,) * (rank - len(x.shape)) + tuple(x.shape)
    scale, broadcast = 1, 0
    for i in range(rank):
        if dims_equal(xs[i], y.shape[i]) is True:
            continue
        if xs[i] != 1 or not isinstance(y.shape[i], int):
            return Decline(f"cannot tell whether axis {i} is broadcast")
        if i not in axes:
            return Decline(f"expanded axis {i} is not reduced")
        scale *= y.shape[i]
        broadcast += 1
    if not broadcast:
        return None
    if mode == "mean" and not x.dtype.is_float:
        return Decline("integer mean")
    if not ctx.supports("ScaledReduce", FUSEGRAPH_DOMAIN):
        return Decline("no ScaledReduce kernel")
    keepdims = int(node.attrs.get("keepdims", 1))
    return x, {"mode": mode, "axes": axes, "keepdims": keepdims, "rank": rank,
               "scale": float(scale) if mode == "sum" else 1.0}


def _reduce_rewrite(node, match, ctx):
    x, attrs = match
    return ctx.emit("ScaledReduce", [x], attrs, domain=FUSEGRAPH_DOMAIN)


def _single(node, ctx):
    return True if len(node.inputs) == 1 and node.inputs[0] is not None else None


RULES = [
    Rule("expand_reduce", _expand_reduce, _reduce_rewrite, ops=tuple(_MODES),
         doc="every broadcast axis is reduced and static"),
    Rule("sum_single", _single, lambda n, m, ctx: ctx.emit("Identity", [n.inputs[0]]),
         ops=("Sum", "Mean", "Max", "Min"), doc="one input"),
]
