"""The pass machinery: ``Pass`` protocol, ``PassResult``, fixed-point groups, ``PassManager``.

A pass is a small object with a ``name`` and ``run(graph) -> PassResult(changed, stats)``;
its options are given to its constructor (typed, see ``PassOptions``). The manager runs a
list of steps (passes and ``FixedPoint`` groups), records one ``PassStat`` per pass run,
verifies the graph (``Graph.verify`` with the op registry's inference) as it comes in and
after the last pass by default, and after every pass under ``verify_each`` (naming the pass
that broke it), keeps the seconds spent verifying (``verify_seconds``, and per pass in its
``PassStat``), writes the IR text after each pass to a dump folder when one is given, and
fails loudly when a fixed-point group does not converge within its iteration cap.

What pipelines exist and in which order is data, in ``pipeline.py``; this file knows no pass.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence, Union

from ..errors import PassError, VerifyError
from ..ir import Graph
from ..report.compile_report import PassStat

LOCKED_FLAGS = frozenset({"external", "no_fuse"})


@dataclass
class PassResult:
    changed: bool
    stats: dict[str, Any] = field(default_factory=dict)


class Pass(Protocol):
    name: str

    def run(self, graph: Graph) -> PassResult: ...


@dataclass(frozen=True)
class PassOptions:
    """Options every pass may read; built once from ``fg.Config`` by ``passes.optimize``.

    fold_size_limit: largest tensor (bytes) that folding or a rewrite may materialise.
    fold_broadcast_limit: largest logical size (bytes) of a folded one-value broadcast
    (kept as a stride-0 view of one element, see ``fold.py``).
    fast_math: assume no NaN / Inf / division by zero occurs (enables x*0 -> 0 and x/x -> 1
    on floats, and log/exp rewrites outside provable domains). Off unless asked for.
    disabled: pass and rule names not to run.
    aggressive_fusion: let fusion rules take the trade-offs they otherwise decline.
    on_apply: debugging (``fusegraph bisect``): called as ``on_apply(rule, nodes)`` after each
    rule application of a rule-driven pass, with the names of the nodes it replaced. Off (None)
    by default; it may raise to stop the pipeline right after that application.
    precision / op_precision: the mixed-precision policy and its per-node overrides
    (``precision.py``; ``fp32`` with no overrides: the pass does not run).
    """
    fold_size_limit: int = 64 * 1024 * 1024
    fast_math: bool = False
    disabled: frozenset[str] = frozenset()
    aggressive_fusion: bool = False
    fold_broadcast_limit: int = 4 * 1024 ** 3
    on_apply: Callable[[str, list[str]], None] | None = None
    precision: str = "fp32"
    op_precision: tuple[tuple[str, str], ...] = ()


@dataclass
class FixedPoint:
    """Run ``passes`` in order, again and again, until none of them changes the graph. Past
    ``max_iterations`` it goes on only while each iteration removes nodes (a measure that cannot
    fall forever, so the group still ends): a chain that folds one link per iteration (a deep
    transformer's shape reads, one layer after another) converges; two rewrites that undo each
    other do not, and are reported."""
    name: str
    passes: list
    max_iterations: int = 16


Step = Union[Pass, FixedPoint]


def is_locked(value) -> bool:
    """A value flagged ``external`` or ``no_fuse``: its producer must stay as it is."""
    return value is not None and bool(value.flags & LOCKED_FLAGS)


class PassManager:
    def __init__(self, steps: Sequence[Step], *, verify: bool = True, verify_each: bool = False,
                 infer: Callable | None = None, dump_dir: str | Path | None = None,
                 on_pass: Callable[[PassStat, Graph], None] | None = None):
        """``verify``: check the graph before the first pass and after the last (a fault found
        after the last names no pass: ``verify_each`` checks after every pass and names it).
        ``on_pass(stat, graph)`` (debugging, ``fusegraph bisect``): called after every pass
        run, once the graph is verified; it may raise to stop the pipeline there."""
        self.steps = list(steps)
        self.on_pass = on_pass
        self.verify = verify
        self.verify_each = verify_each
        self.infer = infer
        self.dump_dir = Path(dump_dir) if dump_dir else None
        self.verify_seconds = 0.0     # of the last run, every Graph.verify together
        self._dumps = 0

    def run(self, graph: Graph) -> list[PassStat]:
        stats: list[PassStat] = []
        self._dumps = 0
        self.verify_seconds = 0.0
        self._dump(graph, "input")
        if self.verify or self.verify_each:
            self._verify(graph, lambda exc: VerifyError(f"graph {graph.name!r} is invalid before any pass "
                                                        f"ran (as imported):\n{exc}"))
        for step in self.steps:
            if isinstance(step, FixedPoint):
                self._run_group(graph, step, stats)
            else:
                self._run_one(graph, step, stats, {})
        if self.verify and self.steps and not self.verify_each:   # verify_each checked after the last
            self._verify(graph, lambda exc: PassError(
                f"the pass pipeline left graph {graph.name!r} invalid (Config(verify_each=True) names "
                f"the pass):\n{exc}"))
        return stats

    def _verify(self, graph: Graph, error: Callable[[VerifyError], Exception]) -> float:
        """``graph.verify`` with the registry's inference; its seconds (added to
        ``verify_seconds``); ``error(exc)`` is raised when it fails."""
        t0 = time.perf_counter()
        try:
            graph.verify(infer=self.infer)
        except VerifyError as exc:
            raise error(exc) from exc
        finally:
            seconds = time.perf_counter() - t0
            self.verify_seconds += seconds
        return seconds

    def _run_group(self, graph: Graph, group: FixedPoint, stats: list[PassStat]) -> None:
        iteration = 0
        while True:
            iteration += 1
            nodes = len(graph.nodes)
            changed = [p.name for p in group.passes
                       if self._run_one(graph, p, stats, {"group": group.name, "iteration": iteration})]
            if not changed:
                return
            if iteration >= group.max_iterations and len(graph.nodes) >= nodes:
                break
        raise PassError(f"graph {graph.name!r}: fixed-point group {group.name!r} did not converge after "
                        f"{iteration} iterations; still changing: {', '.join(changed)}. "
                        f"Two rewrites probably undo each other; disable one with "
                        f"fg.Config(disabled_passes=(...,))")

    def _run_one(self, graph: Graph, p: Pass, stats: list[PassStat], extra: dict) -> bool:
        before = len(graph.nodes)
        t0 = time.perf_counter()
        result = p.run(graph)
        seconds = time.perf_counter() - t0
        stats.append(PassStat(p.name, seconds, before, len(graph.nodes), bool(result.changed),
                              {**result.stats, **extra}))
        if result.changed:
            self._dump(graph, p.name)
        if self.verify_each:
            stats[-1].verify_seconds = self._verify(graph, lambda exc: PassError(
                f"pass {p.name!r} left graph {graph.name!r} invalid:\n{exc}"))
        if self.on_pass is not None:
            self.on_pass(stats[-1], graph)
        return bool(result.changed)

    def _dump(self, graph: Graph, label: str) -> None:
        if self.dump_dir is None:
            return
        self.dump_dir.mkdir(parents=True, exist_ok=True)
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", graph.name) or "graph"
        path = self.dump_dir / f"{safe}.{self._dumps:03d}.{label}.txt"
        path.write_text(str(graph) + "\n")
        self._dumps += 1
