"""Expand followed by a reduction becomes a scaled reduction; one-input Sum becomes Identity."""
import numpy as np
import pytest

from passes_util import F, I64, check, const, model, node, ops


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("axes", [[0, 2], [-3, 1, 2], None])
def test_expand_reduce(op, keepdims, axes):
    nodes = [node("Expand", ["x", "s"], "e")]
    inits = [const("s", [4, 3, 5], np.int64)]
    if axes is not None:
        inits.append(const("axes", axes, np.int64))
    nodes.append(node(op, ["e", "axes"] if axes is not None else ["e"], "r", keepdims=keepdims))
    nodes.append(node("Neg", ["r"], "y"))
    compiled = check(model(nodes, [("x", F, [3, 1])], ["y"], inits))
    assert ops(compiled)[0] == "ScaledReduce"
    sr = compiled.graph.nodes[0]
    assert sr.attrs["scale"] == (20.0 if op == "ReduceSum" else 1.0)  # broadcast axes 0 (x4) and 2 (x5)


def test_expand_reduce_opset13_attribute_axes_and_integers():
    nodes = [node("Expand", ["x", "s"], "e"), node("ReduceMax", ["e"], "m", axes=[0], keepdims=0),
             node("ReduceSum", ["e", "ax"], "t", keepdims=0), node("Add", ["m", "t"], "y")]
    m = model(nodes, [("x", I64, [1, 3])], ["y"], [const("s", [6, 3], np.int64), const("ax", [0], np.int64)],
              opset=13)
    compiled = check(m, rtol=0, atol=0)
    assert ops(compiled) == ["ScaledReduce", "ScaledReduce", "Add"]


def test_expanded_axis_not_reduced_is_declined():
    nodes = [node("Expand", ["x", "s"], "e"), node("ReduceSum", ["e", "axes"], "y", keepdims=1)]
    m = model(nodes, [("x", F, [3, 1])], ["y"], [const("s", [3, 5], np.int64), const("axes", [0], np.int64)])
    compiled = check(m)
    assert ops(compiled) == ["Expand", "ReduceSum"]
    assert any(f.rule == "expand_reduce" and "not reduced" in f.reason for f in compiled.report.fusions)


@pytest.mark.parametrize("op", ["Sum", "Mean", "Max", "Min"])
def test_single_input_variadic_becomes_identity_then_nothing(op):
    m = model([node("Relu", ["x"], "r"), node(op, ["r"], "t"), node("Neg", ["t"], "y")],
              [("x", F, [2, 3])], ["y"])
    compiled = check(m, disabled_passes=("fusion",))   # replacement alone (fusion would chain them)
    assert ops(compiled) == ["Relu", "Neg"]
    assert ops(check(m, level="O1")) == ["Relu", op, "Neg"]
