"""Script segments rebuilt from a stored layout: what a loaded artifact runs instead of
forming segments again (``segments.py``), so a load compiles nothing.

``layout(lowered)`` is the stored form: the node names of each segment, in order.
``from_layout`` takes it back on the same torch build and CPU (the artifact only hands it
over then), for one function's calls (a stream's piece: entries naming none of its nodes
belong to another piece): each entry must name consecutive calls inside one run that
``form_segments`` itself could have chosen (every node expressible, no cut the bridge needs
crossed), or it is dropped with the reason (those nodes run their own kernels). A segment's
TorchScript graph is built (text) at load but compiled at its first call, on copies of that
call's inputs (``GraphKernel(lazy=True)``), and that first result is checked against the same
graph run unfused (a file naming a run the bridge computes wrongly gets the unfused graph).
"""
from __future__ import annotations

from ....ir import Graph
from .onednn_graph import GraphKernel
from .segments import MIN_NODES, SegmentCall, SegmentNode, Segments, _candidates, _edges, _emit_run, splice


def layout(lowered) -> list[list[str]]:
    return [[n.name for n in c.node.nodes] for c in lowered.calls if isinstance(c, SegmentCall)]


def from_layout(graph: Graph, calls: list, binding, stored: list, readers: list | None = None,
                exact: bool = True) -> Segments:
    readers = calls if readers is None else readers
    result = Segments(list(calls))
    position = {c.node.name: i for i, c in enumerate(calls)}
    run_of = {id(c.node): r for r, run in enumerate(_candidates(calls)) for c in run}
    taken: set[int] = set()
    replace: dict[int, SegmentCall] = {}
    for names in stored:
        if isinstance(names, list) and names and not any(isinstance(n, str) and n in position for n in names):
            continue         # another piece's segment
        ok = (isinstance(names, list) and len(names) >= MIN_NODES and all(isinstance(n, str) and n in position
                                                                         for n in names))
        first = position[names[0]] if ok else -1
        ok = ok and [position[n] for n in names] == list(range(first, first + len(names))) \
            and not taken & set(range(first, first + len(names))) \
            and len({run_of.get(id(calls[i].node), -1 - i) for i in range(first, first + len(names))}) == 1
        if not ok:
            result.dropped.append({"nodes": len(names) if isinstance(names, list) else 0, "first": "?", "split": False,
                                   "reason": "the stored segment does not name consecutive calls of this model"})
            continue
        run = calls[first:first + len(names)]
        b, value_names, done = _emit_run(run, binding, exact)
        inputs, outputs = _edges(graph, run, readers)
        if len(done) != len(run) or not outputs:
            result.dropped.append({"nodes": len(run), "first": names[0], "split": False,
                                   "reason": "the stored segment is not one this build expresses"})
            continue
        order = {value_names[id(v)]: i for i, v in enumerate(inputs)}
        b.inputs = sorted(b.inputs, key=lambda n: order[n])
        ir = b.source([value_names[id(o)] for o in outputs])
        nodes = [c.node for c in run]
        label = f"segment {nodes[0].name} .. {nodes[-1].name} ({len(nodes)} nodes)"
        kernel = GraphKernel(label, ir, b.constants, None, partitions=None, lazy=True)
        taken |= set(range(first, first + len(names)))
        result.made.append({"name": label, "nodes": len(nodes), "inputs": len(inputs), "outputs": len(outputs),
                            "partitions": None})
        replace[id(nodes[0])] = SegmentCall(run[0].index, SegmentNode(label, nodes, inputs, outputs), kernel)
    return splice(calls, replace, result)
