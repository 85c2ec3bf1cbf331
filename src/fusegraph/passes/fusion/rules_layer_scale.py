"""Rule ``layer_scale``: a per-feature constant scale after a linear layer folds into its weights.

ConvNeXt, DINOv2, BEiT and CaiT multiply each residual branch by a learned vector (layer
scale, ``gamma * x``) right after the branch's last linear layer: a separate elementwise
pass over the activation. Since ``(x @ w + b) * g == x @ (w * g) + b * g`` (``g`` along the
output features), ``Mul(Linear(x, w, b), g)`` becomes one ``Linear`` with the scaled weights
and bias (computed in float64, rounded once to the weights' type: equal up to that rounding,
as oneDNN's and onnxruntime's folds are). Both ``fusegraph::Linear`` and an activation-free
``fusegraph::LinearAct`` take it; the scale must broadcast over the last axis only and the
product be read by the Mul alone.

Declines: a scale that is not a constant vector along the output features, a layer with an
activation (the scale would come after it), weights or bias computed at run time.
"""
from __future__ import annotations

from ..facts import const_of
from ..rule import Decline, Rule
from .pattern import Pat, Var

FG = "fusegraph"


def _check(m, ctx):
    lin, y = m.nodes["linear"], m.root.outputs[0]
    if lin.op_type == "LinearAct" and str(lin.attrs.get("activation", "none")) != "none":
        return Decline(f"the layer applies {lin.attrs['activation']} before the scale")
    w = const_of(lin.inputs[1])
    b = const_of(lin.input(2)) if lin.input(2) is not None else None
    if w is None or w.dim() != 2 or (lin.input(2) is not None and b is None):
        return Decline("the layer's weights or bias are not constant")
    n = w.shape[0] if int(lin.attrs.get("trans_b", 0)) else w.shape[1]
    g = const_of(m.values["g"])
    out = lin.outputs[0].shape
    if g is None or not g.is_floating_point() or out is None or g.dim() > len(out) or g.numel() not in (1, n) \
            or any(d != 1 for d in g.shape[:-1]) or (g.dim() and g.shape[-1] not in (1, n)):
        return Decline("the scale is not a constant vector along the output features")
    if y.shape is None or tuple(y.shape) != tuple(out) or y.dtype != lin.outputs[0].dtype:
        return Decline("the scale broadcasts the result to another shape or type")
    return w, b, g.double().reshape(-1).expand(n)


def _rewrite(m, got, ctx):
    lin = m.nodes["linear"]
    w, b, g = got
    trans_b = int(lin.attrs.get("trans_b", 0))
    w2 = (w.double() * (g.reshape(-1, 1) if trans_b else g.reshape(1, -1))).to(w.dtype)
    inputs = [lin.inputs[0], ctx.const(w2, "weight")]
    if b is not None:
        inputs.append(ctx.const((b.double().reshape(-1) * g).to(b.dtype), "bias"))
    return ctx.emit(lin.op_type, inputs, dict(lin.attrs), domain=FG)


RULES: list[Rule] = [
    Rule("layer_scale", _check, _rewrite,
         pattern=Pat("Mul", Pat((f"{FG}::Linear", f"{FG}::LinearAct"), Var("x"), Var("w"), ..., name="linear"),
                     Var("g")),
         priority=60, doc="(x @ w + b) * g == x @ (w * g) + b * g, g along the output features"),
]
