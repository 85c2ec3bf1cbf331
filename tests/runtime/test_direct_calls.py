"""Kernels called directly from the generated code (``runtime/direct.py``): the outputs are
the kernels' own (bit for bit the Python path's, and onnxruntime's within rtol 1e-4), the
guards still choose the exact kernels on non-finite feeds, another caller's tensors and
another thread leave the direct calls right, and a failing call names its node.

SqueezeNet with random He-scaled weights and its logits exposed: convolutions, pools and
joins on oneDNN, each writing a planned arena view.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

import fusegraph as fg
from fusegraph.testing import zoo
from fusegraph.errors import KernelError
from fusegraph.runtime.backends.cpu.dnnl import available
from fusegraph.runtime.backends.cpu.guard import Guarded
from fusegraph.runtime.codegen import generate_run_function
from fusegraph.runtime.direct import ThreadEntry
from cpu_isa import needs_bf16
from oracle import assert_outputs_close, ort_run

pytestmark = pytest.mark.skipif(not available(), reason="oneDNN (onednn-cpu-gomp) does not load here")


@pytest.fixture(scope="module")
def squeezenet():
    proto = zoo.expose_logits(zoo.random_light_model("squeezenet"))
    return proto, zoo.random_feeds(proto)


def _compiled(proto, precision: str):
    # a fixed thread count: under ``free_cores`` a busy machine would run the kernels made
    # again for fewer threads, not the ones these tests inspect
    return fg.compile(proto, fg.Config(threads=2, precision=precision, thread_policy="fixed"))


def _entry(cm) -> ThreadEntry:
    (entry,) = [v for v in cm._executor.code.env.values() if isinstance(v, ThreadEntry)]
    return entry


def _python_path(cm) -> None:
    ex = cm._executor
    ex._runner.code = generate_run_function(ex.graph, ex.binding, "<python path>", direct=False)


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)     # NaN where NaN


@pytest.mark.parametrize("precision", ["fp32", pytest.param("bf16", marks=needs_bf16)])
def test_direct_calls_give_the_kernels_own_results(squeezenet, precision):
    proto, feeds = squeezenet
    cm = _compiled(proto, precision)
    entry = _entry(cm)
    assert len(entry.calls) >= 0.7 * len(cm._executor.binding.calls), cm._executor.code.source
    direct = cm.run(feeds)
    if precision == "fp32":
        assert_outputs_close(direct, ort_run(proto, feeds), rtol=1e-4)
    _python_path(cm)
    _same(direct, cm.run(feeds))


def test_guards_still_choose_the_exact_kernels(squeezenet):
    """A NaN pixel, and a feed large enough to overflow inside: the guarded lines run the
    kernels' exact forms, bit for bit as the Python path does. (onnxruntime is no oracle here:
    its Relu maps NaN to 0, where ONNX's keeps it; tests/runtime/test_nan_inf.py checks the
    semantics against the reference evaluator.)"""
    proto, feeds = squeezenet
    cm = _compiled(proto, "fp32")
    guarded = [c.kernel for c in cm._executor.binding.calls if isinstance(c.kernel, Guarded)]
    assert guarded and all(k._exact is None for k in guarded)
    nan = {k: v.copy() for k, v in feeds.items()}
    for v in nan.values():
        v[0, 0, 5, 7] = np.nan
    huge = {k: v * np.float32(3e37) for k, v in feeds.items()}
    got = {"nan": cm.run(nan), "huge": cm.run(huge), "plain": cm.run(feeds)}
    assert all(k._exact is not None for k in guarded)
    assert np.isnan(got["nan"]["softmaxout_1"]).all()       # one NaN pixel reaches every class
    assert not np.isnan(got["plain"]["softmaxout_1"]).any()
    _python_path(cm)
    for case, f in (("nan", nan), ("huge", huge), ("plain", feeds)):
        _same(got[case], cm.run(f))


def test_another_callers_tensors_leave_the_direct_calls_right(squeezenet):
    """A tool calls each kernel through its Python path with tensors of its own (as
    ``benchmarks/profile_nodes.py`` does); the next run's direct calls still use the arena."""
    proto, feeds = squeezenet
    cm = _compiled(proto, "bf16")
    before = cm.run(feeds)
    ex = cm._executor
    planned = {id(o): view for c in ex.binding.calls if c.out is not None for o, view in zip(c.node.outputs, c.out)}
    called = 0
    for call in ex.binding.calls:
        if call.out is None or any(v is not None and not v.is_const and id(v) not in planned for v in call.inputs):
            continue
        args = [None if v is None else torch.zeros_like(ex.binding.dense.get(id(v), v.const) if v.is_const
                                                         else planned[id(v)]) for v in call.inputs]
        call.kernel(*args, out=torch.empty_like(call.out[0]))
        call.kernel(*args)                      # and without out, as a probe does
        called += 1
    assert called >= len(_entry(cm).calls)
    _same(before, cm.run(feeds))


def test_a_run_on_another_thread(squeezenet):
    proto, feeds = squeezenet
    cm = _compiled(proto, "bf16")
    here = cm.run(feeds)
    entry = _entry(cm)
    got, tids = {}, []

    def other():
        got.update(cm.run(feeds))
        tids.append(entry._tid)
    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert tids == [t.ident]                    # the direct calls moved to that thread's resources
    _same(here, got)
    _same(here, cm.run(feeds))
    assert entry._tid == threading.get_ident()


def test_a_failing_direct_call_names_its_node(squeezenet):
    proto, feeds = squeezenet
    cm = _compiled(proto, "fp32")
    entry = _entry(cm)
    i = len(entry.calls) // 2
    node = entry.calls[i]._kernel.prim.what
    entry.execute[i] = lambda *args: 5          # oneDNN's dnnl_runtime_error
    with pytest.raises(KernelError) as err:
        cm.run(feeds)
    message = str(err.value)
    line = next(n for n, text in enumerate(cm._executor.code.source.splitlines(), 1) if f"_df({i}, _s)" in text)
    named = cm._executor.code.line_to_node[line]
    assert repr(named.name) in message and named.op_type in message and "runtime error (5)" in message, (message, node)


@pytest.mark.parametrize("streams", [1, 2])
def test_an_executor_without_direct_calls(squeezenet, tmp_path, streams):
    """``Executor(direct_calls=False)`` (what ``benchmarks/direct_calls.py --load`` binds a stored
    model with): no call of its run functions is direct, and its outputs are bit for bit those
    of the executor with direct calls, on one stream and on two."""
    from fusegraph import artifact
    from fusegraph.runtime.executor import Executor
    proto, feeds = squeezenet
    path = tmp_path / "squeezenet.fgm"
    fg.compile(proto, fg.Config(threads=2, streams=streams)).save(path)
    got = {}
    for direct in (True, False):
        stored = artifact.read(path)
        ex = Executor(stored.graph, stored.graph.name, stored.plan, threads=2, strides=stored.strides,
                      backend_state=stored.backend_state, direct_calls=direct)
        entries = [v for v in ex.code.env.values() if isinstance(v, ThreadEntry)]
        assert (len(entries) >= 1) == direct, ex.code.source
        assert (":= _dx[" in ex.code.source) == direct
        got[direct] = ex.run(feeds)
        ex.close()
    assert_outputs_close(got[True], ort_run(proto, feeds), rtol=1e-4)
    _same(got[True], got[False])
