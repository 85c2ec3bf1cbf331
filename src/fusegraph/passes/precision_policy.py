"""The mixed-precision policy: which ops compute in the reduced type, which follow their
inputs, and which stay in float32, each with a one-line reason, and the rules across ops.

Each op registers its class and reason with the op (``register(..., precision=...)``,
``ops/registry.Precision``); data movement the op registry classes (``Movement``) follows its
inputs (``FOLLOWING_MOVES``); ``classify`` reads both, ``policy()`` lists them. Every decision
carries a ``Reason`` code beside its text, and the passes and tools decide on the code.

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

import enum
from typing import NamedTuple

from ..ops import Movement, Precision, movement_ops, newest, registered_ops

REDUCE, FOLLOW, KEEP, ANY = Precision.REDUCE, Precision.FOLLOW, Precision.KEEP, Precision.ANY

# Data movement follows its inputs' type: every class but CAST (a Cast's output type is its own
# attribute, which the pass does not change: it stays KEEP, the default). The movement classes
# are the registry's (``ops/registry.Movement``).
FOLLOWING_MOVES = tuple(m for m in Movement if m not in (Movement.NONE, Movement.CAST))
MOVE_WHY = "data movement: exact in any type"


class Reason(str, enum.Enum):
    """Why a node got its precision (``code`` beside the human ``why`` in the pass's log and in
    ``report.precision``): decisions read the code, never the text."""
    POLICY = "policy"                        # the op's registered class (its reason is the op's)
    MOVEMENT = "movement"                    # data movement: FOLLOW (``FOLLOWING_MOVES``)
    UNCLASSIFIED = "unclassified"            # no class registered: float32, the safe default
    CHAIN_KEEP_STEP = "chain_keep_step"      # an elementwise chain with a KEEP step: float32
    OWNS_BODY = "owns_body"                  # If / Loop / Scan: float32, body unchanged
    OP_PRECISION = "op_precision"            # a ``Config.op_precision`` entry (the user's, or auto's)
    PRECISION_FP32 = "precision_fp32"        # a REDUCE op under the float32 policy
    LOGITS_FP32 = "logits_fp32"              # the logits: float32 throughout
    LOGITS_FP32_OUTPUT = "logits_fp32_output"   # the logits: bf16 operands, float32 accumulation and output
    AUTO_BUDGET = "auto_budget"              # precision "auto": float32 to stay within the accuracy budget
    AUTO_FALLBACK = "auto_fallback"          # precision "auto": too little left in bf16 to pay for its casts


class Classified(NamedTuple):
    """An op's class under the policy, its reason for people and its code for decisions."""
    cls: Precision
    why: str
    code: Reason


DEFAULT = Classified(KEEP, "not in the policy: float32 (the safe default)", Reason.UNCLASSIFIED)
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
NORMALISATIONS = frozenset({"LayerNorm", "SkipLayerNorm", "RMSNorm", "SkipRMSNorm", "LayerNormalization",
                            "BatchNormalization", "InstanceNormalization", "GroupNormalization", "LRN",
                            "ChannelLayerNorm", "GroupNorm"})
# FOLLOW ops that compute in float32 inside: their constant inputs stay float32 (not rounded)
FLOAT32_CONSTANTS = frozenset({("fusegraph", "ElementwiseChain"), ("fusegraph", "RotaryEmbedding"),
                               ("", "Resize"), ("", "Upsample")})    # their roi / scales: coordinates, not data
# REDUCE products -> the input indices of their constant biases, kept float32: it is added to the
# float32 accumulator (oneDNN takes a float32 bias beside bf16 / fp16 operands; the ops' own
# kernels round it to the operands' type), and a rounded bias shifts every output of its
# channel the same way, layer after layer (a folded BatchNorm lives there): the probabilities'
# relative L2 error of inception_v1 2.4e-2 -> 1.3e-2, bvlc_alexnet 2.1e-2 -> 8.5e-3
# (OpenVINO's bf16, which keeps biases float32: 1.7e-2 / 1.9e-2)
FLOAT32_BIAS = {("fusegraph", "FusedConv"): (2,), ("fusegraph", "LinearAct"): (2,), ("fusegraph", "Linear"): (2,),
                ("fusegraph", "GatedLinear"): (3, 4), ("fusegraph", "LSTM"): (3,), ("", "LSTM"): (3,),
                ("", "GRU"): (3,), ("", "RNN"): (3,)}
CHAIN_KEEP_WHY = "a fused elementwise chain with an exp / log / pow / sqrt step: float32"


def classify(domain: str, op_type: str, steps=()) -> Classified:
    """(class, why, code) of one op, from the registry; ``steps``: an ElementwiseChain's
    steps, which keep the whole chain in float32 when one of them names a KEEP op."""
    if op_type == "ElementwiseChain" and any(_step_keeps(s) for s in steps):
        return Classified(KEEP, CHAIN_KEEP_WHY, Reason.CHAIN_KEEP_STEP)
    opdef = newest(domain, op_type)
    if opdef is not None and opdef.precision is not None:
        return Classified(opdef.precision, opdef.precision_why, Reason.POLICY)
    if (domain, op_type) in movement_ops(*FOLLOWING_MOVES):
        return Classified(FOLLOW, MOVE_WHY, Reason.MOVEMENT)
    return DEFAULT


def _step_keeps(step) -> bool:
    """A chain step naming an op registered as KEEP (exp, log, pow, sqrt, reciprocal)."""
    opdef = newest("", str(step).split(" ")[0])
    return opdef is not None and opdef.precision == KEEP


def policy() -> dict[tuple[str, str], tuple[Precision, str]]:
    """(domain, op type) -> (class, why) of every registered op the policy names (a class of
    its own, or data movement that follows); any other op is ``DEFAULT``."""
    out = {}
    for key in sorted({(domain, op) for domain, op, _ in registered_ops()}):
        c = classify(*key)
        if c.code != Reason.UNCLASSIFIED:
            out[key] = (c.cls, c.why)
    return out
