"""A bf16 product rounds once: its operands are bf16, it accumulates in float32, adds its
float32 bias, its residual and its activation, and rounds its result (the policy's claim,
``passes/precision_policy.py``; what oneDNN's bf16 kernels do, and what the float32 kernels
over bf16 storage do on a CPU without bf16 arithmetic).

The oracle is that arithmetic written out with torch (BatchNorm folded into the weights in
float32, operands rounded to bf16, float32 convolution, one rounding), independent of the
compiler. The compiled bf16 run may differ from it only where a float32 sum in another order
lands on the other side of a bf16 rounding boundary: by one bf16 step, on a few elements. Each
test also checks that a double rounding (the sum rounded before the residual, or a rounded
bias) would be caught: it moves far more elements.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F_

import fusegraph as fg
from fusegraph.ir import DType
from fusegraph.runtime.backends.cpu.dnnl import available

sys.path.insert(0, str(Path(__file__).parents[1] / "passes"))
from passes_util import F, const, model, node  # noqa: E402

pytestmark = pytest.mark.skipif(not available(), reason="oneDNN (onednn-cpu-gomp) does not load here")

EPS = 1e-5
MOVED_AT_MOST = 0.01      # elements one bf16 step off the oracle (float32 order), at most
DOUBLE_ROUNDING_MOVES = 0.03   # a second rounding (or a rounded bias) moves at least this share (checked)


def rnd(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def r16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).float()


def _conv_bn(x, y, name, cin, cout, seed):
    """Conv (He weights, bias) then BatchNormalization, and its float32-folded (weight, bias)."""
    w = rnd(cout, cin, 3, 3, seed=seed, scale=float(np.sqrt(2.0 / (cin * 9))))
    b, gamma = rnd(cout, seed=seed + 1, scale=0.1), 1.0 + 0.2 * rnd(cout, seed=seed + 2)
    beta, mean = rnd(cout, seed=seed + 3, scale=0.1), rnd(cout, seed=seed + 4, scale=0.1)
    var = 0.5 + np.abs(rnd(cout, seed=seed + 5))
    nodes = [node("Conv", [x, name + "_w", name + "_b"], name + "_c", pads=[1] * 4),
             node("BatchNormalization", [name + "_c"] + [name + s for s in ("_g", "_be", "_m", "_v")], y,
                  epsilon=EPS)]
    inits = [const(name + "_w", w), const(name + "_b", b), const(name + "_g", gamma), const(name + "_be", beta),
             const(name + "_m", mean), const(name + "_v", var)]
    s = torch.from_numpy(gamma) / torch.sqrt(torch.from_numpy(var) + EPS)
    folded = (torch.from_numpy(w) * s.view(-1, 1, 1, 1), (torch.from_numpy(b) - torch.from_numpy(mean)) * s
              + torch.from_numpy(beta))
    return nodes, inits, folded


def _residual_block():
    """x -> conv+BN+relu -> a; a -> conv+BN, + a, relu -> y: both convolutions bf16."""
    n1, i1, f1 = _conv_bn("x", "a_bn", "c1", 8, 16, seed=1)
    n2, i2, f2 = _conv_bn("a", "b_bn", "c2", 16, 16, seed=11)
    nodes = n1 + [node("Relu", ["a_bn"], "a")] + n2 + [node("Add", ["b_bn", "a"], "s"), node("Relu", ["s"], "y")]
    return model(nodes, [("x", F, [1, 8, 12, 12])], ["y"], i1 + i2, opset=17), f1, f2


def _one_step_off(got: torch.Tensor, want: torch.Tensor) -> float:
    """Share of elements that differ; asserts none differs by more than one bf16 step."""
    diff = (got - want).abs()
    step = torch.where(want != 0, want.abs(), got.abs()) * 2.0 ** -7      # one bf16 step (8-bit significand)
    steps = diff / step.clamp_min(torch.finfo(torch.float32).tiny)
    assert bool((steps <= 1.0001).all()), f"off by more than one bf16 step: up to {float(steps.max()):.1f} steps"
    return float((diff > 0).float().mean())


def test_residual_convolution_rounds_once():
    m, (w1, b1), (w2, b2) = _residual_block()
    cm = fg.compile(m, fg.Config(threads=2, precision="bf16", op_precision={"Conv": "bf16"}))
    convs = [n for n in cm.graph.nodes if n.op_type == "FusedConv"]
    assert len(convs) == 2 and all(n.inputs[0].dtype == DType.BFLOAT16 for n in convs), \
        [(n.op_type, n.inputs[0].dtype) for n in cm.graph.nodes]
    assert [len(n.inputs) > 3 and n.inputs[3] is not None for n in convs] == [False, True]   # residual fused
    x = torch.from_numpy(rnd(1, 8, 12, 12, seed=5))
    got = torch.from_numpy(np.asarray(cm.run({"x": x.numpy()})["y"]))
    a = r16(F_.conv2d(r16(x), r16(w1), b1, padding=1).relu())
    pre = F_.conv2d(a, r16(w2), b2, padding=1)
    want = r16((pre + a).relu())
    moved = _one_step_off(got, want)
    assert moved <= MOVED_AT_MOST, f"{moved:.2%} of the outputs are one bf16 step off a single rounding"
    twice = r16((r16(pre) + a).relu())                     # the sum rounded before the residual
    assert float((twice != want).float().mean()) >= DOUBLE_ROUNDING_MOVES
    rounded_bias = r16((F_.conv2d(a, r16(w2), r16(b2), padding=1) + a).relu())
    assert float((rounded_bias != want).float().mean()) >= DOUBLE_ROUNDING_MOVES


def test_hidden_product_rounds_once():
    """Gemm + bias + relu (``g1``, named bf16: its output is a graph output too), then the
    logits' Gemm: the hidden product rounds once after its float32 bias and activation; the
    logits product reads bf16 operands and writes float32."""
    w1, b1 = rnd(256, 64, seed=3, scale=float(np.sqrt(2 / 64))), rnd(256, seed=4, scale=0.1)
    w2, b2 = rnd(32, 256, seed=5, scale=float(np.sqrt(2 / 256))), rnd(32, seed=6, scale=0.1)
    m = model([node("Gemm", ["x", "w1", "b1"], "h", transB=1, name="g1"), node("Relu", ["h"], "hr"),
               node("Gemm", ["hr", "w2", "b2"], "y", transB=1, name="g2")], [("x", F, [1, 64])], ["hr", "y"],
              [const("w1", w1), const("b1", b1), const("w2", w2), const("b2", b2)], opset=17)
    cm = fg.compile(m, fg.Config(threads=2, precision="bf16", op_precision={"g1": "bf16"}))
    products = [n for n in cm.graph.nodes if n.op_type in ("LinearAct", "Linear")]
    assert [(n.inputs[0].dtype, n.outputs[0].dtype) for n in products] == \
        [(DType.BFLOAT16, DType.BFLOAT16), (DType.BFLOAT16, DType.FLOAT)], [n.op_type for n in cm.graph.nodes]
    x = torch.from_numpy(rnd(1, 64, seed=7))
    out = {k: torch.from_numpy(np.asarray(v)) for k, v in cm.run({"x": x.numpy()}).items()}
    pre = r16(x) @ r16(torch.from_numpy(w1)).T
    want = r16((pre + torch.from_numpy(b1)).relu())
    moved = _one_step_off(out["hr"], want)
    assert moved <= MOVED_AT_MOST, f"{moved:.2%} of the hidden outputs are one bf16 step off a single rounding"
    twice = r16((r16(pre) + torch.from_numpy(b1)).relu())           # rounded before the bias
    assert float((twice != want).float().mean()) >= DOUBLE_ROUNDING_MOVES
    logits = out["hr"] @ r16(torch.from_numpy(w2)).T + torch.from_numpy(b2)   # its own hidden values, unrounded sum
    np.testing.assert_allclose(out["y"].numpy(), logits.numpy(), rtol=1e-5, atol=1e-5)
