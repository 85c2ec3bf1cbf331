"""Pass "layout": choose channels-last (``nhwc``) memory for the 4-D activations of conv nets.

Layout here is physical only: every value keeps its logical NCHW shape, and torch kernels
compute the same result whatever the strides, so a layout choice can never change values,
only where the transposing copies ("reorders") happen. What the choice drives:

- ``fusegraph::FusedConv`` (and the int8 ``QConv``) with an ``nhwc`` output runs oneDNN with
  prepacked weights on channels-last data (``ops/fused_cnn.py``); its input is converted
  inside the kernel when it is not channels-last (one reorder);
- a planned output buffer of an ``nhwc`` value is a channels-last view of the arena
  (``runtime/arena.py``), so ``out=`` kernels write channels-last directly;
- the planner never lets an output overwrite an input of another layout in place.

Assignment (one forward sweep): a FusedConv's 4-D output is ``nhwc``; a layout-agnostic op
(elementwise / broadcast ops, pooling, Concat, LRN, fused elementwise chains) whose 4-D activation
inputs are all ``nhwc`` keeps ``nhwc``, so reorders move past them to where a
layout-sensitive op (Reshape, Flatten, Gemm, LRN, Transpose, ...) reads the value — usually a
smaller, pooled tensor. View ops of an ``nhwc`` value are ``nhwc`` when the shape is
unchanged, else ``strided`` (neither; never written over in place). Everything else stays
``nchw``. Tensors with 1x1 spatial size are the same bytes in both layouts and cost nothing.

The pass then compares the reorder traffic this plan needs with the bytes the convolutions
process; when reorders would cost more than ``min_gain`` of that (or the graph has fewer
than ``min_convs`` 2-D FusedConvs) it leaves the whole graph ``nchw``, except a graph with an
int8 ``QConv``: oneDNN's int8 convolutions have no fast ``nchw`` form, so that one always goes
``nhwc``. Graph outputs and
inputs are never changed: outputs may come back channels-last-strided (values are equal).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import Graph, Node, Value
from ..ops import lookup
from ..ops.registry import FusionKind
from .manager import PassOptions, PassResult

NHWC, NCHW, STRIDED = "nhwc", "nchw", "strided"
AGNOSTIC = frozenset({("", "MaxPool"), ("", "AveragePool"), ("", "Concat"), ("", "Identity"), ("", "LRN"),
                      ("fusegraph", "ElementwiseChain"), ("fusegraph", "FusedConv"), ("fusegraph", "QConv"),
                      ("fusegraph", "ChannelShuffle"),
                      ("", "QuantizeLinear"), ("", "DequantizeLinear")})   # elementwise, per tensor or per channel
# the convolutions that run channels-last, and the inputs they read in their output's layout
# (the data, and the residual); QConv is the int8 one (``ops/quantized.py``)
CONVS = {("fusegraph", "FusedConv"): (0, 3), ("fusegraph", "QConv"): (0, 4)}
INT8_CONV = ("fusegraph", "QConv")
ANY_INPUT = frozenset({("", "GlobalMaxPool")})  # reads either layout at full speed, exactly


@dataclass(frozen=True)
class LayoutOptions:
    min_convs: int = 2          # fewer 2-D FusedConvs than this: not worth a layout change
    max_reorder_ratio: float = 0.5   # reorder bytes / conv activation bytes above this: stay nchw


def _opdef(node: Node):
    return lookup(node.domain, node.op_type, node.version if node.domain != "fusegraph" else 1)


def _is_act4(v: Value | None) -> bool:
    return (v is not None and not v.is_const and v.shape is not None and len(v.shape) == 4
            and all(isinstance(d, int) for d in v.shape))


def _trivial(v: Value) -> bool:
    """1x1 spatial (or a single channel): both layouts are the same bytes."""
    return v.shape[2] * v.shape[3] == 1 or v.shape[1] == 1


def _bytes(v: Value) -> int:
    n = 1
    for d in v.shape:
        n *= d
    return n * v.dtype.itemsize


def _agnostic(node: Node) -> bool:
    if (node.domain, node.op_type) in AGNOSTIC:
        return len(node.outputs) == 1
    d = _opdef(node)
    return d is not None and d.fusion in (FusionKind.ELEMENTWISE, FusionKind.BROADCAST) and len(node.outputs) == 1


def assign(graph: Graph) -> dict[int, str]:
    """id(value) -> layout for every 4-D activation a node produces."""
    lay: dict[int, str] = {}
    for node in graph.nodes:
        outs = [o for o in node.outputs if _is_act4(o)]
        if not outs:
            continue
        d = _opdef(node)
        ins = [v for v in node.inputs if _is_act4(v) and not _trivial(v)]
        in_lay = [lay.get(id(v), NCHW) for v in ins]
        if (node.domain, node.op_type) in CONVS:
            layout = NHWC
        elif d is not None and d.alias and ins and in_lay[0] != NCHW:
            layout = in_lay[0] if ins[0].shape == outs[0].shape else STRIDED
        elif _agnostic(node) and in_lay and all(x == NHWC for x in in_lay):
            layout = NHWC
        else:
            layout = NCHW
        for o in outs:
            lay[id(o)] = layout if not _trivial(o) else NCHW
    return lay


def reorder_bytes(graph: Graph, lay: dict[int, str]) -> tuple[int, int]:
    """(bytes converted between layouts, bytes read by 2-D FusedConvs) under ``lay``."""
    moved, conv = 0, 0
    for node in graph.nodes:
        fused = (node.domain, node.op_type) in CONVS
        x = node.inputs[0] if node.inputs else None
        if fused and _is_act4(x):
            conv += _bytes(x) + _bytes(node.outputs[0])
        for i, v in enumerate(node.inputs):
            if not _is_act4(v) or _trivial(v):
                continue
            have = lay.get(id(v), NCHW)
            if (node.domain, node.op_type) in ANY_INPUT:
                continue
            if fused and i in CONVS[(node.domain, node.op_type)]:
                want = NHWC
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
        n_conv = sum(1 for n in graph.nodes if (n.domain, n.op_type) in CONVS and n.inputs and _is_act4(n.inputs[0]))
        # oneDNN's int8 convolutions run channels-last only (over nchw it offers its reference
        # one, and the QConv runs its float32 reference form): a graph with one goes nhwc
        n_int8 = sum(1 for n in graph.nodes if (n.domain, n.op_type) == INT8_CONV and n.inputs and _is_act4(n.inputs[0]))
        lay = assign(graph) if n_conv >= self.layout.min_convs or n_int8 else {}
        moved, conv = reorder_bytes(graph, lay) if lay else (0, 0)
        chosen = bool(lay) and (moved <= self.layout.max_reorder_ratio * conv or n_int8 > 0)
        changed = 0
        for node in graph.nodes:
            for o in node.outputs:
                want = lay.get(id(o), NCHW) if chosen else NCHW
                if o.layout != want and (o.shape is not None and len(o.shape) == 4 or o.layout != NCHW):
                    o.layout = want
                    changed += 1
        stats = {"channels_last": chosen, "fused_convs": n_conv, "reorder_bytes": moved, "conv_bytes": conv,
                 "nhwc_values": sum(1 for v in lay.values() if v == NHWC) if chosen else 0}
        return PassResult(changed > 0, stats)
