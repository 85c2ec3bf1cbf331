"""CNN fusion rules (``RULES``): convolution + BatchNorm / residual add / activation.

Every rule fuses into ``fusegraph::FusedConv`` (``ops/fused_cnn.py``), whose value is
``act(conv(x, w) + b + z)``; the order of the rules (priority) builds it up step by step:

- ``conv_bn`` (130): ``BatchNormalization(Conv)`` -> ``Conv`` with ``w * s`` and ``(b - mean) * s + B``,
  ``s = scale / sqrt(var + eps)`` in float64. (At O2 ``batchnorm_to_affine`` and
  ``conv_affine_fold`` already do this in the simplify group; this rule covers pipelines
  where those are disabled.)
- ``conv_add`` (120): ``Add / Sum(Conv, z)`` with ``z`` of exactly the conv output's shape
  -> ``FusedConv(x, w, b, z)``. Declines a broadcasting ``z``.
- ``conv_<activation>`` (110): an activation of a Conv or of an activation-free FusedConv
  (so Conv + Add + Relu ends as one node): Relu, Clip (Relu6), Sigmoid, Tanh, HardSigmoid
  (torch's 1/6, 0.5 only), HardSwish and its ``x * HardSigmoid(x)`` form, SiLU/Swish
  (``x * Sigmoid(x)`` and ``Swish``), LeakyRelu, GELU (ONNX ``Gelu`` and ``fusegraph::Gelu``).
- ``channel_shuffle`` (100): ``Reshape [N, g, C/g, H, W] -> Transpose(0, 2, 1, 3, 4) -> Reshape
  [N, C, H, W]`` -> ``fusegraph::ChannelShuffle`` (one copy, in the input's layout).
- ``conv_prepack`` (-100, after everything else): any remaining 1-D or 2-D Conv with constant
  weights -> an activation-free ``FusedConv`` (oneDNN with prepacked weights, channels-last).

Common conditions (the check declines with ``Decline(reason)`` naming the one that failed):
constant weights and bias, float data, the conv output read by nothing outside the pattern.
``external`` / ``no_fuse`` flags are handled by the pattern matcher and reported as blocked.
"""
from __future__ import annotations

import math

import torch

from ..facts import const_of, shapes_equal
from ..rule import Decline, Rule
from .pattern import Pat, Var

FG = "fusegraph"
CONV_OPS = ("Conv", "fusegraph::FusedConv")
FUSED_ATTRS = ("activation", "activation_params")


def _conv(ops=CONV_OPS) -> Pat:
    return Pat(ops, Var("x"), Var("w"), Var("b", optional=True), ..., name="conv", single_use=False)


# ------------------------------------------------------------------------ shared pieces

def _conv_decline(m, allow_residual: bool = True, uses: bool = True) -> Decline | None:
    """Why the matched conv cannot absorb its consumer(s), or None."""
    conv = m.nodes["conv"]
    y = conv.outputs[0]
    inside = {id(n) for n in m.matched}
    outside = [u for u, _ in y.uses if id(u) not in inside]
    if uses and (outside or y.is_graph_output):
        return Decline(f"conv output %{y.name} is also read by "
                       f"{', '.join(u.name for u in outside) or 'the graph outputs'}")
    if conv.domain == FG and conv.attrs.get("activation"):
        return Decline(f"{conv.name} already applies {conv.attrs['activation']}")
    if conv.domain == FG and not allow_residual and conv.input(3) is not None:
        return Decline(f"{conv.name} already adds a residual")
    if const_of(conv.input(1)) is None:
        return Decline("conv weights are not constant")
    if conv.input(2) is not None and const_of(conv.input(2)) is None:
        return Decline("conv bias is not constant")
    x = conv.inputs[0]
    if not y.dtype.is_float or x.shape is None or len(x.shape) < 3:
        return Decline("not a floating-point convolution of known rank")
    return None


def _emit(ctx, conv, activation: str = "", params=(), z=None):
    attrs = {k: v for k, v in conv.attrs.items() if k not in FUSED_ATTRS}
    attrs["activation"] = activation
    if params:
        attrs["activation_params"] = [float(p) for p in params]
    z = z if z is not None else (conv.input(3) if conv.domain == FG else None)
    inputs = [conv.inputs[0], conv.inputs[1], conv.input(2)] + ([z] if z is not None else [])
    return ctx.emit("FusedConv", inputs, attrs, domain=FG)


# ------------------------------------------------------------------------ conv + BatchNorm

def _bn_check(m, ctx):
    bn = m.root
    why = _conv_decline(m)
    if why is not None:
        return why
    if m.nodes["conv"].domain == FG:
        return Decline("BatchNormalization after a fused convolution")
    if int(bn.attrs.get("training_mode", 0)) or any(o.uses or o.is_graph_output for o in bn.outputs[1:]):
        return Decline("BatchNormalization in training mode")
    if any(const_of(bn.input(i)) is None for i in (1, 2, 3, 4)):
        return Decline("BatchNormalization parameters are not constant")
    return True


def _bn_rewrite(m, _, ctx):
    bn, conv = m.root, m.nodes["conv"]
    scale, beta, mean, var = (const_of(bn.input(i)).double().reshape(-1) for i in (1, 2, 3, 4))
    s = scale / torch.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
    w = const_of(conv.input(1))
    b = const_of(conv.input(2)).double() if conv.input(2) is not None else torch.zeros_like(s)
    w2 = (w.double() * s.reshape((-1,) + (1,) * (w.dim() - 1))).to(w.dtype)
    b2 = ((b - mean) * s + beta).to(w.dtype)
    out = ctx.emit("Conv", [conv.inputs[0], ctx.const(w2, "weight"), ctx.const(b2, "bias")], dict(conv.attrs))
    return [out] + [None] * (len(bn.outputs) - 1)


# ------------------------------------------------------------------------ conv + residual add

def _add_check(m, ctx):
    why = _conv_decline(m, allow_residual=False)
    if why is not None:
        return why
    conv, z, y = m.nodes["conv"], m.values["z"], m.root.outputs[0]
    if z is m.nodes["conv"].outputs[0]:
        return Decline("both operands are the conv output")
    if not shapes_equal(z.shape, conv.outputs[0].shape) or not shapes_equal(y.shape, z.shape):
        return Decline(f"the residual operand %{z.name} broadcasts ({z.type_str()} vs "
                       f"{conv.outputs[0].type_str()})")
    if z.dtype != y.dtype:
        return Decline("the residual operand has another dtype")
    return True


def _add_rewrite(m, _, ctx):
    return _emit(ctx, m.nodes["conv"], z=m.values["z"])


# ------------------------------------------------------------------------ conv + activation

def _scalar_attr(node, name, default):
    return float(node.attrs.get(name, default))


def _clip_params(node):
    if node.version < 11:
        return [_scalar_attr(node, "min", -math.inf), _scalar_attr(node, "max", math.inf)]
    out = []
    for i, default in ((1, -math.inf), (2, math.inf)):
        if node.input(i) is None:
            out.append(default)
            continue
        t = const_of(node.input(i))
        if t is None or t.numel() != 1:
            return Decline("Clip bounds are not constant scalars")
        out.append(float(t.reshape(-1)[0]))
    return out if out[0] <= out[1] else Decline("Clip min > max")


def _is_torch_hardsigmoid(node) -> bool:
    return abs(_scalar_attr(node, "alpha", 0.2) - 1 / 6) < 1e-6 and _scalar_attr(node, "beta", 0.5) == 0.5


def _activation(m):
    """(activation, params) for the matched consumer, or a ``Decline``."""
    root = m.root
    op = root.op_type
    if op == "Relu":
        return "relu", []
    if op == "Clip":
        p = _clip_params(root)
        return p if isinstance(p, Decline) else ("hardtanh", p)
    if op in ("Sigmoid", "Tanh", "HardSwish"):
        return op.lower(), []
    if op == "HardSigmoid":
        return ("hardsigmoid", []) if _is_torch_hardsigmoid(root) else \
            Decline("HardSigmoid alpha/beta differ from (1/6, 0.5)")
    if op == "LeakyRelu":
        return "leaky_relu", [_scalar_attr(root, "alpha", 0.01)]
    if op == "Swish":
        return ("swish", []) if _scalar_attr(root, "alpha", 1.0) == 1.0 else Decline("Swish alpha != 1")
    if op == "Gelu":
        approx = root.attrs.get("approximate", "none")
        return ("gelu" if approx == "none" else "gelu_tanh", []) if approx in ("none", "tanh") else \
            Decline(f"Gelu approximate={approx!r}")
    if op == "Mul":
        gate = m.nodes["gate"]
        if gate.op_type == "Sigmoid":
            return "swish", []
        return ("hardswish", []) if _is_torch_hardsigmoid(gate) else \
            Decline("HardSigmoid alpha/beta differ from (1/6, 0.5)")
    return Decline(f"unknown activation {op}")


def _act_check(m, ctx):
    why = _conv_decline(m)
    if why is not None:
        return why
    return _activation(m)   # (activation, params) for the rewrite, or a Decline


def _act_rewrite(m, act, ctx):
    activation, params = act
    return _emit(ctx, m.nodes["conv"], activation, params)


def _gated(gate_op: str) -> Pat:
    conv = _conv()
    return Pat("Mul", conv, Pat(gate_op, conv, name="gate"))


ACT_PATTERNS = {
    "conv_relu": [Pat("Relu", _conv())],
    "conv_clip": [Pat("Clip", _conv(), ...)],
    "conv_sigmoid": [Pat("Sigmoid", _conv())],
    "conv_tanh": [Pat("Tanh", _conv())],
    "conv_hardsigmoid": [Pat("HardSigmoid", _conv())],
    "conv_hardswish": [Pat("HardSwish", _conv()), _gated("HardSigmoid")],
    "conv_silu": [_gated("Sigmoid"), Pat("Swish", _conv())],
    "conv_leaky_relu": [Pat("LeakyRelu", _conv())],
    "conv_gelu": [Pat(("Gelu", "fusegraph::Gelu"), _conv())],
}


# ------------------------------------------------------------------------ prepack the rest

def _is_1d_or_2d(v) -> bool:
    return v.shape is not None and len(v.shape) in (3, 4)


def _prepack_check(m, ctx):
    why = _conv_decline(m, uses=False)   # the fused node replaces the conv output itself
    return True if why is None else why


def _prepack_rewrite(m, _, ctx):
    return _emit(ctx, m.root)


_PREPACK = Pat("Conv", Var("x", _is_1d_or_2d), Var("w", lambda v: v.is_const), Var("b", optional=True),
               name="conv")


# ------------------------------------------------------------------------ channel shuffle

def _shuffle_check(m, ctx):
    x, mid, y = m.values["x"], m.nodes["split"].outputs[0], m.root.outputs[0]
    perm = m.nodes["swap"].attrs.get("perm")
    if x.shape is None or len(x.shape) != 4 or mid.shape is None or len(mid.shape) != 5:
        return Decline("not a 4-D -> 5-D channel split")
    n, c, h, w = x.shape
    g, cg = mid.shape[1], mid.shape[2]
    if list(perm or []) != [0, 2, 1, 3, 4] or not isinstance(g, int) or not isinstance(cg, int):
        return Decline("not a swap of the two channel factors")
    if tuple(mid.shape) != (n, g, cg, h, w) or g * cg != c or not shapes_equal(y.shape, x.shape):
        return Decline("the reshapes do not split and merge the channel axis")
    return g   # the group count


def _shuffle_rewrite(m, groups, ctx):
    return ctx.emit("ChannelShuffle", [m.values["x"]], {"groups": int(groups)}, domain=FG)


_SHUFFLE = Pat("Reshape", Pat("Transpose", Pat("Reshape", Var("x"), Var("s1"), name="split"), name="swap"),
               Var("s2"))


RULES: list[Rule] = [
    Rule("conv_bn", _bn_check, _bn_rewrite,
         pattern=Pat("BatchNormalization", _conv(("Conv",)), Var("scale"), Var("bias"), Var("mean"), Var("var")),
         priority=130, doc="BN folded into the weights: equal up to rounding"),
    Rule("conv_add", _add_check, _add_rewrite, pattern=Pat(("Add", "Sum"), _conv(), Var("z")), priority=120,
         doc="residual summand of the conv output's exact shape, added before any activation"),
    *[Rule(name, _act_check, _act_rewrite, pattern=pat, priority=110,
           doc="activation applied by oneDNN as a post-op")
      for name, pats in ACT_PATTERNS.items() for pat in pats],
    Rule("channel_shuffle", _shuffle_check, _shuffle_rewrite, pattern=_SHUFFLE, priority=100,
         doc="channel split, swap, merge: one copy"),
    Rule("conv_prepack", _prepack_check, _prepack_rewrite, pattern=_PREPACK, priority=-100,
         doc="1-D / 2-D conv with constant weights: oneDNN, weights prepacked at bind time"),
]
