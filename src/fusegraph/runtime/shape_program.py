"""Every activation's shape at given input shapes, before the run: what a model with symbolic
input dims evaluates once per new input shape to size and place its activations.

``ShapeProgram(graph, calls, memo)`` classifies each node of the run (the calls that are not
shape-only work, ``shape_memo.py``) once, at bind time:

- *determined*: its output shapes follow from its inputs' shapes and from the values of
  inputs known before the run (constants and shape-only values): by the op's rule
  (``ops/shape_rules.py``, microseconds), or, for an op without one, by running its portable
  kernel on ``meta`` tensors (tens of microseconds; tried once at a probe shape when the
  program is built, so an op whose shape needs data is known before the first real run);
- *computed*: its outputs' *values* follow too: a ``Shape`` / ``Size`` of a determined value,
  or a pure node reading only constants and computed values (position ids, masks, the
  ``Gather`` / ``Unsqueeze`` / ``Concat`` arithmetic after a ``Shape`` of an activation that
  builds a reshape target). Its kernel runs once per input shape, here, and its result is
  held in the frame: the nodes that read it are then determined as well (without this, every
  node after the first ``Shape`` of an activation would be dynamic);
- *dynamic*: anything else (a shape read from data, an input that is dynamic, a control-flow
  body): its kernel allocates its result at run time.

``evaluate(input_shapes, memo_values, computed=values)`` then gives ``{id(value): shape}``
for every determined value, walking the nodes in order with plain tuples, and puts the
computed values the run reads into ``values``. The integer arithmetic of a computed node on a
few values (a reshape target, a past's length plus the new tokens') runs on Python ints
(``ops/shape_ints.py``; a tensor is made only for a reader that needs one), and steps of one
op and attributes at the same input shapes call their rule once (a decoder's layers). A rule
that fails at run time (the feeds' shapes do not fit the model) raises ``ValueError`` naming
the node; the caller turns it into an ``InputError``. Nothing here allocates an activation
or runs a kernel on the model's data.
"""
from __future__ import annotations

from operator import is_
from typing import Callable

import torch

from ..ir import Graph, Node, Value
from ..ops import opdef_for
from ..ops.registry import NodeContext
from ..ops.shape_ints import SmallInts, small_kernel
from ..ops.shape_rules import rule_for


class ShapeStep:
    __slots__ = ("node", "ins", "outs", "rule", "reads", "meta", "last", "dense", "read_ids", "twin")

    def __init__(self, node: Node, rule, reads: tuple[int, ...], meta: Callable | None):
        self.node, self.rule, self.reads, self.meta = node, rule, reads, meta
        self.last = None          # (input shapes, values read, output shapes) of the last evaluation
        self.twin = None          # what its rule's result depends on besides its inputs (``_twins``)
        self.ins = tuple(None if v is None else id(v) for v in node.inputs)
        self.outs = tuple(id(o) for o in node.outputs)
        self.dense = None not in self.ins      # no optional input left out
        self.read_ids = tuple(self.ins[i] for i in reads if i < len(self.ins) and self.ins[i] is not None)


class ValueStep:
    """A computed node: ``kernel`` makes its outputs from the values of ``ins`` (its call's
    inputs), or ``shape_of`` reads its one input's shape (``Shape`` / ``Size``)."""
    __slots__ = ("node", "call", "ins", "outs", "kernel", "small", "shape_of", "last", "dense")

    def __init__(self, node: Node, call, shape_of: bool):
        self.node, self.call, self.shape_of = node, call, shape_of
        self.last = None          # (input shapes, input values, output values) of the last evaluation
        inputs = call.inputs if call is not None else node.inputs
        self.ins = tuple(None if v is None else id(v) for v in inputs)
        self.outs = tuple(id(o) for o in node.outputs)
        self.kernel = call.kernel if call is not None else None
        # the op on Python ints where its values are small (``ops/shape_ints.py``); the kernel
        # otherwise, or where the call reads other values than the node's inputs
        same_inputs = call is None or shape_of or (
            len(call.inputs) == len(node.inputs) and all(a is b for a, b in zip(call.inputs, node.inputs)))
        self.small = small_kernel(node) if same_inputs else None
        self.dense = None not in self.ins


SHAPE_READERS = {("", "Shape"), ("", "Size")}


class ShapeProgram:
    def __init__(self, graph: Graph, nodes: list[Node], known_values: set[int], calls: dict | None = None):
        """``nodes``: the run's nodes in order (shape-only work excluded); ``known_values``:
        ids of the values whose tensors are held before the run (shape-only results);
        ``calls``: id(node) -> its bound call, whose kernel a computed node runs (without
        them no node is computed)."""
        self.graph = graph
        self.inputs = [id(v) for v in graph.inputs]
        self.known = set(known_values)
        self.consts = {id(v): v.const for v in graph.constants.values()}
        self.const_shapes = {k: tuple(t.shape) for k, t in self.consts.items()}
        # the constants as the evaluation holds them: a small integer one as Python values
        self.const_values = {k: (SmallInts.of(t) if t is not None else None) or t for k, t in self.consts.items()}
        self.steps: list[ShapeStep | ValueStep] = []
        self.dynamic: dict[str, str] = {}          # node name -> why its outputs are dynamic
        self.computed: set[int] = set()            # ids of computed values
        shaped = set(self.inputs) | set(self.consts) | self.known   # values whose shape is known before the run
        for node in nodes:
            call = calls.get(id(node)) if calls is not None else None
            if call is not None and self._computable(node, call, shaped):
                self.steps.append(ValueStep(node, call, (node.domain, node.op_type) in SHAPE_READERS))
                shaped.update(id(o) for o in node.outputs)
                self.computed.update(id(o) for o in node.outputs)
                continue
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
        _twins(self.steps)
        self._index()

    def _value_known(self, v: Value | None) -> bool:
        return v is None or v.is_const or id(v) in self.known or id(v) in self.computed

    def _computable(self, node: Node, call, shaped: set[int]) -> bool:
        """A pure node that reads only a determined value's shape (``Shape`` / ``Size``), or
        only constants and values known before the run with at least one computed among them
        (what follows from the inputs' shapes alone)."""
        if not opdef_for(node).pure or not node.outputs or any(
                not _tensor_dtype(o) or "container" in o.meta for o in node.outputs):
            return False
        if node.attrs and any(hasattr(a, "nodes") for a in node.attrs.values()):
            return False
        ins = [v for v in call.inputs if v is not None]
        if (node.domain, node.op_type) in SHAPE_READERS:
            return call.args is None and len(ins) == 1 and id(ins[0]) in shaped
        return bool(ins) and all(self._value_known(v) for v in ins) and any(id(v) in self.computed for v in ins)

    @property
    def results(self) -> list[Value]:
        """The computed values the run reads: inputs of the nodes that are not computed, and
        graph outputs."""
        computed_nodes = {id(s.node) for s in self.steps if isinstance(s, ValueStep)}
        out: dict[int, Value] = {}
        for node in self.graph.nodes:
            if id(node) in computed_nodes:
                continue
            for v in node.inputs:
                if v is not None and id(v) in self.computed:
                    out[id(v)] = v
        for v in self.graph.outputs:
            if id(v) in self.computed:
                out[id(v)] = v
        return list(out.values())

    @property
    def computed_nodes(self) -> list[Node]:
        return [s.node for s in self.steps if isinstance(s, ValueStep)]

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
        self.computed -= gone
        self._index()

    def evaluate(self, input_shapes: list[tuple], memo: dict[int, torch.Tensor],
                 probing: bool = False, computed: dict | None = None) -> dict[int, tuple]:
        """Shapes of every determined value (``memo``: the shape-only values' tensors); the
        computed values go into ``computed`` (id -> tensor) where given.

        Only the steps that depend on an input whose shape changed since the last evaluation
        run (``_per_input``); the others' results are the last evaluation's. And each step
        keeps what it read and gave the last time (its inputs' shapes, the very tensors of the
        values it read): a step whose inputs are those again gives its last result without
        running (its rule and kernel are functions of exactly those, and the tensors held for
        a frame are never written). A decoder's next token changes the past's dims only, so
        few steps run again."""
        last = self._last
        changed: set | None = None          # the values whose shape or tensor differs from the last evaluation's
        if not probing and not memo and last is not None and len(input_shapes) == len(last[0]):
            moved = tuple([i for i, (a, b) in enumerate(zip(input_shapes, last[0])) if a != b])
            steps = self._steps_for.get(moved)
            if steps is None:
                steps = self._steps_for[moved] = [self.steps[i] for i in sorted(
                    set().union(*(self._per_input[i] for i in moved)))]
            shapes, values = dict(last[1]), dict(last[2])
            shapes.update(zip(self.inputs, input_shapes))
            changed = {self.inputs[i] for i in moved}
        else:
            steps = self.steps
            shapes = {k: tuple(t.shape) for k, t in memo.items()}
            shapes.update(zip(self.inputs, input_shapes))
            shapes.update(self.const_shapes)
            values = dict(self.const_values)
            values.update(memo)
        self._last = None                   # until this evaluation ends
        get_shape, get_value = shapes.__getitem__, values.__getitem__
        twins: dict[tuple, tuple] = {}      # (twin, input shapes, values read) -> output shapes, this evaluation
        for step in steps:
            if changed is not None and changed.isdisjoint(step.ins):
                continue                    # nothing it reads changed: its last outputs stand
            if step.__class__ is ValueStep:
                if step.shape_of:
                    ins, read = (shapes[step.ins[0]],), ()
                else:
                    ins, read = (), (tuple(map(get_value, step.ins)) if step.dense else
                                     tuple([None if k is None else values[k] for k in step.ins]))
                last = step.last
                if last is not None and last[0] == ins and _same_objects(last[1], read):
                    outs = last[2]
                else:
                    outs = self._compute(step, ins, read)
                    step.last = (ins, read, outs)
                for k, t in zip(step.outs, outs):
                    if changed is not None and values.get(k) is not t:
                        changed.add(k)      # another tensor (the same one: the same shape and values)
                    values[k] = t
                    shapes[k] = tuple(t.shape)
            else:
                ins = tuple(map(get_shape, step.ins)) if step.dense else \
                    tuple([None if k is None else shapes[k] for k in step.ins])
                read = tuple(map(get_value, step.read_ids)) if step.read_ids else ()
                last = step.last
                if not probing and last is not None and last[0] == ins and \
                        (not read or _same_objects(last[1], read)):
                    outs = last[2]
                elif step.twin is not None and not probing:
                    key = (step.twin, ins, tuple(map(id, read)))
                    outs = twins.get(key)
                    if outs is None:
                        outs = twins[key] = self._shapes_of(step, ins, values, probing)
                    step.last = (ins, read, outs)
                else:
                    outs = self._shapes_of(step, ins, values, probing)
                    step.last = (ins, read, outs)
                if changed is not None:
                    for k, shape in zip(step.outs, outs):
                        if shapes.get(k) != shape:
                            changed.add(k)
                shapes.update(zip(step.outs, outs))
        if computed is not None:
            for k in self._result_ids:
                computed[k] = _tensor(values[k])
        if not probing and not memo:
            self._last = (tuple(input_shapes), shapes, values)
        return shapes

    def _index(self) -> None:
        """``_per_input[i]``: the positions of the steps that depend on graph input ``i``'s
        shape, directly or through other steps (a step on constants alone depends on none)."""
        position = {k: i for i, k in enumerate(self.inputs)}
        depends: dict[int, frozenset] = {}
        self._per_input: list[list[int]] = [[] for _ in self.inputs]
        for idx, step in enumerate(self.steps):
            on: set[int] = set()
            for k in step.ins:
                if k is None:
                    continue
                if k in position:
                    on.add(position[k])
                else:
                    on.update(depends.get(k, ()))
            frozen = frozenset(on)
            for o in step.outs:
                depends[o] = frozen
            for i in frozen:
                self._per_input[i].append(idx)
        self._steps_for: dict[tuple, list] = {}     # the inputs whose shapes moved -> the steps to visit
        self._last = None
        self._result_ids = [id(v) for v in self.results]

    def _shapes_of(self, step: "ShapeStep", ins: tuple, values: dict, probing: bool) -> tuple:
        vals = [None] * len(ins)
        for i in step.reads:
            if i < len(ins) and step.ins[i] is not None:
                vals[i] = values[step.ins[i]]
        try:
            outs = step.rule(step.node, list(ins), vals) if step.rule is not None else None
            if outs is None:
                try:
                    outs = self._meta(step, list(ins), values)
                except Exception:
                    if probing:             # at a valid probe shape: the kernel needs data
                        raise _MetaFailed(step) from None
                    raise
            return tuple(tuple(map(int, s)) for s in outs)
        except (ValueError, IndexError, KeyError, TypeError, RuntimeError, ZeroDivisionError) as exc:
            n = step.node
            given = ", ".join("_" if s is None else str(list(s)) for s in ins)
            raise ValueError(f"node {n.name!r} ({n.op_type}) cannot take inputs of shapes ({given}): "
                             f"{type(exc).__name__}: {exc}") from None

    @staticmethod
    def _compute(step: ValueStep, ins: tuple, read: tuple) -> tuple:
        """The step's outputs: on Python ints where its op has a function there and its
        operands are small (a result equal to the last one is the last one's objects, so that
        the steps after it see nothing changed), else by its kernel."""
        node = step.node
        try:
            if step.shape_of:
                return step.small(ins[0])
            if step.small is not None:
                args = _small_args(read)
                got = step.small(*args) if args is not None else None
                if got is not None:
                    last = step.last
                    if last is not None and all(a.same(b) for a, b in zip(got, last[2])):
                        return last[2]
                    return got
            got = step.kernel(*[_tensor(v) for v in read])
            outs = tuple(got) if isinstance(got, (tuple, list)) else (got,)
        except (ValueError, IndexError, KeyError, TypeError, RuntimeError, ZeroDivisionError) as exc:
            raise ValueError(f"node {node.name!r} ({node.op_type}) cannot compute its value at these shapes: "
                             f"{type(exc).__name__}: {exc}") from None
        return outs

    def _meta(self, step: ShapeStep, ins: list, values: dict) -> list[tuple]:
        meta = step.meta or _meta_kernel(step.node)
        args = []
        for k, s, v in zip(step.ins, ins, step.node.inputs):
            if k is None:
                args.append(None)
            elif k in values:                       # constants and shape-only values, as they are
                args.append(_tensor(values[k]))
            else:
                args.append(torch.empty(s, dtype=v.dtype.to_torch(), device="meta"))
        with torch.device("meta"):
            out = meta(*args)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        return [tuple(t.shape) for t in outs]


def _twins(steps: list) -> None:
    """Mark the steps whose rule gives what another step's gives at the same input shapes and
    values read: the same rule on nodes of one op, version, arity and attributes (the rules
    read nothing else of a node). A decoder's layers repeat their shapes: one rule call each."""
    by_signature: dict[tuple, list] = {}
    for step in steps:
        if step.__class__ is ShapeStep and step.rule is not None:
            node = step.node
            attrs = _frozen(node.attrs)
            if attrs is not None:
                signature = (step.rule, node.domain, node.op_type, node.version, len(node.inputs),
                             len(node.outputs), attrs)
                by_signature.setdefault(signature, []).append(step)
    for signature, group in by_signature.items():
        for step in group:
            step.twin = signature if len(group) > 1 else None


def _frozen(attrs: dict) -> tuple | None:
    """The attributes as a hashable tuple (None: one is a tensor or a graph)."""
    def freeze(v):
        if v is None or isinstance(v, (bool, int, float, str, bytes)):
            return v
        if isinstance(v, (list, tuple)):
            items = tuple(freeze(x) for x in v)
            return None if any(x is None and y is not None for x, y in zip(items, v)) else items
        return None
    items = []
    for k in sorted(attrs):
        f = freeze(attrs[k])
        if f is None and attrs[k] is not None:
            return None
        items.append((k, f))
    return tuple(items)


def _tensor(v):
    """A value as the kernels take it: a torch tensor (``SmallInts`` make theirs once)."""
    return v.tensor() if v.__class__ is SmallInts else v


def _small_args(read: tuple) -> list | None:
    """The operands as ``SmallInts`` (None: one is a tensor too large or not of integers)."""
    args = []
    for v in read:
        if v is not None and v.__class__ is not SmallInts:
            v = SmallInts.of(v)
            if v is None:
                return None
        args.append(v)
    return args


def _same_objects(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(map(is_, a, b))


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
