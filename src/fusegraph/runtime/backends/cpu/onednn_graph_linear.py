"""``LinearAct``'s CPU kernel as a oneDNN Graph partition: the product run as a 1x1 convolution.

A float32 product ``x[M, K] @ w[N, K]^T`` is a 1x1 convolution over M positions: ``x`` read
as a channels-last ``[1, K, 1, M]`` tensor is the same memory (no copy), and so is the
``[1, N, 1, M]`` result read back as ``[M, N]``. oneDNN's 1x1 convolution kernels stream a
weight reordered into their blocked layout much faster than its inner product reads the plain
``[N, K]`` matrix (M = 1, 2 threads: 768x3072 114 us against 159, 3072x768 116 against 239,
onnxruntime's MLAS 133 / 136; ``benchmarks/bench_gemv.py``), so this is the kernel for
constant-weight products on CPU. Bias and activation are post-ops of the same partition;
GELU runs after it in place (oneDNN's GELU gives NaN for +inf, and the bridge computes the
tanh form as the erf form).

A partition is specialised on M, which only the run knows when the model has dynamic axes:
a kernel compiles one partition for each new M it meets, up to ``MAX_SHAPES`` (each holds its
own reordered copy of the weight), and runs every further M through ``fallback`` (the inner
product over the plain weight). A model with static shapes compiles its one M at bind time.
No pass logic here.
"""
from __future__ import annotations

import threading

import torch

from ....ops.activations import gelu as gelu_
from .onednn_graph import GraphKernel, with_post_op

MAX_SHAPES = 2
CL = torch.channels_last


def _as_positions(x2: torch.Tensor) -> torch.Tensor:
    """[M, K] row-major -> the channels-last [1, K, 1, M] view of the same memory."""
    m, k = x2.shape
    return x2.view(1, 1, m, k).permute(0, 3, 1, 2)


def _ir(bias: bool, activation: str, exact: bool = True) -> str:
    lines = ["graph(%x : Tensor, %w : Tensor" + (", %b : Tensor" if bias else "") + "):"]
    if not bias:
        lines.append("  %b : NoneType = prim::Constant()")
    lines += ["  %one : int[] = prim::Constant[value=[1, 1]]()",
              "  %zero : int[] = prim::Constant[value=[0, 0]]()",
              "  %g : int = prim::Constant[value=1]()",
              "  %y : Tensor = aten::conv2d(%x, %w, %b, %one, %zero, %one, %g)"]
    return with_post_op(lines, activation, exact)


def linear_kernel(name: str, w: torch.Tensor, b: torch.Tensor | None, activation: str, fallback,
                  rows: int | None = None, exact: bool = True):
    """``act(x @ w^T + b)`` for a constant ``w`` [N, K]; ``rows``: M when the shapes are static
    (compiled now), else None (compiled on first use). Returns None when oneDNN Graph declines."""
    n, k = w.shape
    constants = {"w": w.reshape(n, k, 1, 1)}
    if b is not None:
        constants["b"] = b.contiguous()
    gelu = {"gelu": "none", "gelu_tanh": "tanh"}.get(activation)     # GELU: after it, in place
    if gelu == "none" and not exact:
        gelu = None                       # the fast variant fuses the erf form
    ir = _ir(b is not None, "none" if gelu else activation, exact)
    kernels: dict[int, GraphKernel | None] = {}
    lock = threading.Lock()

    def compiled(m: int):
        got = kernels.get(m, False)
        if got is not False:
            return got
        with lock:
            if m not in kernels:
                if len(kernels) >= MAX_SHAPES:
                    return None
                g = GraphKernel(f"{name}[{m}]", ir, constants, lambda: [_as_positions(torch.zeros(m, k, dtype=w.dtype))])
                kernels[m] = g if g.ok else None
            return kernels[m]

    if rows is not None and compiled(rows) is None:
        return None

    def kernel(x, w_=None, b_=None):
        x2 = x.reshape(-1, k)
        if not x2.is_contiguous():
            x2 = x2.contiguous()
        g = compiled(x2.shape[0]) if x2.shape[0] else None
        if g is None:
            return fallback(x, w_, b_)
        y = g(_as_positions(x2)).permute(0, 2, 3, 1).reshape(*x.shape[:-1], n)
        if gelu is not None:
            gelu_(y, gelu, y)
        return y
    kernel.writes_out, kernel.onednn_graph = False, kernels   # M -> GraphKernel (None: declined)
    return kernel
