"""Deterministic generator of malformed ONNX models, for ``test_hostile_inputs.py``.

``onnx_cases()`` yields ``(kind, name, make)``: ``make(folder)`` writes whatever the case needs
into ``folder`` (external data files, symlinks) and returns what to compile: a path, bytes or
a ModelProto. Every case is a mutation of one of a few tiny valid models: wrong arity, wrong
attribute types and values, bad dims and dtypes, unknown ops / domains, bad opsets, bombs
(ConstantOfShape, Expand, Tile, Range), cycles, duplicate and dangling names, hostile external
data, truncated or flipped bytes and garbage. No randomness outside a fixed seed.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as T, helper as H, numpy_helper as NH

OPSET = 17
INJECT = 't\n__import__("os").system("touch owned")\n#'


def _vi(name, dtype, shape):
    return H.make_tensor_value_info(name, dtype, shape)


def _model(nodes, inputs, outputs, inits=(), opset=OPSET):
    g = H.make_graph(nodes, "hostile", inputs, outputs, list(inits))
    return H.make_model(g, opset_imports=[H.make_opsetid("", opset)])


def _w(name, *shape, seed=0):
    return NH.from_array(np.random.default_rng(seed).standard_normal(shape).astype(np.float32), name)


def base_models() -> dict[str, onnx.ModelProto]:
    """A few tiny valid models covering the op families the mutations aim at."""
    f = T.FLOAT
    return {
        "chain": _model([H.make_node("Mul", ["x", "w"], ["a"], name="mul"),
                         H.make_node("Add", ["a", "b"], ["c"], name="add"),
                         H.make_node("Relu", ["c"], ["y"], name="relu")],
                        [_vi("x", f, [2, 3])], [_vi("y", f, [2, 3])], [_w("w", 3), _w("b", 3, seed=1)]),
        "conv": _model([H.make_node("Conv", ["x", "cw", "cb"], ["c"], name="conv", pads=[1, 1, 1, 1],
                                    strides=[1, 1], dilations=[1, 1], kernel_shape=[3, 3], group=1),
                        H.make_node("Relu", ["c"], ["r"], name="relu"),
                        H.make_node("MaxPool", ["r"], ["y"], name="pool", kernel_shape=[2, 2], strides=[2, 2])],
                       [_vi("x", f, [1, 2, 6, 6])], [_vi("y", f, [1, 4, 3, 3])], [_w("cw", 4, 2, 3, 3), _w("cb", 4)]),
        "gemm": _model([H.make_node("Gemm", ["x", "gw", "gb"], ["g"], name="gemm", transB=1, alpha=1.0),
                        H.make_node("Softmax", ["g"], ["s"], name="softmax", axis=1),
                        H.make_node("MatMul", ["s", "mw"], ["y"], name="matmul")],
                       [_vi("x", f, [2, 4])], [_vi("y", f, [2, 2])], [_w("gw", 3, 4), _w("gb", 3), _w("mw", 3, 2)]),
        "shape": _model([H.make_node("Transpose", ["x"], ["t"], name="transpose", perm=[0, 2, 1]),
                         H.make_node("Reshape", ["t", "shp"], ["r"], name="reshape"),
                         H.make_node("Concat", ["r", "r"], ["c"], name="concat", axis=1),
                         H.make_node("ReduceSum", ["c", "axes"], ["y"], name="reduce", keepdims=0)],
                        [_vi("x", f, [2, 3, 4])], [_vi("y", f, [2])],
                        [NH.from_array(np.array([2, 12], np.int64), "shp"),
                         NH.from_array(np.array([1], np.int64), "axes")]),
    }


def _copy(m):
    c = onnx.ModelProto()
    c.CopyFrom(m)
    return c


def _mut(base, fn):
    """A case that edits a copy of ``base`` in place (``fn``'s return value is ignored)."""
    def make(folder):
        m = _copy(base)
        fn(m, folder)
        return m
    return make


def _attr(name, value):
    return H.make_attribute(name, value)


def _set_attr(node, name, value):
    keep = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend(keep)
    if isinstance(value, list) and not value:
        node.attribute.append(onnx.AttributeProto(name=name, type=onnx.AttributeProto.INTS))
    elif value is not None:
        node.attribute.append(_attr(name, value))


_WRONG_TYPES = (1.5, "1", [1.0, 2.0], ["a"], 3, [1, 2])
_INT_VALUES = (0, -1, -100, 10 ** 9, 2 ** 62)
_INTS_VALUES = ([0, 0], [-1, -1], [10 ** 9, 1], [], [1], [1, 1, 1, 1, 1, 1])


def _node_cases(bases):
    for bname, base in bases.items():
        for i, node in enumerate(base.graph.node):
            tag = f"{bname}.{node.name}"
            yield "arity", f"{tag}.drop_input", _mut(base, lambda m, d, i=i: m.graph.node[i].input.pop())
            yield "arity", f"{tag}.extra_input", _mut(base, lambda m, d, i=i: m.graph.node[i].input.extend(
                [m.graph.node[i].input[0]] * 3))
            yield "arity", f"{tag}.empty_input0", _mut(base, lambda m, d, i=i: m.graph.node[i].input.__setitem__(0, ""))
            yield "arity", f"{tag}.no_inputs", _mut(base, lambda m, d, i=i: m.graph.node[i].ClearField("input"))
            yield "arity", f"{tag}.no_outputs", _mut(base, lambda m, d, i=i: m.graph.node[i].ClearField("output"))
            yield "arity", f"{tag}.extra_output", _mut(base, lambda m, d, i=i: m.graph.node[i].output.append("zz"))
            for a in node.attribute:
                for k, value in enumerate(_WRONG_TYPES):
                    yield "attr_type", f"{tag}.{a.name}.type{k}", _mut(
                        base, lambda m, d, i=i, n=a.name, v=value: _set_attr(m.graph.node[i], n, v))
                values = _INTS_VALUES if a.type == onnx.AttributeProto.INTS else _INT_VALUES
                if a.type in (onnx.AttributeProto.INTS, onnx.AttributeProto.INT):
                    for k, value in enumerate(values):
                        yield "attr_value", f"{tag}.{a.name}.value{k}", _mut(
                            base, lambda m, d, i=i, n=a.name, v=value: _set_attr(m.graph.node[i], n, v))
                yield "attr_value", f"{tag}.{a.name}.removed", _mut(
                    base, lambda m, d, i=i, n=a.name: _set_attr(m.graph.node[i], n, None))
            yield "attr_type", f"{tag}.undefined_type_attr", _mut(
                base, lambda m, d, i=i: m.graph.node[i].attribute.append(onnx.AttributeProto(name="axis")))
            yield "attr_value", f"{tag}.unknown_attr", _mut(
                base, lambda m, d, i=i: m.graph.node[i].attribute.append(_attr("no_such_attr", 1)))
            yield "unknown_op", f"{tag}.op_unknown", _mut(base, lambda m, d, i=i: setattr(m.graph.node[i], "op_type", "NoSuchOp"))
            yield "unknown_op", f"{tag}.op_inject", _mut(base, lambda m, d, i=i: setattr(m.graph.node[i], "op_type", INJECT))
            yield "unknown_op", f"{tag}.domain_unimported", _mut(base, lambda m, d, i=i: setattr(m.graph.node[i], "domain", "evil.x"))
            yield "unknown_op", f"{tag}.domain_imported", _mut(base, lambda m, d, i=i: (
                setattr(m.graph.node[i], "domain", "evil.x"), m.opset_import.append(H.make_opsetid("evil.x", 1))))
            yield "names", f"{tag}.name_inject", _mut(base, lambda m, d, i=i: setattr(m.graph.node[i], "name", INJECT))


def _dims(m, which, k, value):
    dim = m.graph.input[which].type.tensor_type.shape.dim[k]
    if isinstance(value, str):
        dim.dim_param = value
    else:
        dim.dim_value = value


def _graph_cases(bases):
    for bname, base in bases.items():
        rank = len(base.graph.input[0].type.tensor_type.shape.dim)
        for value in (-5, -1, 0, 10 ** 12, 2 ** 62):
            for k in range(min(rank, 2)):
                yield "dims", f"{bname}.input_dim{k}={value}", _mut(base, lambda m, d, k=k, v=value: _dims(m, 0, k, v))
        yield "dims", f"{bname}.input_dim_sym", _mut(base, lambda m, d: _dims(m, 0, 0, "N"))
        yield "dims", f"{bname}.input_rank+1", _mut(base, lambda m, d: m.graph.input[0].type.tensor_type.shape.dim.add().__setattr__("dim_value", 2))
        yield "dims", f"{bname}.input_rank-1", _mut(base, lambda m, d: m.graph.input[0].type.tensor_type.shape.dim.pop())
        yield "dims", f"{bname}.input_no_shape", _mut(base, lambda m, d: m.graph.input[0].type.tensor_type.ClearField("shape"))
        yield "dims", f"{bname}.output_dim-3", _mut(base, lambda m, d: m.graph.output[0].type.tensor_type.shape.dim[0].__setattr__("dim_value", -3))
        for dt in (0, 7, 8, 9, 10, 16, 9999):
            yield "dtypes", f"{bname}.input_dtype{dt}", _mut(base, lambda m, d, dt=dt: setattr(m.graph.input[0].type.tensor_type, "elem_type", dt))
        yield "dtypes", f"{bname}.input_sequence", _mut(base, lambda m, d: m.graph.input[0].type.CopyFrom(
            H.make_sequence_type_proto(H.make_tensor_type_proto(T.FLOAT, [2]))))
        for dt in (0, 8, 9999):
            yield "dtypes", f"{bname}.init_dtype{dt}", _mut(base, lambda m, d, dt=dt: setattr(m.graph.initializer[0], "data_type", dt))
        yield "initializer", f"{bname}.init_raw_short", _mut(base, lambda m, d: setattr(
            m.graph.initializer[0], "raw_data", m.graph.initializer[0].raw_data[:-1]))
        yield "initializer", f"{bname}.init_dims_huge", _mut(base, lambda m, d: m.graph.initializer[0].dims.__setitem__(0, 10 ** 11))
        yield "initializer", f"{bname}.init_dims_negative", _mut(base, lambda m, d: m.graph.initializer[0].dims.__setitem__(0, -4))
        yield "initializer", f"{bname}.init_float_data_wrong", _mut(base, lambda m, d: (
            m.graph.initializer[0].ClearField("raw_data"), m.graph.initializer[0].float_data.extend([1.0])))
        yield "initializer", f"{bname}.init_duplicate", _mut(base, lambda m, d: m.graph.initializer.append(m.graph.initializer[0]))
        for op in (-1, 0, 1, 6, 99999, 2 ** 40):
            yield "opset", f"{bname}.opset{op}", _mut(base, lambda m, d, op=op: setattr(m.opset_import[0], "version", op))
        yield "opset", f"{bname}.no_opset", _mut(base, lambda m, d: m.ClearField("opset_import"))
        yield "opset", f"{bname}.ml_opset99", _mut(base, lambda m, d: m.opset_import.append(H.make_opsetid("ai.onnx.ml", 99)))
        yield "opset", f"{bname}.ir_version99", _mut(base, lambda m, d: setattr(m, "ir_version", 99))
        nodes = len(base.graph.node)
        yield "structure", f"{bname}.cycle_self", _mut(base, lambda m, d: m.graph.node[1].input.__setitem__(0, m.graph.node[1].output[0]))
        yield "structure", f"{bname}.cycle_two", _mut(base, lambda m, d: m.graph.node[0].input.__setitem__(0, m.graph.node[1].output[0]))
        yield "structure", f"{bname}.reversed", _mut(base, lambda m, d: m.graph.node.reverse())
        yield "structure", f"{bname}.dup_node_output", _mut(base, lambda m, d: m.graph.node[1].output.__setitem__(0, m.graph.node[0].output[0]))
        yield "structure", f"{bname}.output_is_input", _mut(base, lambda m, d: m.graph.node[0].output.__setitem__(0, "x"))
        yield "structure", f"{bname}.dup_graph_output", _mut(base, lambda m, d: m.graph.output.append(m.graph.output[0]))
        yield "structure", f"{bname}.graph_output_missing", _mut(base, lambda m, d: setattr(m.graph.output[0], "name", "nowhere"))
        yield "structure", f"{bname}.dangling_input", _mut(base, lambda m, d, n=nodes: m.graph.node[n - 1].input.__setitem__(0, "ghost"))
        yield "structure", f"{bname}.no_graph_outputs", _mut(base, lambda m, d: m.graph.ClearField("output"))
        yield "structure", f"{bname}.no_nodes", _mut(base, lambda m, d: m.graph.ClearField("node"))
        yield "structure", f"{bname}.input_shadows_node", _mut(base, lambda m, d: m.graph.input.append(_vi(m.graph.node[0].output[0], T.FLOAT, [2])))
        yield "names", f"{bname}.value_inject", _mut(base, lambda m, d: _rename_value(m, m.graph.node[0].output[0], INJECT))
        yield "names", f"{bname}.graph_name_inject", _mut(base, lambda m, d: setattr(m.graph, "name", INJECT))


def _rename_value(m, old, new):
    for n in m.graph.node:
        for seq in (n.input, n.output):
            for k, v in enumerate(seq):
                if v == old:
                    seq[k] = new
    for o in m.graph.output:
        if o.name == old:
            o.name = new


def _bomb_cases():
    f = T.FLOAT
    i64 = lambda name, vals: NH.from_array(np.array(vals, np.int64), name)  # noqa: E731
    one = NH.from_array(np.array([1.0], np.float32))
    for shape in ([10 ** 6, 10 ** 6, 10 ** 3], [2 ** 31, 2 ** 31], [1000, 1000, 3000]):
        tag = "x".join(map(str, shape))
        yield "bomb", f"cos_output_{tag}", lambda d, s=shape: _model(
            [H.make_node("ConstantOfShape", ["s"], ["y"], value=one)], [], [_vi("y", f, None)], [i64("s", s)])
        yield "bomb", f"cos_reduced_{tag}", lambda d, s=shape: _model(
            [H.make_node("ConstantOfShape", ["s"], ["c"], value=one), H.make_node("ReduceSum", ["c"], ["y"], keepdims=0)],
            [], [_vi("y", f, None)], [i64("s", s)])
        yield "bomb", f"expand_output_{tag}", lambda d, s=shape: _model(
            [H.make_node("Expand", ["x", "s"], ["y"])], [_vi("x", f, [1])], [_vi("y", f, None)], [i64("s", s)])
        yield "bomb", f"expand_relu_{tag}", lambda d, s=shape: _model(
            [H.make_node("Expand", ["x", "s"], ["e"]), H.make_node("Relu", ["e"], ["y"])],
            [_vi("x", f, [1])], [_vi("y", f, None)], [i64("s", s)])
        yield "bomb", f"tile_{tag}", lambda d, s=shape: _model(
            [H.make_node("Tile", ["x", "s"], ["y"])], [_vi("x", f, [1] * len(s))], [_vi("y", f, None)], [i64("s", s)])
    for n in (1 << 40, 10 ** 7):   # onnx's data propagation walks 1-D values element by element
        yield "bomb", f"dataprop_input_1d_{n}", lambda d, n=n: _model(
            [H.make_node("Add", ["x", "x"], ["y"])], [_vi("x", T.INT64, [n])], [_vi("y", T.INT64, None)])
        yield "bomb", f"dataprop_expand_1d_{n}", lambda d, n=n: _model(
            [H.make_node("Expand", ["x", "s"], ["e"]), H.make_node("Add", ["e", "e"], ["y"])],
            [_vi("x", T.INT64, [1])], [_vi("y", T.INT64, None)], [i64("s", [n])])
    yield "bomb", "cos_dynamic_shape", lambda d: _model(
        [H.make_node("ConstantOfShape", ["s"], ["y"], value=one)], [_vi("s", T.INT64, [3])], [_vi("y", f, None)])
    yield "bomb", "range_huge", lambda d: _model(
        [H.make_node("Range", ["a", "b", "c"], ["y"])], [], [_vi("y", f, None)],
        [NH.from_array(np.array(0, np.float32), "a"), NH.from_array(np.array(1e15, np.float32), "b"),
         NH.from_array(np.array(1, np.float32), "c")])
    yield "bomb", "range_step0", lambda d: _model(
        [H.make_node("Range", ["a", "b", "c"], ["y"])], [], [_vi("y", T.INT64, None)],
        [i64("a", 0), i64("b", 10), i64("c", 0)])
    yield "bomb", "reshape_huge", lambda d: _model(
        [H.make_node("Reshape", ["x", "s"], ["y"])], [_vi("x", f, [2, 3])], [_vi("y", f, None)], [i64("s", [10 ** 9, 10 ** 9])])


def _ext_model(location, dims=(4,), offset=None, length=None):
    t = onnx.TensorProto(name="w", data_type=T.FLOAT, dims=list(dims), data_location=T.EXTERNAL)
    for k, v in (("location", location), ("offset", offset), ("length", length)):
        if v is not None:
            t.external_data.add(key=k, value=str(v))
    return _model([H.make_node("Add", ["x", "w"], ["y"])], [_vi("x", T.FLOAT, [4])], [_vi("y", T.FLOAT, [4])], [t])


def _save(model, folder, data: dict | None = None):
    for name, content in (data or {}).items():
        (Path(folder) / name).write_bytes(content)
    path = Path(folder) / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def _sparse_4tb(folder, broadcast=False):
    p = Path(folder) / "huge.bin"
    with open(p, "wb") as f:
        f.truncate(1 << 42)
    model = _ext_model("huge.bin", dims=(1 << 40,))
    if broadcast:     # x: [1] broadcasts against the 2**40 weights: onnx inference accepts it
        model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
        model.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 1 << 40
    return _save(model, folder)


def _symlink_out(folder):
    os.symlink("/etc/hostname", Path(folder) / "link.bin")
    return _save(_ext_model("link.bin"), folder)


def _external_cases():
    good = np.arange(4, dtype=np.float32).tobytes()
    for loc in ("../../etc/passwd", "/etc/passwd", "sub/../../etc/passwd", "C:\\evil.bin", "..\\..\\x.bin",
                "", "missing.bin", "w.bin\x00.txt", "~/.bashrc", "%2e%2e/etc/passwd"):
        yield "external", f"location={loc!r}", lambda d, loc=loc: _save(_ext_model(loc), d)
    for off, ln in ((-8, 16), (1 << 40, 16), ("abc", 16), (0, 8), (0, 1 << 40), (8, 16), (0, -16)):
        yield "external", f"offset={off},length={ln}", lambda d, o=off, n=ln: _save(_ext_model("w.bin", offset=o, length=n), d, {"w.bin": good})
    yield "external", "dims_mismatch", lambda d: _save(_ext_model("w.bin", dims=(1000,)), d, {"w.bin": good})
    yield "external", "sparse_4tb", _sparse_4tb
    yield "external", "sparse_4tb_broadcast", lambda d: _sparse_4tb(d, broadcast=True)
    yield "external", "symlink_outside", _symlink_out
    yield "external", "from_bytes", lambda d: _ext_model("w.bin").SerializeToString()
    yield "external", "valid", lambda d: _save(_ext_model("w.bin"), d, {"w.bin": good})


def _save_bytes(folder, data: bytes) -> Path:
    path = Path(folder) / "m.onnx"
    path.write_bytes(data)
    return path


def _byte_cases(bases):
    rng = np.random.default_rng(14)
    for bname in ("chain", "conv"):
        data = bases[bname].SerializeToString()
        for k, cut in enumerate(np.linspace(1, len(data) - 1, 8).astype(int)):
            yield "bytes", f"{bname}.truncated{k}@{cut}", lambda d, b=data[:cut]: b
        for k in range(10):
            pos = rng.integers(0, len(data), 3)
            out = bytearray(data)
            for p in pos:
                out[p] ^= 1 << int(rng.integers(0, 8))
            yield "bytes", f"{bname}.flipped{k}", lambda d, b=bytes(out): b
    for k in range(6):
        yield "bytes", f"garbage{k}", lambda d, b=rng.integers(0, 256, 64 << k, dtype=np.uint8).tobytes(): b
    yield "bytes", "empty", lambda d: b""
    yield "bytes", "other_message", lambda d: H.make_tensor("t", T.FLOAT, [1], [1.0]).SerializeToString()
    yield "bytes", "empty_file", lambda d: _save_bytes(d, b"")
    yield "bytes", "garbage_file", lambda d: _save_bytes(d, b"\x08\x07" + bytes(range(256)) * 4)
    yield "bytes", "directory", lambda d: Path(d)
    yield "bytes", "missing_file", lambda d: Path(d) / "nope.onnx"


def onnx_cases():
    bases = base_models()
    yield from _node_cases(bases)
    yield from _graph_cases(bases)
    yield from _bomb_cases()
    yield from _external_cases()
    yield from _byte_cases(bases)
