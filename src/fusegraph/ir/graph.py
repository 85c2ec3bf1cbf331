"""``Graph``: an ordered list of nodes over values, with inputs, outputs and constants.

The node list is kept in a valid topological order; passes insert new nodes next to the
nodes they replace (``before=``) and remove nodes through ``remove``, which keeps use-def
links straight. Names are unique within a graph; ``fresh_name`` makes new ones.

A graph can be the body of a node (an ``ir.Graph`` attribute: If branches, Loop and Scan
bodies). Values of the enclosing graph that a body reads are its ``captures``: placeholder
values of the body, bound positionally to the owning node's trailing (implicit) inputs, so
use-def, liveness and ordering in the enclosing graph see every outer read (``subgraphs.py``).
"""
from __future__ import annotations

import itertools
from typing import Any, Iterable, Iterator

from .dtype import DType
from .nodes import Node, Value
from .shape import Shape


class Graph:
    def __init__(self, name: str = "main", opset: dict[str, int] | None = None):
        self.name = name
        self.opset: dict[str, int] = dict(opset or {"": 17})
        self.inputs: list[Value] = []
        self.outputs: list[Value] = []
        self.nodes: list[Node] = []
        self.constants: dict[str, Value] = {}
        self.captures: list[Value] = []   # outer-scope values a body reads (see module doc)
        self.meta: dict[str, Any] = {}
        self._names: set[str] = set()
        self._node_names: set[str] = set()
        self._node_suffix: dict[str, int] = {}   # name -> the last k of a ``name_k`` claimed
        self._hint = 0                           # the last position ``_index`` found
        self._counter = itertools.count()

    # ----- names -------------------------------------------------------------------------
    def fresh_name(self, prefix: str = "t") -> str:
        prefix = prefix or "t"
        if prefix not in self._names:
            self._names.add(prefix)
            return prefix
        while True:
            name = f"{prefix}_{next(self._counter)}"
            if name not in self._names:
                self._names.add(name)
                return name

    def _claim(self, name: str) -> str:
        if name in self._names:
            return self.fresh_name(name)
        self._names.add(name)
        return name

    def _claim_node_name(self, name: str) -> str:
        """``name``, else ``name_k`` for the first free k. Names are never given back, so the
        search resumes where the last one for ``name`` stopped: a rule that emits thousands of
        nodes of one name claims each in constant time, not in time growing with the count."""
        if name not in self._node_names:
            self._node_names.add(name)
            return name
        k = self._node_suffix.get(name, 0)
        while True:
            k += 1
            candidate = f"{name}_{k}"
            if candidate not in self._node_names:
                break
        self._node_suffix[name] = k
        self._node_names.add(candidate)
        return candidate

    # ----- values --------------------------------------------------------------------------
    def add_input(self, name: str, dtype: DType, shape: Shape) -> Value:
        v = Value(self._claim(name), dtype, shape)
        v.graph = self
        self.inputs.append(v)
        return v

    def add_capture(self, name: str, dtype: DType = DType.UNDEFINED, shape: Shape = None) -> Value:
        """A placeholder for an outer-scope value this body reads (bound by position to an
        implicit input of the owning node)."""
        v = Value(self._claim(name), dtype, shape)
        v.graph = self
        self.captures.append(v)
        return v

    def add_constant(self, name: str, tensor) -> Value:
        """Register a constant (initializer); ``tensor`` is a torch tensor."""
        v = Value(self._claim(name), DType.from_torch(tensor.dtype), tuple(tensor.shape), const=tensor)
        v.graph = self
        self.constants[v.name] = v
        return v

    def new_value(self, name: str = "t", dtype: DType = DType.UNDEFINED, shape: Shape = None) -> Value:
        v = Value(self.fresh_name(name), dtype, shape)
        v.graph = self
        return v

    def replace_output(self, old: Value, new: Value) -> None:
        for i, o in enumerate(self.outputs):
            if o is old:
                self.outputs[i] = new

    # ----- nodes ---------------------------------------------------------------------------
    def add_node(self, op_type: str, inputs: Iterable[Value | None], *, outputs: int | list[str] = 1,
                 attrs: dict[str, Any] | None = None, domain: str = "", version: int | None = None,
                 name: str | None = None, before: Node | None = None, after: Node | None = None) -> Node:
        """Create a node, wire it to its inputs, and place it (at the end, or before/after a node).

        ``outputs`` is a count (names are made up) or a list of names. Output values start
        with unknown dtype and shape; run shape inference to fill them.
        """
        base = name or op_type.lower()
        out_names = [f"{base}_out{i}" if isinstance(outputs, int) and outputs > 1 else base
                     for i in range(outputs)] if isinstance(outputs, int) else list(outputs)
        out_values = [self.new_value(n) for n in out_names]
        node = Node(op_type, inputs, out_values, attrs, domain=domain,
                    version=self.opset.get(domain, 1) if version is None else version,
                    name=self._claim_node_name(base))
        node.graph = self
        if before is not None:
            self.nodes.insert(self._index(before), node)
        elif after is not None:
            self.nodes.insert(self._index(after) + 1, node)
        else:
            self.nodes.append(node)
        return node

    def _index(self, node: Node) -> int:
        """Where ``node`` is in ``nodes``: first near the last position asked for (a rewrite
        inserts and removes around the node it is at, so a pass over the graph finds each in
        constant time), then anywhere (nodes compare by identity: a scan in C)."""
        nodes = self.nodes
        hint = self._hint
        lo, hi = max(0, hint - 32), min(len(nodes), hint + 33)
        for start, stop in ((lo, hi), (0, len(nodes))):
            try:
                self._hint = nodes.index(node, start, stop)
                return self._hint
            except ValueError:
                continue
        raise ValueError(f"node {node.name} is not in graph {self.name}")

    def remove(self, node: Node, safe: bool = True) -> None:
        """Take a node out. With ``safe``, refuse when any of its outputs is still used."""
        if safe:
            for out in node.outputs:
                if out.uses or out.is_graph_output:
                    users = ", ".join(n.name for n in out.users) or "graph output"
                    raise ValueError(f"cannot remove {node.name} ({node.op_type}): output %{out.name} "
                                     f"is still used by {users}")
        node.detach()
        self.nodes.pop(self._index(node))
        node.graph = None

    def remove_nodes(self, nodes: Iterable[Node]) -> None:
        """Take several nodes out at once, in one pass over the node list (``remove`` one by
        one costs a scan each). Each output must be unused, or used only by the others."""
        doomed = {id(n): n for n in nodes}
        for node in doomed.values():
            for out in node.outputs:
                if out.is_graph_output or any(id(u) not in doomed for u, _ in out.uses):
                    raise ValueError(f"cannot remove {node.name} ({node.op_type}): output %{out.name} "
                                     f"is still used outside the nodes removed with it")
        for node in doomed.values():
            node.detach()
            node.graph = None
        self.nodes[:] = [n for n in self.nodes if id(n) not in doomed]

    def fold_to_constants(self, node: Node, tensors) -> None:
        """Replace ``node`` by constants: each output Value becomes a constant holding the
        matching torch tensor and keeps its identity (name, uses, graph-output slots)."""
        tensors = list(tensors)
        if len(tensors) != len(node.outputs):
            raise ValueError(f"{node.name}: {len(tensors)} tensors for {len(node.outputs)} outputs")
        node.detach()
        self.nodes.pop(self._index(node))
        node.graph = None
        for out, t in zip(node.outputs, tensors):
            out.producer, out.const = None, t
            out.dtype, out.shape = DType.from_torch(t.dtype), tuple(t.shape)
            self.constants[out.name] = out
        node.outputs = []

    def toposort(self) -> None:
        """Re-sort ``nodes`` topologically, stable with respect to the current order."""
        position = {id(n): i for i, n in enumerate(self.nodes)}
        indegree = {id(n): 0 for n in self.nodes}
        for n in self.nodes:
            for v in n.inputs:
                if v is not None and v.producer is not None and id(v.producer) in indegree:
                    indegree[id(n)] += 1
        import heapq
        ready = [(position[id(n)], n) for n in self.nodes if indegree[id(n)] == 0]
        heapq.heapify(ready)
        order: list[Node] = []
        while ready:
            _, n = heapq.heappop(ready)
            order.append(n)
            for out in n.outputs:
                for user, _ in out.uses:
                    if id(user) in indegree:
                        indegree[id(user)] -= 1
                        if indegree[id(user)] == 0:
                            heapq.heappush(ready, (position[id(user)], user))
        if len(order) != len(self.nodes):
            stuck = [n.name for n in self.nodes if indegree[id(n)] > 0][:5]
            raise ValueError(f"graph {self.name} has a cycle through {stuck}")
        self.nodes = order

    # ----- queries -------------------------------------------------------------------------
    def values(self) -> Iterator[Value]:
        """Every value: captures, inputs, constants, then node outputs in order."""
        yield from self.captures
        yield from self.inputs
        yield from self.constants.values()
        for n in self.nodes:
            yield from n.outputs

    def op_histogram(self) -> dict[str, int]:
        hist: dict[str, int] = {}
        for n in self.nodes:
            hist[n.op_type] = hist.get(n.op_type, 0) + 1
        return dict(sorted(hist.items(), key=lambda kv: (-kv[1], kv[0])))

    def __len__(self) -> int:
        return len(self.nodes)

    def __str__(self) -> str:
        from .printer import format_graph
        return format_graph(self)

    def verify(self, infer=None) -> None:
        """Check invariants; ``infer(node)`` (from the op registry) also checks types."""
        from .verify import verify_graph
        verify_graph(self, infer)


def is_broadcast(t) -> bool:
    """A tensor that repeats elements through a zero stride: how constant folding keeps a
    one-value fill too large to materialise (``passes/fold.py``); the runtime materialises it
    once when binding, and the artifact stores its base only."""
    return any(st == 0 and n > 1 for st, n in zip(t.stride(), t.shape))
