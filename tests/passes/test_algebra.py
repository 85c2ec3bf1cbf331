"""Algebraic simplification: each rule fires where exact (or under fast_math) and declines
otherwise; results equal O0 and onnx.reference."""
import numpy as np
import pytest

from passes_util import F, I64, check, const, model, node, ops

X = [("x", F, [2, 3, 4])]
XI = [("x", I64, [2, 3, 4])]


def _bin(op, c, swap=False, inputs=X, dtype=np.float32, pre="Relu", post="Neg"):
    """x -> pre -> op(r, c) -> post -> y."""
    args = ["c", "r"] if swap else ["r", "c"]
    nodes = [node(pre, ["x"], "r"), node(op, args, "t"), node(post, ["t"], "y")]
    return model(nodes, inputs, ["y"], [const("c", c, dtype)])


@pytest.mark.parametrize("op, c, swap", [
    ("Mul", 1.0, False), ("Mul", [[1.0] * 4], True), ("Add", 0.0, False), ("Add", [0.0] * 4, True),
    ("Sub", 0.0, False), ("Div", 1.0, False), ("Div", [1.0, 1.0, 1.0, 1.0], False)])
def test_neutral_elements(op, c, swap):
    assert ops(check(_bin(op, c, swap), level="O1")) == ["Relu", "Neg"]


@pytest.mark.parametrize("op, c", [("Mul", np.ones((5, 2, 3, 4))), ("Add", np.zeros((2, 2, 3, 4)))])
def test_neutral_element_that_broadcasts_is_kept(op, c):
    assert op in ops(check(_bin(op, c), level="O1"))


def test_sub_zero_from_left_is_not_neutral():
    m = model([node("Sub", ["c", "x"], "t"), node("Relu", ["t"], "y")], X, ["y"], [const("c", 0.0)])
    assert ops(check(m, level="O1")) == ["Sub", "Relu"]


def test_affine_chain_cancels_to_nothing():
    """-(0 - r) is r: the whole chain goes."""
    assert ops(check(_bin("Sub", 0.0, swap=True), level="O1")) == ["Relu"]


def test_mul_zero_integer_exact():
    m = _bin("Mul", 0, inputs=XI, dtype=np.int64, pre="Abs")
    assert ops(check(m, level="O1")) == []  # the whole graph is constant


def test_mul_zero_float_needs_fast_math():
    assert "Mul" in ops(check(_bin("Mul", 0.0), level="O1"))
    m = _bin("Mul", 0.0, pre="Sigmoid")
    assert ops(check(m, level="O1", fast_math=True)) == []


def test_div_self():
    m = model([node("Sigmoid", ["x"], "r"), node("Div", ["r", "r"], "t"), node("Neg", ["t"], "y")], X, ["y"])
    assert "Div" in ops(check(m, level="O1"))
    assert ops(check(m, level="O1", fast_math=True)) == []


@pytest.mark.parametrize("pre, fires", [("Tanh", True), ("Relu", False)])
def test_log_exp(pre, fires):
    m = model([node(pre, ["x"], "r"), node("Exp", ["r"], "e"), node("Log", ["e"], "y")], X, ["y"])
    assert ops(check(m, level="O1")) == ([pre] if fires else [pre, "Exp", "Log"])
    assert ops(check(m, level="O1", fast_math=True)) == [pre]


@pytest.mark.parametrize("pre, fires", [("Relu", True), ("Tanh", False)])
def test_exp_log(pre, fires):
    m = model([node(pre, ["x"], "r"), node("Log", ["r"], "l"), node("Exp", ["l"], "y")], X, ["y"])
    feeds = {"x": np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)}
    expected = [pre] if fires else [pre, "Log", "Exp"]
    assert ops(check(m, level="O1", feeds=feeds)) == expected


def test_neg_neg():
    m = model([node("Neg", ["x"], "a"), node("Neg", ["a"], "b"), node("Relu", ["b"], "y")], X, ["y"])
    assert ops(check(m, level="O1")) == ["Relu"]


@pytest.mark.parametrize("pre, fires", [("Abs", True), ("Tanh", False)])
def test_sqrt_times_sqrt(pre, fires):
    m = model([node(pre, ["x"], "r"), node("Sqrt", ["r"], "s"), node("Sqrt", ["r"], "s2"),
               node("Mul", ["s", "s2"], "y")], X, ["y"])
    feeds = {"x": np.random.default_rng(2).standard_normal((2, 3, 4)).astype(np.float32)}
    got = ops(check(m, level="O1", feeds=feeds))
    assert got == ([pre] if fires else [pre, "Sqrt", "Mul"])


def test_div_by_constant_becomes_mul_by_reciprocal():
    m = _bin("Div", [3.0, 0.5, -7.0, 1e-3], post="Sigmoid")
    compiled = check(m, level="O1")
    assert ops(compiled) == ["Relu", "Mul", "Sigmoid"]
    mul = compiled.graph.nodes[1]
    assert mul.meta["rule"] == "div_const"


def test_div_by_zero_or_subnormal_reciprocal_declined():
    for c in ([0.0, 1.0, 1.0, 1.0], [3e38, 1.0, 1.0, 1.0]):
        compiled = check(_bin("Div", c, post="Sigmoid"), level="O1", atol=0)
        assert "Div" in ops(compiled)


def test_integer_div_is_not_rewritten():
    m = _bin("Div", 3, inputs=XI, dtype=np.int64, pre="Abs")
    assert "Div" in ops(check(m, level="O1"))


def test_affine_chain_merges_to_mul_add():
    c = lambda n, v: const(n, v)
    nodes = [node("Relu", ["x"], "r"), node("Mul", ["r", "a"], "t1"), node("Add", ["t1", "b"], "t2"),
             node("Sub", ["t2", "d"], "t3"), node("Div", ["t3", "e"], "t4"), node("Sub", ["f", "t4"], "t5"),
             node("Neg", ["t5"], "y")]
    m = model(nodes, X, ["y"], [c("a", np.linspace(1, 2, 4)), c("b", [[0.5], [1.5], [2.5]]), c("d", 0.25),
                                c("e", 4.0), c("f", np.ones(4))])
    compiled = check(m, level="O1")
    assert ops(compiled) == ["Relu", "Mul", "Add"]
    assert all(n.meta.get("rule") == "affine_chain" for n in compiled.graph.nodes[1:])


def test_affine_chain_integer_exact():
    nodes = [node("Abs", ["x"], "r"), node("Mul", ["r", "a"], "t1"), node("Add", ["t1", "b"], "t2"),
             node("Mul", ["t2", "a"], "y")]
    m = model(nodes, XI, ["y"], [const("a", 3, np.int64), const("b", [1, 2, 3, 4], np.int64)])
    assert ops(check(m, level="O1", rtol=0, atol=0)) == ["Abs", "Mul", "Add"]


def test_affine_chain_link_with_two_users_is_not_merged():
    nodes = [node("Relu", ["x"], "r"), node("Mul", ["r", "a"], "t1"), node("Mul", ["t1", "a"], "t2"),
             node("Add", ["t1", "t2"], "y")]
    m = model(nodes, X, ["y"], [const("a", 3.0)])
    assert ops(check(m, level="O1")).count("Mul") == 2


def test_rules_record_their_name_and_can_be_disabled():
    m = _bin("Mul", 1.0, post="Sigmoid")
    assert ops(check(m, level="O1", disabled_passes=("mul_one",))) == ["Relu", "Mul", "Sigmoid"]
    assert ops(check(m, level="O1", disabled_passes=("algebraic_simplify",))) == ["Relu", "Mul", "Sigmoid"]
