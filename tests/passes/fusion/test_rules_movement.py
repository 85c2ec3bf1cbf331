"""Movement fusion rules (passes/fusion/rules_movement.py): torch.roll as exporters write it
(Swin's cyclic shift: a Concat of two Slices per axis) becomes one ``Roll`` kernel, two axes
one ``Roll``; against O0 and onnxruntime ORT_DISABLE_ALL, and the Roll kernel against
torch.roll with its shape rule."""
import numpy as np
import pytest
import torch

from fusegraph.ir import DType, Graph
from fusegraph.ops import opdef_for
from fusegraph.ops.registry import NodeContext
from fusegraph.ops.shape_rules import rule_for
from passes_util import F, check, const, model, node, ops

BIG = 2**63 - 1


def _roll_nodes(x, out, axis, k, negative=False):
    """torch.roll exported: Concat(x[k:], x[:k]) (a roll by -k), or with ``negative``
    Concat(x[-k:], x[:-k]) (a roll by +k)."""
    lo, hi = (-k, k) if negative else (k, k)
    return [node("Slice", [x, f"{out}_s1", f"{out}_e1", f"{out}_a"], f"{out}_hi"),
            node("Slice", [x, f"{out}_s2", f"{out}_e2", f"{out}_a"], f"{out}_lo"),
            node("Concat", [f"{out}_hi", f"{out}_lo"], out, axis=axis)], \
        [const(f"{out}_s1", [lo], np.int64), const(f"{out}_e1", [BIG], np.int64), const(f"{out}_a", [axis], np.int64),
         const(f"{out}_s2", [0], np.int64), const(f"{out}_e2", [hi if not negative else -k], np.int64)]


@pytest.mark.parametrize("negative", [False, True])
def test_roll_one_axis(negative):
    nodes, inits = _roll_nodes("x", "y", 1, 3, negative)
    c = check(model(nodes, [("x", F, [1, 8, 6, 4])], ["y"], inits), oracle="ort")
    assert ops(c) == ["Roll"]
    n = c.graph.nodes[0]
    assert (n.attrs["axes"], n.attrs["shifts"]) == ([1], [3 if negative else 5])   # x[-3:]: roll by +3


def test_roll_two_axes_is_one_kernel():
    a, ia = _roll_nodes("x", "r1", 1, 3)
    b, ib = _roll_nodes("r1", "y", 2, 2, negative=True)
    c = check(model(a + b, [("x", F, [1, 8, 6, 4])], ["y"], ia + ib), oracle="ort")
    assert ops(c) == ["Roll"]
    n = c.graph.nodes[0]
    assert (n.attrs["axes"], n.attrs["shifts"]) == ([1, 2], [5, 2])


def test_roll_needs_the_two_parts_of_one_tensor():
    """Parts that do not cover the axis once each (x[3:] and x[:2]): a plain Concat."""
    nodes, inits = _roll_nodes("x", "y", 1, 3)
    inits = [t if t.name != "y_e2" else const("y_e2", [2], np.int64) for t in inits]
    c = check(model(nodes, [("x", F, [1, 8, 6, 4])], ["y"], inits), oracle="ort")
    assert "Roll" not in ops(c)


def test_roll_kernel_and_shape_rule():
    g = Graph("roll")
    x = g.add_input("x", DType.FLOAT, (2, 5, 7, 3))
    n = g.add_node("Roll", [x], attrs={"shifts": [2, -3], "axes": [1, -2]}, domain="fusegraph", version=1)
    n.outputs[0].dtype = DType.FLOAT
    k = opdef_for(n).build(NodeContext(n, "cpu"))
    t = torch.randn(2, 5, 7, 3)
    want = torch.roll(t, (2, -3), (1, 2))
    assert torch.equal(k(t), want)
    out = torch.empty_like(t)
    assert k(t, out=out) is out and torch.equal(out, want)
    rule, _ = rule_for(n)
    assert rule(n, [(2, 5, 7, 3)], [None]) == [(2, 5, 7, 3)]
