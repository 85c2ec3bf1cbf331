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
from ..ir import DType, Graph
from .onnx_checks import (check_model, check_node, check_opsets, check_text, check_types, check_value_dims,
                          small_vectors)
from .onnx_data import check_tensor_bytes, tensor_to_torch
from .onnx_nodes import Scope, convert_nodes, set_type, value_type
from .onnx_weights import parse_without_weights
from .qoperator import check_qoperator, standard_form

DEFAULT_OPSET = 7
_MAX_MODEL_BYTES = 1 << 34


def load_model_proto(model: Any) -> tuple[onnx.ModelProto, Path | None, str]:
    """Accept a path, bytes or ModelProto; return the proto, its folder and a display name."""
    if isinstance(model, onnx.ModelProto):
        try:
            return model, None, model.graph.name or "model"
        except UnicodeDecodeError:
            return model, None, "model"
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


def import_onnx(model: Any) -> Graph:
    """Build an IR graph from an ONNX model (path, bytes or ModelProto)."""
    proto, base_dir, where = load_model_proto(model)
    check_text(proto, where)
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
    check_qoperator(proto.graph.node, where)
    nodes = [standard_form(n, opset[""]) for n in proto.graph.node]
    for idx, node in enumerate(nodes):
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        check_node(node, node.name or (node.output[0] if node.output else f"node{idx}"), domain,
                   opset.get(domain, 1), where)
    hints, refusal = _shape_hints(proto, where)
    g = proto.graph
    graph = Graph(g.name or "main", opset)
    graph.meta["source"] = where
    scope = Scope(graph)
    by_name = scope.names

    for init in list(g.initializer) + list(_sparse_initializers(g, base_dir, where)):
        tensor = tensor_to_torch(init, base_dir, where)
        by_name[init.name] = graph.add_constant(init.name, tensor)
    for inp in g.input:
        if inp.name in by_name:  # an input shadowing an initializer: its default value is used
            continue
        v = graph.add_input(inp.name, DType.UNDEFINED, None)
        set_type(v, inp.type, where)
        by_name[inp.name] = v

    convert_nodes(scope, nodes, opset, base_dir, where, hints)

    for out in g.output:
        if out.name not in by_name:
            raise ModelLoadError(f"{where}: graph output {out.name!r} is not produced by any node")
        v = by_name[out.name]
        if (v.dtype == DType.UNDEFINED or v.shape is None) and "container" not in v.meta:
            try:
                set_type(v, out.type, where)
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
            dtype, shape, container, _ = value_type(vi.type, "", vi.name)
        except Exception:
            continue
        hints[vi.name] = (dtype, shape) if container is None else vi.type
    return hints, refusal


def _without_initializers(proto: onnx.ModelProto) -> onnx.ModelProto:
    light = onnx.ModelProto(ir_version=proto.ir_version)
    light.opset_import.extend(proto.opset_import)
    for field in ("node", "input", "output", "value_info"):
        getattr(light.graph, field).extend(getattr(proto.graph, field))
    light.graph.name = proto.graph.name
    return light
