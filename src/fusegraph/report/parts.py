"""The shapes of the report's dictionary parts: ``report.kernels`` (made at bind,
``runtime/bind.kernel_summary``) and ``report.precision`` (made by the precision pass,
``passes/precision.precision_summary``, and the ``precision="auto"`` search).

They stay plain dicts (their makers and readers index them by key); these ``TypedDict``s say
which keys they hold and of which types, so that ``CompileReport.from_dict`` reads a stored
one back checked (``typed_json.py``) and every reader can rely on the keys below being there.
A key not listed here is kept as stored.
"""
from __future__ import annotations

from typing import Any, TypedDict

Declined = TypedDict("Declined", {"node": str, "op": str, "family": str, "reason": str})


class _KernelCore(TypedDict):
    backend: str
    implementations: dict[str, int]      # implementation name -> nodes it runs
    declined: list[Declined]             # nodes a kernel family declined, with the reason


class KernelSummary(_KernelCore, total=False):
    weights_released_bytes: int
    weight_reorders: int


PrecisionNode = TypedDict("PrecisionNode", {"node": str, "op": str, "dtype": str, "class": str, "why": str})


class KeptOp(TypedDict):
    node: str
    op: str
    why: str


class AutoKept(TypedDict, total=False):
    node: str
    sensitivity: float
    time_us: float
    why: str | None


class AutoStep(TypedDict, total=False):
    kept: int
    error: float | None


class AutoSearch(TypedDict, total=False):
    """``precision["auto"]``: the accuracy search's budget, errors, the nodes it kept in fp32."""
    budget: float
    calibration_inputs: int
    error: float | None
    bf16_error: float | None
    bf16_time_share: float
    fp32_fallback: float | None
    declined: str | None           # why the search chose fp32 without measuring (no bf16 arithmetic)
    kept_fp32: list[AutoKept]
    steps: list[AutoStep]
    chosen: str                    # "int8" | "bf16" | "fp32": what the search built
    int8: dict[str, Any]           # the int8 search: chosen, why not, errors, kept_fp32, steps


class _PrecisionCore(TypedDict):
    policy: str
    op_precision: dict[str, str]
    nodes: list[PrecisionNode]
    by_dtype: dict[str, int]
    op_precision_unmatched: list[str]
    casts: int
    casts_folded: int
    kept_fp32: list[KeptOp]
    fp32_logits: list[KeptOp]


class Int8Activation(TypedDict, total=False):
    tensor: str
    scale: float
    zero_point: int
    lo: float                      # the calibrated range
    hi: float
    min: float                     # what the tensor held over the calibration inputs
    max: float
    same_as: str | None            # a pass-through op's output: the tensor whose parameters it shares


class Int8Quantisation(TypedDict, total=False):
    """``precision["int8"]`` (``compiler/int8_ptq.py``): how the model was quantised."""
    mode: str                      # "static" (calibrated) | "dynamic" (activation scales at run time)
    calibration: str | None
    percentile: float | None
    calibration_inputs: int
    products_int8: int
    activations: list[Int8Activation]


class PrecisionSummary(_PrecisionCore, total=False):
    auto: AutoSearch
    int8: Int8Quantisation
