"""Weight products with cold weights: onnxruntime (MLAS) vs oneDNN's 1x1 convolution vs its
inner product vs MKL.

Each row runs 8 different weights of one shape in turn (so they come from memory, as in a
model run, not from cache) and reports the median time per product, 2 threads by default:
onnxruntime as one session of 8 MatMuls (spinning off, so its pool does not hold the cores),
the product as a oneDNN Graph 1x1 convolution partition (what ``LinearAct`` runs,
``runtime/backends/cpu/onednn_graph_linear.py``), ``torch.ops.mkldnn._linear_pointwise`` with ``[N, K]``
weights (its fallback), the same with weights reordered for the row count, and ``torch.mm``
(MKL).

With ``--bert-set``: the eight one-row products of the 2-layer BERT export (QKV, output,
FFN up, FFN down, twice; with bias) in model order, as onnxruntime one session of eight
MatMul + Add against the eight ``LinearAct`` partitions, alternating blocks in one process:
what the products of a whole run cost, with nothing else between them.

    python benchmarks/bench_gemv.py [--threads 2] [--rows 1,16] [--bert-set]
"""
from __future__ import annotations

import argparse

import numpy as np
import onnxruntime as ort
import torch
from onnx import TensorProto, helper, numpy_helper

from fusegraph.runtime.backends.cpu.onednn_graph_linear import linear_kernel
from fusegraph.timing import measure

SHAPES = ((768, 768), (768, 2304), (768, 3072), (3072, 768))
COPIES = 8


def _median_us(fn) -> float:
    """Median us per product of ``fn`` (which runs ``COPIES`` of them)."""
    return measure(fn, runs=60, warmup=5).median_ms * 1000.0 / COPIES


def _ort_session(weights, m: int, k: int, threads: int):
    nodes = [helper.make_node("MatMul", ["x", f"w{i}"], [f"y{i}"]) for i in range(len(weights))]
    graph = helper.make_graph(nodes, "gemv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                              [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None)
                               for i in range(len(weights))],
                              [numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(weights)])
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads, so.log_severity_level = threads, 1, 3
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def bert_set(threads: int) -> None:
    import statistics

    from fusegraph.bench import alternate

    shapes = [(768, 2304), (768, 768), (768, 3072), (3072, 768)] * 2
    rng = np.random.default_rng(0)
    weights = [(rng.standard_normal((k, n)) * 0.02).astype(np.float32) for k, n in shapes]
    biases = [(rng.standard_normal(n) * 0.02).astype(np.float32) for _, n in shapes]
    feeds = {f"x{k}": rng.standard_normal((1, k)).astype(np.float32) for k in (768, 3072)}
    nodes, inits = [], []
    for i, ((k, _), w, b) in enumerate(zip(shapes, weights, biases)):
        nodes += [helper.make_node("MatMul", [f"x{k}", f"w{i}"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"y{i}"])]
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(x.shape)) for n, x in feeds.items()]
    outputs = [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None) for i in range(8)]
    graph = helper.make_graph(nodes, "bert_products", inputs, outputs, inits)
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads, so.log_severity_level = threads, 1, 3
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    kernels = [linear_kernel("w", torch.from_numpy(w).t().contiguous(), torch.from_numpy(b), "none", None, rows=1)
               for w, b in zip(weights, biases)]
    xs = [torch.from_numpy(feeds[f"x{k}"]) for k, _ in shapes]

    def ours():
        with torch.inference_mode():
            for kernel, x in zip(kernels, xs):
                kernel(x)
    samples = alternate({"onnxruntime": lambda: sess.run(None, feeds), "oneDNN Graph 1x1 conv": ours},
                        runs=400, warmup=30, block=10)
    print(f"{threads} threads, the eight products of bert in order, median ms per set of eight\n")
    for name, times in samples.items():
        print(f"{name}: {statistics.median(times):.3f} ms")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", default="1,16")
    ap.add_argument("--bert-set", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.bert_set:
        bert_set(args.threads)
        return 0
    linear, reorder = torch.ops.mkldnn._linear_pointwise, torch.ops.mkldnn._reorder_linear_weight
    print(f"{args.threads} threads, {COPIES} weights per shape, median us per product\n")
    print("| rows | K x N | onnxruntime | oneDNN Graph 1x1 conv | oneDNN [N, K] | oneDNN reordered | MKL mm |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for m in (int(r) for r in args.rows.split(",")):
        for k, n in SHAPES:
            rng = np.random.default_rng(0)
            weights = [(rng.standard_normal((k, n)) * 0.02).astype(np.float32) for _ in range(COPIES)]
            x = rng.standard_normal((m, k)).astype(np.float32)
            sess = _ort_session(weights, m, k, args.threads)
            t_ort = _median_us(lambda: sess.run(None, {"x": x}))
            xt = torch.from_numpy(x)
            rows_first = [torch.from_numpy(w).t().contiguous() for w in weights]
            packed = [reorder(w, m) for w in rows_first]
            cols = [torch.from_numpy(w) for w in weights]
            t_dnn = _median_us(lambda: [linear(xt, w, None, "none", [], "") for w in rows_first])
            t_packed = _median_us(lambda: [linear(xt, w, None, "none", [], "") for w in packed])
            t_mkl = _median_us(lambda: [torch.mm(xt, w) for w in cols])
            convs = [linear_kernel("w", w, None, "none", None, rows=m) for w in rows_first]
            with torch.inference_mode():
                t_conv = _median_us(lambda: [c(xt) for c in convs])
            print(f"| {m} | {k}x{n} | {t_ort:.0f} | {t_conv:.0f} | {t_dnn:.0f} | {t_packed:.0f} | {t_mkl:.0f} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
