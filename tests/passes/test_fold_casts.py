"""Pass "fold_casts" (passes/fold_casts.py): a Cast to float32 after a bfloat16 product becomes
the product's float32 output. Graph in / graph out through the public API at bf16, the
declines, and the numbers: against onnxruntime's float32 (no worse than the unfolded model),
and the portable kernels against the oneDNN ones (the same products, unrounded)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from oracle import ort_run
from passes_util import const, model

import fusegraph as fg
from fusegraph.ir import DType

F = TensorProto.FLOAT
BF16 = fg.Config(precision="bf16")
UNFOLDED = fg.Config(precision="bf16", disabled_passes=("fold_casts",))


def _rng(seed=0):
    return np.random.default_rng(seed)


def _linear_then_layernorm(reshape: bool = False, second_reader: bool = False, relu: bool = False):
    """x[1, 16, 32] @ W + b [-> Relu] (a bf16 Linear / LinearAct: not the logits) -> [Reshape] ->
    LayerNorm (fp32 statistics) -> MatMul (the logits) -> y."""
    r = _rng()
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["h"])]
    if relu:
        nodes.append(helper.make_node("Relu", ["h"], ["hr0"]))
        nodes.append(helper.make_node("Identity", ["hr0"], ["h2"]))
    last = "h2" if relu else "h"
    if reshape:
        nodes.append(helper.make_node("Reshape", [last, "shape"], ["hr"]))
        last = "hr"
    nodes += [helper.make_node("LayerNormalization", [last, "g", "beta"], ["n"], axis=-1),
              helper.make_node("MatMul", ["n", "w2"], ["y0" if second_reader else "y"])]
    if second_reader:                                   # a bf16 reader of the product besides the Cast
        nodes += [helper.make_node("Relu", ["h"], ["z"]), helper.make_node("MatMul", ["z", "w2"], ["y1"]),
                  helper.make_node("Add", ["y0", "y1"], ["y"])]
    outputs = ["y"]
    inits = [const("w", r.standard_normal((32, 64)) * 0.2), const("b", r.standard_normal(64) * 0.1),
             const("g", 1 + 0.1 * r.standard_normal(64)), const("beta", 0.1 * r.standard_normal(64)),
             const("w2", r.standard_normal((64, 8)) * 0.2), const("shape", [1, 16, 64], np.int64)]
    return model(nodes, [("x", F, [1, 16, 32])], outputs, inits)


def _conv_then_lrn(residual: bool = False):
    """x -> Conv (bf16) [+ x] -> Relu -> LRN (fp32) -> Conv (the logits) -> y."""
    r = _rng(1)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1])]
    src = "c"
    if residual:
        nodes.append(helper.make_node("Add", ["c", "x"], ["cz"]))
        src = "cz"
    nodes += [helper.make_node("Relu", [src], ["a"]), helper.make_node("LRN", ["a"], ["l"], size=3),
              helper.make_node("Conv", ["l", "w2"], ["y"])]
    inits = [const("w", r.standard_normal((8, 8, 3, 3)) * 0.2), const("w2", r.standard_normal((4, 8, 1, 1)) * 0.3)]
    return model(nodes, [("x", F, [1, 8, 12, 12])], ["y"], inits)


def _casts(m) -> int:
    return sum(1 for n in m.graph.nodes if n.op_type == "Cast")


def _folded(m) -> list[str]:
    return [n.op_type for n in m.graph.nodes if n.attrs.get("out_dtype") == int(DType.FLOAT)]


def _rel(got, want) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


@pytest.mark.parametrize("build, op", [(lambda: _linear_then_layernorm(), "Linear"),
                                       (lambda: _linear_then_layernorm(relu=True), "LinearAct"),
                                       (lambda: _linear_then_layernorm(reshape=True), "Linear"),
                                       (lambda: _conv_then_lrn(), "FusedConv")],
                         ids=["linear", "linear-relu", "linear-reshape", "conv"])
def test_the_cast_after_a_product_folds_into_it(build, op):
    onnx_model = build()
    folded, unfolded = fg.compile(onnx_model, BF16), fg.compile(onnx_model, UNFOLDED)
    assert _folded(folded) == [op] and _folded(unfolded) == []
    assert _casts(folded) == _casts(unfolded) - 1
    assert folded.report.precision["casts_folded"] == 1
    product = next(n for n in folded.graph.nodes if n.op_type == op)
    assert product.inputs[0].dtype == DType.BFLOAT16 and product.outputs[0].dtype == DType.FLOAT
    x = {"x": _rng(2).standard_normal(tuple(folded.inputs[0].shape)).astype(np.float32)}
    want = ort_run(onnx_model, x)["y"]
    got, before = folded.run(x)["y"], unfolded.run(x)["y"]
    assert _rel(got, want) < 1e-2
    assert _rel(got, want) <= _rel(before, want) * 1.1 + 1e-6    # one rounding fewer
    portable = fg.compile(onnx_model, BF16.replace(cpu_kernels="portable")).run(x)["y"]
    np.testing.assert_allclose(portable, got, rtol=2e-3, atol=2e-3 * float(np.abs(got).max()))


@pytest.mark.parametrize("build, why", [
    (lambda: _linear_then_layernorm(second_reader=True), "other readers"),
    (lambda: _conv_then_lrn(residual=True), "residual")], ids=["two-readers", "residual"])
def test_declines(build, why):
    m = fg.compile(build(), BF16)
    assert _folded(m) == []
    stats = next(p.stats for p in m.report.passes if p.name == "fold_casts")
    assert stats["folded"] == 0 and any(why in k for k in stats)


def test_not_at_fp32():
    m = fg.compile(_linear_then_layernorm())
    assert "fold_casts" not in [p.name for p in m.report.passes] and _folded(m) == []
