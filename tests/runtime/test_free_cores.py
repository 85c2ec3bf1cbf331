"""``runtime/free_cores.py`` and ``Config.thread_policy``: a run takes no more threads than the
cores other processes leave free (issue 39 #16).

The sampler is fed a scripted ``/proc/stat``, process CPU time and clock; the executor is
driven with a sampler that says one core is busy: the run goes through a binding made for one
thread (its oneDNN kernels made again at that count, sharing the packed weights and the
arena), gives the outputs of the wide binding, and ``thread_policy="fixed"`` never narrows."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import fusegraph as fg
from fusegraph.errors import ConfigError, RunCancelled
from fusegraph.runtime import free_cores
from fusegraph.runtime.free_cores import CoreSampler
from model_builders import gpt2_kv_cache_onnx
from oracle import assert_outputs_close, ort_run
from test_knobs import knob_model


class Machine:
    """Two CPUs whose busy jiffies (100 per second each) the test sets."""

    def __init__(self):
        self.t, self.own, self.busy, self.total = 0.0, 0.0, [0, 0], [0, 0]

    def advance(self, seconds: float, others_busy: float, own_busy: float) -> None:
        self.t += seconds
        self.own += own_busy * seconds
        busy = (others_busy + own_busy) * 100 * seconds
        for c in (0, 1):
            self.busy[c] += busy / 2
            self.total[c] += 100 * seconds

    def sampler(self) -> CoreSampler:
        return CoreSampler(read_stat=lambda: {c: (int(self.busy[c]), int(self.total[c])) for c in (0, 1)},
                           own_cpu=lambda: self.own, clock=lambda: self.t, cpus=lambda: {0, 1})


def test_a_busy_neighbour_leaves_one_core():
    m = Machine()
    s = m.sampler()
    assert s.free(2) == 2                       # no window yet: every core
    m.advance(1.0, others_busy=1.0, own_busy=0.8)
    assert s.free(2) == 1 and s.others_busy == pytest.approx(1.0, abs=0.02)
    m.advance(1.0, others_busy=0.05, own_busy=2.0)
    assert s.free(2) == 2
    m.advance(0.1, others_busy=1.0, own_busy=1.0)   # inside the window: the last answer stands
    assert s.free(2) == 2
    assert s.free(1) == 1


def test_hysteresis_keeps_the_count_near_the_boundary():
    m = Machine()
    s = m.sampler()
    s.free(2)
    m.advance(1.0, others_busy=0.55, own_busy=1.0)        # free 1.45: one thread when starting afresh
    assert s.free(2) == 1 and s.free(2, current=2) == 2    # but 2 stays 2 this close to 1.5
    m.advance(1.0, others_busy=0.8, own_busy=1.0)
    assert s.free(2, current=2) == 1


def test_no_proc_stat_means_every_core():
    def unreadable():
        raise OSError("no /proc here")
    s = CoreSampler(read_stat=unreadable)
    assert s.free(4) == 4 and not s.available


@pytest.fixture
def one_core_busy(monkeypatch):
    m = Machine()
    sampler = m.sampler()
    sampler.free(2)
    m.advance(1.0, others_busy=1.0, own_busy=1.0)
    monkeypatch.setattr(free_cores, "SAMPLER", sampler)
    return sampler


@pytest.mark.skipif(torch.get_num_threads() < 2 or fg.config.machine_cores() < 2, reason="needs two cores")
@pytest.mark.parametrize("symbolic", [False, True])
def test_a_run_on_a_busy_machine_takes_a_binding_made_for_the_free_cores(one_core_busy, symbolic):
    onnx_model = knob_model("N" if symbolic else 1)
    x = np.random.default_rng(0).standard_normal((1, 8, 16, 16)).astype(np.float32)
    model = fg.compile(onnx_model, fg.Config(threads=2))
    forms = sum(len(v) for v in model._executor.backend.store.forms.values())
    got = model.run({"x": x})
    assert model.threads_used == {1: 1}
    assert symbolic or model._executor._narrow_kernels[1]      # the convolutions' kernels, made again
    assert_outputs_close(got, ort_run(onnx_model, {"x": x}))
    assert sum(len(v) for v in model._executor.backend.store.forms.values()) == forms   # weights held once
    (narrow,) = model._executor._narrow.values()         # it reads the run's stop flag as the wide one does
    assert "_RC.stop" in narrow.code.source
    token = fg.CancelToken()
    token.cancel()
    with pytest.raises(RunCancelled):
        model.run({"x": x}, cancel=token)
    fixed = fg.compile(onnx_model, fg.Config(threads=2, thread_policy="fixed"))
    np.testing.assert_allclose(fixed.run({"x": x})["y"], got["y"], rtol=1e-5, atol=1e-6)
    assert fixed.threads_used == {2: 1}


def test_thread_policy_is_checked():
    with pytest.raises(ConfigError, match="thread_policy"):
        fg.Config(thread_policy="fastest")


@pytest.mark.skipif(torch.get_num_threads() < 2 or fg.config.machine_cores() < 2, reason="needs two cores")
def test_a_kv_session_on_a_busy_machine_decodes_as_on_a_quiet_one(one_core_busy, tmp_path):
    path, _ = gpt2_kv_cache_onnx(tmp_path / "kv.onnx", layers=2, hidden=64, heads=4)
    prompt = np.random.default_rng(0).integers(0, 1000, (1, 5)).astype(np.int64)
    logits = {}
    for policy in ("free_cores", "fixed"):
        model = fg.compile(str(path), fg.Config(threads=2, thread_policy=policy))
        session = model.kv_cache(capacity=4)
        ids, got = prompt, []
        for _ in range(6):
            out = session.run({"input_ids": ids, "attention_mask": np.ones((1, session.length + ids.shape[1]),
                                                                           np.int64)})["logits"]
            got.append(out)
            ids = np.array([[int(out[0, -1].argmax())]], np.int64)
        logits[policy] = got
        assert set(model.threads_used) == ({1} if policy == "free_cores" else {2})
    for a, b in zip(logits["free_cores"], logits["fixed"]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(np.abs(b).max()))
