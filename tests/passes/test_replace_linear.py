"""MatMul + Add and plain Gemm become fusegraph::Linear at O2 (not at O1)."""
import numpy as np
import pytest

from passes_util import F, check, const, model, node, ops

RNG = np.random.default_rng(0)
W = RNG.normal(0, 0.5, (4, 5))


@pytest.mark.parametrize("x_shape, bias_shape, swap", [
    (x, b, s) for x in ([3, 4], [2, 3, 4], [4])
    for b, s in (((5,), False), ((5,), True), ((1, 5), False), ((), False))
    if not (len(x) == 1 and b == (1, 5))])  # [5] + [1, 5] would broadcast the result to [1, 5]
def test_matmul_add_becomes_linear(x_shape, bias_shape, swap):
    args = ["b", "mm"] if swap else ["mm", "b"]
    m = model([node("MatMul", ["x", "w"], "mm"), node("Add", args, "t"), node("Relu", ["t"], "y")],
              [("x", F, x_shape)], ["y"], [const("w", W), const("b", RNG.normal(0, 1, bias_shape))])
    compiled = check(m, disabled_passes=("fusion",))   # replacement alone (fusion would add the Relu)
    assert ops(compiled) == ["Linear", "Relu"]
    lin = compiled.graph.nodes[0]
    assert lin.domain == "fusegraph" and lin.meta["rule"] == "matmul_add_to_linear"
    assert compiled.graph.opset["fusegraph"] == 1
    assert ops(check(m, level="O1")) == ["MatMul", "Add", "Relu"]


def test_runtime_bias_and_weight():
    m = model([node("MatMul", ["x", "w"], "mm"), node("Add", ["mm", "b"], "y")],
              [("x", F, [2, 3, 4]), ("w", F, [4, 5]), ("b", F, [5])], ["y"])
    assert ops(check(m)) == ["Linear"]


@pytest.mark.parametrize("case", ["bias_2d", "weight_3d", "residual", "two_users"])
def test_linear_declined(case):
    inits = [const("w", W)]
    x_shape = [3, 4]
    nodes = [node("MatMul", ["x", "w"], "mm"), node("Add", ["mm", "b"], "y")]
    outputs = ["y"]
    if case == "bias_2d":
        inits.append(const("b", RNG.normal(0, 1, (3, 5))))
    elif case == "weight_3d":
        inits = [const("w", RNG.normal(0, 1, (2, 4, 5))), const("b", RNG.normal(0, 1, 5))]
        x_shape = [2, 3, 4]
    elif case == "residual":
        inits.append(const("r0", RNG.normal(0, 1, (3, 5))))
        nodes = [node("MatMul", ["x", "w"], "mm"), node("Relu", ["mm"], "b"), node("Add", ["mm", "b"], "y")]
    else:
        inits.append(const("b", RNG.normal(0, 1, 5)))
        outputs = ["y", "mm"]
    m = model(nodes, [("x", F, x_shape)], outputs, inits)
    compiled = check(m, disabled_passes=("fusion",))
    assert "Linear" not in ops(compiled)
    declined = [f for f in compiled.report.fusions if not f.applied]
    assert declined and declined[0].rule == "matmul_add_to_linear" and declined[0].reason


@pytest.mark.parametrize("trans_b, c_shape", [(0, (5,)), (1, (5,)), (1, (1, 5)), (0, None)])
def test_gemm_becomes_linear(trans_b, c_shape):
    w = W.T if trans_b else W
    inputs = ["x", "w"] + (["c"] if c_shape else [])
    inits = [const("w", w)] + ([const("c", RNG.normal(0, 1, c_shape))] if c_shape else [])
    m = model([node("Gemm", inputs, "y", transB=trans_b)], [("x", F, [3, 4])], ["y"], inits, opset=13)
    compiled = check(m)
    assert ops(compiled) == ["Linear"] and compiled.graph.nodes[0].attrs["trans_b"] == trans_b


def test_gemm_with_alpha_or_transposed_a_stays():
    m = model([node("Gemm", ["x", "w", "c"], "y", alpha=2.0), node("Gemm", ["xt", "w"], "z", transA=1)],
              [("x", F, [3, 4]), ("xt", F, [4, 3])], ["y", "z"], [const("w", W), const("c", np.ones(5))],
              opset=13)
    assert ops(check(m)) == ["Gemm", "Gemm"]
