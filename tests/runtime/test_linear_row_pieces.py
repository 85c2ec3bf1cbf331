"""A bfloat16 product of one AMX block of rows and a small rest, run as two calls
(``runtime/backends/cpu/dnnl/linear.py``, ``row_pieces_plan``): which shapes take the pieces,
and the pieces' numbers, bit for bit those of one call (the same arithmetic per row) and
close to float32 arithmetic on the same bfloat16 values, their activation and bias included,
into ``out=`` whatever it held and again into another output."""
from __future__ import annotations

import pytest
import torch

from fusegraph.ir import DType, Graph
from fusegraph.ops.registry import NodeContext
from fusegraph.runtime.backends.cpu.dnnl import available, linear
from fusegraph.runtime.backends.cpu.dnnl.linear import AMX_ROW_BLOCK, RowPieces, linear_kernel, row_pieces_plan
from fusegraph.runtime.backends.cpu.dnnl.primitive import Resources
from fusegraph.runtime.backends.cpu.dnnl.weights import WeightStore
from fusegraph.runtime.backends.protocol import Decline

AMX = "brg:avx512_core_amx"


@pytest.mark.parametrize("rows, cols, depth, threads, want", [
    (257, 1536, 384, 2, (256, 1)),          # a vision transformer's 256 patches and its class token
    (384, 384, 384, 2, (256, 128)),
    (256, 1536, 384, 2, None),              # one block: one call shares it between the threads
    (448, 1536, 384, 2, None),              # a rest of more than half a block
    (640, 1536, 384, 2, None),              # more blocks: one call's partition
    (257, 192, 768, 2, None),               # narrow
    (257, 384, 256, 2, None),               # light
    (257, 1536, 384, 1, None),              # one thread
])
def test_which_products_take_pieces(rows, cols, depth, threads, want):
    assert row_pieces_plan(rows, cols, depth, AMX, threads) == want
    assert row_pieces_plan(rows, cols, depth, "brg:avx512_core", threads) is None     # float32: no AMX blocks


def _ctx(rows, k, n, activation="gelu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    g = Graph("product")
    x = g.add_input("x", DType.BFLOAT16, (1, rows, k))
    w = g.add_constant("w", (torch.randn(n, k, generator=gen) / k ** 0.5).bfloat16())
    b = g.add_constant("b", torch.randn(n, generator=gen))
    node = g.add_node("LinearAct", [x, w, b], attrs={"trans_b": 1, "activation": activation}, domain="fusegraph",
                      version=1)
    node.outputs[0].dtype, node.outputs[0].shape = DType.BFLOAT16, (1, rows, n)
    return NodeContext(node, "cpu")


@pytest.mark.skipif(not available(), reason="oneDNN is not loadable here")
@pytest.mark.parametrize("activation, exact", [("gelu", False), ("relu", True), ("none", True)])
def test_pieces_compute_what_one_call_computes(activation, exact, monkeypatch):
    if torch.get_num_threads() < 2:
        pytest.skip("one thread: the product runs as one call")
    rows, k, n = AMX_ROW_BLOCK + 1, 384, 1536
    kernel = linear_kernel(_ctx(rows, k, n, activation), WeightStore(), Resources(), exact)
    assert not isinstance(kernel, Decline), kernel
    if "amx" not in kernel.impl:
        pytest.skip(f"no AMX here ({kernel.impl}): the product runs as one call")
    assert isinstance(kernel, RowPieces) and kernel.pieces == (AMX_ROW_BLOCK, 1)
    monkeypatch.setattr(linear, "row_pieces_plan", lambda *args: None)
    one = linear_kernel(_ctx(rows, k, n, activation), WeightStore(), Resources(), exact)
    assert not isinstance(one, RowPieces)
    x = (torch.randn(1, rows, k, generator=torch.Generator().manual_seed(1)) * 2).bfloat16()
    out = torch.full((1, rows, n), float("nan"), dtype=torch.bfloat16)
    for _ in range(2):
        assert kernel(x, out=out) is out
        assert torch.equal(out, one(x, out=torch.empty(1, rows, n, dtype=torch.bfloat16)))
    ctx = _ctx(rows, k, n, activation)
    w, b = ctx.node.inputs[1].const.float(), ctx.node.inputs[2].const
    ref = torch.nn.functional.linear(x.float(), w, b)
    ref = {"gelu": torch.nn.functional.gelu, "relu": torch.relu, "none": lambda t: t}[activation](ref)
    torch.testing.assert_close(out.float(), ref, rtol=1.6e-2, atol=1e-2)
    other = kernel(x, out=torch.empty(1, rows, n, dtype=torch.bfloat16))
    assert torch.equal(other, out)
