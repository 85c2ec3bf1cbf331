"""A GatedLinear of static shape as two oneDNN products with the gating in their epilogues
(``runtime/backends/cpu/dnnl/gated_linear.py``), against the op's own kernel (ATen's products
and activation, float64 where it says so): every activation on finite inputs, ONNX's NaN / Inf
where a row holds one, the reduced types rounded once, the model's gated products sharing one
float32 buffer per thread."""
from __future__ import annotations

import math

import pytest
import torch

from cpu_isa import BF16_ARITHMETIC
from fusegraph.ir import DType, Graph
from fusegraph.ops import opdef_for
from fusegraph.ops.registry import NodeContext
from fusegraph.runtime.backends.cpu.dnnl import available
from fusegraph.runtime.backends.cpu.dnnl.gated_linear import gated_linear_kernel
from fusegraph.runtime.backends.cpu.dnnl.primitive import Resources
from fusegraph.runtime.backends.cpu.dnnl.weights import WeightStore
from fusegraph.runtime.backends.protocol import Decline

pytestmark = pytest.mark.skipif(not available(), reason="oneDNN is not loadable here")
K, N, ROWS = 64, 96, 24
ACTS = ["silu", "relu", "sigmoid", "gelu", "gelu_tanh"]


def _ctx(activation: str, dtype=DType.FLOAT, bias=True, rows=ROWS, seed=0):
    gen = torch.Generator().manual_seed(seed)
    tdt = dtype.to_torch()
    g = Graph("gated_linear")
    x = g.add_input("x", dtype, (1, rows, K))
    ins = [x] + [g.add_constant(f"w{i}", (torch.randn(N, K, generator=gen) / 4).to(tdt)) for i in range(2)]
    if bias:
        ins += [g.add_constant(f"b{i}", torch.randn(N, generator=gen)) for i in range(2)]
    node = g.add_node("GatedLinear", ins, attrs={"activation": activation}, domain="fusegraph", version=1)
    node.outputs[0].dtype, node.outputs[0].shape = dtype, (1, rows, N)
    return NodeContext(node, "cpu")


def _consts(ctx):
    return [v.const for v in ctx.node.inputs[1:]]


def _x(rows=ROWS, seed=1, dtype=torch.float32):
    return (torch.randn(1, rows, K, generator=torch.Generator().manual_seed(seed)) * 2).to(dtype)


@pytest.mark.parametrize("activation", ACTS)
@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_finite_inputs_match_the_op_s_own_kernel(activation, exact, bias):
    """On oneDNN's brgemm (its jit gemm on a CPU without a brgemm matmul, never its
    reference), into ``out=`` whatever it held, twice (the second call reuses the bound
    tensors)."""
    ctx = _ctx(activation, bias=bias)
    own = opdef_for(ctx.node).build(ctx)(_x(), *_consts(ctx))
    kernel = gated_linear_kernel(ctx, WeightStore(), Resources(), exact)
    assert not isinstance(kernel, Decline), kernel
    assert not kernel.impl.startswith("ref"), kernel.impl
    for _ in range(2):
        out = torch.full((1, ROWS, N), float("nan"))
        assert kernel(_x(), out=out) is out
        torch.testing.assert_close(out, own, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("activation", ACTS)
def test_nan_and_infinities_are_onnx_s(activation):
    """A row whose input holds +inf, -inf or NaN gives what the op's own kernel gives there
    (NaN where a product meets inf - inf or inf * 0, +-inf where the gating keeps one), every
    other row unchanged."""
    ctx = _ctx(activation, bias=False)
    kernel = gated_linear_kernel(ctx, WeightStore(), Resources(), True)
    x = _x()
    x[0, 2, 5], x[0, 4, 7], x[0, 6, 9] = math.inf, -math.inf, math.nan
    got = kernel(x, out=torch.empty(1, ROWS, N))
    want = opdef_for(ctx.node).build(ctx)(x, *_consts(ctx))
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert torch.equal(torch.isposinf(got), torch.isposinf(want)) and torch.equal(torch.isneginf(got),
                                                                                  torch.isneginf(want))
    finite = torch.isfinite(want)
    torch.testing.assert_close(got[finite], want[finite], rtol=1e-4, atol=1e-5)
    assert bool(torch.isnan(want[0, 6]).all()) and not bool(torch.isfinite(want[0, 2]).all())


@pytest.mark.skipif(not BF16_ARITHMETIC, reason="no bf16 arithmetic on this CPU")
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_bfloat16_rounds_once(activation):
    """bfloat16 operands: both products accumulated in float32 and not rounded, the gating in
    float32, the result rounded once: within one bf16 unit of the float32 computation from the
    same bf16 operands."""
    ctx = _ctx(activation, DType.BFLOAT16)
    kernel = gated_linear_kernel(ctx, WeightStore(), Resources(), True)
    x = _x(dtype=torch.bfloat16)
    got = kernel(x, out=torch.empty(1, ROWS, N, dtype=torch.bfloat16))
    want = opdef_for(ctx.node).build(ctx)(x, *_consts(ctx))
    assert got.dtype == torch.bfloat16 and want.dtype == torch.bfloat16
    w = [t.float() for t in _consts(ctx)]
    ref = torch.nn.functional.linear(x.float(), w[0], w[2])
    ref = {"silu": torch.nn.functional.silu, "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh")
           }[activation](ref) * torch.nn.functional.linear(x.float(), w[1], w[3])
    bound = torch.finfo(torch.bfloat16).eps * ref.abs() + 1e-3
    assert bool(((got.float() - ref).abs() <= bound).all())


def test_gated_products_share_one_buffer_per_thread():
    """Two nodes of one model (one ``Resources``): their float32 gates are temporaries of one
    buffer on this thread (the one the model's oneDNN kernels share), of the larger node's
    size, whichever runs first."""
    import threading
    resources, store = Resources(), WeightStore()
    small = gated_linear_kernel(_ctx("silu", rows=8, seed=2), store, resources, True)
    large = gated_linear_kernel(_ctx("silu", rows=ROWS, seed=3), store, resources, True)
    small(_x(8), out=torch.empty(1, 8, N))
    large(_x(), out=torch.empty(1, ROWS, N))
    tid = threading.get_ident()
    a, b = small._views[tid].untyped_storage(), large._views[tid].untyped_storage()
    assert a.data_ptr() == b.data_ptr() and b.nbytes() >= large._offset + 4 * ROWS * N


def test_unknown_rows_or_a_computed_weight_decline():
    ctx = _ctx("silu")
    ctx.node.inputs[0].shape = ("batch", ROWS, K)
    assert isinstance(gated_linear_kernel(ctx, WeightStore(), Resources(), True), Decline)
    g = Graph("computed")
    x, w = g.add_input("x", DType.FLOAT, (1, ROWS, K)), g.add_input("w", DType.FLOAT, (N, K))
    node = g.add_node("GatedLinear", [x, w, w], attrs={"activation": "silu"}, domain="fusegraph", version=1)
    node.outputs[0].dtype, node.outputs[0].shape = DType.FLOAT, (1, ROWS, N)
    assert isinstance(gated_linear_kernel(NodeContext(node, "cpu"), WeightStore(), Resources(), True), Decline)


def test_the_op_refuses_weights_or_biases_that_do_not_pair():
    """A re-sealed artifact's GatedLinear whose two weights or biases differ: the op refuses it
    by name when its kernel is made, not at run time."""
    from fusegraph.errors import UnsupportedOpError
    for shapes in (((N, K), (N + 1, K), (N,)), ((N, K), (N, K), (N + 1,))):
        g = Graph("unpaired")
        x = g.add_input("x", DType.FLOAT, (1, ROWS, K))
        ins = [x, g.add_constant("wg", torch.ones(shapes[0])), g.add_constant("wu", torch.ones(shapes[1])),
               g.add_constant("bg", torch.ones(shapes[2])), g.add_constant("bu", torch.ones(N))]
        node = g.add_node("GatedLinear", ins, attrs={"activation": "silu"}, domain="fusegraph", version=1)
        with pytest.raises(UnsupportedOpError, match="GatedLinear|weights|bias"):
            opdef_for(node).build(NodeContext(node, "cpu"))
