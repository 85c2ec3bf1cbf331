"""ONNX frontend: a ModelProto (or a path to one) becomes an IR ``Graph``.

Handles opsets 7 up to the newest the installed onnx knows (older models load too, node by
node, where the registry has a definition in force at their opset), initializers (including graph
inputs that shadow them, as IR < 4 models have), Constant nodes, and external data confined to
the model's folder. Shapes and dtypes from the model (and from onnx's own inference) are kept
as hints; the op registry's inference refines them later. Optimises nothing.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
from onnx import helper

from ..errors import ModelLoadError, UnsupportedOpError
from ..ir import DType, Graph, Value
from .onnx_checks import check_model, check_node, check_opsets, check_types, check_value_dims, small_vectors
from .onnx_data import check_tensor_bytes, tensor_to_torch
from .onnx_weights import parse_without_weights

DEFAULT_OPSET = 7
_MAX_MODEL_BYTES = 1 << 34
_CONTROL_FLOW = {"If", "Loop", "Scan", "SequenceMap"}


def load_model_proto(model: Any) -> tuple[onnx.ModelProto, Path | None, str]:
    """Accept a path, bytes or ModelProto; return the proto, its folder and a display name."""
    if isinstance(model, onnx.ModelProto):
        return model, None, model.graph.name or "model"
    if isinstance(model, (bytes, bytearray)):
        return _parse(bytes(model), "<bytes>"), None, "<bytes>"
    if isinstance(model, (str, Path)):
        path = Path(model)
        if path.is_dir():
            raise ModelLoadError(f"{str(path)!r} is a directory, not a model file: give an .onnx file "
                                 f"(or a TensorFlow SavedModel folder, which holds saved_model.pb)")
        if not path.is_file():
            raise ModelLoadError(f"model file {str(path)!r} does not exist")
        if path.stat().st_size > _MAX_MODEL_BYTES:
            raise ModelLoadError(f"model file {str(path)!r} is larger than 16 GiB")
        data = parse_without_weights(path)  # large inline weights stay in the file until read
        return _parse(data if data is not None else path.read_bytes(), str(path)), path.parent, str(path)
    raise ModelLoadError(f"cannot load a model from a {type(model).__name__}; give a path, bytes or "
                         f"an onnx.ModelProto")


def _parse(data: bytes, where: str) -> onnx.ModelProto:
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as exc:
        raise ModelLoadError(f"{where}: not a valid ONNX file (protobuf parse failed: {exc})") from None
    if not proto.graph.node and not proto.graph.output:
        raise ModelLoadError(f"{where}: not a valid ONNX model (no graph, no nodes, no outputs)")
    return proto


def _type_of(type_proto, where: str, name: str) -> tuple[DType, tuple | None]:
    if not type_proto.HasField("tensor_type"):
        kind = type_proto.WhichOneof("value") or "unknown"
        raise UnsupportedOpError(f"{where}: value {name!r} has {kind} type; only tensors are supported")
    tt = type_proto.tensor_type
    try:
        dtype = DType(tt.elem_type)
    except ValueError:
        raise ModelLoadError(f"{where}: value {name!r} has unknown element type {tt.elem_type}") from None
    if not tt.HasField("shape"):
        return dtype, None
    dims = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return dtype, tuple(dims)


def _attr_value(attr: onnx.AttributeProto, base_dir, where: str) -> Any:
    if attr.type == onnx.AttributeProto.TENSOR:
        return tensor_to_torch(attr.t, base_dir, where)
    if attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
        return attr.g if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
    value = helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, list):
        return [v.decode("utf-8", errors="replace") if isinstance(v, bytes) else v for v in value]
    return value


def _constant_value(node: onnx.NodeProto, attrs: dict, where: str):
    import torch
    if "value" in attrs:
        return attrs["value"]
    if "value_float" in attrs:
        return torch.tensor(attrs["value_float"], dtype=torch.float32)
    if "value_floats" in attrs:
        return torch.tensor(attrs["value_floats"], dtype=torch.float32)
    if "value_int" in attrs:
        return torch.tensor(attrs["value_int"], dtype=torch.int64)
    if "value_ints" in attrs:
        return torch.tensor(attrs["value_ints"], dtype=torch.int64)
    raise UnsupportedOpError(f"{where}: Constant node {node.name or node.output[0]!r} has "
                             f"{sorted(attrs)}; only numeric tensors are supported",
                             node=node.name, op_type="Constant")


def import_onnx(model: Any) -> Graph:
    """Build an IR graph from an ONNX model (path, bytes or ModelProto)."""
    proto, base_dir, where = load_model_proto(model)
    opset: dict[str, int] = {}
    for imp in proto.opset_import:
        opset["" if imp.domain in ("", "ai.onnx") else imp.domain] = imp.version
    if "" not in opset:
        opset[""] = 1 if proto.ir_version < 3 else DEFAULT_OPSET
    if opset[""] < 1:
        raise ModelLoadError(f"{where}: default-domain opset {opset['']} is not a valid opset version")
    check_opsets(opset, where)
    check_model(proto, where)
    check_value_dims(proto.graph, where)
    for idx, node in enumerate(proto.graph.node):
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        check_node(node, node.name or (node.output[0] if node.output else f"node{idx}"), domain,
                   opset.get(domain, 1), where)
    hints, refusal = _shape_hints(proto, where)
    g = proto.graph
    graph = Graph(g.name or "main", opset)
    graph.meta["source"] = where
    by_name: dict[str, Value] = {}

    for init in list(g.initializer) + list(_sparse_initializers(g, base_dir, where)):
        tensor = tensor_to_torch(init, base_dir, where)
        by_name[init.name] = graph.add_constant(init.name, tensor)
    for inp in g.input:
        if inp.name in by_name:  # an input shadowing an initializer: its default value is used
            continue
        dtype, shape = _type_of(inp.type, where, inp.name)
        by_name[inp.name] = graph.add_input(inp.name, dtype, shape)

    for idx, node in enumerate(g.node):
        label = node.name or (node.output[0] if node.output else f"node{idx}")
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        attrs = {a.name: _attr_value(a, base_dir, f"{where}: node {label!r}") for a in node.attribute}
        if node.op_type in _CONTROL_FLOW and domain == "":
            raise UnsupportedOpError(f"{where}: node {label!r} is a {node.op_type}; control-flow ops "
                                     f"(If, Loop, Scan) are not supported yet", node=label,
                                     op_type=node.op_type)
        if node.op_type == "Constant" and domain == "":
            tensor = _constant_value(node, attrs, f"{where}: node {label!r}")
            by_name[node.output[0]] = graph.add_constant(node.output[0], tensor)
            continue
        inputs = []
        for name in node.input:
            if not name:
                inputs.append(None)
            elif name not in by_name:
                raise ModelLoadError(f"{where}: node {label!r} ({node.op_type}) reads {name!r}, which "
                                     f"no earlier node, input or initializer defines")
            else:
                inputs.append(by_name[name])
        out_names = list(node.output)
        while out_names and not out_names[-1]:
            out_names.pop()
        if domain not in opset:
            raise ModelLoadError(f"{where}: node {label!r} uses domain {domain!r}, which the model "
                                 f"does not import")
        n = graph.add_node(node.op_type, inputs, outputs=[o or f"{label}_unused{k}" for k, o in
                                                          enumerate(out_names)],
                           attrs=attrs, domain=domain, name=label)
        for o, orig in zip(n.outputs, out_names):
            if orig:
                if orig in by_name:
                    raise ModelLoadError(f"{where}: value {orig!r} is defined twice (again by node {label!r})")
                by_name[orig] = o
                o.meta["onnx_name"] = orig
                if orig in hints:
                    o.dtype, o.shape = hints[orig]

    for out in g.output:
        if out.name not in by_name:
            raise ModelLoadError(f"{where}: graph output {out.name!r} is not produced by any node")
        v = by_name[out.name]
        if v.dtype == DType.UNDEFINED or v.shape is None:
            try:
                dtype, shape = _type_of(out.type, where, out.name)
                v.dtype = v.dtype or dtype
                v.shape = v.shape if v.shape is not None else shape
            except (UnsupportedOpError, ModelLoadError):
                pass
        graph.outputs.append(v)
    graph.meta["output_names"] = [o.name for o in g.output]
    if refusal is not None:
        raise refusal
    return graph


def _sparse_initializers(g: onnx.GraphProto, base_dir, where: str):
    from onnx import numpy_helper
    for sp in g.sparse_initializer:
        try:
            yield numpy_helper.from_array(_densify(sp), sp.values.name)
        except ModelLoadError:
            raise
        except Exception as exc:
            raise ModelLoadError(f"{where}: sparse initializer {sp.values.name!r} could not be read: "
                                 f"{type(exc).__name__}: {exc}") from None


def _densify(sp):
    import numpy as np
    from onnx import numpy_helper
    values = numpy_helper.to_array(sp.values)
    indices = numpy_helper.to_array(sp.indices)
    numel = 1
    for d in sp.dims:
        if d < 0:
            raise ValueError(f"dims {list(sp.dims)} hold a negative dim")
        numel *= int(d)
    check_tensor_bytes(sp.values.name, numel * values.dtype.itemsize, sp.dims, "sparse initializer")
    dense = np.zeros(int(np.prod(sp.dims)), dtype=values.dtype)
    flat = indices if indices.ndim == 1 else np.ravel_multi_index(indices.T, tuple(sp.dims))
    dense[flat] = values
    return dense.reshape(tuple(sp.dims))


def _shape_hints(proto: onnx.ModelProto, where: str):
    """Dtypes and shapes onnx itself infers (with data propagation), as hints; and the refusal
    (or None) of onnx's strict type inference (``onnx_checks.check_types``), which the importer
    raises after its own checks.

    Runs on a light copy: large initializers become typed inputs, so weights are not copied.
    """
    hints: dict[str, tuple[DType, tuple | None]] = {}
    light = _without_initializers(proto)
    g = proto.graph
    input_names = {i.name for i in g.input}
    for init in g.initializer:
        if len(init.raw_data) <= 4096 and init.data_location != onnx.TensorProto.EXTERNAL:
            light.graph.initializer.append(init)
        elif init.name not in input_names:
            light.graph.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    checked, refusal = check_types(light, where)
    try:
        if checked is None or not small_vectors(checked):   # refused, or data propagation would crawl
            raise ValueError("no data propagation")
        inferred = onnx.shape_inference.infer_shapes(light, check_type=False, strict_mode=False,
                                                     data_prop=True)
        infos = list(inferred.graph.value_info) + list(inferred.graph.output)
    except Exception:
        src = checked.graph if checked is not None else proto.graph
        infos = list(src.value_info) + list(src.output)
    for vi in infos:
        try:
            hints[vi.name] = _type_of(vi.type, "", vi.name)
        except Exception:
            continue
    return hints, refusal


def _without_initializers(proto: onnx.ModelProto) -> onnx.ModelProto:
    light = onnx.ModelProto(ir_version=proto.ir_version)
    light.opset_import.extend(proto.opset_import)
    for field in ("node", "input", "output", "value_info"):
        getattr(light.graph, field).extend(getattr(proto.graph, field))
    light.graph.name = proto.graph.name
    return light
