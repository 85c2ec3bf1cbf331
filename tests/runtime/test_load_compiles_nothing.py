"""``fg.load`` on the machine and build that compiled the artifact makes nothing: no TorchScript
graph or oneDNN Graph partition is compiled, no weight is reordered, no probe runs. The
kernels compile at their first call instead (``CpuBackend.compiles_lazily``), and the first
run's outputs are bit for bit the compiled model's. On another build the stored backend state
is not used and the load forms its kernels itself (also checked)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

import fusegraph as fg
from fusegraph import zoo
from fusegraph.runtime.backends.cpu import onednn_graph, prepack
from fusegraph.runtime.backends.cpu.segments import SegmentCall

pytestmark = pytest.mark.skipif(not onednn_graph.AVAILABLE, reason="this torch has no oneDNN Graph bridge")


@pytest.fixture(scope="module", params=["squeezenet", "inception_v1", "densenet121"])
def saved(request, tmp_path_factory):
    model = zoo.randomize_weights(onnx.load(zoo.light_model_path(request.param)), seed=0)
    feeds = zoo.random_feeds(model, seed=1)
    compiled = fg.compile(model, fg.Config(threads=2))
    path = tmp_path_factory.mktemp("fgm") / f"{request.param}.fgm"
    compiled.save(path)
    return compiled, path, feeds


def _counts():
    return onednn_graph.compiles[0], prepack.reorders[0]


def test_load_compiles_and_reorders_nothing(saved, monkeypatch):
    compiled, path, feeds = saved
    probes = []
    from fusegraph.runtime.backends.cpu import segments
    monkeypatch.setattr(segments, "form_segments", lambda *a, **k: probes.append(1) or pytest.fail("probe"))
    before = _counts()
    loaded = fg.load(path)
    assert _counts() == before, "fg.load compiled a graph or reordered a weight"
    assert not probes
    assert loaded.report.segments and len(loaded.report.segments) == len(compiled.report.segments)
    want = compiled.run(feeds)
    got = loaded.run(feeds)                      # the first call compiles, lazily
    assert _counts()[1] == before[1], "a weight was reordered at the first run"
    assert onednn_graph.compiles[0] > before[0] or not any(
        isinstance(c, SegmentCall) for c in loaded._executor.code.lowered.calls)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    np.testing.assert_array_equal(loaded.run(feeds)[next(iter(want))], want[next(iter(want))])


def test_another_build_forms_its_kernels(saved, monkeypatch):
    compiled, path, feeds = saved
    import torch
    monkeypatch.setattr(torch, "__version__", torch.__version__ + ".other")
    before = _counts()
    loaded = fg.load(path)
    assert "not used" in loaded.load_info["backend_state"]
    assert onednn_graph.compiles[0] > before[0]          # segments formed and compiled at load
    want = compiled.run(feeds)
    got = loaded.run(feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5)


def test_a_stored_layout_naming_other_nodes_is_dropped(saved, tmp_path):
    """A re-sealed file whose segment layout names nodes out of order: those segments are
    dropped (the nodes run their own kernels), never run over the wrong values."""
    from fusegraph.artifact import store
    from fusegraph.runtime.backends.cpu.segments_stored import from_layout
    compiled, path, feeds = saved
    stored = store.read(path)
    calls = compiled._executor.binding.calls
    names = [c.node.name for c in calls]
    bad = [[names[1], names[0]], ["no such node", names[0]], [names[0]], "x"]
    segs = from_layout(stored.graph, compiled._executor.binding.calls, compiled._executor.binding, bad)
    assert not segs.made and len(segs.dropped) == len(bad)


def test_a_lazily_compiled_graph_that_differs_from_its_unfused_self_is_not_used(monkeypatch):
    """The first call's check: a fused result that differs from the same IR run unfused keeps the
    unfused graph (what a stored layout naming a run the bridge miscomputes gets)."""
    import torch
    from fusegraph.runtime.backends.cpu.onednn_graph import GraphKernel
    ir = "\n".join(["graph(%x : Tensor):", "  %r : Tensor = aten::relu(%x)", "  return (%r)"])
    kernel = GraphKernel("k", ir, {}, None, partitions=None, lazy=True)
    real = kernel._unfused

    def wrong():
        fn = real()
        return lambda *xs: fn(*xs) + 1.0
    monkeypatch.setattr(kernel, "_unfused", wrong)
    x = torch.randn(4, 8)
    y = kernel(x)
    assert "differs" in kernel.reason and torch.equal(y, torch.relu(x) + 1.0)
