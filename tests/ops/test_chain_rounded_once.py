"""An elementwise chain that follows a bfloat16 input under mixed precision computes every
step in float32 and rounds once, over multi-megabyte tensors a block at a time
(``ops/fused_transformer.py``): bit for bit the float32 computation of the same bfloat16
values, rounded once, in the blocked layout and in another."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fusegraph.ir import DType, Graph
from fusegraph.ops import opdef_for
from fusegraph.ops.fused_transformer import ROUNDED_BLOCK
from fusegraph.ops.registry import NodeContext


def _chain_node(steps, n: int, shape, dtype: DType):
    g = Graph("chain")
    ins = [g.add_input(f"x{i}", dtype, shape) for i in range(n)]
    node = g.add_node("ElementwiseChain", ins, outputs=1, attrs={"steps": steps}, domain="fusegraph")
    node.outputs[0].dtype = dtype
    node.outputs[0].shape = shape
    return node


@pytest.mark.parametrize("steps", [["Add i0 i1", "Add p i2"], ["Mul i0 i1", "Sub p i2", "Relu p"]])
def test_a_bfloat16_chain_in_blocks_is_the_float32_one_rounded_once(steps):
    shape = (1, 32, 40, 40)          # more elements than one block, not a multiple of it
    assert 32 * 40 * 40 > ROUNDED_BLOCK and (32 * 40 * 40) % ROUNDED_BLOCK
    rng = np.random.default_rng(1)
    xs = [torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(torch.bfloat16)
          .contiguous(memory_format=torch.channels_last) for _ in range(3)]
    node = _chain_node(steps, 3, shape, DType.BFLOAT16)
    kernel = opdef_for(node).build(NodeContext(node, "cpu"))
    f32_node = _chain_node(steps, 3, shape, DType.FLOAT)
    want = opdef_for(f32_node).build(NodeContext(f32_node, "cpu"))(*(x.float() for x in xs)).to(torch.bfloat16)
    out = torch.full(shape, float("nan"), dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    got = kernel(*xs, out=out)
    assert got is out and torch.equal(got, want)
    assert torch.equal(kernel(*(x.contiguous() for x in xs)), want)      # another layout: the whole-tensor path
