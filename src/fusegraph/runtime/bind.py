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
A model with symbolic input dims binds its kernels once for every shape (``bind_kernels``),
and the calls that write into the arena write the views of each run's frame
(``frame_outputs``; ``frames.py`` plans per bucket of shapes).
Nothing here generates code or runs a kernel.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..errors import PlanError
from ..ir import Graph, Node, Value, is_broadcast
from ..ops import opdef_for
from ..ops.registry import NodeContext, kernel_writes_out, view_input
from ..ops.run_limits import NO_LIMITS, RunLimits
from .run_control import RunControl
from .arena import Arena
from .backends import Backend, Decline
from .layout_probe import probe_strides
from .subgraph import subgraph_factory


FRAME_OUTPUTS = ("frame",)     # NodeCall.out of a call writing into the run's frame views (``frames.py``)


@dataclass
class NodeCall:
    index: int                                  # position in the execution order
    node: Node
    kernel: Callable
    out: tuple[torch.Tensor, ...] | None = None  # arena views written with out=
    guard: bool = False
    args: list[Value] | None = None             # the values the kernel reads, when not the node's inputs
    inplace_input: int | None = None            # the input whose planned bytes the output takes over

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
    control: RunControl | None = None      # the stop flag control-flow bodies read
    limits: RunLimits = NO_LIMITS          # the run-time caps the kernels were built with

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
        call = _call(i, node, opdef, backend, device, kept, _inplace_input(node, slots, kinds), declined,
                     control, limits)
        kernel = call.kernel
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
    return Binding(calls, arena, not_writable, dense_constants(graph), dict(strides or {}), backend, declined,
                   control, limits)


def _call(i: int, node: Node, opdef, backend: Backend, device, kept: bool, inplace_input: int | None,
          declined: list[dict], control: RunControl | None, limits: RunLimits) -> NodeCall:
    """The node's call: its kernel from ``backend`` (the portable one where the backend
    declines: the reason goes to ``declined``), built with the run-time caps ``limits``
    (control-flow bodies stop when ``control`` says so), and the inputs it reads at run time."""
    ctx = NodeContext(node, device, kept, subgraph_factory(device, control, limits), limits)
    ctx.inplace_input = inplace_input
    kernel = backend.kernel(ctx, opdef)
    if isinstance(kernel, Decline):
        declined.append({"node": node.name, "op": node.op_type, "family": kernel.family, "reason": kernel.reason})
        kernel = backend.portable(ctx, opdef)
    for d in backend.tried(node):                  # families the backend tried before this kernel
        declined.append({"node": node.name, "op": node.op_type, "family": d.family, "reason": d.reason})
    call = NodeCall(i, node, kernel, inplace_input=inplace_input)
    reads = getattr(kernel, "reads", None)        # the inputs the kernel reads at run time
    if reads is not None:
        call.args = [node.inputs[j] for j in reads]
    return call


def bind_kernels(graph: Graph, plan, device: str | torch.device, backend: Backend,
                 control: RunControl | None = None, limits: RunLimits = NO_LIMITS) -> Binding:
    """Every node's kernel, for a model with symbolic input dims (bound once, for every shape)
    and no arena yet: its plans are made per bucket at run time (``frames.py``), and which
    calls write into them is ``frame_outputs``'s to say."""
    backend.bind_start(graph)
    kept = bool(backend.freed_memory_kept)
    declined: list[dict] = []
    order = execution_order(graph, plan.order if plan is not None else None)
    calls = [_call(i, node, opdef_for(node), backend, device, kept, None, declined, control, limits)
             for i, node in enumerate(order)]
    return Binding(calls, None, [], dense_constants(graph), {}, backend, declined, control, limits)


def kernels_again(binding: Binding, device, nodes: set[str]) -> dict[int, Callable]:
    """The kernels of the calls whose node is in ``nodes`` made again by the binding's backend
    (at the thread count of the caller's block: ``Executor`` makes a binding per thread count
    this way), keyed by id(node); a node whose new kernel would not read the same inputs, or
    would pack a weight in a form the backend did not already hold (weights held once), keeps
    its kernel (it is left out)."""
    backend = binding.backend
    kept = bool(backend.freed_memory_kept)
    out: dict[int, Callable] = {}
    for call in binding.calls:
        node = call.node
        if node.name not in nodes:
            continue
        forms = backend.weight_forms()
        new = _call(call.index, node, opdef_for(node), backend, device, kept, call.inplace_input, [],
                    binding.control, binding.limits)
        if backend.weight_forms() != forms:
            backend.drop_weight_forms(forms)
            continue
        if [id(v) for v in new.inputs] != [id(v) for v in call.inputs]:
            continue
        out[id(node)] = new.kernel
    return out


def with_kernels(binding: Binding, kernels: dict[int, Callable]) -> Binding:
    """The binding with the calls of ``kernels`` (id(node) -> kernel) running those kernels:
    the same outputs, guards and arena."""
    return dataclasses.replace(binding, calls=[
        dataclasses.replace(c, kernel=kernels[id(c.node)]) if id(c.node) in kernels else c for c in binding.calls])


def frame_outputs(binding: Binding, slotted: Callable[[Value], bool]) -> list[Value]:
    """Mark the calls that write into the run's frame views: a kernel with ``out=`` whose
    every output has a slot of its own at every shape (``slotted``: a shape known before the
    run, not shape-only work, not a view) gets ``NodeCall.out = FRAME_OUTPUTS`` (the views
    change with the input shapes); a call reading an arena value whose result is not a view
    is guarded (copied when its kernel returned an alias of the arena). Returns the values
    the frames hold views of, in call order."""
    in_arena: set[int] = set()
    values: list[Value] = []
    for call in binding.calls:
        node = call.node
        outs = node.outputs
        if outs and kernel_writes_out(opdef_for(node), call.kernel) and all(slotted(o) for o in outs):
            call.out = FRAME_OUTPUTS
            in_arena.update(id(o) for o in outs)
            values.extend(outs)
        elif any(v is not None and id(v) in in_arena for v in node.inputs):
            src = view_input(node)
            for k, o in enumerate(outs):
                if src is not None and k == 0:
                    in_arena.add(id(o))           # a view of an arena value lives in its slot
                else:
                    call.guard = True
    return values


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
