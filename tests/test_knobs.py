"""Every ``fg.Config`` field changes what a compile does, or is refused with a typed error.

``PROBES`` holds, per field, a non-default value and what must differ from the default
compile of the same model (``changed(default, probe)``), or ``REFUSED`` when the value must
raise a ``FusegraphError``. The walk fails for a field that has no entry, so a knob added
later without a test of its effect fails here. The CLI's flags have their own walk in
``tests/test_cli_flags.py``.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from onnx import TensorProto as T, helper as H, numpy_helper

import fusegraph as fg
from fusegraph.runtime import free_cores
from fusegraph.compiler import precision_auto
from fusegraph.errors import FusegraphError
from fusegraph.runtime.backends.cpu import host_memory

REFUSED = "refused"


def knob_model(batch: int | str = 1):
    """Two conv branches (streams, kernels), a duplicated Relu (CSE), a foldable constant
    product (folding), ``c * 0 + c`` (fast math), a ConstantOfShape (broadcast folding);
    ``batch``: the input's and output's dim 0 (a name: symbolic)."""
    rng = np.random.default_rng(0)
    w1, w2 = (numpy_helper.from_array((rng.standard_normal((8, 8, 3, 3)) * 0.3).astype(np.float32), n)
              for n in ("w1", "w2"))
    k = numpy_helper.from_array(np.full((1, 8, 1, 1), 0.5, np.float32), "k")
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    zero = numpy_helper.from_array(np.array(0.0, np.float32), "zero")
    shape = numpy_helper.from_array(np.array([1, 8, 16, 16], np.int64), "shape")
    nodes = [
        H.make_node("Conv", ["x", "w1"], ["a0"], pads=[1, 1, 1, 1], name="conv1"),
        H.make_node("Relu", ["a0"], ["a"], name="relu_a"),
        H.make_node("Relu", ["a0"], ["a2"], name="relu_a_twin"),
        H.make_node("Conv", ["x", "w2"], ["b0"], pads=[1, 1, 1, 1], name="conv2"),
        H.make_node("Sigmoid", ["b0"], ["b"], name="sig_b"),
        H.make_node("Add", ["a", "b"], ["c0"], name="add_ab"),
        H.make_node("Add", ["c0", "a2"], ["c"], name="add_twin"),
        H.make_node("Mul", ["k", "two"], ["k2"], name="fold_me"),
        H.make_node("Mul", ["c", "zero"], ["z"], name="times_zero"),
        H.make_node("Add", ["z", "c"], ["d"], name="plus_c"),
        H.make_node("Mul", ["d", "k2"], ["e"], name="scale"),
        H.make_node("ConstantOfShape", ["shape"], ["ones"], name="ones",
                    value=numpy_helper.from_array(np.array([1.0], np.float32))),
        H.make_node("Add", ["e", "ones"], ["y"], name="plus_ones"),
    ]
    g = H.make_graph(nodes, "knobs", [H.make_tensor_value_info("x", T.FLOAT, [batch, 8, 16, 16])],
                     [H.make_tensor_value_info("y", T.FLOAT, [batch, 8, 16, 16])], [w1, w2, k, two, zero, shape])
    return H.make_model(g, opset_imports=[H.make_opsetid("", 17)])


def two_conv_model():
    """Conv -> Relu -> Conv -> ReduceMean: under bf16 both convolutions read bf16 operands; the
    second is the logits and writes them in fp32 (the policy)."""
    rng = np.random.default_rng(0)
    w1, w2 = (numpy_helper.from_array((rng.standard_normal((8, 8, 3, 3)) * 0.3).astype(np.float32), n)
              for n in ("w1", "w2"))
    nodes = [H.make_node("Conv", ["x", "w1"], ["a0"], pads=[1, 1, 1, 1], name="conv_a"),
             H.make_node("Relu", ["a0"], ["a"], name="relu"),
             H.make_node("Conv", ["a", "w2"], ["b"], pads=[1, 1, 1, 1], name="conv_b"),
             H.make_node("ReduceMean", ["b"], ["y"], axes=[2, 3], keepdims=0, name="mean")]
    g = H.make_graph(nodes, "two_convs", [H.make_tensor_value_info("x", T.FLOAT, [1, 8, 16, 16])],
                     [H.make_tensor_value_info("y", T.FLOAT, [1, 8])], [w1, w2])
    return H.make_model(g, opset_imports=[H.make_opsetid("", 17)])


def fanout_model():
    """``s = x + z`` read by three elementwise consumers (a norm's square, its scale, a Tanh):
    ``aggressive_fusion`` computes the sum inside each of them instead of on its own."""
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    nodes = [H.make_node("Add", ["x", "z"], ["s"], name="sum"), H.make_node("Pow", ["s", "two"], ["sq"], name="sq"),
             H.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1], keepdims=1, name="mean"),
             H.make_node("Mul", ["s", "ms"], ["y"], name="scale"), H.make_node("Tanh", ["s"], ["t"], name="tanh")]
    g = H.make_graph(nodes, "fanout", [H.make_tensor_value_info(n, T.FLOAT, [2, 8, 16]) for n in ("x", "z")],
                     [H.make_tensor_value_info(n, T.FLOAT, [2, 8, 16]) for n in ("y", "t")], [two])
    return H.make_model(g, opset_imports=[H.make_opsetid("", 17)])


def _ops(m):
    return sorted(n.op_type for n in m.graph.nodes)


def _names(m):
    return {n.name for n in m.graph.nodes}


def _slot(m, value):
    return m.plan.slots.get(value)


def _verifies(config):
    """How often Graph.verify runs during a compile with ``config``."""
    from fusegraph.ir.graph import Graph
    calls = []
    real = Graph.verify
    Graph.verify = lambda self, *a, **k: (calls.append(1), real(self, *a, **k))[1]
    try:
        fg.compile(knob_model(), config=config)
    finally:
        Graph.verify = real
    return len(calls)


def _threads_seen(m):
    seen = set()
    m.run({"x": np.ones((1, 8, 16, 16), np.float32)}, hook=lambda i, p, o: seen.add(torch.get_num_threads()))
    return seen


def _lifetime(m, value):
    return next((t.first, t.last) for t in m.report.memory.tensors if t.name == value)


def _reduced(m) -> int:
    """Nodes computing in a reduced type (bf16 / fp16)."""
    rec = m.report.precision
    return 0 if rec is None else sum(1 for r in rec["nodes"] if r["dtype"] != "fp32" and r["class"] == "reduce")


def _one_core_busy() -> free_cores.CoreSampler:
    """A sampler whose last second saw two CPUs busy, one of them by this process."""
    now = {"t": 0.0, "own": 0.0, "busy": 0}
    sampler = free_cores.CoreSampler(read_stat=lambda: {c: (now["busy"], int(now["t"] * 100)) for c in (0, 1)},
                                     own_cpu=lambda: now["own"], clock=lambda: now["t"], cpus=lambda: {0, 1})
    sampler.update()
    now.update(t=1.0, own=1.0, busy=100)
    return sampler


def _kept_freed(config, monkeypatch):
    calls = []
    monkeypatch.setattr(host_memory, "keep_freed_memory", lambda: calls.append(1))
    fg.compile(knob_model(), config=config)
    return bool(calls)


O1 = {"level": "O1"}
# field -> (value, what must differ from the compile without it, or REFUSED[, the fields both share])
PROBES = {
    "level": ("O1", lambda d, p: len(p.graph.nodes) > len(d.graph.nodes)),
    "disabled_passes": (("cse",), lambda d, p: len(p.graph.nodes) > len(d.graph.nodes)),
    "precision": ("bf16", None),       # special-cased below: two_conv_model (knob_model's convs are its logits)
    "streams": (2, lambda d, p: d.plan.streams is None and p.plan.streams is not None
                and p.plan.streams.num_streams == 2),
    "memory": ("off", lambda d, p: p.plan.memory_mode == "off" and d.plan.memory_mode != "off"),
    "device": ("cuda", REFUSED if not torch.cuda.is_available() else
               lambda d, p: next(iter(p.graph.constants.values())).const.is_cuda),
    "threads": (1, lambda d, p: _threads_seen(p) == {1} and _threads_seen(d) == {torch.get_num_threads()}),
    "fold_size_limit": (0, lambda d, p: "fold_me" in _names(p) and "fold_me" not in _names(d)),
    "fold_broadcast_limit": (0, lambda d, p: "ConstantOfShape" in _ops(p) and "ConstantOfShape" not in _ops(d),
                             {"fold_size_limit": 0}),
    "max_arena_bytes": (1024, REFUSED),
    "verify_each": (True, None),      # special-cased below: counts Graph.verify calls
    "fast_math": (True, lambda d, p: len(p.graph.nodes) < len(d.graph.nodes) and not p._executor.backend.exact
                  and d._executor.backend.exact),
    "aggressive_fusion": (True, None),   # special-cased below: fanout_model (knob_model has nothing to recompute)
    # the memory knobs name values: at O1 (no fusion) the model keeps its value names
    "tensor_lifetimes": ((("a0", 0, 8),), lambda d, p: p.plan.arena_bytes > d.plan.arena_bytes, O1),
    "reuse_groups": ((("a0", "b0"),), lambda d, p: _slot(p, "a0")[0] == _slot(p, "b0")[0]
                     and _slot(d, "a0")[0] != _slot(d, "b0")[0], O1),
    "exclusive_tensors": (("a0",), lambda d, p: p.plan.arena_bytes > d.plan.arena_bytes, O1),
    "external_tensors": (("a0",), lambda d, p: _lifetime(p, "a0")[1] > _lifetime(d, "a0")[1], O1),
    "op_precision": ((("Conv", "bf16"),), lambda d, p: _reduced(p) == 2 and _reduced(d) == 0),
    "accuracy_budget": (1e-6, None),   # special-cased below: two_conv_model
    "cuda_graph": (True, REFUSED if not torch.cuda.is_available() else None),
    "keep_freed_memory": (True, None),    # special-cased below: host_memory is touched only then
    "shape_cache": (0, None),            # special-cased below: a model with a symbolic batch
    "dynamic_batch": (True, lambda d, p: p.plan.symbolic and not d.plan.symbolic
                      and p.inputs[0].shape[0] == "batch" and d.inputs[0].shape[0] == 1),
    "shapes": (None, None),              # special-cased below: a model with a symbolic batch
    "thread_policy": ("fixed", None),    # special-cased below: another process keeps a core busy
    "cpu_kernels": ("portable", lambda d, p: set(p.report.kernels["implementations"]) == {"portable"}
                    and set(d.report.kernels["implementations"]) != {"portable"}),
    "max_run_bytes": (1024, None),       # special-cased below: a run-time cap (a ConstantOfShape of a fed shape)
    "max_loop_iterations": (3, None),    # special-cased below: a run-time cap (a Loop of fed trip count)
    "calibration": ("entropy", None),    # special-cased below: int8 ranges on calibration inputs with outliers
    "calibration_percentile": (99.0, None),   # likewise, under calibration="percentile"
}


def _calibration_probe(field, value):
    """precision="int8": the input's calibrated range differs from the default's."""
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.standard_normal((1, 8, 16, 16)).astype(np.float32)} for _ in range(8)]
    feeds[0]["x"][0, 0, 0, :2] = [30.0, -30.0]
    base = {"precision": "int8"} if field == "calibration" else {"precision": "int8", "calibration": "percentile"}

    def hi(config):
        model = fg.compile(knob_model(), config=config, calibration_inputs=feeds)
        return next(a["hi"] for a in model.report.precision["int8"]["activations"] if a["tensor"] == "x")
    assert hi(fg.Config(**base, **{field: value})) < hi(fg.Config(**base))


def _run_cap_probe(field, value):
    """A run the cap refuses (RunLimitExceeded) and the default runs."""
    from fusegraph.errors import RunLimitExceeded
    if field == "max_run_bytes":
        model = H.make_model(H.make_graph(
            [H.make_node("ConstantOfShape", ["s"], ["y"], value=numpy_helper.from_array(np.ones(1, np.float32)))],
            "cos", [H.make_tensor_value_info("s", T.INT64, [2])], [H.make_tensor_value_info("y", T.FLOAT, None)]),
            opset_imports=[H.make_opsetid("", 17)])
        feeds = {"s": np.array([64, 64], np.int64)}       # 16 KiB
    else:
        body = H.make_graph([H.make_node("Identity", ["c"], ["c_out"]), H.make_node("Identity", ["v"], ["v_out"])],
                            "body", [H.make_tensor_value_info("i", T.INT64, []), H.make_tensor_value_info("c", T.BOOL, []),
                                     H.make_tensor_value_info("v", T.FLOAT, [2])],
                            [H.make_tensor_value_info("c_out", T.BOOL, []),
                             H.make_tensor_value_info("v_out", T.FLOAT, [2])])
        model = H.make_model(H.make_graph(
            [H.make_node("Loop", ["n", "", "x"], ["y"], body=body)], "loop",
            [H.make_tensor_value_info("n", T.INT64, []), H.make_tensor_value_info("x", T.FLOAT, [2])],
            [H.make_tensor_value_info("y", T.FLOAT, [2])]), opset_imports=[H.make_opsetid("", 17)])
        feeds = {"n": np.array(10, np.int64), "x": np.ones(2, np.float32)}
    assert fg.compile(model).run(feeds)["y"].size
    with pytest.raises(RunLimitExceeded, match=f"Config.{field}"):
        fg.compile(model, config=fg.Config(**{field: value})).run(feeds)


def test_every_field_has_a_probe():
    assert set(PROBES) == {f.name for f in dataclasses.fields(fg.Config)}


@pytest.mark.parametrize("field", sorted(PROBES))
def test_knob_changes_the_outcome_or_is_refused(field, monkeypatch):
    value, changed, *shared = PROBES[field]
    base = shared[0] if shared else {}
    if field == "verify_each":
        assert _verifies(fg.Config(verify_each=True)) > _verifies(fg.Config()) + 5
        return
    if field == "keep_freed_memory":
        assert not _kept_freed(fg.Config(), monkeypatch) and _kept_freed(fg.Config(keep_freed_memory=True),
                                                                              monkeypatch)
        return
    if field == "precision":
        plain, reduced = (fg.compile(two_conv_model(), config=fg.Config(precision=p)) for p in ("fp32", "bf16"))
        assert _reduced(plain) == 0 and _reduced(reduced) == 2
        assert [k["op"] for k in reduced.report.precision["fp32_logits"]] == ["FusedConv"]
        x = {"x": np.random.default_rng(1).standard_normal((1, 8, 16, 16)).astype(np.float32)}
        np.testing.assert_allclose(reduced.run(x)["y"], plain.run(x)["y"], rtol=2e-2, atol=2e-2)
        return
    if field == "accuracy_budget":   # 1e-6: the search moves both convs to fp32 (1e-2 keeps them bf16)
        # the search as on a CPU with bf16 arithmetic (without, auto gives fp32 before any budget)
        monkeypatch.setattr(precision_auto, "bf16_declined", lambda device: None)
        loose, tight = (fg.compile(two_conv_model(), config=fg.Config(precision="auto", accuracy_budget=b))
                        for b in (1e-2, 1e-6))
        assert _reduced(loose) == 2 and _reduced(tight) == 0
        assert [k["node"] for k in tight.report.precision["auto"]["kept_fp32"]] == ["conv_a", "conv_b"]
        return
    if field == "aggressive_fusion":   # fewer kernels, the same numbers
        default, probe = (fg.compile(fanout_model(), config=fg.Config(aggressive_fusion=a)) for a in (False, True))
        assert probe.report.kernel_count < default.report.kernel_count
        assert "sum" not in _names(probe) and "sum" in _names(default)
        rng = np.random.default_rng(1)
        x = {n: rng.standard_normal((2, 8, 16)).astype(np.float32) for n in ("x", "z")}
        for k, v in default.run(x).items():
            np.testing.assert_allclose(probe.run(x)[k], v, rtol=1e-4, atol=1e-5)
        return
    if field == "shape_cache":      # N > 0: the symbolic-batch model compiles per exact shape instead
        x = {"x": np.random.default_rng(1).standard_normal((3, 8, 16, 16)).astype(np.float32)}
        per_shape, one = (fg.compile(knob_model("N"), config=fg.Config(shape_cache=n)) for n in (8, 0))
        np.testing.assert_allclose(per_shape.run(x)["y"], one.run(x)["y"], rtol=1e-4, atol=1e-5)
        assert one.specializations is None and one.plan.symbolic and len(per_shape.specializations) == 1
        return
    if field == "shapes":           # a declared range refuses a batch outside it
        x = {"x": np.random.default_rng(1).standard_normal((3, 8, 16, 16)).astype(np.float32)}
        open_, capped = (fg.compile(knob_model("N"), config=fg.Config(shapes=s)) for s in ((), {"N": (1, 2)}))
        assert open_.run(x)["y"].shape[0] == 3
        with pytest.raises(FusegraphError, match="outside the declared range 1..2"):
            capped.run(x)
        return
    if field == "thread_policy":    # "fixed": every run at Config.threads, a core busy elsewhere or not
        if fg.config.machine_cores() < 2:
            pytest.skip("needs two cores")
        monkeypatch.setattr(free_cores, "SAMPLER", _one_core_busy())
        x = {"x": np.random.default_rng(1).standard_normal((1, 8, 16, 16)).astype(np.float32)}
        free, fixed = (fg.compile(knob_model(), config=fg.Config(threads=2, thread_policy=p))
                       for p in ("free_cores", "fixed"))
        np.testing.assert_allclose(free.run(x)["y"], fixed.run(x)["y"], rtol=1e-5, atol=1e-6)
        assert free.threads_used == {1: 1} and fixed.threads_used == {2: 1}
        return
    if field in ("max_run_bytes", "max_loop_iterations"):
        _run_cap_probe(field, value)
        return
    if field in ("calibration", "calibration_percentile"):
        _calibration_probe(field, value)
        return
    if changed is None:
        pytest.skip(f"{field}: needs a CUDA device")
    if changed == REFUSED:
        with pytest.raises(FusegraphError):
            fg.compile(knob_model(), config=fg.Config(**{field: value}))
        return
    default = fg.compile(knob_model(), config=fg.Config(**base))
    probe = fg.compile(knob_model(), config=fg.Config(**base, **{field: value}))
    assert changed(default, probe), f"Config.{field}={value!r} changed nothing observable"
    x = {"x": np.random.default_rng(1).standard_normal((1, 8, 16, 16)).astype(np.float32)}
    tol = 2e-2 if field == "op_precision" else 1e-4   # bf16: to its rounding
    np.testing.assert_allclose(probe.run(x)["y"], default.run(x)["y"], rtol=tol, atol=tol / 10)


def test_compile_and_run_leave_the_callers_thread_count_alone():
    before = torch.get_num_threads()
    model = fg.compile(knob_model(), config=fg.Config(threads=1))
    assert torch.get_num_threads() == before
    model.run({"x": np.ones((1, 8, 16, 16), np.float32)})
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("streams", [1, 2])
def test_a_closed_model_refuses_to_run(streams):
    from fusegraph.errors import ModelClosedError
    model = fg.compile(knob_model(), config=fg.Config(streams=streams))
    model.close()
    with pytest.raises(ModelClosedError, match="closed"):
        model.run({"x": np.ones((1, 8, 16, 16), np.float32)})
