"""A bilinear Resize on oneDNN's resampling primitive (``runtime/backends/cpu/dnnl/resample.py``):
against onnxruntime ``ORT_DISABLE_ALL`` at float32 (rtol 1e-4), up and down, from sizes and from
scales, channels-last (between convolutions, SegFormer's decode head) and NCHW; at bfloat16
against float64 arithmetic on the same bf16 values (rounded once); and the nodes whose
coordinate mapping is not oneDNN's declining with their reason, still right on the op's own
kernel."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import fusegraph as fg
from fusegraph.runtime.backends.cpu.dnnl import available
from fusegraph.runtime.backends.cpu.dnnl.call import DnnlKernel
from cpu_isa import BF16_ARITHMETIC
from oracle import assert_outputs_close, ort_run

sys.path.insert(0, str(Path(__file__).parents[1] / "passes"))
from passes_util import F as FLOAT, const, model, node  # noqa: E402

pytestmark = pytest.mark.skipif(not available(), reason="oneDNN (onednn-cpu-gomp) does not load here")


def _he(*shape, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * np.sqrt(2.0 / np.prod(shape[1:]))).astype(np.float32)


def _net(hw, out_hw=None, scales=None, coord="half_pixel", mode="linear", convs=True):
    """[conv ->] Resize [-> conv]: the convolutions make the image channels-last."""
    ins = ["c" if convs else "x", "", "sc" if scales else "", "sz" if out_hw else ""]
    while ins[-1] == "":
        ins.pop()
    nodes = [node("Resize", ins, "r" if convs else "y", mode=mode, coordinate_transformation_mode=coord)]
    inits = []
    if scales:
        inits.append(const("sc", np.array([1, 1, *scales], np.float32)))
    if out_hw:
        inits.append(const("sz", np.array([1, 8, *out_hw], np.int64), np.int64))
    if convs:
        nodes = [node("Conv", ["x", "w0", "b0"], "c", pads=[1, 1, 1, 1])] + nodes + \
                [node("Conv", ["r", "w1"], "y", pads=[1, 1, 1, 1])]
        inits += [const("w0", _he(8, 8, 3, 3, seed=1)), const("b0", np.full(8, 0.1, np.float32)),
                  const("w1", _he(8, 8, 3, 3, seed=2))]
    return model(nodes, [("x", FLOAT, [1, 8, *hw])], ["y"], inits, opset=17)


def _resize_call(cm):
    (call,) = [c for c in cm._executor.binding.calls if c.node.op_type == "Resize"]
    return call


CASES = {   # name -> (input hw, sizes, scales, convolutions around it)
    "up_x2_from_scales": ((7, 9), None, (2.0, 2.0), True),
    "up_from_sizes": ((7, 9), (13, 17), None, True),
    "down_from_sizes": ((12, 10), (5, 7), None, True),
    "nchw_lone": ((6, 6), (16, 11), None, False),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bilinear_resize_runs_on_onednn(name):
    hw, sizes, scales, convs = CASES[name]
    m = _net(hw, sizes, scales, convs=convs)
    cm = fg.compile(m, fg.Config(threads=2))
    call = _resize_call(cm)
    assert isinstance(call.kernel, DnnlKernel) and not call.kernel.impl.startswith("ref"), call.kernel
    assert not [d for d in cm.report.kernels["declined"] if d["node"] == call.node.name]
    if name.startswith("up"):          # between convolutions: channels-last (the layout pass's choice)
        assert call.node.inputs[0].layout == "nhwc"
    feeds = {"x": np.random.default_rng(3).standard_normal((1, 8, *hw)).astype(np.float32)}
    assert_outputs_close(cm.run(feeds), ort_run(m, feeds), rtol=1e-4)


def test_bf16_resize_is_the_bilinear_mean_rounded_once():
    m = _net((7, 9), (13, 17))
    cm = fg.compile(m, fg.Config(threads=2, precision="bf16"))
    call = _resize_call(cm)
    if BF16_ARITHMETIC:
        assert isinstance(call.kernel, DnnlKernel), call.kernel
    calls = cm._executor.binding.calls
    seen = {}

    def hook(i, phase, outs):
        if phase == 1:
            seen.update((id(v), t.clone()) for v, t in zip(calls[i].node.outputs, outs))
    cm.run({"x": np.random.default_rng(5).standard_normal((1, 8, 7, 9)).astype(np.float32)}, hook=hook)
    x, y = seen[id(call.node.inputs[0])], seen[id(call.node.outputs[0])]
    assert x.dtype == y.dtype == torch.bfloat16
    want = F.interpolate(x.double(), size=(13, 17), mode="bilinear", align_corners=False)
    err = (y.double() - want).abs()
    assert (err <= want.abs() * 2.0 ** -8 + 1e-6).all(), float(err.max())


DECLINES = {   # name -> (net arguments, the reason's words)
    "scales_not_out_over_in": (dict(hw=(7, 9), scales=(2.9, 2.8)), "scales that are not"),
    "align_corners": (dict(hw=(7, 9), out_hw=(13, 17), coord="align_corners"), "coordinate_transformation_mode"),
    "nearest": (dict(hw=(7, 9), out_hw=(14, 18), mode="nearest"), "only the linear mode"),
    "pytorch_half_pixel_to_one_row": (dict(hw=(7, 9), out_hw=(1, 17), coord="pytorch_half_pixel"),
                                      "coordinate_transformation_mode"),
}


@pytest.mark.parametrize("name", list(DECLINES))
def test_other_mappings_decline_with_a_reason(name):
    args, words = DECLINES[name]
    m = _net(**args)
    cm = fg.compile(m, fg.Config(threads=2))
    call = _resize_call(cm)
    assert not isinstance(call.kernel, DnnlKernel)
    (declined,) = [d for d in cm.report.kernels["declined"] if d["node"] == call.node.name]
    assert words in declined["reason"], declined
    hw = args["hw"]
    feeds = {"x": np.random.default_rng(7).standard_normal((1, 8, *hw)).astype(np.float32)}
    assert_outputs_close(cm.run(feeds), ort_run(m, feeds), rtol=1e-4)
