"""Consecutive Reshapes, Transposes and Casts collapse where exact."""
import numpy as np
import pytest
from onnx import TensorProto as TP

from fusegraph.ir import DType
from fusegraph.passes.collapse import widens_exactly
from passes_util import F, check, const, model, node, ops

X = [("x", F, [2, 3, 4])]


def _chain(nodes, inits=(), inputs=X):
    return model([node("Relu", ["x"], "r")] + nodes + [node("Sigmoid", ["t"], "y")], inputs, ["y"], inits)


def test_reshape_reshape():
    m = _chain([node("Reshape", ["r", "s1"], "a"), node("Reshape", ["a", "s2"], "t")],
               [const("s1", [6, 4], np.int64), const("s2", [4, -1], np.int64)])
    compiled = check(m, level="O1")
    assert ops(compiled) == ["Relu", "Reshape", "Sigmoid"]
    assert compiled.graph.nodes[1].inputs[0].producer.op_type == "Relu"


def test_unsqueeze_then_reshape_with_zero_uses_static_output_shape():
    m = _chain([node("Unsqueeze", ["r", "ax"], "a"), node("Reshape", ["a", "s2"], "t")],
               [const("ax", [0], np.int64), const("s2", [0, 6, 4], np.int64)])
    assert ops(check(m, level="O1")) == ["Relu", "Reshape", "Sigmoid"]


def test_reshape_with_zero_on_symbolic_shape_declined():
    m = _chain([node("Reshape", ["r", "s1"], "a"), node("Reshape", ["a", "s2"], "t")],
               [const("s1", [0, 12], np.int64), const("s2", [0, 3, 4], np.int64)],
               inputs=[("x", F, ["N", 3, 4])])
    assert ops(check(m, level="O1")) == ["Relu", "Reshape", "Reshape", "Sigmoid"]


def test_transpose_pair_cancels():
    m = _chain([node("Transpose", ["r"], "a", perm=[1, 2, 0]), node("Transpose", ["a"], "t", perm=[2, 0, 1])])
    assert ops(check(m, level="O1")) == ["Relu", "Sigmoid"]


def test_transpose_pair_composes():
    m = _chain([node("Transpose", ["r"], "a", perm=[1, 2, 0]), node("Transpose", ["a"], "t", perm=[1, 0, 2])])
    compiled = check(m, level="O1")
    assert ops(compiled) == ["Relu", "Transpose", "Sigmoid"]
    assert compiled.graph.nodes[1].attrs["perm"] == [2, 1, 0]


def test_transpose_with_other_user_keeps_inner():
    m = model([node("Relu", ["x"], "r"), node("Transpose", ["r"], "a", perm=[1, 0, 2]),
               node("Transpose", ["a"], "b", perm=[1, 0, 2]), node("Sigmoid", ["a"], "c"),
               node("Add", ["b", "r"], "y")], X, ["y", "c"])
    assert ops(check(m, level="O1")) == ["Relu", "Transpose", "Sigmoid", "Add"]


@pytest.mark.parametrize("mid, to, expected, first_reads", [
    (TP.DOUBLE, TP.FLOAT, [], None),                 # f32 -> f64 -> f32: exact round trip
    (TP.DOUBLE, TP.FLOAT16, ["Cast", "Cast"], "r"),  # widen then narrow: f32 -> f16 directly
    (TP.FLOAT16, TP.FLOAT, ["Cast", "Cast"], "r"),   # narrowing first: kept (last cast is a no-op)
    (TP.INT32, TP.FLOAT, ["Cast", "Cast"], "r"),     # float -> int truncates: kept
])
def test_cast_cast(mid, to, expected, first_reads):
    """Relu -> Cast(mid) -> Cast(to) -> Cast(f32)."""
    m = model([node("Relu", ["x"], "r"), node("Cast", ["r"], "a", to=mid), node("Cast", ["a"], "t", to=to),
               node("Cast", ["t"], "y", to=TP.FLOAT)], X, ["y"])
    compiled = check(m, level="O1", rtol=1e-3, atol=1e-3)
    assert ops(compiled)[1:] == expected
    if first_reads:
        assert compiled.graph.nodes[1].inputs[0].name == first_reads


def test_cast_cast_integer_widening():
    m = model([node("Cast", ["x"], "a", to=TP.INT64), node("Cast", ["a"], "y", to=TP.DOUBLE)],
              [("x", TP.INT8, [5])], ["y"])
    compiled = check(m, level="O1", rtol=0, atol=0)
    assert ops(compiled) == ["Cast"] and compiled.graph.nodes[0].inputs[0].name == "x"


def test_widens_exactly_table():
    D = DType
    assert widens_exactly(D.FLOAT16, D.FLOAT) and widens_exactly(D.FLOAT, D.DOUBLE)
    assert not widens_exactly(D.FLOAT16, D.BFLOAT16) and not widens_exactly(D.DOUBLE, D.FLOAT)
    assert widens_exactly(D.INT8, D.INT16) and widens_exactly(D.UINT8, D.INT16)
    assert widens_exactly(D.UINT8, D.FLOAT16)
    assert not widens_exactly(D.INT8, D.UINT16) and not widens_exactly(D.UINT8, D.INT8)
    assert widens_exactly(D.INT16, D.FLOAT) and not widens_exactly(D.INT32, D.FLOAT)
    assert widens_exactly(D.INT32, D.DOUBLE) and not widens_exactly(D.INT64, D.DOUBLE)
    assert widens_exactly(D.BOOL, D.UINT8) and not widens_exactly(D.FLOAT, D.INT64)
