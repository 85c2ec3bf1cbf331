"""Bind every node once, at compile time: its kernel (through the op registry) and, under an
arena plan, where its outputs go.

For each node of the execution order a ``NodeCall`` says:
- ``out``: the arena views the kernel writes into with ``out=`` (with the strides the kernel
  gives its results, found by one probe run, ``layout_probe.py``, or given: a loaded
  artifact passes the strides its compile found, ``Binding.strides``) — only when the op is
  ``writes_out``, this kernel has the out form, and every output has a slot of its own
  (planned or in-place, per ``ExecutionPlan.slots``); otherwise the kernel allocates its
  result, and a node whose outputs the planner gave arena bytes is listed as not writable;
- ``guard``: the kernel does not write into the arena but reads a tensor that lives there,
  and the planner did not treat its output as a view; some kernels return a view of their
  input (a ``select``, a same-dtype ``Cast``), which would outlive the input's slot, so the
  generated code copies such a result when it lands in the arena.
Kernels come from the backend (``backends/``): its own, or the op's portable kernel; a
backend's ``Decline`` is kept with its reason (``Binding.declined``, ``report.kernels``).
Constants folded as stride-0 broadcasts are materialised here, once (``Binding.dense``).
Nothing here generates code or runs a kernel.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from ..errors import PlanError
from ..ir import Graph, Node, Value, is_broadcast
from ..ops import opdef_for
from ..ops.registry import NodeContext, kernel_writes_out
from ..ops.run_limits import NO_LIMITS, RunLimits
from .run_control import RunControl
from .arena import Arena
from .backends import Backend, Decline
from .layout_probe import probe_strides
from .subgraph import subgraph_factory


@dataclass
class NodeCall:
    index: int                                  # position in the execution order
    node: Node
    kernel: Callable
    out: tuple[torch.Tensor, ...] | None = None  # arena views written with out=
    guard: bool = False
    args: list[Value] | None = None             # the values the kernel reads, when not the node's inputs

    @property
    def inputs(self) -> list:
        return list(self.node.inputs) if self.args is None else list(self.args)


@dataclass
class Binding:
    calls: list[NodeCall]
    arena: Arena | None = None
    not_writable: list[dict] = field(default_factory=list)   # {node, op, bytes}
    dense: dict[int, torch.Tensor] = field(default_factory=dict)  # id(value) -> broadcast constant materialised
    strides: dict[str, tuple[int, ...]] = field(default_factory=dict)  # probed (or given) arena view strides
    backend: Backend = field(default_factory=Backend)
    declined: list[dict] = field(default_factory=list)   # {node, op, family, reason}

    @property
    def order(self) -> list[Node]:
        return [c.node for c in self.calls]


def execution_order(graph: Graph, names: list[str] | None) -> list[Node]:
    """The graph's nodes in the planned order (the graph order when ``names`` is None)."""
    if names is None:
        return list(graph.nodes)
    by_name = {n.name: n for n in graph.nodes}
    if len(names) != len(by_name) or set(names) != set(by_name):
        missing = sorted(set(by_name) - set(names))[:5]
        extra = sorted(set(names) - set(by_name))[:5]
        raise PlanError(f"{graph.name}: the execution plan does not match the graph's nodes "
                        f"(missing {missing}, unknown {extra})")
    return [by_name[n] for n in names]


def bind(graph: Graph, plan=None, device: str | torch.device = "cpu",
         strides: dict[str, tuple[int, ...]] | None = None, backend: Backend | None = None,
         control: RunControl | None = None, limits: RunLimits = NO_LIMITS) -> Binding:
    """Kernels (from ``backend``, default the portable one) and output placement for ``plan``
    (an ``ExecutionPlan`` or None: no arena); ``strides`` (value name -> strides of its arena
    view) replaces the probe run when given. Kernels are built with the run-time caps
    ``limits``; control-flow bodies stop when ``control`` says so."""
    backend = backend or Backend()
    backend.bind_start(graph)
    kept = bool(backend.freed_memory_kept)
    declined: list[dict] = []
    order = execution_order(graph, plan.order if plan is not None else None)
    use_arena = plan is not None and plan.uses_arena
    arena = Arena(plan.arena_bytes, device) if use_arena else None
    slots = plan.slots if use_arena else {}
    kinds = plan.kinds if plan is not None else {}
    in_arena: set[int] = set()        # ids of values whose tensor may lie in the arena at run time
    calls: list[NodeCall] = []
    not_writable: list[dict] = []
    writing: list[NodeCall] = []
    for i, node in enumerate(order):
        opdef = opdef_for(node)
        ctx = NodeContext(node, device, kept, subgraph_factory(device, control, limits), limits)
        ctx.inplace_input = _inplace_input(node, slots, kinds)
        kernel = backend.kernel(ctx, opdef)
        if isinstance(kernel, Decline):
            declined.append({"node": node.name, "op": node.op_type, "family": kernel.family, "reason": kernel.reason})
            kernel = backend.portable(ctx, opdef)
        for d in backend.tried(node):                  # families the backend tried before this kernel
            declined.append({"node": node.name, "op": node.op_type, "family": d.family, "reason": d.reason})
        call = NodeCall(i, node, kernel)
        reads = getattr(kernel, "reads", None)        # the inputs the kernel reads at run time
        if reads is not None:
            call.args = [node.inputs[j] for j in reads]
        outs = node.outputs
        if arena is not None and outs and kernel_writes_out(opdef, kernel) and all(o.name in slots for o in outs):
            writing.append(call)
            in_arena.update(id(o) for o in outs)
        elif arena is not None:
            planned = [slots[o.name][1] for o in outs if o.name in slots]
            if planned:
                not_writable.append({"node": node.name, "op": node.op_type, "bytes": int(sum(planned))})
            if any(v is not None and id(v) in in_arena for v in node.inputs):
                for o in outs:
                    if kinds.get(o.name) == "view":
                        in_arena.add(id(o))      # the planner kept the source's slot alive for it
                    else:
                        call.guard = True
        calls.append(call)
    if writing:
        wanted = {o.name for c in writing for o in c.node.outputs}
        if strides is None:
            strides = probe_strides(graph, calls, wanted, device)
        written: dict[int, torch.Tensor] = {}  # id(value) -> its arena view
        for call in writing:
            views = []
            for o in call.node.outputs:
                off, size = slots[o.name]
                view = arena.view(off, size, o, strides.get(o.name))
                if kinds.get(o.name) == "inplace":  # same bytes as an input written here: same layout
                    src = next((written[id(v)] for v in call.node.inputs
                                if v is not None and id(v) in written and slots[v.name][0] == off), None)
                    if src is not None and src.stride() != view.stride():
                        view = arena.view(off, size, o, tuple(src.stride()))
                written[id(o)] = view
                views.append(view)
            call.out = tuple(views)
    return Binding(calls, arena, not_writable, dense_constants(graph), dict(strides or {}), backend, declined)


def _inplace_input(node: Node, slots: dict, kinds: dict) -> int | None:
    """The input whose arena bytes the node's first output takes over in place (the plan's
    ``inplace`` kind), or None."""
    o = node.outputs[0] if node.outputs else None
    if o is None or kinds.get(o.name) != "inplace" or o.name not in slots:
        return None
    off = slots[o.name][0]
    for j, v in enumerate(node.inputs):
        if v is not None and v.name in slots and slots[v.name][0] == off:
            return j
    return None


def kernel_summary(binding: Binding) -> dict:
    """``report.kernels``: the backend, how many nodes each kernel implementation runs (a
    oneDNN primitive's implementation name, else "portable"), and the nodes a kernel family
    declined with the reason (they run the op's portable kernel)."""
    impls: dict[str, int] = {}
    for c in binding.calls:
        impl = getattr(c.kernel, "impl", None) or "portable"
        impls[impl] = impls.get(impl, 0) + 1
    return {"backend": binding.backend.name, "implementations": impls, "declined": list(binding.declined)}


def dense_constants(graph: Graph) -> dict[int, torch.Tensor]:
    """Broadcast constants materialised once, so no kernel re-expands them on every run."""
    return {id(v): v.const.contiguous() for v in graph.constants.values()
            if v.const is not None and is_broadcast(v.const)}
