"""Common subexpression elimination, constants included.

Constants of the same dtype, shape and bytes are merged first, so nodes reading equal
constants through different Values become comparable, and a weight the model shares between
layers (ALBERT's one layer run several times) stays one tensor after the rewrites that make
each node's form of it (a transpose, a concatenation of the three attention products): up to
``MAX_DEDUP_BYTES`` by their bytes, larger ones by comparing them with the earlier constants
of their dtype and shape (``SAMPLED`` bytes at fixed places first, all of them where those
agree: random weights of one shape are told apart without reading them whole). Then,
in node order, a pure node with the same op, domain, version, attributes and input Values
as an earlier one is replaced by it. Not merged: impure or unknown ops, nodes with flagged
outputs, nodes with subgraph attributes, and a duplicate whose output is a graph output when
the survivor's is too (two outputs must not alias one tensor). Bodies of control-flow nodes
are deduplicated on their own, first.
"""
from __future__ import annotations

import math

import torch

from ..ir import Graph
from ..ir.subgraphs import subgraphs
from ..ops import lookup
from .manager import PassResult, is_locked

MAX_DEDUP_BYTES = 1 << 20        # constants up to this size are keyed by their bytes; larger ones compared
SAMPLED = 256                    # bytes compared first, at fixed places, between two large constants


def _tensor_key(t: torch.Tensor):
    if t.numel() * t.element_size() > MAX_DEDUP_BYTES:
        return ("tensor-id", id(t))
    raw = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return ("tensor", str(t.dtype), tuple(t.shape), raw)


def _attr_key(v):
    if isinstance(v, torch.Tensor):
        return _tensor_key(v)
    if isinstance(v, float):
        return ("float", "nan" if math.isnan(v) else v)
    if isinstance(v, (list, tuple)):
        return ("list",) + tuple(_attr_key(x) for x in v)
    if isinstance(v, (int, str, bytes, bool)) or v is None:
        return v
    raise TypeError("unhashable attribute")  # subgraphs and the like: never merged


class CommonSubexpressionElimination:
    name = "cse"

    def __init__(self, options=None):
        self.options = options

    def run(self, graph: Graph) -> PassResult:
        in_bodies = 0
        for node in graph.nodes:          # bodies first, each on its own (outer reads are captures)
            for _, body in subgraphs(node):
                r = self.run(body)
                in_bodies += sum(v for v in r.stats.values() if isinstance(v, int))
        consts = self._dedup_constants(graph)
        seen: dict[tuple, object] = {}
        merged = 0
        for node in list(graph.nodes):
            opdef = lookup(node.domain, node.op_type, node.version)
            if opdef is None or not opdef.pure or any(is_locked(o) for o in node.outputs):
                continue
            try:
                attrs = tuple(sorted((k, _attr_key(v)) for k, v in node.attrs.items()))
            except TypeError:
                continue
            key = (node.domain, node.op_type, node.version, len(node.outputs), attrs,
                   tuple(None if v is None else id(v) for v in node.inputs))
            first = seen.get(key)
            if first is None:
                seen[key] = node
                continue
            if any(o.is_graph_output and f.is_graph_output for o, f in zip(node.outputs, first.outputs)):
                continue
            for o, f in zip(node.outputs, first.outputs):
                o.replace_all_uses_with(f)
            graph.remove(node)
            merged += 1
        stats = {}
        if merged:
            stats["nodes_merged"] = merged
        if consts:
            stats["constants_merged"] = consts
        if in_bodies:
            stats["in_bodies"] = in_bodies
        return PassResult(bool(merged or consts or in_bodies), stats)

    @staticmethod
    def _dedup_constants(graph: Graph) -> int:
        seen: dict[tuple, object] = {}
        large: dict[tuple, list] = {}          # (dtype, shape) -> the large constants kept
        merged = 0
        for name, v in list(graph.constants.items()):
            if is_locked(v) or not v.uses:
                continue
            key = _tensor_key(v.const)
            if key[0] == "tensor-id":
                first = _equal_large(large.setdefault((str(v.const.dtype), tuple(v.const.shape)), []), v)
            else:
                first = seen.setdefault(key, v)
            if first is v:
                continue
            for node, idx in list(v.uses):
                node.set_input(idx, first)
            merged += 1
        return merged


def _equal_large(kept: list, v):
    """The first of ``kept`` whose bytes are ``v``'s (``v`` itself, appended, where none is)."""
    t = v.const
    if t.device.type == "meta" or not t.is_contiguous():
        return v
    raw = t.reshape(-1).view(torch.uint8)
    n = min(SAMPLED, raw.numel())
    picks = torch.arange(n) * (raw.numel() - 1) // max(n - 1, 1)
    sample = raw[picks]
    for other in kept:
        o = other.const.reshape(-1).view(torch.uint8)
        if torch.equal(o[picks], sample) and torch.equal(o, raw):
            return other
    kept.append(v)
    return v
