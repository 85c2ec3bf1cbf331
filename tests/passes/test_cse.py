"""Common subexpression elimination, constants included."""
import numpy as np

from passes_util import F, check, const, model, node, ops

X = [("x", F, [2, 3]), ("z", F, [2, 3])]


def test_duplicate_nodes_merged():
    m = model([node("Add", ["x", "z"], "a"), node("Add", ["x", "z"], "b"), node("Mul", ["a", "b"], "y")],
              X, ["y"])
    assert ops(check(m, level="O1")) == ["Add", "Mul"]


def test_equal_constants_make_nodes_equal():
    m = model([node("Mul", ["x", "c1"], "a"), node("Mul", ["x", "c2"], "b"), node("Sub", ["a", "b"], "d"),
               node("Sigmoid", ["d"], "y")], X, ["y"], [const("c1", [1.5, 2, 3]), const("c2", [1.5, 2, 3])])
    compiled = check(m, level="O1")
    assert ops(compiled) == ["Mul", "Sub", "Sigmoid"]


def test_different_attributes_not_merged():
    m = model([node("Softmax", ["x"], "a", axis=0), node("Softmax", ["x"], "b", axis=1),
               node("Add", ["a", "b"], "y")], X, ["y"])
    assert ops(check(m, level="O1")) == ["Softmax", "Softmax", "Add"]


def test_impure_not_merged():
    m = model([node("RandomUniformLike", ["x"], "a", seed=1.0), node("RandomUniformLike", ["x"], "b", seed=1.0),
               node("Add", ["a", "b"], "y")], X, ["y"])
    import fusegraph as fg
    assert ops(fg.compile(m, fg.Config(verify_each=True))).count("RandomUniformLike") == 2


def test_two_graph_outputs_not_aliased():
    m = model([node("Relu", ["x"], "a"), node("Relu", ["x"], "b")], X, ["a", "b"])
    compiled = check(m, level="O1")
    assert ops(compiled) == ["Relu", "Relu"]
    out = compiled.run({"x": np.ones((2, 3), np.float32), "z": np.ones((2, 3), np.float32)})
    out["a"][0, 0] = 5
    assert out["b"][0, 0] == 1


def test_chain_merges_transitively():
    m = model([node("Exp", ["x"], "a1"), node("Exp", ["x"], "a2"), node("Neg", ["a1"], "b1"),
               node("Neg", ["a2"], "b2"), node("Add", ["b1", "b2"], "y")], X, ["y"])
    assert ops(check(m, level="O1")) == ["Exp", "Neg", "Add"]
