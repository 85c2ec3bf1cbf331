"""The auto precision search's ranking (``precision_auto.rank``) and the time estimate it
weighs float32 against (``CostModel.product_us``), on hand-built nodes; what auto gives on a
device without bf16 arithmetic."""
from __future__ import annotations

import math

import numpy as np
import torch
from cpu_isa import BF16_ARITHMETIC

import fusegraph as fg
from fusegraph.compiler import precision_auto
from fusegraph.ir import DType, Graph
from fusegraph.plan.cost import CostModel, product_flops
from fusegraph.compiler.precision_auto import rank


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


# ---------------------------------------------------------------- where bf16 cannot pay

def _two_convs():
    from test_knobs import two_conv_model
    return two_conv_model()


def test_auto_gives_the_fp32_model_where_the_device_has_no_bf16_arithmetic(monkeypatch):
    """A CPU without bf16 arithmetic (AVX2) would run bf16 as float32 over bf16 storage, slower
    than float32: auto gives the float32 model and says why; the user's entries still hold."""
    from fusegraph.cli.common import precision_line
    monkeypatch.setattr(precision_auto, "bf16_declined", lambda device: "no bf16 arithmetic here")
    model = fg.compile(_two_convs(), fg.Config(precision="auto"))
    prec = model.report.precision
    assert prec["policy"] == "auto" and prec["auto"]["declined"] == "no bf16 arithmetic here"
    assert prec["by_dtype"] == {"fp32": len(prec["nodes"])} and prec["casts"] == 0
    assert not any(n.op_type == "Cast" for n in model.graph.nodes)
    assert "auto chose fp32: no bf16 arithmetic here" in precision_line(model.report)
    x = {"x": np.random.default_rng(1).standard_normal((1, 8, 16, 16)).astype(np.float32)}
    assert np.array_equal(model.run(x)["y"], fg.compile(_two_convs()).run(x)["y"])
    asked = fg.compile(_two_convs(), fg.Config(precision="auto", op_precision={"conv_a": "bf16"})).report.precision
    assert {r["node"]: r["dtype"] for r in asked["nodes"] if r["class"] == "reduce"} == {"conv_relu_fusedconv": "bf16"}


def test_auto_searches_where_the_device_has_bf16_arithmetic(monkeypatch):
    monkeypatch.setattr(precision_auto, "bf16_declined", lambda device: None)
    auto = fg.compile(_two_convs(), fg.Config(precision="auto")).report.precision["auto"]
    assert auto["declined"] is None and 0 < auto["bf16_error"] <= auto["budget"]


def test_the_cpu_declines_exactly_where_onednn_has_no_bf16_product():
    why = precision_auto.bf16_declined("cpu")
    assert (why is None) == BF16_ARITHMETIC
    if why is not None:
        assert torch.backends.cpu.get_cpu_capability() in why
