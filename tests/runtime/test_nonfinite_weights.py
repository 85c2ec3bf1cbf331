"""A NaN or an infinity in a model's weights (issue 39 #3): the bound analysis
(``ops/value_range.py``, ``runtime/backends/cpu/finite.py``) must treat such a constant as
NaN-carrying, so no guarded fast kernel (a max pool without its finiteness check, a fused
clip or relu that maps NaN to a number) runs downstream of it. Each small model has one
non-finite weight, bias, norm scale or pad value and finite feeds; the NaN / +Inf / -Inf
positions must be those of onnxruntime (ORT_DISABLE_ALL) and of ``onnx.reference``, the
finite values theirs, for the compiled model and for the model saved and loaded (where a
product's weight exists only in its packed form: its bound is read from the packed bytes).
"""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import fusegraph as fg
from oracle import ort_run

F = TensorProto.FLOAT
X = (1, 4, 8, 8)


def _t(name, a):
    return numpy_helper.from_array(np.asarray(a, np.float32), name)


def _weights(seed=0):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((4, 4, 3, 3)) * np.sqrt(2.0 / 36)).astype(np.float32)
    return w, (rng.standard_normal(4) * 0.1).astype(np.float32)


def _model(nodes, inits, shape=X):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, list(shape))],
                              [helper.make_tensor_value_info("y", F, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _pool(src="h"):
    return helper.make_node("MaxPool", [src], ["y"], kernel_shape=[2, 2], strides=[2, 2])


def conv_clip_pool(w, b):
    """The issue's first case: Conv -> Clip(0, 6) -> MaxPool."""
    return _model([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1] * 4),
                   helper.make_node("Clip", ["c", "lo", "hi"], ["h"]), _pool()],
                  [_t("w", w), _t("b", b), _t("lo", 0.0), _t("hi", 6.0)])


def conv_hardsigmoid_pool(w, b):
    """The issue's second case: Conv -> HardSigmoid -> MaxPool."""
    return _model([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1] * 4),
                   helper.make_node("HardSigmoid", ["c"], ["h"]), _pool()], [_t("w", w), _t("b", b)])


def conv_bounded_conv_relu(activation):
    """A convolution with the bad weight, an activation bounded whatever its input (so the
    second convolution's relu post-op, which maps NaN to 0, would be admitted), a second
    convolution and its Relu. Without a max pool, a NaN sprinkled among numbers (inf - inf)
    comes out where every oracle puts it."""
    def build(w, b):
        w2, b2 = _weights(seed=3)
        act = [helper.make_node("Clip", ["c", "lo", "hi"], ["s"])] if activation == "Clip" else \
            [helper.make_node(activation, ["c"], ["s"])]
        return _model([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1] * 4), *act,
                       helper.make_node("Conv", ["s", "w2", "b2"], ["c2"], pads=[1] * 4),
                       helper.make_node("Relu", ["c2"], ["y"])],
                      [_t("w", w), _t("b", b), _t("w2", w2), _t("b2", b2), _t("lo", 0.0), _t("hi", 6.0)])
    return build


def gemm_clip_pool(w, b):
    """A product (Gemm: a Linear, its weight packed by the CPU backend) -> Clip -> its
    columns as channels -> MaxPool (a NaN column: whole NaN windows)."""
    return _model([helper.make_node("Reshape", ["x", "flat"], ["f"]),
                   helper.make_node("Gemm", ["f", "w", "b"], ["m"], transB=1),
                   helper.make_node("Clip", ["m", "lo", "hi"], ["k"]),
                   helper.make_node("Transpose", ["k"], ["kt"], perm=[1, 0]),
                   helper.make_node("Reshape", ["kt", "square"], ["h"]), _pool()],
                  [_t("w", w), _t("b", b), _t("lo", 0.0), _t("hi", 6.0),
                   numpy_helper.from_array(np.array([16, 16], np.int64), "flat"),
                   numpy_helper.from_array(np.array([1, 16, 4, 4], np.int64), "square")])


def layer_norm_clip_pool(gamma, beta):
    """LayerNormalization over the last axis (a NaN scale) -> Clip -> MaxPool."""
    return _model([helper.make_node("LayerNormalization", ["x", "g", "be"], ["n"], axis=-1, epsilon=1e-5),
                   helper.make_node("Clip", ["n", "lo", "hi"], ["h"]), _pool()],
                  [_t("g", gamma), _t("be", beta), _t("lo", -6.0), _t("hi", 6.0)])


def pad_conv_relu(value):
    """Pad (constant mode, fill ``value``) -> Conv -> Relu: the fill is part of the padded
    value, so its bound is the input's and the fill's, not the input's alone. (A finite fill
    that overflows the convolution, 3e38, gave 54 NaNs where onnxruntime gives 9 infinities
    before the fix; where such a sum overflows depends on the summation order, so that case is
    checked on the bounds, ``test_finite.py``, not here.)"""
    w, b = _weights(seed=5)
    return _model([helper.make_node("Pad", ["x", "pads", "fill"], ["p"], mode="constant"),
                   helper.make_node("Conv", ["p", "w", "b"], ["c"]),
                   helper.make_node("Relu", ["c"], ["y"])],
                  [_t("w", w), _t("b", b), _t("fill", value),
                   numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads")])



def _conv_case(builder, where, value):
    w, b = _weights()
    if where == "weight":
        w[1, 2, 1, 1] = value                   # the centre tap: never multiplies padding
    elif where == "two_weights":                # +inf and -inf in one output channel: inf - inf
        w[1, 2, 1, 1], w[1, 3, 1, 1] = value, -value
    else:
        b[2] = value
    return builder(w, b)


def _gemm_case(value):
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((16, 16)) * 0.25).astype(np.float32)
    w[5, 7] = value
    return gemm_clip_pool(w, (rng.standard_normal(16) * 0.1).astype(np.float32))


def _norm_case(value):
    gamma, beta = np.ones(8, np.float32), np.zeros(8, np.float32)
    gamma[2:4] = value                  # two neighbouring columns: whole NaN pooling windows
    return layer_norm_clip_pool(gamma, beta)


CASES = {
    "conv_clip_pool_nan_weight": lambda: _conv_case(conv_clip_pool, "weight", np.nan),
    "conv_hardsigmoid_pool_nan_weight": lambda: _conv_case(conv_hardsigmoid_pool, "weight", np.nan),
    "conv_clip_pool_nan_bias": lambda: _conv_case(conv_clip_pool, "bias", np.nan),
    "conv_sigmoid_conv_relu_nan_weight": lambda: _conv_case(conv_bounded_conv_relu("Sigmoid"), "weight", np.nan),
    "conv_clip_conv_relu_inf_weights": lambda: _conv_case(conv_bounded_conv_relu("Clip"), "two_weights", np.inf),
    "conv_hardsigmoid_conv_relu_inf_weights":
        lambda: _conv_case(conv_bounded_conv_relu("HardSigmoid"), "two_weights", np.inf),
    "gemm_clip_pool_nan_weight": lambda: _gemm_case(np.nan),
    "layer_norm_clip_pool_nan_scale": lambda: _norm_case(np.nan),
    "pad_conv_relu_nan_fill": lambda: pad_conv_relu(np.nan),
    "pad_conv_relu_inf_fill": lambda: pad_conv_relu(np.inf),
}


def _assert_same_special(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, what
    for mask in (np.isnan, np.isposinf, np.isneginf):
        bad = mask(got) != mask(want)
        assert not bad.any(), (f"{what}: {mask.__name__} at {int(mask(got).sum())} positions, the oracle at "
                               f"{int(mask(want).sum())}")
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-4, atol=1e-5, err_msg=what)


@pytest.mark.parametrize("case", list(CASES))
def test_a_non_finite_weight_gives_the_oracles_nans_compiled_and_loaded(case, tmp_path):
    m = CASES[case]()
    x = np.random.default_rng(7).standard_normal(X).astype(np.float32)
    want = ort_run(m, {"x": x})["y"]
    with np.errstate(invalid="ignore", over="ignore"):
        reference = ReferenceEvaluator(m).run(None, {"x": x})[0]
    assert not np.isfinite(want).all(), f"{case}: the case no longer makes a NaN or an infinity"
    for mask in (np.isnan, np.isposinf, np.isneginf):         # the two oracles agree
        np.testing.assert_array_equal(mask(want), mask(reference))
    compiled = fg.compile(m, fg.Config(threads=2))
    path = tmp_path / "m.fgm"
    compiled.save(path)
    loaded = fg.load(path)
    if case.startswith("gemm"):        # the loaded product's weight is its packed form alone
        assert any(v.const.device.type == "meta" for v in loaded.graph.constants.values())
    try:
        for label, model in (("compiled", compiled), ("loaded", loaded)):
            _assert_same_special(model.run({"x": x})["y"], want, f"{case} [{label}]")
    finally:
        loaded.close()
        compiled.close()


def test_a_finite_model_still_runs_its_guarded_fast_kernels():
    """The same Conv -> Clip -> MaxPool with finite weights keeps its fast max pool: the fix
    makes a non-finite constant NaN-carrying, not every constant unknown."""
    from fusegraph.runtime.backends.cpu.dnnl import available
    from fusegraph.runtime.backends.cpu.guard import Guarded
    if not available():
        pytest.skip("the oneDNN library does not load here")
    w, b = _weights()
    good = fg.compile(conv_clip_pool(w, b), fg.Config(threads=2))
    w[1, 2, 1, 1] = np.nan
    bad = fg.compile(conv_clip_pool(w, b), fg.Config(threads=2))
    try:
        kinds = [{c.node.op_type: isinstance(c.kernel, Guarded) for c in m._executor.binding.calls}
                 for m in (good, bad)]
        assert kinds == [{"FusedConv": True, "MaxPool": True}, {"FusedConv": False, "MaxPool": False}]
    finally:
        good.close()
        bad.close()

