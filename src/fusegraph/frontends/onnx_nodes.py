"""ONNX nodes, value types and bodies into the IR (used by ``onnx.py`` for the main graph).

``Scope`` holds the names visible while one graph converts: its own values first, then the
enclosing graph's, read through a capture (``ir/subgraphs.py``): a body that reads an outer
name gets a capture placeholder, and the owning node gets the outer value as an implicit
input. Nested bodies capture through each level. ``GraphProto`` attributes (If branches,
Loop / Scan bodies) become ``ir.Graph`` attributes; every body of one node gets the same
captures, in one order. Value types: tensors, and sequences / optionals, which the IR keeps
with ``dtype`` UNDEFINED, no shape and ``meta["container"]`` ("sequence", "optional",
"optional_sequence") plus ``meta["elem_dtype"]`` (their element type), so the planner never
gives them arena memory. Names from the model are data only; nothing here generates code.
"""
from __future__ import annotations

from typing import Any

import onnx
from onnx import helper

from ..errors import ModelLoadError, UnsupportedOpError
from ..ir import DType, Graph, Value
from .onnx_checks import check_node
from .onnx_data import tensor_to_torch

_MAX_NESTING = 16


def tensor_dims(tt) -> tuple | None:
    """A TensorTypeProto's dims: ints, symbolic names, or None for an unknown dim; None without a shape."""
    if not tt.HasField("shape"):
        return None
    dims = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return tuple(dims)


def _elem(code: int, where: str, name: str) -> DType:
    try:
        return DType(code)
    except ValueError:
        raise ModelLoadError(f"{where}: value {name!r} has unknown element type {code}") from None


def value_type(type_proto, where: str, name: str) -> tuple[DType, tuple | None, str | None, DType]:
    """(dtype, shape, container, element dtype) of an ONNX TypeProto; an empty TypeProto (a
    body input left untyped) is an unknown tensor."""
    kind = type_proto.WhichOneof("value")
    if kind is None:
        return DType.UNDEFINED, None, None, DType.UNDEFINED
    if kind == "tensor_type":
        dtype = _elem(type_proto.tensor_type.elem_type, where, name)
        return dtype, tensor_dims(type_proto.tensor_type), None, dtype
    if kind == "sequence_type":
        _, _, inner, elem = value_type(type_proto.sequence_type.elem_type, where, name)
        if inner is not None:
            raise UnsupportedOpError(f"{where}: value {name!r} is a sequence of {inner}s; only sequences "
                                     f"of tensors are supported")
        return DType.UNDEFINED, None, "sequence", elem
    if kind == "optional_type":
        _, _, inner, elem = value_type(type_proto.optional_type.elem_type, where, name)
        if inner not in (None, "sequence"):
            raise UnsupportedOpError(f"{where}: value {name!r} is an optional {inner}; not supported")
        return DType.UNDEFINED, None, "optional" if inner is None else "optional_sequence", elem
    raise UnsupportedOpError(f"{where}: value {name!r} has {kind} type; only tensors, sequences and "
                             f"optionals are supported")


def set_type(v: Value, type_proto, where: str) -> None:
    """Give ``v`` the type the model declares (tensor fields, or the container's meta)."""
    dtype, shape, container, elem = value_type(type_proto, where, v.name)
    if container is None:
        v.dtype = v.dtype or dtype
        v.shape = v.shape if v.shape is not None else shape
    else:
        v.dtype, v.shape = DType.UNDEFINED, None
        v.meta["container"] = container
        v.meta["elem_dtype"] = int(elem)


class Scope:
    """The names one graph can read: its own, then (through captures) its enclosing graph's."""

    def __init__(self, graph: Graph, parent: "Scope | None" = None, depth: int = 0):
        self.graph, self.parent, self.depth = graph, parent, depth
        self.names: dict[str, Value] = {}
        self.outer: list[Value] = []        # parent values, aligned with graph.captures

    def get(self, name: str) -> Value | None:
        v = self.names.get(name)
        if v is not None or self.parent is None:
            return v
        ov = self.parent.get(name)
        if ov is None:
            return None
        cap = self.graph.add_capture(name, ov.dtype, ov.shape)
        cap.meta.update({k: ov.meta[k] for k in ("container", "elem_dtype") if k in ov.meta})
        self.names[name] = cap
        self.outer.append(ov)
        return cap


def attr_value(attr: onnx.AttributeProto, base_dir, where: str) -> Any:
    if attr.type == onnx.AttributeProto.TENSOR:
        return tensor_to_torch(attr.t, base_dir, where)
    value = helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, list):
        return [v.decode("utf-8", errors="replace") if isinstance(v, bytes) else v for v in value]
    return value


def constant_value(node: onnx.NodeProto, attrs: dict, where: str):
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


def convert_body(proto: onnx.GraphProto, parent: Scope, opset: dict[str, int], base_dir, where: str) -> Scope:
    """A GraphProto attribute as an IR graph; its scope's ``outer`` lists what it captured."""
    if parent.depth >= _MAX_NESTING:
        raise ModelLoadError(f"{where}: bodies nest deeper than {_MAX_NESTING} levels")
    graph = Graph(proto.name or "body", opset)
    scope = Scope(graph, parent, parent.depth + 1)
    for init in proto.initializer:
        scope.names[init.name] = graph.add_constant(init.name, tensor_to_torch(init, base_dir, where))
    for inp in proto.input:
        if inp.name in scope.names:
            continue
        v = graph.add_input(inp.name, DType.UNDEFINED, None)
        set_type(v, inp.type, where)
        scope.names[inp.name] = v
    hints = {vi.name: vi.type for vi in list(proto.value_info) + list(proto.output)}
    for idx, node in enumerate(proto.node):
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        label = node.name or (node.output[0] if node.output else f"node{idx}")
        check_node(node, label, domain, opset.get(domain, 1), where)
    convert_nodes(scope, proto.node, opset, base_dir, where, hints)
    for out in proto.output:
        v = scope.get(out.name)
        if v is None:
            raise ModelLoadError(f"{where}: body {graph.name!r} output {out.name!r} is not defined")
        graph.outputs.append(v)
    return scope


def _align_captures(bodies: list[tuple[str, Scope]]) -> list[Value]:
    """Give every body of one node the same captures, in one order; return the outer values."""
    union: list[Value] = []
    for _, scope in bodies:
        for ov in scope.outer:
            if not any(ov is u for u in union):
                union.append(ov)
    for _, scope in bodies:
        have = {id(ov): cap for ov, cap in zip(scope.outer, scope.graph.captures)}
        caps = []
        for u in union:
            cap = have.get(id(u))
            if cap is None:
                cap = scope.graph.add_capture(u.name, u.dtype, u.shape)
                cap.meta.update({k: u.meta[k] for k in ("container", "elem_dtype") if k in u.meta})
            caps.append(cap)
        scope.graph.captures = caps
        scope.outer = list(union)
    return union


def convert_nodes(scope: Scope, nodes, opset: dict[str, int], base_dir, where: str,
                  hints: dict) -> None:
    """Append ``nodes`` to ``scope.graph``; ``hints`` maps a value name to (dtype, shape) or
    to a TypeProto the model declared for it."""
    graph = scope.graph
    for idx, node in enumerate(nodes):
        label = node.name or (node.output[0] if node.output else f"node{idx}")
        at = f"{where}: node {label!r}"
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        attrs, bodies = {}, []
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                body = convert_body(a.g, scope, opset, base_dir, f"{at}.{a.name}")
                bodies.append((a.name, body))
                attrs[a.name] = body.graph
            elif a.type == onnx.AttributeProto.GRAPHS:
                raise UnsupportedOpError(f"{at}: attribute {a.name!r} holds a list of graphs; not supported",
                                         node=label, op_type=node.op_type)
            else:
                attrs[a.name] = attr_value(a, base_dir, at)
        if node.op_type == "Constant" and domain == "":
            scope.names[node.output[0]] = graph.add_constant(node.output[0], constant_value(node, attrs, at))
            continue
        inputs = []
        for name in node.input:
            v = scope.get(name) if name else None
            if name and v is None:
                raise ModelLoadError(f"{at} ({node.op_type}) reads {name!r}, which no earlier node, input "
                                     f"or initializer defines")
            inputs.append(v)
        inputs.extend(_align_captures(bodies))
        out_names = list(node.output)
        while out_names and not out_names[-1]:
            out_names.pop()
        if domain not in opset:
            raise ModelLoadError(f"{at} uses domain {domain!r}, which the model does not import")
        n = graph.add_node(node.op_type, inputs, outputs=[o or f"{label}_unused{k}" for k, o in
                                                          enumerate(out_names)],
                           attrs=attrs, domain=domain, name=label)
        for o, orig in zip(n.outputs, out_names):
            if not orig:
                continue
            if orig in scope.names:
                raise ModelLoadError(f"{where}: value {orig!r} is defined twice (again by node {label!r})")
            scope.names[orig] = o
            o.meta["onnx_name"] = orig
            hint = hints.get(orig)
            if isinstance(hint, tuple):
                o.dtype, o.shape = hint
            elif hint is not None:
                try:
                    set_type(o, hint, where)
                except (UnsupportedOpError, ModelLoadError):
                    pass
