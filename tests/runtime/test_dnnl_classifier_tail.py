"""A classifier's last kernels on oneDNN: Softmax (``dnnl/softmax.py``) and an average pool
whose window is the whole image (``dnnl/pool.py``, the mean as one matmul).

Softmax is checked against ``exp(x - max) / sum`` in float64 (ONNX's definition, for opset 13
and for the flattened 2-D view of earlier opsets: the reference evaluator is wrong on
Softmax-9), rows of NaN, +-inf and all -inf included; the mean against onnxruntime in float32,
and in bfloat16 against the exact mean of the kernel's own bfloat16 input, one rounding away.
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
from fusegraph.runtime.backends.cpu.dnnl.softmax import ExactSoftmax
from cpu_isa import AVX512, BF16_ARITHMETIC
from oracle import assert_outputs_close, ort_run

sys.path.insert(0, str(Path(__file__).parents[1] / "passes"))
from passes_util import F, const, model, node  # noqa: E402

pytestmark = pytest.mark.skipif(not available(), reason="oneDNN (onednn-cpu-gomp) does not load here")


def _softmax_oracle(x: np.ndarray, axis: int, opset: int) -> np.ndarray:
    x = x.astype(np.float64)
    shape = x.shape
    if opset < 13:
        x, axis = x.reshape(int(np.prod(shape[:axis])), -1), 1
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(x - x.max(axis=axis, keepdims=True))
        return (e / e.sum(axis=axis, keepdims=True)).reshape(shape)


def _special_rows(shape, axis) -> np.ndarray:
    """Random rows along ``axis``, some holding NaN, +inf, -inf, only -inf or large values."""
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32) * 4
    moved = np.moveaxis(x, axis, -1).reshape(-1, shape[axis])
    specials = [(np.nan,), (np.inf,), (-np.inf,), (np.inf, -np.inf), (np.nan, np.inf)]
    for r, vals in enumerate(specials):
        for j, v in enumerate(vals):
            moved[r, j] = v
    moved[len(specials)] = -np.inf
    moved[len(specials) + 1] *= 1e30
    return np.ascontiguousarray(np.moveaxis(moved.reshape(np.moveaxis(x, axis, -1).shape), -1, axis))


@pytest.mark.parametrize("opset,shape,axis", [(13, (3, 7, 5), -1), (13, (7, 1000, 1, 1), 1),
                                              (11, (4, 3, 5), 1), (9, (2, 4, 6), 2), (11, (8, 10), 1)])
def test_softmax_is_onnx_softmax_on_every_row(opset, shape, axis):
    m = model([node("Softmax", ["x"], "y", axis=axis)], [("x", F, list(shape))], ["y"], [], opset=opset)
    cm = fg.compile(m, fg.Config(threads=2))
    (call,) = cm._executor.binding.calls
    assert isinstance(call.kernel, ExactSoftmax) and not call.kernel.impl.startswith("ref"), call.kernel
    rows_axis = axis % len(shape) if opset >= 13 else len(shape) - 1
    x = _special_rows(shape, rows_axis) if opset >= 13 else _special_rows(shape, len(shape) - 1)
    got, want = cm.run({"x": x})["y"], _softmax_oracle(x, axis % len(shape), opset)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7, equal_nan=True)


def test_fast_math_softmax_skips_the_check():
    m = model([node("Softmax", ["x"], "y", axis=1)], [("x", F, [2, 6])], ["y"], [], opset=13)
    (call,) = fg.compile(m, fg.Config(threads=2, fast_math=True))._executor.binding.calls
    assert isinstance(call.kernel, DnnlKernel)


def _he(*shape, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * np.sqrt(2.0 / np.prod(shape[1:]))).astype(np.float32)


def _pool_net(pool: str, hw: int = 13):
    """Four 3x3 convolutions with relu (the layout pass makes them channels-last), then the
    whole-image average."""
    nodes, inits, src = [], [], "x"
    for j, (cin, cout) in enumerate([(4, 16), (16, 24), (24, 24), (24, 32)]):
        nodes += [node("Conv", [src, f"w{j}", f"b{j}"], f"c{j}", pads=[1] * 4), node("Relu", [f"c{j}"], f"r{j}")]
        inits += [const(f"w{j}", _he(cout, cin, 3, 3, seed=j)),
                  const(f"b{j}", np.random.default_rng(9 + j).standard_normal(cout).astype(np.float32) * 0.1)]
        src = f"r{j}"
    last = {"global": lambda: node("GlobalAveragePool", [src], "g"),
            "whole_window": lambda: node("AveragePool", [src], "g", kernel_shape=[hw, hw]),
            # inception_v1's: a 7x7 window over a 6x6 image and an end pad it never divides by
            "padded_window": lambda: node("AveragePool", [src], "g", kernel_shape=[hw + 1, hw + 1],
                                          pads=[0, 0, 1, 1]),
            "padded_counting_pads": lambda: node("AveragePool", [src], "g", kernel_shape=[hw + 1, hw + 1],
                                                 pads=[0, 0, 1, 1], count_include_pad=1)}[pool]()
    # a 1x1 convolution (bf16 under bf16, and so the pool), then the logits (kept float32)
    head = [node("Conv", ["g", "wm"], "m"), node("Relu", ["m"], "mr"), node("Conv", ["mr", "wh"], "y")]
    inits += [const("wm", _he(32, 32, 1, 1, seed=6)), const("wh", _he(10, 32, 1, 1, seed=7))]
    return model(nodes + [last] + head, [("x", F, [1, 4, hw, hw])], ["y"], inits, opset=17)


def test_window_counting_pads_past_the_image_is_no_mean():
    """Divided by the window's area, pads included: not the image's mean; it declines (oneDNN's
    pooling has only its reference kernel here) and the op's own kernel runs."""
    m = _pool_net("padded_counting_pads")
    cm = fg.compile(m, fg.Config(threads=2))
    (call,) = [c for c in cm._executor.binding.calls if "Pool" in c.node.op_type]
    assert not isinstance(call.kernel, DnnlKernel)
    feeds = {"x": np.random.default_rng(4).standard_normal((1, 4, 13, 13)).astype(np.float32)}
    assert_outputs_close(cm.run(feeds), ort_run(m, feeds), rtol=1e-4)


@pytest.mark.parametrize("pool", ["global", "whole_window", "padded_window"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_whole_image_average_is_the_mean(pool, precision):
    m = _pool_net(pool)
    cm = fg.compile(m, fg.Config(threads=2, precision=precision))
    (call,) = [c for c in cm._executor.binding.calls if "Pool" in c.node.op_type]
    if precision == "fp32" or BF16_ARITHMETIC:     # the mean as a oneDNN matmul (brg on AVX-512, gemm on AVX2)
        assert isinstance(call.kernel, DnnlKernel), call.kernel
        assert call.kernel.impl.startswith("brg") or not AVX512, call.kernel.impl
        assert not [d for d in cm.report.kernels["declined"] if d["node"] == call.node.name]
    feeds = {"x": np.random.default_rng(4).standard_normal((1, 4, 13, 13)).astype(np.float32)}
    got = cm.run(feeds)
    if precision == "fp32":
        assert_outputs_close(got, ort_run(m, feeds), rtol=1e-4)
        return
    pool_in = {}

    def capture_in(i, phase, outs):
        calls = cm._executor.binding.calls
        if phase == 1 and calls[i].node.outputs[0] is call.node.inputs[0]:
            pool_in["x"] = outs[0].clone()
        if phase == 1 and calls[i] is call:
            pool_in["y"] = outs[0].clone()
    cm.run(feeds, hook=capture_in)
    x, y = pool_in["x"], pool_in["y"]
    # GlobalAveragePool and an AveragePool follow their input's type
    assert x.dtype == y.dtype == torch.bfloat16
    exact = x.double().mean(dim=(2, 3), keepdim=True)
    err = (y.double() - exact).abs()
    if y.dtype == torch.bfloat16 and not isinstance(call.kernel, DnnlKernel):
        pytest.skip("no bfloat16 arithmetic on this CPU: the pool is the op's own ATen kernel")
    if y.dtype == torch.bfloat16:      # one rounding (half an ulp), and torch's own mean, rounded
        assert (err <= exact.abs() * 2.0 ** -8 * (1 + 1e-3)).all(), float((err / exact.abs()).max())
        assert torch.equal(y, x.float().mean(dim=(2, 3), keepdim=True).to(y.dtype))
    else:                               # a float32 sum of 169 terms
        assert (err <= exact.abs() * 4e-6).all(), float((err / exact.abs()).max())
