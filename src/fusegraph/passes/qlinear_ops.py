"""ONNX's integer ops with constant weights and parameters onto the same int8 ops as QDQ groups
(``ops/quantized.py``: ``QConv`` / ``QLinear``), so they run on the same kernels:

- ``qlinear_conv``: ``QLinearConv(x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, B?)`` ->
  ``QConv`` with the float32 bias ``B * x_scale * w_scale`` (``B`` is the int32 sum's bias
  in the product's scale).
- ``qlinear_matmul``: ``QLinearMatMul(a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp)``
  with a constant 2-D ``b`` -> ``QLinear``; with a ``b`` computed at run time (attention's
  products in onnxruntime's QOperator files) -> ``QMatMul``.
- ``conv_integer`` / ``matmul_integer``: ``ConvInteger(x, w, x_zp?, w_zp?)`` /
  ``MatMulInteger(a, b, a_zp?, b_zp?)`` with a constant weight -> ``QConv`` / ``QLinear``
  with an int32 output (the exact sum, scale 1).
Every scale and zero point must be a constant (activations: one each); the weight's zero
points may be per output channel when the weight minus them fits int8 (``qdq_params.py``).
Ops whose parameters are graph inputs keep their own kernels. Exact for the integer forms;
the quantised ones scale in float32 where the ONNX reference requantises in higher precision,
within one step.
"""
from __future__ import annotations

import torch

from ..ir import DType, Node
from .qdq_params import QUANTISED, quantised_weight, scalar
from .quantize_qdq import CONV_ATTRS
from .rule import FUSEGRAPH_DOMAIN, Decline, Rule


def _activation(node: Node, scale_i: int | None, zp_i: int, what: str):
    """(scale, zero point) of an activation operand from constant inputs, or a Decline."""
    s = 1.0 if scale_i is None else scalar(node.input(scale_i))
    z = scalar(node.input(zp_i), 0)
    if s is None or z is None or (scale_i is not None and node.input(scale_i).dtype != DType.FLOAT):
        return Decline(f"{node.name}: the {what} scale or zero point is not one float32 / integer constant")
    if not (s > 0 and s != float("inf")):
        return Decline(f"{node.name}: the {what} scale {s} is not a positive finite number")
    return float(s), int(z)


def _check(node: Node, ctx):
    op = node.op_type
    x = node.inputs[0]
    if x.dtype not in QUANTISED:
        return None
    conv = op in ("QLinearConv", "ConvInteger")
    w_i, ws_i, wzp_i = {"QLinearConv": (3, 4, 5), "QLinearMatMul": (3, 4, 5),
                        "ConvInteger": (1, None, 3), "MatMulInteger": (1, None, 3)}[op]
    w_v = node.input(w_i)
    if op == "QLinearMatMul" and w_v is not None and not w_v.is_const and w_v.dtype in QUANTISED:
        return _activations_product(node)
    if w_v is None or not w_v.is_const or w_v.shape is None:
        return Decline(f"{node.name}: the weight is not a constant")
    if conv and len(w_v.shape) != 4 or not conv and len(w_v.shape) != 2:
        return Decline(f"{node.name}: a weight of rank {len(w_v.shape)}")
    channels = w_v.shape[0] if conv else w_v.shape[1]
    weight = quantised_weight(w_v, node.input(ws_i) if ws_i is not None else torch.ones(1), node.input(wzp_i),
                              0 if conv else 1, 0 if conv else 1, channels, node.name)
    if isinstance(weight, Decline):
        return weight
    xq = _activation(node, 1 if ws_i is not None else None, 2, "input")
    if isinstance(xq, Decline):
        return xq
    attrs = {"x_scale": xq[0], "x_zero_point": xq[1]}
    bias = None
    if op in ("QLinearConv", "QLinearMatMul"):
        yq = _activation(node, 6, 7, "output")
        if isinstance(yq, Decline):
            return yq
        attrs.update(y_type=int(node.outputs[0].dtype), y_scale=yq[0], y_zero_point=yq[1])
        if node.input(8) is not None:
            b = node.input(8).const if node.input(8).is_const else None
            if b is None or b.numel() != channels:
                return Decline(f"{node.name}: the bias is not a constant of one value per output channel")
            bias = (b.to(torch.float64) * xq[0] * weight[1].to(torch.float64)).to(torch.float32)
    else:
        attrs["y_type"] = int(DType.INT32)
    if conv:
        attrs.update({k: node.attrs[k] for k in CONV_ATTRS if k in node.attrs})
    return conv, weight, bias, attrs


def _activations_product(node: Node):
    """The ``QMatMul`` attributes of a QLinearMatMul of two run-time operands, or a Decline."""
    params = [_activation(node, s, z, what) for s, z, what in ((1, 2, "a"), (4, 5, "b"), (6, 7, "output"))]
    bad = next((p for p in params if isinstance(p, Decline)), None)
    if bad is not None:
        return bad
    (a_s, a_z), (b_s, b_z), (y_s, y_z) = params
    return "QMatMul", {"a_scale": a_s, "a_zero_point": a_z, "b_scale": b_s, "b_zero_point": b_z, "y_scale": y_s,
                       "y_zero_point": y_z, "y_type": int(node.outputs[0].dtype)}


def _rewrite(node: Node, found, ctx):
    if found[0] == "QMatMul":
        return ctx.emit("QMatMul", [node.inputs[0], node.inputs[3]], found[1], domain=FUSEGRAPH_DOMAIN)
    conv, (w, ws), bias, attrs = found
    inputs = [node.inputs[0], ctx.const(w, "w"), ctx.const(ws, "w_scale")]
    if bias is not None:
        inputs.append(ctx.const(bias, "b"))
    return ctx.emit("QConv" if conv else "QLinear", inputs, dict(attrs, activation=""), domain=FUSEGRAPH_DOMAIN)


RULES = [
    Rule("qlinear_ops", _check, _rewrite, ops=("QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger"),
         doc="QLinearConv / QLinearMatMul / ConvInteger / MatMulInteger with constant weights and parameters "
             "-> QConv / QLinear; QLinearMatMul of two run-time operands -> QMatMul"),
]
