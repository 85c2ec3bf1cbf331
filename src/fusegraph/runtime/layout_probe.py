"""The memory layout (strides) each kernel gives its outputs, found by one probe run at bind time.

An arena view must have the strides the kernel would give its result on its own: oneDNN
convolutions produce channels-last tensors, and elementwise ops, pools and Concat keep their
inputs' layout; writing such a result into a plain contiguous view would transpose it on every
run (and hand the next kernel another layout, hence possibly other rounding). The layout
depends on the op, its kernel and its inputs' layouts, not on the values, so ``probe_strides``
runs the bound kernels once, in order, on zero inputs of the graph's static input shapes, with
no arena, and records the strides of the requested values whose result is dense. It stops
quietly at the first kernel that fails on zeros (data-dependent shapes or indices) or when an
input has no static shape: those values keep contiguous views, which are always correct.
The result is kept (``bind.Binding.strides``) and stored in a saved artifact, so a loaded
model binds the same views without probing again. Nothing here plans or generates code.
"""
from __future__ import annotations

import torch

from ..ir import Graph
from ..ir.shape import is_static


def _dense(t: torch.Tensor) -> bool:
    """The strides are a permutation of a contiguous layout (no gaps, no overlap)."""
    expected = 1
    for stride, size in sorted((st, sz) for st, sz in zip(t.stride(), t.shape) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def probe_strides(graph: Graph, calls, wanted: set[str], device) -> dict[str, tuple[int, ...]]:
    """``{value name: strides}`` for the values in ``wanted`` whose probed result is dense."""
    if not wanted:
        return {}
    env: dict[int, torch.Tensor] = {}
    for v in graph.inputs:
        if v.shape is None or not is_static(v.shape):
            return {}
        try:
            env[id(v)] = torch.zeros(tuple(int(d) for d in v.shape), dtype=v.dtype.to_torch(), device=device)
        except TypeError:
            return {}
    last: dict[int, int] = {}
    for pos, call in enumerate(calls):
        for v in call.inputs:
            if v is not None:
                last[id(v)] = pos
    keep = {id(v) for v in graph.outputs}
    found: dict[str, tuple[int, ...]] = {}
    with torch.inference_mode():
        for pos, call in enumerate(calls):
            node = call.node
            try:
                args = [None if v is None else (v.const if v.is_const else env[id(v)]) for v in call.inputs]
                res = call.kernel(*args)
            except Exception:  # noqa: BLE001 - a data-dependent kernel: stop probing, keep defaults
                break
            outs = (res,) if len(node.outputs) == 1 else tuple(res)
            for o, t in zip(node.outputs, outs):
                env[id(o)] = t
                if o.name in wanted and isinstance(t, torch.Tensor) and tuple(t.shape) == tuple(o.shape) \
                        and _dense(t) and not t.is_contiguous():
                    found[o.name] = tuple(t.stride())
            for v in list(call.inputs) + list(node.outputs):
                if v is not None and last.get(id(v), -1) <= pos and id(v) not in keep:
                    env.pop(id(v), None)
    return found
