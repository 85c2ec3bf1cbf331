"""RotaryEmbedding of bfloat16 x with constant tables on oneDNN
(``runtime/backends/cpu/dnnl/rotary.py``): against the op's own kernel (ATen: the graph's
arithmetic in float32, rounded once) in both forms (a projection before its head split,
``heads`` > 0, and split heads), bit for bit, and within half a bf16 unit of float32 arithmetic
on the same values; NaN / Inf as the graph gives them, equal tables held once, and the cases
that decline (float32 is left to its own kernel, as fast)."""
from __future__ import annotations

import math

import pytest
import torch

from cpu_isa import needs_avx512
from fusegraph.ir import DType, Graph
from fusegraph.ops import opdef_for
from fusegraph.ops.registry import NodeContext
from fusegraph.runtime.backends.cpu.dnnl import available
from fusegraph.runtime.backends.cpu.dnnl.primitive import Resources
from fusegraph.runtime.backends.cpu.dnnl.rotary import rotary_kernel
from fusegraph.runtime.backends.protocol import Decline

pytestmark = [pytest.mark.skipif(not available(), reason="oneDNN is not loadable here"), needs_avx512]
B, S, H, D = 2, 12, 4, 16
FORMS = {"projection": ((B, S, H * D), 4), "heads": ((B, H, S, D), 0)}


def _tables(seed=0):
    """Real tables' form: cos / sin of position * frequency, the halves equal (sin 0 at position 0)."""
    freq = 1.0 / (10000 ** (torch.arange(0, D, 2, dtype=torch.float64) / D)) * (1 + seed)
    angles = torch.arange(S, dtype=torch.float64)[:, None] * freq[None, :]
    angles = torch.cat([angles, angles], -1)
    return angles.cos().float().view(1, 1, S, D), angles.sin().float().view(1, 1, S, D)


def _ctx(form, dtype=DType.BFLOAT16, seed=0, graph=None):
    shape, heads = FORMS[form]
    g = graph or Graph("rotary")
    cos, sin = _tables(seed)
    x = g.add_input(f"x{len(g.nodes)}", dtype, shape)
    node = g.add_node("RotaryEmbedding", [x, g.add_constant(f"cos{len(g.nodes)}", cos),
                                          g.add_constant(f"sin{len(g.nodes)}", sin)],
                      attrs={"heads": heads}, domain="fusegraph", version=1)
    node.outputs[0].dtype, node.outputs[0].shape = dtype, shape
    return NodeContext(node, "cpu")


def _own(ctx, x):
    return opdef_for(ctx.node).build(ctx)(x, ctx.node.inputs[1].const, ctx.node.inputs[2].const)


def _x(form, seed=1, dtype=torch.bfloat16):
    return (torch.randn(FORMS[form][0], generator=torch.Generator().manual_seed(seed)) * 3).to(dtype)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_matches_the_op_s_own_kernel(form):
    """Bit for bit the op's own kernel, twice into the same output (the second call reuses the
    bound pointers), then into another (re-pointed); within half a bf16 unit of float32
    arithmetic on the same values (rounded once)."""
    ctx = _ctx(form)
    kernel = rotary_kernel(ctx, Resources())
    assert not isinstance(kernel, Decline), kernel
    assert kernel.impl.startswith("jit"), kernel.impl
    x = _x(form)
    want = _own(ctx, x)
    assert want.dtype == torch.bfloat16
    out = torch.full(x.shape, float("nan"), dtype=torch.bfloat16)
    for _ in range(2):
        assert kernel(x, out=out) is out
        assert torch.equal(out, want)
    exact = _own(_ctx(form, DType.FLOAT), x.float())
    assert bool(((out.float() - exact).abs() <= torch.finfo(torch.bfloat16).eps / 2 * exact.abs() + 1e-6).all())
    x2 = _x(form, seed=5)
    assert torch.equal(kernel(x2, out=torch.empty(x.shape, dtype=torch.bfloat16)), _own(ctx, x2))


@pytest.mark.parametrize("form", sorted(FORMS))
def test_nan_and_infinities_are_the_graph_s(form):
    """An infinity meets the sin table's zero at position 0 (inf * 0 = NaN there, +-inf
    elsewhere in its pair), a NaN its pair; everything else unchanged."""
    ctx = _ctx(form)
    kernel = rotary_kernel(ctx, Resources())
    x = _x(form)
    flat = x.view(-1)
    flat[3], flat[5 * D + 2], flat[-7] = math.inf, -math.inf, math.nan
    got, want = kernel(x, out=torch.empty(x.shape, dtype=torch.bfloat16)), _own(ctx, x)
    assert torch.equal(torch.isnan(got), torch.isnan(want)) and bool(torch.isnan(want).any())
    assert torch.equal(torch.isposinf(got), torch.isposinf(want)) and torch.equal(torch.isneginf(got),
                                                                                  torch.isneginf(want))
    finite = torch.isfinite(want)
    assert bool((~finite).sum() > 3)
    assert torch.equal(got[finite], want[finite])


def test_equal_tables_are_held_once():
    resources, g = Resources(), Graph("two")
    a = rotary_kernel(_ctx("projection", graph=g), resources)
    b = rotary_kernel(_ctx("projection", graph=g), resources)           # equal tables, other constants
    c = rotary_kernel(_ctx("projection", seed=1, graph=g), resources)   # other frequencies
    assert not any(isinstance(k, Decline) for k in (a, b, c))
    assert len(resources.shared["rotary tables"]) == 2
    x = _x("projection")
    torch.testing.assert_close(b(x), a(x), rtol=0, atol=0)


def test_float32_is_left_to_its_own_kernel_and_other_cases_decline():
    """float32: not taken, and not a decline either (its own kernel is as fast); tables computed
    at run time and an odd axis decline."""
    assert rotary_kernel(_ctx("projection", DType.FLOAT), Resources()) is None
    g = Graph("computed")
    x = g.add_input("x", DType.BFLOAT16, (B, S, H * D))
    cos, sin = g.add_input("cos", DType.FLOAT, (1, 1, S, D)), g.add_input("sin", DType.FLOAT, (1, 1, S, D))
    node = g.add_node("RotaryEmbedding", [x, cos, sin], attrs={"heads": H}, domain="fusegraph", version=1)
    node.outputs[0].dtype, node.outputs[0].shape = DType.BFLOAT16, (B, S, H * D)
    assert isinstance(rotary_kernel(NodeContext(node, "cpu"), Resources()), Decline)
    g = Graph("odd")
    x = g.add_input("x", DType.BFLOAT16, (B, H, S, 5))
    tab = torch.ones(1, 1, S, 5)
    node = g.add_node("RotaryEmbedding", [x, g.add_constant("c", tab), g.add_constant("s", tab)],
                      attrs={"heads": 0}, domain="fusegraph", version=1)
    node.outputs[0].dtype, node.outputs[0].shape = DType.BFLOAT16, (B, H, S, 5)
    assert isinstance(rotary_kernel(NodeContext(node, "cpu"), Resources()), Decline)
