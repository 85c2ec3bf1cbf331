"""Calibration for post-training int8 quantisation: the range each activation tensor is
quantised over, from what it held while the float32 graph ran the calibration inputs.

``calibration_feeds(graph, given)`` checks the calibration inputs (a feed dict or a non-empty
list of them, each with the model's input names, shapes and types: an ``InputError`` naming
the calibration input and what was wrong). ``calibrate(graph, config, names, feeds)`` binds a
copy of ``graph`` at level O0 (nothing rewritten: the values observed are the ones the
quantisation pairs will be written on), runs it once per feed with a hook that hands each
observed tensor to its observer, and returns ``{name: Range}``:

- ``minmax``: the smallest and largest value seen (onnxruntime's MinMax);
- ``percentile``: a second run fills a histogram (``BINS`` bins over the min-max range) and
  ``(100 - Config.calibration_percentile) / 2`` % of the values are cut from each tail
  (onnxruntime's Percentile, two-sided);
- ``entropy``: a second run fills a histogram of ``|x|`` over ``[0, max |x|]`` (``BINS`` bins, or
  fewer for a tensor with few values: ``entropy_bins``) and the clipping
  threshold ``t`` is the one whose quantised histogram (``levels`` bins: 256 for a one-signed
  tensor, which uint8 spans with all its levels, 128 each side else) is nearest the float one
  in KL divergence (TensorRT's entropy calibration, as onnxruntime's Entropy does); the range
  is the min-max range clipped to ``[-t, t]``.

Non-finite values are left out of every observer, and exact zeros out of the entropy histogram. Nothing here quantises: the ranges go to
``passes/qdq_insert.py``.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import torch

from ..errors import InputError
from ..ir import Graph
from ..ir.serialize import copy_graph

BINS = 2048
SAMPLES_PER_BIN = 32          # entropy: the fewest values per histogram bin on average
EMPTY = 1e-12                 # entropy: what an empty bin of the quantised histogram counts as
MAX_THRESHOLDS = 256           # entropy: thresholds tried per tensor (evenly spaced over the bins)


class Range(NamedTuple):
    lo: float           # the range chosen
    hi: float
    min: float          # what the tensor held
    max: float


def calibration_feeds(graph: Graph, given: Any) -> list[dict]:
    """The calibration inputs as a list of feeds, each checked against the model's inputs."""
    from ..runtime.feeds import convert_feeds
    feeds = [given] if isinstance(given, dict) else list(given) if isinstance(given, (list, tuple)) else None
    if not feeds or not all(isinstance(f, dict) for f in feeds):
        raise InputError("calibration_inputs must be a feed dict ({input name: array}) or a non-empty list of them")
    model = str(graph.meta.get("source", graph.name))
    for i, feed in enumerate(feeds):
        convert_feeds(f"{model}: calibration input {i}", graph.inputs, feed)
    return feeds


def _finite(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().reshape(-1).to(torch.float32)
    return t if bool(torch.isfinite(t).all()) else t[torch.isfinite(t)]


class _MinMax:
    def __init__(self):
        self.min, self.max = math.inf, -math.inf
        self.count = 0

    def update(self, t: torch.Tensor) -> None:
        t = _finite(t)
        self.count += t.numel()
        if t.numel():
            lo, hi = torch.aminmax(t)
            self.min, self.max = min(self.min, float(lo)), max(self.max, float(hi))


class _Histogram:
    """A histogram of ``x`` over ``[lo, hi]`` (``absolute``: of ``|x|`` over ``[0, hi]``)."""

    def __init__(self, lo: float, hi: float, absolute: bool, bins: int = BINS):
        self.lo, self.hi, self.absolute, self.bins = lo, hi, absolute, bins
        self.counts = np.zeros(bins, np.float64)

    def update(self, t: torch.Tensor) -> None:
        t = _finite(t)
        if self.absolute:           # exact zeros (a Relu's) quantise exactly at any threshold: left out,
            t = t.abs()             # or their spike in the first bin, spread by the merging, favours clipping
            t = t[t > 0]
        if t.numel() and self.hi > self.lo:
            self.counts += torch.histc(t, self.bins, self.lo, self.hi).double().numpy()


def _run(graph: Graph, config, names: list[str], feeds: list[dict], make) -> dict[str, Any]:
    """``make(name)`` -> an observer per tensor name; each sees the tensor on every feed."""
    from ..passes import optimize
    from ..report import CompileReport
    from .planning import plan_and_bind
    observers = {n: make(n) for n in names}
    cfg = config.replace(level="O0", precision="fp32", op_precision=(), calibration="minmax",
                         calibration_percentile=99.999, streams=1, shape_cache=0)
    g = copy_graph(graph)
    optimize(g, cfg, CompileReport())
    model = plan_and_bind(g, cfg, CompileReport(), None)     # symbolic input dims: one compile for every shape
    by_node: dict[int, list[tuple[int, Any]]] = {}
    nodes = {n.name: n for n in model.graph.nodes}
    for index, node_name in enumerate(model.plan.order):
        node = nodes.get(node_name)
        for pos, v in enumerate(node.outputs if node is not None else ()):
            if v.name in observers:
                by_node.setdefault(index, []).append((pos, observers[v.name]))
    inputs = [v.name for v in graph.inputs if v.name in observers]

    def hook(index, phase, outputs):
        if phase == 1:
            for pos, observer in by_node.get(index, ()):
                observer.update(outputs[pos])

    seen = set(inputs) | {v.name for node in nodes.values() for v in node.outputs if v.name in observers}
    missing = [n for n in names if n not in seen]
    if missing:
        raise InputError(f"calibration: tensor(s) {missing[:5]} are not computed by the float32 graph")
    for feed in feeds:
        for name in inputs:
            observers[name].update(torch.as_tensor(np.asarray(feed[name])))
        model.run(feed, hook=hook)
    return observers


def entropy_bins(samples: int, levels: int) -> int:
    """Histogram bins for the entropy search over ``samples`` values: ``BINS``, fewer where the
    values are too few to fill them (``SAMPLES_PER_BIN`` on average; a sparse histogram's KL
    divergence measures its sampling noise, which favours clipping hard), never under
    ``levels`` (where the search keeps the whole range: min-max)."""
    bins = BINS
    while bins > levels and samples < bins * SAMPLES_PER_BIN:
        bins //= 2
    return max(bins, levels)


def entropy_threshold(counts: np.ndarray, levels: int) -> int:
    """The number of leading bins of ``counts`` (a histogram of ``|x|``) to keep: the one whose
    distribution quantised to ``levels`` bins diverges least (KL) from the float one, every
    value past it counted in its last bin."""
    counts = counts.astype(np.float64)
    n = counts.size
    if n <= levels:
        return n
    step = max(1, (n - levels) // MAX_THRESHOLDS)
    best, best_i = math.inf, n
    for i in list(range(levels, n, step)) + [n]:
        sliced = counts[:i]
        p = sliced.copy()
        p[-1] += counts[i:].sum()
        merged = i // levels
        index = np.minimum(np.arange(i) // merged, levels - 1)
        sums = np.bincount(index, weights=sliced, minlength=levels)
        nonzero = sliced != 0
        kept = np.bincount(index, weights=nonzero, minlength=levels)
        q = np.where(nonzero, sums[index] / np.maximum(kept[index], 1), 0.0)
        kl = _kl(p, q)
        if kl < best:
            best, best_i = kl, i
    return best_i


def _kl(p: np.ndarray, q: np.ndarray) -> float:
    """KL(p || q) of two histograms, each normalised; a bin that ``p`` fills and ``q`` leaves
    empty costs as if ``q`` held ``EMPTY`` there (a clip at an empty bin: far from ``p``)."""
    ps, qs = p.sum(), q.sum()
    if ps <= 0 or qs <= 0:
        return math.inf
    p, q = p / ps, q / qs
    mask = p > 0
    return float(np.sum(p[mask] * np.log(p[mask] / np.maximum(q[mask], EMPTY))))


def calibrate(graph: Graph, config, names: list[str], feeds: list[dict]) -> dict[str, Range]:
    """The range of every tensor in ``names`` under ``config.calibration``."""
    minmax = _run(graph, config, names, feeds, lambda n: _MinMax())
    seen = {n: (o.min, o.max) if o.min <= o.max else (0.0, 0.0) for n, o in minmax.items()}
    method = config.calibration
    if method == "minmax":
        return {n: Range(lo, hi, lo, hi) for n, (lo, hi) in seen.items()}
    absolute = method == "entropy"
    levels = {n: 256 if lo >= 0 or hi <= 0 else 128 for n, (lo, hi) in seen.items()}
    counts = {n: o.count for n, o in minmax.items()}

    def histogram(n):
        lo, hi = seen[n]
        if absolute:
            return _Histogram(0.0, max(abs(lo), abs(hi)), True, entropy_bins(counts[n], levels[n]))
        return _Histogram(lo, hi, False)
    hists = _run(graph, config, names, feeds, histogram)
    out = {}
    for n, h in hists.items():
        lo, hi = seen[n]
        total = h.counts.sum()
        if h.hi <= h.lo or total == 0:
            out[n] = Range(lo, hi, lo, hi)
            continue
        edges = np.linspace(h.lo, h.hi, h.bins + 1)
        if method == "percentile":
            cut = (100.0 - config.calibration_percentile) / 200.0
            cdf = np.cumsum(h.counts) / total
            i_lo = int(np.searchsorted(cdf, cut))
            i_hi = int(np.searchsorted(cdf, 1.0 - cut))
            a, b = float(edges[min(i_lo, h.bins)]), float(edges[min(i_hi + 1, h.bins)])
            out[n] = Range(max(lo, a), min(hi, b), lo, hi)
        else:
            t = float(edges[entropy_threshold(h.counts, levels[n])])
            out[n] = Range(max(lo, -t), min(hi, t), lo, hi)
    return out
