"""Sampling on grids: GridSample (linear / nearest / cubic; zeros / border / reflection
padding; 1-D to 3-D spatial), AffineGrid, and Col2Im (any number of spatial dims).

GridSample and AffineGrid follow torch's grid_sample / affine_grid, which the ONNX spec
mirrors; half-precision data is sampled in float32 and cast back.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._tensor_util import DeviceCache, dtype_or_none, runtime_ints
from .common import const_ints
from .registry import NodeContext, register

_GS_MODES = {"bilinear": "bilinear", "linear": "bilinear", "nearest": "nearest",
             "bicubic": "bicubic", "cubic": "bicubic"}


def _compute_dtype(dtype):
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def _grid_sample_infer(ctx: NodeContext):
    s, g = ctx.shape(0), ctx.shape(1)
    if s is None or g is None:
        return [(dtype_or_none(ctx), None)]
    return [(dtype_or_none(ctx), (s[0], s[1]) + tuple(g[1:-1]))]


@register("GridSample", since=16, infer=_grid_sample_infer, layout_sensitive=True)
def _grid_sample(ctx: NodeContext):
    mode = _GS_MODES.get(ctx.attr("mode", "bilinear" if ctx.version < 20 else "linear"))
    padding = ctx.attr("padding_mode", "zeros")
    align = bool(ctx.attr("align_corners", 0))
    if mode is None:
        raise ctx.unsupported(f"mode {ctx.attr('mode')!r}")
    if padding not in ("zeros", "border", "reflection"):
        raise ctx.unsupported(f"padding_mode {padding!r}")
    rank = len(ctx.shape(0)) if ctx.shape(0) is not None else None
    if rank is not None and (rank not in (3, 4, 5) or (mode == "bicubic" and rank == 5)):
        raise ctx.unsupported(f"mode {mode!r} on rank-{rank} input")
    if not ctx.dtype(0).is_float:
        raise ctx.unsupported(f"{ctx.dtype(0).name} data")

    def kernel(x, grid):
        cd = _compute_dtype(x.dtype)
        xx, gg = x.to(cd), grid.to(cd)
        one_d = x.dim() == 3
        if one_d:  # [N,C,W] sampled at [N,Wout,1]: a height-1 image sampled on row 0
            xx = xx.unsqueeze(2)
            gg = torch.cat([gg, torch.zeros_like(gg)], dim=-1).unsqueeze(1)
        if (mode == "bicubic" and padding != "zeros") or (mode == "nearest" and padding == "reflection"):
            gg = _onnx_coords(gg, xx.shape[2:], mode, padding, align)
        y = F.grid_sample(xx, gg, mode=mode, padding_mode=padding, align_corners=align)
        if one_d:
            y = y.squeeze(2)
        return y.to(x.dtype)
    return kernel


def _onnx_coords(grid, sizes, mode, padding, align):
    """Where ONNX and torch order the steps differently, do ONNX's first steps on the grid:
    nearest rounds (half to even) before reflecting, torch after; cubic pads a sample's
    coordinate before taking its taps, torch pads only the taps."""
    cols = []
    for k in range(grid.shape[-1]):
        d = sizes[len(sizes) - 1 - k]  # grid's last dim is (x, y[, z]): x indexes the last axis
        n = grid[..., k].double()
        x = (n + 1) / 2 * (d - 1) if align else ((n + 1) * d - 1) / 2
        if mode == "nearest":
            x = torch.round(x)
        else:
            lo, hi = (0.0, d - 1.0) if align else (-0.5, d - 0.5)
            if padding == "border":
                moved = x.clamp(0, d - 1)
            else:
                span = hi - lo
                below = x < lo
                dx = torch.where(below, lo - x, x - hi)
                m = torch.trunc(dx / span) if span > 0 else torch.zeros_like(dx)
                r = dx - m * span
                moved = torch.where(below == (torch.remainder(m, 2) == 0), lo + r, hi - r)
            x = torch.where((x < lo) | (x > hi), moved, x)
        if align:
            n = x * 2 / (d - 1) - 1 if d > 1 else torch.zeros_like(x)
        else:
            n = (2 * x + 1) / d - 1
        cols.append(n)
    return torch.stack(cols, dim=-1).to(grid.dtype)


def _affine_grid_infer(ctx: NodeContext):
    size = const_ints(ctx, 1)
    dt = dtype_or_none(ctx)
    if size is None:
        s1 = ctx.shape(1)
        n = s1[0] if s1 is not None and isinstance(s1[0], int) else None
        return [(dt, None if n is None else (None,) * n)]
    return [(dt, (size[0],) + tuple(size[2:]) + (len(size) - 2,))]


@register("AffineGrid", since=20, infer=_affine_grid_infer, layout_sensitive=True)
def _affine_grid(ctx: NodeContext):
    align = bool(ctx.attr("align_corners", 0))
    size = const_ints(ctx, 1)

    def kernel(theta, s):
        sz = size if size is not None else runtime_ints(s)
        return affine_grid(theta, sz, align)
    return kernel


def affine_grid(theta: torch.Tensor, size, align: bool) -> torch.Tensor:
    """As the ONNX function body: positions evenly spaced in [-1, 1] per spatial dim (a size-1
    dim sits at -1 when align_corners=1), in (x, y[, z], 1) order, times theta transposed."""
    cd = _compute_dtype(theta.dtype)
    spatial = list(size[2:])
    coords = []
    for d in spatial:
        i = torch.arange(d, dtype=torch.float64, device=theta.device)
        if align:
            coords.append(i * (2.0 / (d - 1)) - 1 if d > 1 else i - 1)
        else:
            coords.append((2 * i + 1) / d - 1)
    mesh = torch.meshgrid(*coords, indexing="ij")
    xyz = [mesh[k] for k in range(len(spatial) - 1, -1, -1)]
    base = torch.stack(xyz + [torch.ones_like(mesh[0])], dim=-1)
    flat = base.reshape(-1, len(spatial) + 1).to(cd)
    grid = torch.matmul(flat, theta.to(cd).transpose(1, 2))
    return grid.reshape([int(size[0])] + spatial + [len(spatial)]).to(theta.dtype)


# ---------------------------------------------------------------- Col2Im

def _col2im_geometry(image, block, dil, pads, strides):
    nd = len(image)
    padded = [image[i] + pads[i] + pads[i + nd] for i in range(nd)]
    nblocks = [(padded[i] - (dil[i] * (block[i] - 1) + 1)) // strides[i] + 1 for i in range(nd)]
    return padded, nblocks


def _col2im_index(image, block, dil, pads, strides) -> torch.Tensor:
    """[K, L] flat positions in the padded image of every (kernel offset, block) pair."""
    nd = len(image)
    padded, nblocks = _col2im_geometry(image, block, dil, pads, strides)
    pstride = [1] * nd
    for i in range(nd - 2, -1, -1):
        pstride[i] = pstride[i + 1] * padded[i + 1]
    lin = torch.zeros([1] * (2 * nd), dtype=torch.long, device="cpu")  # a build-time table
    for i in range(nd):
        kernel_pos = (torch.arange(block[i], device="cpu") * dil[i]).unsqueeze(1)
        coord = kernel_pos + (torch.arange(nblocks[i], device="cpu") * strides[i]).unsqueeze(0)
        shape = [1] * (2 * nd)
        shape[i], shape[nd + i] = block[i], nblocks[i]
        lin = lin + (coord * pstride[i]).reshape(shape)
    k = 1
    for b in block:
        k *= b
    return lin.reshape(k, -1)


def col2im(x, image, block, dil, pads, strides, index=None):
    nd = len(image)
    padded, nblocks = _col2im_geometry(image, block, dil, pads, strides)
    n, ck, length = x.shape
    k = 1
    for b in block:
        k *= b
    nl = 1
    for b in nblocks:
        nl *= b
    if ck % k or nl != length:
        raise ValueError(f"Col2Im: input {tuple(x.shape)} does not match block {block} over image {image}")
    if nd == 2:
        y = F.fold(x, output_size=padded, kernel_size=block, dilation=dil, stride=strides)
    else:
        if index is None:
            index = _col2im_index(image, block, dil, pads, strides).to(x.device)
        total = 1
        for p in padded:
            total *= p
        y = torch.zeros((n, ck // k, total), dtype=x.dtype, device=x.device)
        y.index_add_(2, index.reshape(-1), x.reshape(n, ck // k, k * length))
        y = y.reshape((n, ck // k) + tuple(padded))
    crop = tuple(slice(pads[i], pads[i] + image[i]) for i in range(nd))
    return y[(slice(None), slice(None)) + crop]


def _col2im_infer(ctx: NodeContext):
    image, block, s = const_ints(ctx, 1), const_ints(ctx, 2), ctx.shape(0)
    dt = dtype_or_none(ctx)
    if image is None or s is None:
        s1 = ctx.shape(1)
        known = s1 is not None and len(s1) == 1 and isinstance(s1[0], int)
        return [(dt, (None,) * (2 + s1[0]) if known else None)]
    c = None
    if block is not None and isinstance(s[1], int):
        k = 1
        for b in block:
            k *= b
        c = s[1] // k
    return [(dt, (s[0], c) + tuple(image))]


@register("Col2Im", since=18, infer=_col2im_infer, layout_sensitive=True)
def _col2im(ctx: NodeContext):
    image, block = const_ints(ctx, 1), const_ints(ctx, 2)

    def attrs(nd):
        dil = [int(v) for v in ctx.attr("dilations", [1] * nd)]
        pads = [int(v) for v in ctx.attr("pads", [0] * (2 * nd))]
        strides = [int(v) for v in ctx.attr("strides", [1] * nd)]
        return dil, pads, strides

    if image is not None and block is not None:
        dil, pads, strides = attrs(len(image))
        cache = DeviceCache(None if len(image) == 2 else _col2im_index(image, block, dil, pads, strides))
        return lambda x, *_: col2im(x, image, block, dil, pads, strides, cache.get(x.device)[0])

    def dynamic(x, im, bl):
        image_, block_ = runtime_ints(im), runtime_ints(bl)
        return col2im(x, image_, block_, *attrs(len(image_)))
    return dynamic
