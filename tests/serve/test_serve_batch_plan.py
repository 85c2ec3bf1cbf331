"""How a static-shape model runs a batch: as chunks of its compiled batch sizes, the cheapest
cover by measured time (``ServedModel.plan``), and warm-up at the worker's thread count.
A tiny static MLP (``x[1, 8]``) keeps these fast; the served round trip is test_serve_roundtrip."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from fusegraph.serve.model import ServedModel
from fusegraph.serve.settings import settings_from_mapping


@pytest.fixture()
def served(tmp_path):
    rng = np.random.default_rng(0)
    w1, w2 = rng.standard_normal((8, 16)).astype(np.float32), rng.standard_normal((16, 4)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "w2"], ["y"])],
        "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    path = tmp_path / "mlp.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    model = ServedModel("mlp", path, settings_from_mapping({"max_batch_size": 8, "threads": 1}))
    yield model
    model.close()


def test_plan_by_measured_cost(served):
    assert served.sizes == [1, 2, 4, 8]
    # nothing measured yet: cost = rows, fewest runs on a tie -> exact covers, no padding
    assert [served.plan(r) for r in (1, 3, 5, 7, 8)] == [[1], [2, 1], [4, 1], [4, 2, 1], [8]]
    # a compute-bound CPU: time per row hardly falls with the batch -> never pad
    served._cost.update({1: 0.060, 2: 0.118, 4: 0.230, 8: 0.455})
    assert [served.plan(r) for r in (3, 5, 6, 8)] == [[2, 1], [4, 1], [4, 2], [8]]
    # a bigger batch nearly free (a GPU) -> one padded run
    served._cost.update({1: 0.005, 2: 0.0051, 4: 0.0052, 8: 0.0055})
    assert [served.plan(r) for r in (3, 5, 6)] == [[4], [8], [8]]
    # a size that cannot be compiled is left out
    assert served.plan(5, exclude={8, 4}) == [2, 2, 1]


def test_first_run_only_seeds_the_estimate(served):
    served.timed(4, 1.0, first=True)      # a check run, slow
    assert served._cost[4] == 1.0
    served.timed(4, 0.2)                  # the first real run replaces it
    assert served._cost[4] == 0.2
    served.timed(4, 0.4)                  # then a moving average
    assert served._cost[4] == pytest.approx(0.24)
    served.timed(4, 9.0, first=True)      # a later check run does not move it
    assert served._cost[4] == pytest.approx(0.24)


# fixed costs, so the plan does not follow the run times measured during the test: compute-bound
# (time per row hardly falls with the batch: exact chunks) and a nearly free bigger batch (pad)
SPLIT = {1: 0.060, 2: 0.118, 4: 0.230, 8: 0.455}
PADDED = {1: 0.005, 2: 0.0051, 4: 0.0052, 8: 0.0055}


@pytest.mark.parametrize("costs", [SPLIT, PADDED], ids=["split", "padded"])
def test_chunked_and_padded_runs_return_each_row(served, costs, monkeypatch):
    """Every plan returns exactly the batch's rows, each equal to a run of that row alone
    (fp32 reassociation only: a variant is a compilation of its own)."""
    inst = served.instances[0]
    chunks = []
    run_chunk = inst._run_chunk
    monkeypatch.setattr(inst, "_run_chunk", lambda f, rows, size, *rest: (chunks.append((rows, size)),
                                                                         run_chunk(f, rows, size, *rest))[1])
    x = np.random.default_rng(1).standard_normal((8, 8)).astype(np.float32)
    want = np.concatenate([inst.base.run({"x": x[i:i + 1]})["y"] for i in range(8)])
    for rows in range(1, 9):
        served._cost.clear()
        served._cost.update(costs)
        chunks.clear()
        got = inst.run({"x": x[:rows]}, rows)["y"]
        assert got.shape == (rows, 4)
        np.testing.assert_allclose(got, want[:rows], rtol=1e-5, atol=1e-5)
        assert sum(r for r, _ in chunks) == rows
        if rows == 5:   # (rows, size) per chunk: exact 4 + 1, or 5 rows padded to 8
            assert chunks == ([(4, 4), (1, 1)] if costs is SPLIT else [(5, 8)])


def test_warmup_compiles_at_the_instances_thread_count(served, monkeypatch):
    seen = []
    variant = served.source.variant
    monkeypatch.setattr(served.source, "variant", lambda *a: (seen.append(torch.get_num_threads()), variant(*a))[1])
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        served.instances[0].warmup()
        assert torch.get_num_threads() == 2          # the caller's count is put back
    finally:
        torch.set_num_threads(before)
    assert seen == [served.threads] * 3 and served.threads == 1  # sizes 2, 4, 8 at the worker's 1 thread


def _symbolic_batch_model(tmp_path, w):
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "dyn",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
                              [numpy_helper.from_array(w, "w")])
    path = tmp_path / "dyn.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    return path


def test_a_symbolic_batch_runs_every_batch_as_it_is(tmp_path):
    """A model whose batch is symbolic is one compile for every batch size (``frames.py``):
    the server runs each batch whole, whatever its size, and compiles nothing per size."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 4)).astype(np.float32)
    model = ServedModel("dyn", _symbolic_batch_model(tmp_path, w), settings_from_mapping({"max_batch_size": 8,
                                                                                          "threads": 1}))
    try:
        inst = model.instances[0]
        assert not model.resizes and model.sizes == []
        x = rng.standard_normal((8, 8)).astype(np.float32)
        for rows in (3, 5, 7, 6, 8, 1):
            np.testing.assert_allclose(inst.run({"x": x[:rows]}, rows)["y"], x[:rows] @ w, rtol=1e-5, atol=1e-5)
        assert inst.base.specializations is None and inst.base.plan.symbolic
    finally:
        model.close()


def test_a_symbolic_batch_with_per_shape_compiles_runs_as_chunks_of_the_compiled_sizes(tmp_path):
    """With ``shape_cache`` > 0 a symbolic-batch model compiles itself per batch size
    (``specialize.py``): the server runs its batches as chunks of the sizes 1, 2, 4, 8 (compiled
    at warm-up, as the other dims are static), so arbitrary batch sizes compile nothing more."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 4)).astype(np.float32)
    model = ServedModel("dyn", _symbolic_batch_model(tmp_path, w),
                        settings_from_mapping({"max_batch_size": 8, "threads": 1, "shape_cache": 8}))
    try:
        inst = model.instances[0]
        assert model.resizes and model.sizes == [1, 2, 4, 8]
        inst.warmup()
        compiled = [r["shapes"]["x"][0] for r in inst.base.specializations.compiled]
        assert compiled == [1, 2, 4, 8]
        x = rng.standard_normal((8, 8)).astype(np.float32)
        for rows in (3, 5, 7, 6):
            np.testing.assert_allclose(inst.run({"x": x[:rows]}, rows)["y"], x[:rows] @ w, rtol=1e-5, atol=1e-5)
        assert len(inst.base.specializations.compiled) == 4
    finally:
        model.close()
