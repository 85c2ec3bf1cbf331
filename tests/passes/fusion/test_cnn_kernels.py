"""CNN kernel choices made for latency (ops/fused_cnn.py, ops/pool.py, ops/threading_policy.py):
large FusedConv outputs written into their planned arena buffers unless malloc keeps freed
memory (runtime/host_memory.py), the
channels-last GlobalAveragePool as one product, and small kernels run on one thread — each
checked numerically against onnxruntime (ORT_DISABLE_ALL) and the unoptimised graph at fp32
rtol 1e-4, and for bitwise-identical repeated runs."""
import numpy as np
import pytest
import torch

from fusegraph.ops import fused_cnn
from fusegraph.ops.threading_policy import serial, serial_if
from passes_util import F, check, const, model, node, ops


def rnd(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def written_into_arena(compiled, op):
    return [c.out is not None for c in compiled._executor.binding.calls if c.node.op_type == op]


@pytest.mark.parametrize("kept", [False, True])
def test_large_conv_output_goes_into_its_planned_buffer(monkeypatch, kept):
    """With malloc's defaults a large output is written into its arena slot (a fresh allocation
    would fault in new pages every run); when freed memory is kept, oneDNN allocates it."""
    monkeypatch.setattr(fused_cnn, "freed_memory_kept", lambda: kept)
    c_in, c, hw, g = 8, 64, 72, 4            # conv output 64 x 72 x 72 floats: 1.3 MB
    assert c * hw * hw * 4 >= fused_cnn.FRESH_OUT_BYTES
    nodes = [node("Conv", ["x", "w0", "b0"], "a", pads=[1] * 4), node("Relu", ["a"], "r"),
             node("Reshape", ["r", "s5"], "p"), node("Transpose", ["p"], "t", perm=[0, 2, 1, 3, 4]),
             node("Reshape", ["t", "s4"], "u"), node("Conv", ["u", "w1", "b1"], "y", pads=[1] * 4)]
    inits = [const("w0", rnd(c, c_in, 3, 3, scale=0.3)), const("b0", rnd(c, seed=1, scale=0.1)),
             const("w1", rnd(8, c, 3, 3, seed=2, scale=0.05)), const("b1", rnd(8, seed=3, scale=0.1)),
             const("s5", [1, g, c // g, hw, hw], np.int64), const("s4", [1, c, hw, hw], np.int64)]
    m = model(nodes, [("x", F, [1, c_in, hw, hw])], ["y"], inits)
    compiled = check(m, oracle="ort")
    assert "ChannelShuffle" in ops(compiled)
    assert written_into_arena(compiled, "FusedConv")[0] is not kept    # the large one
    feeds = {"x": rnd(1, c_in, hw, hw, seed=5)}
    first = compiled.run(feeds)["y"]
    assert all(np.array_equal(first, compiled.run(feeds)["y"]) for _ in range(3))


def test_small_conv_output_is_allocated_by_onednn():
    nodes = [node("Conv", ["x", "w0", "b0"], "a", pads=[1] * 4), node("Conv", ["a", "w1", "b1"], "y", pads=[1] * 4)]
    inits = [const("w0", rnd(8, 8, 3, 3, scale=0.3)), const("b0", rnd(8, seed=1)),
             const("w1", rnd(8, 8, 3, 3, seed=2, scale=0.3)), const("b1", rnd(8, seed=3))]
    compiled = check(model(nodes, [("x", F, [1, 8, 6, 6])], ["y"], inits), oracle="ort")
    assert written_into_arena(compiled, "FusedConv") == [False, False]


def test_channels_last_global_average_pool_keeps_equal_channels_equal():
    c, hw, k = 77, 9, 24                     # 77: a SIMD block's tail of channels
    w_last = np.repeat(rnd(1, k, 3, 3, seed=2, scale=0.1), c, axis=0)   # every output channel the same
    nodes, inits, src = [], [], "x"
    for i, (ci, co) in enumerate([(3, k)] + [(k, k)] * 5):   # enough conv work for channels-last
        nodes += [node("Conv", [src, f"w{i}", f"b{i}"], f"a{i}", pads=[1] * 4), node("Relu", [f"a{i}"], f"r{i}")]
        inits += [const(f"w{i}", rnd(co, ci, 3, 3, seed=i, scale=(2 / (9 * ci)) ** 0.5)),
                  const(f"b{i}", rnd(co, seed=10 + i, scale=0.1))]
        src = f"r{i}"
    nodes += [node("Conv", [src, "wl"], "b", pads=[1] * 4), node("GlobalAveragePool", ["b"], "y")]
    inits.append(const("wl", w_last))
    compiled = check(model(nodes, [("x", F, [1, 3, hw, hw])], ["y"], inits), oracle="ort")
    b = next(n for n in compiled.graph.nodes if n.op_type == "GlobalAveragePool").inputs[0]
    assert b.layout == "nhwc"
    y = compiled.run({"x": rnd(1, 3, hw, hw, seed=7)})["y"].reshape(-1)
    assert np.all(y == y[0]) and np.abs(y).max() > 0


def test_serial_runs_on_one_thread_and_restores_the_count():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen = []

        def kernel(x, out=None):
            seen.append(torch.get_num_threads())
            if x is None:
                raise ValueError("boom")
            return x
        kernel.writes_out = False
        wrapped = serial(kernel)
        assert wrapped.writes_out is False and wrapped(1) == 1
        try:
            wrapped(None)
        except ValueError:
            pass
        assert serial_if(False, kernel, 2) == 2
        assert seen == [1, 1, 2] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
