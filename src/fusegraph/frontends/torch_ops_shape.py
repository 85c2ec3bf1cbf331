"""The ATen -> fusegraph op table, part two: shape, layout, indexing, reduction, creation,
cast and no-op ATen ops (part one is ``torch_ops.py``; the table itself ``torch_table.py``).

Shape arguments may hold symbolic sizes (FX nodes with a SymInt value): ``cx.ints`` turns them
into an int64 vector built from Shape / Concat nodes, so a dynamic export stays dynamic. Ops
that only exist for autograd or for export's bookkeeping (dropout in eval, clone, contiguous,
``_assert_tensor_metadata``) map to their input or to nothing. Facts only: no optimisation.
"""
from __future__ import annotations

import torch

from .torch_table import SKIP, aten, out_dtype

INT64_MAX = 2 ** 63 - 1


def _rank(cx, x) -> int:
    return len(cx.shape(x))


def _norm(dim: int, rank: int) -> int:
    return dim + rank if dim < 0 else dim


# ----------------------------------------------------------------- no-ops, casts
@aten("aten._assert_tensor_metadata", "aten._assert_scalar", "aten.sym_constrain_range_for_size",
      "aten._assert_async", "aten.sym_constrain_range")
def _skip(cx, a):
    return SKIP


@aten("aten.clone", "aten.contiguous", "aten.alias", "aten.detach", "aten.lift_fresh_copy",
      "aten.to.dtype", "aten.to.dtype_layout", "aten.to.device", "aten.to.other", "aten._to_copy",
      "aten.type_as")
def _identity_or_cast(cx, a):
    x = a["self"]
    dt = out_dtype(cx)
    return cx.v(x, dt)


@aten("aten.dropout", "aten.feature_dropout", "aten.alpha_dropout", "aten.native_dropout")
def _dropout(cx, a):
    if a.get("train") and a.get("p"):
        raise cx.unsupported("in training mode (call module.eval() before compiling)")
    x = cx.v(a["input"])
    return [x, None] if "native" in str(cx.node.target) else x


# ----------------------------------------------------------------- reshaping
@aten("aten.view", "aten.reshape", "aten._unsafe_view")
def _reshape(cx, a):
    size = a.get("size", a.get("shape"))
    return cx.emit("Reshape", [cx.v(a["self"]), cx.ints(size)])


@aten("aten.flatten.using_ints")
def _flatten(cx, a):
    x = a["self"]
    rank = _rank(cx, x)
    if rank == 0:
        return cx.emit("Reshape", [cx.v(x), cx.const([1], torch.int64)])
    start, end = _norm(a["start_dim"], rank), _norm(a["end_dim"], rank)
    if start == end:
        return cx.v(x)
    if start == 1 and end == rank - 1:
        return cx.emit("Flatten", [cx.v(x)], {"axis": 1})
    tail = cx.shape(x)[end + 1:]
    if not all(isinstance(d, int) for d in tail):
        raise cx.unsupported("over symbolic trailing dims is not mapped")
    return cx.emit("Reshape", [cx.v(x), cx.const([0] * start + [-1] + list(tail), torch.int64)])


@aten("aten.transpose.int", "aten.swapaxes", "aten.swapdims")
def _transpose(cx, a):
    x = a["self"]
    rank = _rank(cx, x)
    d0, d1 = _norm(a.get("dim0", a.get("axis0")), rank), _norm(a.get("dim1", a.get("axis1")), rank)
    perm = list(range(rank))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return cx.emit("Transpose", [cx.v(x)], {"perm": perm})


@aten("aten.permute")
def _permute(cx, a):
    rank = _rank(cx, a["self"])
    return cx.emit("Transpose", [cx.v(a["self"])], {"perm": [_norm(d, rank) for d in a["dims"]]})


@aten("aten.unsqueeze")
def _unsqueeze(cx, a):
    rank = _rank(cx, a["self"])
    return cx.emit("Unsqueeze", [cx.v(a["self"]), cx.const([_norm(a["dim"], rank + 1)], torch.int64)])


@aten("aten.squeeze", "aten.squeeze.dim", "aten.squeeze.dims")
def _squeeze(cx, a):
    x = a["self"]
    shape = cx.shape(x)
    dims = a.get("dim")
    dims = list(range(len(shape))) if dims is None else ([dims] if isinstance(dims, int) else list(dims))
    axes = [_norm(d, len(shape)) for d in dims if len(shape) and shape[_norm(d, len(shape))] == 1]
    if not axes:
        return cx.v(x)
    return cx.emit("Squeeze", [cx.v(x), cx.const(axes, torch.int64)])


@aten("aten.expand")
def _expand(cx, a):
    size = [1 if (isinstance(s, int) and s == -1) else s for s in a["size"]]
    return cx.emit("Expand", [cx.v(a["self"]), cx.ints(size)])


@aten("aten.expand_as")
def _expand_as(cx, a):
    return cx.emit("Expand", [cx.v(a["self"]), cx.emit("Shape", [cx.v(a["other"])])])


# ----------------------------------------------------------------- slicing / joining
@aten("aten.slice.Tensor")
def _slice(cx, a):
    x = a["self"]
    shape = cx.shape(x)
    dim = _norm(a["dim"], len(shape))
    start = 0 if a["start"] is None else a["start"]
    end = INT64_MAX if a["end"] is None else a["end"]
    step = a["step"] or 1
    size = shape[dim]
    if (start == 0 and step == 1 and isinstance(end, int)
            and (end == INT64_MAX or (isinstance(size, int) and end >= size))):
        return cx.v(x)
    end = min(end, INT64_MAX) if isinstance(end, int) else end
    return cx.emit("Slice", [cx.v(x), cx.ints([start]), cx.ints([end]), cx.const([dim], torch.int64),
                             cx.const([step], torch.int64)])


@aten("aten.select.int")
def _select(cx, a):
    return cx.emit("Gather", [cx.v(a["self"]), cx.v(a["index"], torch.int64)], {"axis": int(a["dim"])})


def _split_sizes(cx, x, dim, sizes):
    dim = _norm(dim, _rank(cx, x))
    outs = cx.emit("Split", [cx.v(x), cx.const(list(sizes), torch.int64)], {"axis": dim}, n_out=len(sizes))
    return outs if isinstance(outs, list) else [outs]


@aten("aten.split.Tensor", "aten.split_with_sizes", "aten.chunk")
def _split(cx, a):
    x = a["self"]
    dim = a["dim"]
    total = cx.shape(x)[_norm(dim, _rank(cx, x))]
    if not isinstance(total, int):
        raise cx.unsupported("along a symbolic dim is not mapped")
    if "split_sizes" in a:
        sizes = list(a["split_sizes"])
    else:
        step = a["split_size"] if "split_size" in a else -(-total // a["chunks"])
        sizes = [min(step, total - s) for s in range(0, total, step)]
    return _split_sizes(cx, x, dim, sizes)


@aten("aten.unbind.int")
def _unbind(cx, a):
    x, dim = a["self"], a["dim"]
    total = cx.shape(x)[_norm(dim, _rank(cx, x))]
    if not isinstance(total, int):
        raise cx.unsupported("along a symbolic dim is not mapped")
    axis = cx.const([_norm(dim, _rank(cx, x))], torch.int64)
    return [cx.emit("Squeeze", [p, axis]) for p in _split_sizes(cx, x, dim, [1] * total)]


@aten("aten.cat")
def _cat(cx, a):
    dt = out_dtype(cx)
    parts = [t for t in a["tensors"] if not (cx.shape(t) == (0,))]
    rank = _rank(cx, parts[0])
    return cx.emit("Concat", [cx.v(t, dt) for t in parts], {"axis": _norm(a["dim"], rank)})


@aten("aten.stack")
def _stack(cx, a):
    dt = out_dtype(cx)
    rank = _rank(cx, a["tensors"][0]) + 1
    axis = cx.const([_norm(a["dim"], rank)], torch.int64)
    return cx.emit("Concat", [cx.emit("Unsqueeze", [cx.v(t, dt), axis]) for t in a["tensors"]],
                   {"axis": _norm(a["dim"], rank)})


@aten("aten.constant_pad_nd")
def _pad(cx, a):
    x = a["self"]
    rank = _rank(cx, x)
    begins, ends = [0] * rank, [0] * rank
    pad = list(a["pad"])
    for i in range(len(pad) // 2):
        begins[rank - 1 - i], ends[rank - 1 - i] = pad[2 * i], pad[2 * i + 1]
    dt = out_dtype(cx)
    return cx.emit("Pad", [cx.v(x), cx.const(begins + ends, torch.int64), cx.const(a.get("value") or 0, dt)],
                   {"mode": "constant"})


# ----------------------------------------------------------------- indexing
@aten("aten.embedding")
def _embedding(cx, a):
    return cx.emit("Gather", [cx.v(a["weight"]), cx.v(a["indices"])], {"axis": 0})


@aten("aten.index_select")
def _index_select(cx, a):
    return cx.emit("Gather", [cx.v(a["self"]), cx.v(a["index"])], {"axis": int(a["dim"])})


@aten("aten.gather")
def _gather(cx, a):
    return cx.emit("GatherElements", [cx.v(a["self"]), cx.v(a["index"])], {"axis": int(a["dim"])})


@aten("aten.index.Tensor")
def _index(cx, a):
    idx = list(a["indices"])
    present = [i for i, t in enumerate(idx) if t is not None]
    if any(cx.dtype_of(idx[i]) == torch.bool for i in present):
        raise cx.unsupported("with a boolean mask index is not mapped")
    x = cx.v(a["self"])
    if len(present) == 1:
        return cx.emit("Gather", [x, cx.v(idx[present[0]], torch.int64)], {"axis": present[0]})
    if present != list(range(len(present))):
        raise cx.unsupported("with non-leading index tensors is not mapped")
    # as torch.onnx does: one linear index into the indexed leading dims, then a Gather on the
    # tensor with those dims flattened (a GatherND kernel costs far more: benchmarks/RESULTS.md)
    k, rank = len(present), _rank(cx, a["self"])
    shape = cx.shape(a["self"])

    def dim(i):
        if isinstance(shape[i], int):
            return cx.const(shape[i], torch.int64)
        return cx.emit("Squeeze", [cx.emit("Shape", [x], {"start": i, "end": i + 1}), cx.const([0], torch.int64)])

    linear = None
    for i in range(k):
        term = cx.emit("Mod", [cx.v(idx[i], torch.int64), dim(i)])        # negative indices count from the end
        tail = shape[i + 1:k]
        if tail and all(isinstance(d, int) for d in tail):
            stride = 1
            for d in tail:
                stride *= d
            term = cx.emit("Mul", [term, cx.const(stride, torch.int64)]) if stride != 1 else term
        else:
            for j in range(i + 1, k):
                term = cx.emit("Mul", [term, dim(j)])
        linear = term if linear is None else cx.emit("Add", [linear, term])
    flat = cx.const([-1], torch.int64)
    if rank > k:
        flat = cx.emit("Concat", [flat, cx.emit("Shape", [x], {"start": k})], {"axis": 0})
    return cx.emit("Gather", [cx.emit("Reshape", [x, flat]), linear], {"axis": 0})


@aten("aten.sym_size.int")
def _sym_size(cx, a):
    d = _norm(a["dim"], _rank(cx, a["self"]))
    return cx.emit("Shape", [cx.v(a["self"])], {"start": d, "end": d + 1})


# ----------------------------------------------------------------- reductions, scans
def _dims(cx, a, key="dim"):
    dims = a.get(key)
    rank = _rank(cx, a["self"])
    if dims is None or (isinstance(dims, (list, tuple)) and not dims):
        return list(range(rank))
    return [_norm(d, rank) for d in ([dims] if isinstance(dims, int) else dims)]


@aten("aten.mean.dim", "aten.mean.default")
def _mean(cx, a):
    dt = out_dtype(cx)
    return cx.emit("ReduceMean", [cx.v(a["self"], dt)], {"axes": _dims(cx, a), "keepdims": int(bool(a.get("keepdim")))})


@aten("aten.sum.dim_IntList", "aten.sum.default")
def _sum(cx, a):
    dt = out_dtype(cx)
    return cx.emit("ReduceSum", [cx.v(a["self"], dt), cx.const(_dims(cx, a), torch.int64)],
                   {"keepdims": int(bool(a.get("keepdim")))})


@aten("aten.amax", "aten.amin")
def _amax(cx, a):
    op = "ReduceMax" if "amax" in str(cx.node.target) else "ReduceMin"
    return cx.emit(op, [cx.v(a["self"])], {"axes": _dims(cx, a), "keepdims": int(bool(a.get("keepdim")))})


@aten("aten.cumsum")
def _cumsum(cx, a):
    dt = out_dtype(cx)
    return cx.emit("CumSum", [cx.v(a["self"], dt), cx.const(int(a["dim"]), torch.int64)])


@aten("aten.tril", "aten.triu")
def _trilu(cx, a):
    upper = int("triu" in str(cx.node.target))
    return cx.emit("Trilu", [cx.v(a["self"]), cx.const(int(a.get("diagonal") or 0), torch.int64)], {"upper": upper})


# ----------------------------------------------------------------- creation
def _fill(cx, size, value):
    dt = out_dtype(cx)
    static = cx.static(size)
    if static is not None:
        return cx.const(torch.full(static, value, dtype=dt))
    return cx.emit("ConstantOfShape", [cx.ints(size)], {"value": torch.tensor([value], dtype=dt)})


def _fill_like(cx, x, value):
    val = cx.val(x)
    if all(isinstance(d, int) for d in val.shape):
        return cx.const(torch.full(tuple(val.shape), value, dtype=out_dtype(cx)))
    return cx.emit("ConstantOfShape", [cx.emit("Shape", [cx.v(x)])],
                   {"value": torch.tensor([value], dtype=out_dtype(cx))})


@aten("aten.full.default", "aten.new_full")
def _full(cx, a):
    return _fill(cx, a["size"], a["fill_value"])


@aten("aten.zeros.default", "aten.new_zeros")
def _zeros(cx, a):
    return _fill(cx, a["size"], 0)


@aten("aten.ones.default", "aten.new_ones")
def _ones(cx, a):
    return _fill(cx, a["size"], 1)


@aten("aten.full_like")
def _full_like(cx, a):
    return _fill_like(cx, a["self"], a["fill_value"])


@aten("aten.zeros_like")
def _zeros_like(cx, a):
    return _fill_like(cx, a["self"], 0)


@aten("aten.ones_like")
def _ones_like(cx, a):
    return _fill_like(cx, a["self"], 1)


@aten("aten.scalar_tensor")
def _scalar_tensor(cx, a):
    return cx.const(torch.tensor(a["s"], dtype=out_dtype(cx)))


@aten("aten.arange.default", "aten.arange.start", "aten.arange.start_step")
def _arange(cx, a):
    dt = out_dtype(cx)
    start, end, step = a.get("start", 0), a["end"], a.get("step", 1)
    static = cx.static([start, end, step]) if all(isinstance(cx.val(v), (int, torch.SymInt)) for v in
                                                   (start, end, step)) else None
    if static is not None:
        return cx.const(torch.arange(*static, dtype=dt))
    if not any(isinstance(v, torch.fx.Node) for v in (start, end, step)):
        return cx.const(torch.arange(start, end, step, dtype=dt))
    return cx.emit("Range", [cx.v(start, dt), cx.v(end, dt), cx.v(step, dt)])



@aten("aten.item", "aten._local_scalar_dense")
def _item(cx, a):
    """A tensor's value as a symbolic number: kept as a [1] tensor, like a symbolic size."""
    val = cx.node.meta.get("val")
    dt = (torch.bool if isinstance(val, (bool, torch.SymBool)) else
          torch.int64 if isinstance(val, (int, torch.SymInt)) else torch.get_default_dtype())
    return cx.emit("Reshape", [cx.v(a["self"], dt), cx.const([1], torch.int64)])
