"""CNN kernel choices made for latency (runtime/backends/cpu/: conv.py, pool.py, threading_policy.py):
large FusedConv outputs written into their planned arena buffers unless malloc keeps freed
memory (runtime/backends/cpu/host_memory.py), the
channels-last GlobalAveragePool as one product, and small kernels run on one thread — each
checked numerically against onnxruntime (ORT_DISABLE_ALL) and the unoptimised graph at fp32
rtol 1e-4, and for bitwise-identical repeated runs."""
import numpy as np
import pytest
import torch

from fusegraph.ops import fused_cnn
from fusegraph.ops.registry import NodeContext
from fusegraph.runtime.backends.cpu import conv as cpu_conv
from fusegraph.runtime.backends import resolved
from fusegraph.runtime.backends.cpu.threading_policy import serial, serial_if
from passes_util import F, check, const, model, node, ops


def rnd(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def written_into_arena(compiled, op):
    return [c.out is not None for c in compiled._executor.binding.calls if c.node.op_type == op]


@pytest.mark.parametrize("kept", [False, True])
def test_large_conv_output_goes_into_its_planned_buffer(monkeypatch, kept):
    """With malloc's defaults a large output is written into its arena slot (a fresh allocation
    would fault in new pages every run); when freed memory is kept, oneDNN allocates it."""
    from fusegraph.runtime.backends.cpu.backend import CpuBackend
    monkeypatch.setattr(CpuBackend, "freed_memory_kept", kept)   # what bind tells the builders
    c_in, c, hw, g = 8, 64, 72, 4            # conv output 64 x 72 x 72 floats: 1.3 MB
    assert c * hw * hw * 4 >= cpu_conv.FRESH_OUT_BYTES
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


def graph_kernels(compiled, op):
    """Per call of ``op``: whether the kernel the generated code calls is a oneDNN Graph one."""
    return [getattr(resolved(c.kernel), "onednn_graph", None) is not None
            for c in compiled._executor.binding.calls if c.node.op_type == op]


def conv_stack(src, n, c_in, c, seed=0):
    """``n`` Conv + Relu pairs (3x3, pad 1) from ``src``: enough convolution work for the layout
    pass to choose channels-last. Returns (nodes, initializers, last value)."""
    nodes, inits = [], []
    for i in range(n):
        ci = c_in if i == 0 else c
        nodes += [node("Conv", [src, f"w{seed}_{i}", f"b{seed}_{i}"], f"a{seed}_{i}", pads=[1] * 4),
                  node("Relu", [f"a{seed}_{i}"], f"r{seed}_{i}")]
        inits += [const(f"w{seed}_{i}", rnd(c, ci, 3, 3, seed=seed + i, scale=(2 / (9 * ci)) ** 0.5)),
                  const(f"b{seed}_{i}", rnd(c, seed=seed + 50 + i, scale=0.1))]
        src = f"r{seed}_{i}"
    return nodes, inits, src


K3S2 = dict(kernel_shape=[3, 3], strides=[2, 2])


@pytest.mark.parametrize("max_pool, avg_pool, hw", [
    (K3S2, K3S2, 23),
    (dict(K3S2, ceil_mode=1), dict(K3S2, ceil_mode=1), 23),
    (dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), 23),
    (dict(kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1),
     dict(kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1), 23),
    (dict(K3S2, pads=[1, 1, 1, 1]), dict(K3S2, pads=[1, 1, 1, 1], count_include_pad=1), 23),
    (dict(kernel_shape=[5, 5], strides=[3, 3], pads=[2, 2, 2, 2]),
     dict(kernel_shape=[5, 5], strides=[3, 3], pads=[2, 2, 2, 2]), 23),
    (dict(K3S2, pads=[0, 0, 1, 1]), dict(kernel_shape=[7, 7]), 14),     # inception_v2's pools
], ids=["k3s2", "ceil", "same", "pad-ceil", "include-pad", "k5s3", "end-pad"])
def test_pools_and_convs_as_onednn_graph_partitions(max_pool, avg_pool, hw):
    """Channels-last average pools and the fused convolutions around them (residual add
    included) run as oneDNN Graph partitions (max pools as torch's kernel); every geometry
    matches onnxruntime and the unoptimised graph."""
    from fusegraph.runtime.backends.cpu import onednn_graph
    if not onednn_graph.AVAILABLE:
        pytest.skip("this torch has no oneDNN Graph bridge")
    nodes, inits, src = conv_stack("x", 3, 8, 16)
    nodes += [node("MaxPool", [src], "m", **max_pool), node("Conv", ["m", "w1", "b1"], "c", pads=[1] * 4),
              node("Add", ["c", "m"], "s"), node("Relu", ["s"], "t"), node("AveragePool", ["t"], "p", **avg_pool),
              node("Conv", ["p", "w2"], "y", pads=[1] * 4)]
    inits += [const("w1", rnd(16, 16, 3, 3, seed=2, scale=0.1)), const("b1", rnd(16, seed=3, scale=0.1)),
              const("w2", rnd(16, 16, 3, 3, seed=4, scale=0.1))]
    compiled = check(model(nodes, [("x", F, [1, 8, hw, hw])], ["y"], inits), oracle="ort",
                     script_segments=False)
    assert graph_kernels(compiled, "FusedConv")[:4] == [True] * 4
    # max pooling keeps torch's kernel: oneDNN's turns NaN and -inf windows into -FLT_MAX
    assert graph_kernels(compiled, "MaxPool") == [False] and graph_kernels(compiled, "AveragePool") == [True]


def test_small_convolutions_compile_for_one_thread():
    """A convolution run on one thread (under PARALLEL_MACS) has its partition compiled for one
    thread: running it makes no second copy."""
    from fusegraph.runtime.backends.cpu import onednn_graph
    if not onednn_graph.AVAILABLE or torch.get_num_threads() < 2:
        pytest.skip("needs oneDNN Graph and two threads")
    nodes, inits, src = conv_stack("x", 6, 8, 8)
    compiled = check(model(nodes, [("x", F, [1, 8, 6, 6])], [src], inits), oracle="ort", script_segments=False)
    convs = [c for c in compiled._executor.binding.calls if c.node.op_type == "FusedConv"]
    assert len(convs) == 6
    for call in convs:
        macs = fused_cnn.conv_macs(NodeContext(call.node), call.node.inputs[1].const)
        assert macs < cpu_conv.PARALLEL_MACS
        assert list(resolved(call.kernel).onednn_graph._fns) == [1]
