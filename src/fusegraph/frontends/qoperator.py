"""onnxruntime's quantised-operator (QOperator) models: what fusegraph does with their
``com.microsoft`` ops.

onnxruntime's ``quantize_static(..., quant_format=QuantFormat.QOperator)`` writes the
standard ``QLinearConv`` / ``QLinearMatMul`` (which fusegraph runs) beside contrib ops of its
own (``QGemm``, ``QLinearAdd``, ``QLinearConcat``, ``QLinearAveragePool`` ...), whose
semantics only onnxruntime defines. ``check_qoperator`` refuses such a model at import with
one ``UnsupportedOpError`` naming them and saying how to get a model fusegraph reads: the
same quantisation in QDQ format, which fusegraph runs on its int8 kernels. ``standard_form``
imports the contrib ``QuantizeLinear`` / ``DequantizeLinear`` (onnxruntime writes them for
16-bit types or with ``UseQDQContribOps``: the standard ops' semantics) as the standard ops
where the model's default opset has their ``axis`` (13 and later).
"""
from __future__ import annotations

import onnx

from ..errors import UnsupportedOpError

MS = "com.microsoft"
QOPERATOR_OPS = frozenset({
    "QGemm", "QLinearAdd", "QLinearMul", "QLinearConcat", "QLinearAveragePool", "QLinearGlobalAveragePool",
    "QLinearSoftmax", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearReduceMean", "QLinearWhere", "QLinearConv",
    "QAttention", "QEmbedLayerNormalization", "QOrderedMatMul", "DynamicQuantizeMatMul", "MatMulIntegerToFloat",
    "DynamicQuantizeLSTM", "QuantizeWithOrder", "DequantizeWithOrder", "QLinearLayerNormalization",
})
CONTRIB_QDQ = ("QuantizeLinear", "DequantizeLinear")
REQUANTISE = ("re-quantise the float model in QDQ format, which fusegraph runs on its int8 kernels: "
              "onnxruntime.quantization.quantize_static(model, out, reader, quant_format=QuantFormat.QDQ)")


def check_qoperator(nodes, where: str) -> None:
    """Refuse a model using onnxruntime's QOperator contrib ops, naming them."""
    found = sorted({n.op_type for n in nodes if n.domain == MS and n.op_type in QOPERATOR_OPS})
    if found:
        first = next(n for n in nodes if n.domain == MS and n.op_type in QOPERATOR_OPS)
        raise UnsupportedOpError(
            f"{where}: the model is quantised in onnxruntime's QOperator format (com.microsoft::"
            f"{', '.join(found)}), whose ops only onnxruntime defines; {REQUANTISE}",
            node=first.name or (first.output[0] if first.output else None), op_type=first.op_type)


def standard_form(node: onnx.NodeProto, default_opset: int) -> onnx.NodeProto:
    """``node``, or a copy in the standard domain when it is a contrib Q / DQ the standard op
    at ``default_opset`` expresses."""
    if node.domain != MS or node.op_type not in CONTRIB_QDQ or default_opset < 13:
        return node
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    copy.domain = ""
    return copy
