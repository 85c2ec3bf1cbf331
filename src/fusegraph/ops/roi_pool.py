"""Region-of-interest pooling: RoiAlign and MaxRoiPool.

RoiAlign samples bilinearly with gathers (every region at once); MaxRoiPool loops over the
regions, whose count and boxes are data. The windowed and global pools are in ``pool.py``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .conv import check_rank, ints_attr
from .registry import FusionKind, NodeContext, register


# ----------------------------------------------------------------------------- RoiAlign
def _roi_infer(ph_attr: str, pw_attr: str | None = None):
    def infer(ctx: NodeContext):
        xs, rs = ctx.shape(0), ctx.shape(1)
        if pw_attr is None:
            ph, pw = ints_attr(ctx, ph_attr)
        else:
            ph, pw = int(ctx.attr(ph_attr, 1)), int(ctx.attr(pw_attr, 1))
        r = None if rs is None else rs[0]
        c = None if xs is None else xs[1]
        return [(ctx.dtype(0) or None, (r, c, ph, pw))]
    return infer


def _axis_samples(start, bin_size, grid, pooled: int, gmax: int, size: int):
    """Per-axis sample positions -> (low index, high index, low weight, high weight, valid)."""
    dev, ft = start.device, start.dtype
    p = torch.arange(pooled, device=dev, dtype=ft).reshape(1, -1, 1)
    i = torch.arange(gmax, device=dev, dtype=ft).reshape(1, 1, -1)
    g = grid.to(ft).reshape(-1, 1, 1)
    b = bin_size.reshape(-1, 1, 1)
    pos = start.reshape(-1, 1, 1) + p * b + (i + 0.5) * b / g        # (R, pooled, gmax)
    inside = (pos >= -1.0) & (pos <= size)
    pos = pos.clamp_min(0)
    low = pos.floor()
    top = low >= size - 1
    low = torch.where(top, torch.full_like(low, size - 1), low)
    pos = torch.where(top, low, pos)
    high = torch.where(top, low, low + 1)
    frac = pos - low
    ok = inside.to(ft)
    valid = (i < g).expand_as(pos)
    return low.long(), high.long(), (1 - frac) * ok, frac * ok, valid


@register("RoiAlign", since=10, fusion=FusionKind.OPAQUE, layout_sensitive=True,
          infer=_roi_infer("output_height", "output_width"))
def _roi_align(ctx: NodeContext):
    mode = (ctx.attr("mode", "avg") or "avg").lower()
    if mode not in ("avg", "max"):
        raise ctx.unsupported(f"mode {mode!r}")
    default_ct = "half_pixel" if ctx.version >= 16 else "output_half_pixel"
    half = (ctx.attr("coordinate_transformation_mode", default_ct) or default_ct).lower() == "half_pixel"
    ph, pw = int(ctx.attr("output_height", 1)), int(ctx.attr("output_width", 1))
    ratio = int(ctx.attr("sampling_ratio", 0))
    scale = float(ctx.attr("spatial_scale", 1.0))
    check_rank(ctx, 0, (4,))

    def roi_align(x, rois, batch_indices):
        n, c, h, w = x.shape
        r = rois.shape[0]
        ft = torch.float32 if rois.dtype in (torch.float16, torch.bfloat16) else rois.dtype
        box = rois.to(ft) * scale - (0.5 if half else 0.0)
        rw, rh = box[:, 2] - box[:, 0], box[:, 3] - box[:, 1]
        if not half:
            rw, rh = rw.clamp_min(1.0), rh.clamp_min(1.0)
        bh, bw = rh / ph, rw / pw
        if ratio > 0:
            gh = gw = torch.full((r,), ratio, device=x.device, dtype=torch.int64)
            gmax_h = gmax_w = ratio
        else:
            gh, gw = torch.ceil(rh / ph).long(), torch.ceil(rw / pw).long()
            gmax_h = max(int(gh.max()) if r else 1, 1)
            gmax_w = max(int(gw.max()) if r else 1, 1)
        ylo, yhi, wyl, wyh, vy = _axis_samples(box[:, 1], bh, gh, ph, gmax_h, h)
        xlo, xhi, wxl, wxh, vx = _axis_samples(box[:, 0], bw, gw, pw, gmax_w, w)
        table = x.permute(0, 2, 3, 1).reshape(n * h * w, c)
        base = (batch_indices.long() * (h * w)).reshape(r, 1, 1)
        acc = None
        for iy in range(gmax_h):
            ya, yb = ylo[:, :, iy:iy + 1], yhi[:, :, iy:iy + 1]
            wa, wb = wyl[:, :, iy:iy + 1], wyh[:, :, iy:iy + 1]
            for ix in range(gmax_w):
                xa, xb = xlo[:, None, :, ix], xhi[:, None, :, ix]
                va, vb = wxl[:, None, :, ix], wxh[:, None, :, ix]
                idx = torch.stack([ya * w + xa, ya * w + xb, yb * w + xa, yb * w + xb]) + base
                wts = torch.stack([wa * va, wa * vb, wb * va, wb * vb]).to(x.dtype)
                vals = table[idx.reshape(-1)].reshape(4, r, ph, pw, c) * wts.unsqueeze(-1)
                ok = (vy[:, :, iy:iy + 1] & vx[:, None, :, ix]).unsqueeze(-1)
                if mode == "avg":
                    val = torch.where(ok, vals.sum(0), 0.0)
                    acc = val if acc is None else acc + val
                else:
                    val = torch.where(ok, vals.amax(0), -math.inf)
                    acc = val if acc is None else torch.maximum(acc, val)
        if mode == "avg":
            acc = acc / (gh * gw).clamp_min(1).to(x.dtype).reshape(r, 1, 1, 1)
        else:
            acc = torch.where(torch.isneginf(acc), 0.0, acc)
        return acc.permute(0, 3, 1, 2).contiguous()
    return roi_align


# ----------------------------------------------------------------------------- MaxRoiPool
def _round_away(v: float) -> int:
    return int(math.floor(abs(v) + 0.5)) * (1 if v >= 0 else -1)


@register("MaxRoiPool", since=1, fusion=FusionKind.OPAQUE, layout_sensitive=True,
          infer=_roi_infer("pooled_shape"))
def _max_roi_pool(ctx: NodeContext):
    shape = ints_attr(ctx, "pooled_shape")
    if not shape or len(shape) != 2:
        raise ctx.unsupported("pooled_shape must hold 2 values")
    ph, pw = shape
    scale = float(ctx.attr("spatial_scale", 1.0))

    def max_roi_pool(x, rois):
        n, c, h, w = x.shape
        outs = []
        for b, x1, y1, x2, y2 in rois.tolist():
            xs, ys = _round_away(x1 * scale), _round_away(y1 * scale)
            xe, ye = _round_away(x2 * scale), _round_away(y2 * scale)
            rw, rh = max(xe - xs + 1, 1), max(ye - ys + 1, 1)
            crop = x[int(b):int(b) + 1, :, max(ys, 0):max(min(ys + rh, h), 0), max(xs, 0):max(min(xs + rw, w), 0)]
            pads = [max(-xs, 0), rw - crop.shape[3] - max(-xs, 0), max(-ys, 0), rh - crop.shape[2] - max(-ys, 0)]
            crop = F.pad(crop, pads, value=-math.inf)
            y = F.adaptive_max_pool2d(crop, (ph, pw))
            outs.append(torch.where(torch.isneginf(y), 0.0, y))
        if not outs:
            return x.new_zeros((0, c, ph, pw))
        return torch.cat(outs, 0)
    return max_roi_pool
