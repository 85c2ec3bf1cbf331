"""TorchScript IR for a run of nodes: the builder, and the registry of per-op emitters.

A script segment (``segments.py``) runs several consecutive nodes as one
TorchScript graph, so the interpreter pays one Python call for all of them and oneDNN Graph
compiles their convolutions, pools and products into partitions. Each op that can take part
has an *emitter* (``script_ops.py``) registered here with ``@emitter(domain, op_type)``:

    emit(ctx: NodeContext, b: ScriptBuilder, args: list[str | None]) -> list[str] | None

``args`` are the IR names of the node's inputs (None for a missing optional input; constants
come as IR names too, see ``ScriptBuilder.constant``); it returns the IR names of the node's
outputs, or None when this node is not one it can express (it must decline before adding
lines; the builder is rolled back anyway). An emitter writes only functional aten ops: no
op writes into an input. Names in ``ScriptBuilder.inputs`` are the segment's inputs.
``ScriptBuilder.source()`` is the graph text, whose inputs are the segment's inputs followed
by its constants (``constants`` maps their names to the tensors,
which ``onednn_graph.GraphKernel`` turns into graph constants). No pass logic here.
"""
from __future__ import annotations

from typing import Callable

import torch

from ....ops.registry import NodeContext

Emitter = Callable[[NodeContext, "ScriptBuilder", list], "list[str] | None"]
EMITTERS: dict[tuple[str, str], Emitter] = {}


def emitter(domain: str, *op_types: str):
    def deco(fn: Emitter) -> Emitter:
        for op in op_types:
            EMITTERS[(domain, op)] = fn
        return fn
    return deco


def emitter_for(domain: str, op_type: str) -> Emitter | None:
    return EMITTERS.get(("" if domain == "ai.onnx" else domain, op_type))


def _ir_float(v: float) -> str:
    text = repr(float(v))
    return text if ("." in text or "e" in text or "inf" in text or "nan" in text) else text + "."


class ScriptBuilder:
    """Accumulates IR lines; hands out fresh value names."""

    def __init__(self, exact: bool = True):
        self.exact = exact      # NaN / Inf as ONNX says (False: oneDNN's own forms; see script_ops)
        self.lines: list[str] = []
        self.inputs: list[str] = []
        self.constants: dict[str, torch.Tensor] = {}
        self._const_ids: dict[int, str] = {}
        self._n = 0

    def fresh(self) -> str:
        self._n += 1
        return f"%t{self._n}"

    def mark(self) -> tuple[int, int]:
        return len(self.lines), len(self.constants)

    def rollback(self, mark: tuple[int, int]) -> None:
        n_lines, n_consts = mark
        del self.lines[n_lines:]
        for key in list(self.constants)[n_consts:]:
            del self._const_ids[id(self.constants.pop(key))]

    def input(self) -> str:
        name = f"%in{len(self.inputs)}"
        self.inputs.append(name)
        return name

    def constant(self, t: torch.Tensor) -> str:
        """A tensor constant (weights): one graph input, replaced by the tensor when compiled."""
        key = self._const_ids.get(id(t))
        if key is None:
            key = f"c{len(self.constants)}"
            self.constants[key] = t
            self._const_ids[id(t)] = key
        return "%" + key

    def _lit(self, type_: str, value: str) -> str:
        name = self.fresh()
        self.lines.append(f"  {name} : {type_} = prim::Constant[value={value}]()")
        return name

    def ints(self, values) -> str:
        return self._lit("int[]", "[" + ", ".join(str(int(v)) for v in values) + "]")

    def int(self, v) -> str:
        return self._lit("int", str(int(v)))

    def float(self, v) -> str:
        return self._lit("float", _ir_float(v))

    def bool(self, v) -> str:
        return self._lit("bool", str(int(bool(v))))

    def str(self, v: str) -> str:
        if not v.isidentifier():   # only the emitters' own literals ("none", "tanh"), never a model's
            raise ValueError(f"script string literal {v[:40]!r} is not a plain identifier")
        return self._lit("str", '"' + v + '"')

    def none(self) -> str:
        name = self.fresh()
        self.lines.append(f"  {name} : NoneType = prim::Constant()")
        return name

    def op(self, kind: str, *args: str, type_: str = "Tensor") -> str:
        name = self.fresh()
        self.lines.append(f"  {name} : {type_} = {kind}({', '.join(args)})")
        return name

    def op_n(self, kind: str, n: int, *args: str) -> list[str]:
        """An op with ``n`` tensor outputs: their names."""
        names = [self.fresh() for _ in range(n)]
        self.lines.append(f"  {', '.join(m + ' : Tensor' for m in names)} = {kind}({', '.join(args)})")
        return names

    def tensor_list(self, names: list[str]) -> str:
        return self.op("prim::ListConstruct", *names, type_="Tensor[]")

    def source(self, outputs: list[str]) -> str:
        params = [f"{n} : Tensor" for n in self.inputs] + [f"%{k} : Tensor" for k in self.constants]
        lines = list(self.lines)
        ret = outputs[0]
        if len(outputs) > 1:      # a function returns one value: several go back as a tuple
            ret = "%results"
            types = ", ".join(["Tensor"] * len(outputs))
            lines.append(f"  {ret} : ({types}) = prim::TupleConstruct({', '.join(outputs)})")
        return "graph(" + ", ".join(params) + "):\n" + "\n".join(lines) + f"\n  return ({ret})\n"
