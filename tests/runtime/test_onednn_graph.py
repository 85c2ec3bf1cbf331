"""oneDNN Graph kernels (runtime/backends/cpu/onednn_graph.py, onednn_graph_cnn.py, onednn_graph_linear.py):
partitions that compile, declines that say why, one compiled copy per thread count, inputs the
partition was not specialised for, and the global TorchScript switches left as found. Every
result is compared with the same aten ops run eagerly (an independent path: no partition)."""
import pytest
import torch
import torch.nn.functional as F

from fusegraph.runtime.backends.cpu import onednn_graph, onednn_graph_cnn, onednn_graph_linear
from fusegraph.runtime.backends.cpu.onednn_graph import GraphKernel

pytestmark = pytest.mark.skipif(not onednn_graph.AVAILABLE, reason="this torch has no oneDNN Graph bridge")
CL = torch.channels_last
CONV_ADD_RELU = """graph(%x : Tensor, %z : Tensor, %w : Tensor, %b : Tensor):
  %s : int[] = prim::Constant[value=[1, 1]]()
  %g : int = prim::Constant[value=1]()
  %one : int = prim::Constant[value=1]()
  %c : Tensor = aten::conv2d(%x, %w, %b, %s, %s, %s, %g)
  %y : Tensor = aten::add(%c, %z, %one)
  %r : Tensor = aten::relu(%y)
  return (%r)"""


def rnd(*shape, seed=0, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def cl(t):
    return t.contiguous(memory_format=CL)


@pytest.fixture
def conv_add_relu():
    w, b = rnd(16, 8, 3, 3, seed=1, scale=0.2), rnd(16, seed=2)
    k = GraphKernel("t", CONV_ADD_RELU, {"w": w, "b": b},
                    lambda: [cl(torch.zeros(1, 8, 6, 6)), cl(torch.zeros(1, 16, 6, 6))])
    return k, w, b


def test_partition_matches_eager_aten(conv_add_relu):
    k, w, b = conv_add_relu
    assert k.ok and k.reason == ""
    x, z = cl(rnd(1, 8, 6, 6, seed=3)), cl(rnd(1, 16, 6, 6, seed=4))
    with torch.inference_mode():
        got = k(x, z)
    want = torch.relu(F.conv2d(x, w, b, 1, 1) + z)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert got.is_contiguous(memory_format=CL)


def test_other_strides_run_the_unfused_graph(conv_add_relu):
    """An input laid out otherwise than the partition was specialised for still gets the right
    numbers (TorchScript's guard falls back to the plain aten graph)."""
    k, w, b = conv_add_relu
    x, z = rnd(1, 8, 6, 6, seed=5), rnd(1, 16, 6, 6, seed=6)   # NCHW
    with torch.inference_mode():
        got = k(x, z)
    torch.testing.assert_close(got, torch.relu(F.conv2d(x, w, b, 1, 1) + z), rtol=1e-5, atol=1e-5)


def test_one_compiled_copy_per_thread_count(conv_add_relu):
    k, w, b = conv_add_relu
    threads = torch.get_num_threads()
    x, z = cl(rnd(1, 8, 6, 6, seed=7)), cl(rnd(1, 16, 6, 6, seed=8))
    with torch.inference_mode():
        before = k(x, z)
        try:
            torch.set_num_threads(1 if threads > 1 else 2)
            other = k(x, z)
        finally:
            torch.set_num_threads(threads)
    assert sorted(k._fns) == sorted({threads, 1 if threads > 1 else 2})
    torch.testing.assert_close(before, other, rtol=1e-5, atol=1e-6)   # another split of the same sums


def test_declines_with_the_op_left_outside():
    ir = """graph(%x : Tensor, %w : Tensor):
  %b : NoneType = prim::Constant()
  %s : int[] = prim::Constant[value=[1, 1]]()
  %p : int[] = prim::Constant[value=[0, 0]]()
  %g : int = prim::Constant[value=1]()
  %c : Tensor = aten::conv2d(%x, %w, %b, %s, %p, %s, %g)
  %r : Tensor = aten::hardsigmoid(%c)
  return (%r)"""
    k = GraphKernel("hs", ir, {"w": rnd(8, 8, 1, 1)}, lambda: [cl(torch.zeros(1, 8, 4, 4))])
    assert not k.ok and "aten::hardsigmoid" in k.reason


def test_global_switches_left_as_found(conv_add_relu):
    llga = torch._C._jit_llga_enabled()
    profiling = torch._C._jit_set_profiling_executor(True)
    torch._C._jit_set_profiling_executor(profiling)
    GraphKernel("again", CONV_ADD_RELU, {"w": rnd(16, 8, 3, 3), "b": rnd(16)},
                lambda: [cl(torch.zeros(1, 8, 5, 5)), cl(torch.zeros(1, 16, 5, 5))])
    assert torch._C._jit_llga_enabled() == llga
    assert torch._C._jit_set_profiling_executor(profiling) == profiling


def test_conv_builder_reasons():
    w = rnd(8, 8, 3, 3)
    ok = dict(stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=1, residual=False, params=[])
    assert "hardsigmoid" in onednn_graph_cnn.conv_kernel("c", (1, 8, 5, 5), (1, 8, 5, 5), w, None,
                                                         activation="hardsigmoid", **ok)
    assert "static" in onednn_graph_cnn.conv_kernel("c", ("N", 8, 5, 5), ("N", 8, 5, 5), w, None,
                                                    activation="relu", **ok)
    assert "static" in onednn_graph_cnn.conv_kernel("c", (1, 8, 1, 1), (1, 8, 1, 1), w, None,
                                                    activation="relu", **ok)
    assert callable(onednn_graph_cnn.conv_kernel("c", (1, 8, 5, 5), (1, 8, 5, 5), w, None,
                                                 activation="relu", **ok))


@pytest.mark.parametrize("activation", ["none", "relu", "gelu", "gelu_tanh", "sigmoid", "tanh", "silu"])
def test_linear_as_a_1x1_convolution(activation):
    w, b = rnd(48, 32, seed=1, scale=0.2), rnd(48, seed=2)
    eager = {"none": lambda y: y, "relu": torch.relu, "gelu": F.gelu, "sigmoid": torch.sigmoid,
             "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"), "tanh": torch.tanh, "silu": F.silu}[activation]
    fallback_calls = []

    def fallback(x, w_=None, b_=None):
        fallback_calls.append(tuple(x.shape))
        return eager(F.linear(x, w, b))
    kernel = onednn_graph_linear.linear_kernel("lin", w, b, activation, fallback, rows=None)
    shapes = [(1, 1, 32), (2, 3, 32), (1, 1, 32), (4, 32), (2, 3, 32)]
    with torch.inference_mode():
        for i, shape in enumerate(shapes):
            x = rnd(*shape, seed=10 + i)
            got = kernel(x)
            assert got.shape == shape[:-1] + (48,)
            torch.testing.assert_close(got, eager(F.linear(x, w, b)), rtol=1e-5, atol=1e-5)
    # the first MAX_SHAPES row counts got a partition; a third one runs through the fallback
    assert sorted(kernel.onednn_graph) == [1, 6] and fallback_calls == [(4, 32)]


def test_linear_static_rows_compile_at_bind():
    w = rnd(16, 8)
    kernel = onednn_graph_linear.linear_kernel("lin", w, None, "relu", None, rows=5)
    assert list(kernel.onednn_graph) == [5] and kernel.onednn_graph[5].ok
