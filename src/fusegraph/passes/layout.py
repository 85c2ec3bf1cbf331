"""Pass "layout": choose channels-last (``nhwc``) memory for the activations of conv nets: 4-D
images ``[N, C, H, W]`` and the 3-D sequences ``[N, C, L]`` of 1-D convolutions (speech
encoders), both stored with the channels innermost.

Layout here is physical only: every value keeps its logical NCHW shape, and torch kernels
compute the same result whatever the strides, so a layout choice can never change values,
only where the transposing copies ("reorders") happen. What the choice drives:

- ``fusegraph::FusedConv`` (and the int8 ``QConv``) with an ``nhwc`` output runs oneDNN with
  prepacked weights on channels-last data (``ops/fused_cnn.py``); its input is converted
  inside the kernel when it is not channels-last (one reorder);
- a planned output buffer of an ``nhwc`` value is a channels-last view of the arena
  (``runtime/arena.py``), so ``out=`` kernels write channels-last directly;
- the planner never lets an output overwrite an input of another layout in place.

Assignment (one forward sweep): a FusedConv's 3-D / 4-D output is ``nhwc``; a layout-agnostic op
(elementwise / broadcast ops, pooling, Concat, LRN, GELU, fused elementwise chains, channel
layer and group norms, a Resize of the spatial axes only) whose activation
inputs are all ``nhwc`` keeps ``nhwc``, so reorders move past them to where a
layout-sensitive op (Reshape, Flatten, Gemm, LRN, Transpose, ...) reads the value — usually a
smaller, pooled tensor. A Transpose moving the channels of an ``nhwc`` value last (ConvNeXt's
and HuBERT's ``[N, C, H, W] -> [N, H, W, C]`` around a layer norm, a ViT's patches) is a
straight copy, and one moving the last axis of plain data to the channels writes ``nhwc`` (a
straight copy too) where a FusedConv reads the result (through views and agnostic ops) or an
agnostic op joins it with a channels-last value. View ops of an ``nhwc`` value are ``nhwc`` when the shape is unchanged
or only its spatial axes are split or merged, else ``strided`` (neither; never written over in place; a 3-D view of another
shape is not laid out). Everything else stays ``nchw``. Tensors of one pixel are the same bytes
in both layouts and cost nothing, and a pool over the whole image reads either.

The pass then compares the reorder traffic this plan needs with the bytes the convolutions
process; when reorders would cost more than ``min_gain`` of that (or the graph has fewer
than ``min_convs`` 1-D / 2-D FusedConvs) it leaves the whole graph ``nchw``, except a graph with an
int8 ``QConv`` or a depthwise FusedConv (one input channel per group): neither has a fast
``nchw`` form in oneDNN (its int8 convolutions run channels-last only; over ``nchw`` a depthwise
one is its im2col GEMM, one per channel, many times slower than the two reorders its
channels-last form can cost), so such a graph always goes ``nhwc``. Graph outputs and
inputs are never changed: outputs may come back channels-last-strided (values are equal).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import Graph, Node, Value
from ..ops import lookup
from ..ops.registry import view_input
from ..ops.registry import FusionKind
from .manager import PassOptions, PassResult

NHWC, NCHW, STRIDED = "nhwc", "nchw", "strided"
AGNOSTIC = frozenset({("", "MaxPool"), ("", "AveragePool"), ("", "Concat"), ("", "Identity"), ("", "LRN"),
                      ("fusegraph", "ElementwiseChain"), ("fusegraph", "FusedConv"), ("fusegraph", "QConv"),
                      ("fusegraph", "ChannelShuffle"), ("fusegraph", "Gelu"),
                      ("fusegraph", "ChannelLayerNorm"), ("fusegraph", "GroupNorm"),
                      ("", "QuantizeLinear"), ("", "DequantizeLinear")})   # Q / DQ: elementwise, per tensor or per channel
# the convolutions that run channels-last, and the inputs they read in their output's layout
# (the data, and the residual); QConv is the int8 one (``ops/quantized.py``)
CONVS = {("fusegraph", "FusedConv"): (0, 3), ("fusegraph", "QConv"): (0, 4)}
INT8_CONV = ("fusegraph", "QConv")
SPATIAL_RESIZE = frozenset({("", "Resize"), ("", "Upsample")})
ANY_INPUT = frozenset({("", "GlobalMaxPool"), ("", "GlobalAveragePool")})  # read either layout at full speed, exactly


@dataclass(frozen=True)
class LayoutOptions:
    min_convs: int = 2          # fewer 2-D FusedConvs than this: not worth a layout change
    max_reorder_ratio: float = 0.5   # reorder bytes / conv activation bytes above this: stay nchw


def _opdef(node: Node):
    return lookup(node.domain, node.op_type, node.version if node.domain != "fusegraph" else 1)


def _is_act(v: Value | None) -> bool:
    """A 3-D ``[N, C, L]`` or 4-D ``[N, C, H, W]`` activation of static shape."""
    return (v is not None and not v.is_const and v.shape is not None and len(v.shape) in (3, 4)
            and all(isinstance(d, int) for d in v.shape))


def _pixels(v: Value) -> int:
    n = 1
    for d in v.shape[2:]:
        n *= d
    return n


def _trivial(v: Value) -> bool:
    """One pixel (or a single channel): both layouts are the same bytes."""
    return _pixels(v) == 1 or v.shape[1] == 1


def _single_pixel_out(node: Node) -> bool:
    return all(_is_act(o) and _pixels(o) == 1 for o in node.outputs)


def _depthwise(node: Node) -> bool:
    """A FusedConv of more than one group whose groups read one input channel each."""
    w = node.inputs[1] if len(node.inputs) > 1 else None
    return (node.domain, node.op_type) == ("fusegraph", "FusedConv") and int(node.attrs.get("group", 1)) > 1 \
        and w is not None and w.shape is not None and len(w.shape) >= 3 and w.shape[1] == 1


def _bytes(v: Value) -> int:
    n = 1
    for d in v.shape:
        n *= d
    return n * v.dtype.itemsize


def _perm(node: Node, rank: int) -> set[str]:
    """{"to_last"} for a Transpose moving the channel axis last (``[0, 2, .., r-1, 1]``),
    {"from_last"} for its inverse (``[0, r-1, 1, .., r-2]``); for 3-D ``[0, 2, 1]`` is both."""
    if node.domain or node.op_type != "Transpose" or rank not in (3, 4):
        return set()
    perm = [int(p) for p in node.attrs.get("perm") or []]
    got = set()
    if perm == [0, *range(2, rank), 1]:
        got.add("to_last")
    if perm == [0, rank - 1, *range(1, rank - 1)]:
        got.add("from_last")
    return got


def _agnostic(node: Node) -> bool:
    if (node.domain, node.op_type) in AGNOSTIC:
        return len(node.outputs) == 1
    if (node.domain, node.op_type) in SPATIAL_RESIZE:    # batch and channels kept: torch keeps the layout
        x, y = node.inputs[0], node.outputs[0]
        return _is_act(x) and _is_act(y) and tuple(x.shape[:2]) == tuple(y.shape[:2])
    d = _opdef(node)
    return d is not None and d.fusion in (FusionKind.ELEMENTWISE, FusionKind.BROADCAST) and len(node.outputs) == 1


def _feeds_conv(v: Value, depth: int = 4) -> bool:
    """A FusedConv reads ``v``, directly or through views and layout-agnostic ops."""
    for user, i in v.uses:
        if user.domain == "fusegraph" and user.op_type == "FusedConv" and i == 0:
            return True
        if depth and (_agnostic(user) or view_input(user, by_layout=False) == i) and user.outputs and _is_act(user.outputs[0]) \
                and _feeds_conv(user.outputs[0], depth - 1):
            return True
    return False


def _joins_channels_last(v: Value, lay: dict[int, str]) -> bool:
    """A FusedConv reads ``v`` (through views and agnostic ops), or an agnostic op joins it with
    a channels-last value (ConvNeXt's residual Add after its block's transpose back)."""
    return _feeds_conv(v) or any(_agnostic(u) and any(w is not v and lay.get(id(w)) == NHWC for w in u.inputs)
                                 for u, _ in v.uses)


def assign(graph: Graph) -> dict[int, str]:
    """id(value) -> layout for every 3-D / 4-D activation a node produces."""
    lay: dict[int, str] = {}
    for node in graph.nodes:
        outs = [o for o in node.outputs if _is_act(o)]
        if not outs:
            continue
        d = _opdef(node)
        ins = [v for v in node.inputs if _is_act(v) and not _trivial(v)]
        in_lay = [lay.get(id(v), NCHW) for v in ins]
        if (node.domain, node.op_type) in CONVS:
            layout = NHWC
        elif d is not None and d.alias and ins and in_lay[0] != NCHW:
            same = ins[0].shape == outs[0].shape
            if in_lay[0] == NHWC and tuple(ins[0].shape[:2]) == tuple(outs[0].shape[:2]):
                layout = NHWC     # spatial axes split or merged: channels-last stays channels-last
            elif not same and len(outs[0].shape) != 4:
                continue          # a 3-D view of another shape: not laid out (NCHW), as ever
            else:
                layout = in_lay[0] if same else STRIDED
        elif "from_last" in _perm(node, len(outs[0].shape)) and node.inputs[0] is not None \
                and lay.get(id(node.inputs[0]), NCHW) == NCHW and _joins_channels_last(outs[0], lay):
            layout = NHWC         # [N, .., C] -> [N, C, ..] written channels-last: a straight copy
        elif _agnostic(node) and in_lay and all(x == NHWC for x in in_lay):
            layout = NHWC
        else:
            layout = NCHW
        for o in outs:
            lay[id(o)] = layout if not _trivial(o) else NCHW
    return lay


def reorder_bytes(graph: Graph, lay: dict[int, str]) -> tuple[int, int]:
    """(bytes converted between layouts, bytes read by 1-D / 2-D FusedConvs) under ``lay``."""
    moved, conv = 0, 0
    for node in graph.nodes:
        fused = (node.domain, node.op_type) in CONVS
        x = node.inputs[0] if node.inputs else None
        if fused and _is_act(x):
            conv += _bytes(x) + _bytes(node.outputs[0])
        for i, v in enumerate(node.inputs):
            if not _is_act(v) or _trivial(v):
                continue
            have = lay.get(id(v), NCHW)
            if (node.domain, node.op_type) in ANY_INPUT:
                continue
            if fused and i in CONVS[(node.domain, node.op_type)]:
                want = NHWC
            elif i == 0 and "to_last" in _perm(node, len(v.shape)):
                want = have       # channels-last read as [N, .., C]: a straight copy, or a transpose
            elif i == 0 and view_input(node, by_layout=False) == 0 and lay.get(id(node.outputs[0]), NCHW) == have:
                want = have       # a view that keeps the layout (spatial axes split or merged)
            elif (node.domain, node.op_type) in AGNOSTIC and _single_pixel_out(node):
                continue          # a pool over the whole image reads either layout
            elif _agnostic(node) and lay.get(id(node.outputs[0]), NCHW) == NHWC:
                want = NHWC
            else:
                want = NCHW
            if have != want:
                moved += 2 * _bytes(v)
    return moved, conv


class LayoutPass:
    name = "layout"

    def __init__(self, options: PassOptions, layout: LayoutOptions | None = None):
        self.options, self.layout = options, layout or LayoutOptions()

    def run(self, graph: Graph) -> PassResult:
        n_conv = sum(1 for n in graph.nodes if (n.domain, n.op_type) in CONVS and n.inputs and _is_act(n.inputs[0]))
        # oneDNN's int8 convolutions run channels-last only (over nchw it offers its reference
        # one, and the QConv runs its float32 reference form): a graph with one goes nhwc
        n_int8 = sum(1 for n in graph.nodes if (n.domain, n.op_type) == INT8_CONV and n.inputs and _is_act(n.inputs[0]))
        # a depthwise convolution over nchw is oneDNN's GEMM fallback: such a graph goes nhwc too
        n_depthwise = sum(1 for n in graph.nodes if _depthwise(n) and _is_act(n.inputs[0]))
        must = n_int8 + n_depthwise > 0
        lay = assign(graph) if n_conv >= self.layout.min_convs or must else {}
        moved, conv = reorder_bytes(graph, lay) if lay else (0, 0)
        chosen = bool(lay) and (moved <= self.layout.max_reorder_ratio * conv or must)
        changed = 0
        for node in graph.nodes:
            for o in node.outputs:
                want = lay.get(id(o), NCHW) if chosen else NCHW
                if o.layout != want and (o.shape is not None and len(o.shape) in (3, 4) or o.layout != NCHW):
                    o.layout = want
                    changed += 1
        stats = {"channels_last": chosen, "fused_convs": n_conv, "depthwise_convs": n_depthwise,
                 "reorder_bytes": moved, "conv_bytes": conv,
                 "nhwc_values": sum(1 for v in lay.values() if v == NHWC) if chosen else 0}
        return PassResult(changed > 0, stats)
