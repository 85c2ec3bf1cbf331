"""The CPU backend's oneDNN kernels (``runtime/backends/cpu/dnnl/``) on small ONNX graphs,
checked against onnxruntime with ``ORT_DISABLE_ALL`` (fp32: rtol 1e-4, He-scaled weights), and
checked to have really run as oneDNN primitives: every node of the kernel's op is bound to a
``DnnlKernel`` whose implementation is in ``report.kernels["implementations"]`` and no family
declined it, so no test here can pass on the portable fallback.

Covered: convolutions (3x3, 1x1, 7x7 stride 2, groups, depthwise, dilation, asymmetric pads,
SAME_UPPER / SAME_LOWER / VALID, odd channel counts, no bias, a batch of 3) with their fused bias /
activation (exact and ``fast_math`` post-ops) / residual (both forms: a ``binary add`` post-op
reading the residual, and a ``sum`` post-op accumulating onto it when the planner puts the
output in place over it), a first convolution reading an NCHW graph input through its staging
buffer, a lone convolution the layout pass leaves NCHW (oneDNN's GEMM kernel), a weight shared
by two convolutions (packed once); max / average / global pools in both layouts, LRN; the
nodes oneDNN cannot take exactly declining with their reason (even LRN window, dilated max
pool, ...); MatMul / Gemm as LinearAct (relu, GELU) on 2-D and 3-D inputs; bf16 and fp16
precision; NaN / Inf through the exact max pool (and without the check under ``fast_math``);
two streams giving bitwise the outputs of one.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import fusegraph as fg
from fusegraph.runtime.backends.cpu.dnnl import available
from fusegraph.runtime.backends.cpu.dnnl.call import DnnlKernel
from fusegraph.runtime.backends.cpu.dnnl.primitive import exact_post_ops
from fusegraph.runtime.backends.cpu.guard import Guarded, Measuring
from fusegraph.runtime.codegen import generate_run_function
from cpu_isa import BF16_ARITHMETIC, needs_avx512, needs_bf16
from oracle import assert_outputs_close, ort_run

sys.path.insert(0, str(Path(__file__).parents[1] / "passes"))
from passes_util import F, const, model, node  # noqa: E402

pytestmark = pytest.mark.skipif(not available(), reason="oneDNN (onednn-cpu-gomp) does not load here")

CFG = fg.Config(threads=2)
CONV, LINEAR = ("FusedConv",), ("LinearAct", "Linear")


def rnd(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def he(*shape, seed=0):
    """He-scaled weights: activations stay O(1) through the layers."""
    return rnd(*shape, seed=seed, scale=float(np.sqrt(2.0 / np.prod(shape[1:]))))


def fast_of(kernel):
    """A guarded node's fast kernel (``runtime/backends/cpu/guard.py``), a measuring node's own,
    any other as it is."""
    kernel = kernel.kernel if isinstance(kernel, Measuring) else kernel
    return kernel.fast if isinstance(kernel, Guarded) else kernel


def exact_of(kernel):
    """The kernel a run with non-finite (or too large) feeds uses."""
    kernel = kernel.kernel if isinstance(kernel, Measuring) else kernel
    return kernel.exact if isinstance(kernel, Guarded) else kernel


def dnnl_calls(cm, ops) -> list:
    """The calls of ``cm`` whose op is in ``ops``: at least one, each bound to a oneDNN kernel
    (not a reference one), none declined, each implementation counted in the report."""
    calls = [c for c in cm._executor.binding.calls if c.node.op_type in ops]
    assert calls, f"no {ops} node bound: {[c.node.op_type for c in cm._executor.binding.calls]}"
    declined = {d["node"]: d["reason"] for d in cm.report.kernels["declined"]}
    impls = cm.report.kernels["implementations"]
    for c in calls:
        k = fast_of(c.kernel)
        # a oneDNN kernel on a fallback implementation is listed with its reason (``slow``), nothing else
        assert c.node.name not in declined or declined[c.node.name] == getattr(k, "slow", None), \
            f"{c.node.name} declined: {declined[c.node.name]}"
        assert isinstance(k, DnnlKernel), f"{c.node.name} ({c.node.op_type}) runs {type(k).__name__}"
        assert k.impl and k.impl != "portable" and not k.impl.startswith("ref"), k.impl
        assert impls.get(k.impl, 0) >= 1, (k.impl, impls)
    return calls


def check(m, ops, config=CFG, seed=0, scale=1.0):
    """Compile ``m``, compare with onnxruntime (rtol 1e-4) and check ``ops`` ran on oneDNN."""
    cm = fg.compile(m, config)
    feeds = {i.name: rnd(*[d.dim_value for d in i.type.tensor_type.shape.dim], seed=seed, scale=scale)
             for i in m.graph.input}
    assert_outputs_close(cm.run(feeds), ort_run(m, feeds), rtol=1e-4)
    return cm, dnnl_calls(cm, ops), feeds


def conv(x, y, w, cin, cout, k, seed=0, bias=True, group=1, **attrs):
    """A Conv node with He-scaled weights and a small bias."""
    ins = [x, w] + ([w + "_b"] if bias else [])
    inits = [const(w, he(cout, cin // group, k, k, seed=seed))]
    if bias:
        inits.append(const(w + "_b", rnd(cout, seed=seed + 1, scale=0.1)))
    return [node("Conv", ins, y, group=group, **attrs)], inits


def stem_then(case_nodes, case_inits, cin=8, hw=12, out="y", opset=17, stems=1):
    """3x3 stem convolution(s) with relu, then the case's nodes reading ``s``. The layout pass
    makes a net of two or more convolutions channels-last (the case's convolution, or a second
    stem, is the second one) and leaves a lone convolution NCHW."""
    nodes, inits, src = [], [], "x"
    for j in range(stems):
        n, i = conv(src, f"s{j}", f"ws{j}", 4 if j == 0 else cin, cin, 3, seed=11 + j, pads=[1] * 4)
        dst = "s" if j == stems - 1 else f"r{j}"
        nodes += n + [node("Relu", [f"s{j}"], dst)]
        inits += i
        src = dst
    return model(nodes + case_nodes, [("x", F, [1, 4, hw, hw])], [out], inits + case_inits, opset=opset)


# --------------------------------------------------------------------------- convolutions

GEOMETRIES = {   # name -> (cin, cout, k, group, attrs)
    "3x3": (8, 16, 3, 1, dict(pads=[1] * 4)),
    "3x3_no_bias": (8, 16, 3, 1, dict(pads=[1] * 4, bias=False)),
    "odd_channels_17_30": (17, 30, 3, 1, dict(pads=[1] * 4)),
    "1x1": (8, 16, 1, 1, {}),
    "7x7_stride2": (8, 16, 7, 1, dict(strides=[2, 2], pads=[3] * 4)),
    "group2": (8, 12, 3, 2, dict(pads=[1] * 4)),
    "depthwise": (8, 8, 3, 8, dict(pads=[1] * 4)),
    "dilation2": (8, 8, 3, 1, dict(pads=[2] * 4, dilations=[2, 2])),
    "asymmetric_pads": (8, 8, 3, 1, dict(pads=[0, 1, 2, 1])),
    "same_upper_stride2": (8, 8, 3, 1, dict(auto_pad="SAME_UPPER", strides=[2, 2])),
    "same_lower_stride2": (8, 8, 3, 1, dict(auto_pad="SAME_LOWER", strides=[2, 2])),
    "valid_stride3": (8, 8, 3, 1, dict(auto_pad="VALID", strides=[3, 3])),
}


@pytest.mark.parametrize("name", list(GEOMETRIES))
def test_conv_geometry(name):
    cin, cout, k, group, attrs = GEOMETRIES[name]
    n, i = conv("s", "c", "w", cin, cout, k, seed=3, group=group, **attrs)
    cm, calls, _ = check(stem_then(n + [node("Relu", ["c"], "y")], i, cin=cin), CONV)
    assert len(calls) == 2 and all(c.node.outputs[0].layout == "nhwc" for c in calls)
    assert all(c.node.attrs.get("activation") == "relu" for c in calls)


def test_conv_batch_of_three():
    n, i = conv("s", "c", "w", 8, 16, 3, seed=3, pads=[1] * 4)
    m = stem_then(n + [node("Relu", ["c"], "y")], i)
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 3
    cm, calls, _ = check(m, CONV)
    assert [fast_of(c.kernel).output.shape[0] for c in calls] == [3, 3]


ACTIVATIONS = {   # name -> (nodes after the conv output "c", extra initializers, FusedConv activation)
    "bias_relu": (lambda: [node("Relu", ["c"], "y")], [], "relu"),
    "clip_0_6": (lambda: [node("Clip", ["c", "lo", "hi"], "y")],
                 [const("lo", np.float32(0)), const("hi", np.float32(6))], "hardtanh"),
    "sigmoid": (lambda: [node("Sigmoid", ["c"], "y")], [], "sigmoid"),
    "leaky_relu": (lambda: [node("LeakyRelu", ["c"], "y", alpha=0.1)], [], "leaky_relu"),
    "hardswish": (lambda: [node("HardSwish", ["c"], "y")], [], "hardswish"),
    "hardsigmoid": (lambda: [node("HardSigmoid", ["c"], "y", alpha=1.0 / 6, beta=0.5)], [], "hardsigmoid"),
    "tanh": (lambda: [node("Tanh", ["c"], "y")], [], "tanh"),
    "swish": (lambda: [node("Sigmoid", ["c"], "g"), node("Mul", ["c", "g"], "y")], [], "swish"),
}
NOT_EXACT = {"hardtanh", "hardsigmoid"}      # no oneDNN eltwise exact on NaN: torch after the primitive


@pytest.mark.parametrize("fast_math", [False, True], ids=["exact", "fast_math"])
@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_conv_activation_fused(name, fast_math):
    after, inits, activation = ACTIVATIONS[name]
    n, i = conv("s", "c", "w", 8, 8, 3, seed=5, pads=[1] * 4)
    m = stem_then(n + after(), i + inits)
    bounded = name in ("clip_0_6", "hardswish", "hardsigmoid")
    cm, calls, feeds = check(m, CONV, fg.Config(threads=2, fast_math=fast_math), scale=4.0 if bounded else 1.0)
    case = next(c for c in calls if c.node.inputs[1].name == "w")
    assert case.node.attrs.get("activation") == activation, case.node.attrs
    # exact: clip / hard sigmoid run after the primitive, unless the guard admits the fast form
    assert (exact_of(case.kernel).after is not None) == (activation in NOT_EXACT and not fast_math)
    assert isinstance(case.kernel, Guarded) == (activation in NOT_EXACT | {"relu"} and not fast_math)
    if bounded:         # the pre-activations cross both bounds (clip: 0 and 6; the hard ones: -3 and 3)
        pre = ort_run(stem_then(n, i, out="c"), feeds)["c"]
        assert (pre < -3).any() and (pre > 6).any(), (pre.min(), pre.max())
    assert not [c for c in cm._executor.binding.calls if c.node.op_type not in CONV]


def _residual_graph(in_place: bool):
    """Conv + Add(residual) + Relu. ``in_place``: the residual ``s`` dies at the add and is not
    the convolution's own input (s -> conv a -> conv b + s), so the planner may put the output
    over it; else the convolution reads ``s`` both as its input and as its residual."""
    na, ia = conv("s", "a", "wa", 8, 8, 3, seed=21, pads=[1] * 4)
    src = "ar" if in_place else "s"
    nb, ib = conv(src, "b", "wb", 8, 8, 3, seed=23, pads=[1] * 4)
    nodes = (na + [node("Relu", ["a"], "ar")] if in_place else []) + nb + \
        [node("Add", ["b", "s"], "r"), node("Relu", ["r"], "y")]
    return stem_then(nodes, (ia if in_place else []) + ib)


@pytest.mark.parametrize("in_place", [False, True], ids=["binary_post_op", "sum_post_op"])
def test_conv_residual_add_relu(in_place):
    cm, calls, feeds = check(_residual_graph(in_place), CONV)
    res = [c for c in calls if len(c.node.inputs) > 3 and c.node.inputs[3] is not None]
    assert len(res) == 1 and res[0].node.attrs.get("activation") == "relu"
    call, z = res[0], res[0].node.inputs[3]
    kernel = fast_of(call.kernel)
    assert not [c for c in cm._executor.binding.calls if c.node.op_type == "Add"]
    slots = cm.plan.slots
    if in_place:
        assert cm.plan.kinds.get(call.node.outputs[0].name) == "inplace"
        assert slots[call.node.outputs[0].name][0] == slots[z.name][0]
        assert kernel.prefill == 1 and kernel.inputs[1] is None     # z is the summand, no slot
        ex = cm._executor                 # the run calls it directly: offered only with no copy
        assert any(ex.code.line_to_node.get(i + 1) is call.node and ":= " in line
                   for i, line in enumerate(ex.code.source.splitlines())), ex.code.source
        ex._runner.code = generate_run_function(ex.graph, ex.binding, "<python path>", direct=False)
        cm.run(feeds)
        assert not kernel._prefill_copy, "the residual was copied though it lies in the output's bytes"
        producer = next(c for c in cm._executor.binding.calls if z in c.node.outputs)
        assert call.out[0].data_ptr() == producer.out[0].data_ptr()
    else:
        assert kernel.prefill is None and kernel.inputs[1] is not None
        assert slots[call.node.outputs[0].name][0] != slots[z.name][0]
    # a second run (same arena objects: the prepared argument array) gives the same answer
    again = cm.run(feeds)
    assert_outputs_close(again, ort_run(_residual_graph(in_place), feeds), rtol=1e-4)


def test_first_conv_stages_nchw_graph_input():
    n, i = conv("s", "y", "w", 8, 8, 3, seed=2, pads=[1] * 4)
    cm, calls, feeds = check(stem_then(n, i), CONV)
    first = next(c for c in calls if c.node.inputs[0].name == "x")
    assert first.node.outputs[0].layout == "nhwc"
    assert fast_of(first.kernel).converted >= 1, "the NCHW graph input was not staged into channels-last"
    inner = next(c for c in calls if c is not first)
    assert fast_of(inner.kernel).converted == 0, "an arena input in the kernel's layout was copied"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_staging_moves_every_bit_pattern_into_the_slot_layout(dtype):
    """A slot's staging copy of an NCHW tensor into its channels-last layout (oneDNN's reorder)
    keeps every bit: NaN payloads, infinities, subnormals, signed zeros; a tensor of another
    float type is converted as ATen converts it."""
    from fusegraph.runtime.backends.cpu.dnnl.call import Slot
    from fusegraph.runtime.backends.cpu.dnnl.layouts import channels_last
    shape = (1, 5, 7, 9)
    ints = torch.int16 if dtype == torch.bfloat16 else torch.int32
    info = torch.iinfo(ints)
    bits = torch.randint(info.min, info.max, shape, dtype=ints, generator=torch.Generator().manual_seed(0))
    x = bits.view(dtype)
    slot = Slot(0, shape, channels_last(shape), dtype)
    staged = slot.stage(x)
    assert staged.stride() == channels_last(shape)
    assert slot._reorders[x.stride()] is not None or (dtype == torch.bfloat16 and not BF16_ARITHMETIC)   # else copy_
    assert torch.equal(staged.view(ints), bits.contiguous(memory_format=torch.channels_last))
    other = torch.randn(shape, dtype=torch.float64)
    assert torch.equal(slot.stage(other), other.to(dtype))


def test_shared_weight_is_packed_once():
    """Two convolutions of one weight (same geometry): one reorder, one packed copy."""
    n1, i1 = conv("s", "a", "w", 8, 8, 3, seed=6, pads=[1] * 4)
    n2, _ = conv("ar", "b", "w", 8, 8, 3, seed=6, pads=[1] * 4)
    m = stem_then(n1 + [node("Relu", ["a"], "ar")] + n2 + [node("Relu", ["b"], "y")], i1)
    cm, calls, _ = check(m, CONV)
    shared = [c for c in calls if c.node.inputs[1].name == "w"]
    assert len(shared) == 2 and cm.report.kernels["weight_reorders"] == 2      # the stem's and "w"
    assert fast_of(shared[0].kernel)._keep[0] is fast_of(shared[1].kernel)._keep[0]


def test_bind_probe_leaves_no_tensor_alive():
    """The bind-time layout probe calls the kernels without ``out``: the kernels keep no
    reference to its tensors (they stayed alive until the first run: squeezenet-sized models
    held ~17 MiB of probe activations through compile)."""
    n, i = conv("s", "y", "w", 8, 8, 3, seed=2, pads=[1] * 4)
    cm = fg.compile(stem_then(n, i), CFG)
    kernels = [fast_of(c.kernel) for c in dnnl_calls(cm, CONV)]
    arena = cm._executor.arena            # a direct call's home tensors are arena views, no probe's
    assert all(t is None or arena.contains(t) for k in kernels for t in k._cur)
    x = rnd(1, 4, 12, 12)
    cm.run({"x": x})                          # a planned run: arena views, kept for the next call
    assert any(t is not None for k in kernels for t in k._cur)


def test_lone_conv_stays_nchw():
    n, i = conv("x", "c", "w", 4, 8, 3, seed=4, pads=[1] * 4)
    m = model(n + [node("Relu", ["c"], "y")], [("x", F, [1, 4, 12, 12])], ["y"], i, opset=17)
    cm, calls, _ = check(m, CONV)
    assert len(calls) == 1 and calls[0].node.outputs[0].layout != "nhwc"
    assert fast_of(calls[0].kernel).output.strides == (8 * 144, 144, 12, 1)
    assert "gemm" in fast_of(calls[0].kernel).impl, fast_of(calls[0].kernel).impl
    assert [d["reason"] for d in cm.report.kernels["declined"]] == [fast_of(calls[0].kernel).slow]
    assert fast_of(calls[0].kernel).slow.startswith("NCHW data (the layout pass kept this graph NCHW)")


# --------------------------------------------------------------------------- pools and LRN

POOLS = {   # name -> (node after the stem output "s")
    "max_3x3_s2": lambda: node("MaxPool", ["s"], "y", kernel_shape=[3, 3], strides=[2, 2]),
    "max_pads": lambda: node("MaxPool", ["s"], "y", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    "max_ceil": lambda: node("MaxPool", ["s"], "y", kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
    "avg_exclude_pad": lambda: node("AveragePool", ["s"], "y", kernel_shape=[3, 3], strides=[2, 2],
                                    pads=[1, 1, 1, 1], count_include_pad=0),
    "avg_include_pad": lambda: node("AveragePool", ["s"], "y", kernel_shape=[3, 3], strides=[2, 2],
                                    pads=[1, 1, 1, 1], count_include_pad=1),
    "max_asym_pads": lambda: node("MaxPool", ["s"], "y", kernel_shape=[2, 2], strides=[2, 2], pads=[0, 1, 1, 0]),
    "avg_ceil_exclude_pad": lambda: node("AveragePool", ["s"], "y", kernel_shape=[3, 3], strides=[2, 2],
                                         ceil_mode=1, count_include_pad=0),
    "global_avg": lambda: node("GlobalAveragePool", ["s"], "y"),
}


@pytest.mark.parametrize("name,layout", [(n, lay) for n in POOLS for lay in ("nhwc", "nchw")
                                         if (n, lay) != ("global_avg", "nchw")])   # that one declines
def test_pool(name, layout):
    pool = POOLS[name]()
    # the layout pass makes a short conv chain ending in a global pool NCHW: four convolutions
    deep = 4 if name == "global_avg" else 2
    m = stem_then([pool], [], hw=13, stems=deep if layout == "nhwc" else 1)
    cm, calls, _ = check(m, (pool.op_type,))
    assert len(calls) == 1 and calls[0].node.inputs[0].layout == layout


DECLINES = {   # name -> (graph, the op, the reason given)
    # ceil mode whose last window overhangs the explicit pads, counting pads: ONNX counts the
    # pads but not the overhang, which oneDNN's average cannot say
    "avg_ceil_count_pads": (lambda: stem_then([node(
        "AveragePool", ["s"], "y", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1,
        count_include_pad=1)], [], stems=2), "AveragePool", "a pool geometry oneDNN does not express exactly"),
    "max_dilated": (lambda: stem_then([node("MaxPool", ["s"], "y", kernel_shape=[2, 2], dilations=[2, 2])],
                                      [], stems=2), "MaxPool", "oneDNN offers only its reference pooling"),
    "lrn_nchw": (lambda: stem_then([node("LRN", ["s"], "y", size=3)], [], stems=1), "LRN",
                 "oneDNN offers only its reference LRN"),
}


@pytest.mark.parametrize("name", list(DECLINES))
def test_declines_with_reason(name):
    """A node oneDNN cannot take exactly (or fast) declines with its reason and runs portable."""
    make, op, reason = DECLINES[name]
    m = make()
    cm = fg.compile(m, CFG)
    (call,) = [c for c in cm._executor.binding.calls if c.node.op_type == op]
    assert not isinstance(call.kernel, DnnlKernel)
    why = [d for d in cm.report.kernels["declined"] if d["node"] == call.node.name]
    assert len(why) == 1 and why[0]["family"] == "dnnl" and why[0]["reason"].startswith(reason), why
    feeds = {"x": rnd(1, 4, 12, 12)}
    assert_outputs_close(cm.run(feeds), ort_run(m, feeds), rtol=1e-4)


def _lrn_graph(size, stems=2):
    return stem_then([node("LRN", ["s"], "y", size=size, alpha=1e-3, beta=0.75, bias=2.0)], [], stems=stems)


@needs_avx512       # AVX2: oneDNN's LRN is only its reference kernel (declined)
@pytest.mark.parametrize("size", [3, 5])
def test_lrn_odd_window(size):
    check(_lrn_graph(size), ("LRN",))


def test_lrn_even_window_declines_with_reason():
    """onnxruntime refuses an even LRN window (and onnx.reference's LRN sums one channel
    only): the oracle is ONNX's formula, window [c - floor((size-1)/2), c + ceil((size-1)/2)]."""
    size, alpha, beta, bias = 4, 1e-3, 0.75, 2.0
    m = _lrn_graph(size)
    cm = fg.compile(m, CFG)
    lrn = next(c for c in cm._executor.binding.calls if c.node.op_type == "LRN")
    assert lrn.node.inputs[0].layout == "nhwc"        # the odd sizes run on oneDNN in this layout
    assert not isinstance(lrn.kernel, DnnlKernel)
    why = [d for d in cm.report.kernels["declined"] if d["node"] == lrn.node.name]
    assert len(why) == 1 and why[0]["family"] == "dnnl" and "even" in why[0]["reason"], why
    feeds = {"x": rnd(1, 4, 12, 12)}
    # the LRN's input: the same model with its output moved to "s"
    m_s = stem_then([], [], stems=2, out="s")
    s = ort_run(m_s, feeds)["s"].astype(np.float64)
    lo, hi = (size - 1) // 2, -(-(size - 1) // 2)
    sq = np.pad(s * s, ((0, 0), (lo, hi), (0, 0), (0, 0)))
    sums = sum(sq[:, j:j + s.shape[1]] for j in range(size))
    want = (s / (bias + alpha / size * sums) ** beta).astype(np.float32)
    np.testing.assert_allclose(cm.run(feeds)["y"], want, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------- products

def _linear_graph(shape, activation, gemm):
    k, n = shape[-1], 24
    if gemm:
        nodes = [node("Gemm", ["x", "w", "b"], "h", transB=1)]
        inits = [const("w", he(n, k, seed=1)), const("b", rnd(n, seed=2, scale=0.1))]
    else:
        nodes = [node("MatMul", ["x", "w"], "m"), node("Add", ["m", "b"], "h")]
        inits = [const("w", he(n, k, seed=1).T.copy()), const("b", rnd(n, seed=2, scale=0.1))]
    if activation == "relu":
        nodes.append(node("Relu", ["h"], "y"))
    else:      # the erf form exporters write: 0.5 * h * (1 + erf(h / sqrt 2))
        nodes += [node("Div", ["h", "sq2"], "hd"), node("Erf", ["hd"], "he"), node("Add", ["he", "one"], "h1"),
                  node("Mul", ["h", "h1"], "hm"), node("Mul", ["hm", "half"], "y")]
        inits += [const("sq2", np.float32(np.sqrt(2))), const("one", np.float32(1)), const("half", np.float32(0.5))]
    return model(nodes, [("x", F, list(shape))], ["y"], inits, opset=17)


@pytest.mark.parametrize("fast_math", [False, True], ids=["exact", "fast_math"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("shape,gemm", [((6, 32), True), ((6, 32), False), ((2, 5, 32), False)],
                         ids=["gemm_2d", "matmul_2d", "matmul_3d"])
def test_linear_act(shape, gemm, activation, fast_math):
    cm, calls, _ = check(_linear_graph(shape, activation, gemm), LINEAR, fg.Config(threads=2, fast_math=fast_math))
    assert len(calls) == 1 and calls[0].node.attrs.get("activation") == activation
    # exact GELU runs after the product (oneDNN's gives NaN for +-inf); fast_math fuses it; so
    # does an exact ReLU where the epilogue is not the checked injector (AVX2's GEMM)
    exact = exact_of(calls[0].kernel)
    checked = exact_post_ops(exact.impl)
    assert (exact.after is not None) == (not fast_math and (activation == "gelu" or not checked)), exact.impl
    assert fast_of(calls[0].kernel).after is None


# --------------------------------------------------------------------------- precision

def _conv_net():
    """Three convolutions (one residual), a max pool, a global pool and a Gemm head."""
    n1, i1 = conv("s", "a", "w1", 16, 16, 3, seed=31, pads=[1] * 4)
    n2, i2 = conv("ar", "b", "w2", 16, 16, 3, seed=33, pads=[1] * 4)
    nodes = n1 + [node("Relu", ["a"], "ar")] + n2 + [
        node("Add", ["b", "s"], "r"), node("Relu", ["r"], "rr"),
        node("MaxPool", ["rr"], "p", kernel_shape=[2, 2], strides=[2, 2]),
        node("GlobalAveragePool", ["p"], "g"), node("Flatten", ["g"], "f"),
        node("Gemm", ["f", "wg", "bg"], "y", transB=1)]
    return stem_then(nodes, i1 + i2 + [const("wg", he(10, 16, seed=35)), const("bg", rnd(10, seed=36))],
                     cin=16, hw=16)


def _rel_l2(got, want):
    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert np.isfinite(g).all()
    return float(np.linalg.norm(g - w) / np.linalg.norm(w))


def _mlp(shape, hid=64):
    """Linear + relu, Linear + erf GELU, Linear: the middle ones run in the reduced precision."""
    k = shape[-1]
    nodes = [node("MatMul", ["x", "w1"], "m1"), node("Add", ["m1", "b1"], "h1"), node("Relu", ["h1"], "r1"),
             node("MatMul", ["r1", "w2"], "m2"), node("Add", ["m2", "b2"], "h"),
             node("Div", ["h", "sq2"], "hd"), node("Erf", ["hd"], "he"), node("Add", ["he", "one"], "hp"),
             node("Mul", ["h", "hp"], "hm"), node("Mul", ["hm", "half"], "g"),
             node("MatMul", ["g", "w3"], "m3"), node("Add", ["m3", "b3"], "y")]
    inits = [const("w1", he(hid, k, seed=1).T.copy()), const("b1", rnd(hid, seed=2, scale=0.1)),
             const("w2", he(hid, hid, seed=3).T.copy()), const("b2", rnd(hid, seed=4, scale=0.1)),
             const("w3", he(16, hid, seed=5).T.copy()), const("b3", rnd(16, seed=6, scale=0.1)),
             const("sq2", np.float32(np.sqrt(2))), const("one", np.float32(1)), const("half", np.float32(0.5))]
    return model(nodes, [("x", F, list(shape))], ["y"], inits, opset=17)


NETS = {"conv_net": (_conv_net, (1, 4, 16, 16), CONV), "mlp_2d": (lambda: _mlp((6, 32)), (6, 32), LINEAR),
        "mlp_3d": (lambda: _mlp((2, 5, 32)), (2, 5, 32), LINEAR)}


@pytest.mark.parametrize("net", list(NETS))
@pytest.mark.parametrize("precision,bound", [("bf16", 1e-2), ("fp16", 1e-3)])
def test_reduced_precision(precision, bound, net):
    """bf16: oneDNN's bf16 kernels (relative L2 <= 1e-2 against the fp32 oracle), or on a CPU
    without bf16 arithmetic bf16 storage computed by the float32 kernels; fp16: float16 storage
    computed by the float32 kernels (<= 1e-3)."""
    make, shape, ops = NETS[net]
    m = make()
    cm = fg.compile(m, fg.Config(threads=2, precision=precision))
    feeds = {"x": rnd(*shape, seed=7)}
    want = ort_run(m, feeds)["y"]
    got = cm.run(feeds)["y"]
    assert got.dtype == np.float32 and got.shape == want.shape
    err = _rel_l2(got, want)
    assert err <= bound, f"{precision}: relative L2 error {err:.2e} > {bound}"
    assert err > 1e-6, "as exact as fp32: the reduced precision did not take effect"
    reduced = fg.ir.DType.BFLOAT16 if precision == "bf16" else fg.ir.DType.FLOAT16
    calls = [c for c in dnnl_calls(cm, ops) if c.node.inputs[0].dtype == reduced]   # computing reduced
    assert len(calls) >= 2, [(c.node.name, c.node.inputs[0].dtype) for c in dnnl_calls(cm, ops)]
    for c in calls:
        if precision == "bf16" and BF16_ARITHMETIC:
            impl = fast_of(c.kernel).impl      # AVX512-BF16 kernels, or AMX tiles (their names say amx)
            assert "bf16" in impl or "amx" in impl, impl
        else:     # the float32 primitive over float16 (bfloat16) storage
            assert fast_of(c.kernel).output.dtype == torch.float32 and "bf16" not in fast_of(c.kernel).impl, fast_of(c.kernel).impl
    if net == "conv_net":
        assert [fast_of(c.kernel).prefill for c in calls].count(1) == 1     # the residual accumulated in place


@pytest.mark.parametrize("cin", [80, 64])
def test_a_strided_bf16_convolution_is_right_on_every_cpu(cin):
    """A 2x2 convolution at stride 2 over 80 channels (ConvNeXt-V2's downsampling) under bf16:
    oneDNN 3.2's AMX brgemm convolution computes it wrongly (relative error about 1), so the
    bind-time check declines it there (the reason says so) and the op's own kernel runs it;
    64 channels pass the check. On every CPU: within bf16's error of the fp32 oracle."""
    n1, i1 = conv("s", "d", "wd", cin, 160, 2, seed=3, strides=[2, 2])
    n2, i2 = conv("d", "y", "w2", 160, 16, 1, seed=4)
    m = stem_then(n1 + n2, i1 + i2, cin=cin, hw=28, stems=2)
    feeds = {"x": rnd(1, 4, 28, 28, seed=7)}
    cm = fg.compile(m, fg.Config(threads=2, precision="bf16"))
    assert _rel_l2(cm.run(feeds)["y"], ort_run(m, feeds)["y"]) <= 1e-2
    strided = next(c for c in cm._executor.binding.calls if c.node.op_type == "FusedConv"
                   and c.node.attrs.get("strides") == [2, 2])
    declined = [d for d in cm.report.kernels["declined"] if d["node"] == strided.node.name]
    if declined:
        assert "bind-time check" in declined[0]["reason"] and cin == 80, declined


DEPTHWISE = {   # name -> (kernel, stride, residual: None, "binary" (read) or "sum" (accumulated in place))
    "3x3": (3, 1, None), "5x5_stride2": (5, 2, None), "3x3_residual_read": (3, 1, "binary"),
    "3x3_residual_in_place": (3, 1, "sum")}


@pytest.mark.parametrize("name", list(DEPTHWISE))
def test_bf16_depthwise_convolution_with_a_float32_bias(name):
    """A bf16 depthwise convolution with its (float32) bias, relu and optionally a residual: on a
    CPU with bf16 arithmetic it runs oneDNN's brgemm depthwise kernel (``brdgmm``, offered only
    without a float32 bias argument: the bias is its first post-op, the residual's operand the
    second); its output is the float64 arithmetic on the same bf16 values, bias, residual and
    relu, rounded once (a dropped bias or operands read from the wrong post-op are far off)."""
    k, stride, residual = DEPTHWISE[name]
    c, hw = 32, 14
    n, i = conv("s", "d", "wd", c, c, k, seed=5, group=c, pads=[k // 2] * 4, strides=[stride] * 2)
    head, ih = conv("q" if residual == "binary" else "r", "y", "wh", c, 8, 1, seed=7)   # the logits (float32)
    tail = [node("Relu", ["d"], "r")] + head
    if residual:
        stem2, i2 = conv("s", "t", "wt", c, c, 1, seed=9)
        tail = stem2 + [node("Add", ["d", "t"], "a"), node("Relu", ["a"], "r")] + head
        if residual == "binary":        # the residual still read after (in bf16): not summed in place
            tail.insert(-1, node("Mul", ["r", "t"], "q"))
        i += i2
    m = stem_then(n + tail, i + ih, cin=c, hw=hw)
    feeds = {"x": rnd(1, 4, hw, hw, seed=8)}
    cm = fg.compile(m, fg.Config(threads=2, precision="bf16"))
    assert _rel_l2(cm.run(feeds)["y"], ort_run(m, feeds)["y"]) <= 1e-2
    calls = cm._executor.binding.calls
    (dw,) = [c_ for c_ in calls if c_.node.op_type == "FusedConv" and c_.node.attrs.get("group") == c]
    kernel = fast_of(dw.kernel)
    if BF16_ARITHMETIC and isinstance(kernel, DnnlKernel) and "avx512" in kernel.impl:
        assert kernel.impl.startswith("brdgmm"), kernel.impl
        if residual:
            assert kernel.prefill == (1 if residual == "sum" else None)
    seen = {}

    def capture(j, phase, outs):
        if phase == 1:
            for v, t in zip(calls[j].node.outputs, outs):
                seen[id(v)] = t.clone()
    out = cm.run(feeds, hook=capture)
    x = seen[id(dw.node.inputs[0])].double()
    w = torch.from_numpy(he(c, 1, k, k, seed=5)).to(torch.bfloat16).double()    # the model's, rounded once
    b = torch.from_numpy(rnd(c, seed=6, scale=0.1)).double()
    want = torch.nn.functional.conv2d(x, w, b, stride=stride, padding=k // 2, groups=c)
    if residual:
        want = want + seen[id(dw.node.inputs[3])].double()
    want = want.relu()
    got = seen[id(dw.node.outputs[0])].double()
    assert got.shape == want.shape and dw.node.outputs[0].dtype.to_torch() == torch.bfloat16
    err = (got - want).abs()
    assert (err <= want.abs() * 2.0 ** -8 + 1e-5).all(), float(err.max())
    assert np.isfinite(out["y"]).all()


CHECK_GEOMETRIES = {    # name -> (input shape, weight shape, (strides, dilations, begin, end, groups))
    "asymmetric_pads_stride2": ((1, 8, 9, 11), (6, 8, 3, 3), ([2, 2], [1, 1], [0, 1], [2, 1], 1)),
    "groups2_dilation2": ((1, 8, 12, 12), (8, 4, 3, 3), ([1, 2], [2, 2], [2, 2], [2, 2], 2)),
    "one_dimensional": ((1, 8, 20), (6, 8, 5), ([1, 3], [1, 1], [0, 1], [0, 1], 1)),
}


@pytest.mark.parametrize("name", list(CHECK_GEOMETRIES))
def test_the_bind_time_check_accepts_a_right_kernel_and_refuses_a_wrong_one(name):
    """``conv._checked_error`` against kernels with known answers: ATen's own convolution of the
    bf16 input (right: the error is bf16's rounding of the output) and the same with the
    input's first column dropped (wrong by a shift: far above the tolerance)."""
    from fusegraph.runtime.backends.cpu.dnnl.conv import CHECK_TOLERANCE, _checked_error
    xs, wshape, (s, d, begin, end, g) = CHECK_GEOMETRIES[name]
    w = torch.from_numpy(he(*wshape, seed=5)).to(torch.bfloat16)
    b = torch.from_numpy(rnd(wshape[0], seed=6, scale=0.1))
    one_d = len(xs) == 3

    def reference(x, shift=0):
        x4, w4 = (x.float().unsqueeze(2), w.float().unsqueeze(2)) if one_d else (x.float(), w.float())
        x4 = torch.nn.functional.pad(x4[..., shift:], (begin[1], end[1] + shift, begin[0], end[0]))
        y = torch.nn.functional.conv2d(x4, w4, b, stride=tuple(s), dilation=tuple(d), groups=g).relu_()
        return (y.squeeze(2) if one_d else y).to(torch.bfloat16)
    ys = tuple(reference(torch.zeros(xs, dtype=torch.bfloat16)).shape)
    strides = torch.empty(xs).stride()
    args = (xs, ys, strides, False, w, b, (s, d, begin, end, g), "relu", [])
    assert _checked_error(reference, *args) < 1e-2
    assert _checked_error(lambda x: reference(x, shift=1), *args) > CHECK_TOLERANCE


# --------------------------------------------------------------------------- elementwise chains

BF16 = fg.Config(threads=2, precision="bf16")


def _chain_net(relu=True, seed=21):
    """1x1 convolution, Concat, a pre-activation BatchNorm (Mul / Add by per-channel constants,
    as ONNX exports it after a Concat) and its ReLU, then a 1x1 convolution: under bf16 the
    chain runs in bfloat16 (the last convolution stays float32 as the logits), and a NaN stays
    at its pixel through the 1x1 convolutions."""
    # no biases: the oneDNN convolutions add a float32 bias (precision_policy.FLOAT32_BIAS), the
    # portable ones a rounded one; this compares the chain's kernels
    n1, i1 = conv("x", "c", "w1", 4, 8, 1, seed=seed, bias=False)
    chain = [node("Mul", ["cat", "bn_s"], "bn_m"), node("Add", ["bn_m", "bn_b"], "bn_a" if relu else "h")]
    if relu:
        chain.append(node("Relu", ["bn_a"], "h"))
    n2, i2 = conv("h", "y", "w2", 16, 8, 1, seed=seed + 1, bias=False)
    inits = [const("bn_s", rnd(16, 1, 1, seed=seed + 2, scale=0.5)), const("bn_b", rnd(16, 1, 1, seed=seed + 3))]
    return model(n1 + [node("Concat", ["c", "c"], "cat", axis=1)] + chain + n2, [("x", F, [1, 4, 6, 6])], ["y"],
                 i1 + inits + i2, opset=17)


@needs_bf16
@pytest.mark.parametrize("relu", [True, False])
def test_bf16_chain_as_one_binary_primitive(relu):
    """The bfloat16 chain is one binary primitive with post-ops: within bf16 error of
    onnxruntime's float32, and equal (float32 arithmetic, one rounding) to the op's own kernel."""
    m = _chain_net(relu)
    fast = fg.compile(m, BF16)
    (c,) = dnnl_calls(fast, ("ElementwiseChain",))
    assert c.node.outputs[0].dtype == fg.ir.DType.BFLOAT16 and c.node.outputs[0].layout == "nhwc"
    assert (fast_of(c.kernel).after is None) == (fast_of(c.kernel).impl.startswith("jit:"))
    portable = fg.compile(m, fg.Config(threads=2, precision="bf16", cpu_kernels="portable"))
    feeds = {"x": rnd(1, 4, 6, 6)}
    got = fast.run(feeds)["y"]
    assert _rel_l2(got, ort_run(m, feeds)["y"]) < 2e-2
    assert _rel_l2(got, portable.run(feeds)["y"]) < 1e-5


def test_float32_chain_declines_with_reason():
    cm = fg.compile(_chain_net(), CFG)
    (c,) = [c for c in cm._executor.binding.calls if c.node.op_type == "ElementwiseChain"]
    why = [d["reason"] for d in cm.report.kernels["declined"] if d["node"] == c.node.name]
    assert why and "float32" in why[0] and not isinstance(fast_of(c.kernel), DnnlKernel)


@needs_bf16
def test_bf16_chain_keeps_nan_and_infinities():
    """ONNX's Relu(NaN) is NaN: oneDNN's relu post-op would give 0 (then the last convolution a
    finite number at that pixel), so the chain's ReLU is the NaN-keeping form."""
    m = _chain_net(seed=31)
    cm = fg.compile(m, BF16)
    dnnl_calls(cm, ("ElementwiseChain",))
    x = rnd(1, 4, 6, 6)
    x[0, 0, 1, 1], x[0, 2, 3, 4] = np.nan, np.inf
    got, want = cm.run({"x": x})["y"], ort_run(m, {"x": x})["y"]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[0, :, 1, 1]).all()
    finite = np.isfinite(want)
    np.testing.assert_array_equal(np.isfinite(got), finite)
    assert _rel_l2(got[finite], want[finite]) < 2e-2


# --------------------------------------------------------------------------- NaN / Inf, streams

def test_exact_max_pool_propagates_nan_and_keeps_minus_inf():
    """A NaN anywhere in a window gives NaN, a window of -inf gives -inf (numpy's max over the
    2x2 windows is the oracle: onnxruntime's and onnx.reference's answer for a window mixing
    NaN and numbers depends on the element order; on the other windows onnxruntime agrees),
    where oneDNN's max pool alone would give a number and -FLT_MAX."""
    m = model([node("MaxPool", ["x"], "y", kernel_shape=[2, 2], strides=[2, 2])],
              [("x", F, [1, 8, 8, 8])], ["y"], [], opset=17)
    cm = fg.compile(m, CFG)
    (pool,) = dnnl_calls(cm, ("MaxPool",))
    assert isinstance(pool.kernel, Guarded) and exact_of(pool.kernel).after is not None

    def oracle(x):
        return x.reshape(1, 8, 4, 2, 4, 2).max(axis=(3, 5))

    x = rnd(1, 8, 8, 8)
    x[0, 0, 0, 1] = np.nan                  # a NaN among numbers
    x[0, 2, 4:6, 4:6] = np.nan              # a window of NaN
    x[0, 1, 2:4, 2:4] = -np.inf             # a window of -inf
    x[0, 3, 0, 0] = np.inf
    got = cm.run({"x": x})["y"]
    assert np.isnan(got[0, 0, 0, 0]) and np.isnan(got[0, 2, 2, 2]) and np.isneginf(got[0, 1, 1, 1])
    assert np.isposinf(got[0, 3, 0, 0])
    np.testing.assert_array_equal(got, oracle(x))   # NaN where NaN, infinities and numbers equal
    ort = ort_run(m, {"x": x})["y"]
    ort[0, 0, 0, 0] = np.nan
    np.testing.assert_array_equal(got, ort)
    clean = rnd(1, 8, 8, 8, seed=1)                 # the next finite input: oneDNN's own result
    np.testing.assert_array_equal(cm.run({"x": clean})["y"], oracle(clean))


def test_exact_max_pool_channels_last_kernel_on_nan():
    """The same check in a channels-last pool (after two convolutions), its kernel called on a
    channels-last tensor holding NaN and -inf windows: the recomputation lands in the output."""
    m = stem_then([node("MaxPool", ["s"], "y", kernel_shape=[2, 2], strides=[2, 2])], [], hw=8, stems=2)
    cm = fg.compile(m, CFG)
    (pool,) = dnnl_calls(cm, ("MaxPool",))
    kernel = exact_of(pool.kernel)
    slot = kernel.inputs[0]
    assert pool.node.inputs[0].layout == "nhwc" and slot.strides == (8 * 64, 1, 64, 8)
    x = torch.randn(1, 8, 8, 8, generator=torch.Generator().manual_seed(0)).contiguous(
        memory_format=torch.channels_last)
    x[0, 3, 0, 1] = float("nan")
    x[0, 5, 2:4, 4:6] = float("-inf")
    want = x.numpy().reshape(1, 8, 4, 2, 4, 2).max(axis=(3, 5))
    out = torch.empty_strided(kernel.output.shape, kernel.output.strides)
    got = kernel(x, out=out)
    assert got.data_ptr() == out.data_ptr() and np.isnan(want[0, 3, 0, 0]) and np.isneginf(want[0, 5, 1, 2])
    np.testing.assert_array_equal(out.numpy(), want)
    x = x.nan_to_num(0.0, 0.0, 0.0)
    kernel(x, out=out)
    np.testing.assert_array_equal(out.numpy(), x.numpy().reshape(1, 8, 4, 2, 4, 2).max(axis=(3, 5)))


def test_fast_math_max_pool_runs_without_the_check():
    direct = model([node("MaxPool", ["x"], "y", kernel_shape=[2, 2], strides=[2, 2])],
                   [("x", F, [1, 8, 8, 8])], ["y"], [], opset=17)
    cm = fg.compile(direct, fg.Config(threads=2, fast_math=True))
    (pool,) = dnnl_calls(cm, ("MaxPool",))
    assert not isinstance(pool.kernel, Guarded) and pool.kernel.after is None
    x = rnd(1, 8, 8, 8)
    x[0, 0, 0, 0] = np.nan
    assert cm.run({"x": x})["y"].shape == (1, 8, 4, 4)


def _two_branch_net():
    """Two branches of two 32-channel convolutions each: the stream planner keeps two streams."""
    nodes, inits = [], []
    for br, seed in (("a", 40), ("b", 50)):
        src = "s"
        for d in range(2):
            n, i = conv(src, f"{br}{d}", f"w{br}{d}", 32, 32, 3, seed=seed + d, pads=[1] * 4)
            nodes += n + [node("Relu" if br == "a" else "Sigmoid", [f"{br}{d}"], f"{br}{d}r")]
            inits += i
            src = f"{br}{d}r"
    nodes += [node("MaxPool", ["a1r"], "ap", kernel_shape=[2, 2], strides=[2, 2]),
              node("AveragePool", ["b1r"], "bp", kernel_shape=[2, 2], strides=[2, 2]),
              node("Concat", ["ap", "bp"], "y", axis=1)]
    return stem_then(nodes, inits, cin=32, hw=16)


def test_two_streams_bitwise_identical():
    m = _two_branch_net()
    feeds = {"x": rnd(1, 4, 16, 16, seed=9)}
    one = fg.compile(m, CFG)
    two = fg.compile(m, fg.Config(threads=2, streams=2))
    assert two.report.streams.num_streams == 2, two.report.streams.candidates
    for cm in (one, two):
        assert len(dnnl_calls(cm, CONV)) == 5
        assert len(dnnl_calls(cm, ("MaxPool", "AveragePool"))) == 2
    a = one.run(feeds)
    assert_outputs_close(a, ort_run(m, feeds), rtol=1e-4)
    for _ in range(2):
        b = two.run(feeds)
        for k in a:
            assert np.array_equal(a[k], b[k]), f"{k}: streams=2 differs from streams=1 " \
                                               f"(max {np.abs(a[k] - b[k]).max():.3g})"


# --------------------------------------------------------------------------- concat

@needs_bf16
@pytest.mark.parametrize("axis", [1, 2, -1], ids=["channels", "rows", "columns"])
def test_bf16_concat_is_one_primitive_moving_the_same_bits(axis, monkeypatch):
    """Two channels-last convolutions' outputs joined, then a convolution: under bf16 the join
    is one oneDNN primitive, bit for bit the op's own kernel (torch.cat); float32 joins
    decline with their reason."""
    from fusegraph.runtime.backends.cpu.dnnl import DnnlKernels
    n1, i1 = conv("s", "a", "wa", 8, 6, 3, seed=31, pads=[1] * 4)
    n2, i2 = conv("s", "b", "wb", 8, 10 if axis == 1 else 6, 1, seed=32)
    n3, i3 = conv("cat", "y", "wc", 16 if axis == 1 else 6, 4, 1, seed=33)
    m = stem_then(n1 + n2 + [node("Concat", ["a", "b"], "cat", axis=axis)] + n3, i1 + i2 + i3)
    bf16 = fg.compile(m, fg.Config(threads=2, precision="bf16"))
    (call,) = [c for c in bf16._executor.binding.calls if c.node.op_type == "Concat"]
    assert isinstance(call.kernel, DnnlKernel) and not call.kernel.impl.startswith("ref")
    assert call.node.inputs[0].layout == "nhwc" and call.node.inputs[0].dtype.name == "BFLOAT16"
    real = DnnlKernels.kernel
    monkeypatch.setattr(DnnlKernels, "kernel", lambda self, ctx, opdef, key, exact:
                        None if key == ("", "Concat") else real(self, ctx, opdef, key, exact))
    own = fg.compile(m, fg.Config(threads=2, precision="bf16"))
    assert not any(isinstance(c.kernel, DnnlKernel) for c in own._executor.binding.calls if c.node.op_type == "Concat")
    x = {"x": rnd(1, 4, 12, 12, seed=3)}
    np.testing.assert_array_equal(bf16.run(x)["y"], own.run(x)["y"])
    monkeypatch.undo()
    fp32 = fg.compile(m, CFG)
    reasons = [d["reason"] for d in fp32.report.kernels["declined"] if d["op"] == "Concat"]
    assert reasons and "float32" in reasons[0]
