"""A weight stored in a oneDNN blocked layout, read back as a plain tensor with torch alone.

oneDNN describes a blocked layout (``memory.MemDesc.describe()``) by the logical ``dims``,
the ``padded`` dims, one outer stride per dim (in elements, over the padded dim divided by
its blocks) and the inner blocks (``blocks``) with the dims they split (``idxs``), outermost
first; the inner blocks form one dense tile at the innermost position. ``unpack`` views the
bytes as ``[outer dims..., block dims...]`` with exactly those strides, puts each dim's
outer index before its blocks (mixed radix, outermost block first), reshapes to the padded
dims and drops the padding (and the compensation sums oneDNN appends to an int8 weight,
which the primitives make again from the weight): no oneDNN call, so a saved model's weights can be read on a
machine without the library, or in another layout than the one stored. A plain layout may hold
its rows longer than they are (strides only, no blocks: ``linear.leading_dimension``).
``check`` refuses a description that does not fit its bytes (an artifact is untrusted: every
offset the view can reach must lie inside them).
"""
from __future__ import annotations

import math

import torch

from .memory import TORCH_OF

_KEYS = ("dims", "dt", "padded", "kind", "size", "strides", "blocks", "idxs")


def _ints(x, n=None) -> bool:
    return isinstance(x, list) and (n is None or len(x) == n) and all(
        isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 40 for v in x)


def _extra_limit(desc: dict, padded: list[int]) -> int:
    """The most bytes oneDNN appends to an int8 weight's elements: its compensations (int32
    sums per output channel, each group's: one for int8 activations, one for an activation
    zero point), padded to 64-byte alignment, at most the product of the two outer dims."""
    if TORCH_OF[desc["dt"]].itemsize != 1:
        return 0
    channels = padded[0] * (padded[1] if len(padded) > 1 else 1)
    return 2 * (4 * channels + 64)


def check(desc, nbytes: int) -> str | None:
    """Why ``desc`` cannot describe ``nbytes`` bytes of a blocked tensor (None: it can)."""
    if not isinstance(desc, dict) or set(desc) != set(_KEYS):
        return "not a blocked-layout description"
    dims, padded, strides, blocks, idxs = (desc[k] for k in ("dims", "padded", "strides", "blocks", "idxs"))
    nd = len(dims) if isinstance(dims, list) else -1
    if not (1 <= nd <= 12 and _ints(dims, nd) and _ints(padded, nd) and _ints(strides, nd)
            and _ints(blocks) and _ints(idxs, len(blocks) if isinstance(blocks, list) else 0) and len(blocks) <= 12):
        return "malformed dims, strides or blocks"
    if not (isinstance(desc["dt"], int) and desc["dt"] in TORCH_OF) or desc["kind"] != 2 \
            or not isinstance(desc["size"], int) or isinstance(desc["size"], bool):
        return "unknown data type or format kind"
    if any(i >= nd for i in idxs) or any(b < 1 for b in blocks):
        return "a block names no dim"
    per_dim = [1] * nd
    for b, i in zip(blocks, idxs):
        per_dim[i] *= b
    if any(p < d or p % k for p, d, k in zip(padded, dims, per_dim)):
        return "padded dims do not hold their dims and blocks"
    item = TORCH_OF[desc["dt"]].itemsize
    dense = math.prod(padded) * item     # oneDNN's weights are dense, then its int8 compensation
    inner = math.prod(blocks)
    reach = inner + sum((p // k - 1) * s for p, k, s in zip(padded, per_dim, strides))
    # or a plain layout whose rows are held longer than they are (``linear.leading_dimension``)
    spread = max(p // k * s for p, k, s in zip(padded, per_dim, strides)) * inner * item if not blocks else dense
    if desc["size"] != nbytes or not dense <= nbytes <= max(dense + _extra_limit(desc, padded), spread):
        return f"{nbytes} bytes do not hold the {math.prod(padded)} padded elements described"
    if reach * item > nbytes:
        return f"the layout reaches {reach * item} bytes of {nbytes}"
    return None


def unpack(desc: dict, data: torch.Tensor) -> torch.Tensor:
    """The plain (row-major) tensor of ``data`` (uint8 bytes laid out as ``desc``)."""
    why = check(desc, data.numel())
    if why is not None:
        raise ValueError(f"blocked weight: {why}")
    dtype = TORCH_OF[desc["dt"]]
    dims, padded, strides, blocks, idxs = (desc[k] for k in ("dims", "padded", "strides", "blocks", "idxs"))
    nd = len(dims)
    per_dim = [1] * nd
    for b, i in zip(blocks, idxs):
        per_dim[i] *= b
    inner_strides, acc = [], 1
    for b in reversed(blocks):
        inner_strides.insert(0, acc)
        acc *= b
    flat = data.view(dtype)
    shape = [p // k for p, k in zip(padded, per_dim)] + list(blocks)
    view = torch.as_strided(flat, shape, list(strides) + inner_strides)
    order = []
    for d in range(nd):
        order.append(d)
        order += [nd + j for j, i in enumerate(idxs) if i == d]
    plain = view.permute(order).reshape(padded)
    return plain[tuple(slice(0, d) for d in dims)].contiguous()
