"""Dynamically quantised products (onnxruntime's ``quantize_dynamic``) onto one int8 op,
``fusegraph::QLinearDynamic`` (``ops/quantized_dynamic.py``):

    DynamicQuantizeLinear(x) -> (x_q, x_scale, x_zp)
    MatMulInteger(x_q, W_q, x_zp, W_zp) -> Cast(to float) -> Mul(·, Mul(x_scale, W_scale)) [-> Add(·, b)]

-> ``QLinearDynamic(x_q, x_scale, x_zp, W_q - W_zp, W_scale, b?)``, rooted at the last node
(the bias ``Add`` when the ``Mul``'s only reader adds a constant bias along the last axis,
else the ``Mul``; the ``Mul`` rule leaves such a pair to the ``Add`` rule). The
``DynamicQuantizeLinear`` stays: it may feed several products (query, key and value), and
quantises once for all of them. Conditions, each declined with its reason: the three values
of one ``DynamicQuantizeLinear`` (its data, its zero point at ``MatMulInteger``'s third
input, its scale in the scale product); a constant 2-D int8 / uint8 weight whose zero
points (per tensor or per column) leave it in int8 (``qdq_params.quantised_weight``) and a
constant float32 weight scale per tensor or per column; the ``MatMulInteger`` and the
``Cast`` read by nothing else. Exact: the op computes what the matched nodes compute, in
their order (``Cast`` of the exact int32 sum, times the float32 product of the scales, plus
the bias).
"""
from __future__ import annotations

from ..ir import DType, Node, Value
from .facts import const_of, only_use
from .qdq_params import is_op, quantised_weight
from .rule import FUSEGRAPH_DOMAIN, Decline, Rule


def _other(node: Node, v: Value) -> Value | None:
    """The input of two-input ``node`` that is not ``v``."""
    a, b = node.input(0), node.input(1)
    return b if a is v else a if b is v else None


def _bias(add: Node, y: Value, n: int):
    """The constant float32 bias of N values ``add`` adds to ``y``, or None."""
    b = _other(add, y)
    t = const_of(b)
    if t is None or b.dtype != DType.FLOAT or t.numel() != n:
        return None
    if t.dim() > 1 and any(d != 1 for d in t.shape[:-1]):
        return None
    if add.outputs[0].shape != y.shape:
        return None
    return t.reshape(-1)


def _scaled_product(mul: Node):
    """The pieces of ``Mul(Cast(MatMulInteger(DQL(x)...)), Mul(x_scale, w_scale))`` rooted at
    ``mul``: (dql, mmi, weight, w_scale), a Decline, or None (not this pattern)."""
    cast = next((p for p in (mul.input(0).producer if mul.input(0) is not None else None,
                             mul.input(1).producer if mul.input(1) is not None else None)
                 if is_op(p, "Cast")), None)
    if cast is None or int(cast.attrs.get("to", 0)) != int(DType.FLOAT):
        return None
    mmi = cast.input(0).producer
    if not is_op(mmi, "MatMulInteger"):
        return None
    dql = mmi.input(0).producer
    if not is_op(dql, "DynamicQuantizeLinear"):
        return None
    where = mmi.name
    if mmi.input(2) is not dql.outputs[2]:
        return Decline(f"{where}: the zero point is not its DynamicQuantizeLinear's")
    if not (only_use(mmi.outputs[0]) and only_use(cast.outputs[0])) or mmi.outputs[0].is_graph_output \
            or cast.outputs[0].is_graph_output:
        return Decline(f"{where}: the integer sum or its float32 cast is read elsewhere")
    if dql.input(0).dtype != DType.FLOAT:
        return Decline(f"{where}: a {dql.input(0).dtype} activation (float32 only)")
    scales = _other(mul, cast.outputs[0])
    sm = scales.producer if scales is not None else None
    if not is_op(sm, "Mul") or dql.outputs[1] not in (sm.input(0), sm.input(1)):
        return Decline(f"{where}: the result is not scaled by its activation's scale times a constant")
    w_scale = _other(sm, dql.outputs[1])
    w_v = mmi.input(1)
    if w_v is None or const_of(w_v) is None or w_v.shape is None or len(w_v.shape) != 2:
        return Decline(f"{where}: the weight is not a 2-D constant")
    n = w_v.shape[1]
    ws = const_of(w_scale)
    if ws is None or ws.numel() not in (1, n) or (ws.numel() > 1 and ws.shape[-1] != n):
        return Decline(f"{where}: the weight scale is not a constant per tensor or per column")
    weight = quantised_weight(w_v, ws.reshape(-1) if ws.numel() > 1 else ws.reshape(()), mmi.input(3), 1, 1, n,
                              where)
    if isinstance(weight, Decline):
        return weight
    return dql, mmi, weight


def _check_mul(mul: Node, ctx):
    got = _scaled_product(mul)
    if got is None or isinstance(got, Decline):
        return got
    y = mul.outputs[0]
    if only_use(y) and is_op(y.uses[0][0], "Add") and _bias(y.uses[0][0], y, got[2][0].shape[1]) is not None:
        return None                         # the Add rule takes the pair
    return got + (None,)


def _check_add(add: Node, ctx):
    for side in (0, 1):
        y = add.input(side)
        mul = y.producer if y is not None else None
        if not is_op(mul, "Mul") or not only_use(y) or y.is_graph_output:
            continue
        got = _scaled_product(mul)
        if got is None or isinstance(got, Decline):
            continue
        b = _bias(add, y, got[2][0].shape[1])
        if b is not None:
            return got + (b,)
    return None


def _rewrite(root: Node, found, ctx):
    dql, _mmi, (w, ws), bias = found
    inputs = [dql.outputs[0], dql.outputs[1], dql.outputs[2], ctx.const(w, "w"), ctx.const(ws, "w_scale")]
    if bias is not None:
        inputs.append(ctx.const(bias.float().contiguous(), "b"))
    return ctx.emit("QLinearDynamic", inputs, {}, domain=FUSEGRAPH_DOMAIN)


RULES = [
    Rule("dynamic_matmul_bias", _check_add, _rewrite, ops=("Add",), priority=1,
         doc="Add(Mul(Cast(MatMulInteger(DynamicQuantizeLinear(x), W)), x_scale * W_scale), b) -> "
             "QLinearDynamic: the same arithmetic in the same order"),
    Rule("dynamic_matmul", _check_mul, _rewrite, ops=("Mul",),
         doc="Mul(Cast(MatMulInteger(DynamicQuantizeLinear(x), W)), x_scale * W_scale) -> QLinearDynamic: "
             "the same arithmetic in the same order"),
]
