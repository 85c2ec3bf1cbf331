"""The CPU backend's kernels for the decoder ops: the bfloat16 rotation and gating that take
their float32 buffer from the workspace (``runtime/backends/cpu/rotary_gating.py``) give the
ops' own kernels' numbers bit for bit, into ``out=``; float32 nodes are left to the ops' own
kernels (None)."""
from __future__ import annotations

import pytest
import torch

from fusegraph.ir import DType, Graph
from fusegraph.ops import opdef_for
from fusegraph.ops.registry import NodeContext
from fusegraph.runtime.backends.cpu.rotary_gating import gated_kernel, rotary_kernel
from fusegraph.runtime.backends.cpu.workspace import Workspace


def _ctx(op, shapes, attrs, dtype):
    g = Graph("k")
    ins = [g.add_input(f"x{i}", dtype if i == 0 else DType.FLOAT, s) for i, s in enumerate(shapes)]
    n = g.add_node(op, ins, attrs=attrs, domain="fusegraph", version=1)
    n.outputs[0].dtype = dtype
    return NodeContext(n, "cpu")


@pytest.mark.parametrize("heads", [0, 2])
def test_bf16_rotary_matches_its_op(heads):
    x = torch.randn(2, 5, 16) if heads else torch.randn(2, 3, 5, 8)
    x = x.bfloat16()
    cos, sin = torch.randn(1, 1, 5, 8), torch.randn(1, 1, 5, 8)
    ctx = _ctx("RotaryEmbedding", [tuple(x.shape), (1, 1, 5, 8), (1, 1, 5, 8)], {"heads": heads}, DType.BFLOAT16)
    fast, own = rotary_kernel(ctx, Workspace()), opdef_for(ctx.node).build(ctx)
    out = torch.empty_like(x)
    assert fast(x, cos, sin, out=out) is out and torch.equal(out, own(x, cos, sin))


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_bf16_gating_matches_its_op(act):
    x = (torch.randn(3, 4, 10) * 3).bfloat16()
    ctx = _ctx("GatedActivation", [(3, 4, 10)], {"activation": act}, DType.BFLOAT16)
    fast, own = gated_kernel(ctx, Workspace()), opdef_for(ctx.node).build(ctx)
    out = torch.empty(3, 4, 5, dtype=torch.bfloat16)
    assert fast(x, out=out) is out and torch.equal(out, own(x))


def test_float32_nodes_run_their_own_kernels():
    assert rotary_kernel(_ctx("RotaryEmbedding", [(1, 2, 4, 8), (4, 8), (4, 8)], {}, DType.FLOAT), Workspace()) is None
    assert gated_kernel(_ctx("GatedActivation", [(2, 8)], {"activation": "silu"}, DType.FLOAT), Workspace()) is None
