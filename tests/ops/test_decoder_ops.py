"""The decoder ops (``ops/fused_decoder.py``) and grouped-query attention (``kv_repeat``): their
kernels against the formulas they fuse (numpy / explicit torch), written into ``out=``
buffers bit for bit as returned, and their run-time shape rules (``ops/shape_rules.py``)
against the kernels' own output shapes."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fusegraph.ir import DType, Graph
from fusegraph.ops import opdef_for
from fusegraph.ops.registry import NodeContext
from fusegraph.ops.shape_rules import rule_for


def _node(op, shapes, attrs=None, consts=None, n_out=1, dtype=DType.FLOAT):
    g = Graph("decoder_ops")
    ins = []
    for i, s in enumerate(shapes):
        if s is None:
            ins.append(None)
        elif consts and i in consts:
            ins.append(g.add_constant(f"c{i}", consts[i]))
        else:
            ins.append(g.add_input(f"x{i}", dtype, tuple(s)))
    node = g.add_node(op, ins, outputs=n_out, attrs=attrs or {}, domain="fusegraph", version=1)
    for o in node.outputs:
        o.dtype = dtype
    return node


def _kernel(node):
    return opdef_for(node).build(NodeContext(node, "cpu"))


def _rule_shapes(node, shapes):
    rule, reads = rule_for(node)
    return [tuple(s) for s in rule(node, shapes, [None] * len(shapes))]


def _rnd(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


# ------------------------------------------------------------------ RMSNorm


@pytest.mark.parametrize("gamma", [True, False])
def test_rms_norm_kernel(gamma):
    x, g = _rnd(2, 3, 16, seed=1) * 3, _rnd(16, seed=2)
    node = _node("RMSNorm", [(2, 3, 16), (16,)] if gamma else [(2, 3, 16)], {"epsilon": 1e-6},
                 consts={1: g} if gamma else None)
    k = _kernel(node)
    y = k(x, g) if gamma else k(x)
    xn = x.double().numpy()
    want = xn / np.sqrt((xn * xn).mean(-1, keepdims=True) + 1e-6) * (g.double().numpy() if gamma else 1.0)
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-6)
    out = torch.empty_like(x)
    assert (k(x, g, out=out) if gamma else k(x, out=out)) is out and torch.equal(out, y)
    assert _rule_shapes(node, [tuple(x.shape)] + ([(16,)] if gamma else [])) == [tuple(y.shape)]


def test_rms_norm_rows_that_overflow_follow_the_float32_graph():
    x = torch.tensor([[3e19, 1.0, 2.0, -1.0], [1.0, float("inf"), 2.0, 3.0], [1.0, float("nan"), 0.0, 1.0]])
    y = _kernel(_node("RMSNorm", [(3, 4)], {"epsilon": 1e-6}))(x)
    assert torch.equal(y[0], torch.zeros(4))                  # squares overflow: the graph's rsqrt is 0
    assert torch.isnan(y[1, 1]) and torch.equal(y[1, [0, 2, 3]], torch.zeros(3))     # inf * 0
    assert torch.isnan(y[2]).all()


def test_skip_rms_norm_kernel_and_rule():
    a, b, g = _rnd(2, 5, 8, seed=1), _rnd(2, 5, 8, seed=2), _rnd(8, seed=3)
    node = _node("SkipRMSNorm", [(2, 5, 8), (2, 5, 8), (8,)], {"epsilon": 1e-5}, consts={2: g}, n_out=2)
    y, s = _kernel(node)(a, b, g)
    assert torch.equal(s, a + b)
    ref = _kernel(_node("RMSNorm", [(2, 5, 8), (8,)], {"epsilon": 1e-5}, consts={1: g}))(a + b, g)
    assert torch.equal(y, ref)
    assert _rule_shapes(node, [(2, 5, 8), (2, 5, 8), (8,)]) == [(2, 5, 8), (2, 5, 8)]


# ------------------------------------------------------------------ RotaryEmbedding


def _rotate_half_ref(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., h:], x[..., :h]], dim=-1) * sin


@pytest.mark.parametrize("heads", [0, 3])
def test_rotary_kernel(heads):
    b, s, d = 2, 5, 8
    cos, sin = _rnd(1, 1, s, d, seed=3), _rnd(1, 1, s, d, seed=4)
    if heads:
        x = _rnd(b, s, heads * d, seed=1)
        want = _rotate_half_ref(x.view(b, s, heads, d).transpose(1, 2), cos, sin).transpose(1, 2).reshape(b, s, -1)
    else:
        x = _rnd(b, 4, s, d, seed=1)
        want = _rotate_half_ref(x, cos, sin)
    node = _node("RotaryEmbedding", [tuple(x.shape), tuple(cos.shape), tuple(sin.shape)], {"heads": heads})
    k = _kernel(node)
    y = k(x, cos, sin)
    torch.testing.assert_close(y, want, rtol=1e-6, atol=1e-6)    # a fused multiply-add: the last bit may differ
    out = torch.empty_like(x)
    assert k(x, cos, sin, out=out) is out and torch.equal(out, y)
    assert _rule_shapes(node, [tuple(x.shape), tuple(cos.shape), tuple(sin.shape)]) == [tuple(x.shape)]


def test_rotary_kernel_rounds_a_bfloat16_input_once():
    x, cos, sin = _rnd(1, 2, 4, 8, seed=1).bfloat16(), _rnd(1, 1, 4, 8, seed=2), _rnd(1, 1, 4, 8, seed=3)
    y = _kernel(_node("RotaryEmbedding", [(1, 2, 4, 8), (1, 1, 4, 8), (1, 1, 4, 8)], dtype=DType.BFLOAT16))(x, cos, sin)
    want = _rotate_half_ref(x.float(), cos, sin)       # float32 inside, one rounding at the end
    assert y.dtype == torch.bfloat16
    mismatched = (y != want.bfloat16()).sum().item()
    assert mismatched <= 1, mismatched                  # a last-bit float32 difference may round the other way


def test_rotary_kernel_refuses_tables_that_enlarge_x():
    k = _kernel(_node("RotaryEmbedding", [(1, 2, 1, 8), (1, 1, 4, 8), (1, 1, 4, 8)]))
    with pytest.raises(RuntimeError, match="does not broadcast"):
        k(_rnd(1, 2, 1, 8), _rnd(1, 1, 4, 8), _rnd(1, 1, 4, 8))


# ------------------------------------------------------------------ GatedActivation

REF = {"silu": lambda a: a * torch.sigmoid(a), "gelu": lambda a: torch.nn.functional.gelu(a),
       "gelu_tanh": lambda a: torch.nn.functional.gelu(a, approximate="tanh"), "relu": torch.relu,
       "sigmoid": torch.sigmoid}


@pytest.mark.parametrize("act", sorted(REF))
def test_gated_activation_kernel(act):
    x = _rnd(2, 3, 12, seed=5) * 3
    x[0, 0, 0], x[0, 0, 1] = float("inf"), float("-inf")
    node = _node("GatedActivation", [(2, 3, 12)], {"activation": act})
    k = _kernel(node)
    y = k(x)
    np.testing.assert_allclose(y.numpy(), (REF[act](x[..., :6]) * x[..., 6:]).numpy(), rtol=1e-6, atol=1e-6,
                               equal_nan=True)
    out = torch.empty(2, 3, 6)
    assert k(x, out=out) is out
    torch.testing.assert_close(out, y, rtol=0, atol=0, equal_nan=True)
    assert _rule_shapes(node, [(2, 3, 12)]) == [(2, 3, 6)]


# ------------------------------------------------------------------ grouped-query attention


@pytest.mark.parametrize("merge", [0, 1])
@pytest.mark.parametrize("mask_heads", [0, 1, 4])
def test_kv_repeat_equals_the_repeated_heads(merge, mask_heads):
    b, h, g, lq, s, d = 2, 4, 2, 3, 5, 8
    q, k, v = _rnd(b, h, lq, d, seed=1), _rnd(b, g, s, d, seed=2), _rnd(b, g, s, d, seed=3)
    shapes = [(b, h, lq, d), (b, g, s, d), (b, g, s, d)]
    args = [q, k, v]
    if mask_heads:
        mask = torch.zeros(b, mask_heads, lq, s)
        mask[..., -1] = -1e9
        shapes.append(tuple(mask.shape))
        args.append(mask)
    attrs = {"scale": d ** -0.5, "merge_heads": merge}
    node = _node("ScaledDotProductAttention", shapes, {**attrs, "kv_repeat": h // g})
    y = _kernel(node)(*args)
    rep = [q, k.repeat_interleave(h // g, dim=1), v.repeat_interleave(h // g, dim=1)] + args[3:]
    want = _kernel(_node("ScaledDotProductAttention", [tuple(t.shape) for t in rep], attrs))(*rep)
    torch.testing.assert_close(y, want, rtol=1e-6, atol=1e-6)
    out = torch.empty_like(want)
    assert _kernel(node)(*args, out=out) is out
    torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)
    assert _rule_shapes(node, shapes) == [tuple(want.shape)]
