"""The torch frontend's ATen op table: ``TABLE`` (ATen overload or packet name -> handler),
the ``aten`` decorator that fills it, ``lookup`` (overload, then packet, then an in-place op's
functional form), ``bind`` (an op's arguments by schema name) and the small helpers the
handler modules share (dtypes, type promotion). The handlers register themselves from
``torch_ops.py`` (arithmetic, activations, products, convolutions, normalisation, pooling,
attention) and ``torch_ops_shape.py`` (shape, indexing, creation, casts). Facts only: no
optimisation, no pass logic.
"""
from __future__ import annotations

from typing import Any, Callable

import torch


TABLE: dict[str, Callable] = {}
SKIP = object()          # a handler's result for ops that produce nothing (asserts)


def aten(*names: str):
    def deco(fn):
        for n in names:
            TABLE[n] = fn
        return fn
    return deco


def lookup(name: str):
    """The handler of an ATen overload name (``aten.add.Tensor``), by overload then packet;
    an in-place variant (``aten.relu_``) falls back to its functional form."""
    parts = name.split(".")
    packet = ".".join(parts[:2])
    for key in (name, packet):
        if key in TABLE:
            return TABLE[key]
    if parts[1].endswith("_") and not parts[1].startswith("_"):
        base = f"{parts[0]}.{parts[1][:-1]}"
        return TABLE.get(".".join([base] + parts[2:])) or TABLE.get(base)
    return None


def is_inplace(target) -> bool:
    return target._schema.name.endswith("_") and target._schema.is_mutable


def bind(target, args, kwargs) -> dict[str, Any]:
    """The op's arguments by schema name, defaults filled in."""
    out = {}
    for i, a in enumerate(target._schema.arguments):
        if i < len(args) and not a.kwarg_only:
            out[a.name] = args[i]
        elif a.name in kwargs:
            out[a.name] = kwargs[a.name]
        else:
            out[a.name] = a.default_value if a.has_default_value() else None
    return out


def out_dtype(cx) -> torch.dtype:
    val = cx.node.meta.get("val")
    return val.dtype if isinstance(val, torch.Tensor) else torch.get_default_dtype()


def promote(cx, *args) -> torch.dtype:
    """torch's type promotion over tensors and Python numbers (for comparisons)."""
    tensors = [cx.val(a) for a in args if isinstance(cx.val(a), torch.Tensor)]
    dt = tensors[0].dtype if tensors else torch.int64
    for t in tensors[1:]:
        dt = torch.promote_types(dt, t.dtype)
    if any(isinstance(cx.val(a), float) for a in args) and not dt.is_floating_point:
        dt = torch.get_default_dtype()
    return dt


# ----------------------------------------------------------------- elementwise
