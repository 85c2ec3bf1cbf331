"""Every activation's shape at given input shapes, before the run: what a model with symbolic
input dims evaluates once per new input shape to size and place its activations.

``ShapeProgram(graph, calls, memo)`` classifies each node of the run (the calls that are not
shape-only work, ``shape_memo.py``) once, at bind time:

- *determined*: its output shapes follow from its inputs' shapes and from the values of
  inputs known before the run (constants and shape-only values): by the op's rule
  (``ops/shape_rules.py``, microseconds), or, for an op without one, by running its portable
  kernel on ``meta`` tensors (tens of microseconds; tried once at a probe shape when the
  program is built, so an op whose shape needs data is known before the first real run);
- *dynamic*: anything else (a shape read from data, an input that is dynamic, a control-flow
  body): its kernel allocates its result at run time.

``evaluate(input_shapes, memo_values)`` then gives ``{id(value): shape}`` for every
determined value, walking the nodes in order with plain tuples. A rule that fails at run
time (the feeds' shapes do not fit the model) raises ``ValueError`` naming the node; the
caller turns it into an ``InputError``. Nothing here allocates an activation or runs a
kernel on data.
"""
from __future__ import annotations

from typing import Callable

import torch

from ..ir import Graph, Node, Value
from ..ops import opdef_for
from ..ops.registry import NodeContext
from ..ops.shape_rules import rule_for


class ShapeStep:
    __slots__ = ("node", "ins", "outs", "rule", "reads", "meta")

    def __init__(self, node: Node, rule, reads: tuple[int, ...], meta: Callable | None):
        self.node, self.rule, self.reads, self.meta = node, rule, reads, meta
        self.ins = tuple(None if v is None else id(v) for v in node.inputs)
        self.outs = tuple(id(o) for o in node.outputs)


class ShapeProgram:
    def __init__(self, graph: Graph, nodes: list[Node], known_values: set[int]):
        """``nodes``: the run's nodes in order (shape-only work excluded); ``known_values``:
        ids of the values whose tensors are held before the run (shape-only results)."""
        self.graph = graph
        self.inputs = [id(v) for v in graph.inputs]
        self.known = set(known_values)
        self.consts = {id(v): v.const for v in graph.constants.values()}
        self.steps: list[ShapeStep] = []
        self.dynamic: dict[str, str] = {}          # node name -> why its outputs are dynamic
        shaped = set(self.inputs) | set(self.consts) | self.known   # values whose shape is known before the run
        for node in nodes:
            why = self._why_not(node, shaped)
            if why is not None:
                self.dynamic[node.name] = why
                continue
            found = rule_for(node)
            rule, reads = found if found is not None else (None, None)
            reads = tuple(reads(node)) if reads is not None else ()
            meta = None if rule is not None else _meta_kernel(node)
            if rule is None and meta is None:
                self.dynamic[node.name] = "no shape rule and its kernel does not run on meta tensors"
                continue
            if any(not self._value_known(node.inputs[i]) for i in reads if i < len(node.inputs)):
                self.dynamic[node.name] = "its output shape depends on the values of a run-time input"
                continue
            self.steps.append(ShapeStep(node, rule, reads, meta))
            shaped.update(id(o) for o in node.outputs)
        self.determined = shaped

    def _value_known(self, v: Value | None) -> bool:
        return v is None or v.is_const or id(v) in self.known

    def _why_not(self, node: Node, shaped: set[int]) -> str | None:
        if node.attrs and any(hasattr(a, "nodes") for a in node.attrs.values()):
            return "it runs a control-flow body"
        if any("container" in o.meta for o in node.outputs):
            return "it makes a sequence or an optional"
        if any(not _tensor_dtype(o) for o in node.outputs):
            return "an output has no tensor dtype"
        for v in node.inputs:
            if v is not None and not v.is_const and id(v) not in shaped:
                return f"input %{v.name} has a run-time shape"
        return None

    def probe(self, input_shapes: list[tuple], memo: dict[int, torch.Tensor]) -> None:
        """Evaluate once at a probe shape; a node whose meta run fails there (its kernel needs
        data) becomes dynamic, and so does every node that reads its outputs."""
        while True:
            try:
                self.evaluate(input_shapes, memo, probing=True)
                return
            except _MetaFailed as failed:
                self._drop(failed.step)

    def _drop(self, first: ShapeStep) -> None:
        gone = set(first.outs)
        self.dynamic[first.node.name] = "its kernel needs data to know its output shape"
        kept = []
        for step in self.steps:
            if step is first:
                continue
            if any(k in gone for k in step.ins if k is not None):
                gone.update(step.outs)
                self.dynamic[step.node.name] = "an input has a run-time shape"
                continue
            kept.append(step)
        self.steps = kept
        self.determined -= gone

    def evaluate(self, input_shapes: list[tuple], memo: dict[int, torch.Tensor],
                 probing: bool = False) -> dict[int, tuple]:
        """Shapes of every determined value (``memo``: the shape-only values' tensors)."""
        shapes: dict[int, tuple] = {k: tuple(t.shape) for k, t in memo.items()}
        shapes.update(zip(self.inputs, input_shapes))
        for k, t in self.consts.items():
            shapes[k] = tuple(t.shape)
        values = dict(self.consts)
        values.update(memo)
        for step in self.steps:
            ins = [None if k is None else shapes[k] for k in step.ins]
            vals = [None] * len(ins)
            for i in step.reads:
                if i < len(ins) and step.ins[i] is not None:
                    vals[i] = values[step.ins[i]]
            try:
                outs = step.rule(step.node, ins, vals) if step.rule is not None else None
                if outs is None:
                    try:
                        outs = self._meta(step, ins, values)
                    except Exception:
                        if probing:             # at a valid probe shape: the kernel needs data
                            raise _MetaFailed(step) from None
                        raise
            except (ValueError, IndexError, KeyError, TypeError, RuntimeError, ZeroDivisionError) as exc:
                n = step.node
                given = ", ".join("_" if s is None else str(list(s)) for s in ins)
                raise ValueError(f"node {n.name!r} ({n.op_type}) cannot take inputs of shapes ({given}): "
                                 f"{type(exc).__name__}: {exc}") from None
            for k, s in zip(step.outs, outs):
                shapes[k] = tuple(int(d) for d in s)
        return shapes

    def _meta(self, step: ShapeStep, ins: list, values: dict) -> list[tuple]:
        meta = step.meta or _meta_kernel(step.node)
        args = []
        for k, s, v in zip(step.ins, ins, step.node.inputs):
            if k is None:
                args.append(None)
            elif k in values:                       # constants and shape-only values, as they are
                args.append(values[k])
            else:
                args.append(torch.empty(s, dtype=v.dtype.to_torch(), device="meta"))
        with torch.device("meta"):
            out = meta(*args)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        return [tuple(t.shape) for t in outs]


class _MetaFailed(Exception):
    def __init__(self, step: ShapeStep):
        super().__init__(step.node.name)
        self.step = step


def _tensor_dtype(v: Value) -> bool:
    try:
        return v.dtype is not None and v.dtype.to_torch() is not None
    except (TypeError, ValueError, KeyError):
        return False


def _meta_kernel(node: Node) -> Callable | None:
    """The node's portable kernel, to run on meta tensors (None: it cannot be built alone)."""
    try:
        return opdef_for(node).build(NodeContext(node, "meta"))
    except Exception:  # noqa: BLE001 - a kernel that needs a runtime to build (control flow)
        return None
