"""Lifetimes: the first and last step of every value for one execution order, and the arena
buffers (``memory.Buffer``) they need.

Step ``i`` is the ``i``-th node of the order; a node's inputs and outputs are all live at its
step. Rules:

- graph inputs are pinned: live from step 0, never written, not in the arena;
- graph outputs and ``external`` tensors are pinned to the last step (readable after the run);
- a node output nobody reads lives at its own step only (its kernel still writes it);
- views (``aliasing.VIEW_OPS``) get no buffer: they live in their source's buffer and extend it;
- an in-place candidate (``aliasing.inplace_candidates``) whose input buffer dies at that node
  takes that buffer over (``LifetimeOptions.inplace``), unless a value of that buffer is pinned
  (a graph output or external tensor must survive the run, even at the last step);
- user constraints: a lifetime override widens a buffer's span (never narrows it: a warning
  says so), ``exclusive`` buffers never share, a reuse group becomes one slot with several spans
  (its members must not overlap in time), ``external`` pins to the end;
- values without a static shape or a sized dtype are *unplannable* and listed with the reason.

Stream hooks: ``LifetimeOptions.release_after(value, last_step) -> step`` moves a value's
release later; with several streams, ``plan/stream_memory.py`` passes the last step that is
not ordered after every use (by stream order and events), so a buffer is reused only by a
node that an event or its own stream orders after the previous tenant's uses.
``LifetimeOptions.inplace_ok(node, values) -> bool`` vetoes an in-place takeover (a value of
that buffer is read on another stream, unordered with the node). The in-place decision looks
at the plain last use; the release hook only widens spans. Default: released at its last use.
Nothing here mutates the graph.
"""
from __future__ import annotations

import os

from dataclasses import dataclass, field
from typing import Callable, Mapping

from ..errors import ConfigError
from ..ir import DType, Graph, Node, Value
from ..ir.shape import numel
from .aliasing import inplace_candidates, view_source
from .memory import Buffer, Constraints, lower_bound


@dataclass(frozen=True)
class LifetimeOptions:
    views: bool = True
    inplace: bool = True
    tensor_lifetimes: tuple = ()     # (name, first_step, last_step)
    reuse_groups: tuple = ()         # tuples of names sharing one slot
    exclusive_tensors: tuple = ()
    external_tensors: tuple = ()
    release_after: Callable[[Value, int], int] | None = None  # stream hook, see module doc
    inplace_ok: Callable[[Node, list[Value]], bool] | None = None  # stream hook, see module doc
    # value name -> bytes (None: sized at run time; a string: why it has no bytes here),
    # instead of the static shapes' sizes: a plan for a bucket of input shapes (``buckets.py``)
    sizes: Mapping[str, int | str | None] | None = None

    @classmethod
    def from_config(cls, config, **overrides) -> "LifetimeOptions":
        kw = dict(tensor_lifetimes=tuple(config.tensor_lifetimes), reuse_groups=tuple(config.reuse_groups),
                  exclusive_tensors=tuple(config.exclusive_tensors),
                  external_tensors=tuple(config.external_tensors), inplace=config.memory != "off")
        kw.update(overrides)
        return cls(**kw)


@dataclass
class ValueLife:
    name: str
    first: int
    last: int
    size: int | None   # bytes; None when unplannable
    kind: str          # planned | view | inplace | input | const | unplannable
    buffer: str | None  # arena buffer holding it (None: not in the arena)


@dataclass
class Lifetimes:
    steps: int
    values: dict[str, ValueLife]
    buffers: list[Buffer]
    members: dict[str, list[str]]            # buffer -> value names living in it
    exclusive: frozenset
    unplannable: list[tuple[str, str]] = field(default_factory=list)   # (value, reason)
    inplace: list[tuple[str, str, str]] = field(default_factory=list)  # (node, input, output)
    warnings: list[str] = field(default_factory=list)

    def constraints(self, **kw) -> Constraints:
        return Constraints(exclusive=self.exclusive, **kw)

    @property
    def lower_bound_bytes(self) -> int:
        return lower_bound(self.buffers, self.constraints())


def value_bytes(v: Value) -> int | None:
    n = numel(v.shape)
    if n is None or v.dtype in (DType.UNDEFINED, DType.STRING) or "container" in v.meta:
        return None
    return n * v.dtype.itemsize


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 1 << 40


# A tensor larger than the machine's memory is never put in the arena (which is allocated when
# the model is bound): it is left to its kernel, which then fails at run time naming the node.
MAX_PLANNED_BYTES = _physical_memory()


def _why_unplannable(v: Value, sized: bool = False) -> str:
    if sized and "container" not in v.meta and v.dtype not in (DType.UNDEFINED, DType.STRING):
        return "its shape is known only when its kernel runs (it depends on data)"
    if "container" in v.meta:
        return f"a {v.meta['container'].replace('_', ' ')} (a list of tensors or None at run time), not a tensor"
    if v.dtype in (DType.UNDEFINED, DType.STRING):
        return f"dtype {v.dtype.name} has no fixed size"
    size = value_bytes(v)
    if size is not None:
        return f"{size} bytes is more than this machine's memory ({MAX_PLANNED_BYTES} bytes)"
    return f"shape {list(v.shape) if v.shape is not None else '*'} is not static"


def compute_lifetimes(graph: Graph, order: list[Node] | None = None,
                      options: LifetimeOptions = LifetimeOptions()) -> Lifetimes:
    order = list(graph.nodes) if order is None else list(order)
    end = max(len(order) - 1, 0)
    vals: dict[str, Value] = {}
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for v in graph.inputs:
        vals[v.name], first[v.name], last[v.name] = v, 0, 0
    for i, node in enumerate(order):
        for v in node.inputs:
            if v is not None and not v.is_const:
                if v.name not in first:
                    raise ValueError(f"order is not topological: {node.name} reads %{v.name} before it is made")
                last[v.name] = max(last[v.name], i)
        for o in node.outputs:
            vals[o.name], first[o.name], last[o.name] = o, i, i
    by_name = _name_index(vals)
    pinned = {v.name for v in graph.outputs if not v.is_const}
    pinned |= {_resolve(by_name, n, "external_tensors").name for n in options.external_tensors}
    for name in vals:
        if name in pinned:
            last[name] = end
    use_last = dict(last)   # plain last use: what the in-place decision looks at
    if options.release_after is not None:
        for name in vals:
            last[name] = min(end, max(last[name], int(options.release_after(vals[name], last[name]))))
    exclusive_values = {_resolve(by_name, n, "exclusive_tensors").name for n in options.exclusive_tensors}
    grouped = {_resolve(by_name, n, "reuse_groups").name for g in options.reuse_groups for n in g}
    both = sorted(exclusive_values & grouped)
    if both:
        raise ConfigError(f"tensor(s) {both} are both exclusive and in a reuse group; choose one")
    barred = exclusive_values | grouped

    root: dict[str, str] = {}
    kind: dict[str, str] = {}
    members: dict[str, list[str]] = {}
    given = options.sizes
    sizes = {name: value_bytes(v) if given is None else
             (given.get(name) if not isinstance(given.get(name), str) else None) for name, v in vals.items()}
    for v in graph.inputs:
        root[v.name], kind[v.name] = v.name, "input"
        members[v.name] = [v.name]
    inplace_log: list[tuple[str, str, str]] = []
    for i, node in enumerate(order):
        src = view_source(node) if options.views else None
        for k, o in enumerate(node.outputs):
            if src is not None and k == 0:
                s = node.inputs[src]
                if s.is_const:
                    root[o.name], kind[o.name] = s.name, "const"
                    continue
                r = root[s.name]
                root[o.name], kind[o.name] = r, "view"
                members[r].append(o.name)
                continue
            taken = None
            if options.inplace and k == 0 and o.name not in barred:
                taken = _inplace_target(node, i, root, kind, members, use_last, sizes, barred | pinned,
                                        options.sizes is not None)
                if taken is not None and options.inplace_ok is not None and \
                        not options.inplace_ok(node, [vals[m] for m in members[taken]]):
                    taken = None
            if taken is not None:
                root[o.name], kind[o.name] = taken, "inplace"
                members[taken].append(o.name)
                inplace_log.append((node.name, node.inputs[_first_input_with_root(node, root, taken)].name,
                                    o.name))
            else:
                root[o.name], kind[o.name] = o.name, "planned"
                members[o.name] = [o.name]

    lives: dict[str, ValueLife] = {}
    buffers: dict[str, Buffer] = {}
    unplannable: list[tuple[str, str]] = []
    for name, v in vals.items():
        r = root[name]
        k = kind[name]
        if k == "const":
            lives[name] = ValueLife(name, first[name], last[name], sizes[name], k, None)
            continue
        if kind[r] == "input":
            lives[name] = ValueLife(name, first[name], last[name], sizes[name],
                                    "input" if r == name else "view", None)
            continue
        if sizes[r] is None or sizes[r] > MAX_PLANNED_BYTES:
            told = given.get(r) if given is not None else None
            if isinstance(told, str):
                why = told if r == name else f"lives in %{r}: {told}"
            else:
                why = _why_unplannable(vals[r], given is not None) if r == name \
                    else f"lives in %{r}, which is unplannable"
            unplannable.append((name, why))
            lives[name] = ValueLife(name, first[name], last[name], None, "unplannable", None)
            continue
        lives[name] = ValueLife(name, first[name], last[name], sizes[name], k, r)
        if r == name:
            span_end = max(last[m] for m in members[r])
            buffers[r] = Buffer(r, sizes[r], ((first[r], span_end),))

    warnings: list[str] = []
    for name, lo, hi in options.tensor_lifetimes:
        v = _resolve(by_name, name, "tensor_lifetimes")
        b = lives[v.name].buffer
        if b is None:
            warnings.append(f"lifetime override for %{name} ignored: it is not in the arena")
            continue
        s, e = buffers[b].spans[0]
        lo, hi = max(0, int(lo)), min(end, int(hi))
        if lo > s or hi < e:
            warnings.append(f"lifetime override [{lo}, {hi}] for %{name} does not cover its uses "
                            f"[{s}, {e}]; widened to [{min(s, lo)}, {max(e, hi)}]")
        buffers[b] = Buffer(b, buffers[b].size, ((min(s, lo), max(e, hi)),))
    exclusive = frozenset(lives[n].buffer for n in exclusive_values if lives[n].buffer)
    buffer_members = {b: list(members[b]) for b in buffers}
    for gi, group in enumerate(options.reuse_groups):
        _merge_group(gi, group, by_name, lives, buffers, buffer_members)
    return Lifetimes(len(order), lives, list(buffers.values()), buffer_members, exclusive,
                     unplannable, inplace_log, warnings)


def _inplace_target(node, i, root, kind, members, last, sizes, barred, symbolic=False) -> str | None:
    out = node.outputs[0]
    for k in inplace_candidates(node, symbolic):
        v = node.inputs[k]
        r = root.get(v.name)
        if r is None or kind.get(r) != "planned" or sizes.get(r) is None or sizes[r] != sizes.get(out.name):
            continue
        if any(m in barred for m in members[r]) or max(last[m] for m in members[r]) != i:
            continue
        others = [w for w in node.inputs if w is not None and w is not v and root.get(w.name) == r]
        if others:  # another view of the same bytes is read in a different element order
            continue
        return r
    return None


def _first_input_with_root(node: Node, root: dict, r: str) -> int:
    return next(k for k, v in enumerate(node.inputs) if v is not None and root.get(v.name) == r)


def _name_index(vals: dict[str, Value]) -> dict[str, Value]:
    index = dict(vals)
    for v in vals.values():
        alias = v.meta.get("onnx_name")
        if alias and alias not in index:
            index[alias] = v
    return index


def _resolve(by_name: dict[str, Value], name: str, field_name: str) -> Value:
    try:
        return by_name[name]
    except KeyError:
        near = sorted(n for n in by_name if name.lower() in n.lower())[:5]
        hint = f"; similar names: {near}" if near else ""
        raise ConfigError(f"Config.{field_name} names tensor {name!r}, which is not an activation of "
                          f"this graph{hint}") from None


def _merge_group(gi, group, by_name, lives, buffers, buffer_members) -> None:
    roots: list[str] = []
    for name in group:
        v = _resolve(by_name, name, "reuse_groups")
        b = lives[v.name].buffer
        if b is None or b not in buffers:
            raise ConfigError(f"Config.reuse_groups[{gi}]: %{name} is not an arena tensor (an input, "
                              f"a constant, unplannable, or already in another group)")
        if b not in roots:
            roots.append(b)
    if len(roots) < 2:
        return
    spans = sorted(s for r in roots for s in buffers[r].spans)
    for (s1, e1), (s2, e2) in zip(spans, spans[1:]):
        if s2 <= e1:
            raise ConfigError(f"Config.reuse_groups[{gi}] {list(group)}: members are live at the same "
                              f"time (steps {s1}-{e1} and {s2}-{e2}); they cannot share memory")
    name = f"reuse{gi}:{roots[0]}"
    merged = Buffer(name, max(buffers[r].size for r in roots), tuple(spans))
    names: list[str] = []
    for r in roots:
        del buffers[r]
        names += buffer_members.pop(r)
    buffers[name] = merged
    buffer_members[name] = names
    for n in names:
        lives[n].buffer = name
