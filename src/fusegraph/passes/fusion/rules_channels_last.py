"""Channels-last blocks without their transposes: a ``Transpose`` that moves the channel axis of a
conv net's activation last (``[0, 2, .., 1]``) is sunk through the per-pixel ops that follow it,
until it meets its inverse and both vanish. ConvNeXt writes every block as ``Transpose ->
LayerNorm -> Linear + GELU -> Linear (layer scale folded) -> Transpose back -> residual Add``:
after these rules it is ``ChannelLayerNorm -> 1x1 FusedConv + GELU -> 1x1 FusedConv`` on the
channels-last image, and the residual Add folds into the last convolution (``conv_add``):
no copy, no separate add.

- ``sink_transpose_norm`` (16): ``LayerNorm(Transpose(x))`` over the moved channels ->
  ``Transpose(ChannelLayerNorm(x))``.
- ``sink_transpose_linear`` (15, after ``linear_act`` has fused the activation):
  ``Linear / LinearAct(Transpose(x), w, b)`` over the moved channels -> ``Transpose(FusedConv(x,
  w as [N, K, 1(, 1)], b))``, a pointwise convolution with the same activation.
- ``transpose_pair`` (14): ``Transpose(Transpose(x))`` whose permutations compose to the
  identity -> ``x``.

Each applies only where the transposed value has that one reader (else the copy stays for the
others and nothing is gained), on 3-D ``[N, C, L]`` or 4-D ``[N, C, H, W]`` data of static
shape. Exact: the same arithmetic over the same numbers; a layer norm of channels-last rows
and a pointwise convolution sum in the order oneDNN's kernels do (rounding-level differences).
"""
from __future__ import annotations

from ..facts import const_of
from ..rule import Decline, Rule
from .pattern import Pat, Var

FG = "fusegraph"
LAYER_NORMS = ("LayerNormalization", f"{FG}::LayerNorm")
# LinearAct activation -> FusedConv activation
CONV_ACTIVATION = {"none": "", "relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_tanh", "sigmoid": "sigmoid",
                   "tanh": "tanh", "silu": "swish"}


def _perm(node) -> list[int]:
    return [int(p) for p in node.attrs.get("perm") or []]


def _to_last(t, x) -> bool:
    r = len(x.shape) if x.shape is not None else 0
    return r in (3, 4) and _perm(t) == [0, *range(2, r), 1] and all(isinstance(d, int) for d in x.shape)


def _moved(m):
    """Why the matched Transpose is not a lone channels-to-last move of static data, or None."""
    t, x = m.nodes["t"], m.values["x"]
    if not _to_last(t, x):
        return Decline("not a move of the channel axis last, on 3-D / 4-D data of static shape")
    out = t.outputs[0]
    if len(out.uses) != 1 or out.is_graph_output:
        return Decline("the transposed value has other readers")
    return None


def _to_last_attrs(rank: int) -> dict:
    return {"perm": [0, *range(2, rank), 1]}


# ------------------------------------------------------------------------ layer norm

def _norm_check(m, ctx):
    why = _moved(m)
    if why is not None:
        return why
    ln, x = m.root, m.values["x"]
    c = x.shape[1]
    if ln.domain == "" and (int(ln.attrs.get("axis", -1)) not in (-1, len(x.shape) - 1)
                            or any(o.uses or o.is_graph_output for o in ln.outputs[1:])):
        return Decline("the layer norm normalises more than the channels, or its statistics are read")
    for v in ln.inputs[1:]:
        t = const_of(v) if v is not None else None
        if v is not None and (t is None or tuple(t.shape) != (c,)):
            return Decline("gamma / beta are not constant vectors of the channels")
    return True


def _norm_rewrite(m, _, ctx):
    ln, x = m.root, m.values["x"]
    inputs = [x, *ln.inputs[1:]]
    while inputs[-1] is None:
        inputs.pop()
    y = ctx.emit("ChannelLayerNorm", inputs, {"epsilon": float(ln.attrs.get("epsilon", 1e-5))}, domain=FG)
    out = ctx.emit("Transpose", [y], _to_last_attrs(len(x.shape)))
    return [out] + [None] * (len(ln.outputs) - 1)


# ------------------------------------------------------------------------ linear -> pointwise conv

def _linear_check(m, ctx):
    why = _moved(m)
    if why is not None:
        return why
    lin, x = m.root, m.values["x"]
    act = str(lin.attrs.get("activation", "none")) if lin.op_type == "LinearAct" else "none"
    if act not in CONV_ACTIVATION:
        return Decline(f"activation {act!r} has no FusedConv form")
    if lin.attrs.get("out_dtype") is not None:
        return Decline("a product that writes another type")
    w = const_of(lin.inputs[1])
    b = lin.input(2)
    if w is None or w.dim() != 2 or (b is not None and const_of(b) is None):
        return Decline("the weights or bias are not constant")
    trans_b = int(lin.attrs.get("trans_b", 0))
    k = w.shape[1] if trans_b else w.shape[0]
    if k != x.shape[1]:
        return Decline("the product does not read the moved channels")
    n = w.shape[0] if trans_b else w.shape[1]
    spatial = len(x.shape) - 2
    wc = (w if trans_b else w.t()).contiguous().reshape((n, k) + (1,) * spatial)
    return wc, CONV_ACTIVATION[act]


def _linear_rewrite(m, got, ctx):
    lin, x = m.root, m.values["x"]
    wc, act = got
    spatial = len(x.shape) - 2
    attrs = {"kernel_shape": [1] * spatial, "strides": [1] * spatial, "pads": [0] * (2 * spatial),
             "dilations": [1] * spatial, "group": 1, "activation": act}
    y = ctx.emit("FusedConv", [x, ctx.const(wc, "weight"), lin.input(2)], attrs, domain=FG)
    return ctx.emit("Transpose", [y], _to_last_attrs(len(x.shape)))


# ------------------------------------------------------------------------ transpose pairs

def _pair_check(m, ctx):
    inner, outer = m.nodes["t"], m.root
    p, q = _perm(inner), _perm(outer)
    if not p or len(p) != len(q) or [p[i] for i in q] != list(range(len(p))):
        return None                        # not inverse permutations: nothing to say
    if outer.outputs[0].is_graph_output and m.values["x"].is_graph_input:
        return Decline("would make a graph input a graph output")
    return True


def _pair_rewrite(m, _, ctx):
    return m.values["x"]


_T = Pat("Transpose", Var("x"), name="t")

RULES: list[Rule] = [
    Rule("sink_transpose_norm", _norm_check, _norm_rewrite,
         pattern=Pat(LAYER_NORMS, _T, Var("gamma", optional=True), Var("beta", optional=True)), priority=16,
         doc="a layer norm of the moved channels is the channel layer norm, moved"),
    Rule("sink_transpose_linear", _linear_check, _linear_rewrite,
         pattern=Pat((f"{FG}::Linear", f"{FG}::LinearAct"), _T, Var("w"), Var("b", optional=True)), priority=15,
         doc="a product over the moved channels is a pointwise convolution, moved"),
    Rule("transpose_pair", _pair_check, _pair_rewrite,
         pattern=Pat("Transpose", _T), priority=14, doc="inverse permutations cancel"),
]
