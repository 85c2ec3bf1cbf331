"""A static cost model: estimated microseconds per node, from shapes alone (no kernel runs).

Each node costs a fixed *dispatch* overhead (Python call + kernel launch; on CPU it holds the
GIL, so it never overlaps with another stream's dispatch) plus a roofline estimate of its work:
``max(flops / flop rate, bytes / bandwidth, window elements / window rate)``, where

- conv-like ops count ``2 * out_numel * prod(weight.shape[1:])`` flops (ConvTranspose: per
  input element), matmul-like ops ``2 * out_numel * K``;
- pooling counts window elements (``out_numel * prod(kernel_shape)``; global pooling and LRN
  read every input element once or ``size`` times); torch's CPU pooling is slow, hence its rate;
- every op moves the bytes of its inputs and outputs; views (``aliasing.VIEW_OPS``) move none.

Intra-op threads speed a kernel up only when it is large: ``speedup(t) = 1 + (t - 1) * e * w /
(w + grain)`` for a single-thread time ``w`` and a large-kernel efficiency ``e``. This is why splitting small ops over streams pays
on a CPU while splitting big ones does not. Rates are rough per-thread figures measured on a
2-core x86 machine (CPU) and an H200 (CUDA); the planner only compares estimates, so only
their ratios matter. The model reads shapes and attributes; it never mutates the graph.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ..ir import Node, Value
from ..ir.shape import numel
from .aliasing import view_source
from ..config import machine_cores

CONV_OPS = frozenset({"Conv", "ConvInteger", "DeformConv", "QLinearConv"})
MATMUL_OPS = frozenset({"MatMul", "MatMulInteger", "Gemm", "Linear", "BatchMatMul", "QLinearMatMul"})
POOL_OPS = frozenset({"MaxPool", "AveragePool", "LpPool"})
GLOBAL_POOL_OPS = frozenset({"GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"})


@dataclass(frozen=True)
class Work:
    flops: float = 0.0
    bytes: float = 0.0
    window: float = 0.0   # pooling / LRN window elements


def _n(v: Value | None) -> int:
    if v is None:
        return 0
    return numel(v.shape) or 0


def _bytes(v: Value | None) -> int:
    if v is None:
        return 0
    try:
        return _n(v) * v.dtype.itemsize
    except (AttributeError, ValueError, TypeError):
        return 0


def _prod(xs) -> int:
    out = 1
    for x in xs:
        if not isinstance(x, int):
            return 0
        out *= x
    return out


def _arithmetic(op: str, node: Node) -> float:
    """Flops of a convolution- or matmul-like ``op`` computed by ``node`` (0 for any other op)."""
    out = node.outputs[0] if node.outputs else None
    x, w = node.input(0), node.input(1)
    if op in CONV_OPS and w is not None and w.shape:
        return 2.0 * _n(out) * _prod(w.shape[1:])
    if op == "ConvTranspose" and w is not None and w.shape:
        return 2.0 * _n(x) * _prod(w.shape[1:])
    if op in MATMUL_OPS and x is not None and x.shape:
        k = x.shape[-1]
        if op == "Gemm" and node.attrs.get("transA", 0) and len(x.shape) >= 2:
            k = x.shape[-2]
        if op == "BatchMatMul" and node.attrs.get("trans_a", 0) and len(x.shape) >= 2:
            k = x.shape[-2]
        return 2.0 * _n(out) * (k if isinstance(k, int) else 0)
    return 0.0


def node_work(node: Node) -> Work:
    """Flops, bytes moved and window elements of one node, from static shapes (0 when unknown)."""
    if view_source(node) is not None:
        return Work()
    moved = float(sum(_bytes(v) for v in node.inputs) + sum(_bytes(o) for o in node.outputs))
    op = node.op_type
    out, x = (node.outputs[0] if node.outputs else None), node.input(0)
    window = 0.0
    if op in POOL_OPS:
        window = float(_n(out) * _prod(node.attrs.get("kernel_shape", ())))
    elif op in GLOBAL_POOL_OPS:
        window = float(_n(x))
    elif op == "LRN":
        window = float(_n(x) * int(node.attrs.get("size", 1)))
    return Work(_arithmetic(op, node), moved, window)


FUSED_PRODUCTS = {"FusedConv": "Conv", "LinearAct": "Linear"}   # fused op -> the product it computes


def product_flops(node: Node) -> float:
    """Flops of one product node, fused forms included (``FUSED_PRODUCTS``;
    ``ScaledDotProductAttention``: ``4 * out_numel * keys``), from static shapes; ``node_work``'s
    count for any other node (0 when unknown)."""
    if node.op_type == "ScaledDotProductAttention":
        v = node.input(0) if node.attrs.get("qkv_split") is not None else node.input(2)
        keys = v.shape[-2] if v is not None and v.shape and len(v.shape) >= 2 else None
        return 4.0 * _n(node.outputs[0]) * (keys if isinstance(keys, int) else 0)
    return _arithmetic(FUSED_PRODUCTS.get(node.op_type, node.op_type), node)


@dataclass(frozen=True)
class CostModel:
    """Per-node time estimates in microseconds (the planner's cost unit).

    cores: intra-op threads the whole machine has (split across CPU streams).
    threads: intra-op threads one kernel gets (``for_streams`` sets it to ``cores // n``).
    dispatch_us: per-kernel overhead, serial across streams. sync_us: a cross-stream wait.
    flops_per_us / bytes_per_us / window_per_us: per-thread rates. grain_us: see module doc.
    """
    device: str = "cpu"
    cores: int = 1
    threads: int = 1
    dispatch_us: float = 6.0
    sync_us: float = 30.0
    flops_per_us: float = 40e3
    bytes_per_us: float = 10e3
    window_per_us: float = 250.0
    grain_us: float = 50.0
    efficiency: float = 0.85

    @classmethod
    def for_device(cls, device: str | None = None, cores: int | None = None) -> "CostModel":
        """The model of this machine: CUDA when asked for (or ``None`` and torch sees a GPU)."""
        if device in (None, "auto"):
            device = "cuda" if _cuda_available() else "cpu"
        if str(device).startswith("cuda"):
            return cls(device="cuda", cores=1, threads=1, dispatch_us=8.0, sync_us=4.0,
                       flops_per_us=25e6, bytes_per_us=2e6, window_per_us=5e5, grain_us=0.0)
        cores = max(1, int(cores or machine_cores()))
        return cls(device="cpu", cores=cores, threads=cores)

    def for_streams(self, n: int) -> "CostModel":
        """The model seen by each of ``n`` CPU streams sharing the cores (CUDA: unchanged)."""
        if self.device != "cpu":
            return self
        return dataclasses.replace(self, threads=max(1, self.cores // max(1, n)))

    def compute_us(self, node: Node) -> float:
        """Kernel time without the dispatch overhead, at ``self.threads`` threads."""
        w = node_work(node)
        single = max(w.flops / self.flops_per_us, w.bytes / self.bytes_per_us, w.window / self.window_per_us)
        return self.scaled_us(single, self.threads)

    def product_us(self, node: Node) -> float:
        """One-thread roofline time of a product node, its fused forms included
        (``product_flops``): what running it in a reduced type would roughly halve."""
        return max(product_flops(node) / self.flops_per_us, node_work(node).bytes / self.bytes_per_us)

    def scaled_us(self, single_us: float, threads: int) -> float:
        """A one-thread time ``single_us`` at ``threads`` intra-op threads (the module doc's
        speedup). The planner uses it for a measured one-thread time when the measured
        several-thread time is larger: that one was disturbed (see ``MeasuredCosts``)."""
        if threads <= 1 or single_us <= 0:
            return single_us
        return single_us / (1.0 + (threads - 1) * self.efficiency * single_us / (single_us + self.grain_us))

    def node_us(self, node: Node) -> float:
        return self.dispatch_us + self.compute_us(node)

    def node_us_at(self, node: Node, threads: int) -> float:
        """``node_us`` with ``threads`` intra-op threads (hybrid plans: narrow and wide nodes)."""
        return dataclasses.replace(self, threads=max(1, threads)).node_us(node)

    __call__ = node_us


@dataclass(frozen=True)
class MeasuredCosts:
    """Per-node microseconds measured on this machine (``runtime/stream_calibrate.py``).

    us: ``{threads: {node name: µs}}`` for 1 thread and for ``cores`` threads, dispatch
    included; a node missing from it (or a thread count not measured) falls back to
    ``fallback`` (the static model). A several-thread time is capped by the static model's
    thread speedup applied to the measured one-thread time (``CostModel.scaled_us``): with
    another process on the cores an OpenMP team waits at every barrier for a descheduled
    thread, so a disturbed calibration would otherwise plan for a loaded machine.
    sync_us: a cross-stream handoff (event + thread wake-up). wide_us / wake_us: see
    ``node_us_wide``.
    contention: slowdown of a one-thread kernel while another stream runs beside it (shared
    caches, memory bandwidth, the GIL between kernels), applied to narrow nodes of plans
    with several streams.
    """
    us: dict
    cores: int
    sync_us: float = 40.0
    contention: float = 1.1
    device: str = "cpu"
    fallback: CostModel | None = None
    wide_us: dict | None = None     # {name: µs} at ``cores`` threads in the stream workers' regime
    wake_us: float = 0.0            # added to a capped wide time (team threads sleep between kernels)

    @property
    def dispatch_us(self) -> float:
        return 0.0

    def node_us_wide(self, node: Node) -> float:
        """A hybrid plan's wide node: ``cores`` threads while the stream workers exist (their
        OpenMP teams make libgomp's idle threads sleep instead of spin, see
        ``runtime/streams_cpu.py``), capped like ``node_us_at``."""
        if not self.wide_us or node.name not in self.wide_us:
            return self.node_us_at(node, self.cores)
        model = self.fallback or CostModel.for_device("cpu", self.cores)
        measured = float(self.wide_us[node.name])
        single = self.us.get(1, {}).get(node.name)
        if single is None:
            return measured
        return min(measured, model.scaled_us(float(single), self.cores) + self.wake_us)

    def node_us_at(self, node: Node, threads: int) -> float:
        model = self.fallback or CostModel.for_device("cpu", self.cores)
        table, single = self.us.get(threads), self.us.get(1, {}).get(node.name)
        if table is None or node.name not in table:
            return model.node_us_at(node, threads) if single is None else model.scaled_us(float(single), threads)
        measured = float(table[node.name])
        return measured if single is None or threads <= 1 else min(measured, model.scaled_us(float(single), threads))


def _cuda_available() -> bool:
    try:
        import torch
        return bool(torch.cuda.is_available())
    except Exception:  # pragma: no cover - torch is a hard dependency
        return False


def fixed_costs(cost, order: list[Node]) -> list[float]:
    """Costs of ``order`` from a callable ``node -> float`` or a mapping ``name -> float``."""
    if callable(cost):
        values = [float(cost(n)) for n in order]
    else:
        values = [float(cost.get(n.name, 0.0)) for n in order]
    for n, c in zip(order, values):
        if not math.isfinite(c) or c < 0:
            raise ValueError(f"cost of node {n.name!r} must be a finite non-negative number, got {c!r}")
    return values
