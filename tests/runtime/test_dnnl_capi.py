"""The CPU backend without oneDNN (``runtime/backends/cpu/dnnl/capi.py`` cannot load its library),
and with the oneDNN kernels turned off (``Config.cpu_kernels="portable"``).

The library being absent is simulated by putting a cached ``None`` into ``capi._LIB`` (what
``capi.load`` keeps after a failed load) with a reason in ``capi.UNAVAILABLE``, or by replacing
``capi.load`` itself; both are restored afterwards, and each test checks that the real library
is back. Then: the default config runs every node on its portable kernel and still matches
onnxruntime (``ORT_DISABLE_ALL``); ``cpu_kernels="onednn"`` raises ``ConfigError`` naming the
reason; a model compiled and saved with oneDNN (weights held only packed) loads and runs
without it, reading the packed forms back with ``blocked.unpack``.
"""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import numpy as np
import pytest

import fusegraph as fg
from fusegraph.errors import ConfigError
from fusegraph.runtime.backends.cpu.dnnl import available, capi
from fusegraph.runtime.backends.cpu.dnnl.call import DnnlKernel
from cpu_isa import AVX512
from oracle import assert_outputs_close, ort_run

sys.path.insert(0, str(Path(__file__).parents[1] / "passes"))
from passes_util import F, const, model, node  # noqa: E402

REASON = "test: libdnnl.so.3 made unloadable by test_dnnl_capi"


@contextlib.contextmanager
def no_library(how: str):
    """oneDNN unavailable inside: ``how`` "cached" (``_LIB`` holds None) or "load" (``load``
    returns None); the module's state is put back on the way out."""
    saved_lib, saved_why, saved_load = list(capi._LIB), capi.UNAVAILABLE, capi.load
    try:
        if how == "cached":
            capi._LIB[:] = [None]
        else:
            capi.load = lambda: None
        capi.UNAVAILABLE = REASON
        yield
    finally:
        capi._LIB[:] = saved_lib
        capi.UNAVAILABLE = saved_why
        capi.load = saved_load


def _restored(before):
    assert capi.load is not None and capi._LIB == before and capi.UNAVAILABLE != REASON
    assert available() == (before[:1] != [None])


def he(*shape, seed=0):
    return (np.random.default_rng(seed).standard_normal(shape) * np.sqrt(2.0 / np.prod(shape[1:]))).astype(np.float32)


def _net():
    """Every kernel family oneDNN has here: convolutions (grouped, residual, activations), max /
    average / global pools, LRN, a Gemm head with ``transB`` and a MatMul + bias + relu."""
    inits = [const("w1", he(16, 3, 3, 3, seed=1)), const("b1", he(16, 1, seed=2)[:, 0]),
             const("w2", he(16, 8, 3, 3, seed=3)), const("w3", he(16, 16, 1, 1, seed=4)),
             const("wg", he(24, 16, seed=5)), const("bg", he(24, 1, seed=6)[:, 0]),
             const("wm", he(24, 10, seed=7)), const("bm", he(10, 1, seed=8)[:, 0])]
    nodes = [node("Conv", ["x", "w1", "b1"], "a", pads=[1] * 4), node("Relu", ["a"], "ar"),
             node("Conv", ["ar", "w2"], "b", pads=[1] * 4, group=2), node("Add", ["b", "ar"], "r"),
             node("Relu", ["r"], "rr"), node("MaxPool", ["rr"], "p", kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4),
             node("LRN", ["p"], "n", size=3), node("Conv", ["n", "w3"], "c"), node("Sigmoid", ["c"], "cs"),
             node("AveragePool", ["cs"], "q", kernel_shape=[2, 2], strides=[2, 2]),
             node("GlobalAveragePool", ["q"], "g"), node("Flatten", ["g"], "f"),
             node("Gemm", ["f", "wg", "bg"], "h", transB=1), node("MatMul", ["h", "wm"], "mm"),
             node("Add", ["mm", "bm"], "ma"), node("Relu", ["ma"], "y")]
    return model(nodes, [("x", F, [1, 3, 16, 16])], ["y"], inits, opset=17)


FEEDS = {"x": np.random.default_rng(5).standard_normal((1, 3, 16, 16)).astype(np.float32)}


def _unguarded(kernel):
    """A guarded node's fast kernel (``cpu/guard.py``), else the kernel itself."""
    return getattr(kernel, "fast", kernel)


def _all_portable(cm):
    calls = cm._executor.binding.calls
    assert not [c.node.name for c in calls if isinstance(_unguarded(c.kernel), DnnlKernel)]
    assert cm.report.kernels["implementations"] == {"portable": len(calls)}, cm.report.kernels
    assert cm.report.kernels["declined"] == []          # no family was there to try
    assert cm.report.kernels["weights_released_bytes"] == 0


@pytest.mark.skipif(not available(), reason="oneDNN does not load here: the other tests show it")
def test_the_net_uses_onednn_when_it_loads():
    """The premise of the tests below: with the library, these nodes run oneDNN kernels."""
    cm = fg.compile(_net(), fg.Config(threads=2))
    ops = {c.node.op_type for c in cm._executor.binding.calls if isinstance(_unguarded(c.kernel), DnnlKernel)}
    lrn = {"LRN"} if AVX512 else set()        # AVX2: oneDNN's LRN is its reference kernel (declined)
    assert {"FusedConv", "MaxPool", "AveragePool", "GlobalAveragePool"} | lrn <= ops, ops
    assert ops & {"LinearAct", "Linear"}, ops
    assert_outputs_close(cm.run(FEEDS), ort_run(_net(), FEEDS), rtol=1e-4)


@pytest.mark.parametrize("how", ["cached", "load"])
def test_unloadable_library_runs_every_node_portable(how):
    before = list(capi._LIB)
    m = _net()
    with no_library(how):
        assert not available() and REASON in capi.UNAVAILABLE
        cm = fg.compile(m, fg.Config(threads=2))
        _all_portable(cm)
        assert_outputs_close(cm.run(FEEDS), ort_run(m, FEEDS), rtol=1e-4)
    _restored(before)
    assert_outputs_close(cm.run(FEEDS), ort_run(m, FEEDS), rtol=1e-4)    # still portable, still right


@pytest.mark.parametrize("how", ["cached", "load"])
def test_onednn_asked_for_without_library_is_a_config_error(how):
    before = list(capi._LIB)
    with no_library(how):
        with pytest.raises(ConfigError) as err:
            fg.compile(_net(), fg.Config(threads=2, cpu_kernels="onednn"))
    _restored(before)
    msg = str(err.value)
    assert REASON in msg and "cpu_kernels='onednn'" in msg, msg


@pytest.mark.skipif(not available(), reason="needs oneDNN to compile the packed forms")
def test_model_saved_with_onednn_loads_and_runs_without_it(tmp_path):
    """The saved weights are held only packed (oneDNN layouts, the Gemm's ``[N, K]`` weight as
    ``[K, N]``, the grouped weight as ``[g, O/g, I/g, kh, kw]``): without the library the load
    reads them back with ``blocked.unpack`` and runs them on the portable kernels."""
    m = _net()
    cm = fg.compile(m, fg.Config(threads=2))
    assert cm.report.kernels["weights_released_bytes"] > 0
    path = tmp_path / "net.fgm"
    cm.save(path)
    before = list(capi._LIB)
    with no_library("cached"):
        loaded = fg.load(path)
        _all_portable(loaded)
        got = loaded.run(FEEDS)
    _restored(before)
    assert_outputs_close(got, ort_run(m, FEEDS), rtol=1e-4)


@pytest.mark.skipif(not available(), reason="oneDNN does not load here")
def test_portable_config_runs_every_node_portable():
    m = _net()
    cm = fg.compile(m, fg.Config(threads=2, cpu_kernels="portable"))
    _all_portable(cm)
    assert_outputs_close(cm.run(FEEDS), ort_run(m, FEEDS), rtol=1e-4)


def test_unknown_cpu_kernels_is_a_config_error():
    with pytest.raises(ConfigError, match="cpu_kernels"):
        fg.Config(cpu_kernels="mkl")


def _cache_capacity(env: dict) -> int:
    import os
    import subprocess
    code = ("import ctypes; from fusegraph.runtime.backends.cpu.dnnl import capi; lib = capi.load(); "
            "c = ctypes.c_int(); lib.cdll.dnnl_get_primitive_cache_capacity(ctypes.byref(c)); print(c.value)")
    clean = {k: v for k, v in os.environ.items() if k not in capi.CACHE_ENVIRONMENT}
    done = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


@pytest.mark.skipif(not available(), reason="oneDNN is not loadable here")
def test_the_primitive_cache_is_bounded_unless_the_environment_says_otherwise():
    """fusegraph's oneDNN keeps ``PRIMITIVE_CACHE_CAPACITY`` primitives (a model with symbolic
    dims makes one per row count); a capacity set in the environment stands."""
    assert _cache_capacity({}) == capi.PRIMITIVE_CACHE_CAPACITY
    assert _cache_capacity({"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "37"}) == 37
