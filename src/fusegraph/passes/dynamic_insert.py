"""Pass "dynamic_insert" (``precision="int8"`` without calibration inputs): each planned
MatMul / Gemm product (``ptq_plan.py``) rewritten into the form onnxruntime's
``quantize_dynamic`` writes, which the pipeline's ``dynamic_quant`` pass turns into one
``QLinearDynamic`` (an int8 product whose activation scale and zero point are computed at run
time, ``ops/quantized_dynamic.py``):

    DynamicQuantizeLinear(x) -> (x_q, x_scale, x_zp)                 (one per activation)
    MatMulInteger(x_q, W_q, x_zp) -> Cast(float) -> Mul(·, Mul(x_scale, s_w)) [-> Add(·, b)]

``W_q`` / ``s_w``: int8 weights symmetric per output column (``qdq_insert.weight_qparams``; a
Gemm with transB has its weight transposed first), ``b`` a Gemm's bias as one value per column.
The arithmetic is onnxruntime's: the integer sum, cast to float32, times the float32 product
of the scales, plus the bias.
"""
from __future__ import annotations

import torch

from ..ir import DType, Graph, Node, Value
from .manager import PassResult
from .ptq_plan import ProductPlan
from .qdq_insert import typed, weight_qparams


class InsertDynamicQuant:
    name = "dynamic_insert"

    def __init__(self, products: list[ProductPlan]):
        self.products = products

    def run(self, graph: Graph) -> PassResult:
        from ..ops import infer_node
        self._infer = infer_node
        self._version = max(11, graph.opset.get("", 11))
        quantised: dict[int, Node] = {}       # id(activation) -> its DynamicQuantizeLinear
        done = 0
        for p in self.products:
            if not p.int8:
                continue
            x = p.node.inputs[0]
            if id(x) not in quantised:
                anchor = {"after": x.producer} if x.producer is not None else {"before": graph.nodes[0]}
                dql = graph.add_node("DynamicQuantizeLinear", [x], version=self._version,
                                     outputs=[f"{x.name}_quantized", f"{x.name}_scale", f"{x.name}_zero_point"],
                                     name=f"{x.name}_DynamicQuantizeLinear", **anchor)
                self._placed(dql)
                quantised[id(x)] = dql
            self._rewrite(graph, p.node, quantised[id(x)])
            done += 1
        return PassResult(bool(done), {"products": done, "activations": len(quantised)})

    def _placed(self, node: Node) -> Node:
        node.meta["rule"] = self.name
        typed(node, self._infer)
        return node

    def _add(self, graph: Graph, op: str, inputs, before: Node, name: str, attrs=None) -> Value:
        node = graph.add_node(op, inputs, attrs=attrs or {}, version=self._version, name=name, before=before)
        node.meta["fused_from"] = [before.name, *before.meta.get("fused_from", ())]   # the report finds the product
        node.meta["fused_types"] = [before.op_type, *before.meta.get("fused_types", ())]
        return self._placed(node).outputs[0]

    def _rewrite(self, graph: Graph, n: Node, dql: Node) -> None:
        w = n.inputs[1].const.to(torch.float32)
        if n.op_type == "Gemm" and int(n.attrs.get("transB", 0)):
            w = w.t()
        wq, ws = weight_qparams(w.contiguous(), 1)
        base = n.name
        wq_v = graph.add_constant(f"{base}_W_quantized", wq)
        ws_v = graph.add_constant(f"{base}_W_scale", ws)
        total = self._add(graph, "MatMulInteger", [dql.outputs[0], wq_v, dql.outputs[2]], n, f"{base}_MatMulInteger")
        cast = self._add(graph, "Cast", [total], n, f"{base}_cast", {"to": int(DType.FLOAT)})
        scales = self._add(graph, "Mul", [dql.outputs[1], ws_v], n, f"{base}_scales")
        y = self._add(graph, "Mul", [cast, scales], n, f"{base}_dequantized")
        b = n.input(2) if n.op_type == "Gemm" else None
        if b is not None:
            bt = b.const.to(torch.float32)
            if bt.numel() in (1, ws.numel()):      # one value per column (the form dynamic_quant folds)
                bt = bt.reshape(-1).expand(ws.numel())
            y = self._add(graph, "Add", [y, graph.add_constant(f"{base}_bias", bt.contiguous())], n, f"{base}_bias")
        out = n.outputs[0]
        y.flags |= out.flags
        out.replace_all_uses_with(y)
        graph.remove(n)
