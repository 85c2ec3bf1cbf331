"""Pass "qdq_insert" (``precision="int8"`` with calibration inputs): QuantizeLinear /
DequantizeLinear pairs written into a float32 graph in the form onnxruntime's
``quantize_static`` writes (QDQ format, per-channel symmetric int8 weights, per-tensor uint8
activations), so that the pipeline's int8 passes (``quantize_qdq``, ``qdq_propagate``) and
kernels take it from there exactly as they take an onnxruntime-quantised file.

Given the plan (``ptq_plan.py``: which products, which activation tensors) and each observed
tensor's calibrated range (``compiler/calibrate.py``):
- an activation ``v``: ``DQ(Q(v, s, z), s, z)`` read by every consumer of ``v`` (a graph output
  keeps ``v`` itself), with ``activation_qparams``: the range widened to hold 0, ``s = (max -
  min) / 255``, ``z = round(-min / s)``, as onnxruntime's ``compute_scale_zp`` (uint8,
  asymmetric); a pass-through op's output takes its input's ``(s, z)``;
- a quantised product's weight: ``DQ(W_q, s_w, 0, axis)`` per output channel (``axis`` 0 for a
  Conv, 1 for a MatMul, 0 / 1 for a Gemm with / without transB), ``weight_qparams``: ``s_w =
  2 max|W| / 254`` per channel (1 where the channel is all zero), ``W_q = clip(round(W / s_w),
  -127, 127)``;
- its bias (Conv, Gemm): ``DQ(b_q, s_x s_w, 0, axis=0)`` with ``b_q = round(b / (s_x s_w))``
  as int32, as onnxruntime quantises a bias.
Rounding is half to even in float32 throughout, as numpy does in onnxruntime's tool.
"""
from __future__ import annotations

import numpy as np
import torch

from ..errors import PassError
from ..ir import DType, Graph, Node, Value
from .manager import PassResult
from .ptq_plan import ProductPlan, TensorPlan

U8 = (0, 255)
S8_SYMMETRIC = (-127, 127)
_TINY = float(np.finfo(np.float32).tiny)


def activation_qparams(lo: float, hi: float) -> tuple[float, int]:
    """(float32 scale as a Python float, uint8 zero point) of the range ``[lo, hi]``."""
    rmin, rmax = np.float32(min(lo, 0.0)), np.float32(max(hi, 0.0))
    scale = np.float32((rmax - rmin) / np.float32(U8[1] - U8[0]))
    if not np.isfinite(scale) or scale < _TINY:
        return 1.0, 0
    zp = int(np.clip(np.round(np.float32(U8[0]) - rmin / scale), *U8))
    return float(scale), zp


def weight_qparams(w: torch.Tensor, axis: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 weight, float32 scales per channel along ``axis``) of float32 ``w``."""
    w = w.to(torch.float32)
    channels = w.shape[axis]
    absmax = w.movedim(axis, 0).reshape(channels, -1).abs().amax(dim=1)
    scale = (absmax * 2) / torch.tensor(float(S8_SYMMETRIC[1] - S8_SYMMETRIC[0]), dtype=torch.float32)
    scale = torch.where(scale < _TINY, torch.ones_like(scale), scale)
    shape = [1] * w.dim()
    shape[axis] = channels
    q = torch.round(w / scale.reshape(shape)).clamp(*S8_SYMMETRIC).to(torch.int8)
    return q.contiguous(), scale.contiguous()


def bias_qparams(b: torch.Tensor, x_scale: float, w_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int32 bias, float32 scales ``x_scale * w_scale``) of float32 bias ``b``."""
    scale = torch.tensor(x_scale, dtype=torch.float32) * w_scale
    q = torch.round(b.to(torch.float32).reshape(-1) / scale)
    limit = float(2 ** 31 - 1)
    return q.clamp(-limit, limit).to(torch.int32).contiguous(), scale.contiguous()


def typed(node: Node, infer) -> None:
    """Give ``node``'s outputs the dtypes and shapes the op registry infers for them."""
    for out, (dtype, shape) in zip(node.outputs, infer(node) or []):
        if dtype is not None:
            out.dtype = DType(dtype)
        out.shape = shape
    if any(o.dtype == DType.UNDEFINED for o in node.outputs):
        raise PassError(f"{node.name}: the dtype of a new {node.op_type} node could not be inferred")


class InsertQDQ:
    name = "qdq_insert"

    def __init__(self, products: list[ProductPlan], tensors: TensorPlan, ranges: dict[str, tuple[float, float]]):
        self.products = products
        self.tensors = tensors
        self.ranges = ranges
        self.params: dict[str, tuple[float, int]] = {}     # value name -> (scale, zero point)

    def run(self, graph: Graph) -> PassResult:
        from ..ops import infer_node
        self._infer = infer_node
        self._version = max(13, graph.opset.get("", 13))
        values = {v.name: v for v in graph.values()}
        for name in self.tensors.observe:
            lo, hi = self.ranges[name]
            self.params[name] = activation_qparams(lo, hi)
        for name in self.tensors.same_as:
            self.params[name] = self.params[self.tensors.root(name)]
        pairs = 0
        for name in list(self.tensors.observe) + list(self.tensors.same_as):
            self._quantise_activation(graph, values[name], *self.params[name])
            pairs += 1
        weights = 0
        for p in self.products:
            if p.int8:
                self._quantise_product(graph, p)
                weights += 1
        return PassResult(bool(pairs or weights), {"activations": pairs, "weights": weights})

    def _node(self, graph: Graph, op: str, inputs, out: str, anchor: dict, attrs=None) -> Node:
        node = graph.add_node(op, inputs, outputs=[out], attrs=attrs or {}, version=self._version,
                              name=out.removesuffix("_out"), **anchor)
        node.meta["rule"] = self.name
        typed(node, self._infer)
        return node

    def _quantise_activation(self, graph: Graph, v: Value, scale: float, zp: int) -> None:
        uses = [(n, i) for n, i in v.uses]
        s = graph.add_constant(f"{v.name}_scale", torch.tensor(scale, dtype=torch.float32))
        z = graph.add_constant(f"{v.name}_zero_point", torch.tensor(zp, dtype=torch.uint8))
        anchor = {"after": v.producer} if v.producer is not None else {"before": graph.nodes[0]}
        q = self._node(graph, "QuantizeLinear", [v, s, z], f"{v.name}_QuantizeLinear_out", anchor)
        dq = self._node(graph, "DequantizeLinear", [q.outputs[0], s, z], f"{v.name}_DequantizeLinear_out",
                        {"after": q})
        for n, i in uses:
            n.set_input(i, dq.outputs[0])

    def _quantise_product(self, graph: Graph, p: ProductPlan) -> None:
        n = p.node
        w = n.inputs[1]
        wq, ws = weight_qparams(w.const, p.weight_axis)
        channels = ws.numel()
        wq_v = graph.add_constant(f"{w.name}_quantized", wq)
        ws_v = graph.add_constant(f"{w.name}_scale", ws)
        wz_v = graph.add_constant(f"{w.name}_zero_point", torch.zeros(channels, dtype=torch.int8))
        dq = self._node(graph, "DequantizeLinear", [wq_v, ws_v, wz_v], f"{w.name}_DequantizeLinear_out",
                        {"before": n}, {"axis": p.weight_axis})
        n.set_input(1, dq.outputs[0])
        b = n.input(2)
        if b is None or n.op_type == "MatMul":
            return
        x_scale = self._input_scale(n)
        bt = b.const.to(torch.float32)
        if bt.numel() == 1:
            bt = bt.reshape(1).expand(channels)
        if bt.numel() != channels:
            return                       # a bias broadcast another way: left float (quantize_qdq reads it)
        bq, bs = bias_qparams(bt, x_scale, ws)
        bq_v = graph.add_constant(f"{b.name}_quantized", bq)
        bs_v = graph.add_constant(f"{b.name}_scale", bs)
        bz_v = graph.add_constant(f"{b.name}_zero_point", torch.zeros(channels, dtype=torch.int32))
        bdq = self._node(graph, "DequantizeLinear", [bq_v, bs_v, bz_v], f"{b.name}_DequantizeLinear_out",
                         {"before": n}, {"axis": 0})
        n.set_input(2, bdq.outputs[0])

    def _input_scale(self, n: Node) -> float:
        """The activation scale of product ``n``: its input is the DQ this pass wrote."""
        dq = n.inputs[0].producer
        return float(dq.inputs[1].const)

