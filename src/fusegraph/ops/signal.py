"""Signal processing: DFT, STFT, Hann/Hamming/Blackman windows and MelWeightMatrix (opset 17 on).

Complex values are carried as a trailing dim of size 2 (real, imaginary); real signals have
a trailing dim of size 1. FFTs run in float32 (float64 for double input) and cast back.
Sizes that usually arrive as constants (dft_length, axis, frame_step, window size...) are
read at build time; when they arrive at run time they are read in the kernel.
"""
from __future__ import annotations

import math

import torch

from ..ir import DType
from .common import normalize_axis
from .registry import FusionKind, NodeContext, register

_FLOATS = (DType.FLOAT, DType.FLOAT16, DType.DOUBLE, DType.BFLOAT16)


def _scalar(ctx: NodeContext, i: int):
    """(known, value): a constant scalar input read at build time, else (False, None)."""
    if not ctx.has_input(i):
        return True, None
    t = ctx.const(i)
    if t is None:
        return False, None
    return True, t.reshape(-1)[0].item()


def _run_scalar(known: bool, value, t):
    if known:
        return value
    return None if t is None else t.reshape(-1).tolist()[0]


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _to_complex(x: torch.Tensor) -> torch.Tensor:
    """[..., 1] real or [..., 2] complex (real, imag) -> complex tensor [...]."""
    x = x.to(_compute_dtype(x))
    if x.shape[-1] == 1:
        return x[..., 0]
    return torch.complex(x[..., 0], x[..., 1])


def _dft(x: torch.Tensor, length, axis: int, inverse: bool, onesided: bool) -> torch.Tensor:
    ax = normalize_axis(axis, x.dim())
    if ax == x.dim() - 1:
        raise ValueError("DFT axis must not be the trailing (real, imag) dim")
    if inverse and onesided:
        n = length if length is not None else 2 * (x.shape[ax] - 1)
        out = torch.fft.irfft(_to_complex(x), n=n, dim=ax).unsqueeze(-1)
        return out.to(x.dtype)
    sig = _to_complex(x)
    n = length if length is not None else x.shape[ax]
    if inverse:
        res = torch.fft.ifft(sig, n=n, dim=ax)
    elif onesided and not sig.is_complex():
        res = torch.fft.rfft(sig, n=n, dim=ax)
    else:
        res = torch.fft.fft(sig, n=n, dim=ax)
        if onesided:
            res = res.narrow(ax, 0, n // 2 + 1)
    return torch.view_as_real(res.resolve_conj()).to(x.dtype)


def _dft_infer(ctx: NodeContext):
    shape = ctx.shape(0)
    dt = ctx.dtype(0) or None
    inverse, onesided = bool(ctx.attr("inverse", 0)), bool(ctx.attr("onesided", 0))
    known_len, length = _scalar(ctx, 1)
    if ctx.version >= 20:
        known_axis, axis = _scalar(ctx, 2)
        axis = -2 if axis is None else axis
    else:
        known_axis, axis = True, ctx.attr("axis", 1)
    if shape is None or not known_axis:
        return [(dt, None)]
    ax = normalize_axis(int(axis), len(shape))
    dims = list(shape)
    if not known_len:
        dims[ax] = None
    else:
        n = length
        if n is None:
            d = shape[ax]
            n = (2 * (d - 1) if inverse and onesided else d) if isinstance(d, int) else None
        dims[ax] = n if not onesided or inverse or n is None else n // 2 + 1
    dims[-1] = 1 if inverse and onesided else 2
    return [(dt, tuple(dims))]


@register("DFT", since=17, fusion=FusionKind.OPAQUE, infer=_dft_infer)
def _build_dft(ctx: NodeContext):
    if ctx.dtype(0) not in _FLOATS:
        raise ctx.unsupported(f"input dtype {ctx.dtype(0).name}")
    inverse, onesided = bool(ctx.attr("inverse", 0)), bool(ctx.attr("onesided", 0))
    known_len, length = _scalar(ctx, 1)
    if ctx.version >= 20:
        known_axis, axis = _scalar(ctx, 2)
        if known_axis and axis is None:
            axis = -2
    else:
        known_axis, axis = True, int(ctx.attr("axis", 1))

    def kernel(x, len_t=None, axis_t=None):
        n = _run_scalar(known_len, length, len_t)
        a = axis if known_axis else _run_scalar(False, None, axis_t)
        return _dft(x, None if n is None else int(n), int(-2 if a is None else a), inverse, onesided)
    return kernel


# ---------------------------------------------------------------- STFT

def _stft(x, step: int, window, frame_length, onesided: bool) -> torch.Tensor:
    sig = _to_complex(x)                                   # [batch, length]
    if frame_length is None:
        frame_length = window.shape[0] if window is not None else sig.shape[-1]
    frames = sig.unfold(-1, int(frame_length), int(step))  # [batch, frames, frame_length]
    if window is not None:
        frames = frames * window.to(frames.real.dtype if frames.is_complex() else frames.dtype)
    if onesided and not frames.is_complex():
        res = torch.fft.rfft(frames, dim=-1)
    else:
        res = torch.fft.fft(frames, dim=-1)
        if onesided:  # as the reference does for complex input, keep the first half
            res = res[..., : frames.shape[-1] // 2 + 1]
    return torch.view_as_real(res.resolve_conj()).to(x.dtype)


def _stft_infer(ctx: NodeContext):
    shape = ctx.shape(0)
    dt = ctx.dtype(0) or None
    known_step, step = _scalar(ctx, 1)
    known_fl, fl = _scalar(ctx, 3)
    if fl is None and known_fl and ctx.has_input(2):
        wshape = ctx.shape(2)
        fl = wshape[0] if wshape else None
    if shape is None or len(shape) != 3:
        return [(dt, None)]
    length = shape[1]
    if fl is None and known_fl and not ctx.has_input(2):
        fl = length
    frames = bins = None
    if isinstance(length, int) and isinstance(fl, int) and known_step and step:
        frames = (length - int(fl)) // int(step) + 1
    if isinstance(fl, int):
        onesided = bool(ctx.attr("onesided", 1))
        bins = int(fl) // 2 + 1 if onesided else int(fl)
    return [(dt, (shape[0], frames, bins, 2))]


@register("STFT", since=17, fusion=FusionKind.OPAQUE, infer=_stft_infer)
def _build_stft(ctx: NodeContext):
    if ctx.dtype(0) not in _FLOATS:
        raise ctx.unsupported(f"input dtype {ctx.dtype(0).name}")
    onesided = bool(ctx.attr("onesided", 1))
    known_step, step = _scalar(ctx, 1)
    known_fl, fl = _scalar(ctx, 3)

    def kernel(x, step_t, window=None, fl_t=None):
        return _stft(x, _run_scalar(known_step, step, step_t), window,
                     _run_scalar(known_fl, fl, fl_t), onesided)
    return kernel


# ---------------------------------------------------------------- windows

# Evaluation order follows the ONNX reference, so integer output types truncate alike.
def _hann(n, denom):
    return torch.sin(n * math.pi / denom) ** 2


def _hamming(n, denom):
    alpha = 25.0 / 46.0
    return alpha - torch.cos(n * math.pi * 2 / denom) * (1 - alpha)


def _blackman(n, denom):
    return (torch.cos(n * (2 * math.pi) / denom) * -0.5 + torch.cos(n * (4 * math.pi) / denom) * 0.08) + 0.42


def _out_dtype(ctx: NodeContext, attr: str = "output_datatype") -> torch.dtype:
    code = int(ctx.attr(attr, int(DType.FLOAT)))
    try:
        return DType(code).to_torch()
    except (ValueError, TypeError):
        raise ctx.unsupported(f"{attr}={code}") from None


def _window_infer(ctx: NodeContext):
    known, size = _scalar(ctx, 0)
    dt = DType(int(ctx.attr("output_datatype", int(DType.FLOAT))))
    return [(dt, (int(size),) if known and size is not None else (None,))]


def _make_window(op_type: str, fn):
    @register(op_type, since=17, fusion=FusionKind.OPAQUE, infer=_window_infer)
    def build(ctx: NodeContext):
        out_dt = _out_dtype(ctx)
        periodic = bool(ctx.attr("periodic", 1))
        known, size = _scalar(ctx, 0)

        def kernel(size_t):
            n = int(_run_scalar(known, size, size_t))
            denom = n if periodic else n - 1
            idx = torch.arange(n, dtype=torch.float64, device=size_t.device)
            return fn(idx, denom).to(out_dt)
        return kernel


_make_window("HannWindow", _hann)
_make_window("HammingWindow", _hamming)
_make_window("BlackmanWindow", _blackman)


# ---------------------------------------------------------------- MelWeightMatrix

def _mel_matrix(num_mel: int, dft_length: int, rate, low, high, dtype, device) -> torch.Tensor:
    """Triangular filterbank [dft_length // 2 + 1, num_mel], peaks 1 (ONNX's integer-bin form)."""
    bins = dft_length // 2 + 1
    to_mel = lambda f: 2595.0 * math.log1p(f / 700.0) / math.log(10.0)  # noqa: E731
    lo_mel, hi_mel = to_mel(float(low)), to_mel(float(high))
    step = (hi_mel - lo_mel) / (num_mel + 2)
    points = torch.arange(num_mel + 2, dtype=torch.float64, device=device) * step + lo_mel
    hz = 700.0 * torch.expm1(points / 2595.0 * math.log(10.0))
    edges = torch.floor((dft_length + 1) * hz / rate).to(torch.int64)   # [num_mel + 2]
    left, center, right = edges[:-2], edges[1:-1], edges[2:]             # [num_mel] each
    j = torch.arange(bins, device=device).unsqueeze(1)                  # [bins, 1]
    up_w = (center - left).clamp(min=1).to(torch.float64)
    down_w = (right - center).clamp(min=1).to(torch.float64)
    rising = torch.where((j >= left) & (j <= center), (j - left) / up_w, 0.0)
    rising = torch.where((center == left) & (j == center), 1.0, rising)
    falling = torch.where((j >= center) & (j < right) & (right > center), (right - j) / down_w, 0.0)
    # The falling edge overwrites the rising one where both apply (only at j == center).
    out = torch.where((j >= center) & (j < right) & (right > center), falling, rising)
    return out.to(dtype)


def _mel_infer(ctx: NodeContext):
    dt = DType(int(ctx.attr("output_datatype", int(DType.FLOAT))))
    k_mel, mel = _scalar(ctx, 0)
    k_len, n = _scalar(ctx, 1)
    return [(dt, (int(n) // 2 + 1 if k_len and n is not None else None,
                  int(mel) if k_mel and mel is not None else None))]


@register("MelWeightMatrix", since=17, fusion=FusionKind.OPAQUE, infer=_mel_infer)
def _build_mel(ctx: NodeContext):
    out_dt = _out_dtype(ctx)
    known = [_scalar(ctx, i) for i in range(5)]

    def kernel(*args):
        vals = [_run_scalar(k, v, t) for (k, v), t in zip(known, args)]
        return _mel_matrix(int(vals[0]), int(vals[1]), vals[2], vals[3], vals[4], out_dt,
                           args[0].device)
    return kernel
