"""``fg.load`` on a machine whose oneDNN primitives want the layouts the artifact stored makes
nothing but the primitives themselves: no weight is reordered (the stored packed forms are
used as they are: ``load_info["weight_reorders"] == 0`` and no oneDNN reorder runs), no layout
probe runs (the stored arena strides are used), nothing is compiled by TorchScript or Inductor,
and the first run's outputs are bit for bit the compiled model's. What load does make, one
oneDNN primitive per node of the oneDNN family (JIT code generation, cheap to rebuild), is
counted against the kernels the compiled model bound."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import fusegraph as fg
from fusegraph.testing import zoo
from fusegraph.runtime import bind as bind_module
from fusegraph.runtime.backends.cpu.dnnl import available, primitive, weights
from fusegraph.runtime.backends.cpu.dnnl.call import DnnlKernel

pytestmark = pytest.mark.skipif(not available(), reason="the oneDNN library does not load here")


def _dnnl_kernels(cm) -> list:
    """The oneDNN kernels of ``cm``'s calls (a guarded node's fast kernel, a measuring node's
    own: ``cpu/guard.py``)."""
    kernels = [getattr(c.kernel, "kernel", c.kernel) for c in cm._executor.binding.calls]
    kernels = [getattr(k, "fast", k) for k in kernels]
    return [k for k in kernels if isinstance(k, DnnlKernel)]


@pytest.fixture(scope="module", params=["squeezenet", "inception_v1", "densenet121"])
def saved(request, tmp_path_factory):
    model = zoo.random_light_model(request.param)
    feeds = zoo.random_feeds(model, seed=1)
    compiled = fg.compile(model, fg.Config(threads=2))
    path = tmp_path_factory.mktemp("fgm") / f"{request.param}.fgm"
    compiled.save(path)
    return compiled, path, feeds


def test_load_reorders_probes_and_compiles_nothing(saved, monkeypatch):
    compiled, path, feeds = saved
    reorders, made = [], []
    real_reorder, real_init = weights.reorder, primitive.Primitive.__init__    # weight packing's reorder
    monkeypatch.setattr(weights, "reorder", lambda *a: reorders.append(1) or real_reorder(*a))

    def counted_init(self, pd, what):
        made.append(what)
        real_init(self, pd, what)
    monkeypatch.setattr(primitive.Primitive, "__init__", counted_init)
    monkeypatch.setattr(bind_module, "probe_strides", lambda *a, **k: pytest.fail("the layout probe ran on load"))
    import torch
    monkeypatch.setattr(torch.jit, "script", lambda *a, **k: pytest.fail("TorchScript compiled on load"))
    monkeypatch.setattr(torch, "compile", lambda *a, **k: pytest.fail("torch.compile ran on load"))
    loaded = fg.load(path)
    assert loaded.load_info["weight_reorders"] == 0 and not reorders
    oneDNN = _dnnl_kernels(loaded)
    compiled_dnnl = _dnnl_kernels(compiled)
    assert len(oneDNN) == len(compiled_dnnl) > 0
    declined = [d for d in loaded.report.kernels["declined"] if d["family"] == "dnnl"]
    assert "reorder" not in made            # one primitive per oneDNN kernel (or per node it declined)
    assert len(oneDNN) <= len(made) <= len(oneDNN) + len(declined)
    assert [k.impl for k in oneDNN] == [k.impl for k in compiled_dnnl]
    want = compiled.run(feeds)
    got = loaded.run(feeds)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    loaded.close()


_FRESH_LOAD = """
import sys, numpy as np, fusegraph as fg
m = fg.load(sys.argv[1])
feeds = {v.name: np.ones([int(d) for d in v.shape], dtype=np.int64) for v in m.inputs}
m.run(feeds)
print(sorted(k for k in ("sympy", "torch._dynamo", "torch._inductor") if k in sys.modules))
"""


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_fresh_load_and_run_import_no_compiler(name, transformer_models, tmp_path):
    """A fresh process that loads a transformer and runs it imports neither sympy nor torch's
    compiler stack (``torch.broadcast_shapes`` pulls in sympy: 0.3-0.4 s of a 0.06 s load)."""
    from model_builders import static_shapes
    path = tmp_path / f"{name}.fgm"
    fg.compile(static_shapes(transformer_models[name], 1, 16), fg.Config(threads=2)).save(path)
    out = subprocess.run([sys.executable, "-c", _FRESH_LOAD, str(path)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
