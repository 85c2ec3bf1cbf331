"""The mixed-precision classes that ops of several families share, each with its one-line
reason, as ``(Precision, why)`` pairs for ``register(..., precision=...)``. An op whose reason
is its own writes it where it registers; ``passes/precision_policy.py`` reads them all from
the registry and says what the classes mean.
"""
from __future__ import annotations

from .registry import Precision

CONVOLUTION = (Precision.REDUCE, "a convolution: the reduced-type kernel accumulates in float32 and rounds the "
                                 "result once")
MATRIX_PRODUCT = (Precision.REDUCE, "a product: the reduced-type GEMM accumulates in float32 and rounds the "
                                    "result once")
ELEMENTWISE = (Precision.FOLLOW, "one elementwise step: rounded once, as in float32 then cast")
ACTIVATION = (Precision.FOLLOW, "an activation: torch computes it in float32 inside and rounds once")
EXPONENTIALS_AND_SUM = (Precision.KEEP, "exponentials and a sum: float32")
REDUCTION = (Precision.KEEP, "a reduction: float32")
NORMALISATION = (Precision.KEEP, "normalisation statistics: float32")
