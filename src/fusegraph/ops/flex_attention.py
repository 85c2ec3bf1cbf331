"""FlexAttention (ai.onnx.preview, 1): attention with user ``score_mod`` / ``prob_mod`` subgraphs.

Scores ``(Q*sqrt(s)) @ (K*sqrt(s))^T`` are computed in the input type, cast to the softmax
precision (float32 for float16 / bfloat16 / float32, float64 for double, unless
``softmax_precision`` says otherwise), passed through ``score_mod``, softmaxed, passed through
``prob_mod`` and multiplied by V in that precision; Y has V's type. GQA repeats each K/V head
over a contiguous group of query heads. Without modifiers and with the softmax in the input
type, the kernel is ``scaled_dot_product_attention``.

The modifier subgraphs are ``ir.Graph`` attributes (the frontend converts them at import);
their kernels are bound once through the op registry and run node by node
(``SubgraphRunner``); a subgraph that reads outer-scope values is unsupported.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..errors import FusegraphError
from ..ir import DType
from .attention import round_scalar, softmax_dtype
from .registry import FusionKind, NodeContext, opdef_for, register


class SubgraphRunner:
    """A graph attribute bound to a callable over torch tensors (one output)."""

    def __init__(self, ctx: NodeContext, graph, what: str):
        from ..ir import Graph
        from .infer import infer_graph

        if not isinstance(graph, Graph):
            raise ctx.unsupported(f"{what} is not a graph")
        if graph.captures:
            raise ctx.unsupported(f"{what} subgraph reads outer-scope values")
        try:
            infer_graph(graph)
            self.steps = [(opdef_for(n).build(NodeContext(n)), n) for n in graph.nodes]
        except FusegraphError as exc:
            raise ctx.unsupported(f"{what} subgraph: {exc}") from None
        if len(graph.outputs) != 1:
            raise ctx.unsupported(f"{what} subgraph must have exactly one output")
        self.graph = graph
        self._consts: dict[torch.device, dict[int, torch.Tensor]] = {}

    def __call__(self, *args: torch.Tensor) -> torch.Tensor:
        device = args[0].device
        consts = self._consts.get(device)
        if consts is None:
            consts = {id(v): v.const.to(device) for v in self.graph.constants.values()}
            self._consts[device] = consts
        env = dict(consts)
        for v, a in zip(self.graph.inputs, args):
            env[id(v)] = a
        for kernel, node in self.steps:
            out = kernel(*[None if v is None else env[id(v)] for v in node.inputs])
            outs = out if isinstance(out, (tuple, list)) else (out,)
            for v, o in zip(node.outputs, outs):
                env[id(v)] = o
        return env[id(self.graph.outputs[0])]


def _flex_infer(ctx: NodeContext):
    q, v = ctx.shape(0), ctx.shape(2)
    dt = ctx.dtype(2) or ctx.dtype(0) or None
    if q is None or v is None or len(q) != 4 or len(v) != 4:
        return [(dt, None)]
    return [(dt, (q[0], q[1], q[2], v[3]))]


@register("FlexAttention", since=1, domain="ai.onnx.preview", infer=_flex_infer,
          fusion=FusionKind.OPAQUE)
def _flex_attention(ctx: NodeContext):
    scale_attr = ctx.attr("scale", None)
    in_dt = ctx.dtype(0)
    if in_dt not in (DType.FLOAT, DType.FLOAT16, DType.DOUBLE, DType.BFLOAT16):
        raise ctx.unsupported(f"input dtype {in_dt.name}")
    sp = softmax_dtype(ctx, ctx.attr("softmax_precision", None))
    if sp is None:
        sp = torch.float64 if in_dt == DType.DOUBLE else torch.float32
    score_mod = ctx.attr("score_mod", None)
    prob_mod = ctx.attr("prob_mod", None)
    score_fn = SubgraphRunner(ctx, score_mod, "score_mod") if score_mod is not None else None
    prob_fn = SubgraphRunner(ctx, prob_mod, "prob_mod") if prob_mod is not None else None
    fused = score_fn is None and prob_fn is None and sp == in_dt.to_torch()

    def kernel(Q, K, V):
        scale = scale_attr if scale_attr is not None else 1.0 / math.sqrt(Q.shape[3])
        gqa = Q.shape[1] != K.shape[1]
        if fused:
            return F.scaled_dot_product_attention(Q, K, V, scale=scale, enable_gqa=gqa)
        if gqa:
            rep = Q.shape[1] // K.shape[1]
            K = K.repeat_interleave(rep, dim=1)
            V = V.repeat_interleave(rep, dim=1)
        s = round_scalar(round_scalar(math.sqrt(round_scalar(scale, torch.float32)), torch.float32),
                         Q.dtype)
        scores = torch.matmul(Q * s, (K * s).transpose(-1, -2)).to(sp)
        if score_fn is not None:
            scores = score_fn(scores).to(sp)
        probs = torch.softmax(scores, dim=-1)
        if prob_fn is not None:
            probs = prob_fn(probs).to(sp)
        return torch.matmul(probs, V.to(sp)).to(V.dtype)

    return kernel
