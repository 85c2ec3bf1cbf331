"""Pass "fold_casts" (passes/fold_casts.py): a Cast to float32 after a bfloat16 product becomes
the product's float32 output. Graph in / graph out through the public API at bf16, the
declines, and the numbers: against onnxruntime's float32 (no worse than the unfolded model),
and the portable kernels against the oneDNN ones (the same products, unrounded)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper
from oracle import ort_run
from passes_util import const, model

import fusegraph as fg
from cpu_isa import BF16_ARITHMETIC
from fusegraph.ir import DType

F = TensorProto.FLOAT
BF16 = fg.Config(precision="bf16")
UNFOLDED = fg.Config(precision="bf16", disabled_passes=("fold_casts",))


def _rng(seed=0):
    return np.random.default_rng(seed)


def _linear_then_layernorm(reshape: bool = False, second_reader: bool = False, relu: bool = False,
                           transpose: bool = False):
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
    if transpose:           # Swin's window reverse: Reshape -> Transpose -> Reshape
        nodes += [helper.make_node("Reshape", [last, "win"], ["hw"]),
                  helper.make_node("Transpose", ["hw"], ["ht"], perm=[0, 2, 1, 3]),
                  helper.make_node("Reshape", ["ht", "shape"], ["hb"])]
        last = "hb"
    nodes += [helper.make_node("LayerNormalization", [last, "g", "beta"], ["n"], axis=-1),
              helper.make_node("MatMul", ["n", "w2"], ["y0" if second_reader else "y"])]
    if second_reader:                                   # a bf16 reader of the product besides the Cast
        nodes += [helper.make_node("Relu", ["h"], ["z"]), helper.make_node("MatMul", ["z", "w2"], ["y1"]),
                  helper.make_node("Add", ["y0", "y1"], ["y"])]
    outputs = ["y"]
    inits = [const("w", r.standard_normal((32, 64)) * 0.2), const("b", r.standard_normal(64) * 0.1),
             const("g", 1 + 0.1 * r.standard_normal(64)), const("beta", 0.1 * r.standard_normal(64)),
             const("w2", r.standard_normal((64, 8)) * 0.2), const("shape", [1, 16, 64], np.int64),
             const("win", [1, 4, 4, 64], np.int64)]
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
    """Products writing float32 because a Cast folded in (the logits write float32 by policy)."""
    logits = {k["node"] for k in (m.report.precision or {}).get("fp32_logits", [])}
    return [n.op_type for n in m.graph.nodes if n.attrs.get("out_dtype") == int(DType.FLOAT) and n.name not in logits]


def _rel(got, want) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


@pytest.mark.parametrize("build, op", [(lambda: _linear_then_layernorm(), "Linear"),
                                       (lambda: _linear_then_layernorm(relu=True), "LinearAct"),
                                       (lambda: _linear_then_layernorm(reshape=True), "Linear"),
                                       (lambda: _linear_then_layernorm(transpose=True), "Linear"),
                                       (lambda: _conv_then_lrn(), "FusedConv")],
                         ids=["linear", "linear-relu", "linear-reshape", "linear-transpose", "conv"])
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


def _norm_then_product(pre_ln: bool):
    """x [+ r] -> layer norm (fp32 statistics; decomposed as older exporters write it, or
    LayerNormalization after the sum) -> MatMul + bias (a bf16 Linear) -> Relu -> MatMul (the
    logits) [+ the sum: a pre-LN residual stream, the SkipLayerNorm's second output] -> y."""
    r = _rng(4)
    h = helper.make_node
    if pre_ln:
        nodes = [h("Add", ["x", "r"], ["s"]), h("LayerNormalization", ["s", "g", "beta"], ["n"], axis=-1)]
    else:       # the decomposed form: mean, centred, variance, sqrt, divide, scale and shift
        nodes = [h("ReduceMean", ["x", "ax"], ["mu"]), h("Sub", ["x", "mu"], ["c"]),
                 h("Pow", ["c", "two"], ["c2"]), h("ReduceMean", ["c2", "ax"], ["var"]),
                 h("Add", ["var", "eps"], ["ve"]), h("Sqrt", ["ve"], ["sd"]), h("Div", ["c", "sd"], ["z"]),
                 h("Mul", ["z", "g"], ["zg"]), h("Add", ["zg", "beta"], ["n"])]
    nodes += [h("MatMul", ["n", "w"], ["m0"]), h("Add", ["m0", "b"], ["m1"]), h("Relu", ["m1"], ["m2"]),
              h("MatMul", ["m2", "w2"], ["m" if pre_ln else "y"])]
    if pre_ln:
        nodes.append(h("Add", ["m", "s"], ["y"]))
    inits = [const("g", 1 + 0.1 * r.standard_normal(64)), const("beta", 0.1 * r.standard_normal(64)),
             const("w", r.standard_normal((64, 64)) * 0.2), const("b", r.standard_normal(64) * 0.1),
             const("w2", r.standard_normal((64, 64)) * 0.2), const("r", r.standard_normal((1, 16, 64))),
             const("two", np.array(2.0)), const("eps", np.array(1e-5)), const("ax", [-1], np.int64)]
    return model(nodes, [("x", F, [1, 16, 64])], ["y"], inits)


def _bf16_normalised(m, feeds) -> torch.Tensor:
    """The bfloat16 normalised values the model's first product reads (the norm's own output
    when the Cast is folded, else the Cast's), captured with ``run(hook=)``."""
    nodes = {n.name: n for n in m.graph.nodes}
    order = [nodes[name] for name in m.plan.order]
    want = next(i for i, n in enumerate(order) if n.op_type == "LinearAct")
    seen = {}

    def hook(index, phase, outputs):
        if phase == 1 and order[want].inputs[0] in order[index].outputs:
            seen["x"] = outputs[order[index].outputs.index(order[want].inputs[0])].clone()
    m.run(feeds, hook=hook)
    return seen["x"]


@pytest.mark.parametrize("pre_ln", [False, True], ids=["layernorm", "skip-layernorm-with-sum"])
@pytest.mark.parametrize("kernels", ["auto", "portable"])
def test_the_cast_after_a_layer_norm_folds_into_it_bitwise(pre_ln, kernels):
    onnx_model = _norm_then_product(pre_ln)
    folded = fg.compile(onnx_model, BF16.replace(cpu_kernels=kernels))
    unfolded = fg.compile(onnx_model, UNFOLDED.replace(cpu_kernels=kernels))
    norm = next(n for n in folded.graph.nodes if n.op_type in ("LayerNorm", "SkipLayerNorm"))
    assert norm.op_type == ("SkipLayerNorm" if pre_ln else "LayerNorm") and len(norm.outputs) == (2 if pre_ln else 1)
    assert norm.attrs["out_dtype"] == int(DType.BFLOAT16) and norm.outputs[0].dtype == DType.BFLOAT16
    stats = next(p.stats for p in folded.report.passes if p.name == "fold_casts")
    assert stats["folded"] == 2 and _casts(folded) == _casts(unfolded) - 2    # the norm's, the product's
    if pre_ln:
        assert norm.outputs[1].dtype == DType.FLOAT          # the residual stream stays float32
    if kernels == "auto" and BF16_ARITHMETIC:       # a CPU without bfloat16 arithmetic: the op's own norm
        impls = {c.node.op_type: getattr(c.kernel, "impl", "portable") for c in folded._executor.binding.calls}
        assert impls[norm.op_type] != "portable", impls     # oneDNN's norm writes the bfloat16
    x = {"x": _rng(5).standard_normal((1, 16, 64)).astype(np.float32)}
    got, want = _bf16_normalised(folded, x), _bf16_normalised(unfolded, x)
    assert got.dtype == want.dtype == torch.bfloat16 and torch.equal(got, want)     # rounded once, the same way
    assert _rel(folded.run(x)["y"], ort_run(onnx_model, x)["y"]) < 1e-2


def test_a_layer_norm_read_by_another_op_keeps_its_cast():
    """BERT's post-LN form: the normalised output is the next residual too (float32)."""
    r = _rng(6)
    h = helper.make_node
    nodes = [h("Add", ["x", "r"], ["s"]), h("LayerNormalization", ["s", "g", "beta"], ["n"], axis=-1),
             h("MatMul", ["n", "w"], ["m0"]), h("Add", ["m0", "b"], ["m"]), h("Add", ["m", "n"], ["a"]),
             h("LayerNormalization", ["a", "g", "beta"], ["y"], axis=-1)]
    inits = [const("g", 1 + 0.1 * r.standard_normal(32)), const("beta", 0.1 * r.standard_normal(32)),
             const("w", r.standard_normal((32, 32)) * 0.2), const("b", r.standard_normal(32) * 0.1),
             const("r", r.standard_normal((1, 8, 32)))]
    m = fg.compile(model(nodes, [("x", F, [1, 8, 32])], ["y"], inits), BF16)
    first = next(n for n in m.graph.nodes if n.op_type == "SkipLayerNorm")
    assert "out_dtype" not in first.attrs and first.outputs[0].dtype == DType.FLOAT
    stats = next(p.stats for p in m.report.passes if p.name == "fold_casts")
    assert stats["declined: the norm's output has other readers, is a graph output or is locked"] == 1


def _conv_channel_norm_conv():
    """ConvNeXt's "channels_first" norm as exporters write it: a 3x3 convolution and a max pool
    (so that the norm reads the same bf16 values folded or not), Transpose to channels last ->
    LayerNormalization -> Transpose back (a ChannelLayerNorm; the convolutions make the graph
    channels-last), then a 1x1 convolution with relu (bf16) and the logits."""
    r = _rng(8)
    h = helper.make_node
    nodes = [h("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
             h("MaxPool", ["c0"], ["c"], kernel_shape=[2, 2], strides=[2, 2]),
             h("Transpose", ["c"], ["ct"], perm=[0, 2, 3, 1]),
             h("LayerNormalization", ["ct", "g", "beta"], ["nt"], axis=-1, epsilon=1e-6),
             h("Transpose", ["nt"], ["n"], perm=[0, 3, 1, 2]),
             h("Conv", ["n", "w1", "b1"], ["p"]), h("Relu", ["p"], ["pr"]), h("Conv", ["pr", "w2"], ["y"])]
    inits = [const("w0", r.standard_normal((32, 3, 3, 3)) * 0.3), const("b0", r.standard_normal(32) * 0.1),
             const("g", 1 + 0.1 * r.standard_normal(32)), const("beta", 0.1 * r.standard_normal(32)),
             const("w1", r.standard_normal((64, 32, 1, 1)) * 0.25), const("b1", r.standard_normal(64) * 0.1),
             const("w2", r.standard_normal((10, 64, 1, 1)) * 0.2)]
    return model(nodes, [("x", F, [1, 3, 12, 12])], ["y"], inits)


@pytest.mark.parametrize("kernels", ["auto", "portable"])
def test_the_cast_after_a_channel_layer_norm_folds_into_it_bitwise(kernels):
    """The norm before a bf16 convolution writes bfloat16 itself: the convolution reads the very
    bits the unfolded model's Cast made (computed in float32, rounded once)."""
    onnx_model = _conv_channel_norm_conv()
    folded = fg.compile(onnx_model, BF16.replace(cpu_kernels=kernels))
    unfolded = fg.compile(onnx_model, UNFOLDED.replace(cpu_kernels=kernels))
    norm = next(n for n in folded.graph.nodes if n.op_type == "ChannelLayerNorm")
    assert norm.attrs["out_dtype"] == int(DType.BFLOAT16) and norm.outputs[0].dtype == DType.BFLOAT16
    assert _casts(folded) < _casts(unfolded)
    if kernels == "auto" and BF16_ARITHMETIC:
        impls = {c.node.op_type: getattr(c.kernel, "impl", "portable") for c in folded._executor.binding.calls}
        assert impls["ChannelLayerNorm"] != "portable", impls       # oneDNN's norm writes the bfloat16
    x = {"x": _rng(9).standard_normal((1, 3, 12, 12)).astype(np.float32)}

    def normalised(m):
        calls = m._executor.binding.calls
        (conv,) = [c for c in calls if c.node.op_type == "FusedConv" and c.node.attrs.get("activation") == "relu"]
        seen = {}

        def hook(i, phase, outs):
            if phase == 1 and conv.node.inputs[0] in calls[i].node.outputs:
                seen["x"] = outs[calls[i].node.outputs.index(conv.node.inputs[0])].clone()
        m.run(x, hook=hook)
        return seen["x"]
    got, want = normalised(folded), normalised(unfolded)
    assert got.dtype == want.dtype == torch.bfloat16 and torch.equal(got, want)
    assert _rel(folded.run(x)["y"], ort_run(onnx_model, x)["y"]) < 1e-2


def test_an_out_dtype_that_is_no_float_type_is_refused():
    """``out_dtype`` on a norm (an artifact's attribute) must name a float type."""
    from fusegraph.errors import UnsupportedOpError
    from fusegraph.ir import Graph
    from fusegraph.ops import opdef_for
    from fusegraph.ops.registry import NodeContext
    g = Graph("t")
    x = g.add_input("x", DType.FLOAT, (1, 8, 4, 4))
    n = g.add_node("ChannelLayerNorm", [x], domain="fusegraph", name="norm", outputs=["y"],
                   attrs={"epsilon": 1e-6, "out_dtype": int(DType.INT64)})
    with pytest.raises(UnsupportedOpError, match="norm.*out_dtype 7 is not a float type"):
        opdef_for(n).build(NodeContext(n, "cpu"))
