"""Sequences and optionals: ``Sequence*``, ``SplitToSequence``, ``ConcatFromSequence``,
``Optional``, ``OptionalHasElement``, ``OptionalGetElement``.

At run time a sequence is a ``TensorSequence`` (a Python list of tensors) and an empty
optional is ``None``. Kernels never change a sequence they are given: they return a new
one. A tensor put into a sequence is copied, so a sequence never holds a view of arena
memory that the plan reuses after the producer's last use; ``TensorSequence.data_ptr`` is 0
(never in the arena) for the runtime's alias guard. In the IR these values have no dtype
and no shape (so the planner gives them no arena bytes) and carry ``meta["container"]``.
"""
from __future__ import annotations

import torch

from ..ir import DType
from .registry import NodeContext, register


class TensorSequence(list):
    """A sequence value: a list of tensors that owns its elements."""

    elem_dtype: DType = DType.UNDEFINED

    def data_ptr(self) -> int:   # the runtime's arena guard: a sequence never lies in the arena
        return 0

    def record_stream(self, stream) -> None:   # CUDA streams: a sequence read on another stream
        for t in self:
            t.record_stream(stream)


def _new(items, elem_dtype=DType.UNDEFINED) -> TensorSequence:
    s = TensorSequence(items)
    s.elem_dtype = elem_dtype
    return s


def _seq(x, what: str = "input") -> TensorSequence:
    if not isinstance(x, list):
        raise TypeError(f"{what} must be a sequence, got {type(x).__name__}")
    return x


def _container(ctx: NodeContext, kind: str, elem: DType = DType.UNDEFINED):
    """Inference for an op whose one output is a container: record its kind on the output."""
    out = ctx.node.outputs[0]
    out.meta["container"] = kind
    out.meta["elem_dtype"] = int(elem)
    return [(None, None)]


def _elem_of(ctx: NodeContext, i: int) -> DType:
    v = ctx.node.input(i)
    if v is None:
        return DType.UNDEFINED
    return DType(v.meta.get("elem_dtype", int(v.dtype)))


def _pos(p, n: int, insert: bool = False) -> int:
    k = int(p.reshape(()).item())
    hi = n if insert else n - 1
    if not -n <= k <= hi:
        raise IndexError(f"position {k} is out of range for a sequence of {n}")
    return k + n if k < 0 else k


# ----- sequences ------------------------------------------------------------------------------
@register("SequenceEmpty", since=11, foldable=False,
          infer=lambda ctx: _container(ctx, "sequence", DType(ctx.attr("dtype", int(DType.FLOAT)))))
def _sequence_empty(ctx: NodeContext):
    elem = DType(ctx.attr("dtype", int(DType.FLOAT)))
    return lambda: _new([], elem)


@register("SequenceConstruct", since=11, foldable=False,
          infer=lambda ctx: _container(ctx, "sequence", ctx.dtype(0)))
def _sequence_construct(ctx: NodeContext):
    def kernel(*xs):
        if len({x.dtype for x in xs}) > 1:
            raise TypeError("SequenceConstruct inputs must share one dtype")
        return _new([x.clone() for x in xs], DType.from_torch(xs[0].dtype))
    return kernel


@register("SequenceAt", since=11, foldable=False,
          infer=lambda ctx: [(_elem_of(ctx, 0) or None, None)])
def _sequence_at(ctx: NodeContext):
    def kernel(seq, pos):
        seq = _seq(seq)
        return seq[_pos(pos, len(seq))]
    return kernel


@register("SequenceInsert", since=11, foldable=False,
          infer=lambda ctx: _container(ctx, "sequence", _elem_of(ctx, 0) or ctx.dtype(1)))
def _sequence_insert(ctx: NodeContext):
    def kernel(seq, x, pos=None):
        items = list(_seq(seq))
        if items and items[0].dtype != x.dtype:
            raise TypeError(f"cannot insert a {x.dtype} tensor into a sequence of {items[0].dtype}")
        k = len(items) if pos is None else _pos(pos, len(items), insert=True)
        items.insert(k, x.clone())
        return _new(items, DType.from_torch(x.dtype))
    return kernel


@register("SequenceErase", since=11, foldable=False,
          infer=lambda ctx: _container(ctx, "sequence", _elem_of(ctx, 0)))
def _sequence_erase(ctx: NodeContext):
    def kernel(seq, pos=None):
        items = list(_seq(seq))
        if not items:
            raise IndexError("SequenceErase on an empty sequence")
        del items[len(items) - 1 if pos is None else _pos(pos, len(items))]
        return _new(items, getattr(seq, "elem_dtype", DType.UNDEFINED))
    return kernel


@register("SequenceLength", since=11, foldable=False, infer=lambda ctx: [(DType.INT64, ())])
def _sequence_length(ctx: NodeContext):
    device = torch.device(ctx.device)
    return lambda seq: torch.tensor(len(_seq(seq)), dtype=torch.int64, device=device)


@register("SplitToSequence", since=11, foldable=False,
          infer=lambda ctx: _container(ctx, "sequence", ctx.dtype(0)))
def _split_to_sequence(ctx: NodeContext):
    axis = int(ctx.attr("axis", 0))
    keepdims = int(ctx.attr("keepdims", 1))

    def kernel(x, split=None):
        a = axis % x.dim()
        if split is None:
            parts = torch.split(x, 1, dim=a)
            if not keepdims:
                parts = [p.squeeze(a) for p in parts]
        elif split.dim() == 0:
            parts = torch.split(x, int(split.item()), dim=a)
        else:
            sizes = [int(s) for s in split.tolist()]
            if sum(sizes) != x.shape[a] or any(s < 0 for s in sizes):
                raise ValueError(f"split sizes {sizes} do not cover dim {a} of size {x.shape[a]}")
            parts = torch.split(x, sizes, dim=a)
        return _new([p.clone() for p in parts], DType.from_torch(x.dtype))
    return kernel


@register("ConcatFromSequence", since=11, foldable=False,
          infer=lambda ctx: [(_elem_of(ctx, 0) or None, None)])
def _concat_from_sequence(ctx: NodeContext):
    axis = int(ctx.attr("axis"))
    new_axis = int(ctx.attr("new_axis", 0))

    def kernel(seq):
        items = _seq(seq)
        if not items:
            raise ValueError("ConcatFromSequence of an empty sequence")
        rank = items[0].dim() + (1 if new_axis else 0)
        if not -rank <= axis < rank:
            raise ValueError(f"axis {axis} is out of range for rank {rank}")
        return torch.stack(list(items), dim=axis) if new_axis else torch.cat(list(items), dim=axis)
    return kernel


# ----- optionals ------------------------------------------------------------------------------
def _optional_infer(ctx: NodeContext):
    v = ctx.node.input(0)
    inner = None if v is None else v.meta.get("container")
    return _container(ctx, "optional_sequence" if inner == "sequence" else "optional",
                      _elem_of(ctx, 0) if v is not None else DType.UNDEFINED)


@register("Optional", since=15, foldable=False, infer=_optional_infer)
def _optional(ctx: NodeContext):
    if ctx.has_input(0):
        return lambda x: x
    return lambda *_: None


@register("OptionalHasElement", since=15, foldable=False, infer=lambda ctx: [(DType.BOOL, ())])
def _optional_has_element(ctx: NodeContext):
    device = torch.device(ctx.device)
    return lambda x=None: torch.tensor(x is not None, dtype=torch.bool, device=device)


def _get_element_infer(ctx: NodeContext):
    v = ctx.node.input(0)
    inner = v.meta.get("container") if v is not None else None
    if inner in ("sequence", "optional_sequence"):
        return _container(ctx, "sequence", _elem_of(ctx, 0))
    return [((v.dtype or DType(v.meta.get("elem_dtype", 0))) or None if v is not None else None,
             v.shape if v is not None else None)]


@register("OptionalGetElement", since=15, foldable=False, infer=_get_element_infer)
def _optional_get_element(ctx: NodeContext):
    def kernel(x=None):
        if x is None:
            raise ValueError("OptionalGetElement of an empty optional")
        return x
    return kernel


# ops that may read a sequence or optional value; any other op is refused one at inference
TAKES_CONTAINERS = frozenset({"SequenceAt", "SequenceInsert", "SequenceErase", "SequenceLength",
                              "ConcatFromSequence", "Optional", "OptionalHasElement", "OptionalGetElement",
                              "Identity", "If", "Loop", "Scan", "SequenceMap"})


def check_container_inputs(node) -> None:
    """Refuse a node that would read a sequence / optional where it takes a tensor."""
    if node.domain == "" and node.op_type in TAKES_CONTAINERS:
        return
    for i, v in enumerate(node.inputs):
        if v is not None and "container" in v.meta:
            from ..errors import ShapeInferenceError
            raise ShapeInferenceError(f"node {node.name!r} ({node.op_type}) reads %{v.name}, a "
                                      f"{v.meta['container'].replace('_', ' ')}, as input {i}; it takes tensors")
