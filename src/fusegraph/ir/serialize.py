"""``Graph`` <-> a JSON-able dict, with tensors kept aside by name.

``graph_to_dict(graph)`` returns ``(data, tensors)``: ``data`` holds only JSON types (nodes with
op type, domain, version, inputs and outputs by value name, attributes; values with dtype,
shape, flags, layout and the JSON-able part of their meta; graph inputs, outputs, opset, meta);
``tensors`` maps a key to each torch tensor the graph holds (constants under their own name,
tensor attributes under ``@<node>/<attr>``). ``graph_from_dict(data, tensors)`` is the inverse.

Attribute values are encoded losslessly: JSON scalars as themselves, lists as lists, and tagged
objects for the rest (``$tuple``, ``$dict``, ``$float`` for NaN/inf, ``$bytes``, ``$dtype``,
``$tensor``/``$ndarray`` references, ``$graph`` for a body: its own dict, with its tensors
kept under the attribute's key as a prefix). Meta entries that cannot be encoded are dropped.
A body's ``captures`` (outer values it reads) are listed by name, like its inputs.

Decoding trusts nothing: every field is type-checked and a malformed dict raises
``ArtifactError`` naming the offending entry. The result is not verified here; callers run
``graph.verify()``. This module does no file I/O and knows no framework.
"""
from __future__ import annotations

import base64
import math
from typing import Any

import numpy as np
import torch

from ..errors import ArtifactError
from .dtype import DType
from .graph import Graph
from .nodes import Node, Value

SCHEMA_VERSION = 1
_MAX_DEPTH = 32
_MAX_GRAPH_NESTING = 16


class _Unencodable(Exception):
    pass


# ----- encoding ------------------------------------------------------------------------------
def _encode(x: Any, tensors: dict, key: str, depth: int = 0) -> Any:
    if depth > _MAX_DEPTH:
        raise _Unencodable("nested too deeply")
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, DType):
        return {"$dtype": int(x)}
    if isinstance(x, int):
        return int(x)
    if isinstance(x, float):
        return float(x) if math.isfinite(x) else {"$float": repr(float(x))}
    if isinstance(x, np.generic):
        return _encode(x.item(), tensors, key, depth + 1)
    if isinstance(x, (torch.Tensor, np.ndarray)):
        tag = "$tensor" if isinstance(x, torch.Tensor) else "$ndarray"
        t = x if isinstance(x, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(x))
        name = key
        while name in tensors:
            name += "_"
        tensors[name] = t.detach()
        return {tag: name}
    if isinstance(x, Graph):
        sub, sub_tensors = graph_to_dict(x)
        prefix = f"{key}/"
        if any(k.startswith(prefix) for k in tensors):
            raise _Unencodable(f"tensor keys under {prefix!r} are taken")
        for k, t in sub_tensors.items():
            tensors[prefix + k] = t
        return {"$graph": {"prefix": prefix, "graph": sub}}
    if isinstance(x, list):
        return [_encode(v, tensors, f"{key}.{i}", depth + 1) for i, v in enumerate(x)]
    if isinstance(x, tuple):
        return {"$tuple": [_encode(v, tensors, f"{key}.{i}", depth + 1) for i, v in enumerate(x)]}
    if isinstance(x, (bytes, bytearray)):
        return {"$bytes": base64.b64encode(bytes(x)).decode("ascii")}
    if isinstance(x, dict) and all(isinstance(k, str) for k in x):
        return {"$dict": {k: _encode(v, tensors, f"{key}.{k}", depth + 1) for k, v in x.items()}}
    raise _Unencodable(f"a {type(x).__name__} cannot be stored")


def _encode_meta(meta: dict, tensors: dict, key: str) -> dict:
    out = {}
    for k, v in meta.items():
        if not isinstance(k, str):
            continue
        before = len(tensors)
        try:
            out[k] = _encode(v, tensors, f"{key}.{k}")
        except _Unencodable:  # drop the entry and any tensor it had registered
            for name in list(tensors)[before:]:
                del tensors[name]
    return out


def graph_to_dict(graph: Graph) -> tuple[dict, dict[str, torch.Tensor]]:
    """The graph as JSON-able data plus the tensors it references (constants by name)."""
    tensors: dict[str, torch.Tensor] = {}
    for name, v in graph.constants.items():
        tensors[v.name] = v.const.detach()
    values = []
    for v in graph.values():
        entry: dict[str, Any] = {"name": v.name, "dtype": int(v.dtype),
                                 "shape": None if v.shape is None else list(v.shape)}
        if v.is_const:
            entry["const"] = v.name
        if v.flags:
            entry["flags"] = sorted(v.flags)
        if v.layout != "nchw":
            entry["layout"] = v.layout
        if v.meta:
            entry["meta"] = _encode_meta(v.meta, tensors, f"@{v.name}/meta")
        values.append(entry)
    nodes = []
    for node in graph.nodes:
        attrs = {}
        for k, a in node.attrs.items():
            try:
                attrs[k] = _encode(a, tensors, f"@{node.name}/{k}")
            except _Unencodable as exc:
                raise ArtifactError(f"cannot save node {node.name!r} ({node.op_type}): attribute {k!r}: "
                                    f"{exc}") from None
        entry = {"name": node.name, "op_type": node.op_type, "domain": node.domain,
                 "version": node.version, "inputs": [None if v is None else v.name for v in node.inputs],
                 "outputs": [v.name for v in node.outputs], "attrs": attrs}
        if node.meta:
            entry["meta"] = _encode_meta(node.meta, tensors, f"@{node.name}/meta")
        nodes.append(entry)
    data = {"schema": SCHEMA_VERSION, "name": graph.name, "opset": dict(graph.opset),
            "meta": _encode_meta(graph.meta, tensors, "@graph/meta"), "values": values,
            "inputs": [v.name for v in graph.inputs], "constants": list(graph.constants),
            "captures": [v.name for v in graph.captures],
            "nodes": nodes, "outputs": [v.name for v in graph.outputs]}
    return data, tensors


# ----- decoding ------------------------------------------------------------------------------
def _bad(where: str, what: str) -> ArtifactError:
    return ArtifactError(f"malformed graph in artifact: {where}: {what}")


def _want(x: Any, typ, where: str, what: str):
    if not isinstance(x, typ) or (typ is int and isinstance(x, bool)):
        raise _bad(where, f"{what} must be {getattr(typ, '__name__', typ)}, got {type(x).__name__}")
    return x


_SCALARS = frozenset({type(None), bool, int, float, str})


def _decode_dict(x: Any, tensors: dict, where: str, what: str, depth: int = 0) -> dict:
    """A plain JSON object of encoded values (attributes, meta) decoded."""
    return {k: v if type(v) in _SCALARS else _decode(v, tensors, where, depth + 1)
            for k, v in _want(x, dict, where, what).items()}


def _decode(x: Any, tensors: dict, where: str, depth: int = 0) -> Any:
    if type(x) in _SCALARS:
        return x
    if depth > _MAX_DEPTH:
        raise _bad(where, "attribute nested too deeply")
    if isinstance(x, list):
        return [_decode(v, tensors, where, depth + 1) for v in x]
    if not isinstance(x, dict) or len(x) != 1:
        raise _bad(where, f"cannot decode attribute value {str(x)[:60]!r}")
    (tag, body), = x.items()
    if tag == "$tuple":
        return tuple(_decode(v, tensors, where, depth + 1) for v in _want(body, list, where, tag))
    if tag == "$dict":
        return _decode_dict(body, tensors, where, tag, depth)
    if tag == "$float":
        if body not in ("nan", "inf", "-inf"):
            raise _bad(where, f"$float must be nan, inf or -inf, got {body!r}")
        return float(body)
    if tag == "$dtype":
        try:
            return DType(_want(body, int, where, tag))
        except ValueError:
            raise _bad(where, f"unknown dtype code {body}") from None
    if tag == "$bytes":
        try:
            return base64.b64decode(_want(body, str, where, tag), validate=True)
        except ValueError:
            raise _bad(where, "invalid base64 in $bytes") from None
    if tag == "$graph":
        body = _want(body, dict, where, tag)
        prefix = _want(body.get("prefix"), str, where, "$graph prefix")
        if depth + 1 > _MAX_GRAPH_NESTING:
            raise _bad(where, "bodies nested too deeply")
        sub = {k[len(prefix):]: t for k, t in tensors.items() if k.startswith(prefix)}
        return graph_from_dict(body.get("graph"), sub, _level=depth + 1)
    if tag in ("$tensor", "$ndarray"):
        t = tensors.get(_want(body, str, where, tag))
        if t is None:
            raise _bad(where, f"tensor {body!r} is not in the weights")
        return t if tag == "$tensor" else t.numpy()
    raise _bad(where, f"unknown tag {tag!r}")


def _shape(x: Any, where: str):
    if x is None:
        return None
    for d in _want(x, list, where, "shape"):
        if not (d is None or isinstance(d, str) or (type(d) is int and d >= 0)):
            raise _bad(where, f"shape dims must be non-negative ints, names or null, got {d!r}")
    return tuple(x)


def _make_value(e: Any, tensors: dict) -> Value:
    _want(e, dict, "values", "each value")
    name = _want(e.get("name"), str, "values", "value name")
    where = f"value %{name}"
    try:
        dtype = DType(_want(e.get("dtype"), int, where, "dtype"))
    except ValueError:
        raise _bad(where, f"unknown dtype code {e.get('dtype')}") from None
    shape = _shape(e.get("shape"), where)
    const = None
    if "const" in e:
        const = tensors.get(_want(e["const"], str, where, "const"))
        if const is None:
            raise _bad(where, f"constant tensor {e['const']!r} is not in the weights")
        if shape != tuple(const.shape) or DType.from_torch(const.dtype) != dtype:
            raise _bad(where, f"declared {dtype.name}{list(shape or [])} but the weights hold "
                              f"{const.dtype}{list(const.shape)}")
    v = Value(name, dtype, shape, const=const)
    if "flags" in e:
        v.flags = {_want(f, str, where, "flag") for f in _want(e["flags"], list, where, "flags")}
    if "layout" in e:
        v.layout = _want(e["layout"], str, where, "layout")
    if "meta" in e:
        v.meta = _decode_dict(e["meta"], tensors, where, "meta")
    return v


def copy_graph(graph: Graph) -> Graph:
    """An independent copy of ``graph`` (nodes, values, meta) sharing its constant tensors:
    what a pass may optimise in place while the original stays as it was."""
    return graph_from_dict(*graph_to_dict(graph))


def graph_from_dict(data: Any, tensors: dict[str, torch.Tensor], _level: int = 0) -> Graph:
    """Rebuild a graph; raises ArtifactError on anything malformed. Call ``verify()`` after.
    (``_level``: how deep this graph is nested in bodies; bounded.)"""
    if _level > _MAX_GRAPH_NESTING:
        raise _bad("graph", "bodies nested too deeply")
    _want(data, dict, "graph", "the graph")
    if data.get("schema") != SCHEMA_VERSION:
        raise _bad("graph", f"schema {data.get('schema')!r} is not {SCHEMA_VERSION}")
    opset = _want(data.get("opset"), dict, "graph", "opset")
    for k, v in opset.items():
        _want(v, int, "opset", f"opset[{k!r}]")
    graph = Graph(_want(data.get("name"), str, "graph", "name"), opset)
    graph.meta = _decode_dict(data.get("meta", {}), tensors, "graph meta", "meta")
    values: dict[str, Value] = {}
    for e in _want(data.get("values"), list, "graph", "values"):
        v = _make_value(e, tensors)
        if v.name in values:
            raise _bad(f"value %{v.name}", "defined twice")
        v.graph = graph
        values[v.name] = v

    def lookup(name: Any, where: str) -> Value:
        v = values.get(_want(name, str, where, "a value reference"))
        if v is None:
            raise _bad(where, f"refers to unknown value %{name}")
        return v

    claimed: set[str] = set()

    def claim(v: Value, where: str) -> Value:
        if v.name in claimed:
            raise _bad(where, f"value %{v.name} is defined twice")
        claimed.add(v.name)
        return v

    for name in _want(data.get("inputs"), list, "graph", "inputs"):
        v = claim(lookup(name, "graph inputs"), "graph inputs")
        if v.is_const:
            raise _bad("graph inputs", f"%{v.name} is a constant")
        graph.inputs.append(v)
    for name in _want(data.get("captures", []), list, "graph", "captures"):
        v = claim(lookup(name, "graph captures"), "graph captures")
        if v.is_const:
            raise _bad("graph captures", f"%{v.name} is a constant")
        graph.captures.append(v)
    for name in _want(data.get("constants"), list, "graph", "constants"):
        v = claim(lookup(name, "graph constants"), "graph constants")
        if not v.is_const:
            raise _bad("graph constants", f"%{v.name} has no tensor")
        graph.constants[v.name] = v
    node_names: set[str] = set()
    for e in _want(data.get("nodes"), list, "graph", "nodes"):
        _want(e, dict, "nodes", "each node")
        name = _want(e.get("name"), str, "nodes", "node name")
        where = f"node {name!r}"
        if name in node_names:
            raise _bad(where, "node name used twice")
        node_names.add(name)
        ins = [None if x is None else lookup(x, where) for x in _want(e.get("inputs"), list, where, "inputs")]
        outs = [claim(lookup(x, where), where) for x in _want(e.get("outputs"), list, where, "outputs")]
        if any(o.is_const for o in outs):
            raise _bad(where, "a node output cannot be a constant")
        attrs = _decode_dict(e.get("attrs", {}), tensors, where, "attrs", _level)
        version = _want(e.get("version"), int, where, "version")
        node = Node(_want(e.get("op_type"), str, where, "op_type"), ins, outs, attrs,
                    domain=_want(e.get("domain", ""), str, where, "domain"), version=version, name=name)
        if "meta" in e:
            node.meta = _decode_dict(e["meta"], tensors, where, "meta")
        node.graph = graph
        graph.nodes.append(node)
    graph.outputs = [lookup(x, "graph outputs") for x in _want(data.get("outputs"), list, "graph", "outputs")]
    unused = set(values) - claimed
    if unused:
        raise _bad("values", f"%{sorted(unused)[0]} is neither an input, a constant nor a node output")
    graph._names.update(values)
    graph._node_names.update(node_names)
    return graph
