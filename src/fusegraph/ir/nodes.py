"""``Value`` and ``Node``: the two kinds of object a ``Graph`` is made of.

Use-def links are kept by the objects themselves: creating or rewiring a node registers or
unregisters it as a user of its inputs. Passes never edit ``uses`` lists by hand.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from .dtype import DType
from .shape import Shape, format_shape

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from .graph import Graph


class Value:
    """A tensor in the graph: a graph input, a constant, or a node output.

    flags: ``external`` (must stay materialised and readable after a run),
    ``no_fuse`` (never fused away).
    """

    __slots__ = ("name", "dtype", "shape", "producer", "index", "uses", "const", "flags",
                 "layout", "meta", "graph")

    def __init__(self, name: str, dtype: DType = DType.UNDEFINED, shape: Shape = None,
                 const: "torch.Tensor | None" = None):
        self.name = name
        self.dtype = DType(dtype)
        self.shape = None if shape is None else tuple(shape)
        self.producer: Node | None = None
        self.index = 0  # output position in the producer
        self.uses: list[tuple[Node, int]] = []
        self.const = const
        self.flags: set[str] = set()
        self.layout = "nchw"
        self.meta: dict[str, Any] = {}
        self.graph: Graph | None = None

    @property
    def is_const(self) -> bool:
        return self.const is not None

    @property
    def users(self) -> list["Node"]:
        seen: list[Node] = []
        for node, _ in self.uses:
            if not any(node is s for s in seen):
                seen.append(node)
        return seen

    @property
    def is_graph_output(self) -> bool:
        return self.graph is not None and any(self is o for o in self.graph.outputs)

    @property
    def is_graph_input(self) -> bool:
        return self.graph is not None and any(self is i for i in self.graph.inputs)

    def replace_all_uses_with(self, other: "Value") -> None:
        """Point every consumer (and graph-output slot) of this value at ``other``."""
        if other is self:
            return
        for node, idx in list(self.uses):
            node.set_input(idx, other)
        if self.graph is not None:
            self.graph.replace_output(self, other)

    def type_str(self) -> str:
        return f"{self.dtype.short}{format_shape(self.shape)}"

    def __repr__(self) -> str:
        kind = "const " if self.is_const else ""
        return f"<Value %{self.name}: {kind}{self.type_str()}>"


class Node:
    """One operator application. ``version`` is the opset version of ``domain``."""

    __slots__ = ("op_type", "domain", "version", "inputs", "outputs", "attrs", "name", "meta", "graph")

    def __init__(self, op_type: str, inputs: Iterable[Value | None], outputs: Iterable[Value],
                 attrs: dict[str, Any] | None = None, *, domain: str = "", version: int = 1,
                 name: str = ""):
        self.op_type = op_type
        self.domain = domain
        self.version = version
        self.attrs: dict[str, Any] = dict(attrs or {})
        self.name = name
        self.meta: dict[str, Any] = {}
        self.graph: Graph | None = None
        self.inputs: list[Value | None] = []
        for i, v in enumerate(inputs):
            self.inputs.append(v)
            if v is not None:
                v.uses.append((self, i))
        self.outputs: list[Value] = list(outputs)
        for i, v in enumerate(self.outputs):
            if v.producer is not None:
                raise ValueError(f"value %{v.name} already produced by {v.producer.name}")
            v.producer = self
            v.index = i

    @property
    def key(self) -> tuple[str, str]:
        return (self.domain, self.op_type)

    def set_input(self, index: int, value: Value | None) -> None:
        old = self.inputs[index]
        if old is value:
            return
        if old is not None:
            for k, (n, i) in enumerate(old.uses):
                if n is self and i == index:
                    del old.uses[k]
                    break
        self.inputs[index] = value
        if value is not None:
            value.uses.append((self, index))

    def detach(self) -> None:
        """Drop this node's uses of its inputs (called when it leaves the graph)."""
        for i in range(len(self.inputs)):
            self.set_input(i, None)

    def input(self, i: int) -> Value | None:
        return self.inputs[i] if i < len(self.inputs) else None

    def const_input(self, i: int):
        v = self.input(i)
        return None if v is None else v.const

    def __repr__(self) -> str:
        return f"<Node {self.name}: {self.op_type}>"
