"""Transposes and Reshapes around a matmul are absorbed (fusegraph::BatchMatMul, plain MatMul)."""
import numpy as np
import pytest

from passes_util import F, check, const, model, node, ops

RNG = np.random.default_rng(0)


@pytest.mark.parametrize("which", ["a", "b", "both"])
def test_transposed_operands(which):
    ta, tb = which in ("a", "both"), which in ("b", "both")
    nodes, ins = [], []
    for name, t in (("a", ta), ("b", tb)):
        if t:
            nodes.append(node("Transpose", [name], name + "t", perm=[0, 1, 3, 2]))
        ins.append(name + "t" if t else name)
    nodes += [node("MatMul", ins, "mm"), node("Relu", ["mm"], "y")]
    a_shape = [2, 3, 5, 4] if ta else [2, 3, 4, 5]
    b_shape = [1, 3, 6, 5] if tb else [1, 3, 5, 6]
    compiled = check(model(nodes, [("a", F, a_shape), ("b", F, b_shape)], ["y"]))
    assert ops(compiled) == ["BatchMatMul", "Relu"]
    attrs = compiled.graph.nodes[0].attrs
    assert (attrs["trans_a"], attrs["trans_b"]) == (int(ta), int(tb))


def test_transpose_of_matmul_output():
    m = model([node("MatMul", ["a", "b"], "mm"), node("Transpose", ["mm"], "t", perm=[0, 2, 1]),
               node("Relu", ["t"], "y")], [("a", F, [2, 3, 4]), ("b", F, [4, 5])], ["y"])
    compiled = check(m)
    assert ops(compiled) == ["BatchMatMul", "Relu"]
    n = compiled.graph.nodes[0]
    assert [v.name for v in n.inputs] == ["b", "a"] and n.attrs == {"trans_a": 1, "trans_b": 1}


def test_other_permutation_declined():
    m = model([node("Transpose", ["a"], "at", perm=[1, 0, 2]), node("MatMul", ["at", "b"], "y")],
              [("a", F, [3, 2, 4]), ("b", F, [4, 5])], ["y"])
    assert ops(check(m)) == ["Transpose", "MatMul"]


def test_rank_one_operand_declined():
    m = model([node("Transpose", ["a"], "at", perm=[1, 0]), node("MatMul", ["v", "at"], "y")],
              [("a", F, [5, 4]), ("v", F, [4])], ["y"])
    assert ops(check(m)) == ["Transpose", "MatMul"]


@pytest.mark.parametrize("x_shape", [[2, 3, 4], [6, 4]])
def test_reshape_around_matmul(x_shape):
    nodes = [node("Reshape", ["x", "s1"], "flat"), node("MatMul", ["flat", "w"], "mm"),
             node("Reshape", ["mm", "s2"], "t"), node("Relu", ["t"], "y")]
    inits = [const("w", RNG.normal(0, 1, (4, 5))), const("s1", [-1, 4], np.int64),
             const("s2", x_shape[:-1] + [5], np.int64)]
    compiled = check(model(nodes, [("x", F, x_shape)], ["y"], inits), disabled_passes=("fusion",))
    assert ops(compiled) == ["MatMul", "Relu"] and compiled.graph.nodes[0].inputs[0].name == "x"


def test_reshape_gemm_reshape_becomes_one_linear():
    """GPT-2's Conv1D export: Reshape -> Gemm(+bias) -> Reshape."""
    nodes = [node("Reshape", ["x", "s1"], "flat"), node("Gemm", ["flat", "w", "b"], "g"),
             node("Reshape", ["g", "s2"], "y")]
    inits = [const("w", RNG.normal(0, 1, (4, 6))), const("b", RNG.normal(0, 1, 6)),
             const("s1", [-1, 4], np.int64), const("s2", [2, 3, 6], np.int64)]
    compiled = check(model(nodes, [("x", F, [2, 3, 4])], ["y"], inits))
    assert ops(compiled) == ["Linear"]


def test_reshape_that_reorders_is_declined():
    nodes = [node("Reshape", ["x", "s1"], "flat"), node("MatMul", ["flat", "w"], "mm"),
             node("Reshape", ["mm", "s2"], "y")]
    inits = [const("w", RNG.normal(0, 1, (4, 5))), const("s1", [-1, 4], np.int64),
             const("s2", [3, 2, 5], np.int64)]
    assert ops(check(model(nodes, [("x", F, [2, 3, 4])], ["y"], inits))) == ["Reshape", "MatMul", "Reshape"]
