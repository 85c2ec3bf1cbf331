"""``runtime/backends/cpu/finite.py`` and ``guard_plan.py``: the input magnitudes under which a guarded node cannot see NaN or an
infinity, checked on small graphs against bounds computed by hand, and on the transfer
rules that reset bounds (clip, LayerNorm) or make them unknown (an op the table does not
know); plus the guard at run time (``runtime/backends/cpu/guard.py``): finite feeds run the
fast kernels and never make the exact ones, a NaN or a too-large feed runs the exact ones,
and a loaded model derives the same limits from its packed weights."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

import fusegraph as fg
from fusegraph.ir import DType, Graph
from fusegraph.runtime.backends.cpu.finite import FLOAT32_MAX, GRID, Fact, propagate, tensor_fact
from fusegraph.runtime.backends.cpu.guard_plan import fast_limits, guard_plan
from fusegraph.runtime.backends.cpu.dnnl import available
from fusegraph.runtime.backends.cpu.guard import Guarded, Measuring
from cpu_isa import needs_bf16
from oracle import ort_run

F = TensorProto.FLOAT


def _conv_graph(activation="hardtanh", params=(0.0, 6.0), w_value=0.5, pool=True, extra=None):
    """x [1, 4, 6, 6] -> FusedConv(3x3, every weight w_value, bias 1) -> [extra] -> MaxPool."""
    g = Graph("g")
    x = g.add_input("x", DType.FLOAT, (1, 4, 6, 6))
    w = g.add_constant("w", torch.full((4, 4, 3, 3), w_value))
    b = g.add_constant("b", torch.ones(4))
    attrs = {"pads": [1, 1, 1, 1], "activation": activation, "activation_params": list(params)}
    y = _out(g.add_node("FusedConv", [x, w, b], attrs=attrs, domain="fusegraph", name="conv"), (1, 4, 6, 6))
    if extra:
        y = _out(g.add_node(extra, [y], name="extra"), (1, 4, 6, 6))
    if pool:
        y = _out(g.add_node("MaxPool", [y], attrs={"kernel_shape": [2, 2], "strides": [2, 2]}, name="pool"),
                 (1, 4, 3, 3))
    g.outputs.append(y)
    return g


def _out(node, shape):
    v = node.outputs[0]
    v.dtype, v.shape = DType.FLOAT, shape
    return v


def test_conv_bound_by_hand():
    g = _conv_graph(activation="", params=())
    facts = propagate(g, 2.0)
    y = next(n for n in g.nodes if n.name == "conv").outputs[0]
    assert facts[id(y)].bound == pytest.approx(2.0 * 0.5 * 36 + 1.0)   # M * max|w| * (4*3*3 terms) + |b|
    assert facts[id(y)].finite


def test_clip_resets_the_bound_and_keeps_nan_flag_off():
    g = _conv_graph()
    lim = fast_limits(g)
    # after the clip the pool's input is in [0, 6] whatever the feed; the conv's own
    # pre-activation overflows only for feeds near float32's largest (0.5 * 36 terms)
    assert lim == {"conv": 1e32, "pool": math.inf}


def test_unclipped_pool_limit_is_where_the_conv_would_overflow():
    g = _conv_graph(activation="relu", params=(), w_value=1e20)
    lim = fast_limits(g)
    # the pre-activation bound is M * 1e20 * 36 + 1: below 1e38 up to M = 1e16, not at 1e32;
    # the relu (guarded too: oneDNN's maps NaN to 0) needs the same
    assert lim == {"conv": 1e16, "pool": 1e16}
    assert max(m for m in GRID if m * 1e20 * 36 + 1 < 1e38) == 1e16


def test_unknown_op_makes_the_pool_unguarded():
    g = _conv_graph(activation="relu", params=(), extra="Log")     # log of a bounded value: NaN possible
    assert "pool" not in fast_limits(g)


def test_float32_max_input_admitted_only_through_a_reset():
    g = _conv_graph(activation="relu", params=())
    assert fast_limits(g)["pool"] < FLOAT32_MAX     # a conv of huge inputs overflows: finite limit
    assert fast_limits(_conv_graph())["pool"] == math.inf


def _clip_model():
    rng = np.random.default_rng(0)
    nodes, inits, src = [], [], "x"
    for i in range(3):       # three conv + clip(0, 6) blocks: the layout pass goes channels-last
        w = (rng.standard_normal((8, 8, 3, 3)) * 0.2).astype(np.float32)
        inits += [helper.make_tensor(f"w{i}", F, w.shape, w.flatten()), helper.make_tensor(f"b{i}", F, [8], [0.1] * 8)]
        nodes += [helper.make_node("Conv", [src, f"w{i}", f"b{i}"], [f"c{i}"], pads=[1] * 4),
                  helper.make_node("Clip", [f"c{i}", "lo", "hi"], [f"r{i}"])]
        src = f"r{i}"
    nodes.append(helper.make_node("MaxPool", [src], ["y"], kernel_shape=[2, 2], strides=[2, 2]))
    inits += [helper.make_tensor("lo", F, [], [0.0]), helper.make_tensor("hi", F, [], [6.0])]
    graph = helper.make_graph(nodes, "clips", [helper.make_tensor_value_info("x", F, [1, 8, 12, 12])],
                              [helper.make_tensor_value_info("y", F, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.skipif(not available(), reason="the oneDNN library does not load here")
def test_guard_runs_fast_on_finite_feeds_and_exact_on_nan(tmp_path):
    m = _clip_model()
    cm = fg.compile(m, fg.Config(threads=2, thread_policy="fixed"))
    guarded = [c.kernel for c in cm._executor.binding.calls if isinstance(c.kernel, Guarded)]
    assert len(guarded) == 4 and sorted(k.limit for k in guarded) == [1e32] + [math.inf] * 3
    x = np.random.default_rng(1).standard_normal((1, 8, 12, 12)).astype(np.float32) * 5
    np.testing.assert_allclose(cm.run({"x": x})["y"], ort_run(m, {"x": x})["y"], rtol=1e-4, atol=1e-5)
    assert all(k._exact is None for k in guarded)               # the exact kernels were never made
    x[0, 0, 3, 3] = np.nan
    # oracle: the portable kernels (torch's clamp and max pool propagate NaN, as ONNX's
    # definitions do; onnxruntime's Clip maps NaN to a bound)
    got = cm.run({"x": x})["y"]
    want = fg.compile(m, fg.Config(threads=2, cpu_kernels="portable", thread_policy="fixed")).run({"x": x})["y"]
    assert all(k._exact is not None for k in guarded)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got).any()
    ok = ~np.isnan(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=1e-4, atol=1e-5)
    path = tmp_path / "c.fgm"
    cm.save(path)
    loaded = fg.load(path)          # limits from the packed bytes: the same as the compile's
    assert {c.node.name: c.kernel.limit for c in loaded._executor.binding.calls if isinstance(c.kernel, Guarded)} \
        == {c.node.name: c.kernel.limit for c in cm._executor.binding.calls if isinstance(c.kernel, Guarded)}


@pytest.mark.skipif(not available(), reason="the oneDNN library does not load here")
def test_fast_math_needs_no_guard():
    cm = fg.compile(_clip_model(), fg.Config(threads=2, fast_math=True, thread_policy="fixed"))
    assert not any(isinstance(c.kernel, Guarded) for c in cm._executor.binding.calls)


def test_a_cast_keeps_the_bound_and_a_reduced_type_rounds_up():
    from fusegraph.runtime.backends.cpu.finite import ROUNDING
    g = Graph("g")
    x = g.add_input("x", DType.FLOAT, (4,))
    to_bf16 = _out(g.add_node("Cast", [x], attrs={"to": int(DType.BFLOAT16)}, name="bf"), (4,))
    to_bf16.dtype = DType.BFLOAT16
    to_f16 = _out(g.add_node("Cast", [x], attrs={"to": int(DType.FLOAT16)}, name="h"), (4,))
    to_f16.dtype = DType.FLOAT16
    g.outputs += [to_bf16, to_f16]
    small, large = propagate(g, 10.0), propagate(g, 1e5)
    assert small[id(to_bf16)].bound == pytest.approx(10.0 * ROUNDING) and small[id(to_bf16)].finite
    assert small[id(to_f16)].finite
    assert large[id(to_bf16)].finite and not large[id(to_f16)].finite     # float16 overflows above 65504


@pytest.mark.skipif(not available(), reason="the oneDNN library does not load here")
def test_a_bf16_model_runs_its_fast_kernels_and_stays_exact_on_nan():
    """Through the precision pass's Casts the bounds carry on: the bf16 model's clip and pool
    kernels are guarded too (before, a Cast made every bound unknown and every one exact)."""
    m = _clip_model()
    cm = fg.compile(m, fg.Config(threads=2, precision="bf16", thread_policy="fixed"))
    guarded = [c.kernel for c in cm._executor.binding.calls if isinstance(c.kernel, Guarded)]
    assert len(guarded) >= 3
    x = np.random.default_rng(1).standard_normal((1, 8, 12, 12)).astype(np.float32) * 5
    got = cm.run({"x": x})["y"]
    want = ort_run(m, {"x": x})["y"]
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 2e-2
    assert all(k._exact is None for k in guarded)
    x[0, 0, 3, 3] = np.nan
    got = cm.run({"x": x})["y"]
    want = fg.compile(m, fg.Config(threads=2, precision="bf16", cpu_kernels="portable", thread_policy="fixed")).run({"x": x})["y"]
    assert all(k._exact is not None for k in guarded)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got).any()


def _skip_layer_norm_model(d=64):
    """x + r -> LayerNormalization (the skip_layer_norm fusion makes one SkipLayerNorm)."""
    rng = np.random.default_rng(2)
    g, b, r = (rng.standard_normal(s).astype(np.float32) for s in ((d,), (d,), (1, 16, d)))
    nodes = [helper.make_node("Add", ["x", "r"], ["s"]),
             helper.make_node("LayerNormalization", ["s", "g", "b"], ["y"], axis=-1, epsilon=1e-5)]
    inits = [helper.make_tensor(n, F, t.shape, t.flatten()) for n, t in (("g", g), ("b", b), ("r", r))]
    graph = helper.make_graph(nodes, "skip_ln", [helper.make_tensor_value_info("x", F, [1, 16, d])],
                              [helper.make_tensor_value_info("y", F, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("op,shape", [("LayerNorm", (1, 4, 64)), ("ChannelLayerNorm", (1, 64, 4))])
def test_layer_norm_limit_is_where_its_squared_deviations_overflow(op, shape):
    """Over the last axis, or over the channels (axis 1) of channels-last data: wav2vec2's
    feature encoder, ConvNeXt."""
    g = Graph("ln", opset={"": 17, "fusegraph": 1})
    x = g.add_input("x", DType.FLOAT, shape)
    n = g.add_node(op, [x, g.add_constant("g", torch.ones(64)), g.add_constant("b", torch.zeros(64))],
                   domain="fusegraph", attrs={"epsilon": 1e-5}, name="ln")
    n.outputs[0].dtype, n.outputs[0].shape = DType.FLOAT, shape
    g.outputs.append(n.outputs[0])
    # 4 * 64 * M^2 < 1e38 for M <= 1e16, not for 1e32
    assert fast_limits(g) == {"ln": 1e16}


def _channel_norm_model():
    """x [1, 8, 40] -> Conv1d -> Transpose -> LayerNormalization -> Transpose -> Conv1d: a layer
    norm over the channels between two convolutions (the passes make one ChannelLayerNorm on
    channels-last data)."""
    rng = np.random.default_rng(3)
    w1 = (rng.standard_normal((32, 8, 3)) * 0.3).astype(np.float32)
    w2 = (rng.standard_normal((32, 32, 3)) * 0.1).astype(np.float32)
    gamma, beta = rng.standard_normal(32).astype(np.float32), rng.standard_normal(32).astype(np.float32)
    t = lambda n, a: helper.make_tensor(n, F, a.shape, a.flatten())            # noqa: E731
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1]),
             helper.make_node("Transpose", ["c"], ["t"], perm=[0, 2, 1]),
             helper.make_node("LayerNormalization", ["t", "g", "b"], ["n"], axis=-1, epsilon=1e-5),
             helper.make_node("Transpose", ["n"], ["u"], perm=[0, 2, 1]),
             helper.make_node("Conv", ["u", "w2"], ["y"], pads=[1, 1])]
    graph = helper.make_graph(nodes, "channel_norm", [helper.make_tensor_value_info("x", F, [1, 8, 40])],
                              [helper.make_tensor_value_info("y", F, None)],
                              [t("w1", w1), t("w2", w2), t("g", gamma), t("b", beta)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


# (model, guarded op, input shape, a row / pixel whose float32 sum of squares overflows and its
# value, a NaN's place and the row / pixel it makes NaN, the places compared with the exact form)
LAYER_NORM_CASES = {
    "last axis": (_skip_layer_norm_model, "SkipLayerNorm", (1, 16, 64), np.s_[0, 3], 3e37, np.s_[0, 5, 7],
                  np.s_[0, 5], np.s_[0, 3]),
    "channels": (_channel_norm_model, "ChannelLayerNorm", (1, 8, 40), np.s_[0, :, 3], 3e20, np.s_[0, 2, 30],
                 np.s_[0, :, 30], np.s_[0, :, 1:6]),
}


@pytest.mark.skipif(not available(), reason="the oneDNN library does not load here")
@pytest.mark.parametrize("case", sorted(LAYER_NORM_CASES))
def test_layer_norm_runs_without_its_check_while_rows_cannot_overflow(case):
    build, op, shape, big, value, nan, nan_row, near = LAYER_NORM_CASES[case]
    m = build()
    cm = fg.compile(m, fg.Config(threads=2, thread_policy="fixed"))
    guarded = [c for c in cm._executor.binding.calls if isinstance(c.kernel, Guarded)]
    assert [(c.node.op_type, c.kernel.limit) for c in guarded] == [(op, 1e16)]
    kernel = guarded[0].kernel
    assert getattr(kernel.fast, "portable", None) is None and kernel.fast.impl != "portable"   # the primitive
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32) * 5
    np.testing.assert_allclose(cm.run({"x": x})["y"], ort_run(m, {"x": x})["y"], rtol=1e-4, atol=1e-4)
    assert kernel._exact is None
    x[big] = value          # its float32 sum of squares overflows: the exact kernel's float64 rows
    x[nan] = np.nan         # NaN stays NaN where it reaches
    got = cm.run({"x": x})["y"]
    assert kernel._exact is not None
    want = fg.compile(m, fg.Config(threads=2, cpu_kernels="portable", thread_policy="fixed")).run({"x": x})["y"]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[nan_row]).all() and np.isfinite(got[big]).all()
    np.testing.assert_allclose(got[near], want[near], rtol=1e-4, atol=1e-4)


def _measured_chain_model(divisor: float):
    """x [1, 8, 128, 128] -> 1x1 conv -> Div by ``divisor`` (folded into the weights) -> Elu (an
    op the bound analysis does not know: no limit follows from the feeds' magnitude past it)
    -> Concat with itself (262144 elements) -> a
    pre-activation BatchNorm (Mul, Add) and its Relu -> 1x1 conv with Relu. Channel 0's
    BatchNorm scale is 0: an infinity there becomes NaN, which ONNX's Relu keeps."""
    rng = np.random.default_rng(5)
    w1 = (rng.standard_normal((8, 8, 1, 1)) * 0.5).astype(np.float32)
    w2 = (rng.standard_normal((8, 16, 1, 1)) * 0.3).astype(np.float32)
    s = rng.uniform(0.5, 1.5, (16, 1, 1)).astype(np.float32)
    s[0] = 0.0
    b = rng.standard_normal((16, 1, 1)).astype(np.float32)
    t = lambda n, a: helper.make_tensor(n, F, a.shape, a.flatten())            # noqa: E731
    inits = [t("w1", w1), t("w2", w2), t("s", s), t("b", b), helper.make_tensor("d", F, [], [divisor])]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"]), helper.make_node("Div", ["c", "d"], ["q"]),
             helper.make_node("Elu", ["q"], ["e"]), helper.make_node("Concat", ["e", "e"], ["cat"], axis=1),
             helper.make_node("Mul", ["cat", "s"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["h"]), helper.make_node("Conv", ["h", "w2"], ["c2"]),
             helper.make_node("Relu", ["c2"], ["y"])]
    graph = helper.make_graph(nodes, "measured", [helper.make_tensor_value_info("x", F, [1, 8, 128, 128])],
                              [helper.make_tensor_value_info("y", F, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.skipif(not available(), reason="the oneDNN library does not load here")
@pytest.mark.parametrize("precision", [pytest.param("bf16", marks=needs_bf16), "fp32"])
@pytest.mark.parametrize("divisor", [2.0, 1e-38], ids=["finite", "overflows_inside"])
def test_a_measured_value_admits_the_fast_kernels_downstream_and_catches_what_overflows_inside(divisor, precision):
    """Nothing follows from the feeds' magnitude past the Elu, so the Elu measures its output
    after every call (the join of it with itself is bounded by that), and the chain and the
    convolution after it run their fast relu while it is finite (a float32 chain has no fast
    form). Divided by 1e-38 the finite feed overflows inside: the measured infinity sends them
    to their exact kernels, and the NaN that 0 * inf makes in channel 0 comes out as the
    portable kernels give it (the fast relu would have made it 0)."""
    m = _measured_chain_model(divisor)
    cm = fg.compile(m, fg.Config(threads=2, precision=precision, thread_policy="fixed"))
    calls = {c.node.op_type: c.kernel for c in cm._executor.binding.calls}
    elu, chain, conv = calls["Elu"], calls["ElementwiseChain"], calls["FusedConv"]
    assert isinstance(elu, Measuring) and elu.measures == (0,)
    assert isinstance(conv, Guarded) and not conv.measures and conv.limit >= 1e8
    assert isinstance(chain, Guarded) == (precision == "bf16")
    x = np.random.default_rng(2).standard_normal((1, 8, 128, 128)).astype(np.float32)
    got = cm.run({"x": x})["y"]
    want = fg.compile(m, fg.Config(threads=2, precision=precision, cpu_kernels="portable", thread_policy="fixed")).run({"x": x})["y"]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    guarded = [k for k in (chain, conv) if isinstance(k, Guarded)]
    if divisor == 2.0:
        assert np.isfinite(want).all() and np.linalg.norm(got - want) <= 1e-5 * np.linalg.norm(want)
        assert all(k._exact is None for k in guarded)       # fast all along, never made
    else:                # (values at float32's edge may round to inf in one kernel and not the other)
        assert all(k._exact is not None for k in guarded)
        assert np.isnan(got).any()


def _chain(g, src, name, shape):
    steps = {"steps": ["Mul i0 i1", "Add p i2", "Relu p"]}
    scale, shift = g.add_constant(f"{name}_s", torch.full((shape[1], 1, 1), 0.5)), \
        g.add_constant(f"{name}_b", torch.ones(shape[1], 1, 1))
    return _out(g.add_node("ElementwiseChain", [src, scale, shift], attrs=steps, domain="fusegraph", name=name),
                shape)


def test_a_measured_value_bounds_every_reader_and_everything_downstream():
    """u comes from an op the analysis does not know. chain1 reads it, so u is measured where
    it is made; conv1 after chain1, a join reading u again, chain2 after the join and chain3
    (which may run before chain1) are all bounded by that one measurement."""
    g = Graph("g")
    shape, wide = (1, 16, 128, 128), (1, 32, 128, 128)
    x = g.add_input("x", DType.FLOAT, shape)
    u = _out(g.add_node("Elu", [x], name="unknown"), shape)
    h1 = _chain(g, u, "chain1", shape)
    w = g.add_constant("w", torch.full((16, 16, 1, 1), 0.1))
    c1 = _out(g.add_node("FusedConv", [h1, w], attrs={"activation": "relu"}, domain="fusegraph", name="conv1"),
              shape)
    cat = _out(g.add_node("Concat", [u, c1], attrs={"axis": 1}, name="join"), wide)
    g.outputs += [_chain(g, cat, "chain2", wide), _chain(g, u, "chain3", shape)]
    plan = guard_plan(g, measure_below=1e4)
    assert plan.measured == {"unknown": (0,)}
    assert all(plan.limits[n] >= 1e16 for n in ("chain1", "conv1", "chain2", "chain3"))
    assert guard_plan(g).measured == {} and "chain2" not in guard_plan(g).limits


def test_a_join_is_bounded_by_measuring_its_parts_each_once():
    """A DenseNet block: each layer's join appends a new part to the previous join, and a
    BatchNorm-ReLU chain and a convolution read it. The parts are measured where they are made
    (through the chain and the joins), each once; neither the chains' outputs nor the growing
    joins are measured."""
    g = Graph("g")
    part = (1, 16, 64, 64)
    x = g.add_input("x", DType.FLOAT, part)
    joined = _out(g.add_node("Elu", [x], name="stem"), part)
    for k in range(4):
        width = (1, 16 * (k + 1), 64, 64)
        h = _chain(g, joined, f"chain{k}", width)
        w = g.add_constant(f"w{k}", torch.full((16, width[1], 1, 1), 0.1))
        new = _out(g.add_node("FusedConv", [h, w], attrs={"activation": "relu"}, domain="fusegraph",
                              name=f"conv{k}"), part)
        new = _out(g.add_node("Elu", [new], name=f"grow{k}"), part)
        joined = _out(g.add_node("Concat", [joined, new], attrs={"axis": 1}, name=f"join{k}"),
                      (1, 16 * (k + 2), 64, 64))
    g.outputs.append(joined)
    plan = guard_plan(g, measure_below=1e4)
    assert plan.measured == {"stem": (0,), "grow0": (0,), "grow1": (0,), "grow2": (0,)}
    assert all(plan.limits[f"{kind}{k}"] >= 1e16 for kind in ("chain", "conv") for k in range(4))


def test_only_the_values_a_limit_needs_are_measured():
    """A convolution reads u (from an op the analysis does not know) and a residual s (a
    sigmoid: within [-1, 1] whatever the feeds). Measuring u alone admits the fast kernel, so
    s is not measured: a measurement is a pass over the tensor on every run."""
    g = Graph("g")
    shape = (1, 16, 128, 128)
    x = g.add_input("x", DType.FLOAT, shape)
    u = _out(g.add_node("Elu", [x], name="unknown"), shape)
    s = _out(g.add_node("Sigmoid", [x], name="bounded"), shape)
    w, b = g.add_constant("w", torch.full((16, 16, 1, 1), 0.1)), g.add_constant("b", torch.zeros(16))
    g.outputs.append(_out(g.add_node("FusedConv", [u, w, b, s], attrs={"activation": "relu"}, domain="fusegraph",
                                     name="conv"), shape))
    plan = guard_plan(g, measure_below=1e4)
    assert plan.measured == {"unknown": (0,)}
    assert plan.limits["conv"] >= 1e16


@pytest.mark.parametrize("x_type,zero_point,scale,bound,nan", [
    (TensorProto.UINT8, 3, 0.1, 255 * 0.1, False),       # |x - zp| <= 255
    (TensorProto.UINT8, None, 0.1, 255 * 0.1, False),
    (TensorProto.INT8, None, 0.5, 128 * 0.5, False),
    (TensorProto.INT32, None, 0.5, 2.0 ** 31 * 0.5, False),
    (TensorProto.UINT8, 3, float("nan"), math.inf, True),
    (TensorProto.UINT8, 3, float("inf"), math.inf, True),  # inf * 0 is NaN
])
def test_a_dequantized_value_is_bounded_by_its_type_and_scale(x_type, zero_point, scale, bound, nan):
    """``DequantizeLinear``'s ``(x - zp) * scale``: at most the integer type's width times the
    scale (a QDQ model's float values need no measurement to be bounded); a NaN or infinite
    scale makes it NaN-carrying."""
    from onnx import numpy_helper
    from fusegraph.frontends.onnx import import_onnx
    np_type = {TensorProto.UINT8: np.uint8, TensorProto.INT8: np.int8, TensorProto.INT32: np.int32}[x_type]
    inits = [numpy_helper.from_array(np.array(scale, np.float32), "s")]
    ins = ["x", "s"]
    if zero_point is not None:
        inits.append(numpy_helper.from_array(np.array(zero_point, np_type), "z"))
        ins.append("z")
    graph = helper.make_graph([helper.make_node("DequantizeLinear", ins, ["y"])], "dq",
                              [helper.make_tensor_value_info("x", x_type, [4])],
                              [helper.make_tensor_value_info("y", F, [4])], inits)
    g = import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    fact = propagate(g, 1.0)[id(g.outputs[0])]
    assert fact.nan == nan
    if math.isfinite(bound):
        assert fact.bound == pytest.approx(bound, rel=1e-6)


@pytest.mark.parametrize("steps", [["Mul ix i1", "Relu p"], ["", "Relu p"], ["Mul i0 i7", "Relu p"]],
                         ids=["operand", "empty", "out_of_range"])
def test_a_malformed_chain_is_unknown_to_the_analysis_not_a_crash(steps):
    """The analysis runs before any kernel is built (a loaded artifact's chain steps are
    untrusted): a step it cannot read makes the chain's value unknown, and no limit."""
    g = Graph("g")
    x = g.add_input("x", DType.FLOAT, (1, 4, 8, 8))
    scale = g.add_constant("s", torch.ones(4, 1, 1))
    y = _out(g.add_node("ElementwiseChain", [x, scale], attrs={"steps": steps}, domain="fusegraph", name="c"),
             (1, 4, 8, 8))
    g.outputs.append(y)
    assert "c" not in guard_plan(g, measure_below=1e4).limits
    assert math.isinf(propagate(g, 1.0)[id(y)].bound)


# ---------------------------------------------------------------- transfers that were unsound

def _one(op, inputs, shape=(1, 4, 6, 6), attrs=None, opset=18, consts=(), out_shape=None):
    """x [shape] -> op(x, consts...) ; returns (graph, output value)."""
    g = Graph("g", opset={"": opset, "fusegraph": 1})
    x = g.add_input("x", DType.FLOAT, shape)
    ins = [x if i == "x" else None if i is None else g.add_constant(i, consts[i]) for i in inputs] if consts else \
        [x] * inputs
    y = _out(g.add_node(op, ins, attrs=attrs or {}, name="op"), out_shape or shape)
    g.outputs.append(y)
    return g, y


def test_a_pad_fill_is_part_of_the_padded_value():
    """Pad passed its input's bound through whatever its fill (issue 38): a fill above the
    input's bound is the padded value's bound, a NaN fill makes it NaN-carrying."""
    for fill, want in ((2.0 ** 100, Fact(2.0 ** 100)), (0.5, Fact(2.0))):
        g, y = _one("Pad", ["x", "pads", "fill"], consts={"pads": torch.tensor([0, 0, 1, 1] * 2),
                                                          "fill": torch.tensor(fill)}, out_shape=(1, 4, 8, 8))
        assert propagate(g, 2.0)[id(y)] == want
    g, y = _one("Pad", ["x", "pads", "fill"], consts={"pads": torch.tensor([0, 0, 1, 1] * 2),
                                                      "fill": torch.tensor(float("nan"))}, out_shape=(1, 4, 8, 8))
    assert propagate(g, 2.0)[id(y)].nan
    g, y = _one("Pad", ["x", "pads"], consts={"pads": torch.tensor([0, 0, 1, 1] * 2)}, attrs={"mode": "reflect"},
                out_shape=(1, 4, 8, 8))
    assert propagate(g, 2.0)[id(y)] == Fact(2.0)


def test_a_sum_of_inputs_adds_their_bounds():
    """The variadic Sum was bounded like Max (the largest input's bound)."""
    g, y = _one("Sum", 3)
    assert propagate(g, 2.0)[id(y)] == Fact(6.0)


def test_clip_bounds_follow_its_limits_and_an_infinite_input():
    """clip(x, 5, 10) of |x| <= 1 is 5 (the old bound: min(1, 10) = 1); clip(x, 0, 6) of an
    input that may be +-inf reaches 6 (the old bound kept the input's finite bound); limits
    computed at run time bound it by their own facts (the old bound: 0)."""
    c = {"x": None, "lo": torch.tensor(5.0), "hi": torch.tensor(10.0)}
    g, y = _one("Clip", ["x", "lo", "hi"], consts=c)
    assert propagate(g, 1.0)[id(y)] == Fact(5.0)
    assert propagate(g, 20.0)[id(y)] == Fact(10.0)
    g = Graph("g", opset={"": 18})
    x = g.add_input("x", DType.FLOAT, (4,))
    inf = _out(g.add_node("Mul", [x, g.add_constant("big", torch.tensor(float("inf")))], name="inf"), (4,))
    y = _out(g.add_node("Clip", [inf, g.add_constant("lo", torch.tensor(0.0)), g.add_constant("hi", torch.tensor(6.0))],
                        name="clip"), (4,))
    f = propagate(g, 1e-3)[id(y)]
    assert f.bound == 6.0 and not f.inf
    g = Graph("g", opset={"": 18})
    x = g.add_input("x", DType.FLOAT, (4,))
    lim = g.add_input("limit", DType.FLOAT, ())
    neg = _out(g.add_node("Neg", [lim], name="neg"), ())
    y = _out(g.add_node("Clip", [x, neg, lim], name="clip"), (4,))
    assert propagate(g, 3.0)[id(y)] == Fact(3.0)


def test_a_steep_leaky_relu_enlarges_the_bound():
    g, y = _one("LeakyRelu", 1, attrs={"alpha": 10.0})
    assert propagate(g, 2.0)[id(y)] == Fact(20.0)
    g, y = _one("LeakyRelu", 1)
    assert propagate(g, 2.0)[id(y)] == Fact(2.0)
    g = _conv_graph(activation="leaky_relu", params=(10.0,), pool=False)
    y = g.outputs[0]
    assert propagate(g, 2.0)[id(y)].bound == pytest.approx(10.0 * (2.0 * 0.5 * 36 + 1.0))


def test_layer_normalization_over_several_axes_is_bounded_by_all_of_them():
    """LayerNormalization(axis=1) of [1, 4, 6, 6] normalises rows of 144: sqrt(144) = 12 (the
    old bound took the last axis alone: sqrt(6))."""
    consts = {"x": None, "g": torch.ones(4, 6, 6), "b": torch.zeros(4, 6, 6)}
    g, y = _one("LayerNormalization", ["x", "g", "b"], consts=consts, attrs={"axis": 1})
    assert propagate(g, 1.0)[id(y)].bound == pytest.approx(12.0)


def test_dropout_in_training_mode_is_unknown():
    g, y = _one("Dropout", 1, opset=6)
    assert math.isinf(propagate(g, 1.0)[id(y)].bound)
    g, y = _one("Dropout", 1, opset=6, attrs={"is_test": 1})
    assert propagate(g, 1.0)[id(y)] == Fact(1.0)


@pytest.mark.parametrize("where, bad", [("weight", float("nan")), ("weight", float("inf")), ("bias", float("nan"))])
def test_a_non_finite_weight_or_bias_makes_the_product_nan_carrying(where, bad):
    """Issue 39 #3: the gain was one number, so a NaN weight became an unknown but NaN-free
    bound that a clip or a sigmoid then reset; now the weight's fact carries its NaN (an
    infinite weight times a zero: NaN too) into the product, the activation and the pool after
    it: no limit for either."""
    g = _conv_graph(activation="hardtanh", params=(0.0, 6.0))
    g.constants["w" if where == "weight" else "b"].const.view(-1)[3] = bad
    conv = next(n for n in g.nodes if n.name == "conv").outputs[0]
    f = propagate(g, 1.0)[id(conv)]
    assert f.nan and f.bound == 6.0
    assert fast_limits(g) == {}


def test_an_infinite_bias_is_clipped_not_nan():
    """conv + inf is inf, never NaN: the clip makes it 6, so the pool after it keeps its fast
    kernel; the convolution's own clip post-op (whose pre-activation is infinite) does not."""
    g = _conv_graph(activation="hardtanh", params=(0.0, 6.0))
    g.constants["b"].const.view(-1)[3] = float("inf")
    conv = next(n for n in g.nodes if n.name == "conv").outputs[0]
    assert propagate(g, 1.0)[id(conv)] == Fact(6.0)
    assert fast_limits(g) == {"pool": math.inf}


def test_a_released_weight_is_read_through_the_backends_facts():
    """A loaded model's weights exist only in their packed forms: the analysis asks the
    backend (``const_fact``) for the fact of a constant whose plain tensor is a placeholder."""
    g = _conv_graph(activation="hardtanh", params=(0.0, 6.0))
    w = g.constants["w"]
    w.const = torch.empty(w.const.shape, device="meta")
    nan_packed = torch.full((4 * 4 * 9 + 16,), 0.5)
    nan_packed[7] = float("nan")
    assert fast_limits(g, lambda v: tensor_fact(torch.full((160,), 0.5))) == {"conv": 1e32, "pool": math.inf}
    assert fast_limits(g, lambda v: tensor_fact(nan_packed)) == {}
    assert fast_limits(g) == {}           # nothing to read the placeholder by: unknown


@pytest.mark.parametrize("name", ["densenet121", "inception_v2", "squeezenet"])
def test_the_guard_plan_shares_a_node_s_facts_only_where_every_grid_point_agrees(name, monkeypatch):
    """``record_at_every_point`` makes a node's facts once where its inputs' are the same at
    every grid point: the plan (limits and measurements) is the one made point by point, on
    light models with their random He-scaled weights, plain (the portable kernels keep them)."""
    from fusegraph.runtime.backends.cpu import guard_plan as gp
    from fusegraph.runtime.backends.cpu.backend import MEASURE_BELOW
    from fusegraph.runtime.backends.cpu.finite import record_facts
    from fusegraph.testing import zoo
    model = zoo.random_light_model(name)
    graph = fg.compile(model, config=fg.Config(threads=1, cpu_kernels="portable")).graph
    shared = guard_plan(graph, measure_below=MEASURE_BELOW)

    def each_point(node, ins, facts):
        for table, x in zip(facts, ins):
            record_facts(node, x, table)
    monkeypatch.setattr(gp, "record_at_every_point", each_point)
    assert guard_plan(graph, measure_below=MEASURE_BELOW) == shared
    assert shared.limits                    # (a plan with guarded nodes in it)
