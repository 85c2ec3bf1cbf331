"""The mixed-precision policy, as data: which ops compute in the reduced type, which follow
their inputs, and which stay in float32, each with a one-line reason.

Classes (``passes/precision.py`` applies them):
- ``REDUCE``: heavy arithmetic that runs in bf16 / fp16 (AMX and AVX512-BF16 / FP16 tiles on
  CPU, tensor cores on CUDA); oneDNN and cuBLAS accumulate in float32 inside, so only the
  inputs and the output are rounded. Their float inputs are cast to the reduced type.
- ``FOLLOW``: data movement and cheap elementwise work, exact or rounded once in any float
  type: runs in the reduced type when every non-constant float input already has it, else
  in float32 (its reduced inputs are cast back), so casts collect at the policy boundaries.
- ``KEEP``: numerically sensitive ops (exponentials, normalisation statistics, reductions,
  accumulations): float32, their reduced inputs cast back.
- ``ANY``: ops that read only a value's shape; no cast either way.
Ops the policy does not name stay in float32 (``KEEP``, the safe default). The model's last
heavy ops, whose outputs reach a graph output through no normalisation (the logits), keep
float32 values unless ``Config.op_precision`` names them: under bf16 a product that can write
float32 itself (``FP32_OUTPUT_PRODUCTS``) reads its operands in bf16 and accumulates and writes
the logits in float32 (OpenVINO's bf16 rounds the logits too; a float32 accumulation of bf16
operands is the product's own arithmetic); any other keeps float32 throughout.
"""
from __future__ import annotations

REDUCE, FOLLOW, KEEP, ANY = "reduce", "follow", "keep", "any"

_MATMUL = "a product: the reduced-type GEMM accumulates in float32 and rounds the result once"
_CONV = "a convolution: the reduced-type kernel accumulates in float32 and rounds the result once"
_MOVE = "data movement: exact in any type"
_ELEMENTWISE = "one elementwise step: rounded once, as in float32 then cast"
_ACTIVATION = "an activation: torch computes it in float32 inside and rounds once"

# (domain, op type) -> (class, why)
POLICY: dict[tuple[str, str], tuple[str, str]] = {
    # heavy arithmetic
    ("fusegraph", "FusedConv"): (REDUCE, _CONV),
    ("", "Conv"): (REDUCE, _CONV),
    ("", "ConvTranspose"): (REDUCE, _CONV),
    ("fusegraph", "LinearAct"): (REDUCE, _MATMUL),
    ("fusegraph", "Linear"): (REDUCE, _MATMUL),
    ("fusegraph", "BatchMatMul"): (REDUCE, _MATMUL),
    ("", "MatMul"): (REDUCE, _MATMUL),
    ("", "Gemm"): (REDUCE, _MATMUL),
    ("fusegraph", "ScaledDotProductAttention"): (
        REDUCE, "attention products in the reduced type; its softmax runs in float32 inside"),
    # data movement
    **{("", op): (FOLLOW, _MOVE) for op in (
        "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Identity", "Concat", "Split",
        "Slice", "Gather", "Expand", "Tile", "Pad", "DepthToSpace", "SpaceToDepth")},
    ("fusegraph", "ChannelShuffle"): (FOLLOW, _MOVE),
    ("", "MaxPool"): (FOLLOW, "a window maximum: exact in any type"),
    ("", "GlobalMaxPool"): (FOLLOW, "a maximum: exact in any type"),
    ("", "AveragePool"): (FOLLOW, "a small window mean: torch accumulates in float32 and rounds once"),
    # elementwise
    **{("", op): (FOLLOW, _ELEMENTWISE) for op in (
        "Add", "Sub", "Mul", "Div", "Neg", "Abs", "Relu", "LeakyRelu", "PRelu", "Clip", "Max", "Min", "Where")},
    **{("", op): (FOLLOW, _ACTIVATION) for op in (
        "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Gelu", "Elu", "Selu", "Softplus", "Mish", "Erf")},
    ("fusegraph", "Gelu"): (FOLLOW, _ACTIVATION),
    ("fusegraph", "ElementwiseChain"): (FOLLOW, "a fused elementwise chain: reads and writes the reduced "
                                                "type, computes every step in float32 with its float32 "
                                                "constants and rounds once (a chain with a KEEP step "
                                                "stays float32)"),
    # shape readers
    ("", "Shape"): (ANY, "reads only the shape"),
    ("", "Size"): (ANY, "reads only the shape"),
    # numerically sensitive
    ("", "Softmax"): (KEEP, "exponentials and a sum: float32"),
    ("", "LogSoftmax"): (KEEP, "exponentials, a sum and a log: float32"),
    ("fusegraph", "MaskedSoftmax"): (KEEP, "exponentials and a sum: float32"),
    ("fusegraph", "LayerNorm"): (KEEP, "normalisation statistics (mean, variance): float32"),
    ("fusegraph", "SkipLayerNorm"): (KEEP, "a residual sum and normalisation statistics: float32"),
    ("", "LayerNormalization"): (KEEP, "normalisation statistics: float32"),
    ("", "BatchNormalization"): (KEEP, "normalisation statistics: float32"),
    ("", "InstanceNormalization"): (KEEP, "normalisation statistics: float32"),
    ("", "GroupNormalization"): (KEEP, "normalisation statistics: float32"),
    ("fusegraph", "GroupNorm"): (KEEP, "normalisation statistics: float32"),
    ("fusegraph", "ChannelLayerNorm"): (KEEP, "normalisation statistics (mean, variance): float32"),
    ("", "LRN"): (KEEP, "a windowed sum of squares and a power: float32"),
    ("", "GlobalAveragePool"): (KEEP, "a reduction over the whole plane: float32"),
    **{("", op): (KEEP, "a reduction: float32") for op in (
        "ReduceMean", "ReduceSum", "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum",
        "ReduceLogSumExp", "ReduceProd", "ReduceMax", "ReduceMin", "CumSum")},
    ("fusegraph", "ScaledReduce"): (KEEP, "a reduction: float32"),
    **{("", op): (KEEP, "exp / log / pow / sqrt: float32") for op in (
        "Exp", "Log", "Pow", "Sqrt", "Reciprocal")},
}

DEFAULT = (KEEP, "not in the policy: float32 (the safe default)")
LOGITS_WHY = "the model's logits (its last heavy op before an output): float32 unless op_precision names it"
LOGITS_OUT_WHY = ("the model's logits (its last heavy op before an output): bf16 operands, accumulated and "
                  "written in float32; op_precision fp32 keeps the operands float32 too")
# products whose kernels write a float32 output from bf16 operands (attribute ``out_dtype``)
FP32_OUTPUT_PRODUCTS = frozenset({("fusegraph", "Linear"), ("fusegraph", "LinearAct"), ("fusegraph", "FusedConv")})


def has_residual(node) -> bool:
    """A FusedConv that adds a residual input: its sum would change type with its output, so
    it writes no float32 output from bf16 operands."""
    return node.op_type == "FusedConv" and len(node.inputs) > 3 and node.inputs[3] is not None
# ops the logits search looks through (graph output backwards to the last heavy ops); a
# normalisation stops it: what follows one is a hidden state, not logits
NORMALISATIONS = frozenset({"LayerNorm", "SkipLayerNorm", "LayerNormalization", "BatchNormalization",
                            "InstanceNormalization", "GroupNormalization", "LRN", "ChannelLayerNorm",
                            "GroupNorm"})
# FOLLOW ops that compute in float32 inside: their constant inputs stay float32 (not rounded)
FLOAT32_CONSTANTS = frozenset({("fusegraph", "ElementwiseChain")})
# REDUCE products -> the input index of their constant bias, kept float32: it is added to the
# float32 accumulator (oneDNN takes a float32 bias beside bf16 / fp16 operands; the ops' own
# kernels round it to the operands' type), and a rounded bias shifts every output of its
# channel the same way, layer after layer (a folded BatchNorm lives there): the probabilities'
# relative L2 error of inception_v1 2.4e-2 -> 1.3e-2, bvlc_alexnet 2.1e-2 -> 8.5e-3
# (OpenVINO's bf16, which keeps biases float32: 1.7e-2 / 1.9e-2)
FLOAT32_BIAS = {("fusegraph", "FusedConv"): 2, ("fusegraph", "LinearAct"): 2, ("fusegraph", "Linear"): 2}
# ElementwiseChain steps that keep the whole chain in float32
CHAIN_KEEP_STEPS = frozenset({"Exp", "Log", "Pow", "Sqrt", "Reciprocal"})


def classify(domain: str, op_type: str, steps=()) -> tuple[str, str]:
    """(class, why) of one op; ``steps``: an ElementwiseChain's steps."""
    cls, why = POLICY.get((domain, op_type), DEFAULT)
    if op_type == "ElementwiseChain" and any(str(s).split(" ")[0] in CHAIN_KEEP_STEPS for s in steps):
        return KEEP, "a fused elementwise chain with an exp / log / pow / sqrt step: float32"
    return cls, why
