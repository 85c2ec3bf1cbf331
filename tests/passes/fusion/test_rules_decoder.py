"""Decoder fusion rules (passes/fusion/rules_decoder.py) and linear_silu: each form graph-in /
graph-out (the fused op list) and numerically against the unoptimised graph (O0) and
onnxruntime with ORT_DISABLE_ALL at fp32 rtol 1e-4, and the cases each rule must decline, with
the reason recorded in ``report.fusions``."""
import numpy as np
import pytest

from cpu_isa import needs_avx512
from oracle import ort_run
from passes_util import F, check, compile_with, const, model, node, ops

B, S, D = 2, 5, 16
TWO, ONE, EPS = const("two", 2.0), const("one", 1.0), const("eps", 1e-6)


def declined(compiled, rule):
    return [f.reason for f in compiled.report.fusions if f.rule == rule and not f.applied]


def fused(compiled, op):
    return [n for n in compiled.graph.nodes if n.domain == "fusegraph" and n.op_type == op]


def rnd(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def axes(*a):
    return const("axes", list(a), np.int64)


# ------------------------------------------------------------------ RMSNorm

def _rms(square="pow", inverse="div1", gamma="const", mean_axes=(-1,), x="x"):
    """x * 1/sqrt(mean(x^2) + eps) [* gamma], as Llama / T5 exports write it."""
    sq = node("Pow", [x, "two"], "sq") if square == "pow" else node("Mul", [x, x], "sq")
    nodes = [sq, node("ReduceMean", ["sq", "axes"], "ms", keepdims=1), node("Add", ["ms", "eps"], "v"),
             node("Sqrt", ["v"], "r")]
    out = "y" if gamma == "none" else "n"
    if inverse == "div1":
        nodes += [node("Div", ["one", "r"], "inv"), node("Mul", [x, "inv"], out)]
    elif inverse == "reciprocal":
        nodes += [node("Reciprocal", ["r"], "inv"), node("Mul", ["inv", x], out)]
    else:
        nodes.append(node("Div", [x, "r"], out))
    if gamma == "const":
        nodes.append(node("Mul", ["g", "n"], "y"))
    elif gamma == "cast":                            # the exporters' float32 -> float32 upcast
        nodes += [node("Cast", ["n"], "nc", to=F), node("Mul", ["g", "nc"], "y")]
    return nodes, [TWO, ONE, EPS, axes(*mean_axes), const("g", rnd(D, seed=3) + 1.0)]


@pytest.mark.parametrize("square", ["pow", "mul"])
@pytest.mark.parametrize("inverse", ["div1", "reciprocal", "divide"])
@pytest.mark.parametrize("gamma", ["const", "cast", "none"])
def test_rms_norm_forms(square, inverse, gamma):
    nodes, inits = _rms(square, inverse, gamma)
    c = check(model(nodes, [("x", F, [B, S, D])], ["y"], inits), oracle="ort", feeds={"x": rnd(B, S, D, scale=3)})
    assert ops(c) == ["RMSNorm"]
    n = fused(c, "RMSNorm")[0]
    assert (len(n.inputs) == 2) == (gamma != "none") and n.attrs["epsilon"] == pytest.approx(1e-6)


def test_rms_norm_cast_to_half_before_the_scale():
    """A Cast to float16 between the norm and its scale: the norm writes float16 (one rounding,
    as the graph's Cast), the float16 scale product stays."""
    nodes, inits = _rms(gamma="none")
    nodes[-1].output[0] = "n"
    nodes += [node("Cast", ["n"], "h", to=10), node("Mul", ["h", "g16"], "y")]
    inits.append(const("g16", rnd(D, seed=3) + 1.0, np.float16))
    m = model(nodes, [("x", F, [B, S, D])], ["y"], inits)
    c = check(m, oracle="ort", feeds={"x": rnd(B, S, D, scale=3)}, rtol=1e-3, atol=1e-3)
    assert ops(c) == ["RMSNorm", "Mul"]
    assert fused(c, "RMSNorm")[0].attrs["out_dtype"] == 10


@pytest.mark.parametrize("case, reason", [
    ("axis", "the mean square is not over the last axis alone"),
    ("eps", "epsilon is not a non-negative scalar constant"),
])
def test_rms_norm_declines(case, reason):
    nodes, inits = _rms(mean_axes=(1,) if case == "axis" else (-1,))
    inputs = [("x", F, [B, S, D])]
    if case == "eps":
        inits = [t for t in inits if t.name != "eps"]
        inputs.append(("eps", F, [1]))
    feeds = {"x": rnd(B, S, D, scale=3)} | ({"eps": np.full(1, 1e-6, np.float32)} if case == "eps" else {})
    c = check(model(nodes, inputs, ["y"], inits), oracle="ort", feeds=feeds)
    assert "RMSNorm" not in ops(c)
    assert reason in declined(c, "rms_norm")


def test_layer_norm_is_not_taken_for_an_rms_norm():
    """(x - mean) / sqrt(mean((x - mean)^2) + eps) is the RMS norm of x - mean: layer_norm
    (higher priority) takes it whole."""
    nodes = [node("ReduceMean", ["x", "axes"], "mu"), node("Sub", ["x", "mu"], "d")]
    more, inits = _rms(gamma="none", inverse="divide", x="d")
    c = check(model(nodes + more, [("x", F, [B, S, D])], ["y"], inits), oracle="ort",
              feeds={"x": rnd(B, S, D, scale=3) + 2})
    assert ops(c) == ["LayerNorm"]


@pytest.mark.parametrize("residual_out", [False, True])
def test_skip_rms_norm(residual_out):
    nodes, inits = _rms(x="s")
    nodes.insert(0, node("Add", ["a", "b"], "s"))
    outs = ["y", "s"] if residual_out else ["y"]
    if residual_out:       # the residual stream read on: the sum is the node's second output
        nodes.append(node("Add", ["s", "y"], "z"))
        outs = ["z"]
    m = model(nodes, [("a", F, [B, S, D]), ("b", F, [B, S, D])], outs, inits)
    c = check(m, oracle="ort")
    assert ops(c) == (["SkipRMSNorm", "Add"] if residual_out else ["SkipRMSNorm"])
    assert len(fused(c, "SkipRMSNorm")[0].outputs) == (2 if residual_out else 1)


def test_skip_rms_norm_declines_a_broadcast():
    nodes, inits = _rms(x="s")
    nodes.insert(0, node("Add", ["a", "b"], "s"))
    c = check(model(nodes, [("a", F, [B, S, D]), ("b", F, [D])], ["y"], inits), oracle="ort")
    assert ops(c) == ["Add", "RMSNorm"]
    assert declined(c, "skip_rms_norm") == ["the residual Add broadcasts"]


@needs_avx512
def test_rms_norm_is_exact_on_nan_and_inf():
    """Rows with a NaN, an infinity, squares that overflow float32 (the graph's sum is inf: the
    row normalises to 0, NaN where x is infinite), and ordinary rows: as onnxruntime computes
    the graph, on oneDNN's kernel (static shapes) and ATen's (symbolic)."""
    nodes, inits = _rms()
    x = rnd(6, D, scale=3)
    x[0, 3], x[1, 5], x[2, :] = np.nan, np.inf, 3e19
    x[3, 0] = -np.inf
    x[4, :4] = 2e19
    for shape in ([6, D], ["rows", D]):
        m = model(nodes, [("x", F, shape)], ["y"], inits)
        c = compile_with(m)
        got, want = c.run({"x": x})["y"], ort_run(m, {"x": x})["y"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)
        impl = c.report.kernels["implementations"]
        assert (list(impl) == ["jit:uni"]) if shape[0] == 6 else (list(impl) == ["portable"]), impl


# ------------------------------------------------------------------ rotary embeddings

H, L, HD = 4, 6, 8


def _rotary(x="x", d=HD, lo_end=None, hi_start=None):
    """x * cos + cat(-x[..., d/2:], x[..., :d/2]) * sin, as apply_rotary_pos_emb exports."""
    h = d // 2
    return [node("Mul", [x, "cos"], "m1"),
            node("Slice", [x, "c0", "ch" if lo_end is None else "lo_end", "cax"], "x1"),
            node("Slice", [x, "ch" if hi_start is None else "hi_start", "cend", "cax"], "x2"),
            node("Neg", ["x2"], "nx2"), node("Concat", ["nx2", "x1"], "rot", axis=-1),
            node("Mul", ["rot", "sin"], "m2"), node("Add", ["m1", "m2"], "y")], \
        [const("c0", [0], np.int64), const("ch", [h], np.int64), const("cend", [2**62], np.int64),
         const("cax", [-1], np.int64), const("lo_end", [lo_end or h], np.int64),
         const("hi_start", [hi_start or h], np.int64)]


def _tables(shape, d=HD):
    pos = np.arange(shape[-2], dtype=np.float32)[:, None] / (10000 ** (np.arange(d // 2) / (d // 2)))
    ang = np.concatenate([pos, pos], axis=-1).reshape(shape)
    return [const("cos", np.cos(ang)), const("sin", np.sin(ang))]


def test_rotary_embedding():
    nodes, inits = _rotary()
    c = check(model(nodes, [("x", F, [B, H, L, HD])], ["y"], inits + _tables([1, 1, L, HD])), oracle="ort")
    assert ops(c) == ["RotaryEmbedding"]
    assert fused(c, "RotaryEmbedding")[0].attrs.get("heads", 0) == 0


def test_rotary_embedding_takes_the_head_split_in():
    """A projection's head split read only by the rotation: the rotation reads the projection
    ([B, L, H*D], heads H) and the split moves after it."""
    nodes, inits = _rotary(x="t")
    nodes = [node("Reshape", ["p", "shape4"], "r4"), node("Transpose", ["r4"], "t", perm=[0, 2, 1, 3])] + nodes
    inits += _tables([1, 1, L, HD]) + [const("shape4", [B, L, H, HD], np.int64)]
    c = check(model(nodes, [("p", F, [B, L, H * HD])], ["y"], inits), oracle="ort")
    assert ops(c) == ["RotaryEmbedding", "Reshape", "Transpose"]
    assert fused(c, "RotaryEmbedding")[0].attrs["heads"] == H


def test_rotary_embedding_declines_tables_that_enlarge_x():
    nodes, inits = _rotary()
    c = check(model(nodes, [("x", F, [B, H, 1, HD])], ["y"], inits + _tables([1, 1, L, HD])), oracle="ort")
    assert "RotaryEmbedding" not in ops(c)
    assert declined(c, "rotary_embedding") == ["cos / sin do not broadcast into the rotated tensor"]


@pytest.mark.parametrize("bounds", [{"lo_end": 3}, {"hi_start": 5}])
def test_rotary_embedding_needs_the_two_halves(bounds):
    """Slices that are not the two halves of the last axis: not a rotary embedding (nothing
    fused, nothing recorded)."""
    split = bounds.get("lo_end") or bounds.get("hi_start")      # both parts split there: a valid graph
    nodes, inits = _rotary(lo_end=split, hi_start=split)
    c = check(model(nodes, [("x", F, [B, H, L, HD])], ["y"], inits + _tables([1, 1, L, HD])), oracle="ort")
    assert "RotaryEmbedding" not in ops(c) and declined(c, "rotary_embedding") == []


# ------------------------------------------------------------------ grouped-query attention

HQ, HKV = 4, 2


def _repeat(t, out, n=HQ // HKV):
    """repeat_kv: Reshape(Expand(Unsqueeze(t, 2), [B, Hkv, n, L, D]), [B, Hkv*n, L, D])."""
    return [node("Unsqueeze", [t, "ax2"], f"{out}_u"), node("Expand", [f"{out}_u", f"e{n}"], f"{out}_e"),
            node("Reshape", [f"{out}_e", "shape_q"], out)]


def _gqa(repeat_v=True):
    nodes = _repeat("k", "kr") + (_repeat("v", "vr") if repeat_v else [])
    nodes += [node("Transpose", ["kr"], "kt", perm=[0, 1, 3, 2]), node("MatMul", ["q", "kt"], "s0"),
              node("Mul", ["s0", "scale"], "s1"), node("Add", ["s1", "mask"], "s2"),
              node("Softmax", ["s2"], "p", axis=-1), node("MatMul", ["p", "vr" if repeat_v else "v"], "y")]
    inits = [const("ax2", [2], np.int64), const(f"e{HQ // HKV}", [B, HKV, HQ // HKV, L, HD], np.int64),
             const("shape_q", [B, HQ, L, HD], np.int64), const("scale", HD ** -0.5)]
    return nodes, inits


def test_grouped_query_attention_reads_the_kv_heads_once():
    nodes, inits = _gqa()
    mask = np.zeros((B, 1, L, L), np.float32)
    mask[:, :, :, -2:] = -1e9
    inputs = [("q", F, [B, HQ, L, HD]), ("k", F, [B, HKV, L, HD]), ("v", F, [B, HKV, L, HD]), ("mask", F, [B, 1, L, L])]
    m = model(nodes, inputs, ["y"], inits)
    feeds = {"q": rnd(B, HQ, L, HD), "k": rnd(B, HKV, L, HD, seed=1), "v": rnd(B, HKV, L, HD, seed=2), "mask": mask}
    c = check(m, oracle="ort", feeds=feeds)
    assert ops(c) == ["ScaledDotProductAttention"]
    assert fused(c, "ScaledDotProductAttention")[0].attrs["kv_repeat"] == HQ // HKV


def test_grouped_query_attention_declines_one_repeated_operand():
    nodes, inits = _gqa(repeat_v=False)
    inputs = [("q", F, [B, HQ, L, HD]), ("k", F, [B, HKV, L, HD]), ("v", F, [B, HQ, L, HD]), ("mask", F, [B, 1, L, L])]
    c = check(model(nodes, inputs, ["y"], inits), oracle="ort")
    assert "Expand" in ops(c)
    assert declined(c, "attention_repeat_kv") == ["k and v are not both repeated the same number of times"]


# ------------------------------------------------------------------ gated MLPs and linear SiLU

def _gated(act="silu", up_input="x", w3_cols=24, bias=False):
    nodes = [node("MatMul", ["x", "w1"], "g"), node("MatMul", [up_input, "w3"], "u")]
    if bias:
        nodes = [node("MatMul", ["x", "w1"], "g0"), node("Add", ["g0", "b1"], "g"),
                 node("MatMul", [up_input, "w3"], "u0"), node("Add", ["u0", "b3"], "u")]
    if act == "silu":
        nodes += [node("Sigmoid", ["g"], "sg"), node("Mul", ["g", "sg"], "a")]
    elif act == "gelu":
        nodes += [node("Div", ["g", "sq2"], "gd"), node("Erf", ["gd"], "ge"), node("Add", ["ge", "one"], "g1"),
                  node("Mul", ["g", "g1"], "gm"), node("Mul", ["gm", "half"], "a")]
    else:
        nodes.append(node("Relu", ["g"], "a"))
    nodes.append(node("Mul", ["a", "u"], "y"))
    inits = [const("w1", rnd(D, 24, seed=1) / 4), const("w3", rnd(D, w3_cols, seed=2) / 4),
             const("sq2", np.sqrt(2.0)), const("one", 1.0), const("half", 0.5),
             const("b1", rnd(24, seed=4)), const("b3", rnd(w3_cols, seed=5))]
    return nodes, inits


@pytest.mark.parametrize("act, name", [("silu", "silu"), ("gelu", "gelu"), ("relu", "relu")])
def test_gated_mlp_packs_both_products(act, name):
    """Rows known at run time only: one product of the packed weights, the gating after it."""
    nodes, inits = _gated(act)
    c = check(model(nodes, [("x", F, ["batch", "seq", D])], ["y"], inits), oracle="ort",
              feeds={"x": rnd(B, S, D)})
    assert ops(c) == ["LinearAct", "GatedActivation"]
    lin, gate = fused(c, "LinearAct")[0], fused(c, "GatedActivation")[0]
    assert gate.attrs["activation"] == name and tuple(lin.inputs[1].const.shape) == (48, D)
    assert declined(c, "gated_product") == ["rows known at run time only: the packed product runs one GEMM over them"]


@pytest.mark.parametrize("act, name", [("silu", "silu"), ("gelu", "gelu"), ("relu", "relu")])
@pytest.mark.parametrize("bias", [False, True])
def test_gated_product_of_static_rows(act, name, bias):
    """A static input: the two products and the gating one GatedLinear, its weights the gate's
    and the up projection's again (``[N, K]`` each), the biases split the same way (the
    numbers against onnxruntime: ``check``)."""
    nodes, inits = _gated(act, bias=bias)
    c = check(model(nodes, [("x", F, [B, S, D])], ["y"], inits), oracle="ort")
    assert ops(c) == ["GatedLinear"]
    g = fused(c, "GatedLinear")[0]
    assert g.attrs["activation"] == name
    assert [tuple(v.const.shape) for v in g.inputs[1:3]] == [(24, D), (24, D)]
    assert (len([v for v in g.inputs if v is not None]) == 5) == bias


def test_gated_mlp_declines_different_inputs():
    nodes, inits = _gated(up_input="x2")
    c = check(model(nodes, [("x", F, [B, S, D]), ("x2", F, [B, S, D])], ["y"], inits), oracle="ort")
    assert "GatedActivation" not in ops(c)
    assert declined(c, "gated_mlp") == ["the gate and up projections read different inputs"]


def test_linear_silu():
    m = model([node("MatMul", ["x", "w"], "p"), node("Sigmoid", ["p"], "s"), node("Mul", ["s", "p"], "y")],
              [("x", F, [B, S, D])], ["y"], [const("w", rnd(D, 24))])
    c = check(m, oracle="ort")
    assert ops(c) == ["LinearAct"] and fused(c, "LinearAct")[0].attrs["activation"] == "silu"
