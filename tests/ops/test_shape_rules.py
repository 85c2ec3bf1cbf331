"""The run-time shape rules (``ops/shape_rules.py``) against the ops' own kernels: for each op
with a rule, nodes of several forms at random concrete shapes; the rule's output shapes must be
the shapes the portable kernel returns (run on meta tensors, values passed where the rule
reads them). And the bucket boundaries of ``plan/buckets.py``."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fusegraph.ir import DType, Graph
from fusegraph.ops import opdef_for
from fusegraph.ops.registry import NodeContext
from fusegraph.ops.shape_rules import broadcast, rule_for
from fusegraph.plan.buckets import boundary_at_least, slot_capacity


def _node(op, shapes, attrs=None, consts=None, domain="", version=17, n_out=1, dtype=DType.FLOAT):
    g = Graph("rules")
    ins = []
    for i, s in enumerate(shapes):
        if s is None:
            ins.append(None)
        elif consts and i in consts:
            ins.append(g.add_constant(f"c{i}", consts[i]))
        else:
            ins.append(g.add_input(f"x{i}", dtype if i == 0 or op != "Gather" else DType.INT64,
                                   tuple(f"s{i}_{k}" for k in range(len(s)))))
    node = g.add_node(op, ins, outputs=n_out, attrs=attrs or {}, domain=domain, version=version)
    for o in node.outputs:
        o.dtype = dtype
    return node


def _check(node, shapes, consts=None):
    found = rule_for(node)
    assert found is not None, node.op_type
    rule, reads = found
    values = [None] * len(shapes)
    for i in reads(node):
        values[i] = (consts or {}).get(i)
    got = rule(node, shapes, values)
    kernel = opdef_for(node).build(NodeContext(node, "meta"))
    args = []
    for i, s in enumerate(shapes):
        if s is None:
            args.append(None)
        elif consts and i in consts:
            args.append(consts[i])
        else:
            dt = node.inputs[i].dtype.to_torch()
            args.append(torch.zeros(s, dtype=dt) if dt == torch.int64 else torch.empty(s, device="meta", dtype=dt))
    with torch.device("meta"):
        out = kernel(*args)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    assert [tuple(s) for s in got] == [tuple(t.shape) for t in outs], (node.op_type, shapes, node.attrs)


RNG = np.random.default_rng(0)


@pytest.mark.parametrize("op", ["Relu", "Sigmoid", "Tanh", "Softmax", "Cast", "Erf"])
def test_same_shape_ops(op):
    attrs = {"to": int(DType.FLOAT)} if op == "Cast" else {}
    for s in [(3,), (2, 5), (1, 7, 4)]:
        _check(_node(op, [s], attrs), [s])


@pytest.mark.parametrize("op", ["Add", "Mul", "Sub", "Div", "Max", "Where"])
def test_broadcasting_ops(op):
    cases = [[(2, 3), (3,)], [(4, 1, 5), (1, 6, 5)], [(1,), (7, 1)]]
    for shapes in cases:
        if op == "Where":
            shapes = [shapes[0]] + shapes
            node = _node(op, shapes)
            node.inputs[0].dtype = DType.BOOL
            _check(node, shapes)
        else:
            _check(_node(op, shapes), shapes)


def test_matmul_and_linear():
    for a, b in [((5, 4), (4, 3)), ((2, 5, 4), (4, 3)), ((2, 1, 5, 4), (3, 4, 6)), ((4,), (4, 3)), ((2, 5, 4), (4,))]:
        _check(_node("MatMul", [a, b]), [a, b])
    w = torch.randn(4, 3)
    for x in [(5, 4), (2, 7, 4)]:
        _check(_node("Linear", [x, (4, 3)], {"trans_b": 0}, {1: w}, domain="fusegraph", version=1), [x, (4, 3)], {1: w})
        wt = torch.randn(3, 4)
        _check(_node("Linear", [x, (3, 4)], {"trans_b": 1}, {1: wt}, domain="fusegraph", version=1), [x, (3, 4)],
               {1: wt})


def test_data_movement():
    _check(_node("Transpose", [(2, 3, 4)], {"perm": [2, 0, 1]}), [(2, 3, 4)])
    _check(_node("Transpose", [(2, 3, 4)]), [(2, 3, 4)])
    _check(_node("Concat", [(2, 3), (2, 5)], {"axis": 1}), [(2, 3), (2, 5)])
    _check(_node("Concat", [(2, 3, 0), (2, 3, 4)], {"axis": -1}), [(2, 3, 0), (2, 3, 4)])
    _check(_node("Flatten", [(2, 3, 4)], {"axis": 2}), [(2, 3, 4)])
    idx = (3, 2)
    _check(_node("Gather", [(5, 6), idx], {"axis": 0}), [(5, 6), idx])
    _check(_node("Gather", [(5, 6, 7), idx], {"axis": 1}), [(5, 6, 7), idx])


def test_ops_that_read_shape_values():
    for x, spec in [((2, 3, 4), [0, -1]), ((6, 4), [3, 2, -1]), ((2, 3, 4), [2, 0, 2, 2])]:
        t = torch.tensor(spec)
        _check(_node("Reshape", [x, (len(spec),)], consts={1: t}), [x, (len(spec),)], {1: t})
    for x, target in [((3, 1), [2, 3, 4]), ((1,), [5])]:
        t = torch.tensor(target)
        _check(_node("Expand", [x, (len(target),)], consts={1: t}), [x, (len(target),)], {1: t})
    for x, axes in [((3, 4), [0]), ((3, 4), [0, 3])]:
        t = torch.tensor(axes)
        _check(_node("Unsqueeze", [x, (len(axes),)], consts={1: t}), [x, (len(axes),)], {1: t})
    t = torch.tensor([1])
    _check(_node("Squeeze", [(3, 1, 4), (1,)], consts={1: t}), [(3, 1, 4), (1,)], {1: t})
    for starts, ends, axes, steps in [([1], [4], [1], [1]), ([0, -3], [9, 100], [0, 1], [2, 1]), ([5], [-1], [0], [-2])]:
        consts = {1: torch.tensor(starts), 2: torch.tensor(ends), 3: torch.tensor(axes), 4: torch.tensor(steps)}
        shapes = [(7, 8), (len(starts),), (len(ends),), (len(axes),), (len(steps),)]
        _check(_node("Slice", shapes, consts=consts), shapes, consts)
    split = {1: torch.tensor([2, 5])}
    _check(_node("Split", [(3, 7), (2,)], {"axis": 1}, split, n_out=2), [(3, 7), (2,)], split)
    _check(_node("Split", [(6, 2)], {"axis": 0}, n_out=3), [(6, 2)])


def test_attention_rule():
    q = (2, 5, 64)
    node = _node("ScaledDotProductAttention", [(2, 5, 192), None, None],
                 {"qkv_split": [64, 64, 64], "q_heads": 4, "k_heads": 4, "v_heads": 4, "merge_heads": 1,
                  "scale": 0.25}, domain="fusegraph",
                 version=1)
    _check(node, [(2, 5, 192), None, None])
    node = _node("ScaledDotProductAttention", [(1, 4, 3, 16), (1, 4, 9, 16), (1, 4, 9, 16)], {"scale": 0.25},
                 domain="fusegraph", version=1)
    _check(node, [(1, 4, 3, 16), (1, 4, 9, 16), (1, 4, 9, 16)])
    assert q


def test_broadcast_refuses_what_does_not_broadcast():
    assert broadcast((2, 1), (1, 3)) == (2, 3)
    with pytest.raises(ValueError):
        broadcast((2, 3), (4, 3))


def test_bucket_boundaries():
    seen = sorted({boundary_at_least(n) for n in range(1, 200)})
    assert seen[:12] == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
    for n in range(1, 5000):
        b = boundary_at_least(n)
        assert n <= b and (b <= 4 or b <= 1.5 * n)
    assert slot_capacity(0) == 0 and slot_capacity(1) == 64 and slot_capacity(64 * 5) == 64 * 6
