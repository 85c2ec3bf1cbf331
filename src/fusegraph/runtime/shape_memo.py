"""Shape-only work done once per input shape: which nodes of a run depend on nothing but the
inputs' shapes, and the generated code that remembers their results.

A model exported with dynamic axes computes its position ids, masks' shapes and reshape
targets at run time: ``Shape`` / ``Size`` of an input, then ``Gather``, ``Unsqueeze``,
``Concat``, ``Range``, ``Expand``, ``Where`` … of those and of constants (BERT: 49 of its 74
kernels, GPT-2: 34 of 59). Their values are the same on every run with the same input
shapes, so the generated ``run`` looks the input shapes up in a per-model memo and runs those
nodes only on a miss (``_memo_fill``), like TensorRT evaluates shape tensors once per
optimisation profile. Each node costs only microseconds alone, but tens of them inside a run,
after the big products have pushed the interpreter's own code and data out of the caches.

A node is shape-only when it is pure (registry) and either is ``Shape`` / ``Size`` of a graph
input, a constant or a shape-only value, or reads only constants and shape-only values with
at least one of the latter. Such a node runs without its planned arena buffer (its result
must outlive the run); its slot stays unused. An output sharing memory with a remembered
value is copied before it is handed out (``Executor.run``). The memo keeps ``MEMO_ENTRIES`` shapes; a
result set over ``MEMO_BYTES`` is recomputed on every run instead of being kept. Stream
plans and debug runs (``hook``) run every node as before.

A model with symbolic input dims runs its frames instead (``frame_runner.py``): there the
shape program computes these values and more (a ``Shape`` of an activation and what follows
from it) once per input shape, and a ``ShapeMemo`` with no calls carries its computed nodes
and values (``computed``, ``computed_results``) to the code generator.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..ir import Graph, Node, Value
from ..ops.registry import opdef_for
from .bind import NodeCall
from .shape_functions import shape_function, shape_reader

SHAPE_READERS = {("", "Shape"), ("", "Size")}
MEMO_ENTRIES = 64
MEMO_BYTES = 16 << 20


@dataclass
class ShapeMemo:
    calls: list[NodeCall]     # shape-only calls, in order, without arena buffers
    results: list[Value]      # shape-only values the rest of the run or the caller reads
    computed: list[Node] = field(default_factory=list)        # nodes the frame computes (``shape_program.py``)
    computed_results: list[Value] = field(default_factory=list)   # their values the run reads

    @property
    def held(self) -> list[Value]:
        """The values a frame holds, in its order: the shape-only results, then the computed."""
        return list(self.results) + list(self.computed_results)

    def skipped(self) -> set[int]:
        """ids of the nodes the run body leaves out (their values come from the frame)."""
        return {id(c.node) for c in self.calls} | {id(n) for n in self.computed}


def shape_only_calls(graph: Graph, calls: list[NodeCall]) -> ShapeMemo | None:
    """The shape-only work of ``calls``, or None when there is none. The calls come back
    without their arena buffers (``out``): a remembered result must not live where later
    nodes write. A ``Shape`` / ``Size`` of a value made in the run whose shape follows from
    the input shapes and shape-only values (``shape_functions.py``) is computed from their
    shapes instead: its call reads those values (``NodeCall.args``)."""
    shape_only: set[int] = set()
    memo: list[NodeCall] = []
    inputs = {id(v) for v in graph.inputs}
    fns: dict = {}

    def leaf_ok(v):
        return id(v) in inputs or id(v) in shape_only
    for call in calls:
        node = call.node
        ins = [v for v in node.inputs if v is not None]
        if not opdef_for(node).pure:     # every bound node has its registry entry
            continue
        known = [v.is_const or id(v) in shape_only for v in ins]
        reads_shape = (node.domain, node.op_type) in SHAPE_READERS and ins and \
            (known[0] or any(ins[0] is v for v in graph.inputs))
        if reads_shape or (ins and all(known) and any(id(v) in shape_only for v in ins)):
            memo.append(call)
            shape_only.update(id(o) for o in node.outputs)
        elif (node.domain, node.op_type) in SHAPE_READERS and ins:
            found = shape_function(graph, ins[0], leaf_ok, fns)
            if found is not None:
                fn, leaves = found
                memo.append(replace(call, kernel=shape_reader(node, fn, leaves), args=leaves))
                shape_only.add(id(node.outputs[0]))
    if not memo:
        return None
    memo = [replace(c, out=None, guard=False) for c in memo]
    memo_ids = {id(c.node) for c in memo}
    needed: dict[int, Value] = {}
    for call in calls:
        if id(call.node) not in memo_ids:
            for v in call.node.inputs:
                if v is not None and id(v) in shape_only:
                    needed[id(v)] = v
    for v in graph.outputs:
        if id(v) in shape_only:
            needed[id(v)] = v
    if not needed:
        return None
    return ShapeMemo(memo, list(needed.values()))


def memo_prologue(params: list[str], results: list[str]) -> list[str]:
    """The lines at the top of ``run``: the shape-only results for these input shapes."""
    key = "(" + "".join(f"{p}.shape, " for p in params) + ")"
    return [f"_m = _MEMO.get({key})",
            "if _m is None:",
            f"    _m = _memo_fill({', '.join(params + [key])})",
            f"{', '.join(results)}, = _m"]


def fill_epilogue(results: list[str]) -> list[str]:
    """The lines that end ``_memo_fill`` (before it returns ``results``): remember them, unless
    the memo is full (it then starts over) or they are too large to keep."""
    return [f"_r = ({', '.join(results)},)",
            "if sum(t.numel() * t.element_size() for t in _r if hasattr(t, 'element_size')) <= _MEMO_BYTES:",
            "    if len(_MEMO) >= _MEMO_ENTRIES:",
            "        _MEMO.clear()",
            "        _MEMO_STORAGES.clear()",
            "    _MEMO[_key] = _r",
            "    _MEMO_STORAGES.update(t.untyped_storage().data_ptr() for t in _r if hasattr(t, 'untyped_storage'))"]


def memo_globals() -> dict:
    """A fresh memo (one per generated module), its bounds, and the storages of the tensors it
    holds (``_MEMO_STORAGES``: the executor copies an output that shares one, so a caller can
    never write into a remembered value)."""
    return {"_MEMO": {}, "_MEMO_ENTRIES": MEMO_ENTRIES, "_MEMO_BYTES": MEMO_BYTES, "_MEMO_STORAGES": set()}
