"""The CPU backend's kernels around attention that write into planned memory:

- ``fusegraph::ScaledDotProductAttention`` that oneDNN's primitives decline
  (``dnnl/attention.py`` runs the others): the op's own kernel (torch products and softmax),
  its output written into the planned buffer (``out=``) and its ``q @ k^T`` scores into the
  backend's per-thread workspace (``workspace.py``) instead of a fresh allocation per run
  (with symbolic shapes, the workspace grows to the largest scores a run has needed);
- ``Gather`` of rows of a constant 2-D table (an embedding lookup) by run-time indices:
  ``index_select`` into the planned buffer, negative indices wrapped as ONNX says.
Other nodes of these ops decline with a reason (their portable kernel runs).
"""
from __future__ import annotations

import torch

from ..protocol import Decline


def attention_kernel(ctx, opdef, workspace):
    portable = opdef.build(ctx)
    nbytes = portable.scores_bytes()
    if nbytes is None:          # symbolic shapes: the workspace grows to the largest scores seen

        def attention(*args, out=None):
            return portable(*args, out=out, scores=workspace.at_least)
    else:
        workspace.need(nbytes)

        def attention(*args, out=None):
            return portable(*args, out=out, scores=workspace.get())
    attention.writes_out = True
    return attention


def embedding_kernel(ctx):
    table = ctx.const(0)
    if int(ctx.attr("axis", 0)) != 0 or table is None or table.dim() != 2 or ctx.const(1) is not None \
            or table.device.type not in ("cpu", "meta"):
        return None
    n, d = table.shape
    if ctx.dtype(1) is None or ctx.dtype(1).to_torch() not in (torch.int64, torch.int32):
        return Decline("indices are not int32 / int64", "cpu")

    def gather(data, idx, out=None):
        flat = idx.reshape(-1)
        if flat.numel() and int(flat.min()) < 0:     # ONNX: -n <= i < 0 counts from the end
            flat = torch.where(flat < 0, flat + n, flat)
        if out is None:
            return torch.index_select(data, 0, flat).view(*idx.shape, d)
        torch.index_select(data, 0, flat, out=out.view(-1, d))
        return out
    gather.writes_out = True
    return gather
