"""Detection: NonMaxSuppression (opset 10 on).

Per batch and class: drop boxes whose score is not above ``score_threshold``, order the rest
by score (ties: lower box index first), then greedily keep a box unless its IoU with an
already kept box is strictly above ``iou_threshold``, up to ``max_output_boxes_per_class``.
The IoU matrix is computed on the device; the greedy walk reads it once per class with
``.tolist()`` (the output size depends on data). Output: int64 [selected, 3] rows of
(batch, class, box).
"""
from __future__ import annotations

import torch

from ..ir import DType
from .registry import FusionKind, NodeContext, register


def _corners(boxes: torch.Tensor, center: bool):
    """(x_min, x_max, y_min, y_max), each [..., N]."""
    if center:
        xc, yc, w, h = boxes.unbind(-1)
        return xc - w / 2, xc + w / 2, yc - h / 2, yc + h / 2
    y1, x1, y2, x2 = boxes.unbind(-1)
    return torch.minimum(x1, x2), torch.maximum(x1, x2), torch.minimum(y1, y2), torch.maximum(y1, y2)


def _suppression(coords, iou_threshold: float) -> torch.Tensor:
    """[K, K] bool: box i suppresses box j (IoU strictly above the threshold)."""
    x0, x1, y0, y1 = coords
    ix0 = torch.maximum(x0[:, None], x0[None, :])
    ix1 = torch.minimum(x1[:, None], x1[None, :])
    iy0 = torch.maximum(y0[:, None], y0[None, :])
    iy1 = torch.minimum(y1[:, None], y1[None, :])
    inter = (ix1 - ix0) * (iy1 - iy0)
    area = (x1 - x0) * (y1 - y0)
    union = area[:, None] + area[None, :] - inter
    ok = (ix1 > ix0) & (iy1 > iy0) & (inter > 0) & (area[:, None] > 0) & (area[None, :] > 0) & (union > 0)
    iou = inter / torch.where(union > 0, union, torch.ones_like(union))
    return ok & (iou > iou_threshold)


def _greedy(rows: list, limit: int) -> list[int]:
    kept: list[int] = []
    removed = [False] * len(rows)
    for i, row in enumerate(rows):
        if removed[i]:
            continue
        kept.append(i)
        if len(kept) >= limit:
            break
        for j in range(i + 1, len(row)):
            if row[j]:
                removed[j] = True
    return kept


def _nms(boxes, scores, max_out: int, iou_thr: float, score_thr, center: bool) -> torch.Tensor:
    device = boxes.device
    if max_out <= 0 or boxes.shape[1] == 0:
        return torch.zeros((0, 3), dtype=torch.int64, device=device)
    coords = _corners(boxes, center)                                  # each [B, N]
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices   # [B, C, N]
    if score_thr is not None:
        counts = (scores > score_thr).sum(-1).tolist()                # [B][C]
    else:
        counts = [[scores.shape[-1]] * scores.shape[1] for _ in range(scores.shape[0])]
    picked = []
    for b, per_class in enumerate(counts):
        for c, k in enumerate(per_class):
            if k == 0:
                continue
            idx = order[b, c, :k]
            sup = _suppression([t[b][idx] for t in coords], iou_thr)
            kept = _greedy(sup.tolist(), max_out)
            sel = idx[torch.tensor(kept, dtype=torch.int64, device=device)]
            rows = torch.stack([torch.full_like(sel, b), torch.full_like(sel, c), sel], dim=1)
            picked.append(rows)
    if not picked:
        return torch.zeros((0, 3), dtype=torch.int64, device=device)
    return torch.cat(picked, 0)


def _nms_infer(ctx: NodeContext):
    return [(DType.INT64, (None, 3))]


def _const_scalar(ctx: NodeContext, i: int):
    """(known, value) of optional scalar input ``i``; absent counts as known None."""
    if not ctx.has_input(i):
        return True, None
    t = ctx.const(i)
    if t is None:
        return False, None
    return True, (t.reshape(-1)[0].item() if t.numel() else None)


def _at_run(known: bool, value, t):
    if known:
        return value
    if t is None or t.numel() == 0:
        return None
    return t.reshape(-1).tolist()[0]


@register("NonMaxSuppression", since=10, fusion=FusionKind.OPAQUE, infer=_nms_infer)
def _build_nms(ctx: NodeContext):
    if not ctx.dtype(0).is_float:
        raise ctx.unsupported(f"boxes dtype {ctx.dtype(0).name}")
    center = int(ctx.attr("center_point_box", 0))
    if center not in (0, 1):
        raise ctx.unsupported(f"center_point_box={center}")
    consts = [_const_scalar(ctx, i) for i in (2, 3, 4)]

    def kernel(boxes, scores, max_t=None, iou_t=None, score_t=None):
        max_out, iou, score = (_at_run(k, v, t) for (k, v), t in zip(consts, (max_t, iou_t, score_t)))
        return _nms(boxes, scores, int(max_out or 0), float(iou or 0.0), score, bool(center))
    return kernel
