"""No-op elimination: nodes whose output 0 equals their input 0 are bypassed.

Each rule's condition is exact (the output is bit-identical to the input):

- identity: always.
- dropout: inference mode (no training_mode input, or a constant false one) and the mask
  output unused; ratio is irrelevant in inference.
- cast_same: ``to`` equals the input's dtype.
- reshape_same / expand_same: output shape provably equal to the input shape.
- transpose_identity: the permutation is the identity.
- slice_whole: every step is 1 and every sliced axis is covered from start to end (static
  dims, or start 0 and end >= 2^31-1 on a symbolic dim: no real dim is that large).
- pad_zero: every pad amount is 0 (any mode).
- concat_single: a Concat of one input.

A bypass that would make two graph outputs one tensor is declined.
"""
from __future__ import annotations

from ..ir import DType
from .facts import const_of, ints_arg, shapes_equal
from .rule import Decline, Rule

_BIG = (1 << 31) - 1


def _bypass(node, match, ctx):
    return node.inputs[0]


def _rule(name, ops, cond, doc):
    def check(node, ctx):
        if not node.inputs or node.inputs[0] is None:
            return None
        verdict = cond(node)
        if verdict is not True:
            return verdict if isinstance(verdict, Decline) else None
        if any(o.uses or o.is_graph_output for o in node.outputs[1:]):
            return Decline("a secondary output is used")
        out, x = node.outputs[0], node.inputs[0]
        if out.is_graph_output and x.is_graph_output:
            return Decline("would make two graph outputs the same tensor")
        return True
    return Rule(name, check, _bypass, ops=ops, doc=doc)


def _dropout(node):
    if node.version >= 12 and node.input(2) is not None:
        t = const_of(node.input(2))
        if t is None:
            return Decline("training_mode is not a constant")
        if bool(t.reshape(-1)[0]):
            return Decline("training_mode is true")
    return True


def _cast_same(node):
    to = node.attrs.get("to")
    return to is not None and node.inputs[0].dtype != DType.UNDEFINED and DType(to) == node.inputs[0].dtype


def _same_shape(node):
    return shapes_equal(node.inputs[0].shape, node.outputs[0].shape)


def _transpose_identity(node):
    shape = node.inputs[0].shape
    perm = node.attrs.get("perm")
    if perm is None:
        return shape is not None and len(shape) <= 1
    return list(perm) == list(range(len(perm)))


def _slice_whole(node):
    shape = node.inputs[0].shape
    if shape is None:
        return None
    if node.version < 10:
        starts, ends, axes = (node.attrs.get(k) for k in ("starts", "ends", "axes"))
        steps = None
    else:
        parts = [ints_arg(node, i, "", 10) for i in (1, 2, 3, 4)]
        if not all(known for known, _ in parts):
            return None
        starts, ends, axes, steps = (vals for _, vals in parts)
    if starts is None or ends is None:
        return None
    axes = list(range(len(starts))) if axes is None else [a + len(shape) if a < 0 else a for a in axes]
    steps = steps or [1] * len(starts)
    for a, s, e, st in zip(axes, starts, ends, steps):
        if st != 1 or not 0 <= a < len(shape):
            return None
        d = shape[a]
        if isinstance(d, int):
            s = min(max(s + d if s < 0 else s, 0), d)
            e = min(max(e + d if e < 0 else e, 0), d)
            if s != 0 or e != d:
                return None
        elif s != 0 or e < _BIG:
            return None
    return True


def _pad_zero(node):
    known, pads = ints_arg(node, 1, "pads", 11)
    if not known or pads is None:
        return None
    return all(p == 0 for p in pads)


RULES = [
    _rule("identity", ("Identity",), lambda n: True, "always"),
    _rule("dropout", ("Dropout",), _dropout, "inference mode, mask unused"),
    _rule("cast_same", ("Cast",), _cast_same, "target type equals the input type"),
    _rule("reshape_same", ("Reshape",), _same_shape, "output shape provably equals input shape"),
    _rule("expand_same", ("Expand",), _same_shape, "output shape provably equals input shape"),
    _rule("transpose_identity", ("Transpose",), _transpose_identity, "identity permutation"),
    _rule("slice_whole", ("Slice",), _slice_whole, "steps 1, every sliced axis fully covered"),
    _rule("pad_zero", ("Pad",), _pad_zero, "all pads are 0"),
    _rule("concat_single", ("Concat",), lambda n: len(n.inputs) == 1, "one input"),
]
