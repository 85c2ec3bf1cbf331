"""Precision bisect: the ops whose reduced precision costs a model the most accuracy
(``fusegraph bisect MODEL --precision bf16``).

``precision_bisect(model, precision="bf16"|"fp16"|"int8", config, feeds, top) -> PrecisionBisectResult``
(int8: ``int8_bisect.int8_ranking``, which measures each product by compiles instead of the hooks below):

1. the reference: the model compiled at float32, its outputs on the given feeds or on random
   inputs of its specs;
2. the model compiled at ``precision``: its whole-model error (the largest relative L2 error
   of any float output against the reference) and, from ``report.precision["nodes"]``, every
   node the policy runs in the reduced type (``REDUCE`` ops, and ``FOLLOW`` ops whose inputs
   are reduced: an elementwise Add / Sub after a conv runs reduced too);
3. each such node's sensitivity, shared with ``precision="auto"``
   (``precision_auto.sensitivity``): the outputs' error when only that node's outputs are
   rounded to the reduced type in the float32 reference, one hooked run per node.

Node names agree between the two compiles: the precision pass runs last and only adds casts.
Rounding a node's output is what the reduced model does to it (a fused elementwise chain, too,
computes in float32 and rounds once); the rounding of its weights is not simulated. Nothing
here changes what the compiler does: it only drives it, as ``bisect.py`` does.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import UsageError
from ..compiler.accuracy import worst_error
from ..report.printable import printable

DTYPES = ("bf16", "fp16", "int8")


@dataclass
class RankedOp:
    node: str
    op: str
    dtype: str
    sensitivity: float           # outputs' relative L2 error with only this node rounded (NaN: not measured)
    why: str                     # the policy's reason for running it reduced
    fused_from: list[str] = field(default_factory=list)    # the model's nodes fused into it

    @property
    def label(self) -> str:
        return self.node + (f" ({', '.join(self.fused_from)})" if self.fused_from else "")


@dataclass
class PrecisionBisectResult:
    model: str
    precision: str
    error: float                 # the whole model at ``precision`` against float32
    ranked: list[RankedOp] = field(default_factory=list)    # every reduced node, most sensitive first
    top: int = 10
    calibration: str | None = None    # int8: what the activations' ranges were calibrated on

    @property
    def worst(self) -> RankedOp | None:
        return self.ranked[0] if self.ranked else None

    def _head(self) -> str:
        head = (f"{printable(self.model)}: {self.precision} vs fp32: whole-model relative L2 error {self.error:.3g}; "
                f"{len(self.ranked)} node(s) run in {self.precision}")
        return head + (f"; calibration: {printable(self.calibration)}" if self.calibration else "")

    def _alone(self) -> str:
        return ("only that product quantised to int8, the others float32" if self.precision == "int8"
                else f"only that op rounded to {self.precision}")

    def to_text(self, top: int | None = None) -> str:
        top = self.top if top is None else top
        lines = [self._head()]
        if not self.ranked:
            return lines[0] + f"\nno node runs in {self.precision}: nothing to rank"
        lines.append(f"most sensitive ops (outputs' relative L2 error with {self._alone()}):")
        labels = [printable(r.label) for r in self.ranked[:top]]
        width = max(len(label) for label in labels)
        for i, (r, label) in enumerate(zip(self.ranked[:top], labels), 1):
            lines.append(f"  {i:>3}  {label:<{width}}  {printable(r.op):<18} {_sci(r.sensitivity):>9}  "
                         f"{printable(r.why)}")
        if len(self.ranked) > top:
            lines.append(f"  ... {len(self.ranked) - top} more")
        return "\n".join(lines)

    def render(self, top: int | None = None):
        """A rich table of the ``top`` most sensitive ops, the whole-model error as its caption."""
        from rich.markup import escape
        from rich.table import Table
        from rich.text import Text
        top = self.top if top is None else top
        table = Table(title=escape(f"{printable(self.model)}: ops ranked by their {self.precision} sensitivity"),
                      caption=escape(self._head() + ("" if len(self.ranked) <= top else
                                                     f"; {len(self.ranked) - top} more not shown")))
        table.add_column("#", justify="right")
        table.add_column("node", no_wrap=True)
        table.add_column("op", no_wrap=True)
        table.add_column("rel L2 error", justify="right", no_wrap=True)
        table.add_column("why it runs reduced", min_width=20)
        for i, r in enumerate(self.ranked[:top], 1):
            fused = f"\n[dim]fused from {escape(', '.join(map(printable, r.fused_from)))}[/dim]" if r.fused_from else ""
            table.add_row(str(i), Text(printable(r.node)), Text(printable(r.op)), _sci(r.sensitivity),
                          escape(printable(r.why)) + fused)
        return table

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "precision": self.precision, "error": self.error,
                "calibration": self.calibration, "ranked": [vars(r).copy() for r in self.ranked]}


def _sci(v: float) -> str:
    return "-" if math.isnan(v) else f"{v:.3g}"


def precision_bisect(model: Any, precision: str = "bf16", config=None, feeds: dict | None = None,
                     top: int = 10, progress: bool = False, calibration: list[dict] | None = None
                     ) -> PrecisionBisectResult:
    """Rank the nodes ``precision`` would reduce by the accuracy each costs alone (see the
    module doc); ``config``: the rest of the compile (its ``op_precision`` holds on the reduced
    side)."""
    import torch

    from ..compiler.driver import import_model
    from ..compiler import compile as fg_compile
    from ..config import Config
    from ..ir.serialize import copy_graph
    from ..ops import infer_graph
    from ..compiler.precision_auto import sensitivity
    from .bisect import StepProgress
    if precision not in DTYPES:
        raise UsageError(f"precision bisect: precision must be one of {', '.join(DTYPES)}, got {precision!r}")
    if precision == "int8":
        from .int8_bisect import int8_ranking
        found = int8_ranking(model, config, calibration, feeds, progress)
        return PrecisionBisectResult(found.model, "int8", found.error,
                                     [RankedOp(r["node"], r["op"], "int8", found.sensitivity[r["node"]], r["why"])
                                      for r in found.rows], top, calibration=found.calibration)
    if calibration is not None:
        raise UsageError(f"precision bisect: calibration inputs apply to int8 (the activations' ranges); "
                         f"{precision} uses none")
    config = config or Config()
    graph = import_model(model)
    infer_graph(graph)
    name = str(graph.meta.get("source", graph.name))

    def fresh():       # each compile optimises its own copy (a Graph model is left as given)
        return copy_graph(graph)

    with StepProgress(progress) as tick:
        tick("fp32 reference")
        reference = fg_compile(fresh(), config.replace(precision="fp32", op_precision=()))
        try:
            feeds = feeds if feeds is not None else _random_feeds(reference.graph)
            want = reference.run(feeds)
            tick(f"{precision} model")
            reduced = fg_compile(fresh(), config.replace(precision=precision))
            try:
                error = worst_error(reduced.run(feeds), want)
                nodes = [r for r in (reduced.report.precision or {}).get("nodes", [])
                         if r["class"] in ("reduce", "follow") and r["dtype"] != "fp32"]
            finally:
                reduced.close()
            tick(f"sensitivity of {len(nodes)} node(s)")
            dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
            cost = sensitivity(reference, feeds, want, [r["node"] for r in nodes], dtype)
            fused = {n.name: list(n.meta.get("fused_from", ())) for n in reference.graph.nodes}
        finally:
            reference.close()
    ranked = [RankedOp(r["node"], r["op"], r["dtype"], cost.get(r["node"], float("nan")), r["why"],
                       [x for x in fused.get(r["node"], []) if x != r["node"]]) for r in nodes]
    # most sensitive first; a node not measured (no such node in the fp32 plan) last
    ranked.sort(key=lambda r: (math.isnan(r.sensitivity), 0.0 if math.isnan(r.sensitivity) else -r.sensitivity))
    return PrecisionBisectResult(name, precision, error, ranked, top)


def _random_feeds(graph) -> dict[str, np.ndarray]:
    from ..runtime.feeds import random_feeds
    return random_feeds(graph.inputs, 0)
