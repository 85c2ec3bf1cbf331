"""The op registry: per (domain, op_type, opset range) the facts every stage needs.

An ``OpDef`` holds the kernel builder, shape/dtype inference, purity, fusion kind, layout
sensitivity, and the facts passes and backends read instead of lists of op names: the
data-movement class (``Movement``), the mixed-precision class with its one-line reason
(``Precision``, applied by ``passes/precision_policy.py``) and the value-range transfer
(``value_range``: how input magnitude bounds bound the outputs, ``ops/value_range.py``).
A consumer takes the ops it needs through a named query (``movement_ops``) at its use site,
where the reason it takes that subset is written.

Kernel builders run once per node at compile time: they read attributes and constant inputs
through a ``NodeContext`` and return a plain callable over torch tensors, so the run loop pays
one call per node. The same torch calls run on CPU and CUDA.

Kernel convention: ``kernel(*inputs)`` receives one torch tensor per node input (``None``
for a missing optional input) and returns a tensor for a one-output node, else a tuple with
one tensor per node output. An op registered with ``writes_out=True`` builds kernels that also
take ``out=`` (a preallocated tensor of the output's shape and dtype, a tuple of them for a
multi-output op, or None) and write the result there, bit for bit what they return without it;
a builder marks a kernel it could only make without that form with ``no_out(kernel)``. Under
``out=``, an input may be the very buffer of ``out`` only when the op also declares in-place
ability (elementwise / broadcast fusion kind or ``inplace`` pairs). ``alias`` lists the
(input, output) pairs whose output is a view of the input's memory (Reshape, Squeeze, ...).

This file holds no op and no pass logic; op families register themselves from their own
modules (``ops/elementwise.py`` and siblings).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import UnsupportedOpError
from ..ir import DType, Node
from ..ir.shape import Shape
from .run_limits import NO_LIMITS, RunLimits


class Movement(str, enum.Enum):
    """What an op that only moves data does with its input's elements (its data-movement
    class); an op that computes new values is ``NONE``. A value of a non-NONE op's output is a
    value of its inputs (or the pad fill, or the same value in another type)."""
    NONE = "none"              # computes new values (the default)
    VIEW = "view"              # the same elements in the same order under another shape (Reshape, Identity)
    PERMUTE = "permute"        # every element once, in another order (Transpose, DepthToSpace)
    SELECT = "select"          # some of the elements, chosen by range or index (Slice, Split, Gather)
    REPLICATE = "replicate"    # elements repeated (Expand, Tile)
    JOIN = "join"              # several inputs' elements side by side (Concat)
    PAD = "pad"                # the input's elements and a fill value (Pad)
    CAST = "cast"              # each element converted to another type, rounded to it (Cast)


class Precision(str, enum.Enum):
    """An op's mixed-precision class (``passes/precision_policy.py`` applies it). An op
    registered with none stays in float32 (``KEEP``, the safe default)."""
    REDUCE = "reduce"          # heavy arithmetic in the reduced type, accumulated in float32 inside
    FOLLOW = "follow"          # exact or rounded once in any float type: follows its inputs' type
    KEEP = "keep"              # numerically sensitive: float32
    ANY = "any"                # reads only a value's shape: no cast either way


class FusionKind(str, enum.Enum):
    ELEMENTWISE = "elementwise"   # out[i] = f(in[i]), same shape
    BROADCAST = "broadcast"       # elementwise with numpy broadcasting
    INJECTIVE = "injective"       # each output element reads one input element (reshape, transpose)
    REDUCE = "reduce"
    OUT_FUSABLE = "out-fusable"   # conv / matmul: elementwise consumers can fuse into it
    OPAQUE = "opaque"


_MISSING = object()


class NodeContext:
    """What a kernel builder or an inference function may see of a node."""

    __slots__ = ("node", "version", "device", "freed_memory_kept", "run_subgraph_factory", "inplace_input",
                 "limits")

    def __init__(self, node: Node, device: str = "cpu", freed_memory_kept: bool = False,
                 run_subgraph_factory: Callable | None = None, limits: RunLimits | None = None):
        self.node = node
        # run-time caps the kernel honours before it allocates (run_limits.py; the runtime's
        # from fg.Config, none where no runtime binds the node)
        self.limits = limits or NO_LIMITS
        # the runtime's body runner maker (runtime/subgraph.py): factory(body, owner name) -> runner;
        # None where no runtime binds the node (folding, inference): control flow then refuses
        self.run_subgraph_factory = run_subgraph_factory
        self.version = node.version
        self.device = str(device)          # where the kernel will run: "cpu", "cuda", "cuda:1" ...
        # the host reuses memory a run frees (the runtime's malloc policy): large fresh outputs are cheap
        self.freed_memory_kept = freed_memory_kept
        # the input whose planned bytes the (first) output takes over in place, when bound with a plan
        self.inplace_input: int | None = None

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def n_inputs(self) -> int:
        return len(self.node.inputs)

    @property
    def n_outputs(self) -> int:
        return len(self.node.outputs)

    def attr(self, name: str, default: Any = _MISSING) -> Any:
        if name in self.node.attrs:
            return self.node.attrs[name]
        if default is _MISSING:
            raise UnsupportedOpError(f"node {self.node.name!r} ({self.node.op_type}) lacks required "
                                     f"attribute {name!r}", node=self.node.name, op_type=self.node.op_type)
        return default

    def has_input(self, i: int) -> bool:
        return i < len(self.node.inputs) and self.node.inputs[i] is not None

    def const(self, i: int):
        """The constant torch tensor feeding input ``i``, or None when it is not constant."""
        return self.node.const_input(i)

    def dtype(self, i: int) -> DType:
        v = self.node.input(i)
        return DType.UNDEFINED if v is None else v.dtype

    def shape(self, i: int) -> Shape:
        v = self.node.input(i)
        return None if v is None else v.shape

    def unsupported(self, reason: str) -> UnsupportedOpError:
        n = self.node
        return UnsupportedOpError(f"node {n.name!r}: {n.op_type} (opset {n.version}) is not supported: "
                                  f"{reason}", node=n.name, op_type=n.op_type)


Builder = Callable[[NodeContext], Callable]
Infer = Callable[[NodeContext], "list[tuple[DType | None, Shape]]"]


@dataclass(frozen=True)
class OpDef:
    op_type: str
    domain: str
    since: int
    build: Builder
    infer: Infer | None = None
    pure: bool = True
    fusion: FusionKind = FusionKind.OPAQUE
    layout_sensitive: bool = False
    foldable: bool = True
    inplace: tuple[tuple[int, int], ...] = field(default=())  # (input, output) pairs a kernel may alias
    writes_out: bool = False   # built kernels accept ``out=`` (see module doc)
    alias: tuple[tuple[int, int], ...] = field(default=())    # (input, output): output views input
    # (ctx, constant inputs) -> the one value every element of the single output holds, or None
    # when it is not one value; lets folding keep an oversized fill as a stride-0 broadcast
    splat: Callable | None = None
    movement: Movement = Movement.NONE
    precision: Precision | None = None      # None: not in the policy (float32)
    precision_why: str = ""                 # the policy's one-line reason for ``precision``
    # (node, input facts) -> output facts (``ops/value_range.py``); None: the movement class's, else unknown
    value_range: Callable | None = None
    # node -> whether output 0 is input 0's very bytes in the values' memory layouts (a Transpose
    # that only changes which axes are named, not the order in memory); None: never
    view_when: Callable | None = None


_REGISTRY: dict[tuple[str, str], list[OpDef]] = {}
_QUERIES: dict[tuple, frozenset] = {}        # movement_ops' answers, until the registry changes


def register(op_type: str, *, since: int = 1, domain: str = "", infer: Infer | None = None,
             pure: bool = True, fusion: FusionKind = FusionKind.OPAQUE, layout_sensitive: bool = False,
             foldable: bool = True, inplace: tuple = (), writes_out: bool = False,
             alias: tuple = (), splat: Callable | None = None, movement: Movement = Movement.NONE,
             precision: tuple[Precision, str] | None = None,
             value_range: Callable | None = None, view_when: Callable | None = None) -> Callable[[Builder], Builder]:
    """Decorator: register ``build`` as the kernel builder of ``op_type`` from opset ``since``.

    A later registration of the same op with a higher ``since`` takes over from that opset on.
    ``precision``: (class, the one-line reason); ``value_range``: the op's transfer;
    ``view_when``: node -> whether this node's output 0 is its input 0's bytes (a view).
    """
    movement = Movement(movement)
    if precision is not None:
        cls, why = precision
        if not isinstance(cls, Precision) or not isinstance(why, str) or not why:
            raise TypeError(f"register({op_type!r}): precision must be (Precision, a reason), got {precision!r}")

    def deco(build: Builder) -> Builder:
        defs = _REGISTRY.setdefault((domain, op_type), [])
        defs[:] = [d for d in defs if d.since != since]
        defs.append(OpDef(op_type, domain, since, build, infer, pure, fusion, layout_sensitive,
                          foldable, tuple(inplace), bool(writes_out),
                          tuple(tuple(p) for p in alias), splat, movement,
                          None if precision is None else precision[0],
                          "" if precision is None else precision[1], value_range, view_when))
        defs.sort(key=lambda d: d.since)
        _QUERIES.clear()
        return build
    return deco


def unregister(op_type: str, *, since: int, domain: str = "") -> None:
    """Remove one registration (a test or a plugin that registered an op for a while)."""
    defs = _REGISTRY.get((domain, op_type), [])
    defs[:] = [d for d in defs if d.since != since]
    if not defs:
        _REGISTRY.pop((domain, op_type), None)
    _QUERIES.clear()


def movement_ops(*classes: Movement) -> frozenset[tuple[str, str]]:
    """(domain, op type) of every registered op whose data-movement class is one of
    ``classes`` (every class but ``NONE`` when none is named), in any of its opsets."""
    want = frozenset(Movement(c) for c in classes) or frozenset(Movement) - {Movement.NONE}
    key = ("movement", want)
    got = _QUERIES.get(key)
    if got is None:
        got = _QUERIES[key] = frozenset(k for k, defs in _REGISTRY.items() if any(d.movement in want for d in defs))
    return got


def newest(domain: str, op_type: str) -> OpDef | None:
    """The op's registration of the highest opset: where a fact holds in every opset of the op
    (its precision class, its movement class) and the caller has no version."""
    defs = _REGISTRY.get(("" if domain == "ai.onnx" else domain, op_type))
    return defs[-1] if defs else None


def no_out(kernel: Callable) -> Callable:
    """Mark a kernel of a ``writes_out`` op that has no ``out=`` form (a rare dtype path).

    Wraps rather than tags, so a shared function is never marked by accident."""
    def without_out(*xs):
        return kernel(*xs)
    without_out.writes_out = False
    return without_out


def kernel_writes_out(opdef: OpDef, kernel: Callable) -> bool:
    """Whether this built kernel of ``opdef`` accepts ``out=``: the kernel's own ``writes_out``
    mark when it has one (a backend's kernel for an op whose portable kernel has no out form),
    else the op's."""
    mark = getattr(kernel, "writes_out", None)
    return bool(opdef.writes_out if mark is None else mark)


def lookup(domain: str, op_type: str, version: int) -> OpDef | None:
    """The definition in force at ``version`` (the newest ``since`` not above it)."""
    if domain == "ai.onnx":
        domain = ""
    best = None
    for d in _REGISTRY.get((domain, op_type), ()):
        if d.since <= version:
            best = d
    return best


def opdef_for(node: Node) -> OpDef:
    d = lookup(node.domain, node.op_type, node.version)
    if d is None:
        dom = f"{node.domain}::" if node.domain else ""
        known = _REGISTRY.get((node.domain, node.op_type))
        why = (f"only opset >= {known[0].since} is implemented" if known else "no kernel for this op")
        raise UnsupportedOpError(f"node {node.name!r}: op {dom}{node.op_type} (opset {node.version}) "
                                 f"is not supported: {why}", node=node.name, op_type=node.op_type)
    return d


def view_input(node: Node, by_layout: bool = True) -> int | None:
    """The input index that output 0 of ``node`` is a view of (``OpDef.alias``: same bytes,
    another shape, the same dtype; with ``by_layout``, also ``OpDef.view_when``: the same bytes
    in the values' memory layouts as they stand), or None when it is not a view (or the op is
    unknown)."""
    if len(node.outputs) != 1:
        return None
    opdef = lookup(node.domain, node.op_type, node.version)
    if opdef is None:
        return None
    idx = next((i for i, o in opdef.alias if o == 0), None)
    if idx is None and by_layout and opdef.view_when is not None and opdef.view_when(node):
        idx = 0
    if idx is None or node.input(idx) is None or node.inputs[idx].dtype != node.outputs[0].dtype:
        return None
    return idx


def registered_ops() -> list[tuple[str, str, int]]:
    return sorted((d.domain, d.op_type, d.since) for defs in _REGISTRY.values() for d in defs)
