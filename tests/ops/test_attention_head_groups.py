"""ScaledDotProductAttention's own kernel, given a workspace, over long sequences: a group of
heads at a time (``ops/fused_transformer.py``: ``SCORES_CHUNK_ABOVE`` / ``SCORES_CHUNK``), the
float64 formula's numbers with every mask form, and a workspace a few MiB, not all heads'
scores."""
from __future__ import annotations

import pytest
import torch

from fusegraph.ir import DType, Graph
from fusegraph.ops import fused_transformer, opdef_for
from fusegraph.ops.registry import NodeContext

B, H, L, D = 1, 12, 320, 16


def _attention(mask_shape, merge: int):
    g = Graph("attention")
    ins = [g.add_input(n, DType.FLOAT, ("b", "h", "l", "d")) for n in "qkv"]
    if mask_shape is not None:
        ins.append(g.add_input("mask", DType.FLOAT, mask_shape))
    node = g.add_node("ScaledDotProductAttention", ins, attrs={"scale": D ** -0.5, "merge_heads": merge},
                      domain="fusegraph", version=1)
    node.outputs[0].dtype = DType.FLOAT
    return opdef_for(node).build(NodeContext(node, "cpu"))


def _formula(q, k, v, mask):
    s = (q.double() @ k.double().transpose(-1, -2)) * D ** -0.5
    if mask is not None:
        s = s + mask.double()
    return torch.softmax(s, -1) @ v.double()


@pytest.mark.parametrize("mask_shape", [None, (B, 1, 1, L), (B, H, L, L), (H, L, L)])
@pytest.mark.parametrize("merge", [0, 1])
def test_long_sequences_run_by_head_groups_with_the_formulas_numbers(mask_shape, merge):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, generator=gen) for _ in range(3))
    mask = None
    if mask_shape is not None:
        mask = torch.zeros(mask_shape)
        mask[..., -7:] = float("-inf")          # padding at the end of every row
        if mask_shape[-3] == H:
            mask[..., 3, :, :5] = -1e4          # a head of its own
    want = _formula(q, k, v, mask)
    if merge:
        want = want.transpose(1, 2).reshape(B, L, H * D)
    asked: list[int] = []

    def workspace(nbytes):
        asked.append(nbytes)
        return torch.empty(nbytes, dtype=torch.uint8)
    out = torch.full(tuple(want.shape), float("nan"))
    kernel = _attention(mask_shape, merge)
    got = kernel(q, k, v, *([mask] if mask is not None else []), out=out, scores=workspace)
    assert got is out
    torch.testing.assert_close(out, want.float(), rtol=1e-4, atol=1e-5)
    per_head = L * L * 4
    assert per_head * H > fused_transformer.SCORES_CHUNK_ABOVE       # the case is the chunked one
    group = fused_transformer.SCORES_CHUNK // per_head
    assert len(asked) == -(-H // group) and max(asked) < per_head * (group + 1), asked


def test_short_sequences_take_every_head_at_once():
    q, k, v = (torch.randn(B, H, 64, D) for _ in range(3))
    asked: list[int] = []
    out = torch.empty(B, H, 64, D)
    _attention(None, 0)(q, k, v, out=out, scores=lambda n: asked.append(n) or torch.empty(n, dtype=torch.uint8))
    assert asked == [H * 64 * 64 * 4]
    torch.testing.assert_close(out, _formula(q, k, v, None).float(), rtol=1e-4, atol=1e-5)
