"""Arguments that would change nothing are refused, never silently ignored (issue 39 #15):
``calibration_inputs`` outside ``precision="auto"``, ``example_inputs`` / ``dynamic_shapes``
with a model that brings its own input shapes."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import fusegraph as fg
from fusegraph.errors import UsageError
from test_knobs import knob_model

FEEDS = [{"x": np.zeros((1, 8, 16, 16), np.float32)}]


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_calibration_inputs_need_the_auto_search(precision):
    with pytest.raises(UsageError, match="calibration_inputs apply to precision='auto'"):
        fg.compile(knob_model(), fg.Config(precision=precision), calibration_inputs=FEEDS)


def test_example_inputs_and_dynamic_shapes_need_a_torch_model():
    with pytest.raises(UsageError, match="example_inputs apply to a torch module"):
        fg.compile(knob_model(), example_inputs=(torch.zeros(1, 8, 16, 16),))
    with pytest.raises(UsageError, match="dynamic_shapes apply to a torch module"):
        fg.compile(knob_model(), dynamic_shapes={"x": {0: "batch"}})


def test_the_arguments_still_apply_where_they_mean_something(monkeypatch):
    from fusegraph.compiler import precision_auto
    monkeypatch.setattr(precision_auto, "bf16_declined", lambda device: None)
    model = fg.compile(knob_model(), fg.Config(precision="auto"), calibration_inputs=FEEDS)
    assert model.report.precision["auto"]["calibration_inputs"] == 1
    lin = torch.nn.Linear(4, 3).eval()
    model = fg.compile(lin, example_inputs=(torch.randn(2, 4),))
    np.testing.assert_allclose(model.run({model.inputs[0].name: np.ones((2, 4), np.float32)})[model.outputs[0].name],
                               lin(torch.ones(2, 4)).detach().numpy(), rtol=1e-5, atol=1e-6)
