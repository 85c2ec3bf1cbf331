"""Helpers for the pass tests: build small ONNX models, compile them at a level, and check the
result against two independent oracles (the unoptimised graph at O0, and onnx.reference or
onnxruntime with ORT_DISABLE_ALL). Never the optimiser against itself."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import fusegraph as fg
from fusegraph.frontends.onnx import import_onnx
from fusegraph.ops import infer_graph
from fusegraph.passes import PassOptions, optimize
from fusegraph.report import CompileReport
from oracle import assert_outputs_close, ort_run

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def const(name: str, value, dtype=np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def model(nodes, inputs, outputs, inits=(), opset: int = 18) -> onnx.ModelProto:
    """``inputs``: (name, elem_type, shape); ``outputs``: names (types left to inference)."""
    g = helper.make_graph(
        nodes, "test",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(o, 0, None) if isinstance(o, str) else
         helper.make_tensor_value_info(*o) for o in outputs],
        list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8 if opset < 21 else 10
    try:  # output element types from onnx's inference (onnxruntime refuses undefined ones)
        inferred = {o.name: o for o in onnx.shape_inference.infer_shapes(m).graph.output}
        for o in m.graph.output:
            if not o.type.tensor_type.elem_type and o.name in inferred:
                o.type.tensor_type.elem_type = inferred[o.name].type.tensor_type.elem_type
    except Exception:
        pass
    return m


def node(op, ins, outs, **attrs) -> onnx.NodeProto:
    return helper.make_node(op, list(ins), [outs] if isinstance(outs, str) else list(outs), **attrs)


def feeds_for(m: onnx.ModelProto, seed: int = 0, dims: dict | None = None) -> dict:
    rng = np.random.default_rng(seed)
    inits = {t.name for t in m.graph.initializer}
    feeds = {}
    for vi in m.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else (dims or {}).get(d.dim_param, 3)
                 for d in tt.shape.dim]
        dt = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if np.issubdtype(dt, np.floating):
            feeds[vi.name] = rng.standard_normal(shape).astype(dt)
        elif dt == np.bool_:
            feeds[vi.name] = rng.integers(0, 2, shape).astype(dt)
        else:
            feeds[vi.name] = rng.integers(-5, 6, shape).astype(dt)
    return feeds


def reference(m: onnx.ModelProto, feeds: dict) -> dict:
    from onnx.reference import ReferenceEvaluator
    names = [o.name for o in m.graph.output]
    return dict(zip(names, ReferenceEvaluator(m).run(None, feeds)))


def compile_with(m, level: str = "O2", fast_math: bool = False, **config) -> fg.CompiledModel:
    """Compile with verification after every pass; ``fast_math`` goes through PassOptions."""
    cfg = fg.Config(level=level, verify_each=True, **config)
    if not fast_math:
        return fg.compile(m, cfg)
    graph = import_onnx(m)
    infer_graph(graph)
    report = CompileReport()
    optimize(graph, cfg, report, options=PassOptions(cfg.fold_size_limit, True, frozenset(cfg.disabled_passes)))
    compiled = fg.compile(graph, fg.Config(level="O0"))
    compiled.report.passes, compiled.report.unfolded = report.passes, report.unfolded
    return compiled


def check(m, level: str = "O2", oracle: str = "ref", feeds=None, rtol=1e-4, atol=1e-5,
          fast_math: bool = False, **config) -> fg.CompiledModel:
    """Optimise ``m``; assert its outputs equal O0's and the oracle's; return the compiled model."""
    feeds = feeds if feeds is not None else feeds_for(m)
    compiled = compile_with(m, level, fast_math, **config)
    got = compiled.run(feeds)
    assert_outputs_close(got, fg.compile(m, fg.Config(level="O0")).run(feeds), rtol, atol)
    want = reference(m, feeds) if oracle == "ref" else ort_run(m, feeds)
    assert_outputs_close(got, want, rtol, atol)
    return compiled


def ops(compiled) -> list[str]:
    graph = getattr(compiled, "graph", compiled)
    return [n.op_type for n in graph.nodes]


def ort_basic_node_count(path, tmp_path) -> int:
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.optimized_model_filepath = str(tmp_path / "basic.onnx")
    so.log_severity_level = 3
    ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return len(onnx.load(so.optimized_model_filepath, load_external_data=False).graph.node)
