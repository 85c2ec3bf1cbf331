"""Channel normalisation rules (``RULES``): the forms exporters give a conv net's layer norm over
channels and its group norm, as the fused ops of ``ops/fused_norm_cnn.py``.

- ``channel_layer_norm`` (70): ``Transpose([0, 2, .., 1]) -> LayerNormalization(axis=-1) ->
  Transpose([0, r-1, 1, ..])`` (ConvNeXt's "channels_first" LayerNorm, HuBERT's conv feature
  encoder; ONNX ``LayerNormalization`` or ``fusegraph::LayerNorm``) -> ``ChannelLayerNorm(x)``:
  the same normalisation over axis 1, no transposes; on channels-last data it is oneDNN's
  layer norm over contiguous rows.
- ``group_norm`` (65, largest pattern first): ``InstanceNormalization`` (of ``x``, or of
  ``Reshape(x, [N, G, -1])`` followed by the ``Reshape`` back: PyTorch's GroupNorm export),
  then optionally ``Mul`` by a per-channel constant and ``Add`` of one -> ``GroupNorm(x,
  scale, bias)`` with ``groups`` G (C for a plain InstanceNormalization) and the affine steps
  folded into its per-channel scale and bias (in float64: ``s_g * gamma`` and
  ``b_g * gamma + beta``).

- ``onnx_layer_norm`` (5, after the others and ``skip_layer_norm``): an ONNX
  ``LayerNormalization`` over the last axis whose statistics nobody reads -> ``fusegraph::LayerNorm``
  (ConvNeXt's channels-last blocks: oneDNN's layer norm instead of the op's portable kernel).

Declines name the condition that failed: a permutation that is not a channel move and its
inverse, a layer norm over more than the last axis or with its statistics read, affine
parameters that are not constants of the channel count, reshapes that do not split the
channels into equal groups, shapes not known.
"""
from __future__ import annotations

from ..facts import const_of, shapes_equal
from ..rule import Decline, Rule
from .pattern import Pat, Var

FG = "fusegraph"
LAYER_NORMS = ("LayerNormalization", f"{FG}::LayerNorm")


def _static(shape) -> bool:
    return shape is not None and all(isinstance(d, int) for d in shape)


def _channel_vector(v, c: int, rank: int):
    """A constant broadcasting over every axis but the channel axis of a rank-``rank`` tensor
    with ``c`` channels, as a float64 vector of ``c``; None otherwise."""
    t = const_of(v)
    if t is None or not t.is_floating_point() or t.dim() > rank:
        return None
    shape = (1,) * (rank - t.dim()) + tuple(t.shape)
    if any(d != 1 for i, d in enumerate(shape) if i != 1) or shape[1] not in (1, c):
        return None
    return t.double().reshape(-1).expand(c)


# ------------------------------------------------------------------------ channel layer norm

def _ln_check(m, ctx):
    t_in, ln, t_out = m.nodes["t_in"], m.nodes["ln"], m.root
    x = m.values["x"]
    if not _static(x.shape) or len(x.shape) not in (3, 4):
        return Decline("needs a 3-D or 4-D input of static shape")
    r, c = len(x.shape), x.shape[1]
    if [int(p) for p in t_in.attrs.get("perm") or []] != [0, *range(2, r), 1] or \
            [int(p) for p in t_out.attrs.get("perm") or []] != [0, r - 1, *range(1, r - 1)]:
        return Decline("the transposes do not move the channel axis last and back")
    if ln.domain == "" and int(ln.attrs.get("axis", -1)) not in (-1, r - 1):
        return Decline("the layer norm normalises more than the last axis")
    if any(o.uses or o.is_graph_output for o in ln.outputs[1:]):
        return Decline("the layer norm's mean or inverse deviation is read")
    if not x.dtype.is_float:
        return Decline("not floating-point data")
    params = []
    for name in ("gamma", "beta"):
        v = m.values.get(name)
        if v is None:
            params.append(None)
            continue
        t = const_of(v)
        if t is None or t.numel() != c:
            return Decline(f"the layer norm's {name} is not a constant of the channel count")
        params.append(v if tuple(t.shape) == (c,) else ctx.const(t.reshape(c), name))
    return params


def _ln_rewrite(m, params, ctx):
    ln = m.nodes["ln"]
    eps = float(ln.attrs.get("epsilon", 1e-5))
    inputs = [m.values["x"], *params]
    while inputs and inputs[-1] is None:
        inputs.pop()
    return ctx.emit("ChannelLayerNorm", inputs, {"epsilon": eps}, domain=FG)


_CHANNEL_LN = Pat("Transpose", Pat(LAYER_NORMS, Pat("Transpose", Var("x"), name="t_in"),
                                   Var("gamma", optional=True), Var("beta", optional=True), name="ln"),
                  name="t_out")


# ------------------------------------------------------------------------ group norm

def _core(grouped: bool) -> Pat:
    inner = Var("x") if not grouped else Pat("Reshape", Var("x"), Var("s1"), name="split")
    norm = Pat("InstanceNormalization", inner, Var("s"), Var("b"), name="norm")
    return norm if not grouped else Pat("Reshape", norm, Var("s2"), name="merge")


def _gn_check(m, ctx):
    x, norm, y = m.values["x"], m.nodes["norm"], m.root.outputs[0]
    if not _static(x.shape) or len(x.shape) < 3 or not x.dtype.is_float:
        return Decline("needs floating-point data of static shape, rank 3 or more")
    n, c = x.shape[0], x.shape[1]
    if "split" in m.nodes:
        mid = norm.inputs[0].shape
        if not _static(mid) or len(mid) != 3 or mid[0] != n or c % mid[1] or \
                not shapes_equal(m.nodes["merge"].outputs[0].shape, x.shape):
            return Decline("the reshapes do not split the channels into equal groups and back")
        groups = mid[1]
    else:
        groups = c
    s, b = const_of(m.values["s"]), const_of(m.values["b"])
    if s is None or b is None or s.numel() != groups or b.numel() != groups:
        return Decline("the instance norm's scale and bias are not constants of the group count")
    per = c // groups
    scale = s.double().reshape(-1).repeat_interleave(per)
    bias = b.double().reshape(-1).repeat_interleave(per)
    rank = len(x.shape)
    if "gamma" in m.values:
        gamma = _channel_vector(m.values["gamma"], c, rank)
        if gamma is None:
            return Decline("the scale after the norm is not a per-channel constant")
        scale, bias = scale * gamma, bias * gamma
    if "beta" in m.values:
        beta = _channel_vector(m.values["beta"], c, rank)
        if beta is None:
            return Decline("the shift after the norm is not a per-channel constant")
        bias = bias + beta
    if not shapes_equal(y.shape, x.shape):
        return Decline("the affine steps broadcast the result to another shape")
    return groups, scale.to(s.dtype), bias.to(s.dtype), float(norm.attrs.get("epsilon", 1e-5))


def _gn_rewrite(m, got, ctx):
    groups, scale, bias, eps = got
    return ctx.emit("GroupNorm", [m.values["x"], ctx.const(scale, "scale"), ctx.const(bias, "bias")],
                    {"groups": int(groups), "epsilon": eps}, domain=FG)


def _gn_patterns():
    for grouped in (True, False):
        core = _core(grouped)
        yield Pat("Add", Pat("Mul", core, Var("gamma"), name="scale"), Var("beta"))
        yield Pat("Mul", core, Var("gamma"))
        yield Pat("Add", core, Var("beta"))
        yield core


# ------------------------------------------------------------------------ ONNX LayerNormalization

def _onnx_ln_check(m, ctx):
    ln = m.root
    x = ln.inputs[0]
    if x.shape is None or not x.shape or not isinstance(x.shape[-1], int) or not x.dtype.is_float:
        return Decline("not floating point, or the normalised size is unknown")
    if int(ln.attrs.get("axis", -1)) not in (-1, len(x.shape) - 1) or int(ln.attrs.get("stash_type", 1)) != 1:
        return Decline("normalises more than the last axis, or keeps statistics in another type")
    if any(o.uses or o.is_graph_output for o in ln.outputs[1:]):
        return Decline("its mean or inverse deviation is read")
    if any(v is not None and (v.shape is None or tuple(v.shape) != (x.shape[-1],)) for v in ln.inputs[1:]):
        return Decline("scale / bias are not vectors along the last axis")
    return True


def _onnx_ln_rewrite(m, _, ctx):
    ln = m.root
    out = ctx.emit("LayerNorm", [v for v in ln.inputs], {"epsilon": float(ln.attrs.get("epsilon", 1e-5))},
                   domain=FG)
    return [out] + [None] * (len(ln.outputs) - 1)


RULES: list[Rule] = [
    Rule("onnx_layer_norm", _onnx_ln_check, _onnx_ln_rewrite,
         pattern=Pat("LayerNormalization", Var("x"), Var("gamma"), Var("beta", optional=True)), priority=5,
         doc="ONNX LayerNormalization over the last axis, statistics unread: fusegraph's (oneDNN on CPU); "
             "after the channel, skip and group norm rules have had theirs"),
    Rule("channel_layer_norm", _ln_check, _ln_rewrite, pattern=_CHANNEL_LN, priority=70,
         doc="a layer norm between a channel-to-last transpose and its inverse: one norm over axis 1"),
    *[Rule("group_norm", _gn_check, _gn_rewrite, pattern=pat, priority=65 - i,
           doc="instance norm of the channels or of channel groups, then per-channel affine steps: "
               "equal up to the rounding of the folded scale and bias")
      for i, pat in enumerate(_gn_patterns())],
]
