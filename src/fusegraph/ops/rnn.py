"""Recurrent ops: RNN, GRU and LSTM (opsets 7, 14 and 22), written from the ONNX equations.

Gate orders are ONNX's (LSTM ``iofc``, GRU ``zrh``), not torch.nn's. Supported: directions
forward / reverse / bidirectional, the ``activations`` list with ``activation_alpha`` /
``activation_beta``, ``clip``, GRU ``linear_before_reset``, LSTM peepholes and
``input_forget``, ``sequence_lens`` (padded steps give zero outputs and keep the state),
initial states, ``layout`` 0/1, and every optional output. The input projection of all steps
is one matmul; the time loop does only the recurrent matmul and the gate math.

Under mixed precision a recurrent layer reads and writes the reduced type (its weights
stored reduced, its bias float32); this kernel computes such a node in float32 and rounds
each output once (oneDNN's bf16 cells also round the hidden state at each step).

``fusegraph::LSTM`` is ONNX's LSTM with the gate blocks of W, R and B in the order
``ifco`` (input, forget, cell, output: torch's and oneDNN's order) instead of ``iofc``; the
peepholes P keep ONNX's ``iof``. ``passes/replace_rnn.py`` rewrites an LSTM with constant
weights into it (the weights reordered once), so a backend's recurrent kernel reads its
weights as they are stored (``runtime/backends/cpu/dnnl/rnn.py``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..ir import DType
from .registry import FusionKind, NodeContext, Precision, register

REDUCED = (torch.bfloat16, torch.float16)

# name -> (uses alpha, uses beta, default alpha, default beta, fn(x, alpha, beta))
_ACTS = {
    "relu": (False, False, 0.0, 0.0, lambda x, a, b: torch.relu(x)),
    "tanh": (False, False, 0.0, 0.0, lambda x, a, b: torch.tanh(x)),
    "sigmoid": (False, False, 0.0, 0.0, lambda x, a, b: torch.sigmoid(x)),
    "affine": (True, True, 1.0, 0.0, lambda x, a, b: x * a + b),
    "leakyrelu": (True, False, 0.01, 0.0, lambda x, a, b: F.leaky_relu(x, a)),
    "thresholdedrelu": (True, False, 1.0, 0.0,
                        lambda x, a, b: torch.where(x > a, x, torch.zeros_like(x))),
    "scaledtanh": (True, True, 1.0, 1.0, lambda x, a, b: torch.tanh(x * b) * a),
    "hardsigmoid": (True, True, 0.2, 0.5, lambda x, a, b: torch.clamp(x * a + b, 0.0, 1.0)),
    "elu": (True, False, 1.0, 0.0, lambda x, a, b: F.elu(x, a)),
    "softsign": (False, False, 0.0, 0.0, lambda x, a, b: x / (1 + torch.abs(x))),
    "softplus": (False, False, 0.0, 0.0, lambda x, a, b: F.softplus(x)),
}

_DEFAULT_ACTS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}
_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
_FLOATS = (DType.FLOAT, DType.FLOAT16, DType.DOUBLE, DType.BFLOAT16, DType.UNDEFINED)
# an LSTM's gate blocks in W / R / B: the block index of (i, o, f, c)
ONNX_LSTM_GATES = (0, 1, 2, 3)       # ONNX: i, o, f, c
IFCO_LSTM_GATES = (0, 3, 1, 2)       # fusegraph::LSTM (torch, oneDNN): i, f, c, o


def _activations(ctx: NodeContext, op: str, dirs: int) -> list[list]:
    """Per direction, the list of activation callables (alpha/beta bound)."""
    per_dir = len(_DEFAULT_ACTS[op])
    names = ctx.attr("activations", None) or _DEFAULT_ACTS[op] * dirs
    if len(names) == per_dir and dirs == 2:
        names = list(names) * 2
    if len(names) != per_dir * dirs:
        raise ctx.unsupported(f"activations has {len(names)} entries, expected {per_dir * dirs}")
    alphas = list(ctx.attr("activation_alpha", None) or [])
    betas = list(ctx.attr("activation_beta", None) or [])
    funcs = []
    for name in names:
        key = str(name).lower()
        if key not in _ACTS:
            raise ctx.unsupported(f"activation {name!r}")
        use_a, use_b, a, b, fn = _ACTS[key]
        if use_a and alphas:
            a = float(alphas.pop(0))
        if use_b and betas:
            b = float(betas.pop(0))
        funcs.append(lambda x, _fn=fn, _a=a, _b=b: _fn(x, _a, _b))
    return [funcs[d * per_dir:(d + 1) * per_dir] for d in range(dirs)]


def _rnn_infer(op: str):
    def infer(ctx: NodeContext):
        x, r = ctx.shape(0), ctx.shape(2)
        dt = ctx.dtype(0) or None
        dirs = 2 if ctx.attr("direction", "forward") == "bidirectional" else 1
        hidden = ctx.attr("hidden_size", None) or (r[-1] if r is not None else None)
        if x is None or len(x) != 3:
            return [(dt, None)] * ctx.n_outputs
        if int(ctx.attr("layout", 0)):
            b, t = x[0], x[1]
            y, yh = (b, t, dirs, hidden), (b, dirs, hidden)
        else:
            t, b = x[0], x[1]
            y, yh = (t, dirs, b, hidden), (dirs, b, hidden)
        return [(dt, y), (dt, yh), (dt, yh)][:ctx.n_outputs]
    return infer


def _reverse_index(lens: torch.Tensor, T: int) -> torch.Tensor:
    """(T, B) time index that reverses each sequence within its own length."""
    t = torch.arange(T, device=lens.device).unsqueeze(1)
    return torch.where(t < lens, lens - 1 - t, t)


def _take_time(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    return torch.gather(x, 0, idx.unsqueeze(-1).expand(-1, -1, x.shape[-1]))


def _make(op: str, domain: str = "", since: int = 7, gates: tuple = ONNX_LSTM_GATES):
    n_gates = _GATES[op]

    @register(op, since=since, domain=domain, infer=_rnn_infer(op), fusion=FusionKind.OPAQUE,
              precision=(Precision.REDUCE, "a recurrent layer: its products read the reduced type (oneDNN's round "
                                           "the hidden state to it at each step, as their input) and accumulate in "
                                           "float32; the gates and the cell state in float32"))
    def build(ctx: NodeContext):
        direction = ctx.attr("direction", "forward")
        if direction not in ("forward", "reverse", "bidirectional"):
            raise ctx.unsupported(f"direction={direction!r}")
        dirs = 2 if direction == "bidirectional" else 1
        if ctx.dtype(0) not in _FLOATS:
            raise ctx.unsupported(f"input dtype {ctx.dtype(0).name}")
        acts = _activations(ctx, op, dirs)
        clip = ctx.attr("clip", None)
        clip = float(clip) if clip is not None else None
        layout = int(ctx.attr("layout", 0))
        lbr = bool(ctx.attr("linear_before_reset", 0)) if op == "GRU" else False
        input_forget = bool(ctx.attr("input_forget", 0)) if op == "LSTM" else False
        n_out = ctx.n_outputs
        cl = (lambda v: v.clamp(-clip, clip)) if clip is not None else (lambda v: v)

        def kernel(X, W, R, B=None, seq_lens=None, h0=None, c0=None, P=None):
            if X.dtype in REDUCED:         # float32 inside, each output rounded once
                up = [None if t is None else t.float() for t in (X, W, R, B, h0, c0, P)]
                outs = kernel(up[0], up[1], up[2], up[3], seq_lens, up[4], up[5], up[6])
                if n_out == 1:
                    return outs.to(X.dtype)
                return tuple(None if o is None else o.to(X.dtype) for o in outs)
            if layout:
                X = X.transpose(0, 1)
                h0 = h0.transpose(0, 1) if h0 is not None else None
                c0 = c0.transpose(0, 1) if c0 is not None else None
            T, batch = X.shape[0], X.shape[1]
            H = R.shape[-1]
            lens = seq_lens.to(torch.int64).reshape(1, -1) if seq_lens is not None else None
            ys, hs, cs = [], [], []
            for d in range(dirs):
                reverse = direction == "reverse" or d == 1
                x = X
                rev_idx = None
                if reverse:
                    if lens is None:
                        x = torch.flip(X, (0,))
                    else:
                        rev_idx = _reverse_index(lens, T)
                        x = _take_time(X, rev_idx)
                w, r = W[d], R[d]
                if B is not None:
                    wb, rb = B[d][:n_gates * H], B[d][n_gates * H:]
                else:
                    wb = rb = None
                h = h0[d] if h0 is not None else X.new_zeros((batch, H))
                c = p = None
                if op == "LSTM":
                    c = c0[d] if c0 is not None else X.new_zeros((batch, H))
                    p = P[d] if P is not None else None
                y, h, c = _run(op, x, w, r, wb, rb, h, c, p, acts[d], cl, lbr, input_forget, lens, gates)
                if reverse:
                    y = torch.flip(y, (0,)) if rev_idx is None else _take_time(y, rev_idx)
                ys.append(y)
                hs.append(h)
                cs.append(c)
            Y = torch.stack(ys, dim=1)                # (T, dirs, B, H)
            Yh = torch.stack(hs, dim=0)               # (dirs, B, H)
            Yc = torch.stack(cs, dim=0) if op == "LSTM" else None
            if layout:
                Y = Y.permute(2, 0, 1, 3)
                Yh = Yh.transpose(0, 1)
                Yc = Yc.transpose(0, 1) if Yc is not None else None
            outs = (Y, Yh, Yc)[:n_out]
            return outs[0] if n_out == 1 else outs

        return kernel

    return build


def _run(op, x, w, r, wb, rb, h, c, p, acts, cl, lbr, input_forget, lens, gates=ONNX_LSTM_GATES):
    """One direction over time; returns Y (T, B, H), the last state h and (LSTM) c; ``gates``:
    the block index of an LSTM's (i, o, f, c) gates."""
    T = x.shape[0]
    H = r.shape[-1]
    xw = torch.matmul(x, w.t())                       # (T, B, G*H)
    if wb is not None:
        if op == "GRU":
            xw = xw + wb + torch.cat([rb[:2 * H], torch.zeros_like(rb[2 * H:])])
        else:
            xw = xw + wb + rb
    rt = r.t()
    valid = None
    if lens is not None:                              # (T, B, 1): step t is inside sequence b
        valid = (torch.arange(T, device=x.device).unsqueeze(1) < lens).unsqueeze(-1)
    if p is not None:
        pi, po, pf = p[:H], p[H:2 * H], p[2 * H:]
    ys = []
    for t in range(T):
        g = xw[t]
        if op == "RNN":
            h_new = acts[0](cl(g + torch.matmul(h, rt)))
            c_new = None
        elif op == "GRU":
            hr = torch.matmul(h, rt[:, :2 * H])
            z = acts[0](cl(g[:, :H] + hr[:, :H]))
            rr = acts[0](cl(g[:, H:2 * H] + hr[:, H:]))
            if lbr:
                hh = torch.matmul(h, rt[:, 2 * H:])
                if rb is not None:
                    hh = hh + rb[2 * H:]
                n = acts[1](cl(g[:, 2 * H:] + rr * hh))
            else:
                hh = torch.matmul(rr * h, rt[:, 2 * H:])
                if rb is not None:
                    hh = hh + rb[2 * H:]
                n = acts[1](cl(g[:, 2 * H:] + hh))
            h_new = (1 - z) * n + z * h
            c_new = None
        else:
            g = g + torch.matmul(h, rt)
            gi, go, gf, gc = (g[:, k * H:(k + 1) * H] for k in gates)
            if p is not None:
                gi = gi + pi * c
                gf = gf + pf * c
            i = acts[0](cl(gi))
            f = 1 - i if input_forget else acts[0](cl(gf))
            cc = acts[1](cl(gc))
            c_new = f * c + i * cc
            if p is not None:
                go = go + po * c_new
            o = acts[0](cl(go))
            h_new = o * acts[2](c_new)
        if valid is not None:
            v = valid[t]
            ys.append(torch.where(v, h_new, torch.zeros_like(h_new)))
            h = torch.where(v, h_new, h)
            c = torch.where(v, c_new, c) if c_new is not None else None
        else:
            ys.append(h_new)
            h, c = h_new, c_new
    y = torch.stack(ys, dim=0) if ys else x.new_zeros((0, x.shape[1], H))
    return y, h, c


for _op in ("RNN", "GRU", "LSTM"):
    _make(_op)
_make("LSTM", domain="fusegraph", since=1, gates=IFCO_LSTM_GATES)
