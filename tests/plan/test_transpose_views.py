"""A Transpose that only renames axes is a view (``ops/shape_ops._same_bytes``, read through
``ops/registry.view_input``): ConvNeXt-V2 reads its channels-last activations as ``[N, H, W, C]``
for its linear layers and transposes back, and with the layout pass's channels-last data each
of those permutations is the input's very bytes. The planner gives such a value no buffer, the
run makes no copy (the output shares the input's memory), and the numbers are onnxruntime's
(``ORT_DISABLE_ALL``, rtol 1e-4). A permutation that moves bytes stays a copy into its own
buffer."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import fusegraph as fg
from fusegraph.ir import DType, Graph
from fusegraph.ops.registry import view_input
from oracle import assert_outputs_close, ort_run

sys.path.insert(0, str(Path(__file__).parents[1] / "passes"))
from passes_util import F, const, model, node  # noqa: E402


def _he(*shape, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * np.sqrt(2.0 / np.prod(shape[1:]))).astype(np.float32)


def _block():
    """conv -> Transpose to [N, H, W, C] -> a softmax over C (what keeps the transposes: a
    Transpose -> MatMul -> Transpose alone becomes a 1x1 convolution) -> MatMul over C (+ bias)
    -> Transpose back -> + conv's output -> conv: the form of ConvNeXt-V2's exported blocks
    (its GRN between the transposes)."""
    nodes = [node("Conv", ["x", "w0", "b0"], "c0", pads=[1, 1, 1, 1]),
             node("Transpose", ["c0"], "t", perm=[0, 2, 3, 1]), node("Softmax", ["t"], "sm", axis=-1),
             node("MatMul", ["sm", "wl"], "m"), node("Add", ["m", "bl"], "ml"),
             node("Transpose", ["ml"], "back", perm=[0, 3, 1, 2]),
             node("Add", ["back", "c0"], "r"), node("Relu", ["r"], "rr"),
             node("Conv", ["rr", "w1"], "y", pads=[1, 1, 1, 1])]
    inits = [const("w0", _he(16, 3, 3, 3, seed=1)), const("b0", np.full(16, 0.1, np.float32)),
             const("wl", _he(16, 16, seed=2).T.copy()), const("bl", np.full(16, -0.05, np.float32)),
             const("w1", _he(8, 16, 3, 3, seed=3))]
    return model(nodes, [("x", F, [1, 3, 10, 10])], ["y"], inits)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_transpose_of_channels_last_data_is_a_view(precision):
    m = _block()
    cm = fg.compile(m, fg.Config(threads=2, precision=precision))
    transposes = [n for n in cm.graph.nodes if n.op_type == "Transpose"]
    assert len(transposes) == 2 and transposes[0].inputs[0].layout == "nhwc", \
        [(n.name, n.inputs[0].layout) for n in transposes]
    kinds = cm.plan.kinds
    assert all(kinds[n.outputs[0].name] == "view" and view_input(n) == 0 for n in transposes), kinds
    assert all(view_input(n, by_layout=False) is None for n in transposes)
    calls = cm._executor.binding.calls
    feeds = {"x": np.random.default_rng(4).standard_normal((1, 3, 10, 10)).astype(np.float32)}
    ptrs = {}

    def hook(i, phase, outs):
        if phase == 1:
            ptrs.update((id(v), t.data_ptr()) for v, t in zip(calls[i].node.outputs, outs))
    got = cm.run(feeds, hook=hook)
    assert all(ptrs[id(n.outputs[0])] == ptrs[id(n.inputs[0])] for n in transposes)    # no copy
    if precision == "fp32":
        assert_outputs_close(got, ort_run(m, feeds), rtol=1e-4)
    else:
        want = ort_run(m, feeds)["y"]
        assert np.linalg.norm(got["y"] - want) / np.linalg.norm(want) < 1e-2


def test_a_transpose_that_moves_bytes_is_a_copy():
    """Row-major data permuted: its own buffer, as before; and the numbers."""
    nodes = [node("Transpose", ["x"], "t", perm=[0, 2, 1]), node("Softmax", ["t"], "s", axis=-1),
             node("MatMul", ["s", "w"], "y")]
    m = model(nodes, [("x", F, [2, 6, 5])], ["y"], [const("w", _he(6, 4, seed=5))])
    cm = fg.compile(m, fg.Config(threads=2))
    (t,) = [n for n in cm.graph.nodes if n.op_type == "Transpose"]
    assert view_input(t) is None and cm.plan.kinds.get(t.outputs[0].name) != "view"
    assert t.outputs[0].name in cm.plan.slots
    feeds = {"x": np.random.default_rng(6).standard_normal((2, 6, 5)).astype(np.float32)}
    assert_outputs_close(cm.run(feeds), ort_run(m, feeds), rtol=1e-4)


@pytest.mark.parametrize("shape,perm,layouts,view", [
    ((1, 8, 4, 4), (0, 2, 3, 1), ("nhwc", "nchw"), True),      # channels-last read as [N, H, W, C]
    ((1, 4, 4, 8), (0, 3, 1, 2), ("nchw", "nhwc"), True),      # and back
    ((1, 8, 4, 4), (0, 2, 3, 1), ("nchw", "nchw"), False),     # row-major data: a real transpose
    ((2, 8, 4, 4), (0, 2, 3, 1), ("nhwc", "nhwc"), False),     # channels-last kept: bytes move
    ((1, 1, 5, 7), (1, 0, 2, 3), ("nchw", "nchw"), True),      # only size-1 axes move
    ((3, 1, 5), (1, 0, 2), ("nchw", "nchw"), True),
    ((3, 2, 5), (1, 0, 2), ("nchw", "nchw"), False),
    ((1, 8, 6), (0, 2, 1), ("nhwc", "nchw"), True),            # a channels-last [N, C, L]
])
def test_which_permutations_keep_the_bytes(shape, perm, layouts, view):
    g = Graph("t")
    x = g.add_input("x", DType.FLOAT, shape)
    n = g.add_node("Transpose", [x], name="tr", outputs=["y"], attrs={"perm": list(perm)})
    n.outputs[0].dtype, n.outputs[0].shape = DType.FLOAT, tuple(shape[p] for p in perm)
    x.layout, n.outputs[0].layout = layouts
    assert (view_input(n) == 0) is view
