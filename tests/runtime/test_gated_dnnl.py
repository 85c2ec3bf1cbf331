"""A GatedActivation's GELU as oneDNN's eltwise over rows (``runtime/backends/cpu/dnnl/gated.py``):
the float64 formula's numbers on finite inputs at any row count, ONNX's NaN / Inf wherever a
run brings one (the op's own GELU then runs), one rounding for bfloat16, and the activations
ATen runs as fast left to it."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fusegraph.ir import DType, Graph
from fusegraph.ops import opdef_for
from fusegraph.ops.registry import NodeContext
from fusegraph.runtime.backends.cpu.dnnl import available, rows_eltwise
from fusegraph.runtime.backends.cpu.dnnl.gated import gated_kernel
from fusegraph.runtime.backends.cpu.dnnl.primitive import Resources, create
from fusegraph.runtime.backends.protocol import Decline

pytestmark = pytest.mark.skipif(not available(), reason="oneDNN is not loadable here")
N = 96


def _ctx(activation: str, dtype=DType.FLOAT, shape=("batch", "seq", 2 * N)):
    g = Graph("gated")
    x = g.add_input("x", dtype, shape)
    node = g.add_node("GatedActivation", [x], attrs={"activation": activation}, domain="fusegraph", version=1)
    node.outputs[0].dtype = dtype
    return NodeContext(node, "cpu")


def _formula(x: torch.Tensor, activation: str) -> torch.Tensor:
    x = x.double()
    approximate = "tanh" if activation == "gelu_tanh" else "none"
    return torch.nn.functional.gelu(x[..., :N], approximate=approximate) * x[..., N:]


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh"])
@pytest.mark.parametrize("exact", [True, False])
def test_finite_rows_match_the_formula_at_every_row_count(activation, exact, monkeypatch):
    """The GELU runs on oneDNN (the op's own is refused here) at one row and at row counts
    split into several pieces (201: 192, 8, 1), into ``out=`` whatever it held; the pieces'
    primitives are made once per count."""
    kernel = gated_kernel(_ctx(activation), Resources(), exact)
    assert not isinstance(kernel, Decline), kernel

    def refused(*_args):
        raise AssertionError("the op's own GELU ran on finite inputs")
    kernel._act = refused
    made = []
    monkeypatch.setattr(rows_eltwise, "create", lambda what, f: made.append(what) or create(what, f))
    rng = np.random.default_rng(0)
    for rows in (1, 201, 3, 201, 64):
        x = torch.from_numpy((rng.standard_normal((1, rows, 2 * N)) * 3).astype(np.float32))
        out = torch.full((1, rows, N), float("nan"))
        assert kernel(x, out=out) is out
        torch.testing.assert_close(out, _formula(x, activation).float(), rtol=1e-4, atol=1e-5)
    assert sorted(made) == ["eltwise"] * len({1, 192, 3, 64}), made     # 8 was made with the kernel


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh"])
def test_nan_and_infinities_are_onnx_s(activation):
    """Where a gate holds a NaN or an infinity the exact form gives what the op's own kernel
    gives (+inf stays +inf, NaN stays NaN), rows without one unchanged; the fast form
    (``Config.fast_math``) keeps oneDNN's numbers on the finite rows."""
    ctx = _ctx(activation)
    own = opdef_for(ctx.node).build(ctx)
    kernel = gated_kernel(ctx, Resources(), True)
    rng = np.random.default_rng(1)
    x = torch.from_numpy(rng.standard_normal((1, 12, 2 * N)).astype(np.float32))
    x[0, 2, 5], x[0, 4, 7], x[0, 6, 9], x[0, 8, N + 3] = math.inf, -math.inf, math.nan, math.inf
    got = kernel(x, out=torch.empty(1, 12, N))
    want = own(x)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    finite = torch.isfinite(want)
    assert torch.equal(torch.isinf(got), torch.isinf(want)) and torch.equal(got[~finite & ~torch.isnan(want)],
                                                                            want[~finite & ~torch.isnan(want)])
    torch.testing.assert_close(got[finite], want[finite], rtol=1e-4, atol=1e-5)
    assert math.isinf(float(want[0, 2, 5])), "the op's own GELU keeps +inf: the case checked above is real"
    fast = gated_kernel(ctx, Resources(), False)
    clean = x.clone()
    clean[0, :, :][~torch.isfinite(clean[0])] = 0.5
    torch.testing.assert_close(fast(clean), own(clean), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [DType.BFLOAT16, DType.FLOAT16])
def test_reduced_types_round_once(dtype):
    """bfloat16 / float16: computed in float32 and rounded once into the output, as the op's
    own kernel does: within one unit in the last place of the float64 formula (the tanh form
    near zero: within a few 1e-6, where ATen's GELU saturates to 0 and oneDNN's does not)."""
    ctx = _ctx("gelu_tanh", dtype)
    kernel = gated_kernel(ctx, Resources(), True)
    torch_dtype = dtype.to_torch()
    x = (torch.randn(2, 33, 2 * N, generator=torch.Generator().manual_seed(2)) * 3).to(torch_dtype)
    got = kernel(x, out=torch.empty(2, 33, N, dtype=torch_dtype))
    assert got.dtype == torch_dtype
    want = _formula(x, "gelu_tanh")
    assert bool(((got.double() - want).abs() <= torch.finfo(torch_dtype).eps * want.abs() + 4e-6).all())


@pytest.mark.parametrize("activation", ["silu", "relu", "sigmoid"])
def test_activations_aten_runs_as_fast_are_left_to_it(activation):
    """Not taken, and not a decline either (the report lists none): ATen's own are as fast."""
    assert gated_kernel(_ctx(activation), Resources(), True) is None


def test_an_odd_or_unknown_width_declines():
    assert isinstance(gated_kernel(_ctx("gelu", shape=("rows", "width")), Resources(), True), Decline)
    assert isinstance(gated_kernel(_ctx("gelu", shape=(4, 2 * N + 1)), Resources(), True), Decline)
