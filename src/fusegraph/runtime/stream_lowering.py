"""The backend's lowering applied to a stream plan: each stream's calls are cut where the
plan synchronises (a node that waits for an event starts a piece, a node that records one
ends it, a change between a hybrid plan's wide and narrow nodes cuts too), and each piece is
lowered on its own, with every stream's calls as the readers a lowered call must hand its
values to. So several streams run the same kind of kernels as one stream, and an event is
always waited for before, and recorded after, a whole call.
Lowering runs at the intra-op thread count the streams run at (kernels compile for it).
"""
from __future__ import annotations

from .threads import intra_op_threads


def first_name(call) -> str:
    """The plan's name of the first node a call runs (a lowered call may run several)."""
    nodes = getattr(call.node, "nodes", None)
    return nodes[0].name if nodes else call.node.name


def last_name(call) -> str:
    nodes = getattr(call.node, "nodes", None)
    return nodes[-1].name if nodes else call.node.name


def _pieces(calls: list, plan, wide: frozenset) -> list[list]:
    pieces, cur = [], []
    for call in calls:
        name = call.node.name
        if cur and (plan.waits.get(name) or ((name in wide) != (cur[-1].node.name in wide))):
            pieces.append(cur)
            cur = []
        cur.append(call)
        if name in plan.records:
            pieces.append(cur)
            cur = []
    if cur:
        pieces.append(cur)
    return pieces


def lower_streams(graph, binding, plan, wide: frozenset, probe, threads: int) -> tuple[list[list], list]:
    """(per stream, its lowered calls; the ``Lowered`` of every piece)."""
    backend = binding.backend
    by_name = {c.node.name: c for c in binding.calls}
    readers = list(binding.calls)
    per_stream, lowered = [], []
    with intra_op_threads(threads):
        for names in plan.per_stream:
            out = []
            for piece in _pieces([by_name[n] for n in names], plan, wide):
                got = backend.lower(graph, piece, binding, probe, readers)
                lowered.append(got)
                out += got.calls
            per_stream.append(out)
    return per_stream, lowered
