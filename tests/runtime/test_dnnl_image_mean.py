"""The mean over an image as one oneDNN matmul (``dnnl/pool.py``) on whatever layout reaches it:
GlobalAveragePool of NCHW data (a graph the layout pass leaves NCHW) and of channels-last
data, at batch 1 and 2, and an AveragePool whose window covers the image as ``transformers``'
EfficientNet writes it (``AvgPool2d(1280, ceil_mode=True)`` over 7x7: kernel and strides 1280,
``count_include_pad`` 1, no explicit pads: ONNX counts no overhang, so it is the mean). Also:
a convolution that runs oneDNN's ``gemm`` fallback carries its reason in
``report.kernels["declined"]``. Numbers against onnxruntime ORT_DISABLE_ALL at rtol 1e-4."""
import math
import sys
from pathlib import Path

import numpy as np
import pytest

import fusegraph as fg
from cpu_isa import needs_avx512
from oracle import assert_outputs_close, ort_run

sys.path.insert(0, str(Path(__file__).parents[1] / "passes"))
from passes_util import F, const, model, node  # noqa: E402

C = 24


def rnd(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def convs_then(tail, n_convs, batch=1, size=7):
    nodes, inits, src = [], [], "x"
    for i in range(n_convs):
        inits += [const(f"w{i}", rnd(C, C, 3, 3, seed=i, scale=math.sqrt(2 / (9 * C)))),
                  const(f"b{i}", rnd(C, seed=10 + i, scale=0.1))]
        nodes += [node("Conv", [src, f"w{i}", f"b{i}"], f"c{i}", pads=[1] * 4), node("Relu", [f"c{i}"], f"r{i}")]
        src = f"r{i}"
    nodes.append(tail(src))
    return model(nodes, [("x", F, [batch, C, size, size])], ["y"], inits, opset=17)


def run_checked(m, batch=1, size=7):
    feeds = {"x": rnd(batch, C, size, size, seed=4)}
    compiled = fg.compile(m, fg.Config(threads=2))
    assert_outputs_close(compiled.run(feeds), ort_run(m, feeds))
    return compiled


def kernel_of(compiled, op):
    (call,) = [c for c in compiled._executor.binding.calls if c.node.op_type == op]
    return call


GAP = lambda src: node("GlobalAveragePool", [src], "y")   # noqa: E731
EFFICIENTNET_POOL = lambda src: node("AveragePool", [src], "y", kernel_shape=[1280, 1280],  # noqa: E731
                                     strides=[1280, 1280], pads=[0, 0, 0, 0], ceil_mode=1, count_include_pad=1)


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("n_convs, layout", [(1, "nchw"), (3, "nhwc")])
@pytest.mark.parametrize("pool", ["global", "efficientnet"])
def test_image_mean_on_either_layout(batch, n_convs, layout, pool):
    m = convs_then(GAP if pool == "global" else EFFICIENTNET_POOL, n_convs, batch)
    compiled = run_checked(m, batch)
    op = "GlobalAveragePool" if pool == "global" else "AveragePool"
    call = kernel_of(compiled, op)
    assert call.node.inputs[0].layout == layout
    assert (getattr(call.kernel, "impl", None) or "portable") != "portable", "the oneDNN mean ran"
    assert not [d for d in compiled.report.kernels["declined"] if d["op"] == op]


def test_a_window_that_counts_explicit_pads_is_no_mean():
    """count_include_pad with explicit pads: the divisor counts them; not the image mean."""
    m = convs_then(lambda src: node("AveragePool", [src], "y", kernel_shape=[9, 9], strides=[9, 9],
                                    pads=[1, 1, 1, 1], count_include_pad=1), 3)
    run_checked(m)


@needs_avx512
def test_a_gemm_convolution_says_why():
    """One convolution: the layout pass keeps the graph NCHW, oneDNN runs its im2col + GEMM
    fallback, and the report says so."""
    compiled = run_checked(convs_then(GAP, 1, size=12), size=12)
    call = kernel_of(compiled, "FusedConv")
    assert "gemm" in call.kernel.impl
    reasons = [d["reason"] for d in compiled.report.kernels["declined"] if d["op"] == "FusedConv"]
    assert len(reasons) == 1 and reasons[0].startswith("NCHW data (the layout pass kept this graph NCHW)")
