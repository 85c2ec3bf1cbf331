"""``fusegraph::GatedActivation`` with a GELU (``gelu(x[..., :N]) * x[..., N:]``: a gated MLP's
GEGLU after the product of its two packed weights, T5 v1.1's) with the GELU as oneDNN's eltwise.

The op's own kernel copies the gate into the output, activates it there and multiplies by the
up half, each an ATen call; ATen's GELU, its tanh form above all, is several times slower than
oneDNN's eltwise. This kernel makes the same three steps with the GELU run by
``rows_eltwise.RowsEltwise`` over the dense copy (any row count, so symbolic shapes too).
oneDNN's GELU is ONNX's for finite inputs only: in the exact form it runs where one max over
the gate finds neither a NaN nor a +inf, the op's own GELU otherwise (``Config.fast_math``:
always oneDNN's). bfloat16 / float16 values compute in a float32 buffer of this thread and
round once into the output, as the op's own kernel does. SiLU, ReLU and the sigmoid are not
taken (None, no decline): ATen's are as fast (the reduced types' kernel is
``rotary_gating.py``'s). Anything else declines with its reason.
"""
from __future__ import annotations

import threading

import torch

from .....ops.fused_decoder import ACTIVATIONS
from ...protocol import Decline
from .linear_runtime import FAST
from .rows_eltwise import RowsEltwise

TYPES = (torch.float32, torch.bfloat16, torch.float16)
GELUS = ("gelu", "gelu_tanh")          # the activations run here (``linear_runtime.FAST``'s eltwise forms)
_INF = float("inf")


def gated_kernel(ctx, resources, exact: bool = True):
    """The kernel of a GatedActivation node with a GELU, None for another activation, or a
    ``Decline`` saying why not."""
    node = ctx.node
    name = str(ctx.attr("activation", ""))
    if name in ACTIVATIONS and name not in GELUS:
        return None             # ATen's own is as fast: not a oneDNN kernel's to take
    if name not in ACTIVATIONS:
        return Decline(f"activation {name!r}", "dnnl")
    x_v, y_v = node.inputs[0], node.outputs[0]
    dtype = x_v.dtype.to_torch() if x_v.dtype is not None else None
    if dtype not in TYPES or y_v.dtype != x_v.dtype:
        return Decline(f"needs float32, bfloat16 or float16 values, the output of the input's type (got {dtype})",
                       "dnnl")
    width = x_v.shape[-1] if x_v.shape else None
    if not isinstance(width, int) or width % 2 or x_v.layout == "nhwc":
        return Decline("needs a row-major input whose last axis is of known, even size", "dnnl")
    rows = RowsEltwise(width // 2, FAST[name][0], resources)
    if rows.is_reference:
        return Decline(f"oneDNN offers only its reference eltwise ({rows.impl})", "dnnl")
    return GatedRows(width // 2, dtype, rows, ACTIVATIONS[name], exact, resources)


class GatedRows:
    """``out = gelu(x[..., :N]) * x[..., N:]``, the GELU over the rows by oneDNN."""
    writes_out = True

    def __init__(self, n: int, dtype: torch.dtype, rows: RowsEltwise, act, checked: bool, resources):
        """``act``: the op's own GELU (into ``out``), run where ``checked`` finds a NaN or a +inf."""
        self.n, self.dtype, self._rows, self._act, self._checked = n, dtype, rows, act, checked
        self.impl = rows.impl
        # a reduced type's float32 values: one buffer per thread, shared by the model's gated nodes
        self._buffers = resources.shared.setdefault("gated float32", {}) if dtype != torch.float32 else None

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        n = self.n
        if x.shape[-1] != 2 * n:
            raise RuntimeError(f"gated activation: the last axis is {x.shape[-1]}, the kernel was made for {2 * n}")
        shape = tuple(x.shape[:-1]) + (n,)
        if out is None:
            out = torch.empty(shape, dtype=x.dtype)
        if x.dtype != self.dtype or out.dtype != self.dtype or not out.is_contiguous():
            raise TypeError(f"gated activation: input {x.dtype}, output {out.dtype} {tuple(out.stride())}, the "
                            f"kernel was made for a row-major {self.dtype} output")
        m = out.numel() // n if n else 0
        if m == 0:
            return out
        y = out if self._buffers is None else self._buffer(m * n).view(shape)
        y.copy_(x[..., :n])
        if self._checked and not bool(y.amax() < _INF):     # a NaN or +inf: the op's own GELU keeps them
            self._act(y, y)
        else:
            self._rows(y.data_ptr(), m)
        y.mul_(x[..., n:])
        if y is not out:
            out.copy_(y)
        return out

    def _buffer(self, count: int) -> torch.Tensor:
        buf = self._buffers.get(threading.get_ident())
        if buf is None or buf.numel() < count:
            with torch.inference_mode(False):
                buf = self._buffers[threading.get_ident()] = torch.empty(count, dtype=torch.float32)
        return buf[:count]
