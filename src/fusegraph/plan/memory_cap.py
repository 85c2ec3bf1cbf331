"""The activation-memory cap (``Config.max_arena_bytes``), checked once a memory plan exists.

A tiny model can ask for a huge arena (a 149-byte ConstantOfShape of 1000x1000x750 floats
plans a 3 GB arena) or a huge broadcast constant that binding materialises, or return an
output (an Expand bomb) that every run must copy out. ``check_memory_cap`` adds up what
binding will allocate — the planned arena and the broadcast constants made dense — and looks
at each graph input's and output's static size; over the cap it raises ``PlanError`` naming the total,
the limit, the biggest tensors and the knob. Pure: it reads sizes, allocates nothing.
"""
from __future__ import annotations

from ..errors import PlanError
from ..ir import Graph, is_broadcast
from .lifetime import value_bytes


def _mib(n: int) -> str:
    return f"{n / 2 ** 20:.1f} MiB" if n < 2 ** 30 else f"{n / 2 ** 30:.2f} GiB"


def check_memory_cap(graph: Graph, arena_bytes: int, limit: int | None) -> None:
    """Raise PlanError when binding ``graph`` with an ``arena_bytes`` arena would go over
    ``limit`` bytes (None: no cap)."""
    if limit is None:
        return
    dense = [(v.name, int(v.const.numel()) * v.const.element_size()) for v in graph.constants.values()
             if v.const is not None and is_broadcast(v.const)]
    total = int(arena_bytes) + sum(b for _, b in dense)
    if total > limit:
        sizes = [(v.name, b) for n in graph.nodes for v in n.outputs if (b := value_bytes(v))] + dense
        biggest = ", ".join(f"%{name} {_mib(b)}" for name, b in sorted(sizes, key=lambda p: -p[1])[:3])
        raise PlanError(f"{graph.name}: the memory plan needs {total} bytes ({_mib(total)}: arena "
                        f"{arena_bytes}, broadcast constants {total - arena_bytes}), over the limit of "
                        f"{limit} bytes ({_mib(limit)}); biggest tensors: {biggest}. Raise "
                        f"Config.max_arena_bytes (None: no cap) if the model really needs it")
    for kind, values in (("input", graph.inputs), ("output", graph.outputs)):
        for v in values:
            b = value_bytes(v)
            if b is not None and b > limit:
                raise PlanError(f"{graph.name}: graph {kind} %{v.name} ({v.type_str()}) holds {b} bytes "
                                f"({_mib(b)}), over the limit of {limit} bytes ({_mib(limit)}) that every "
                                f"run would have to {'feed' if kind == 'input' else 'return'}. Raise "
                                f"Config.max_arena_bytes (None: no cap) if the model really needs it")
