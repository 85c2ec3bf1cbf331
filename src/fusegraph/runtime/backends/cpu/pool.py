"""The CPU backend's kernels for MaxPool / AveragePool (the ops and their portable kernels are
in ``ops/pool.py``): a 2-D pool of a channels-last float32 CPU input of static shape whose
geometry torch's symmetric padding expresses (or, for max, end-only padding that ceil mode
reproduces) becomes a ``Deferred`` kernel that resolves to its oneDNN Graph partition
(``onednn_graph_cnn.pool_kernel``; max pooling declines there: oneDNN maps an all-NaN window
to -FLT_MAX). Anything else declines to the portable kernel.
"""
from __future__ import annotations

from ....ir import DType
from ....ops.pool import PoolGeometry, native_pool2d
from ..protocol import Decline, Deferred
from . import onednn_graph
from .onednn_graph_cnn import pool_kernel


def pool_kernel_for(ctx, opdef):
    """The CPU kernel of one MaxPool / AveragePool node, or a ``Decline``."""
    kind = "max" if ctx.node.op_type == "MaxPool" else "avg"
    if kind == "max" and ctx.n_outputs > 1:
        return Decline("MaxPool with indices", "onednn")
    x, y = ctx.node.inputs[0], ctx.node.outputs[0]
    if not (onednn_graph.AVAILABLE and x.layout == "nhwc"):
        return Decline("needs an nhwc input and oneDNN Graph", "onednn")
    if x.dtype != DType.FLOAT:
        return Decline(f"a {x.dtype.name} input: torch's own pool (oneDNN Graph's partitions run float32 here)",
                       "onednn")
    geo = PoolGeometry(ctx)
    native = native_pool2d(ctx, geo, kind)
    if native is None:
        return Decline("geometry torch's native 2-D pool does not express", "onednn")
    pad, ceil = native
    include = bool(ctx.attr("count_include_pad", 0)) if kind == "avg" else False
    plain = opdef.build(ctx)

    def build():
        got = pool_kernel(ctx.name, kind, x.shape, y.shape, geo.kernel, geo.strides, pad, geo.dil, ceil, include)
        return plain if isinstance(got, str) else got
    return Deferred(plain, build)
