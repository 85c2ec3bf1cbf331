"""Rule ``pad_into_conv``: a zero ``Pad`` of the spatial axes in front of a convolution becomes
the convolution's own (possibly asymmetric) padding.

Exporters write TensorFlow's "same" padding (``transformers``' MobileNet V1 / V2 and
EfficientNet, TF-converted models) as ``Pad(x, pads, 0)`` followed by a ``Conv`` with
``pads = 0``: one extra copy of the activation per convolution, and a node the layout pass
cannot see through (so the whole net stays NCHW, off oneDNN's channels-last kernels). A
convolution pads with zeros itself and its pads may differ at the beginning and the end of
each axis (ONNX ``pads`` = [begin..., end...]; oneDNN ``padding_l`` / ``padding_r``), so

    Conv(Pad(x, [0, 0, pb..., 0, 0, pe...], 0), pads=[cb..., ce...])
        == Conv(x, pads=[cb + pb..., ce + pe...])

exactly, for ``Conv`` and ``fusegraph::FusedConv`` (the residual and the activation come
after the convolution, untouched). The Pad stays while something else reads it.

Declines (recorded in ``report.fusions``): a mode other than ``constant`` (reflect / edge /
wrap pad with values, not zeros), a non-zero or run-time pad value, pads or axes computed at
run time, negative pads (a crop), padding of the batch or channel axis, a convolution that
pads itself with ``auto_pad`` SAME_*, an input of unknown rank.
"""
from __future__ import annotations

from ..facts import const_of, ints_arg
from ..rule import Decline, Rule
from .pattern import Pat, Var

FG = "fusegraph"


def _mode(pad) -> str:
    mode = pad.attrs.get("mode", "constant")
    return mode.decode() if isinstance(mode, bytes) else str(mode)


def _pad_value(pad):
    """The constant pad value as a float, or a ``Decline``."""
    if pad.version < 11:
        return float(pad.attrs.get("value", 0.0))
    v = pad.input(2)
    if v is None:
        return 0.0
    t = const_of(v)
    if t is None:
        return Decline("the pad value is computed at run time")
    if t.numel() == 0:
        return 0.0
    return float(t.reshape(-1)[0])


def _spatial_pads(pad, rank: int):
    """(begins, ends) of the spatial axes of a rank-``rank`` input, or a ``Decline``."""
    known, pads = ints_arg(pad, 1, "pads", 11)
    if not known or pads is None:
        return Decline("the pads are computed at run time")
    axes = list(range(rank))
    if pad.version >= 18 and pad.input(3) is not None:
        t = const_of(pad.input(3))
        if t is None:
            return Decline("the padded axes are computed at run time")
        axes = [int(a) % rank for a in t.reshape(-1).tolist()]
    if len(pads) != 2 * len(axes):
        return Decline(f"{len(pads)} pads for {len(axes)} axes")
    begins, ends = [0] * rank, [0] * rank
    for i, a in enumerate(axes):
        begins[a], ends[a] = pads[i], pads[len(axes) + i]
    if min(begins + ends) < 0:
        return Decline("negative pads (a crop)")
    if begins[0] or begins[1] or ends[0] or ends[1]:
        return Decline("pads the batch or channel axis")
    return begins[2:], ends[2:]


def _check(m, ctx):
    pad, conv = m.nodes["pad"], m.root
    x = m.values["x"]
    if x.shape is None or len(x.shape) < 3:
        return Decline("an input of unknown rank")
    mode = _mode(pad)
    if mode != "constant":
        return Decline(f"{mode} padding repeats values; a convolution pads with zeros")
    value = _pad_value(pad)
    if isinstance(value, Decline):
        return value
    if value != 0.0:
        return Decline(f"pads with {value}, not with zeros")
    got = _spatial_pads(pad, len(x.shape))
    if isinstance(got, Decline):
        return got
    auto_pad = conv.attrs.get("auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad or "NOTSET")
    if auto_pad not in ("NOTSET", "VALID"):
        return Decline(f"the convolution pads itself (auto_pad={auto_pad})")
    n = len(x.shape) - 2
    own = [0] * (2 * n) if auto_pad == "VALID" else [int(p) for p in (conv.attrs.get("pads") or [0] * (2 * n))]
    if len(own) != 2 * n:
        return Decline(f"the convolution has {len(own)} pads for {n} spatial axes")
    begins, ends = got
    return [own[i] + begins[i] for i in range(n)] + [own[n + i] + ends[i] for i in range(n)]


def _rewrite(m, pads, ctx):
    conv = m.root
    attrs = {k: v for k, v in conv.attrs.items() if k != "auto_pad"}
    attrs["pads"] = pads
    inputs = [m.values["x"]] + list(conv.inputs[1:])
    return ctx.emit(conv.op_type, inputs, attrs, domain=conv.domain)


_PATTERN = Pat(("Conv", f"{FG}::FusedConv"), Pat("Pad", Var("x"), ..., name="pad", single_use=False),
               Var("w"), ..., name="conv")

RULES: list[Rule] = [
    Rule("pad_into_conv", _check, _rewrite, pattern=_PATTERN, priority=140,
         doc="a zero Pad of the spatial axes: the convolution's own zero padding, begin and end apart"),
]
