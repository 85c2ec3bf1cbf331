"""QDQ between int8 ops: the quantised values flow from one int8 op to the next, with no
dequantise-quantise round trip where the model's arithmetic does not need one.

- ``dq_sink`` (root a data-movement op: view, permutation, selection (a Split: each part),
  replication; or a max pool): ``Op(DQ(x), ...) -> DQ(Op(x, ...))`` for a per-tensor DQ.
  Exact: such an op moves (or, a max pool, picks by order) values, and a per-tensor
  dequantisation is the same map on every element, increasing (scale > 0).
- ``dq_join`` (root Concat): ``Concat(DQ(a), DQ(b) ...)`` with one set of parameters ->
  ``DQ(Concat(a, b ...))``. Exact.
- ``qdq_cancel`` (root QuantizeLinear): ``Q(DQ(x))`` -> ``x`` when both have the same
  parameters (exact: a quantised value dequantises and quantises to itself), else
  ``Requantize(x)`` (the same arithmetic in one node).
- ``qdq_concat`` (root QuantizeLinear): ``Q(Concat(DQ(a), DQ(b) ...))`` -> ``Concat(a', b'
  ...)`` where ``a'`` is ``a`` when its parameters are the Q's and ``Requantize(a)`` else.
  Exact: a concat moves values, and quantising a concat is quantising its parts.
- ``qdq_bias`` (root QuantizeLinear): ``Q(Add(DQ(QLinear(...)), bias))`` with a constant
  bias (or the DQ of one) along the last axis -> the QLinear with the Q's output parameters
  and the bias added to its own where the Q saturates wherever the product's own
  quantisation clamps (``_bias_saturation_kept``); elsewhere the product clamps its result
  to its own range (``y_clip``) and adds the bias after that clamp (``post_bias``), as the
  model adds it to the clamped values.
- ``qdq_residual`` (root QuantizeLinear): ``Q(act(Add(DQ(QConv(...)), DQ(z))))`` -> the
  QConv with residual ``z`` and activation ``act`` (Relu or none), writing the Q's
  parameters, its result clamped to its own quantisation's range before the residual
  (``conv_clip``: the model's first quantisation clamps it there); any other
  ``Q(act(Add(DQ(a), DQ(b))))`` -> ``QAdd(a, b)``.
- ``requantize_product`` (root Requantize): ``Requantize(QConv / QLinear(...))`` -> the
  product writing the Requantize's parameters; also through views and permutations between
  them (a query's reshape and transpose into heads: they move the values the requantisation
  maps one by one), and with one step multiplying by a positive constant ``c`` (attention's
  ``1 / sqrt(d)``: ``Q(DQ(x) * c)`` with scale ``s`` is the product quantised with ``s / c``).
  Where the new range reaches beyond the product's own (a concat's range over its branches),
  the product clamps its result to its own range first (``y_clip``), as the model's first
  quantisation does; ``qdq_bias``, ``qdq_residual`` and ``qdq_grid_gelu`` leave a clamped
  product alone (its clamp would have to come before their bias, residual or GELU), and this
  rule a product with a ``post_bias`` (its clamp is not of its output's values).
- ``split_product`` (root Split): ``Split(QLinear(...))`` along the product's columns (through
  views that keep them last; GPT-2's packed q / k / v) -> one QLinear per part, the weight's
  columns with their scales and bias, each reshaped to its part's shape: exact (every
  column's arithmetic is its own), and each part's requantisation can then fold into its
  product.
- ``qdq_affine`` (root QuantizeLinear, its own pass after fusion, once BatchNorm became
  ``Mul`` / ``Add`` and those an ``ElementwiseChain``): ``Q(DQ(x) op c1 op c2 ...)`` with
  float32 constants that broadcast over ``x`` (a pre-activation BatchNorm) ->
  ``Requantize(x, c1, c2 ...)`` with those ``steps``. Exact: the same float32 steps in the
  same order, in one node.
- ``qdq_grid_output`` (root DequantizeLinear, its own pass after ``qdq_affine``: the
  quantised-to-quantised rules have had their turn): ``DQ(P(...))`` for a ``QConv`` /
  ``QLinear`` / ``QMatMul`` ``P`` whose quantised output only this DQ reads (through views: reshapes that
  move no value), with its parameters -> ``P`` writing float32 on that grid (``y_grid``),
  then the views: the product's epilogue quantises and dequantises in place of a pass over
  the tensor. Exact: the same two roundings.
- ``qdq_grid_gelu`` (root QuantizeLinear, in the same pass, once a product writes on its
  grid): ``Q(Gelu(P))`` for a ``QLinear`` ``P`` writing float32 on a grid, read by the Gelu
  alone (through views on either side) -> ``P`` with that grid, the GELU and the Q's
  parameters (``mid_*``), then the views over its quantised result: its epilogue
  rounds onto the grid, applies the GELU and quantises, and the FFN's float32 activation is
  never written. The same roundings in the same order; oneDNN's GELU is the one the Gelu
  node runs on finite values (the epilogue is finite: the grid post-ops' condition), and its
  last quantisation may fall the other way on a tie (one step).

``qdq_bias``, ``qdq_residual`` and ``requantize_product`` round once where the model
rounds twice: the product's result ``v`` was quantised to ``q1 = round(v / s1)`` (its own
scale ``s1``), dequantised, combined with values that are exact multiples of nothing in
particular, and quantised again with scale ``s2``; here ``v`` goes straight on.
``|s1 * q1 - v| <= s1 / 2``, and the combination (adding a bias or a residual, a Relu) moves
a difference by no more than itself, so before the last rounding the two differ by at most
``s1 / (2 s2)`` steps of ``s2``, after it by at most ``floor(s1 / (2 s2)) + 1`` steps
(``rounding_bound``; a step multiplying by ``c`` scales the difference: ``s1`` reads
``c s1``); ``tests/passes/test_int8_qdq.py`` checks it at a model output. The product's own
output, read by nothing else, is never materialised.
"""
from __future__ import annotations

import math

import torch

from ..ir import DType, Node
from ..ops import Movement, movement_ops
from ..ops.quantized import AFFINE_STEPS, RANGE, y_type
from .facts import ints_arg, only_use
from .qdq_params import QParams, activation_params, constant_bias, is_op
from .rule import FUSEGRAPH_DOMAIN, Decline, Rule

# ops whose value is a selection of their input's elements (or their order statistic): a
# per-tensor increasing map (a dequantisation) commutes with them
SINK_MOVES = (Movement.VIEW, Movement.PERMUTE, Movement.SELECT, Movement.REPLICATE)
ORDER_STATISTICS = ("MaxPool", "GlobalMaxPool")      # the maximum of a window (scale > 0: order kept)


def rounding_bound(s1: float, s2: float) -> int:
    """The most steps of ``s2`` by which rounding once differs from rounding to ``s1`` first."""
    return int(math.floor(s1 / (2.0 * s2))) + 1


def _dq(v) -> Node | None:
    p = v.producer if v is not None else None
    return p if is_op(p, "DequantizeLinear") else None


def _fg(node: Node | None, *ops: str) -> bool:
    return node is not None and node.domain == FUSEGRAPH_DOMAIN and node.op_type in ops


def _emit_dq(ctx, x, p: QParams, like: Node):
    return ctx.emit("DequantizeLinear", [x, like.input(1), like.input(2)])


def _emit_requantize(ctx, x, src: QParams, dst: QParams):
    return ctx.emit("Requantize", [x], {"x_scale": src.scale, "x_zero_point": src.zero_point, "y_scale": dst.scale,
                                       "y_zero_point": dst.zero_point, "y_type": int(dst.dtype)},
                    domain=FUSEGRAPH_DOMAIN)


# ------------------------------------------------------------------------ dq_sink, dq_join

def _sinkable(node: Node) -> bool:
    if node.domain != "" or not node.outputs:
        return False
    if node.op_type in ORDER_STATISTICS:
        return len(node.outputs) == 1
    return (node.domain, node.op_type) in movement_ops(*SINK_MOVES)


def _check_sink(node: Node, ctx):
    if not _sinkable(node):
        return None
    dq = _dq(node.input(0))
    if dq is None or any(_dq(v) is not None for v in node.inputs[1:]):
        return None
    p = activation_params(dq)
    return Decline(str(p)) if isinstance(p, Decline) else (dq, p)


def _rewrite_sink(node: Node, found, ctx):
    dq, p = found
    n = len(node.outputs)
    moved = ctx.emit(node.op_type, [dq.inputs[0]] + list(node.inputs[1:]), dict(node.attrs), outputs=n)
    if n == 1:
        return _emit_dq(ctx, moved, p, dq)
    return [_emit_dq(ctx, m, p, dq) for m in moved]      # a Split: each part dequantised alike


def _check_join(node: Node, ctx):
    if len(node.outputs) != 1 or any(v is None for v in node.inputs):
        return None
    dqs = [_dq(v) for v in node.inputs]
    if not dqs or any(d is None for d in dqs):
        return None
    ps = [activation_params(d) for d in dqs]
    bad = next((p for p in ps if isinstance(p, Decline)), None)
    if bad is not None:
        return bad
    if not all(p.same(ps[0]) for p in ps):
        return Decline(f"{node.name}: its inputs have different quantisation parameters")
    return dqs, ps[0]


def _rewrite_join(node: Node, found, ctx):
    dqs, p = found
    joined = ctx.emit("Concat", [d.inputs[0] for d in dqs], dict(node.attrs))
    return _emit_dq(ctx, joined, p, dqs[0])


# ------------------------------------------------------------------------ Q(DQ(x)), Q(Concat(DQ ...))

def _check_cancel(q: Node, ctx):
    dq = _dq(q.input(0))
    if dq is None:
        return None
    src, dst = activation_params(dq), activation_params(q)
    for p in (src, dst):
        if isinstance(p, Decline):
            return p
    return dq.inputs[0], src, dst


def _rewrite_cancel(q: Node, found, ctx):
    x, src, dst = found
    return x if src.same(dst) else _emit_requantize(ctx, x, src, dst)


def _check_q_concat(q: Node, ctx):
    cat = q.inputs[0].producer
    if not is_op(cat, "Concat") or any(v is None for v in cat.inputs):
        return None
    dqs = [_dq(v) for v in cat.inputs]
    if any(d is None for d in dqs):
        return None
    if not only_use(cat.outputs[0]):
        return Decline(f"{cat.name}: its float result is read outside the group")
    ps = [activation_params(d) for d in dqs] + [activation_params(q)]
    bad = next((p for p in ps if isinstance(p, Decline)), None)
    return bad if bad is not None else (cat, dqs, ps[:-1], ps[-1])


def _rewrite_q_concat(q: Node, found, ctx):
    cat, dqs, ps, y = found
    parts = [d.inputs[0] if p.same(y) else _emit_requantize(ctx, d.inputs[0], p, y) for d, p in zip(dqs, ps)]
    return ctx.emit("Concat", parts, dict(cat.attrs))


# ------------------------------------------------------------------------ Q(act(Add(DQ ..., ...)))

def _under_q_add(q: Node):
    """(Add node, activation) feeding Q ``q``, through an optional Relu; None otherwise."""
    a, act = q.inputs[0].producer, ""
    if is_op(a, "Relu") and only_use(a.outputs[0]):
        a, act = a.inputs[0].producer, "relu"
    if not (is_op(a, "Add") or (is_op(a, "Sum") and len(a.inputs) == 2)):
        return None
    return a, act


def _private_product(v, ops, quantised: bool = True) -> Node | None:
    """The int8 product whose quantised output only the DQ producing ``v`` reads, where that
    DQ's result is read only once: a product the group may take over."""
    dq = _dq(v)
    if dq is None or not only_use(v):
        return None
    p = dq.inputs[0].producer
    if not _fg(p, *ops) or not only_use(dq.inputs[0]):
        return None
    if quantised and DType(int(p.attrs.get("y_type", 0))) not in (DType.UINT8, DType.INT8):
        return None
    return p


def _check_bias(q: Node, ctx):
    found = _under_q_add(q)
    if found is None or found[1]:
        return None
    add = found[0]
    for side in (0, 1):
        p = _private_product(add.inputs[side], ("QLinear",))
        if p is None or p.attrs.get("activation") or "y_clip" in p.attrs:     # (its clamp comes before the bias)
            continue
        out = p.outputs[0]
        n = out.shape[-1] if out.shape else None
        bias = constant_bias(add.inputs[1 - side], n)
        if bias is None or isinstance(bias, Decline):
            continue
        if add.outputs[0].shape != out.shape or not only_use(add.outputs[0]):
            return Decline(f"{add.name}: the sum broadcasts or is read outside the group")
        y = activation_params(q)
        if isinstance(y, Decline):
            return y
        return p, bias, y, None if _bias_saturation_kept(p, bias, y) else _own_range(p)
    return None


def _bias_saturation_kept(p: Node, bias: torch.Tensor, y) -> bool:
    """Whether quantising ``v + b`` once with ``y`` saturates wherever the model's first
    quantisation (the product's ``y_*``) clamps ``v`` before the bias is added, in every column:
    ``y``'s range, less the column's bias, lies within the first (widened by half a step)."""
    s1, (lo1, hi1) = float(p.attrs["y_scale"]), _own_range(p)
    lo2, hi2 = _grid_range(y.scale, y.zero_point, y.dtype)
    if not bias.numel():                                     # no columns: nothing is clamped
        return True
    b_lo, b_hi = float(bias.min()), float(bias.max())       # NaN in the bias: both comparisons fail
    return lo2 >= lo1 + b_hi - s1 / 2 and hi2 <= hi1 + b_lo + s1 / 2


def _rewrite_bias(q: Node, found, ctx):
    """The product with the Q's parameters and the bias added to its own; where the product's
    own quantisation clamps what the Q's would not (``clip``: that range), its result clamped
    to it first (``y_clip``) and the bias added after the clamp (``post_bias``), as the model
    adds it to the clamped values."""
    p, bias, y, clip = found
    attrs = dict(p.attrs, y_type=int(y.dtype), y_scale=y.scale, y_zero_point=y.zero_point)
    if clip is not None:
        attrs.update(y_clip=list(clip), post_bias=[float(v) for v in bias.reshape(-1)])
        return ctx.emit(p.op_type, list(p.inputs), attrs, domain=FUSEGRAPH_DOMAIN)
    old = p.input(3)
    total = bias if old is None else old.const.to(bias.dtype) + bias
    return ctx.emit(p.op_type, [p.inputs[0], p.inputs[1], p.inputs[2], ctx.const(total, "b")], attrs,
                    domain=FUSEGRAPH_DOMAIN)


def _check_residual(q: Node, ctx):
    found = _under_q_add(q)
    if found is None:
        return None
    add, act = found
    dqs = [_dq(v) for v in add.inputs]
    if any(d is None for d in dqs):
        return None
    if not only_use(add.outputs[0]):
        return Decline(f"{add.name}: its float result is read outside the group")
    ps = [activation_params(d) for d in dqs] + [activation_params(q)]
    bad = next((p for p in ps if isinstance(p, Decline)), None)
    if bad is not None:
        return bad
    for side in (0, 1):
        conv = _private_product(add.inputs[side], ("QConv",))
        other = dqs[1 - side].inputs[0]
        if conv is not None and len(conv.inputs) < 5 and not conv.attrs.get("activation") \
                and "y_clip" not in conv.attrs and "conv_clip" not in conv.attrs \
                and other.shape == conv.outputs[0].shape and other.dtype.itemsize == 1:
            return "conv", conv, other, ps[1 - side], act, ps[2]
    if add.outputs[0].shape is None:
        return Decline(f"{add.name}: the sum's shape is not known")
    return "add", dqs, ps, act


def _rewrite_residual(q: Node, found, ctx):
    if found[0] == "conv":
        _, conv, z, zp, act, y = found
        # the convolution's own quantisation clamped its result: it still does, before the residual
        attrs = dict(conv.attrs, activation=act, z_scale=zp.scale, z_zero_point=zp.zero_point,
                     y_type=int(y.dtype), y_scale=y.scale, y_zero_point=y.zero_point,
                     conv_clip=list(_own_range(conv)))
        inputs = list(conv.inputs) + [None] * (4 - len(conv.inputs)) + [z]
        return ctx.emit("QConv", inputs, attrs, domain=FUSEGRAPH_DOMAIN)
    _, dqs, ps, act = found
    (a, b), y = ps[:2], ps[2]
    attrs = {"a_scale": a.scale, "a_zero_point": a.zero_point, "b_scale": b.scale, "b_zero_point": b.zero_point,
             "y_type": int(y.dtype), "y_scale": y.scale, "y_zero_point": y.zero_point, "activation": act}
    return ctx.emit("QAdd", [dqs[0].inputs[0], dqs[1].inputs[0]], attrs, domain=FUSEGRAPH_DOMAIN)


# ------------------------------------------------------------------------ Requantize(product)

GRID_VIEWS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")     # move no value: any type passes through


def _through_views(v, ops=GRID_VIEWS) -> tuple:
    """(the value before the chain of default-domain ``ops`` that ends at ``v``, each read by
    its next op alone; those ops in order)."""
    views = []
    while v.producer is not None and v.producer.domain == "" and v.producer.op_type in ops and only_use(v):
        views.append(v.producer)
        v = v.producer.inputs[0]
    return v, views[::-1]


# views and permutations: a requantisation commutes with them (it maps each value alike)
MOVERS = frozenset(op for domain, op in movement_ops(Movement.VIEW, Movement.PERMUTE) if domain == "")


def _positive_scale(r: Node) -> float | None:
    """``c`` of a Requantize whose only step multiplies by one positive finite float32 constant
    (a query's ``1 / sqrt(d)``), 1.0 for one without steps, None otherwise."""
    steps = r.attrs.get("steps") or []
    if not steps:
        return 1.0
    c = r.input(1)
    if list(steps) != ["Mul 1"] or len(r.inputs) != 2 or c is None or not c.is_const or c.dtype != DType.FLOAT \
            or c.const.numel() != 1:
        return None
    value = float(c.const.reshape(()))
    return value if math.isfinite(value) and value > 0 else None


def _grid_range(scale: float, zero_point: int, dtype: DType) -> tuple[float, float]:
    """The real values a quantisation with these parameters represents, its ends included."""
    lo, hi = RANGE[dtype]
    return scale * (lo - zero_point), scale * (hi - zero_point)


def _own_range(p: Node) -> tuple[float, float]:
    """The range of a product's own output quantisation (its ``y_*``)."""
    return _grid_range(float(p.attrs["y_scale"]), int(p.attrs.get("y_zero_point", 0)), y_type(p.attrs))


def _saturation_kept(s1: float, z1: int, t1: DType, s2: float, z2: int, t2: DType, c: float = 1.0) -> bool:
    """Whether quantising ``v`` once with (``s2 / c``, ``z2``, ``t2``) saturates wherever the
    model's first quantisation (``s1``, ``z1``, ``t1``) clamps it: the second grid's range,
    divided by ``c``, lies within the first's (widened by half a step, which rounds onto its
    ends anyway). Otherwise a value beyond the first range, clamped by the model, would go on
    unclamped: not a rounding difference."""
    lo1, hi1 = _grid_range(s1, z1, t1)
    lo2, hi2 = _grid_range(s2, z2, t2)
    return lo2 / c >= lo1 - s1 / 2 and hi2 / c <= hi1 + s1 / 2


def _check_requantize_product(r: Node, ctx):
    c = _positive_scale(r)
    if c is None:                     # other float steps between: not the product's own requantisation
        return None
    v, moves = _through_views(r.inputs[0], MOVERS)
    p = v.producer
    yt = DType(int(p.attrs.get("y_type", 0))) if _fg(p, "QConv", "QLinear") else None
    if yt not in (DType.UINT8, DType.INT8):
        return None
    if not only_use(v):
        return Decline(f"{p.name}: its quantised output has other readers")
    if "post_bias" in p.attrs:            # its clamp is of the values before that bias, not of its output's
        return Decline(f"{p.name}: a bias after its clamp")
    return p, yt, c, moves


def _rewrite_requantize_product(r: Node, found, ctx):
    """The product quantised with the Requantize's parameters (its scale over ``c``); where the
    product's own range does not hold the new one, its result clamped to that range first
    (``y_clip``, within any clamp it had), as the model's first quantisation clamps it."""
    p, yt, c, moves = found
    a = r.attrs
    s1, z1 = float(p.attrs["y_scale"]), int(p.attrs.get("y_zero_point", 0))
    attrs = dict(p.attrs, y_type=int(a["y_type"]), y_scale=float(a["y_scale"]) / c, y_zero_point=a["y_zero_point"])
    if not _saturation_kept(s1, z1, yt, float(a["y_scale"]), int(a["y_zero_point"]), DType(int(a["y_type"])), c):
        lo, hi = _grid_range(s1, z1, yt)
        if "y_clip" in p.attrs:
            lo, hi = max(lo, float(p.attrs["y_clip"][0])), min(hi, float(p.attrs["y_clip"][1]))
        attrs["y_clip"] = [lo, max(lo, hi)]
    return _emit_over_views(ctx, p, attrs, moves)


# ------------------------------------------------------------------------ Split(product)

def _check_split_product(split: Node, ctx):
    """``Split`` along the last axis of a ``QLinear``'s result (through views that keep its
    columns last), the product read by nothing else, its weight, scales and bias constants:
    (product, part sizes, part shapes)."""
    if split.domain != "" or len(split.outputs) < 2 or any(not o.uses for o in split.outputs):
        return None
    v, _views = _through_views(split.inputs[0])
    p = v.producer
    if not _fg(p, "QLinear") or not only_use(v):
        return None
    consts = [p.input(i) for i in range(1, len(p.inputs))]
    if any(c is None or not c.is_const or c.const.device.type == "meta" for c in consts):
        return None
    w = p.input(1).const
    n = w.shape[0] if int(p.attrs.get("trans_b", 0)) else w.shape[-1]
    shape, shapes = split.inputs[0].shape, [o.shape for o in split.outputs]
    if v.shape is None or not v.shape or v.shape[-1] != n or any(
            s is None or not all(isinstance(d, int) for d in s) for s in [shape] + shapes):
        return None
    axis = int(split.attrs.get("axis", 0))
    if (axis + len(shape) if axis < 0 else axis) != len(shape) - 1:
        return None
    known, sizes = ints_arg(split, 1, "split", 13)
    parts = [s[-1] for s in shapes]
    if not known or (sizes is not None and sizes != parts) or sum(parts) != n:
        return Decline(f"{split.name}: part sizes not known or not the shapes'")
    return p, parts, shapes


def _rewrite_split_product(split: Node, found, ctx):
    """One QLinear per part: the weight's columns (rows under ``trans_b``), their scales and
    bias (and ``post_bias``), the same other attributes (every column's arithmetic is its
    own), each result reshaped to its part's shape."""
    p, sizes, shapes = found
    trans_b = bool(int(p.attrs.get("trans_b", 0)))
    w, scales = p.input(1).const, p.input(2).const
    bias = p.input(3).const if len(p.inputs) > 3 and p.input(3) is not None else None
    outs, start = [], 0
    for size, shape in zip(sizes, shapes):
        cols = slice(start, start + size)
        inputs = [p.inputs[0], ctx.const(w[cols] if trans_b else w[:, cols], "w"),
                  ctx.const(scales.reshape(-1)[cols] if scales.numel() > 1 else scales, "w_scale")]
        if bias is not None:
            inputs.append(ctx.const(bias.reshape(-1)[cols], "b"))
        attrs = dict(p.attrs)
        if "post_bias" in attrs:
            attrs["post_bias"] = list(attrs["post_bias"])[cols]
        y = ctx.emit("QLinear", inputs, attrs, domain=FUSEGRAPH_DOMAIN)
        outs.append(ctx.emit("Reshape", [y, ctx.const(torch.tensor(shape, dtype=torch.int64), "shape")]))
        start += size
    return outs


# ------------------------------------------------------------------------ Q(DQ(x) op c ...)

def _affine_chain(node: Node | None):
    """(index of the live input, [(op, constant input index)]) of a ``Mul`` / ``Add`` / ``Sub``
    / ``Div`` by a constant, or an ``ElementwiseChain`` of such steps, the running value first
    in each; None otherwise."""
    if node is None or len(node.outputs) != 1:
        return None
    live = [i for i, v in enumerate(node.inputs) if v is not None and not v.is_const]
    if len(live) != 1 or None in node.inputs:
        return None
    if node.domain == "" and node.op_type in AFFINE_STEPS and len(node.inputs) == 2:
        if live[0] == 1 and node.op_type in ("Sub", "Div"):
            return None
        return live[0], [(node.op_type, 1 - live[0])]
    if not _fg(node, "ElementwiseChain"):
        return None
    steps = []
    for k, step in enumerate(node.attrs.get("steps", [])):
        op, *args = str(step).split()
        running = f"i{live[0]}" if k == 0 else "p"
        if op not in AFFINE_STEPS or len(args) != 2 or running not in args:
            return None
        other = args[1] if args[0] == running else args[0]
        if other == args[0] and op in ("Sub", "Div"):
            return None
        if not (other[:1] == "i" and other[1:].isdigit()) or int(other[1:]) == live[0]:
            return None
        steps.append((op, int(other[1:])))
    return (live[0], steps) if steps else None


def _check_affine(q: Node, ctx):
    node = q.inputs[0].producer
    chain = _affine_chain(node)
    if chain is None:
        return None
    live, steps = chain
    dq = _dq(node.inputs[live])
    if dq is None:
        return None
    if not only_use(q.inputs[0]):
        return Decline(f"{node.name}: its float result is read outside the group")
    x_shape = dq.inputs[0].shape
    for _op, k in steps:
        c = node.inputs[k]
        if c.dtype != DType.FLOAT or c.shape is None or x_shape is None or len(c.shape) > len(x_shape) or \
                any(d != 1 and d != x for d, x in zip(reversed(c.shape), reversed(x_shape))):
            return Decline(f"{node.name}: constant {c.name!r} is not float32 broadcasting over the input")
    src, dst = activation_params(dq), activation_params(q)
    for p in (src, dst):
        if isinstance(p, Decline):
            return p
    return dq.inputs[0], [node.inputs[k] for _op, k in steps], [op for op, _k in steps], src, dst


def _rewrite_affine(q: Node, found, ctx):
    x, constants, ops, src, dst = found
    return ctx.emit("Requantize", [x, *constants],
                    {"x_scale": src.scale, "x_zero_point": src.zero_point, "y_scale": dst.scale,
                     "y_zero_point": dst.zero_point, "y_type": int(dst.dtype),
                     "steps": [f"{op} {k}" for k, op in enumerate(ops, start=1)]}, domain=FUSEGRAPH_DOMAIN)


# ------------------------------------------------------------------------ DQ(product)

def _check_grid(dq: Node, ctx):
    v, views = _through_views(dq.inputs[0])
    p = v.producer
    if not _fg(p, "QConv", "QLinear", "QMatMul"):
        return None
    yt = DType(int(p.attrs.get("y_type", int(DType.UINT8))))
    if yt not in (DType.UINT8, DType.INT8) or int(p.attrs.get("y_grid", 0)):
        return None
    if not only_use(v):
        return Decline(f"{p.name}: its quantised output has other readers")
    params = activation_params(dq)
    if isinstance(params, Decline):
        return params
    if params.dtype != yt or params.scale != float(p.attrs["y_scale"]) or \
            params.zero_point != int(p.attrs.get("y_zero_point", 0)):
        return Decline(f"{dq.name}: dequantises with other parameters than {p.name} quantised with")
    return p, yt, views


def _emit_over_views(ctx, p: Node, attrs: dict, views: list[Node]):
    """The product ``p`` again with ``attrs``, then the same ``views`` over its new result
    (they move values, whatever their type)."""
    out = ctx.emit(p.op_type, list(p.inputs), attrs, domain=FUSEGRAPH_DOMAIN)
    for view in views:
        out = ctx.emit(view.op_type, [out, *view.inputs[1:]], dict(view.attrs))
    return out


def _rewrite_grid(dq: Node, found, ctx):
    p, yt, views = found
    return _emit_over_views(ctx, p, dict(p.attrs, y_type=int(DType.FLOAT), y_grid=int(yt)), views)


def _check_grid_gelu(q: Node, ctx):
    v, after = _through_views(q.inputs[0])
    g = v.producer
    if g is None or g.op_type != "Gelu" or g.domain not in ("", FUSEGRAPH_DOMAIN) \
            or len([x for x in g.inputs if x is not None]) != 1:
        return None
    u, before = _through_views(g.inputs[0])
    p = u.producer
    if not _fg(p, "QLinear") or not int(p.attrs.get("y_grid", 0)) or p.attrs.get("activation", "") \
            or p.attrs.get("mid_activation") or "y_clip" in p.attrs:
        return None
    if not (only_use(u) and only_use(g.inputs[0]) and only_use(v) and only_use(q.inputs[0])):
        return Decline(f"{p.name}: its output or its GELU's has other readers")
    params = activation_params(q)
    if isinstance(params, Decline):
        return params
    approximate = str(g.attrs.get("approximate", "none"))
    if approximate not in ("none", "tanh"):
        return Decline(f"{g.name}: approximate={approximate!r}")
    return p, params, "gelu" if approximate == "none" else "gelu_tanh", before + after


def _rewrite_grid_gelu(q: Node, found, ctx):
    p, params, activation, views = found
    attrs = {k: v for k, v in p.attrs.items() if k != "y_grid"}
    attrs.update(mid_grid=int(p.attrs["y_grid"]), mid_scale=p.attrs["y_scale"],
                 mid_zero_point=int(p.attrs.get("y_zero_point", 0)), mid_activation=activation,
                 y_type=int(params.dtype), y_scale=params.scale, y_zero_point=params.zero_point)
    return _emit_over_views(ctx, p, attrs, views)     # the GELU is elementwise: the views move its result


GRID_RULES = [
    Rule("qdq_grid_output", _check_grid, _rewrite_grid, ops=("DequantizeLinear",), priority=10,
         doc="DQ(QConv / QLinear / QMatMul) -> the product writing float32 on its quantisation grid: exact"),
    Rule("qdq_grid_gelu", _check_grid_gelu, _rewrite_grid_gelu, ops=("QuantizeLinear",), priority=8,
         doc="Q(Gelu(QLinear on a grid)) -> the QLinear with the grid, the GELU and the Q's parameters"),
]

AFFINE_RULES = [
    Rule("qdq_affine", _check_affine, _rewrite_affine, ops=("QuantizeLinear",), priority=10,
         doc="Q(DQ(x) op c ...) with per-channel float constants -> Requantize(x, c ...) with steps: exact"),
]

SINK_ROOTS = tuple(sorted(op for domain, op in movement_ops(*SINK_MOVES) if domain == "")) + ORDER_STATISTICS

RULES = [
    Rule("qdq_bias", _check_bias, _rewrite_bias, ops=("QuantizeLinear",), priority=18,
         doc="Q(Add(DQ(QLinear), bias)) -> QLinear with the bias: rounds once (rounding_bound)"),
    Rule("qdq_residual", _check_residual, _rewrite_residual, ops=("QuantizeLinear",), priority=16,
         doc="Q(act(Add(DQ(QConv), DQ(z)))) -> QConv with residual z (rounds once); else QAdd"),
    Rule("qdq_concat", _check_q_concat, _rewrite_q_concat, ops=("QuantizeLinear",), priority=14,
         doc="Q(Concat(DQ(a) ...)) -> Concat of a (or Requantize(a)): exact"),
    Rule("qdq_cancel", _check_cancel, _rewrite_cancel, ops=("QuantizeLinear",), priority=12,
         doc="Q(DQ(x)) -> x (same parameters) or Requantize(x): exact"),
    Rule("dq_sink", _check_sink, _rewrite_sink, ops=SINK_ROOTS, priority=10,
         doc="Op(DQ(x)) -> DQ(Op(x)) for data movement and max pools: exact"),
    Rule("dq_join", _check_join, _rewrite_join, ops=("Concat",), priority=10,
         doc="Concat(DQ(a), DQ(b)) with one set of parameters -> DQ(Concat(a, b)): exact"),
    Rule("requantize_product", _check_requantize_product, _rewrite_requantize_product,
         ops=("fusegraph::Requantize",), priority=10,
         doc="Requantize(QConv / QLinear), through views and permutations, times c > 0 -> the "
             "product writing its parameters: rounds once (rounding_bound)"),
    Rule("split_product", _check_split_product, _rewrite_split_product, ops=("Split",), priority=8,
         doc="Split(QLinear) along its columns -> one QLinear per part (each part's requantisation then folds)"),
]
