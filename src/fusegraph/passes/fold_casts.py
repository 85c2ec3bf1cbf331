"""Pass "fold_casts": a Cast to float32 right after a bfloat16 product becomes the product's
own float32 output, and a Cast to bfloat16 right after a float32 layer norm its own bfloat16
output (a cast is a post-op, not a kernel).

The precision pass puts a ``Cast`` to float32 where a reduced value meets a float32 reader
(a LayerNorm's statistics, an LRN, a reduction). When that value is the output of a
``Linear``, ``LinearAct`` or ``FusedConv`` computing in bfloat16 (directly, or through moves that
keep the type: Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Roll; Swin's window reverse
and shift before its residual norm) and the Cast is its only reader, the product writes
float32 instead (attribute ``out_dtype``) and the moves move the float32 values: its
accumulations, float32 already, are no longer rounded to bfloat16 first, and one kernel per
boundary goes. The ops' kernels
honour the attribute (``ops/fused_basic.py``, ``ops/fused_transformer.py``, ``ops/fused_cnn.py``; oneDNN's
``dnnl/linear.py``, ``dnnl/conv.py``).

The precision pass also puts a Cast to bfloat16 between a LayerNorm (float32 statistics) and
the product reading it. When the norm's normalised output (a ``LayerNorm``, a
``ChannelLayerNorm`` before a convolution, or a ``SkipLayerNorm`` that gives its sum as a
second output: the pre-LN residual stream) has the Cast as its only reader, the norm writes
bfloat16 (``out_dtype``): computed in float32 as before and rounded once, the same numbers,
one kernel and one float32 buffer fewer (``ops/fused_transformer.py``,
``ops/fused_norm_cnn.py``, oneDNN's ``dnnl/layernorm.py``).

Declined, with the reason counted in the stats: a product or norm whose output has another
reader or is a graph output, a convolution with a residual input (its sum would change type),
a SkipLayerNorm whose sum shares its output's bytes, a Cast whose output is a graph output (its
name is the model's), a locked value.
"""
from __future__ import annotations

from ..ir import DType, Graph
from .manager import PassResult, is_locked
from .precision_policy import FP32_OUTPUT_PRODUCTS as PRODUCTS
from .precision_policy import has_residual

MOVES = {("", "Reshape"), ("", "Flatten"), ("", "Squeeze"), ("", "Unsqueeze"), ("", "Transpose"),
         ("fusegraph", "Roll")}     # one input, moved as it is in any type
NORMS = {("fusegraph", "LayerNorm"), ("fusegraph", "SkipLayerNorm"), ("fusegraph", "RMSNorm"),
         ("fusegraph", "SkipRMSNorm"), ("fusegraph", "ChannelLayerNorm")}


def _product_path(cast):
    """The values from the product's output to the Cast's input (moves between them included:
    a Reshape, Flatten, Squeeze, Unsqueeze, Transpose or Roll keeps its input's type), or a
    reason string."""
    path = [cast.inputs[0]]
    while path[-1] is not None and path[-1].producer is not None \
            and (path[-1].producer.domain, path[-1].producer.op_type) in MOVES:
        path.append(path[-1].producer.inputs[0])
    src = path[-1]
    node = src.producer if src is not None else None
    if node is None or (node.domain, node.op_type) not in PRODUCTS:
        return "not after a product"
    if src.dtype != DType.BFLOAT16 or node.inputs[0] is None or node.inputs[0].dtype != DType.BFLOAT16:
        return "not a bfloat16 product"
    if any(len(v.uses) != 1 or v.is_graph_output or is_locked(v) for v in path) or is_locked(cast.outputs[0]):
        return "the product's output has other readers, is a graph output or is locked"
    if has_residual(node):
        return "a convolution with a residual"
    if cast.outputs[0].is_graph_output:
        return "the Cast's output is a graph output"
    return path


def _norm_path(cast):
    """``[the layer norm's float32 normalised output]`` the Cast to bfloat16 reads, or a reason."""
    src = cast.inputs[0]
    node = src.producer if src is not None else None
    if node is None or (node.domain, node.op_type) not in NORMS or src is not node.outputs[0]:
        return "not after a layer norm"
    if src.dtype != DType.FLOAT or "out_dtype" in node.attrs:
        return "not a float32 layer norm"
    if len(src.uses) != 1 or src.is_graph_output or is_locked(src) or is_locked(cast.outputs[0]):
        return "the norm's output has other readers, is a graph output or is locked"
    if node.op_type in ("SkipLayerNorm", "SkipRMSNorm") and len(node.outputs) != 2:
        return f"a {node.op_type} that normalises its sum in place"
    if cast.outputs[0].is_graph_output:
        return "the Cast's output is a graph output"
    return [src]


FOLDS = {int(DType.FLOAT): _product_path, int(DType.BFLOAT16): _norm_path}    # the Cast's type -> its fold


class FoldCasts:
    name = "fold_casts"

    def run(self, graph: Graph) -> PassResult:
        folded, declined = 0, {}
        for cast in [n for n in graph.nodes if n.op_type == "Cast" and n.domain == ""]:
            to = int(cast.attrs.get("to", 0))
            if to not in FOLDS:
                continue
            path = FOLDS[to](cast)
            if isinstance(path, str):
                declined[path] = declined.get(path, 0) + 1
                continue
            path[-1].producer.attrs["out_dtype"] = to      # the producer writes the Cast's type
            for v in path:
                v.dtype = DType(to)
            cast.outputs[0].replace_all_uses_with(path[0])
            graph.remove(cast)
            folded += 1
        return PassResult(bool(folded), {"folded": folded, **{f"declined: {k}": v for k, v in declined.items()}})
