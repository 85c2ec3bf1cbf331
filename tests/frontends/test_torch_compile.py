"""``torch.compile(backend="fusegraph")``: the Dynamo backend against torch eager (the oracle):
whole models, graph breaks, guards, a recompilation on a new shape, and options -> fg.Config."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from fusegraph.errors import ConfigError
from fusegraph.compiler import torch_dynamo

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_torch_frontend import MODELS, assert_close, build, eager  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _records(since):
    return torch_dynamo.COMPILES[since:]


@pytest.mark.parametrize("name", MODELS)
def test_model_matches_eager(name):
    module, args, _ = build(name)
    since = len(torch_dynamo.COMPILES)
    compiled = torch.compile(module, backend="fusegraph")
    with torch.no_grad():
        assert_close(compiled(*args).numpy(), eager(module, args))
    assert len(_records(since)) == 1          # one FX graph, compiled by fusegraph


def test_recompile_on_new_shape_goes_dynamic_and_says_what_it_reused():
    module, args, _ = build("resnet50")
    since = len(torch_dynamo.COMPILES)
    compiled = torch.compile(module, backend="fusegraph")
    for batch in (1, 2, 3, 5):
        x = torch.randn(batch, 3, 64, 64)
        with torch.no_grad():
            assert_close(compiled(x).numpy(), eager(module, (x,)))
    recs = _records(since)
    assert len(recs) == 2                     # static, then one dynamic model for every later batch
    assert recs[0]["dynamic"] == {} and list(recs[1]["dynamic"].values()) == [[0]]
    assert "recompile 2" in recs[1]["reused"] and "without copying" in recs[1]["reused"]


class Breaks(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 4)
        self.scale = 2.0

    def forward(self, x):
        h = torch.relu(self.a(x))
        torch._dynamo.graph_break()
        if h.sum() > 0:                       # data-dependent branch: another graph break
            h = h * self.scale
        return self.b(h)


def test_graph_breaks_and_guards():
    module = Breaks().eval()
    x = torch.randn(3, 8)
    since = len(torch_dynamo.COMPILES)
    compiled = torch.compile(module, backend="fusegraph")
    with torch.no_grad():
        assert_close(compiled(x).numpy(), eager(module, (x,)))
        assert_close(compiled(-x).numpy(), eager(module, (-x,)))
        assert len(_records(since)) >= 2      # each region between breaks is its own fusegraph model
        module.scale = 3.0                    # a guarded Python attribute: Dynamo recompiles
        assert_close(compiled(x).numpy(), eager(module, (x,)))


def test_options_map_onto_config():
    module = Breaks().eval()
    since = len(torch_dynamo.COMPILES)
    compiled = torch.compile(module.a, backend="fusegraph", options={"level": "O0", "memory": "off"})
    x = torch.randn(2, 8)
    with torch.no_grad():
        assert_close(compiled(x).numpy(), eager(module.a, (x,)))
    assert len(_records(since)) == 1
    with pytest.raises(Exception) as info:
        torch.compile(module.b, backend="fusegraph", options={"levle": "O1"})(x)
    assert isinstance(info.value, ConfigError) or isinstance(info.value.__cause__, ConfigError) \
        or "level" in str(info.value)
