"""The auto precision search's ranking (``precision_auto.rank``) and the time estimate it
weighs float32 against (``CostModel.product_us``), on hand-built nodes."""
from __future__ import annotations

import math

from fusegraph.ir import DType, Graph
from fusegraph.plan.cost import CostModel, product_flops
from fusegraph.precision_auto import rank


def test_rank_puts_the_highest_squared_error_per_microsecond_first():
    sensitivity = {"big_conv": 4e-3, "small_conv": 4e-3, "quiet": 2e-4, "unmeasured": math.inf}
    time_us = {"big_conv": 1000.0, "small_conv": 10.0, "quiet": 1.0, "unmeasured": 500.0}
    # same error: the cheap node goes back first; 4e-8 per us (quiet) still beats 1.6e-8 (big_conv)
    assert rank(sensitivity, time_us) == ["unmeasured", "small_conv", "quiet", "big_conv"]
    # an unknown time counts as 1 us; ties break by name, so the order is reproducible
    assert rank({"b": 1e-3, "a": 1e-3}, {}) == ["a", "b"]


def _graph():
    g = Graph()
    x = g.add_input("x", DType.FLOAT, (1, 64, 56, 56))
    w = g.new_value("w", DType.FLOAT, (64, 64, 3, 3))
    conv = g.add_node("FusedConv", [x, w], domain="fusegraph", name="conv")
    conv.outputs[0].dtype, conv.outputs[0].shape = DType.FLOAT, (1, 64, 56, 56)
    row = g.add_input("row", DType.FLOAT, (1, 9216))
    fc_w = g.new_value("fc_w", DType.FLOAT, (9216, 4096))
    fc = g.add_node("LinearAct", [row, fc_w], domain="fusegraph", name="fc")
    fc.outputs[0].dtype, fc.outputs[0].shape = DType.FLOAT, (1, 4096)
    return conv, fc


def test_product_time_is_flops_for_a_conv_and_weight_bytes_for_a_one_row_product():
    conv, fc = _graph()
    assert product_flops(conv) == 2.0 * 64 * 56 * 56 * 64 * 9
    assert product_flops(fc) == 2.0 * 4096 * 9216
    cpu = CostModel.for_device("cpu", cores=2)
    assert cpu.product_us(conv) == product_flops(conv) / cpu.flops_per_us
    weight_bytes = 9216 * 4096 * 4
    assert cpu.product_us(fc) >= weight_bytes / cpu.bytes_per_us > product_flops(fc) / cpu.flops_per_us
