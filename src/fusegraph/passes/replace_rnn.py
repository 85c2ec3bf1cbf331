"""Recurrent nodes in the gate order their fast kernels read.

- lstm_gate_order: an ONNX ``LSTM`` whose W and R (and B, when given) are constants ->
  ``fusegraph::LSTM`` (``ops/rnn.py``), the same node with the gate blocks of W, R and both
  halves of B reordered once from ONNX's ``iofc`` to ``ifco`` (torch's and oneDNN's order);
  the peepholes P keep their order. Exact: the same weights, in other rows. The backend's
  recurrent kernel then reads its weights as a permutation of their axes
  (``runtime/backends/cpu/dnnl/rnn.py``), so the packed form it keeps is the weight's only
  copy and an artifact can read it back plain.

GRU's ``zrh`` and RNN's single gate are already in oneDNN's order: they need no rewrite.
"""
from __future__ import annotations

import torch

from .rule import FUSEGRAPH_DOMAIN, Decline, Rule

IFCO_FROM_IOFC = (0, 2, 3, 1)      # block k of the result is block IFCO_FROM_IOFC[k] of ONNX's


def _gate_blocks(t: torch.Tensor, hidden: int, halves: int) -> torch.Tensor:
    """``t`` ``[dirs, halves * 4 * hidden, ...]`` with each half's gate blocks reordered."""
    d = t.shape[0]
    rest = tuple(t.shape[2:])
    blocks = t.reshape(d, halves, 4, hidden, *rest)
    return blocks[:, :, list(IFCO_FROM_IOFC)].reshape(t.shape).contiguous()


def _lstm_check(node, ctx):
    w, r = node.const_input(1), node.const_input(2)
    if w is None or r is None:
        return Decline("W or R is not a constant")
    b = node.const_input(3)
    if node.input(3) is not None and b is None:
        return Decline("B is not a constant")
    if w.dim() != 3 or r.dim() != 3 or w.shape[1] % 4 or r.shape[1] != w.shape[1] or r.shape[0] != w.shape[0]:
        return Decline(f"W {tuple(w.shape)} and R {tuple(r.shape)} are not [dirs, 4 * hidden, ...]")
    hidden = w.shape[1] // 4
    if b is not None and tuple(b.shape) != (w.shape[0], 8 * hidden):
        return Decline(f"B {tuple(b.shape)} is not [dirs, 8 * hidden]")
    if not ctx.supports("LSTM", FUSEGRAPH_DOMAIN):
        return Decline("no fusegraph::LSTM kernel")
    return hidden


def _lstm_rewrite(node, hidden, ctx):
    w, r, b = node.const_input(1), node.const_input(2), node.const_input(3)
    inputs = list(node.inputs)
    inputs[1] = ctx.const(_gate_blocks(w, hidden, 1), "W")
    inputs[2] = ctx.const(_gate_blocks(r, hidden, 1), "R")
    if b is not None:
        inputs[3] = ctx.const(_gate_blocks(b, hidden, 2), "B")
    outs = ctx.emit("LSTM", inputs, dict(node.attrs), domain=FUSEGRAPH_DOMAIN, outputs=len(node.outputs))
    return outs if isinstance(outs, list) else [outs]


RULES = [
    Rule("lstm_gate_order", _lstm_check, _lstm_rewrite, ops=("LSTM",),
         doc="W and R (and B) are constants: the same weights in torch's / oneDNN's gate order"),
]
