"""A static product's weight in the plain layout (oneDNN's gemm, where the CPU has no brgemm
matmul for the type: AVX2) is held with each row one cache line longer where a row's bytes
are a multiple of ``SET_ALIASING_BYTES`` (``runtime/backends/cpu/dnnl/linear.py``,
``matmul_primitive`` / ``longer_rows``): which layouts take it, and the product over the held
weight against float64 arithmetic, its bias and activation included, into ``out=`` whatever it
held; the store's only form of the weight reads back exactly."""
from __future__ import annotations

import pytest
import torch

from fusegraph.ir import DType, Graph
from fusegraph.ops.registry import NodeContext
from fusegraph.runtime.backends.cpu.dnnl import available, capi
from fusegraph.runtime.backends.cpu.dnnl.blocked import check
from fusegraph.runtime.backends.cpu.dnnl.linear import (LINE_BYTES, SET_ALIASING_BYTES, leading_dimension,
                                                        linear_kernel, longer_rows, matmul_primitive)
from fusegraph.runtime.backends.cpu.dnnl.memory import DTYPES, MemDesc
from fusegraph.runtime.backends.cpu.dnnl.primitive import Resources, create
from fusegraph.runtime.backends.cpu.dnnl.weights import WeightStore
from fusegraph.runtime.backends.protocol import Decline

needs_dnnl = pytest.mark.skipif(not available(), reason="oneDNN is not loadable here")


@needs_dnnl
@pytest.mark.parametrize("k, n, dtype, ld", [
    (768, 3072, torch.float32, 3072 + 16),      # 12 KiB rows
    (3072, 768, torch.float32, 768 + 16),       # 3 KiB rows
    (64, 256, torch.float32, 256 + 16),         # 1 KiB rows
    (64, 512, torch.bfloat16, 512 + 32),        # 1 KiB of bfloat16
    (64, 200, torch.float32, None),             # 800-byte rows: no aliasing
    (64, 260, torch.float32, None),
    (1, 768, torch.float32, None),              # one row: nothing to alias with
])
def test_which_plain_layouts_are_held_longer(k, n, dtype, ld):
    got = longer_rows(MemDesc.of((k, n), dtype))
    if ld is None:
        assert got is None
        return
    assert leading_dimension(n, dtype) == ld == n + LINE_BYTES // dtype.itemsize
    assert (n * dtype.itemsize) % SET_ALIASING_BYTES == 0
    assert got == MemDesc.of((k, n), dtype, (ld, 1))
    assert longer_rows(got) is None                             # held longer once
    assert longer_rows(MemDesc.of((k, n), dtype, (1, k))) is None     # W^T: not this layout
    assert longer_rows(MemDesc.of((2, k, n), dtype)) is None          # a batch of weights


@needs_dnnl
def test_a_blocked_layout_is_left_as_oneDNN_picked_it():
    """An inner product's weight layout (blocked on every CPU oneDNN has a jit kernel for) is
    not a plain one: nothing to hold longer."""
    lib = capi.load()
    x, w, y = (MemDesc.of((64, 256), torch.float32), MemDesc.tagged([768, 256], DTYPES[torch.float32], capi.TAG_ANY),
               MemDesc.of((64, 768), torch.float32))
    prim = create("inner product", lambda pd: lib.inner_product_forward_primitive_desc_create(
        pd, lib.engine, capi.FORWARD_INFERENCE, x.handle, w.handle, None, y.handle, None))
    md = prim.md(capi.Q_WEIGHTS_MD)
    if not md.describe()["blocks"]:
        pytest.skip(f"{prim.impl}: a plain layout on this CPU")
    assert longer_rows(md) is None


def _ctx(rows, k, n, activation, trans_b, seed=0):
    gen = torch.Generator().manual_seed(seed)
    g = Graph("product")
    x = g.add_input("x", DType.FLOAT, (1, rows, k))
    shape = (n, k) if trans_b else (k, n)
    w = g.add_constant("w", torch.randn(*shape, generator=gen) * (2 / k) ** 0.5)
    b = g.add_constant("b", torch.randn(n, generator=gen))
    node = g.add_node("LinearAct", [x, w, b], attrs={"trans_b": int(trans_b), "activation": activation},
                      domain="fusegraph", version=1)
    node.outputs[0].dtype, node.outputs[0].shape = DType.FLOAT, (1, rows, n)
    return NodeContext(node, "cpu"), w.const, b.const


@needs_dnnl
@pytest.mark.parametrize("rows", [1, 7, 128])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("activation, exact", [("relu", True), ("gelu", True), ("gelu", False), ("none", True)])
def test_the_product_over_the_held_weight(rows, trans_b, activation, exact):
    k, n = 256, 768
    ctx, w, b = _ctx(rows, k, n, activation, trans_b)
    store = WeightStore()
    kernel = linear_kernel(ctx, store, Resources(), exact)
    assert not isinstance(kernel, Decline), kernel
    (form,) = store.forms["w"]
    plain = matmul_primitive(MemDesc.of((rows, k), torch.float32),
                             MemDesc.tagged([k, n], DTYPES[torch.float32], capi.TAG_ANY), None,
                             MemDesc.of((rows, n), torch.float32), [], False)
    if not plain.md(capi.Q_WEIGHTS_MD).describe()["blocks"]:        # oneDNN's gemm here (AVX2): held longer
        assert form.desc["strides"] == [n + 16, 1] and form.data.numel() == k * (n + 16) * 4, form.desc
        assert kernel.impl.startswith("gemm:jit"), kernel.impl
    assert check(form.desc, form.data.numel()) is None
    assert torch.equal(store.plain("w", torch.empty(w.shape, device="meta")), w)
    x = torch.randn(1, rows, k, generator=torch.Generator().manual_seed(1))
    out = torch.full((1, rows, n), float("nan"))
    got = kernel(x, out=out)
    y = x.double() @ (w.double().t() if trans_b else w.double()) + b.double()
    want = {"relu": torch.relu, "gelu": torch.nn.functional.gelu, "none": lambda t: t}[activation](y)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
