"""The calibration inputs the int8 tools (``fusegraph compare / bisect --precision int8``) use
when none are given, and the words that say which they used.

``default_calibration(graph, given)``: the given feeds as they are; else, for a model with a
convolution (which static quantisation needs calibration for: ``precision="int8"`` refuses
it without), ``CALIBRATION_INPUTS`` random inputs of the model's input specs (seeds from
``CALIBRATION_SEED``, apart from the accuracy inputs' seeds 0 .. N-1, so that accuracy is not
measured on the calibration data); else no calibration: the MatMul / Gemm products are
quantised dynamically, as ``precision="int8"`` does without calibration inputs. Ranges from
random inputs are not the model's real ranges: the description says so.
"""
from __future__ import annotations

from typing import Any

CALIBRATION_INPUTS = 8
CALIBRATION_SEED = 1000


def default_calibration(graph, given: Any) -> tuple[list[dict] | None, str]:
    """(calibration feeds or None, what they are, in words)."""
    from ..runtime.feeds import random_feeds
    if given is not None:
        feeds = [given] if isinstance(given, dict) else list(given)
        return feeds, f"static, on the {len(feeds)} calibration input(s) given"
    if any(n.op_type == "Conv" for n in graph.nodes):
        feeds = [random_feeds(graph.inputs, CALIBRATION_SEED + i) for i in range(CALIBRATION_INPUTS)]
        return feeds, (f"static, on {CALIBRATION_INPUTS} random inputs of the model's input specs (no calibration "
                       f"inputs given: ranges of random data, not of the model's real inputs; give --calibration DIR)")
    return None, "dynamic: no calibration inputs given, activation scales computed at run time"
