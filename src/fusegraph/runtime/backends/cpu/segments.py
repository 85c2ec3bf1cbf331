"""Script segments: runs of consecutive nodes executed as one TorchScript graph on CPU.

Calling a kernel from the generated Python code costs a few microseconds (the call, the
wrapper, the partition's own entry); a ShuffleNet runs ~80 of them per millisecond of work.
A segment is a maximal run of consecutive calls (execution order, of one function or of one
piece of a stream's function between its events, ``runtime/stream_lowering.py``; no
shape-only work) whose every node has an emitter (``script_ir.py``) and static shapes:
their IR goes into one TorchScript graph, compiled with the oneDNN Graph fuser on
(``onednn_graph.GraphKernel``), and the generated code calls it once (ShuffleNet:
1.65 -> 1.31 ms at 2 threads, the same kernels).

Binding a segment (``form_segments``):
- the per-node code runs once on random inputs (a probe, through the debug hook), which gives
  every segment its example inputs with the exact sizes and strides the run will pass (the
  compiled graph is specialised on them) and the per-node results;
- the segment compiles on those inputs and its first fused run must reproduce the per-node
  results (fp32: rtol 1e-4, atol 1e-5 of the output's scale), or it is dropped and its nodes
  keep their kernels (``Segments.dropped`` says why); a run the bridge fails on or computes
  wrongly is tried again in halves, and a run ends after a partition anchor whose output
  feeds a post-op and another op (``ANCHORS``: a bridge bug);
- its inputs are the non-constant values its nodes read from outside, its outputs the values
  read after it (later calls, graph outputs, ``external`` values); constants become graph
  constants. Its intermediates never reach the arena: the TorchScript allocator holds them
  (with malloc keeping freed memory, the same pages run after run), so their planned slots
  stay unused and each node is listed as not writable into the arena.
Only for CPU runs of graphs whose inputs all have static shapes; debug runs (``hook``) run
node by node (a debug run compiles the per-node kernels of
the segments' nodes when it first needs them). No pass logic; the ops' emitters know the ops.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from ....ir import Graph, Value
from . import onednn_graph
from .onednn_graph import GraphKernel, close
from ....ops.registry import NodeContext
from .script_ir import ScriptBuilder, emitter_for
from ...bind import Binding, NodeCall

MIN_NODES = 2


@dataclass
class SegmentNode:
    """What the generated code and error messages see of a segment (quacks like a ``Node``)."""
    name: str
    nodes: list
    inputs: list[Value]
    outputs: list[Value]
    op_type: str = "ScriptSegment"
    domain: str = "fusegraph"


@dataclass
class SegmentCall:
    """A segment in place of its nodes' calls (quacks like ``bind.NodeCall``)."""
    index: int
    node: SegmentNode
    kernel: Callable
    out: None = None
    guard: bool = True          # an output may be a view of an input that lives in the arena

    @property
    def inputs(self) -> list[Value]:
        return list(self.node.inputs)


@dataclass
class Segments:
    calls: list                                              # NodeCalls and SegmentCalls, in order
    made: list[dict] = field(default_factory=list)           # {name, nodes, inputs, outputs, partitions}
    dropped: list[dict] = field(default_factory=list)        # {nodes, first, reason, split}
    not_writable: list[dict] = field(default_factory=list)   # {node, op, bytes}: arena slots left unused


def _static(v: Value) -> bool:
    return v.shape is not None and all(isinstance(d, int) for d in v.shape)


def available(graph: Graph, device: str) -> bool:
    return onednn_graph.AVAILABLE and device == "cpu" and all(_static(v) for v in graph.inputs)


def _emit_run(run: list[NodeCall], binding: Binding,
              exact: bool = True) -> tuple[ScriptBuilder, dict[int, str], list[NodeCall]]:
    """IR for the longest prefix of ``run`` every node of which its emitter expresses."""
    b = ScriptBuilder(exact)
    names: dict[int, str] = {}
    done: list[NodeCall] = []
    for call in run:
        mark = b.mark()
        fresh: list[int] = []
        args = []
        for v in call.node.inputs:
            if v is None:
                args.append(None)
            elif v.is_const:
                args.append(b.constant(binding.dense.get(id(v), v.const)))
            else:
                if id(v) not in names:
                    names[id(v)] = b.input()
                    fresh.append(id(v))
                args.append(names[id(v)])
        outs = emitter_for(call.node.domain, call.node.op_type)(NodeContext(call.node), b, args)
        if outs is None or len(outs) != len(call.node.outputs):
            b.rollback(mark)
            for key in fresh:
                del names[key]
            b.inputs = [n for n in b.inputs if n in names.values()]
            break
        for o, name in zip(call.node.outputs, outs):
            names[id(o)] = name
        done.append(call)
    return b, names, done


# Ops oneDNN Graph may take as the anchor of a partition, and ops it may fuse after one as
# post-ops. Its bridge computes a wrong result when an anchor's output feeds such a post-op and
# another op too (DenseNet's pool or concat -> batch-norm chain + concat: 1e21 off), so a segment ends
# after such an anchor and its output is handed over through the generated code.
ANCHORS = {("fusegraph", "FusedConv"), ("", "MaxPool"), ("", "AveragePool"), ("", "GlobalAveragePool"),
           ("fusegraph", "LinearAct"), ("", "Concat")}
POST_OPS = {("", "Relu"), ("", "Add"), ("", "Sub"), ("", "Mul"), ("", "Div"), ("", "Sigmoid"), ("", "Tanh"),
            ("", "Exp"), ("", "Log"), ("", "Sqrt"), ("", "Abs"), ("", "Neg"), ("", "Erf"), ("", "Reciprocal"),
            ("fusegraph", "ElementwiseChain")}


def _ends_segment(node) -> bool:
    if (node.domain, node.op_type) not in ANCHORS:
        return False
    users = {id(u): u for o in node.outputs for u, _ in o.uses}
    return len(users) > 1 and any((u.domain, u.op_type) in POST_OPS for u in users.values())


def _candidates(calls: list[NodeCall]) -> list[list[NodeCall]]:
    runs, cur = [], []
    for call in calls:
        n = call.node
        ok = (emitter_for(n.domain, n.op_type) is not None and all(_static(o) for o in n.outputs)
              and all(v is None or v.is_const or _static(v) for v in n.inputs))
        if ok:
            cur.append(call)
        if (not ok or _ends_segment(n)) and cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return runs


def _edges(graph: Graph, run: list[NodeCall], calls: list[NodeCall]) -> tuple[list[Value], list[Value]]:
    """The values a run of calls reads from outside it (in first-use order) and the ones it
    hands to the other ``calls``, to the caller or to ``external`` readers (in node order):
    what a segment made of it takes and gives back."""
    inside = {id(c.node) for c in run}
    read_after = {id(v) for c in calls if id(c.node) not in inside for v in c.inputs if v is not None}
    graph_outs = {id(v) for v in graph.outputs}
    inputs, seen, outputs = [], set(), []
    for call in run:
        for v in call.node.inputs:
            if v is not None and not v.is_const and id(v) not in seen and \
                    (v.producer is None or id(v.producer) not in inside):
                seen.add(id(v))
                inputs.append(v)
        outputs += [o for o in call.node.outputs
                    if id(o) in read_after or id(o) in graph_outs or "external" in o.flags]
    return inputs, outputs


def _boundary(graph: Graph, run: list[NodeCall], calls: list[NodeCall]) -> set[int]:
    """ids of a run's edge values (``_edges``): the ones a probe run must keep."""
    inputs, outputs = _edges(graph, run, calls)
    return {id(v) for v in inputs + outputs}


def _examples(values: list[torch.Tensor]):
    """Example inputs for ``GraphKernel``: the probe's values for the first compile (whose
    result is checked), then zeros of the same sizes, strides and dtypes (a copy compiled for
    another thread count), so the segment does not keep the probe's tensors alive."""
    first = [values]
    layouts = [(tuple(t.shape), tuple(t.stride()), t.dtype) for t in values]

    def make():
        if first:
            return first.pop()
        return [torch.empty_strided(size, stride, dtype=dtype).zero_() for size, stride, dtype in layouts]
    return make


def _random_feeds(graph: Graph) -> tuple[dict[int, torch.Tensor], list[torch.Tensor]]:
    """Random inputs for the probe run (floats normal, the rest zero), and id(value) -> tensor."""
    gen = torch.Generator().manual_seed(0)
    feeds = []
    for v in graph.inputs:
        dt = v.dtype.to_torch()
        shape = tuple(v.shape)
        feeds.append(torch.randn(shape, generator=gen).to(dt) if dt.is_floating_point else torch.zeros(shape, dtype=dt))
    return {id(v): t for v, t in zip(graph.inputs, feeds)}, feeds


def form_segments(graph: Graph, calls: list[NodeCall], binding: Binding,
                  probe: Callable[[list, Callable], object], readers: list | None = None,
                  exact: bool = True) -> Segments:
    """``calls`` with runs of scriptable nodes replaced by ``SegmentCall``s. ``probe(feeds,
    hook)`` runs the per-node code once with a debug hook (see ``codegen``). ``readers``: every
    call whose inputs a segment must hand over (default ``calls``; a stream's piece passes the
    calls of every stream); ``exact``: NaN / Inf as ONNX says (``script_ops``)."""
    readers = calls if readers is None else readers
    runs = [r for r in _candidates(calls) if len(r) >= MIN_NODES]
    result = Segments(list(calls))
    if not runs:
        return result
    values, feeds = _random_feeds(graph)
    by_index = {c.index: c for c in binding.calls}

    def run_probe(wanted: set[int]) -> None:
        """One probe run keeping copies of the ``wanted`` values only (a copy of every value
        of a DenseNet run would stay in malloc's kept memory: +190 MiB of peak RSS)."""
        def capture(i, phase, outs):
            if phase == 1:
                for v, t in zip(by_index[i].node.outputs, outs):
                    if id(v) in wanted and isinstance(t, torch.Tensor):
                        values[id(v)] = t.clone()
        with torch.inference_mode():
            probe(feeds, capture)
    try:
        run_probe(set().union(*(_boundary(graph, r, readers) for r in runs)))
    except Exception as exc:  # noqa: BLE001 - a model that cannot run on random inputs: node by node
        result.dropped.append({"nodes": sum(len(r) for r in runs), "first": runs[0][0].node.name, "split": False,
                               "reason": f"the probe run on random inputs failed: {type(exc).__name__}: {exc}"})
        return result
    replace: dict[int, SegmentCall] = {}
    pending = list(reversed(runs))
    while pending:
        run = pending.pop()
        if len(run) < MIN_NODES:
            continue
        b, names, done = _emit_run(run, binding, exact)
        pending.append(run[max(len(done), 1):])      # what follows the first declining node
        if len(done) < MIN_NODES:
            continue
        missing = _boundary(graph, done, readers) - values.keys()
        if missing:                                  # a part of a run: its own edges, once more
            run_probe(missing)
        seg = _make(graph, readers, done, b, names, values, result)
        if seg is not None:
            replace[id(done[0].node)] = seg
        elif result.dropped[-1]["split"]:           # the bridge failed on it: try each half
            half = len(done) // 2
            pending += [done[half:], done[:half]]
    return splice(calls, replace, result)


def splice(calls: list, replace: dict, result: Segments) -> Segments:
    """``result`` with its calls: ``calls`` where each segment of ``replace`` (keyed by
    id(its first node)) stands for its nodes, whose arena slots are listed as left unused."""
    if not replace:
        return result
    skip = {id(n) for seg in replace.values() for n in seg.node.nodes}
    out = []
    for call in calls:
        if id(call.node) in replace:
            out.append(replace[id(call.node)])
        elif id(call.node) not in skip:
            out.append(call)
        if id(call.node) in skip and call.out is not None:
            result.not_writable.append({"node": call.node.name, "op": call.node.op_type,
                                        "bytes": int(sum(t.numel() * t.element_size() for t in call.out))})
    result.calls = out
    return result


def _make(graph, calls, done, b, names, values, result) -> SegmentCall | None:
    nodes = [c.node for c in done]
    inputs, outputs = _edges(graph, done, calls)
    if not outputs:       # nothing after it reads its results (dead code the passes left)
        result.dropped.append({"nodes": len(nodes), "first": nodes[0].name, "split": False,
                               "reason": "no value of it is read afterwards"})
        return None
    order = {names[id(v)]: i for i, v in enumerate(inputs)}
    b.inputs = sorted(b.inputs, key=lambda n: order[n])
    ir = b.source([names[id(o)] for o in outputs])
    examples = [values[id(v)] for v in inputs]
    label = f"segment {nodes[0].name} .. {nodes[-1].name} ({len(nodes)} nodes)"
    kernel = GraphKernel(label, ir, b.constants, _examples(examples), partitions=None)
    if not kernel.ok:
        result.dropped.append({"nodes": len(nodes), "first": nodes[0].name, "reason": kernel.reason,
                               "split": True})
        return None
    got = kernel.example_output          # its first fused run, on the probe's values
    got = got if isinstance(got, tuple) else (got,)
    bad = [o.name for o, t in zip(outputs, got) if not close(t, values[id(o)])]
    if bad:
        result.dropped.append({"nodes": len(nodes), "first": nodes[0].name, "split": True,
                               "reason": f"differs from the per-node kernels on {', '.join(bad[:3])}"})
        return None
    result.made.append({"name": label, "nodes": len(nodes), "inputs": len(inputs), "outputs": len(outputs),
                        "partitions": kernel.partitions})
    seg_node = SegmentNode(label, nodes, inputs, outputs)
    return SegmentCall(done[0].index, seg_node, kernel)
