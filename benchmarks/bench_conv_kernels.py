"""One convolution, three ways: ideep (``torch.ops.mkldnn._convolution_pointwise`` with a
prepacked weight, which builds oneDNN's primitive descriptor on every call), a oneDNN Graph
partition (``runtime/backends/cpu/onednn_graph_cnn.conv_kernel``: compiled once) and onnxruntime's Conv node
(ORT_ENABLE_ALL, spinning off), each with bias + ReLU, channels-last float32 input, batch 1.
The shapes are ShuffleNet's and SqueezeNet's; the first row is a tiny one whose time is all
fixed cost. Median us per call, warm caches (each call repeats the same convolution).

    python benchmarks/bench_conv_kernels.py [--threads 2]
"""
from __future__ import annotations

import argparse

import numpy as np
import onnxruntime as ort
import torch
from onnx import TensorProto, helper, numpy_helper

from fusegraph.runtime.backends.cpu.onednn_graph_cnn import conv_kernel
from fusegraph.timing import measure

CL = torch.channels_last
# (channels in, size, channels out, kernel, stride, groups)
SHAPES = ((16, 4, 16, 1, 1, 1), (272, 14, 272, 1, 1, 4), (136, 28, 136, 1, 1, 4), (272, 14, 272, 3, 1, 272),
          (544, 7, 544, 1, 1, 4), (64, 55, 16, 1, 1, 1), (16, 55, 64, 3, 1, 1), (512, 13, 1000, 1, 1, 1))


def _us(fn) -> float:
    return measure(fn, runs=200, warmup=20).median_ms * 1000.0


def _ort(x, w, b, pad, stride, groups, threads):
    node = helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[pad] * 4, strides=[stride] * 2, group=groups)
    graph = helper.make_graph([node, helper.make_node("Relu", ["c"], ["y"])], "conv",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads, so.log_severity_level = threads, 1, 3
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return lambda: sess.run(None, {"x": x})


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{args.threads} threads, median us per call\n")
    print("| C in x HW -> C out, k, stride, groups | ideep | oneDNN Graph | onnxruntime |")
    print("|---|---:|---:|---:|")
    unary = torch.ops.mkldnn._convolution_pointwise.default
    for c, hw, o, k, s, g in SHAPES:
        rng = np.random.default_rng(0)
        x = rng.standard_normal((1, c, hw, hw)).astype(np.float32)
        w = (rng.standard_normal((o, c // g, k, k)) * 0.1).astype(np.float32)
        b = rng.standard_normal(o).astype(np.float32)
        p = k // 2
        xt = torch.from_numpy(x).contiguous(memory_format=CL)
        wt, bt = torch.from_numpy(w), torch.from_numpy(b)
        packed = torch.ops.mkldnn._reorder_convolution_weight(wt, [p, p], [s, s], [1, 1], g, [1, c, hw, hw])
        out_hw = (hw + 2 * p - k) // s + 1
        graph = conv_kernel("conv", (1, c, hw, hw), (1, o, out_hw, out_hw), wt, bt, [s, s], [p, p], [1, 1], g,
                            False, "relu", [])
        with torch.inference_mode():
            t_ideep = _us(lambda: unary(xt, packed, bt, [p, p], [s, s], [1, 1], g, "relu", [], None))
            t_graph = _us(lambda: graph(xt))
        t_ort = _us(_ort(x, w, b, p, s, g, args.threads))
        print(f"| {c} x {hw}x{hw} -> {o}, {k}x{k}, s{s}, g{g} | {t_ideep:.1f} | {t_graph:.1f} | {t_ort:.1f} |",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
