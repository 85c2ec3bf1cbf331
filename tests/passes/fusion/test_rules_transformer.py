"""Transformer fusion rules (passes/fusion/rules_transformer.py): each rule graph-in / graph-out
(the fused op list) and numerically against the unoptimised graph (O0) and onnxruntime with
ORT_DISABLE_ALL at fp32 rtol 1e-4, plus at least one case where the rule must decline, with
the reason it records in ``report.fusions``."""
import math

import numpy as np
import pytest

import fusegraph as fg
from passes_util import F, check, compile_with, const, model, node, ops

H, D = 4, 8          # heads, head size of the small attention graphs
FMIN = float(np.finfo(np.float32).min)


def declined(compiled, rule):
    return [f.reason for f in compiled.report.fusions if f.rule == rule and not f.applied]


def fused(compiled, op):
    return [n for n in compiled.graph.nodes if n.domain == "fusegraph" and n.op_type == op]


def rnd(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


# ------------------------------------------------------------------ linear + activation

ACTS = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh"}


@pytest.mark.parametrize("act", sorted(ACTS))
@pytest.mark.parametrize("bias", [True, False])
def test_linear_act(act, bias):
    nodes = [node("MatMul", ["x", "w"], "mm")]
    last = "mm"
    if bias:
        nodes.append(node("Add", ["mm", "b"], "mb"))
        last = "mb"
    nodes.append(node(act, [last], "y"))
    m = model(nodes, [("x", F, [2, 3, 16])], ["y"], [const("w", rnd(16, 24)), const("b", rnd(24, seed=1))])
    c = check(m, oracle="ort")
    assert ops(c) == ["LinearAct"]
    assert fused(c, "LinearAct")[0].attrs["activation"] == ACTS[act]


def test_gemm_bias_gelu_becomes_one_linear():
    nodes = [node("Gemm", ["x", "w", "b"], "g", transB=1), node("Div", ["g", "sq2"], "u"), node("Erf", ["u"], "e"),
             node("Add", ["e", "one"], "a"), node("Mul", ["g", "a"], "m"), node("Mul", ["m", "half"], "y")]
    m = model(nodes, [("x", F, [5, 16])], ["y"], [const("w", rnd(24, 16)), const("b", rnd(24, seed=1)),
                                                 const("sq2", math.sqrt(2)), const("one", 1.0), const("half", 0.5)])
    c = check(m, oracle="ort")
    assert ops(c) == ["LinearAct"]
    n = fused(c, "LinearAct")[0]
    assert n.attrs == {"trans_b": 1, "activation": "gelu"} and len(n.inputs) == 3


@pytest.mark.parametrize("rows", [1, 6])
def test_linear_layer(rows):
    """A plain MatMul / Gemm by a large constant weight -> LinearAct without activation (oneDNN's
    inner product); small weights stay as they are."""
    m = model([node("MatMul", ["x", "w"], "a"), node("Gemm", ["a", "w2", "b"], "g", transB=1),
               node("MatMul", ["g", "small"], "y")],
              [("x", F, [rows, 256])], ["y"], [const("w", rnd(256, 512, scale=0.1)),
                                              const("w2", rnd(300, 512, seed=1, scale=0.1)), const("b", rnd(300)),
                                              const("small", rnd(300, 4, seed=2))])
    c = check(m, oracle="ort", threads=2, feeds={"x": rnd(rows, 256)})
    assert ops(c) == ["LinearAct", "LinearAct", "MatMul"]
    assert [n.attrs.get("activation") for n in c.graph.nodes[:2]] == ["none", "none"]


@pytest.mark.parametrize("act", ["none", "relu", "gelu", "gelu_tanh", "sigmoid", "tanh"])
def test_linear_weights_stored_rows_first_for_onednn(act):
    """A constant [K, N] MatMul weight becomes a [N, K] constant with trans_b=1 (the layout
    oneDNN's inner product reads without a reorder) and the kernel is oneDNN's (its rows, a
    symbolic dim here, given at run time: sgemm), with the bias as an operand; outputs match
    onnxruntime for one row and for several."""
    tail = {"none": [], "relu": [node("Relu", ["mb"], "y")], "sigmoid": [node("Sigmoid", ["mb"], "y")],
            "tanh": [node("Tanh", ["mb"], "y")], "gelu": _gelu_erf("(x*a)*h"), "gelu_tanh": _gelu_tanh()}[act]
    first = "x" if act.startswith("gelu") else "mb"
    nodes = [node("MatMul", ["x_in", "w"], "mm"), node("Add", ["mm", "b"], first)] + tail
    out = "y" if act != "none" else first
    m = model(nodes, [("x_in", F, ["n", 64])], [out],
              [const("w", rnd(64, 1100, scale=0.2)), const("b", rnd(1100, seed=1))] + GELU_CONSTS)
    for rows in (1, 7):
        c = check(m, oracle="ort", threads=2, feeds={"x_in": rnd(rows, 64, seed=rows)})
        n = fused(c, "LinearAct")[0]
        assert n.attrs == {"trans_b": 1, "activation": act}
        assert tuple(n.inputs[1].shape) == (1100, 64) and n.inputs[1].const.is_contiguous()
        why = [d["reason"] for d in c.report.kernels["declined"] if d["node"] == n.name]
        assert why == []      # a symbolic row count: oneDNN's sgemm, whatever the rows
        impls = c.report.kernels["implementations"]
        assert "sgemm" in impls, impls


def test_linear_layer_declines_unknown_rank():
    m = model([node("MatMul", ["x", "w"], "y")], [("x", F, None)], ["y"], [const("w", rnd(256, 512))])
    c = check(m, oracle="ort", feeds={"x": rnd(3, 256)})
    assert ops(c) == ["MatMul"]
    assert declined(c, "linear_layer") == ["the input rank is unknown"]


def test_linear_act_declines_batched_weight():
    m = model([node("MatMul", ["x", "w"], "mm"), node("Relu", ["mm"], "y")], [("x", F, [2, 3, 16])], ["y"],
              [const("w", rnd(2, 16, 8))])
    c = check(m, oracle="ort")
    assert ops(c) == ["MatMul", "Relu"]
    assert declined(c, "linear_act") == ["the weight is not 2-D"]


# ------------------------------------------------------------------ GELU

def _gelu_erf(form):
    div = node("Div", ["x", "sq2"], "u") if form != "mul" else node("Mul", ["x", "isq2"], "u")
    core = [div, node("Erf", ["u"], "e"), node("Add", ["one", "e"], "a")]
    tails = {
        "(x*a)*h": [node("Mul", ["x", "a"], "m"), node("Mul", ["m", "half"], "y")],
        "(x*h)*a": [node("Mul", ["half", "x"], "m"), node("Mul", ["a", "m"], "y")],
        "x*(a*h)": [node("Mul", ["a", "half"], "m"), node("Mul", ["x", "m"], "y")],
        "mul": [node("Mul", ["x", "a"], "m"), node("Mul", ["m", "half"], "y")],
    }
    return core + tails[form]


GELU_CONSTS = [const("sq2", math.sqrt(2)), const("isq2", math.sqrt(0.5)), const("one", 1.0), const("half", 0.5),
               const("three", 3.0), const("c1", 0.044715), const("k", math.sqrt(2 / math.pi))]


@pytest.mark.parametrize("form", ["(x*a)*h", "(x*h)*a", "x*(a*h)", "mul"])
def test_gelu_erf_forms(form):
    m = model(_gelu_erf(form), [("x", F, [2, 5, 16])], ["y"], GELU_CONSTS)
    c = check(m, oracle="ort", feeds={"x": rnd(2, 5, 16, scale=3)})
    assert ops(c) == ["Gelu"] and fused(c, "Gelu")[0].attrs["approximate"] == "none"


def _gelu_tanh(cube="pow"):
    x3 = [node("Pow", ["x", "three"], "x3")] if cube == "pow" else \
        [node("Mul", ["x", "x"], "x2"), node("Mul", ["x2", "x"], "x3")]
    return x3 + [node("Mul", ["x", "half"], "m0"), node("Mul", ["x3", "c1"], "m1"), node("Add", ["x", "m1"], "s"),
                 node("Mul", ["s", "k"], "m2"), node("Tanh", ["m2"], "t"), node("Add", ["t", "one"], "a"),
                 node("Mul", ["m0", "a"], "y")]


@pytest.mark.parametrize("cube", ["pow", "mul"])
def test_gelu_tanh_form(cube):
    m = model(_gelu_tanh(cube), [("x", F, [2, 5, 16])], ["y"], GELU_CONSTS)
    c = check(m, oracle="ort", feeds={"x": rnd(2, 5, 16, scale=3)})
    assert ops(c) == ["Gelu"] and fused(c, "Gelu")[0].attrs["approximate"] == "tanh"


def test_bias_gelu_absorbs_the_bias():
    nodes = [node("Add", ["x0", "b"], "x")] + _gelu_erf("(x*a)*h")
    m = model(nodes, [("x0", F, [2, 5, 16])], ["y"], GELU_CONSTS + [const("b", rnd(16, seed=3))])
    c = check(m, oracle="ort", feeds={"x0": rnd(2, 5, 16, scale=3)})
    assert ops(c) == ["Gelu"] and len(fused(c, "Gelu")[0].inputs) == 2


def test_gelu_declines_wrong_constant():
    consts = [t if t.name != "half" else const("half", 0.6) for t in GELU_CONSTS]
    m = model(_gelu_tanh(), [("x", F, [2, 5, 16])], ["y"], consts)
    c = check(m, oracle="ort", disabled_passes=("elementwise_chain",))
    assert "Gelu" not in ops(c)
    assert "the constant factor is 0.6, not 0.5" in declined(c, "gelu")


def test_gelu_blocked_by_external_interior():
    m = model(_gelu_erf("(x*a)*h"), [("x", F, [2, 5, 16])], ["y"], GELU_CONSTS)
    c = check(m, oracle="ort", external_tensors=("e",), disabled_passes=("elementwise_chain",))
    assert "Gelu" not in ops(c) and "Erf" in ops(c)
    assert any("external" in r for r in declined(c, "gelu"))


# ------------------------------------------------------------------ LayerNorm

def _ln(opset=17, square="pow", tail="affine", axes=(-1,)):
    def mean(src, dst):
        if opset < 18:
            return node("ReduceMean", [src], dst, axes=list(axes))
        return node("ReduceMean", [src, "ax"], dst)
    sq = node("Pow", ["d", "two"], "p") if square == "pow" else node("Mul", ["d", "d"], "p")
    nodes = [mean("x", "mu"), node("Sub", ["x", "mu"], "d"), sq, mean("p", "v"), node("Add", ["v", "eps"], "ve"),
             node("Sqrt", ["ve"], "s"), node("Div", ["d", "s"], "n" if tail != "plain" else "y")]
    if tail != "plain":
        nodes.append(node("Mul", ["n", "g"], "ng" if tail == "affine" else "y"))
    if tail == "affine":
        nodes.append(node("Add", ["ng", "b"], "y"))
    inits = [const("two", 2.0), const("eps", 1e-5), const("g", rnd(16, seed=1)), const("b", rnd(16, seed=2)),
             const("ax", list(axes), np.int64)]
    return model(nodes, [("x", F, [2, 5, 16])], ["y"], inits, opset)


@pytest.mark.parametrize("opset", [17, 18])
@pytest.mark.parametrize("square", ["pow", "mul"])
@pytest.mark.parametrize("tail", ["affine", "scale", "plain"])
def test_layer_norm_decomposed(opset, square, tail):
    c = check(_ln(opset, square, tail), oracle="ort", feeds={"x": rnd(2, 5, 16, scale=4) + 3})
    assert ops(c) == ["LayerNorm"]
    assert len(fused(c, "LayerNorm")[0].inputs) == {"affine": 3, "scale": 2, "plain": 1}[tail]


def test_layer_norm_declines_two_axes():
    c = check(_ln(axes=(-2, -1)), oracle="ort", disabled_passes=("elementwise_chain",))
    assert "LayerNorm" not in ops(c)
    assert "the means are not over the last axis alone" in declined(c, "layer_norm")


def test_skip_layer_norm_post_ln():
    m = model([node("Add", ["a", "r"], "s"), node("LayerNormalization", ["s", "g", "b"], "y", epsilon=1e-12)],
              [("a", F, [2, 5, 16]), ("r", F, [2, 5, 16])], ["y"], [const("g", rnd(16)), const("b", rnd(16, seed=1))])
    c = check(m, oracle="ort")
    assert ops(c) == ["SkipLayerNorm"] and len(fused(c, "SkipLayerNorm")[0].outputs) == 1


def test_skip_layer_norm_keeps_the_residual_stream():
    """Pre-LN: the sum feeds the LayerNorm and the next residual Add (emitted before it)."""
    m = model([node("Add", ["a", "r"], "s"), node("Relu", ["a"], "ra"), node("Add", ["s", "ra"], "s2"),
               node("LayerNormalization", ["s", "g", "b"], "n"), node("Add", ["n", "s2"], "y")],
              [("a", F, [2, 5, 16]), ("r", F, [2, 5, 16])], ["y"], [const("g", rnd(16)), const("b", rnd(16, seed=1))])
    c = check(m, oracle="ort")
    assert "SkipLayerNorm" in ops(c) and "LayerNormalization" not in ops(c)
    assert len(fused(c, "SkipLayerNorm")[0].outputs) == 2


def test_skip_layer_norm_declines_broadcast():
    m = model([node("Add", ["a", "r"], "s"), node("LayerNormalization", ["s", "g", "b"], "y")],
              [("a", F, [2, 5, 16]), ("r", F, [16])], ["y"], [const("g", rnd(16)), const("b", rnd(16, seed=1))])
    c = check(m, oracle="ort")
    assert ops(c) == ["Add", "LayerNorm"]      # the LayerNormalization alone (onnx_layer_norm)
    assert set(declined(c, "skip_layer_norm")) == {"the residual Add broadcasts"}


# ------------------------------------------------------------------ softmax

def _softmax(axis=-1, guard=True):
    nodes = [node("Mul", ["x", "sc"], "xs"), node("Add", ["xs", "mask"], "xm"),
             node("Softmax", ["xm"], "p" if guard else "y", axis=axis)]
    if guard:
        nodes += [node("IsNaN", ["p"], "nan"), node("Where", ["nan", "zero", "p"], "y")]
    return model(nodes, [("x", F, [2, 3, 5, 7]), ("mask", F, [2, 1, 1, 7])], ["y"],
                 [const("sc", 0.125), const("zero", 0.0)])


def test_masked_softmax_with_nan_guard():
    mask = np.zeros((2, 1, 1, 7), np.float32)
    mask[0, ..., 3:] = FMIN
    mask[1] = -np.inf                     # a fully masked batch: NaN rows, zeroed by the guard
    feeds = {"x": rnd(2, 3, 5, 7, scale=4), "mask": mask}
    c = check(_softmax(), oracle="ort", feeds=feeds)
    assert ops(c) == ["MaskedSoftmax"]
    n = fused(c, "MaskedSoftmax")[0]
    assert n.attrs["nan_to_zero"] == 1 and n.attrs["scale"] == 0.125


def test_masked_softmax_declines_other_axis():
    c = check(_softmax(axis=1, guard=False), oracle="ort", disabled_passes=("elementwise_chain",))
    assert "Softmax" in ops(c)
    assert declined(c, "masked_softmax") == ["Softmax is not over the last axis"]


# ------------------------------------------------------------------ attention

def _attention(mask="add", fill=FMIN, guard=True, S=6, proj=None, merged=(0, 0, H * D)):
    """The BERT / GPT-2 SDPA export: split heads, scale q and k^T by d^-1/4, add the mask,
    softmax, NaN guard, weight v, merge heads. ``proj``: q, k, v are graph inputs (None), three
    MatMuls of x ("bert"), one MatMul of x split in three ("gpt2"), or MatMuls of two inputs ("two")."""
    nodes, inits = [], []
    if proj in ("bert", "two"):
        nodes += [node("MatMul", ["x2" if proj == "two" and t == "q" else "x", f"w{t}"], t) for t in "qkv"]
        inits += [const(f"w{t}", rnd(H * D, H * D, seed=5 + i, scale=0.3)) for i, t in enumerate("qkv")]
    elif proj == "gpt2":
        nodes += [node("MatMul", ["x", "wqkv"], "qkv"), node("Split", ["qkv", "sizes"], ["q", "k", "v"], axis=2)]
        inits += [const("wqkv", rnd(H * D, 3 * H * D, seed=5, scale=0.3)), const("sizes", [H * D] * 3, np.int64)]
    for t, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        nodes += [node("Reshape", [t, "heads"], f"{t}r"), node("Transpose", [f"{t}r"], f"{t}t", perm=perm)]
    nodes += [node("Mul", ["qt", "c"], "qs"), node("Mul", ["kt", "c"], "ks"), node("MatMul", ["qs", "ks"], "s")]
    if mask == "add":
        nodes.append(node("Add", ["s", "mask"], "sm"))
    else:   # GPT-2 style causal Where with a large negative fill
        nodes.append(node("Where", ["causal", "s", "fill"], "sm"))
    nodes.append(node("Softmax", ["sm"], "p", axis=-1))
    if guard:
        nodes += [node("IsNaN", ["p"], "nan"), node("Where", ["nan", "zero", "p"], "pg")]
    nodes += [node("MatMul", ["pg" if guard else "p", "vt"], "o"), node("Transpose", ["o"], "ot", perm=[0, 2, 1, 3]),
              node("Reshape", ["ot", "merged"], "y")]
    inputs = [(t, F, [2, S, H * D]) for t in (("x", "x2") if proj == "two" else "x" if proj else "qkv")]
    inputs.append(("mask", F, [2, 1, 1, S]) if mask == "add" else ("causal", 9, [S, S]))
    inits += [const("heads", [0, 0, H, D], np.int64), const("merged", list(merged), np.int64),
              const("c", 1 / math.sqrt(math.sqrt(D))), const("zero", 0.0), const("fill", fill)]
    return model(nodes, inputs, ["y"], inits)


def _attention_feeds(S=6, mask="add", masked_batch=False, names="qkv"):
    feeds = {t: rnd(2, S, H * D, seed=i, scale=2) for i, t in enumerate(names)}
    if mask == "add":
        m = np.zeros((2, 1, 1, S), np.float32)
        m[0, ..., S - 2:] = FMIN                     # padding
        if masked_batch:
            m[1] = FMIN                              # every key masked: a uniform average
        feeds["mask"] = m
    else:
        feeds["causal"] = np.tril(np.ones((S, S), bool))
    return feeds


@pytest.mark.parametrize("S", [1, 6])
def test_attention_bert_export(S):
    m = _attention(S=S)
    c = check(m, oracle="ort", feeds=_attention_feeds(S, masked_batch=True))
    assert ops(c) == ["ScaledDotProductAttention"]     # heads split and merged inside too
    n = fused(c, "ScaledDotProductAttention")[0]
    assert n.attrs["k_transposed"] == 1 and n.attrs["nan_to_zero"] == 1 and n.attrs["merge_heads"] == 1
    assert n.attrs["q_heads"] == n.attrs["k_heads"] == n.attrs["v_heads"] == H
    assert math.isclose(n.attrs["scale"], 1 / math.sqrt(D), rel_tol=1e-6)


@pytest.mark.parametrize("proj", ["bert", "gpt2"])
def test_attention_packs_the_projections(proj):
    """Three projections of one input (BERT) or a Split of one (GPT-2) feed q, k, v packed."""
    c = check(_attention(proj=proj), oracle="ort", feeds=_attention_feeds(names=("x",)))
    assert ops(c) == ["MatMul", "ScaledDotProductAttention"]
    assert fused(c, "ScaledDotProductAttention")[0].attrs["qkv_split"] == [H * D] * 3


def test_attention_pack_declines_two_inputs():
    c = check(_attention(proj="two"), oracle="ort", feeds=_attention_feeds(names=("x", "x2")))
    assert ops(c) == ["MatMul"] * 3 + ["ScaledDotProductAttention"]
    assert "q, k, v are not projections of one input" in declined(c, "attention_pack_qkv")


@pytest.mark.parametrize("merged", [(-1, H * D), (2 * 6, H * D)], ids=["minus-one", "rows"])
def test_attention_merge_takes_the_rows_flattened(merged):
    """GPT-2's export merges the heads into ``[B*L, H*D]``: the merged output, viewed flat."""
    c = check(_attention(merged=merged), oracle="ort", feeds=_attention_feeds())
    assert ops(c) == ["ScaledDotProductAttention", "Reshape"]       # no Transpose (a copy) left
    assert fused(c, "ScaledDotProductAttention")[0].attrs["merge_heads"] == 1
    assert c.graph.outputs[0].shape == (2 * 6, H * D)


def test_attention_merge_declines_other_reshape():
    c = check(_attention(merged=(0, -1)), oracle="ort", feeds=_attention_feeds())
    assert "Transpose" in ops(c) and "ScaledDotProductAttention" in ops(c)
    assert "the final Reshape does not provably merge the heads" in declined(c, "attention_merge_heads")


def test_attention_fully_masked_rows_follow_the_guard():
    """A -inf mask over every key: softmax gives NaN, the guard zeros it, so does the fusion."""
    feeds = _attention_feeds(S=1)
    feeds["mask"][:] = -np.inf
    c = check(_attention(S=1), oracle="ort", feeds=feeds)
    assert "ScaledDotProductAttention" in ops(c)
    assert np.all(c.run(feeds)["y"] == 0)


def test_attention_mask_that_enlarges_the_scores():
    """A mask of batch 2 over q, k, v of batch 1: declined when the shapes say so; when they are
    symbolic the fused kernel refuses at run time instead of returning another shape."""
    m = _attention(S=3)
    for vi in list(m.graph.input)[:3]:
        vi.type.tensor_type.shape.dim[0].dim_value = 1
    feeds = {k: v[:1] if k != "mask" else v for k, v in _attention_feeds(S=3).items()}
    c = check(m, oracle="ort", feeds=feeds)
    assert "ScaledDotProductAttention" not in ops(c)
    assert "the mask broadcasts the scores to a larger shape" in declined(c, "attention")
    for vi in m.graph.input:
        vi.type.tensor_type.shape.dim[0].dim_param = "batch" if vi.name != "mask" else "mb"
    c = fg.compile(m)
    assert "ScaledDotProductAttention" in ops(c)
    with pytest.raises(fg.errors.KernelError, match="mask"):
        c.run(feeds)


def test_attention_causal_where_mask():
    m = _attention(mask="where", guard=False)
    c = check(m, oracle="ort", feeds=_attention_feeds(mask="where"))
    assert "ScaledDotProductAttention" in ops(c) and "Softmax" not in ops(c)


def test_attention_declines_small_where_fill():
    """An old GPT-2 export's -1e4 fill: a Where is not an additive mask on fully masked rows."""
    m = _attention(mask="where", fill=-1e4, guard=False)
    c = check(m, oracle="ort", feeds=_attention_feeds(mask="where"), disabled_passes=("elementwise_chain",))
    assert "ScaledDotProductAttention" not in ops(c) and "Softmax" in ops(c)
    assert any("not large enough" in r for r in declined(c, "attention"))


# ------------------------------------------------------------------ elementwise chains

def test_elementwise_chain():
    m = model([node("Mul", ["x", "two"], "a"), node("Add", ["a", "y"], "b"), node("Tanh", ["b"], "t"),
               node("Sub", ["t", "x"], "z"), node("Identity", ["x"], "x2")],
              [("x", F, [3, 4]), ("y", F, [4])], ["z", "x2"], [const("two", 2.0)])
    c = check(m, oracle="ort")
    assert ops(c).count("ElementwiseChain") == 1 and "Tanh" not in ops(c)
    assert fused(c, "ElementwiseChain")[0].attrs["steps"] == ["Mul i0 i1", "Add p i2", "Tanh p", "Sub p i0"]


def test_elementwise_chain_never_writes_an_input():
    """The chain reads x in its first and last step; x is also a graph output."""
    m = model([node("Neg", ["x"], "a"), node("Exp", ["a"], "b"), node("Mul", ["b", "x"], "y"), node("Abs", ["x"], "w")],
              [("x", F, [2, 8])], ["y", "w"])
    feeds = {"x": rnd(2, 8)}
    c = check(m, oracle="ort", feeds=feeds)
    assert "ElementwiseChain" in ops(c)
    got = c.run(feeds)
    np.testing.assert_array_equal(got["w"], np.abs(feeds["x"]))


def test_elementwise_chain_declines_growing_shape():
    m = model([node("Add", ["x", "one"], "a"), node("Mul", ["a", "y"], "z")], [("x", F, [4]), ("y", F, [3, 4])],
              ["z"], [const("one", 1.0)])
    c = check(m, oracle="ort")
    assert ops(c) == ["Add", "Mul"]
    assert declined(c, "elementwise_chain") == ["a single elementwise op"]


def test_rules_can_be_disabled_by_name():
    c = compile_with(_attention(), disabled_passes=("attention",))
    assert "ScaledDotProductAttention" not in ops(c) and "MaskedSoftmax" in ops(c)


# ------------------------------------------------------------------ reshapes around a linear layer

def _reshaped_linear(restore=True):
    """GPT-2's Conv1D export: flatten to 2-D, Gemm, restore the leading dims read from Shape."""
    nodes = [node("Reshape", ["x", "flat"], "x2"), node("Gemm", ["x2", "w", "b"], "g"),
             node("Shape", ["x"], "s"), node("Gather", ["s", "i0"], "d0"), node("Gather", ["s", "i1"], "d1"),
             node("Unsqueeze", ["d0", "ax"], "u0"), node("Unsqueeze", ["d1", "ax"], "u1"),
             node("Concat", ["u0", "u1", "n"] if restore else ["u1", "u0", "n"], "target", axis=0),
             node("Reshape", ["g", "target"], "y")]
    inits = [const("flat", [-1, 8], np.int64), const("w", rnd(8, 5)), const("b", rnd(5, seed=1)),
             const("i0", 0, np.int64), const("i1", 1, np.int64), const("ax", [0], np.int64),
             const("n", [5], np.int64)]
    return model(nodes, [("x", F, ["batch", "seq", 8])], ["y"], inits, opset=13)


def test_linear_reshapes_read_symbolically():
    c = check(_reshaped_linear(), oracle="ort", feeds={"x": rnd(2, 3, 8)})
    assert ops(c) == ["Linear"] and c.graph.nodes[0].inputs[0].name == "x"


def test_linear_reshapes_decline_a_permuted_target():
    c = check(_reshaped_linear(restore=False), oracle="ort", feeds={"x": rnd(3, 3, 8)})
    assert "Reshape" in ops(c)
    assert "the outer Reshape does not provably restore the leading dims" in declined(c, "linear_reshapes")
