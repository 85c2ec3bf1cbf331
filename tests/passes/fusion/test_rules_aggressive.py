"""The rules of ``Config(aggressive_fusion=True)`` (``passes/fusion/rules_aggressive.py``), graph in
/ graph out and against onnxruntime (ORT_DISABLE_ALL) and the unoptimised graph at rtol 1e-4;
each candidate they decline says why, and without the knob none of them runs."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import fusegraph as fg
from passes_util import F, check, const, feeds_for, model, node

AGGRESSIVE = ("recompute_into_consumers", "pack_qkv_padded", "sibling_products")


def rnd(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def records(compiled, rule, applied=None):
    return [f for f in compiled.report.fusions if f.rule == rule and (applied is None or f.applied == applied)]


def both(m, oracle="ort", feeds=None):
    """(default compile, aggressive compile), the aggressive one checked against O0 and the oracle."""
    default = fg.compile(m, fg.Config())
    aggressive = check(m, oracle=oracle, feeds=feeds, aggressive_fusion=True)
    assert not any(f.rule in AGGRESSIVE for f in default.report.fusions), "a rule ran without the knob"
    assert "aggressive_fusion" not in {p.name for p in default.report.passes}
    return default, aggressive


# ------------------------------------------------------------------ recompute_into_consumers


def residual_model(tail: str = "elementwise"):
    """``s = x + z`` read by a norm's square, its scale and a third consumer (``tail``: an
    elementwise Tanh, a MatMul, or a chain that reads ``s`` in its second step)."""
    nodes = [node("Add", ["x", "z"], "s"), node("Pow", ["s", "two"], "sq"),
             node("ReduceMean", ["sq"], "ms", axes=[-1], keepdims=1), node("Mul", ["s", "ms"], "y1")]
    inits = [const("two", 2.0)]
    if tail == "elementwise":
        nodes.append(node("Tanh", ["s"], "y2"))
    elif tail == "matmul":
        nodes.append(node("MatMul", ["s", "w"], "y2"))
        inits.append(const("w", rnd(16, 16, seed=3, scale=0.25)))
    else:                                   # Sigmoid(x) * s: s in the chain's second step
        nodes += [node("Sigmoid", ["x"], "g"), node("Mul", ["g", "s"], "y2")]
    return model(nodes, [("x", F, [2, 8, 16]), ("z", F, [2, 8, 16])], ["y1", "y2"], inits, opset=17)


def test_a_residual_sum_is_recomputed_in_each_consumer():
    default, aggressive = both(residual_model())
    assert "Add" in [n.op_type for n in default.graph.nodes]
    assert "Add" not in [n.op_type for n in aggressive.graph.nodes]
    chains = [n for n in aggressive.graph.nodes if n.op_type == "ElementwiseChain"]
    assert len(chains) == 3 and all(n.attrs["steps"][0] == "Add i0 i1" for n in chains)
    assert aggressive.report.kernel_count == default.report.kernel_count - 1
    (rec,) = records(aggressive, "recompute_into_consumers", True)
    assert rec.nodes == ["s"] or rec.nodes[-1].endswith("s"), rec.nodes


@pytest.mark.parametrize("tail,reason", [("matmul", "is not elementwise"), ("late", "past its first step")])
def test_recompute_declines_when_the_result_stays_needed(tail, reason):
    default, aggressive = both(residual_model(tail))
    declined = records(aggressive, "recompute_into_consumers", False)
    assert any(reason in f.reason for f in declined), [f.reason for f in declined]
    assert aggressive.report.kernel_count == default.report.kernel_count


def test_a_dear_producer_is_not_recomputed():
    """A three-input sum (two steps over three full-size tensors) stays one kernel."""
    nodes = [node("Add", ["x", "z"], "s0"), node("Add", ["s0", "w"], "s"), node("Tanh", ["s"], "y1"),
             node("Sigmoid", ["s"], "y2")]
    m = model(nodes, [(n, F, [4, 16]) for n in ("x", "z", "w")], ["y1", "y2"], opset=17)
    _, aggressive = both(m)
    assert any("too dear" in f.reason for f in records(aggressive, "recompute_into_consumers", False))


# ------------------------------------------------------------------ pack_qkv_padded


def attention_onnx(path, bias_k: bool, scale_q: bool):
    """A self-attention block as torch exports it (whisper's: k without bias, q scaled after
    its projection), hidden 32, 4 heads, 10 positions."""
    import torch

    torch.manual_seed(0)

    class Attention(torch.nn.Module):
        def __init__(self, d=32, h=4):
            super().__init__()
            self.h, self.dh = h, d // h
            self.q, self.v, self.o = torch.nn.Linear(d, d), torch.nn.Linear(d, d), torch.nn.Linear(d, d)
            self.k = torch.nn.Linear(d, d, bias=bias_k)

        def forward(self, x):
            b, s, d = x.shape
            q = self.q(x) * (self.dh ** -0.5) if scale_q else self.q(x)
            k, v = self.k(x), self.v(x)
            q, k, v = (t.view(b, s, self.h, self.dh).transpose(1, 2) for t in (q, k, v))
            a = torch.softmax(q @ k.transpose(-1, -2) * (1.0 if scale_q else self.dh ** -0.5), dim=-1) @ v
            return self.o(a.transpose(1, 2).reshape(b, s, d))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Attention().eval(), (torch.randn(1, 10, 32),), str(path), opset_version=17, dynamo=False,
                          input_names=["x"], output_names=["y"])
    import onnx
    return onnx.load(path)


@pytest.mark.parametrize("bias_k,scale_q", [(False, True), (False, False)])
def test_qkv_packed_despite_missing_biases_and_scales(tmp_path, bias_k, scale_q):
    m = attention_onnx(tmp_path / "a.onnx", bias_k, scale_q)
    default, aggressive = both(m, feeds={"x": rnd(1, 10, 32, seed=1)})
    assert any(f.rule == "attention_pack_qkv" and not f.applied for f in default.report.fusions)
    (sdpa,) = [n for n in aggressive.graph.nodes if n.op_type == "ScaledDotProductAttention"]
    assert sdpa.attrs["qkv_split"] == [32, 32, 32] and sdpa.inputs[1] is None
    assert records(aggressive, "pack_qkv_padded", True)
    # three products become one (the q scale folds into its product either way: ``layer_scale``)
    assert aggressive.report.kernel_count <= default.report.kernel_count - 2
    assert not any(n.op_type == "Mul" for n in default.graph.nodes)


def test_a_scaled_q_with_every_bias_packs_without_the_knob(tmp_path):
    """q's scale after its projection folds into its weights (``layer_scale``): with every bias
    there, the default pipeline packs q, k, v itself."""
    default, aggressive = both(attention_onnx(tmp_path / "a.onnx", True, True), feeds={"x": rnd(1, 10, 32, seed=1)})
    assert records(default, "attention_pack_qkv", True)
    assert aggressive.report.kernel_count == default.report.kernel_count


# ------------------------------------------------------------------ sibling_products


def siblings_model(n: int, opset: int = 17):
    """``n`` products of one input (biases on some), each with its own Relu and consumer."""
    nodes, inits, outs = [], [], []
    for i in range(n):
        nodes.append(node("MatMul", ["x", f"w{i}"], f"m{i}"))
        inits.append(const(f"w{i}", rnd(16, 8 + 4 * i, seed=i, scale=0.35)))
        src = f"m{i}"
        if i % 2 == 0:
            nodes.append(node("Add", [src, f"b{i}"], f"a{i}"))
            inits.append(const(f"b{i}", rnd(8 + 4 * i, seed=10 + i, scale=0.1)))
            src = f"a{i}"
        nodes += [node("Relu", [src], f"r{i}"), node("ReduceMax", [f"r{i}"], f"y{i}", axes=[-1], keepdims=0)]
        outs.append(f"y{i}")
    return model(nodes, [("x", F, [3, 5, 16])], outs, inits, opset=opset)


@pytest.mark.parametrize("opset", [12, 17])     # Split's sizes: an attribute before opset 13, an input after
def test_three_siblings_become_one_product_and_a_split(opset):
    m = siblings_model(3, opset)
    default, aggressive = both(m)
    ops = [n.op_type for n in aggressive.graph.nodes]
    assert ops.count("LinearAct") == 1 and ops.count("Split") == 1, ops
    (packed,) = [n for n in aggressive.graph.nodes if n.op_type == "LinearAct"]
    assert packed.attrs["activation"] == "relu" and packed.outputs[0].shape[-1] == 8 + 12 + 16
    assert aggressive.report.kernel_count == default.report.kernel_count - 1


def test_two_siblings_are_declined():
    default, aggressive = both(siblings_model(2))
    assert any("cost as many kernels" in f.reason for f in records(aggressive, "sibling_products", False))
    assert aggressive.report.kernel_count == default.report.kernel_count


def test_disabling_a_rule_by_name():
    m = siblings_model(3)
    compiled = fg.compile(m, fg.Config(aggressive_fusion=True, disabled_passes=("sibling_products",)))
    assert [n.op_type for n in compiled.graph.nodes].count("LinearAct") == 3
    off = fg.compile(m, fg.Config(aggressive_fusion=True, disabled_passes=("aggressive_fusion",)))
    assert "aggressive_fusion" not in {p.name for p in off.report.passes}
    feeds = feeds_for(m)
    for k, v in compiled.run(feeds).items():
        np.testing.assert_allclose(v, off.run(feeds)[k], rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------ norm_scale_into_products


def norm_model(kind: str, readers: str = "products"):
    """A layer norm (``kind`` "layer": mean / variance form with gamma and beta) or an RMS norm
    (``"rms"``: ``x * (1 / sqrt(mean(x^2) + eps)) * gamma``) read by two products with a Relu
    (``readers`` "mixed": one product and a Tanh)."""
    nodes, inits = [], [const("eps", 1e-5), const("gamma", rnd(16, seed=5) + 1.0)]
    if kind == "layer":
        nodes += [node("ReduceMean", ["x"], "mu", axes=[-1], keepdims=1), node("Sub", ["x", "mu"], "d"),
                  node("Pow", ["d", "two"], "d2"), node("ReduceMean", ["d2"], "var", axes=[-1], keepdims=1),
                  node("Add", ["var", "eps"], "ve"), node("Sqrt", ["ve"], "sd"), node("Div", ["d", "sd"], "nx"),
                  node("Mul", ["nx", "gamma"], "g"), node("Add", ["g", "beta"], "n")]
        inits += [const("two", 2.0), const("beta", rnd(16, seed=6, scale=0.5))]
    else:
        nodes += [node("Pow", ["x", "two"], "x2"), node("ReduceMean", ["x2"], "ms", axes=[-1], keepdims=1),
                  node("Add", ["ms", "eps"], "me"), node("Sqrt", ["me"], "rms"), node("Reciprocal", ["rms"], "r"),
                  node("Mul", ["x", "r"], "nx"), node("Mul", ["nx", "gamma"], "n")]
        inits.append(const("two", 2.0))
    nodes += [node("MatMul", ["n", "w0"], "m0"), node("Relu", ["m0"], "y0")]
    inits.append(const("w0", rnd(16, 24, seed=7, scale=0.35)))
    if readers == "products":
        nodes += [node("MatMul", ["n", "w1"], "m1"), node("Add", ["m1", "b1"], "a1"), node("Relu", ["a1"], "y1")]
        inits += [const("w1", rnd(16, 8, seed=8, scale=0.35)), const("b1", rnd(8, seed=9, scale=0.1))]
    else:
        nodes.append(node("Tanh", ["n"], "y1"))
    return model(nodes, [("x", F, [2, 6, 16])], ["y0", "y1"], inits, opset=17)


@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_the_norms_affine_moves_into_the_products(kind):
    default, aggressive = both(norm_model(kind))
    assert records(aggressive, "norm_scale_into_products", True)
    (norm,) = [n for n in aggressive.graph.nodes if n.op_type == ("LayerNorm" if kind == "layer" else "RMSNorm")]
    assert len([v for v in norm.inputs if v is not None]) == 1, "the affine left the norm"
    assert aggressive.report.kernel_count == default.report.kernel_count


def test_a_norm_read_by_other_work_keeps_its_affine():
    _, aggressive = both(norm_model("rms", readers="mixed"))
    assert any("is not a product" in f.reason for f in records(aggressive, "norm_scale_into_products", False))
