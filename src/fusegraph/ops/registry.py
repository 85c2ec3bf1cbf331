"""The op registry: per (domain, op_type, opset range) the facts every stage needs.

An ``OpDef`` holds the kernel builder, shape/dtype inference, purity, fusion kind and layout
sensitivity. Kernel builders run once per node at compile time: they read attributes and
constant inputs through a ``NodeContext`` and return a plain callable over torch tensors,
so the run loop pays one call per node. The same torch calls run on CPU and CUDA.

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


_REGISTRY: dict[tuple[str, str], list[OpDef]] = {}


def register(op_type: str, *, since: int = 1, domain: str = "", infer: Infer | None = None,
             pure: bool = True, fusion: FusionKind = FusionKind.OPAQUE, layout_sensitive: bool = False,
             foldable: bool = True, inplace: tuple = (), writes_out: bool = False,
             alias: tuple = (), splat: Callable | None = None) -> Callable[[Builder], Builder]:
    """Decorator: register ``build`` as the kernel builder of ``op_type`` from opset ``since``.

    A later registration of the same op with a higher ``since`` takes over from that opset on.
    """
    def deco(build: Builder) -> Builder:
        defs = _REGISTRY.setdefault((domain, op_type), [])
        defs[:] = [d for d in defs if d.since != since]
        defs.append(OpDef(op_type, domain, since, build, infer, pure, fusion, layout_sensitive,
                          foldable, tuple(inplace), bool(writes_out),
                          tuple(tuple(p) for p in alias), splat))
        defs.sort(key=lambda d: d.since)
        return build
    return deco


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


def registered_ops() -> list[tuple[str, str, int]]:
    return sorted((d.domain, d.op_type, d.since) for defs in _REGISTRY.values() for d in defs)
