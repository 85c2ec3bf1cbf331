"""Data-movement fusion rules (``RULES``): rolls as the exporters write them; kernel in
``ops/fused_movement.py``. Exact: they move the same elements to the same places.

- roll (10): ``Concat(Slice(x, k:, axis a), Slice(x, :k, axis a), axis=a)`` (``torch.roll``
  exported along one axis: Swin's cyclic window shift and its reverse), each Slice read only
  by the Concat, x's size n along a known -> ``Roll(x, shifts=[n - k], axes=[a])``.
- roll_merge (9): ``Roll(Roll(x))`` along other axes, the inner one read only by the outer ->
  one ``Roll`` over both (a 2-D shift is two exported rolls): one pass instead of two.
"""
from __future__ import annotations

from ..facts import const_of, producer
from ..rule import FUSEGRAPH_DOMAIN as FG
from ..rule import Decline, Rule
from .pattern import Pat, Var
from .transformer_forms import interior_reason, keep_shape


def _slice_range(v, x):
    """(start, end, axis) of ``v = Slice(x)`` with constant scalar bounds and step 1, read only
    by its user; else None."""
    s = producer(v, "Slice")
    if s is None or s.inputs[0] is not x or s.version < 10 or len(v.uses) != 1 or v.is_graph_output:
        return None
    args = [const_of(s.input(i)) for i in range(1, 5)]
    if args[0] is None or args[1] is None or any(a is not None and a.numel() != 1 for a in args):
        return None
    if args[3] is not None and int(args[3].reshape(-1)[0]) != 1:
        return None
    axis = int(args[2].reshape(-1)[0]) if args[2] is not None else 0
    return int(args[0].reshape(-1)[0]), int(args[1].reshape(-1)[0]), axis


def _roll_check(m, ctx):
    cat = m.root
    if len(cat.inputs) != 2:
        return None
    first, second = cat.inputs
    p = producer(first, "Slice")
    x = p.inputs[0] if p is not None else None
    if x is None or x.shape is None:
        return None
    a1, a2 = _slice_range(first, x), _slice_range(second, x)
    if a1 is None or a2 is None:
        return None
    rank = len(x.shape)
    axis = int(cat.attrs.get("axis", 0)) % rank
    if a1[2] % rank != axis or a2[2] % rank != axis:
        return None
    n = x.shape[axis]
    if not isinstance(n, int):
        return Decline("the rolled axis' size is unknown")
    (s1, e1), (s2, e2) = ([min(max(i + n if i < 0 else i, 0), n) for i in a[:2]] for a in (a1, a2))  # ONNX's clamping
    if not (0 < e2 < n and s2 == 0 and s1 == e2 and e1 == n):
        return None
    k = e2
    return _go(interior_reason([first.producer, second.producer, cat], cat), (x, n - k, axis))


def _go(why, value):
    return value if why is None else why


def _roll_rewrite(m, found, ctx):
    x, shift, axis = found
    return keep_shape(ctx.emit("Roll", [x], {"shifts": [shift], "axes": [axis]}, domain=FG), m.root)


def _merge_check(m, ctx):
    outer, inner = m.root, m.nodes["inner"]
    rank = len(outer.inputs[0].shape or ())
    if rank == 0:
        return Decline("the rank is unknown")
    axes = [int(a) % rank for a in list(inner.attrs["axes"]) + list(outer.attrs["axes"])]
    if len(set(axes)) != len(axes):
        return Decline("the rolls share an axis")
    return _go(interior_reason([inner, outer], outer), axes)


def _merge_rewrite(m, axes, ctx):
    outer, inner = m.root, m.nodes["inner"]
    shifts = [int(s) for s in list(inner.attrs["shifts"]) + list(outer.attrs["shifts"])]
    return keep_shape(ctx.emit("Roll", [inner.inputs[0]], {"shifts": shifts, "axes": axes}, domain=FG), outer)


RULES = [
    Rule("roll", _roll_check, _roll_rewrite, pattern=Pat("Concat"), priority=10,
         doc="Concat(x[k:], x[:k]) along one axis of known size, both Slices read only there"),
    Rule("roll_merge", _merge_check, _merge_rewrite,
         pattern=Pat("fusegraph::Roll", Pat("fusegraph::Roll", Var("x"), name="inner")), priority=9,
         doc="a Roll of a Roll read only there, along other axes"),
]
