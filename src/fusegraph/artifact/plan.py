"""The execution plan and the bind strides an artifact stores, checked against its graph on load.

``plan_record(plan, strides)`` is what ``save`` writes beside the report: the ``ExecutionPlan``
(order, memory mode, arena slots, stream plan) and the strides the layout probe found for the
arena views at compile time (``runtime/layout_probe.py``), so that loading binds the same
views in the same arena without running every kernel once more.

``restore_plan(record, graph, where)`` rebuilds both and refuses, with an ``ArtifactError``,
anything that could make the loaded model crash, hang or write outside its buffers: an order
that is not a topological order of the graph's nodes, an unknown memory mode, a slot outside
the arena or smaller than its value, an arena larger than all its slots laid end to end,
strides that are not a dense layout of the value's shape, two values in overlapping arena
bytes that are live at the same time (``_check_overlap``), and a stream plan whose streams do
not follow the order, or whose waits name an event that is recorded later (a deadlock) or a
cross-stream input they do not order (a race). What the runtime reads of the planner's value
kinds (a view; an in-place takeover of an input's bytes) is derived from the graph and the
op registry and the stored kinds checked against it (``_check_kinds``), never trusted: a
convolution may not be made to write over the input it reads. It plans nothing: it only checks.
"""
from __future__ import annotations

from typing import Any

from .container import align, is_int, want
from ..errors import ArtifactError
from ..ir import Graph
from ..ir.shape import is_static
from ..plan.aliasing import inplace_candidates, view_source
from ..plan.exec_plan import ExecutionPlan
from ..plan.stream_memory import HappensBefore

MEMORY_MODES = ("off", "balanced", "tight")
_MAX_STREAMS = 256


def plan_record(plan: ExecutionPlan | None, strides: dict | None) -> dict | None:
    """``{"plan": ..., "strides": {value: [...]}}`` of a compiled model (None: no plan)."""
    if plan is None:
        return None
    return {"plan": plan.to_dict(), "strides": {k: list(v) for k, v in (strides or {}).items()}}


def _nbytes(v) -> int | None:
    if v.shape is None or not is_static(v.shape):
        return None
    n = v.dtype.to_torch().itemsize
    for d in v.shape:
        n *= int(d)
    return n


def _dense(shape: tuple[int, ...], strides: list) -> bool:
    if len(strides) != len(shape) or not all(is_int(s) and s >= 0 for s in strides):
        return False
    expected = 1
    for stride, size in sorted((st, sz) for st, sz in zip(strides, shape) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _check_order(plan: ExecutionPlan, graph: Graph, where: str) -> dict[str, int]:
    want(isinstance(plan.order, list) and all(isinstance(n, str) for n in plan.order),
         f"{where}: the stored plan's order is malformed")
    names = [n.name for n in graph.nodes]
    want(len(plan.order) == len(names) and set(plan.order) == set(names),
         f"{where}: the stored plan's order does not name each of the graph's nodes once")
    pos = {name: i for i, name in enumerate(plan.order)}
    made = {id(o): pos[n.name] for n in graph.nodes for o in n.outputs}
    for n in graph.nodes:
        for v in n.inputs:
            if v is not None and made.get(id(v), -1) >= pos[n.name]:
                raise ArtifactError(f"{where}: the stored plan runs node {n.name!r} before the producer "
                                    f"of its input {v.name!r}")
    return pos


def _check_arena(plan: ExecutionPlan, graph: Graph, strides: dict, where: str) -> dict[str, tuple]:
    want(plan.memory_mode in MEMORY_MODES, f"{where}: unknown memory mode {str(plan.memory_mode)[:40]!r}")
    want(is_int(plan.arena_bytes) and plan.arena_bytes >= 0, f"{where}: malformed arena size")
    values = {v.name: v for n in graph.nodes for v in n.outputs}
    total = 0
    for name, (off, size) in plan.slots.items():
        v = values.get(name)
        want(v is not None, f"{where}: the stored plan gives arena bytes to unknown value {str(name)[:80]!r}")
        need = _nbytes(v)
        want(need is not None and 0 <= off and need <= size and off + size <= plan.arena_bytes,
             f"{where}: arena slot ({off}, {size}) of {name!r} does not hold it inside an arena of "
             f"{plan.arena_bytes} bytes")
        total += align(size)
    want(plan.arena_bytes <= total + 64, f"{where}: arena of {plan.arena_bytes} bytes is larger than all "
                                         f"its slots end to end ({total})")
    want(isinstance(plan.kinds, dict) and all(isinstance(k, str) for k in plan.kinds.values()),
         f"{where}: the stored plan's value kinds are malformed")
    out = {}
    want(isinstance(strides, dict), f"{where}: stored strides are malformed")
    for name, st in strides.items():
        v = values.get(name)
        want(v is not None and name in plan.slots and isinstance(st, list)
             and _dense(tuple(int(d) for d in v.shape), st),
             f"{where}: stored strides of {str(name)[:80]!r} are not a dense layout of its arena slot")
        out[name] = tuple(st)
    return out


def _check_streams(sp: Any, graph: Graph, pos: dict[str, int], where: str) -> None:
    """Run the stream plan symbolically: advance any stream whose next node's waits are all
    recorded (stuck before the end: a deadlock), keeping vector clocks (``clock[k][j]``: how
    many of stream j's nodes stream k knows are finished) to check every input is ordered."""
    n = sp.num_streams
    want(is_int(n) and 1 <= n <= min(_MAX_STREAMS, max(1, len(pos))), f"{where}: absurd stream count {n!r}")
    want(isinstance(sp.stream_of, dict) and set(sp.stream_of) == set(pos)
         and all(is_int(s) and 0 <= s < n for s in sp.stream_of.values()),
         f"{where}: the stream plan does not put each node on one of its {n} streams")
    want(len(sp.per_stream) == n and sorted(x for lst in sp.per_stream for x in lst) == sorted(pos)
         and all(sp.stream_of[x] == k for k in range(n) for x in sp.per_stream[k]),
         f"{where}: the stream plan's per-stream lists do not match its stream assignment")
    events = {}
    for e in sp.events:
        want(is_int(e.id) and e.id not in events and e.producer in pos and e.stream == sp.stream_of[e.producer]
             and sp.records.get(e.producer) == e.id, f"{where}: stream event {e.id!r} is malformed")
        events[e.id] = e
    want(len(sp.records) == len(events), f"{where}: the stream plan records events it does not declare")
    want(set(sp.waits) <= set(pos), f"{where}: the stream plan waits on behalf of unknown nodes")
    nodes = {nd.name: nd for nd in graph.nodes}
    producer = {id(o): nd.name for nd in graph.nodes for o in nd.outputs}
    index = {x: i for k in range(n) for i, x in enumerate(sp.per_stream[k])}
    clock = [[0] * n for _ in range(n)]
    done_at: dict[str, list[int]] = {}
    ptr, left = [0] * n, len(pos)
    while left:
        moved = False
        for k in range(n):
            while ptr[k] < len(sp.per_stream[k]):
                name = sp.per_stream[k][ptr[k]]
                waits = [events.get(eid) for eid in sp.waits.get(name, [])]
                if not all(e is not None and e.producer in done_at for e in waits):
                    break
                mine = clock[k]
                for e in waits:
                    mine[:] = [max(a, b) for a, b in zip(mine, done_at[e.producer])]
                for v in nodes[name].inputs:
                    p = None if v is None else producer.get(id(v))
                    if p is not None and mine[sp.stream_of[p]] <= index[p]:
                        raise ArtifactError(f"{where}: node {name!r} reads {v.name!r} from another stream "
                                            f"without waiting for it (a race)")
                mine[k] = index[name] + 1
                done_at[name] = list(mine)
                ptr[k], left, moved = ptr[k] + 1, left - 1, True
        want(moved, f"{where}: the stream plan deadlocks: every stream waits on an event never recorded")


def _touches(graph: Graph, named: dict[str, Any]) -> dict[str, tuple[set[str], bool]]:
    """Per arena value: the nodes that read its bytes (its users and, through view ops, the
    users of its views) and whether it must survive the run (it or a view of it is an output)."""
    outputs = {id(v) for v in graph.outputs}
    out = {}
    for name, v in named.items():
        readers, pinned, stack = set(), False, [v]
        while stack:
            x = stack.pop()
            pinned |= id(x) in outputs
            for u in x.users:
                readers.add(u.name)
                if view_source(u) is not None and u.inputs[view_source(u)] is x:
                    stack.append(u.outputs[0])
        out[name] = (readers, pinned)
    return out


def _arena_root(v, slots: dict) -> str | None:
    """The slotted value whose bytes ``v`` is (itself, or the source of the views it is)."""
    seen = 0
    while v is not None and v.name not in slots and seen < 10_000:
        p = v.producer
        src = None if p is None else view_source(p)
        if src is None or p.outputs[0] is not v:
            return None
        v, seen = p.inputs[src], seen + 1
    return None if v is None or v.name not in slots else v.name


def _check_kinds(plan: ExecutionPlan, graph: Graph, where: str) -> dict[str, str]:
    """The value kinds the runtime reads, derived from the graph and the op registry rather than
    taken from the file: a ``view`` must be output 0 of a view op (``OpDef.alias``); an
    ``inplace`` value must be output 0 of a node that may write over that input
    (``aliasing.inplace_candidates``: elementwise, or a declared in-place pair such as a
    convolution's residual), in the very slot of that input's bytes, which the node reads through
    no other input. Returns ``{in-place value: the value whose bytes it takes over}``."""
    made = {o.name: (n, k) for n in graph.nodes for k, o in enumerate(n.outputs)}
    takes: dict[str, str] = {}
    for name, kind in plan.kinds.items():
        if kind not in ("view", "inplace"):
            continue
        node, k = made.get(name, (None, None))
        if kind == "view":
            want(node is not None and k == 0 and view_source(node) is not None,
                 f"{where}: the stored plan calls {str(name)[:80]!r} a view, which its op "
                 f"({node.op_type if node is not None else 'none'}) does not make (tampered plan)")
            continue
        source = None
        if node is not None and k == 0 and name in plan.slots:
            roots = [_arena_root(v, plan.slots) if v is not None else None for v in node.inputs]
            for i in inplace_candidates(node):
                r = roots[i]
                if r is not None and plan.slots[r][0] == plan.slots[name][0] and \
                        sum(1 for x in roots if x == r) == 1:
                    source = r
                    break
        want(source is not None, f"{where}: the stored plan has {str(name)[:80]!r} take over an input's "
                                 f"bytes in place, which its op "
                                 f"({node.op_type if node is not None else 'none'}) may not do there "
                                 f"(tampered plan)")
        takes[name] = source
    return takes


def _check_overlap(plan: ExecutionPlan, graph: Graph, pos: dict[str, int], where: str,
                   takes: dict[str, str]) -> None:
    """No two values whose arena bytes overlap are live at once: every node touching one is
    ordered (by the order, or with streams by stream order and events) before the producer of
    the other. The one exception is the planner's in-place takeover, as ``_check_kinds``
    derived it (``takes``): a value may take the bytes of the input of its producer it was
    derived to take over, when nothing reads them after that producer."""
    named = {o.name: o for n in graph.nodes for o in n.outputs if o.name in plan.slots}
    touch = _touches(graph, named)
    by_name = {n.name: n for n in graph.nodes}
    if plan.streams is not None:
        hb = HappensBefore([by_name[n] for n in plan.order], plan.streams)
        desc = {name: hb.desc[hb.step[name]] for name in pos}

        def before(a: str, b: str) -> bool:
            return bool(desc[a] >> hb.step[b] & 1)
    else:
        def before(a: str, b: str) -> bool:
            return pos[a] < pos[b]

    def done_before(a: str, b: str) -> bool:   # every touch of a before b is written (or in place)
        readers, pinned = touch[a]
        writer = named[b].producer.name
        if pinned or not before(named[a].producer.name, writer):
            return False
        late = [r for r in readers if not before(r, writer)]
        return not late or (late == [writer] and takes.get(b) == a)

    spans = sorted((off, off + size, name) for name, (off, size) in plan.slots.items() if size > 0)
    for i, (lo, hi, a) in enumerate(spans):
        for lo2, _, b in spans[i + 1:]:
            if lo2 >= hi:
                break
            if not (done_before(a, b) or done_before(b, a)):
                raise ArtifactError(f"{where}: the stored plan puts {a!r} and {b!r} in overlapping arena "
                                    f"bytes while both are live (corrupt or tampered plan)")


def restore_plan(record: Any, graph: Graph, where: str) -> tuple[ExecutionPlan | None, dict]:
    """The ``ExecutionPlan`` and strides stored in the report part ``record`` (a dict with
    ``plan`` and ``strides``), checked against ``graph``; (None, {}) when no plan was stored."""
    want(isinstance(record, dict), f"{where}: the stored plan record is malformed")
    if record.get("plan") is None:
        return None, {}
    want(isinstance(record["plan"], dict), f"{where}: the stored plan is malformed")
    try:
        plan = ExecutionPlan.from_dict(record["plan"])
    except ArtifactError as exc:      # a malformed stream plan, named by its field
        raise ArtifactError(f"{where}: the stored plan is malformed: {exc}") from None
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise ArtifactError(f"{where}: the stored plan is malformed: {type(exc).__name__}: {exc}") from None
    pos = _check_order(plan, graph, where)
    strides = _check_arena(plan, graph, record.get("strides", {}), where)
    if plan.streams is not None:
        _check_streams(plan.streams, graph, pos, where)
    _check_overlap(plan, graph, pos, where, _check_kinds(plan, graph, where))
    return plan, strides
