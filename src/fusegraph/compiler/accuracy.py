"""Accuracy of one model's outputs against a reference's: relative L2 error, max abs error,
cosine similarity, and for classifiers top-1 agreement (pure functions over NumPy outputs).

``output_errors(got, want)`` compares one run (``worst_error``: just its largest relative L2);
``accumulate`` folds several runs (the worst
relative L2 and max abs error, the mean cosine, the share of inputs whose top-1 agrees).
A classifier output is a float tensor of shape ``[1, N]`` or ``[N]`` with N >= 2.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np


def _pair(got: np.ndarray, want: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(got, np.float64).reshape(-1), np.asarray(want, np.float64).reshape(-1)


def relative_l2(got, want) -> float:
    """||got - want|| / ||want|` (NaN where they disagree on NaN or infinity; 0 for equal)."""
    g, w = _pair(got, want)
    if not np.array_equal(np.isnan(g), np.isnan(w)) or not np.array_equal(g[np.isinf(w)], w[np.isinf(w)]):
        return float("nan")
    ok = np.isfinite(w)
    g, w = g[ok], w[ok]
    den = float(np.linalg.norm(w))
    num = float(np.linalg.norm(g - w))
    return num / den if den else (0.0 if num == 0 else float("inf"))


def is_classifier(want: np.ndarray) -> bool:
    a = np.asarray(want)
    return np.issubdtype(a.dtype, np.floating) and (a.ndim == 1 or (a.ndim == 2 and a.shape[0] == 1)) \
        and a.size >= 2


def output_errors(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray]) -> dict[str, dict]:
    """Per float output of ``want``: rel_l2, max_abs, cosine and (classifiers) top1_agree."""
    out = {}
    for name, w in want.items():
        w = np.asarray(w)
        if not np.issubdtype(w.dtype, np.floating) or name not in got:
            continue
        g, wf = _pair(got[name], w)
        ok = np.isfinite(g) & np.isfinite(wf)
        denom = float(np.linalg.norm(g[ok]) * np.linalg.norm(wf[ok]))
        row = {"rel_l2": relative_l2(got[name], w),
               "max_abs": float(np.max(np.abs(g[ok] - wf[ok]))) if ok.any() else 0.0,
               "cosine": float(np.dot(g[ok], wf[ok]) / denom) if denom else 1.0}
        if is_classifier(w):
            row["top1_agree"] = float(np.argmax(g) == np.argmax(wf))
        out[name] = row
    return out


def accumulate(runs: list[dict[str, dict]]) -> dict[str, dict]:
    """Several ``output_errors`` results folded: worst rel_l2 / max_abs, mean cosine and
    top-1 agreement (a share of the inputs), and ``inputs`` (how many)."""
    out: dict[str, dict] = {}
    for name in runs[0] if runs else ():
        rows = [r[name] for r in runs if name in r]
        agg = {"rel_l2": max(r["rel_l2"] for r in rows), "max_abs": max(r["max_abs"] for r in rows),
               "cosine": sum(r["cosine"] for r in rows) / len(rows), "inputs": len(rows)}
        if all("top1_agree" in r for r in rows):
            agg["top1_agree"] = sum(r["top1_agree"] for r in rows) / len(rows)
        out[name] = agg
    return out


def worst_error(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray]) -> float:
    """The largest relative L2 error of any float output of ``want`` (NaN: infinitely wrong)."""
    errors = [relative_l2(got[k], w) for k, w in want.items() if np.issubdtype(np.asarray(w).dtype, np.floating)]
    return max((float("inf") if e != e else e for e in errors), default=0.0)


def worst_rel_l2(errors: Mapping[str, dict]) -> float:
    """The largest relative L2 error over the outputs (NaN counts as infinitely wrong)."""
    vals = [e["rel_l2"] for e in errors.values()]
    return max((float("inf") if v != v else v for v in vals), default=0.0)
