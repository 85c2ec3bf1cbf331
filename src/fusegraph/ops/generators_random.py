"""Random generators (impure): RandomNormal, RandomUniform, their *Like forms, Bernoulli and
Multinomial.

A ``seed`` attribute gives each kernel its own torch.Generator per device, created on first
use and kept, so successive runs draw fresh numbers from a reproducible stream; without a
seed the global torch RNG is used. Kernels without tensor inputs create their output on the
current default device (inference runs them under ``torch.device("meta")``).
"""
from __future__ import annotations

import torch

from ..ir import DType
from ._tensor_util import SeededGenerators, dtype_or_none, onnx_dtype_attr
from .registry import NodeContext, register

_FLOATS = (DType.FLOAT, DType.FLOAT16, DType.DOUBLE, DType.BFLOAT16)


def _default_device() -> torch.device:
    return torch.empty(0).device


def _float_dtype(ctx: NodeContext, default: DType | None) -> DType:
    dt = onnx_dtype_attr(ctx, "dtype", default)
    if dt not in _FLOATS:
        raise ctx.unsupported(f"output dtype {dt.name if dt is not None else '?'} is not a float type")
    return dt


def _draw(kind: str, shape, dtype, device, gen, a: float, b: float) -> torch.Tensor:
    if kind == "normal":
        return torch.randn(shape, generator=gen, dtype=dtype, device=device) * b + a
    return torch.rand(shape, generator=gen, dtype=dtype, device=device) * (b - a) + a


def _params(ctx: NodeContext, kind: str) -> tuple[float, float]:
    if kind == "normal":
        return float(ctx.attr("mean", 0.0)), float(ctx.attr("scale", 1.0))
    return float(ctx.attr("low", 0.0)), float(ctx.attr("high", 1.0))


def _shape_attr(ctx: NodeContext) -> tuple[int, ...]:
    return tuple(int(d) for d in ctx.attr("shape"))


def _random_builder(kind: str):
    def build(ctx: NodeContext):
        dtype = _float_dtype(ctx, DType.FLOAT).to_torch()
        shape = _shape_attr(ctx)
        a, b = _params(ctx, kind)
        gens = SeededGenerators(ctx.attr("seed", None))

        def kernel():
            dev = _default_device()
            return _draw(kind, shape, dtype, dev, gens.get(dev), a, b)
        return kernel
    return build


def _random_infer(ctx: NodeContext):
    return [(_float_dtype(ctx, DType.FLOAT), _shape_attr(ctx))]


def _like_builder(kind: str):
    def build(ctx: NodeContext):
        dt = _float_dtype(ctx, ctx.dtype(0))
        dtype = dt.to_torch()
        a, b = _params(ctx, kind)
        gens = SeededGenerators(ctx.attr("seed", None))
        return lambda x: _draw(kind, x.shape, dtype, x.device, gens.get(x.device), a, b)
    return build


def _like_infer(ctx: NodeContext):
    return [(_float_dtype(ctx, ctx.dtype(0)), ctx.shape(0))]


for _kind, _name in (("normal", "RandomNormal"), ("uniform", "RandomUniform")):
    register(_name, since=1, pure=False, foldable=False, infer=_random_infer)(_random_builder(_kind))
    register(_name + "Like", since=1, pure=False, foldable=False, infer=_like_infer)(_like_builder(_kind))


def _bernoulli_infer(ctx: NodeContext):
    return [(onnx_dtype_attr(ctx, "dtype", dtype_or_none(ctx)), ctx.shape(0))]


@register("Bernoulli", since=15, pure=False, foldable=False, infer=_bernoulli_infer)
def _bernoulli(ctx: NodeContext):
    dt = onnx_dtype_attr(ctx, "dtype", ctx.dtype(0))
    if dt is None or dt == DType.UNDEFINED:
        raise ctx.unsupported("unknown output dtype")
    dtype = dt.to_torch()
    gens = SeededGenerators(ctx.attr("seed", None))

    def kernel(p):
        u = torch.rand(p.shape, generator=gens.get(p.device), dtype=torch.float64, device=p.device)
        return (u < p).to(dtype)
    return kernel


def _multinomial_infer(ctx: NodeContext):
    s = ctx.shape(0)
    dt = onnx_dtype_attr(ctx, "dtype", DType.INT32)
    n = int(ctx.attr("sample_size", 1))
    return [(dt, None if s is None else (s[0], n))]


@register("Multinomial", since=7, pure=False, foldable=False, infer=_multinomial_infer)
def _multinomial(ctx: NodeContext):
    dt = onnx_dtype_attr(ctx, "dtype", DType.INT32)
    if dt not in (DType.INT32, DType.INT64):
        raise ctx.unsupported(f"output dtype {dt.name} (int32 or int64 only)")
    dtype = dt.to_torch()
    n = int(ctx.attr("sample_size", 1))
    gens = SeededGenerators(ctx.attr("seed", None))

    def kernel(logits):
        probs = torch.softmax(logits.to(torch.float32), dim=-1)
        return torch.multinomial(probs, n, replacement=True, generator=gens.get(logits.device)).to(dtype)
    return kernel
