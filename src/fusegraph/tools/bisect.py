"""Pass bisect: the first pass, and within it the first rule application, after which a
model's outputs diverge from a reference beyond tolerance (``fusegraph bisect``).

``bisect(model, reference="O0"|"onnxruntime", rtol, atol, config) -> BisectResult``:

1. the reference outputs on random inputs: the unoptimised graph compiled at O0 (or
   onnxruntime with every graph optimisation off, for an ONNX model);
2. the pipeline of ``config.level`` runs on a fresh import with ``PassManager(on_pass=...)``;
   after every pass run that changed the graph, a copy of the graph (``ir.serialize``) is
   compiled at O0 (no pass runs, no memory plan) and run on the same inputs. The first pass
   run whose outputs diverge is the culprit pass;
3. within it (rule-driven passes: rewrite rule sets and fusion), the pipeline runs again on
   fresh imports, stopped right after the m-th rule application of that pass run
   (``PassOptions(on_apply=...)``), and m is bisected: the first application whose graph
   diverges names the rule and its nodes; the IR before and after it is kept (the nodes the
   application removed and the nodes it made, and both whole graphs);
4. when every pass keeps the outputs, the compiled model itself is run: a divergence there
   lies in planning or the runtime (memory plan, streams, segments), not in a pass.

Pass runs are deterministic (node names are drawn in order), so each fresh import replays
the same rewrites. The precision bisect (``--precision bf16``: the ops whose reduced precision
costs the most accuracy) is ``precision_bisect.py``. Nothing here changes what the
compiler does: it only drives it.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import FusegraphError, UsageError
from ..report.printable import printable


class _Stop(Exception):
    """Raised from the pass hooks to stop the pipeline at the point being bisected."""


@dataclass
class Divergence:
    stage: str                      # "pass" | "planning/runtime"
    pass_index: int = -1            # index of the pass run (in report.passes order)
    pass_name: str = ""
    group: str = ""
    iteration: int = 0
    rule: str = ""
    application: int = 0            # 1-based, within the pass run
    applications: int = 0           # rule applications of that pass run
    nodes: list[str] = field(default_factory=list)     # what the application replaced
    removed: list[str] = field(default_factory=list)   # IR lines of nodes gone after it
    added: list[str] = field(default_factory=list)     # IR lines of nodes it made
    error: dict[str, Any] = field(default_factory=dict)
    ir_before: str = ""
    ir_after: str = ""


@dataclass
class BisectResult:
    model: str
    reference: str
    rtol: float
    atol: float
    level: str
    pass_runs: int
    evaluations: int
    found: Divergence | None

    def to_text(self) -> str:
        head = (f"{printable(self.model)}: {self.level} vs reference {self.reference} (rtol={self.rtol:g}, "
                f"atol={self.atol:g}); {self.pass_runs} pass runs, {self.evaluations} graphs evaluated")
        f = self.found
        if f is None:
            return head + "\nno divergence: every pass and the compiled model match the reference"
        err = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={printable(v)}" for k, v in f.error.items())
        if f.stage != "pass":
            return (head + f"\nevery pass keeps the outputs, but the compiled model diverges ({err}): "
                    f"the fault is in planning or the runtime (memory plan, streams, segments); "
                    f"try --memory off / --streams 1")
        where = f" (group {printable(f.group)}, iteration {f.iteration})" if f.group else ""
        lines = [head, f"first divergent pass: {printable(f.pass_name)}{where}, pass run #{f.pass_index}"]
        if f.rule:
            lines.append(f"first divergent rule application: {printable(f.rule)} "
                         f"(application {f.application} of {f.applications} in that pass run)")
            lines.append(f"nodes: {', '.join(map(printable, f.nodes))}")
        else:
            lines.append("the pass is not rule-driven: the whole pass is the smallest step")
        lines.append(f"error: {err}")
        lines.append("IR before (the nodes this step removed or rewired):")
        lines += [printable(line) for line in f.removed] or ["  (none)"]
        lines.append("IR after (the nodes it made or rewired):")
        lines += [printable(line) for line in f.added] or ["  (none)"]
        return "\n".join(lines)


def _random_feeds(graph, seed: int = 0) -> dict[str, np.ndarray]:
    from ..runtime.feeds import random_feeds
    return random_feeds(graph.inputs, seed)


def compare_outputs(got: dict, ref: dict, rtol: float, atol: float) -> dict[str, Any] | None:
    """None when every reference output is matched within tolerance; else the worst error."""
    worst: dict[str, Any] | None = None
    for name, r in ref.items():
        g = got.get(name)
        r = np.asarray(r)
        if g is None or np.asarray(g).shape != r.shape:
            return {"output": name, "shape": str(None if g is None else np.asarray(g).shape)}
        g = np.asarray(g)
        if not np.issubdtype(r.dtype, np.floating):
            if not np.array_equal(g, r):
                return {"output": name, "mismatches": int((g != r).sum())}
            continue
        if np.allclose(g, r, rtol=rtol, atol=atol, equal_nan=True):
            continue
        diff = np.abs(g.astype(np.float64) - r)
        err = {"output": name, "max_abs": float(np.nanmax(diff)) if diff.size else 0.0,
               "max_rel": float(np.nanmax(diff / (np.abs(r) + atol))) if diff.size else 0.0}
        if worst is None or err["max_abs"] > worst.get("max_abs", 0.0):
            worst = err
    return worst


class _Bisector:
    def __init__(self, model, config, feeds, reference_outputs, rtol, atol, tick: Callable[[str], None]):
        self.model, self.config, self.feeds = model, config, feeds
        self.ref, self.rtol, self.atol, self.tick = reference_outputs, rtol, atol, tick
        self.evaluations = 0

    def fresh(self):
        from ..compiler.driver import import_model
        from ..ops import infer_graph
        graph = import_model(self.model)
        infer_graph(graph)
        graph.meta.setdefault("output_names", [v.name for v in graph.outputs])
        return graph

    def evaluate(self, graph) -> dict[str, Any] | None:
        """Compile a copy of ``graph`` at O0 (no pass, no memory plan), run it, compare."""
        from ..compiler import compile as fg_compile
        from ..config import Config
        from ..ir.serialize import copy_graph
        self.evaluations += 1
        try:
            copy = copy_graph(graph)
            model = fg_compile(copy, Config(level="O0", memory="off", cpu_kernels="portable",
                                            threads=self.config.threads))
        except FusegraphError as exc:   # a pass that leaves an unrunnable graph is a culprit too
            return {"cannot run": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
        try:
            return compare_outputs(model.run(self.feeds), self.ref, self.rtol, self.atol)
        except FusegraphError as exc:
            return {"cannot run": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
        finally:
            model.close()

    def replay(self, on_pass=None, on_apply=None):
        """Run the pipeline on a fresh import with the given hooks (``passes.optimize``, as
        ``compile`` does); the graph where it stopped."""
        from ..passes import optimize, options_from_config
        from ..report.compile_report import CompileReport
        graph = self.fresh()
        options = dataclasses.replace(options_from_config(self.config), on_apply=on_apply)
        try:
            optimize(graph, self.config, CompileReport(), options, on_pass=on_pass)
        except _Stop:
            pass
        return graph

    def first_pass(self):
        """(index, stat, error, graph text before) of the first divergent pass run, or None."""
        from ..ir.printer import format_graph
        runs: list = []
        found: list = []
        before = [format_graph(self.fresh())]

        def on_pass(stat, graph):
            runs.append(stat)
            self.tick(f"pass {len(runs)}: {stat.name}")
            if not stat.changed:
                return
            err = self.evaluate(graph)
            if err is not None:
                found.append((len(runs) - 1, stat, err, before[0]))
                raise _Stop()
            before[0] = format_graph(graph)
        self.replay(on_pass=on_pass)
        return (found[0] if found else None), len(runs)

    def stopped_at(self, k: int, m: int):
        """The graph after pass runs 0..k-1 and the first ``m`` rule applications of run k;
        also what the m-th application replaced."""
        done = [0]
        applied: list = []

        def on_pass(stat, graph):
            done[0] += 1
            if done[0] >= k + 1 or (m == 0 and done[0] >= k):
                raise _Stop()

        def on_apply(rule, nodes):
            if done[0] == k:
                applied.append((rule, list(nodes)))
                if len(applied) >= m:
                    raise _Stop()
        if k == 0 and m == 0:
            return self.fresh(), None
        graph = self.replay(on_pass=on_pass, on_apply=on_apply)
        return graph, (applied[m - 1] if m and len(applied) >= m else None)


def _node_lines(graph) -> dict[str, str]:
    from ..ir.printer import format_node
    return {n.name: format_node(n) for n in graph.nodes}


def bisect(model: Any, *, reference: str = "O0", rtol: float = 1e-3, atol: float = 1e-4, config=None,
           feeds: dict | None = None, progress: bool = False) -> BisectResult:
    """Find the first pass run and rule application after which ``model``'s outputs diverge
    from ``reference`` beyond ``rtol`` / ``atol`` (see the module doc)."""
    from ..compiler import compile as fg_compile
    from ..config import Config
    from ..ir.printer import format_graph
    if reference not in ("O0", "onnxruntime"):
        raise UsageError(f"bisect: reference must be 'O0' or 'onnxruntime', got {reference!r}")
    config = config or Config()
    with StepProgress(progress) as tick:
        b = _Bisector(model, config, {}, {}, rtol, atol, tick)
        graph0 = b.fresh()
        b.feeds = feeds if feeds is not None else _random_feeds(graph0)
        tick("reference")
        b.ref = _reference(model, graph0, b, reference)
        hit, pass_runs = b.first_pass()
        name = str(graph0.meta.get("source", graph0.name))
        result = BisectResult(name, reference, rtol, atol, config.level, pass_runs, b.evaluations, None)
        if hit is None:
            tick("compiled model")
            compiled = fg_compile(model, config)
            try:
                err = compare_outputs(compiled.run(b.feeds), b.ref, rtol, atol)
            finally:
                compiled.close()
            if err is not None:
                result.found = Divergence("planning/runtime", error=err)
            result.evaluations = b.evaluations
            return result
        k, stat, err, text_before = hit
        found = Divergence("pass", k, stat.name, str(stat.stats.get("group", "")),
                           int(stat.stats.get("iteration", 0)), error=err)
        apps = sum(stat.stats.get("applied", {}).values()) if isinstance(stat.stats.get("applied"), dict) else 0
        before_graph = after_graph = None
        if apps:
            lo, hi = 1, apps          # the first m whose graph diverges; m = apps does
            while lo < hi:
                mid = (lo + hi) // 2
                tick(f"{stat.name}: application {mid} of {apps}")
                graph, _ = b.stopped_at(k, mid)
                if b.evaluate(graph) is not None:
                    hi = mid
                else:
                    lo = mid + 1
            after_graph, what = b.stopped_at(k, lo)
            before_graph, _ = b.stopped_at(k, lo - 1)
            found.application, found.applications = lo, apps
            if what is not None:
                found.rule, found.nodes = what
            found.error = b.evaluate(after_graph) or err
            found.ir_before, found.ir_after = format_graph(before_graph), format_graph(after_graph)
        else:
            after_graph = b.stopped_at(k, 10 ** 9)[0]
            found.ir_before, found.ir_after = text_before, format_graph(after_graph)
            before_graph = b.stopped_at(k, 0)[0]
        old, new = _node_lines(before_graph), _node_lines(after_graph)
        found.removed = [line for n, line in old.items() if new.get(n) != line]
        found.added = [line for n, line in new.items() if old.get(n) != line]
        result.found, result.evaluations = found, b.evaluations
        return result


def _reference(model, graph0, b: _Bisector, reference: str) -> dict:
    if reference == "O0":
        from ..compiler import compile as fg_compile
        from ..config import Config
        ref_model = fg_compile(graph0, Config(level="O0", memory="off", cpu_kernels="portable",
                                              threads=b.config.threads))
        try:
            return ref_model.run(b.feeds)
        finally:
            ref_model.close()
    try:
        import onnxruntime as ort
    except ImportError:
        raise UsageError("--reference onnxruntime needs onnxruntime: pip install onnxruntime") from None
    import onnx
    proto = model if type(model).__name__ == "ModelProto" else onnx.load(str(model))
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    wanted = {i.name for i in sess.get_inputs()}
    outs = sess.run(names, {k: v for k, v in b.feeds.items() if k in wanted})
    return dict(zip(names, outs))


class StepProgress:
    """A rich spinner on stderr naming the step bisect is at (or nothing)."""

    def __init__(self, show: bool):
        self.show, self._p = show, None

    def __enter__(self) -> Callable[[str], None]:
        if not self.show:
            return lambda text: None
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
        self._p = Progress(SpinnerColumn(), TextColumn("bisect: {task.description}"), TimeElapsedColumn(),
                           console=Console(stderr=True), transient=True)
        self._p.__enter__()
        task = self._p.add_task("start", total=None)
        return lambda text: self._p.update(task, description=text)

    def __exit__(self, *exc) -> None:
        if self._p is not None:
            self._p.__exit__(*exc)
