"""GlobalAveragePool of channels-last conv output (the CPU backend's one product per image,
``runtime/backends/cpu/dnnl/pool.py``): channels holding equal data stay equal (every channel
is the same dot product, in the same summation order), checked against onnxruntime
(ORT_DISABLE_ALL) and the unoptimised graph at fp32 rtol 1e-4."""
import numpy as np

from passes_util import F, check, const, model, node


def rnd(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


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
    gap = next(c for c in compiled._executor.binding.calls if c.node.op_type == "GlobalAveragePool")
    assert getattr(gap.kernel, "impl", "portable") != "portable", "the oneDNN mean ran, not the fallback"
