"""Operator replacement: Transposes and Reshapes around a matmul are absorbed into it.

- transpose_into_matmul: ``MatMul(Transpose(a), b)`` (either operand) where the Transpose
  swaps exactly the last two axes and feeds only this matmul -> ``fusegraph::BatchMatMul``
  with that operand marked transposed (a strided view at run time, no copy). Both ranks >= 2.
- transpose_of_matmul: ``Transpose(MatMul(a, b))`` swapping the last two axes, the matmul
  used only there -> ``BatchMatMul(b, a, trans_a, trans_b)``, since ``(AB)^T = B^T A^T``.
- reshape_around_matmul: ``Reshape(M(Reshape(x, [P, K]), W), [d..., N])`` with M a MatMul of
  2-D ``W`` or a ``fusegraph::Linear``, ``x`` of shape ``[d..., K]`` -> ``M(x, W)``: a matmul
  by a 2-D weight already maps every leading dim independently. Shapes must be provably equal.

Exact: the same products and sums, in the same order.
"""
from __future__ import annotations

from .facts import only_use, producer, shapes_equal
from .rule import FUSEGRAPH_DOMAIN, Decline, Rule

_MATMULS = ("MatMul", "fusegraph::BatchMatMul")


def _swap_last_two(node) -> bool:
    perm = node.attrs.get("perm")
    if perm is None:
        return node.inputs[0].shape is not None and len(node.inputs[0].shape) == 2
    perm = list(perm)
    n = len(perm)
    return n >= 2 and perm == list(range(n - 2)) + [n - 1, n - 2]


def _flags(node):
    if node.op_type == "MatMul":
        return 0, 0
    return int(node.attrs.get("trans_a", 0)), int(node.attrs.get("trans_b", 0))


def _ranks_ok(*values) -> bool:
    return all(v.shape is not None and len(v.shape) >= 2 for v in values)


def _transpose_into(node, ctx):
    if len(node.inputs) != 2 or None in node.inputs:   # malformed arity: inference reports it
        return None
    a, b = node.inputs
    ta, tb = _flags(node)
    new, absorbed = [a, b], 0
    flags = [ta, tb]
    for i, v in enumerate((a, b)):
        t = producer(v, "Transpose")
        if t is not None and _swap_last_two(t) and only_use(v):
            new[i], flags[i] = t.inputs[0], 1 - flags[i]
            absorbed += 1
    if not absorbed:
        return None
    if not _ranks_ok(*new):
        return Decline("an operand has rank < 2")
    if not ctx.supports("BatchMatMul", FUSEGRAPH_DOMAIN):
        return Decline("no BatchMatMul kernel")
    return new, flags


def _bmm_rewrite(node, match, ctx):
    (a, b), (ta, tb) = match
    return ctx.emit("BatchMatMul", [a, b], {"trans_a": ta, "trans_b": tb}, domain=FUSEGRAPH_DOMAIN)


def _transpose_of(node, ctx):
    mm = node.inputs[0].producer
    if mm is None or mm.op_type not in ("MatMul", "BatchMatMul") or not _swap_last_two(node):
        return None
    if mm.op_type == "BatchMatMul" and mm.domain != FUSEGRAPH_DOMAIN:
        return None
    if not only_use(mm.outputs[0]):
        return Decline("matmul output has other users")
    a, b = mm.inputs
    if not _ranks_ok(a, b):
        return Decline("an operand has rank < 2")
    ta, tb = _flags(mm)
    return [b, a], [1 - tb, 1 - ta]


def _reshape_around(node, ctx):
    mm = node.inputs[0].producer
    if mm is None or (mm.domain, mm.op_type) not in (("", "MatMul"), (FUSEGRAPH_DOMAIN, "Linear")):
        return None
    inner = producer(mm.inputs[0], "Reshape")
    if inner is None or not only_use(mm.outputs[0]):
        return None
    x, flat, w = inner.inputs[0], inner.outputs[0], mm.inputs[1]
    if w.shape is None or len(w.shape) != 2 or x.shape is None or len(x.shape) < 2:
        return Decline("weight not 2-D or input rank unknown")
    if flat.shape is None or len(flat.shape) != 2 or not shapes_equal(flat.shape[1:], x.shape[-1:]):
        return Decline("the inner Reshape does not only merge the leading dims")
    out = mm.outputs[0].shape
    if out is None or not shapes_equal(node.outputs[0].shape, tuple(x.shape[:-1]) + tuple(out[-1:])):
        return Decline("the outer Reshape does not restore the leading dims")
    return mm, x


def _reshape_rewrite(node, match, ctx):
    mm, x = match
    return ctx.emit(mm.op_type, [x] + list(mm.inputs[1:]), dict(mm.attrs), domain=mm.domain)


RULES = [
    Rule("transpose_into_matmul", _transpose_into, _bmm_rewrite, ops=_MATMULS,
         doc="Transpose swaps the last two axes only and feeds only the matmul; ranks >= 2"),
    Rule("transpose_of_matmul", _transpose_of, _bmm_rewrite, ops=("Transpose",),
         doc="Transpose swaps the last two axes only; matmul output used once; ranks >= 2"),
    Rule("reshape_around_matmul", _reshape_around, _reshape_rewrite, ops=("Reshape",),
         doc="2-D weight; inner Reshape merges leading dims, outer restores them"),
]
