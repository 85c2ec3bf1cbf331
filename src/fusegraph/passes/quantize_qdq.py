"""QDQ products onto int8 ops: ``DequantizeLinear -> {Conv, MatMul, Gemm} -> QuantizeLinear``
groups, as onnxruntime's ``quantize_static`` (QDQ format) writes them, become one
``fusegraph::QConv`` / ``fusegraph::QLinear`` (``ops/quantized.py``) over the int8 values.

- ``qdq_product`` (root QuantizeLinear): ``Q(act(P(DQ(x), DQ(w), b)))`` with ``P`` a Conv,
  a MatMul with a constant 2-D weight or a Gemm (alpha = beta = 1, transA = 0), ``act``
  an optional Relu, ``x`` an 8-bit activation quantised per tensor, ``w`` a constant int8
  weight quantised per tensor or per output channel with zero point 0 (``qdq_params.py``:
  uint8 weights shifted where that is exact), ``b`` absent, constant, or the DQ of a constant
  (each DQ and the bias possibly behind ``Identity`` nodes)
  -> ``QConv`` / ``QLinear`` writing the Q's type, scale and zero point. The product's and
  the activation's outputs are read by nothing else.
- ``qdq_matmul`` (root QuantizeLinear): ``Q(MatMul(DQ(a), DQ(b)))`` of two activations, each
  quantised per tensor (attention's scores and weighted sum) -> ``QMatMul(a, b)``. The
  MatMul's output is read by nothing else.
- ``qdq_product_float`` (root the product): the same product whose result a float op reads
  (no Q, or other readers) -> the int8 op with a float32 output (the dequantised value).
Exact up to float32 rounding: the integer products are summed exactly (onnxruntime sums the
dequantised float32 products), then scaled, biased and quantised in float32 as the model's
DQ / Q do; a result within a rounding of a tie may quantise one step away.

Anything else stays as the model wrote it (its DQ, float op and Q run as they are: the
reference form) and each recognised group that is not rewritten is logged with the reason
(``report.fusions``).
"""
from __future__ import annotations

from ..ir import DType, Node
from .facts import only_use
from .qdq_params import QParams, activation_params, constant_bias, is_op, through_identity, weight_params
from .rule import FUSEGRAPH_DOMAIN, Decline, Rule

PRODUCTS = ("Conv", "MatMul", "Gemm")
CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


def _dq(v) -> Node | None:
    v = through_identity(v)
    p = v.producer if v is not None else None
    return p if is_op(p, "DequantizeLinear") else None


def product_group(p: Node) -> dict | Decline | None:
    """The pieces of product ``p`` over DQ inputs (None: not a QDQ product)."""
    x_dq, w_dq = _dq(p.input(0)), _dq(p.input(1))
    if x_dq is None or w_dq is None:
        return None
    xp = activation_params(x_dq)
    if isinstance(xp, Decline):
        return xp
    w = w_dq.inputs[0]
    if w.shape is None or not all(isinstance(d, int) for d in w.shape):
        return Decline(f"{p.name}: the weight's shape is not known")
    attrs = {}
    if p.op_type == "Conv":
        if len(w.shape) not in (3, 4, 5):
            return Decline(f"{p.name}: a convolution of rank {len(w.shape)}")
        op, n, axis, bias_in = "QConv", w.shape[0], 0, p.input(2)
        attrs = {k: p.attrs[k] for k in CONV_ATTRS if k in p.attrs}
    elif p.op_type == "MatMul":
        if len(w.shape) != 2 or p.inputs[0].shape is None or len(p.inputs[0].shape) < 1:
            return Decline(f"{p.name}: not a product with a 2-D weight")
        op, n, axis, bias_in = "QLinear", w.shape[1], 1, None
    else:
        a = p.attrs
        if float(a.get("alpha", 1.0)) != 1.0 or int(a.get("transA", 0)) or \
                (p.input(2) is not None and float(a.get("beta", 1.0)) != 1.0):
            return Decline(f"{p.name}: Gemm with alpha / beta other than 1 or transA")
        trans_b = int(a.get("transB", 0))
        op, n, axis, bias_in = "QLinear", w.shape[0 if trans_b else 1], 0 if trans_b else 1, p.input(2)
        attrs = {"trans_b": trans_b}
    weight = weight_params(w_dq, axis, n)
    if isinstance(weight, Decline):
        return weight
    bias = constant_bias(bias_in, n)
    if isinstance(bias, Decline):
        return Decline(f"{p.name}: {bias}")
    return {"op": op, "x": x_dq.inputs[0], "xp": xp, "w": weight[0], "ws": weight[1], "b": bias, "attrs": attrs,
            "product": p}


def emit_product(ctx, g: dict, y: QParams | None, activation: str = "", z=None, zp: QParams | None = None):
    """The int8 node of group ``g`` writing ``y`` (None: float32), with a residual ``z``."""
    attrs = dict(g["attrs"])
    attrs.update(x_scale=g["xp"].scale, x_zero_point=g["xp"].zero_point, activation=activation)
    if y is None:
        attrs["y_type"] = int(DType.FLOAT)
    else:
        attrs.update(y_type=int(y.dtype), y_scale=y.scale, y_zero_point=y.zero_point)
    if z is not None:
        attrs.update(z_scale=zp.scale, z_zero_point=zp.zero_point)
    w = ctx.const(g["w"], "w")
    ws = ctx.const(g["ws"], "w_scale")
    b = ctx.const(g["b"], "b") if g["b"] is not None else None
    inputs = [g["x"], w, ws, b] + ([z] if z is not None else [])
    while inputs and inputs[-1] is None:
        inputs.pop()
    return ctx.emit(g["op"], inputs, attrs, domain=FUSEGRAPH_DOMAIN)


# ------------------------------------------------------------------------ Q(act(product))

def _under_q(q: Node):
    """(product, activation) feeding Q ``q`` through an optional Relu, or None."""
    p, act = q.inputs[0].producer, ""
    if is_op(p, "Relu"):
        if not only_use(p.outputs[0]):
            return None
        p, act = p.inputs[0].producer, "relu"
    return (p, act) if is_op(p, *PRODUCTS) else None


def _check_q_product(q: Node, ctx):
    found = _under_q(q)
    if found is None:
        return None
    p, act = found
    g = product_group(p)
    if g is None or isinstance(g, Decline):
        return g
    if not only_use(p.outputs[0]):
        return Decline(f"{p.name}: its float result is read outside the group")
    yp = activation_params(q)
    if isinstance(yp, Decline):
        return yp
    return g, yp, act


def _rewrite_q_product(q: Node, found, ctx):
    g, yp, act = found
    return emit_product(ctx, g, yp, act)


# ------------------------------------------------------------------------ float consumers

def _check_float_product(p: Node, ctx):
    g = product_group(p)
    if g is None or isinstance(g, Decline):
        return g
    y = p.outputs[0]
    if len(y.uses) == 1 and not y.is_graph_output:
        user = y.uses[0][0]
        if is_op(user, "QuantizeLinear") or (is_op(user, "Relu") and len(user.outputs[0].uses) == 1
                                             and is_op(user.outputs[0].uses[0][0], "QuantizeLinear")):
            return None          # the Q-rooted rule takes the group (or says why not)
    if y.dtype != DType.FLOAT:
        return Decline(f"{p.name}: a {y.dtype.name} product")
    return g


def _rewrite_float_product(p: Node, g, ctx):
    return emit_product(ctx, g, None)


def _check_q_matmul(q: Node, ctx):
    p = q.inputs[0].producer
    if not is_op(p, "MatMul"):
        return None
    a_dq, b_dq = _dq(p.input(0)), _dq(p.input(1))
    if a_dq is None or b_dq is None or a_dq.inputs[0].is_const or b_dq.inputs[0].is_const:
        return None                   # a constant weight is qdq_product's
    if not only_use(q.inputs[0]):
        return Decline(f"{p.name}: its float result is read outside the group")
    params = [activation_params(d) for d in (a_dq, b_dq, q)]
    bad = next((x for x in params if isinstance(x, Decline)), None)
    return bad if bad is not None else (a_dq.inputs[0], b_dq.inputs[0], params)


def _rewrite_q_matmul(q: Node, found, ctx):
    a, b, (pa, pb, py) = found
    return ctx.emit("QMatMul", [a, b], {"a_scale": pa.scale, "a_zero_point": pa.zero_point, "b_scale": pb.scale,
                                        "b_zero_point": pb.zero_point, "y_scale": py.scale,
                                        "y_zero_point": py.zero_point, "y_type": int(py.dtype)},
                    domain=FUSEGRAPH_DOMAIN)


RULES = [
    Rule("qdq_product", _check_q_product, _rewrite_q_product, ops=("QuantizeLinear",), priority=20,
         doc="Q(act(Conv / MatMul / Gemm(DQ(x), DQ(w), b))) -> QConv / QLinear: exact up to float32 rounding"),
    Rule("qdq_matmul", _check_q_matmul, _rewrite_q_matmul, ops=("QuantizeLinear",), priority=18,
         doc="Q(MatMul(DQ(a), DQ(b))) of two activations -> QMatMul(a, b)"),
    Rule("qdq_product_float", _check_float_product, _rewrite_float_product, ops=PRODUCTS, priority=10,
         doc="Conv / MatMul / Gemm(DQ(x), DQ(w), b) read as float -> QConv / QLinear with a float32 output"),
]
