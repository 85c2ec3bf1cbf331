"""Reading a QDQ model's quantisation: what a ``QuantizeLinear`` / ``DequantizeLinear`` node
says, as plain numbers, for the rules of ``quantize_qdq.py`` and ``qdq_propagate.py``.

- ``activation_params(node)``: a per-tensor Q or DQ of an 8-bit activation: ``QParams(scale,
  zero_point, dtype)`` with the scale as the float32 the model holds, or a ``Decline`` saying
  why not (a scale or zero point that is not a constant, per-axis or blocked, another type).
- ``weight_params(dq, channel_axis)``: a DQ of a constant int8 weight (uint8 ones whose
  values minus their zero point fit int8 are shifted there, exactly), scales per tensor or
  per ``channel_axis``: the int8 weight and its float32 scales, or a ``Decline``.
- ``constant_bias(value)``: a constant float bias, or a DQ of a constant (int32) one
  dequantised here exactly as ``DequantizeLinear`` does (float32), or None.
- ``through_identity(value)``: the value an ``Identity`` chain passes on (exporters share
  equal initialisers, and so equal biases, through ``Identity`` nodes).
Nothing here changes the graph.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from ..ir import DType, Node, Value
from .facts import const_of
from .rule import Decline

QUANTISED = (DType.UINT8, DType.INT8)
S8 = (-128, 127)


class QParams(NamedTuple):
    scale: float          # the model's float32 scale, as a Python float (exact)
    zero_point: int
    dtype: DType

    def same(self, other: "QParams") -> bool:
        return self.scale == other.scale and self.zero_point == other.zero_point and self.dtype == other.dtype


def is_op(node: Node | None, *ops: str) -> bool:
    return node is not None and node.domain == "" and node.op_type in ops


def through_identity(v: Value | None) -> Value | None:
    """The value at the start of the ``Identity`` chain that ends at ``v``."""
    while v is not None and is_op(v.producer, "Identity"):
        v = v.producer.input(0)
    return v


def _block(node: Node) -> bool:
    return int(node.attrs.get("block_size", 0)) != 0


def activation_params(node: Node) -> QParams | Decline:
    """The per-tensor parameters of Q / DQ ``node`` over 8-bit integers."""
    s, zp = const_of(node.input(1)), node.input(2)
    if s is None:
        return Decline(f"{node.name}: the scale is not a constant")
    if s.numel() != 1 or _block(node):
        return Decline(f"{node.name}: per-axis or blocked parameters (an activation needs one scale)")
    if s.dtype != torch.float32:
        return Decline(f"{node.name}: a {s.dtype} scale (float32 only)")
    scale = float(s.reshape(()))
    if not (math.isfinite(scale) and scale > 0):
        return Decline(f"{node.name}: scale {scale} is not a positive finite number")
    if node.op_type == "QuantizeLinear":
        dtype = node.outputs[0].dtype
        if int(node.attrs.get("saturate", 1)) == 0:
            return Decline(f"{node.name}: saturate=0")
    else:
        dtype = node.inputs[0].dtype
        if int(node.attrs.get("output_dtype", 0)) not in (0, int(DType.FLOAT)) or node.outputs[0].dtype != DType.FLOAT:
            return Decline(f"{node.name}: dequantises to {node.outputs[0].dtype.name}, not float32")
    if dtype not in QUANTISED:
        return Decline(f"{node.name}: {dtype.name if dtype else '?'} values (uint8 / int8 only)")
    z = 0
    if zp is not None:
        t = const_of(zp)
        if t is None or t.numel() != 1:
            return Decline(f"{node.name}: the zero point is not one constant")
        z = int(t.reshape(()))
    return QParams(scale, z, dtype)


def weight_params(dq: Node, channel_axis: int, channels: int) -> tuple[torch.Tensor, torch.Tensor] | Decline:
    """(int8 weight, float32 scales [channels] or [1]) of DQ ``dq`` over a constant weight,
    scaled per tensor or along ``channel_axis`` with zero point 0 (after shifting a uint8
    weight into int8 where every value minus its zero point fits)."""
    if _block(dq):
        return Decline(f"{dq.name}: blocked weight scales")
    axis = int(dq.attrs.get("axis", 1))
    return quantised_weight(dq.input(0), dq.input(1), dq.input(2), axis, channel_axis, channels, dq.name)


def quantised_weight(w_v: Value, s_v: "Value | torch.Tensor", zp_v: Value | None, axis: int, channel_axis: int, channels: int,
                     where: str) -> tuple[torch.Tensor, torch.Tensor] | Decline:
    """``weight_params`` from the weight, scale and zero-point values themselves (a DQ's
    inputs, or a QLinearConv's; a tensor for a scale the model does not hold); ``axis``: the
    one the scales run along when they are many."""
    w, s = const_of(w_v), s_v if isinstance(s_v, torch.Tensor) else const_of(s_v)
    if w is None or w.device.type != "cpu":
        return Decline(f"{where}: the weight is not a constant")
    if s is None or s.dtype != torch.float32:
        return Decline(f"{where}: the weight's scale is not a float32 constant per tensor or per channel")
    if w.dtype not in (torch.int8, torch.uint8):
        return Decline(f"{where}: a {w.dtype} weight (int8 / uint8 only)")
    z = const_of(zp_v) if zp_v is not None else torch.zeros((), dtype=w.dtype)
    if z is None:
        return Decline(f"{where}: the weight's zero point is not a constant")
    axis = axis + w.dim() if axis < 0 else axis
    if s.numel() > 1 and (axis != channel_axis or s.numel() != channels or s.dim() != 1):
        return Decline(f"{where}: weight scales along axis {axis}, not one per output channel")
    if z.numel() not in (1, channels):
        return Decline(f"{where}: zero points do not match the scales")
    if not bool(torch.isfinite(s).all()) or not bool((s > 0).all()):
        return Decline(f"{where}: a weight scale is not a positive finite number")
    shape = [1] * w.dim()
    if z.numel() > 1:
        shape[channel_axis] = -1
    shifted = w.to(torch.int32) - z.to(torch.int32).reshape(shape)
    if int(shifted.min()) < S8[0] or int(shifted.max()) > S8[1]:
        return Decline(f"{where}: the weight minus its zero point does not fit int8")
    return shifted.to(torch.int8).contiguous(), s.reshape(-1).contiguous()


def scalar(v: Value | None, default=None):
    """The one value of constant ``v`` as a Python number (``default`` when ``v`` is absent;
    None when it is not one constant)."""
    if v is None:
        return default
    t = const_of(v)
    if t is None or t.numel() != 1:
        return None
    return float(t.reshape(())) if t.is_floating_point() else int(t.reshape(()))


def constant_bias(v: Value | None, n) -> torch.Tensor | Decline | None:
    """A bias of ``n`` values as float32: a constant, or the DQ of a constant (per tensor or
    along its only axis) computed as ``DequantizeLinear`` does; None when absent."""
    v = through_identity(v)
    if v is None:
        return None
    p = v.producer
    if is_op(p, "DequantizeLinear"):
        b, s, zp = const_of(p.input(0)), const_of(p.input(1)), p.input(2)
        z = const_of(zp) if zp is not None else None
        if b is None or s is None or (zp is not None and z is None) or _block(p):
            return Decline(f"{p.name}: the bias is not a constant")
        bf = b.to(torch.float32)
        if z is not None:
            bf = bf - z.to(torch.float32)
        if s.numel() > 1 and (b.dim() != 1 or s.numel() != b.numel()):
            return Decline(f"{p.name}: bias scales along another axis")
        t = bf * s.to(torch.float32).reshape(-1 if s.numel() > 1 else ())
    else:
        t = const_of(v)
        if t is None:
            return Decline("the bias is not a constant")
        if not t.is_floating_point():
            return Decline(f"a {t.dtype} bias")
        t = t.to(torch.float32)
    if t.numel() == 1 and isinstance(n, int):
        t = t.reshape(1).expand(n)
    if not isinstance(n, int) or t.numel() != n or (t.dim() > 1 and t.shape[-1] != n):
        return Decline(f"the bias has {t.numel()} values, not one per output channel ({n})")
    return t.reshape(n).contiguous()
