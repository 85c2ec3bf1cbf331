"""Control flow: ``If``, ``Loop``, ``Scan`` (opset 8 and 9+) and ``SequenceMap``, whose bodies
are ``ir.Graph`` attributes.

A body is run by a runner the runtime injects (``NodeContext.run_subgraph_factory``, made in
``runtime/subgraph.py``): ``runner(inputs, captures) -> outputs``. The node's trailing inputs
are the outer values its bodies read (``ir/subgraphs.py``); the kernel hands them to the
runner as captures. Without an injected runner (constant folding, shape inference) the
builders refuse with ``UnsupportedOpError``, so nothing here runs a body on its own.

Inference infers each body (its captures and inputs typed from the node's inputs) and reads
the node's outputs off the body outputs: If merges its branches, Loop / Scan add the
iteration axis to scan outputs. Sequence / optional values keep ``meta["container"]``. A Loop
with no trip count runs until its body's condition is false (as ONNX says); a Loop's or
Scan's zero-iteration scan output needs the body output's static shape, else it fails.
A Loop honours the run-time caps (``NodeContext.limits``, ``run_limits.py``): at most
``max_loop_iterations`` iterations per call, scan outputs no larger than ``max_tensor_bytes``;
stopping a run between iterations is the body runner's part (it checks the run's stop flag
before each body call).
"""
from __future__ import annotations

import torch

from ..ir import DType, Graph, Value
from ..ir.subgraphs import implicit_count
from .registry import NodeContext, register
from .run_limits import check_iterations, check_tensor

_CONTAINER_KEYS = ("container", "elem_dtype")


# ----- inference -----------------------------------------------------------------------------
def _copy_type(dst: Value, src: Value | None, shape: bool = True) -> None:
    if src is None:
        return
    if src.dtype != DType.UNDEFINED:
        dst.dtype = src.dtype
    if shape and src.shape is not None:
        dst.shape = src.shape
    for k in _CONTAINER_KEYS:
        if k in src.meta:
            dst.meta[k] = src.meta[k]


def _infer_body(ctx: NodeContext, body: Graph, inputs: list[tuple[Value | None, bool]]) -> None:
    """Type the body's captures (from the implicit inputs) and ``inputs`` (value to copy from,
    whether its shape carries over), then infer the body."""
    from .infer import infer_graph
    node = ctx.node
    k = implicit_count(node)
    for cap, outer in zip(body.captures, node.inputs[len(node.inputs) - k:]):
        _copy_type(cap, outer)
    for v, (src, with_shape) in zip(body.inputs, inputs):
        if v.dtype == DType.UNDEFINED or (with_shape and v.shape is None):
            _copy_type(v, src, with_shape)
    infer_graph(body)


def _out(ctx: NodeContext, i: int, src: Value, shape) -> tuple:
    out = ctx.node.outputs[i] if i < len(ctx.node.outputs) else None
    if out is not None:
        for k in _CONTAINER_KEYS:
            if k in src.meta:
                out.meta[k] = src.meta[k]
    return (src.dtype or None, shape)


def _merge_shapes(a, b):
    if a is None or b is None or len(a) != len(b):
        return None
    return tuple(x if x == y else None for x, y in zip(a, b))


def _if_infer(ctx: NodeContext):
    then_g, else_g = ctx.attr("then_branch"), ctx.attr("else_branch")
    for g in (then_g, else_g):
        _infer_body(ctx, g, [])
    result = []
    for i, (t, e) in enumerate(zip(then_g.outputs, else_g.outputs)):
        result.append(_out(ctx, i, t if t.dtype else e, _merge_shapes(t.shape, e.shape)))
    return result


def _loop_infer(ctx: NodeContext):
    body = ctx.attr("body")
    n_carried = len(ctx.node.inputs) - implicit_count(ctx.node) - 2
    i64, flag = Value("i", DType.INT64, ()), Value("c", DType.BOOL, ())
    carried = [(ctx.node.inputs[2 + j], False) for j in range(n_carried)]
    _infer_body(ctx, body, [(i64, True), (flag, True)] + carried)
    result = []
    for j, v in enumerate(body.outputs[1:1 + n_carried]):
        init = ctx.node.inputs[2 + j]
        result.append(_out(ctx, j, v, _merge_shapes(v.shape, init.shape if init is not None else None)))
    for j, v in enumerate(body.outputs[1 + n_carried:]):
        result.append(_out(ctx, n_carried + j, v, None if v.shape is None else (None,) + tuple(v.shape)))
    return result


def _scan_infer(ctx: NodeContext):
    body = ctx.attr("body")
    m = int(ctx.attr("num_scan_inputs"))
    n_explicit = len(ctx.node.inputs) - implicit_count(ctx.node)
    n_state = n_explicit - m
    axes = list(ctx.attr("scan_input_axes", [0] * m))
    slices = []
    for j in range(m):
        x = ctx.node.inputs[n_state + j]
        s = Value("x", x.dtype, None)
        if x.shape is not None:
            a = axes[j] % len(x.shape)
            s.shape = tuple(d for k, d in enumerate(x.shape) if k != a)
        slices.append((s, True))
    _infer_body(ctx, body, [(ctx.node.inputs[j], True) for j in range(n_state)] + slices)
    result = [_out(ctx, j, v, v.shape) for j, v in enumerate(body.outputs[:n_state])]
    out_axes = list(ctx.attr("scan_output_axes", [0] * (len(body.outputs) - n_state)))
    for j, v in enumerate(body.outputs[n_state:]):
        shape = None
        if v.shape is not None:
            a = out_axes[j] % (len(v.shape) + 1)
            shape = tuple(v.shape[:a]) + (None,) + tuple(v.shape[a:])
        result.append(_out(ctx, n_state + j, v, shape))
    return result


# ----- kernels -------------------------------------------------------------------------------
def _runner(ctx: NodeContext, attr: str):
    body = ctx.attr(attr)
    if not isinstance(body, Graph):
        raise ctx.unsupported(f"attribute {attr!r} is not a graph")
    if ctx.run_subgraph_factory is None:
        raise ctx.unsupported("its body runs only inside the runtime (no subgraph runner here)")
    return body, ctx.run_subgraph_factory(body, ctx.name)


def _flag(t) -> bool:
    if t.numel() != 1:
        raise ValueError(f"a condition must hold one element, got shape {list(t.shape)}")
    return bool(t.reshape(()).item())


def _single(outs: list, n: int):
    return outs[0] if n == 1 else tuple(outs)


@register("If", since=1, infer=_if_infer, foldable=False)
def _if(ctx: NodeContext):
    _, then_run = _runner(ctx, "then_branch")
    _, else_run = _runner(ctx, "else_branch")
    n = ctx.n_outputs

    def kernel(cond, *captures):
        return _single((then_run if _flag(cond) else else_run)([], captures), n)
    return kernel


def _stack(items: list, body_out: Value, axis: int, device) -> torch.Tensor:
    if items:
        return torch.stack(items, dim=axis)
    if body_out.shape is None or not all(isinstance(d, int) for d in body_out.shape) or not body_out.dtype:
        raise ValueError(f"zero iterations, and the shape of body output %{body_out.name} is not static")
    shape = list(body_out.shape)
    shape.insert(axis % (len(shape) + 1), 0)
    return torch.empty(shape, dtype=body_out.dtype.to_torch(), device=device)


@register("Loop", since=1, infer=_loop_infer, foldable=False)
def _loop(ctx: NodeContext):
    body, run = _runner(ctx, "body")
    n_carried = ctx.n_inputs - implicit_count(ctx.node) - 2
    n_scan = len(body.outputs) - 1 - n_carried
    if n_carried < 0 or n_scan < 0 or len(body.inputs) != n_carried + 2:
        raise ctx.unsupported(f"body has {len(body.inputs)} inputs and {len(body.outputs)} outputs "
                              f"for {n_carried} loop-carried values")
    scan_outs = body.outputs[1 + n_carried:]
    device = torch.device(ctx.device)
    limits, node = ctx.limits, ctx.node
    capped = limits.max_tensor_bytes is not None

    def kernel(trip, cond, *rest):
        carried, captures = list(rest[:n_carried]), rest[n_carried:]
        limit = None if trip is None else int(trip.reshape(()).item())
        keep = True if cond is None else _flag(cond)
        scans: list[list] = [[] for _ in range(n_scan)]
        i = 0
        while keep and (limit is None or i < limit):
            check_iterations(limits, node, i)
            outs = run([torch.tensor(i, dtype=torch.int64, device=device),
                        torch.tensor(keep, dtype=torch.bool, device=device)] + carried, captures)
            keep = _flag(outs[0])
            carried = list(outs[1:1 + n_carried])
            for j in range(n_scan):
                item = outs[1 + n_carried + j]
                if capped:          # the stacked scan output, before it grows past the cap
                    check_tensor(limits, node, (i + 1,) + tuple(item.shape), item.dtype, f"scan output {j}")
                scans[j].append(item)
            i += 1
        stacked = [_stack(s, v, 0, device) for s, v in zip(scans, scan_outs)]
        return _single(carried + stacked, n_carried + n_scan)
    return kernel


@register("Scan", since=9, infer=_scan_infer, foldable=False)
def _scan(ctx: NodeContext):
    body, run = _runner(ctx, "body")
    m = int(ctx.attr("num_scan_inputs"))
    n_explicit = ctx.n_inputs - implicit_count(ctx.node)
    n_state = n_explicit - m
    n_scan_out = len(body.outputs) - n_state
    if m < 1 or n_state < 0 or n_scan_out < 0 or len(body.inputs) != n_state + m:
        raise ctx.unsupported(f"body has {len(body.inputs)} inputs and {len(body.outputs)} outputs for "
                              f"{n_state} states and {m} scan inputs")
    in_axes = list(ctx.attr("scan_input_axes", [0] * m))
    in_dirs = list(ctx.attr("scan_input_directions", [0] * m))
    out_axes = list(ctx.attr("scan_output_axes", [0] * n_scan_out))
    out_dirs = list(ctx.attr("scan_output_directions", [0] * n_scan_out))
    if len(in_axes) != m or len(in_dirs) != m or len(out_axes) != n_scan_out or len(out_dirs) != n_scan_out:
        raise ctx.unsupported("scan axes / directions do not match the number of scan inputs / outputs")
    scan_outs = body.outputs[n_state:]
    device = torch.device(ctx.device)

    def kernel(*args):
        states = list(args[:n_state])
        xs, captures = args[n_state:n_explicit], args[n_explicit:]
        axes = [a % x.dim() for a, x in zip(in_axes, xs)]
        lengths = {x.shape[a] for a, x in zip(axes, xs)}
        if len(lengths) != 1:
            raise ValueError(f"scan inputs disagree on the sequence length: {sorted(lengths)}")
        steps = lengths.pop()
        collected: list[list] = [[] for _ in range(n_scan_out)]
        for t in range(steps):
            slices = [x.select(a, steps - 1 - t if d else t) for x, a, d in zip(xs, axes, in_dirs)]
            outs = run(states + slices, captures)
            states = list(outs[:n_state])
            for j in range(n_scan_out):
                collected[j].append(outs[n_state + j])
        results = []
        for j, items in enumerate(collected):
            if out_dirs[j]:
                items = items[::-1]
            rank = (items[0].dim() if items else len(scan_outs[j].shape or ())) + 1
            results.append(_stack(items, scan_outs[j], out_axes[j] % rank, device))
        return _single(states + results, n_state + n_scan_out)
    return kernel


def _scan8_infer(ctx: NodeContext):
    body = ctx.attr("body")
    m = int(ctx.attr("num_scan_inputs"))
    n_state = len(ctx.node.inputs) - implicit_count(ctx.node) - 1 - m
    feeds = []
    for j, v in enumerate(ctx.node.inputs[1:1 + n_state + m]):
        drop = 1 if j < n_state else 2          # batch axis; and the scan axis for scan inputs
        s = Value("x", v.dtype, None if v.shape is None else tuple(v.shape[drop:]))
        feeds.append((s, True))
    _infer_body(ctx, body, feeds)
    batch = ctx.node.inputs[1].shape[0] if ctx.node.inputs[1].shape else None
    result = []
    for j, v in enumerate(body.outputs):
        extra = (batch,) if j < n_state else (batch, None)
        result.append(_out(ctx, j, v, None if v.shape is None else extra + tuple(v.shape)))
    return result


@register("Scan", since=8, infer=_scan8_infer, foldable=False)
def _scan8(ctx: NodeContext):
    """Scan-8: a leading batch axis on states and scan inputs (scan axis 1), optional
    ``sequence_lens`` (only full lengths are supported: a shorter one is refused at run time)."""
    body, run = _runner(ctx, "body")
    m = int(ctx.attr("num_scan_inputs"))
    n_explicit = ctx.n_inputs - implicit_count(ctx.node)
    n_state = n_explicit - 1 - m
    n_scan_out = len(body.outputs) - n_state
    if m < 1 or n_state < 0 or n_scan_out < 0 or len(body.inputs) != n_state + m:
        raise ctx.unsupported(f"body has {len(body.inputs)} inputs and {len(body.outputs)} outputs for "
                              f"{n_state} states and {m} scan inputs")
    dirs = list(ctx.attr("directions", [0] * m))
    if len(dirs) != m:
        raise ctx.unsupported("directions do not match num_scan_inputs")

    def kernel(lens, *args):
        states, xs, captures = args[:n_state], args[n_state:n_explicit - 1], args[n_explicit - 1:]
        steps = xs[0].shape[1]
        if any(x.shape[1] != steps or x.shape[0] != xs[0].shape[0] for x in xs):
            raise ValueError("scan inputs disagree on batch or sequence length")
        if lens is not None and bool((lens != steps).any()):
            raise ValueError(f"sequence_lens {lens.tolist()} shorter than {steps} are not supported")
        per_batch = []
        for b in range(xs[0].shape[0]):
            st = [s[b] for s in states]
            collected: list[list] = [[] for _ in range(n_scan_out)]
            for t in range(steps):
                outs = run(st + [x[b].select(0, steps - 1 - t if d else t) for x, d in zip(xs, dirs)], captures)
                st = list(outs[:n_state])
                for j in range(n_scan_out):
                    collected[j].append(outs[n_state + j])
            per_batch.append(st + [torch.stack(c) for c in collected])
        return _single([torch.stack([r[j] for r in per_batch]) for j in range(n_state + n_scan_out)],
                       n_state + n_scan_out)
    return kernel


def _sequence_map_infer(ctx: NodeContext):
    body = ctx.attr("body")
    n = len(ctx.node.inputs) - implicit_count(ctx.node)
    feeds = []
    for v in ctx.node.inputs[:n]:
        if v is not None and v.meta.get("container") == "sequence":
            feeds.append((Value("x", DType(v.meta.get("elem_dtype", 0)), None), False))
        else:
            feeds.append((v, True))
    _infer_body(ctx, body, feeds)
    result = []
    for i, (out, bo) in enumerate(zip(ctx.node.outputs, body.outputs)):
        out.meta["container"] = "sequence"
        out.meta["elem_dtype"] = int(bo.dtype)
        result.append((None, None))
    return result


@register("SequenceMap", since=17, infer=_sequence_map_infer, foldable=False)
def _sequence_map(ctx: NodeContext):
    from .sequence import TensorSequence
    body, run = _runner(ctx, "body")
    n = ctx.n_inputs - implicit_count(ctx.node)
    if len(body.inputs) != n or len(body.outputs) != ctx.n_outputs:
        raise ctx.unsupported(f"body has {len(body.inputs)} inputs / {len(body.outputs)} outputs for a "
                              f"node with {n} / {ctx.n_outputs}")

    def kernel(*args):
        xs, captures = args[:n], args[n:]
        if not isinstance(xs[0], list):
            raise TypeError("SequenceMap input 0 must be a sequence")
        steps = len(xs[0])
        if any(isinstance(x, list) and len(x) != steps for x in xs):
            raise ValueError("SequenceMap sequences differ in length")
        results = [TensorSequence() for _ in range(ctx.n_outputs)]
        for i in range(steps):
            outs = run([x[i] if isinstance(x, list) else x for x in xs], captures)
            for seq, o in zip(results, outs):
                seq.append(o.clone())
        return _single(results, ctx.n_outputs)
    return kernel
