"""Recurrent layers as one oneDNN primitive each: ``fusegraph::LSTM`` (ONNX's LSTM with its gates
in oneDNN's order, ``passes/replace_rnn.py``), ONNX ``GRU`` (``linear_before_reset`` 0: oneDNN's
GRU; 1, as torch exports it: its "linear before reset" GRU) and ONNX ``RNN`` (tanh, relu or
sigmoid), every direction, every time step and every gate in one call that writes ``Y``,
``Y_h`` and ``Y_c`` into their planned slots.

Operands, per node (``D`` directions, ``G`` gates, ``H`` hidden, ``T`` steps, ``N`` batch):
- W ``[D, G*H, I]`` and R ``[D, G*H, H]`` are oneDNN's ``[1, D, I|H, G, H]`` weights seen through
  the axis permutation (0, 2, 1): packed once into the layout the primitive picks and held
  by the weight store (the graph's plain copy is released after binding; an artifact carries
  the packed form). ONNX's GRU gates ``zrh`` are oneDNN's ``u r o``; an LSTM is bound only in
  ``fusegraph::LSTM``'s ``ifco`` order (an ONNX LSTM declines, naming the pass that would
  have reordered it: its weights were not constants).
- the bias ``[1, D, G, H]``: ``Wb + Rb`` per gate (the linear-before-reset GRU keeps ``Rbh``
  apart, a fourth gate); the peepholes P (ONNX ``iof``) as oneDNN's ``ifo``: small float32
  tensors the kernel keeps.
- X ``[T, N, I]`` (``layout`` 1: ``[N, T, I]``, oneDNN's ``ntc``), the initial states and the
  outputs are described with their own strides: ``Y`` ``[T, D, N, H]`` is oneDNN's
  ``[T, N, D*H]`` when ``N == 1`` or the direction is one, else the kernel writes a
  staging buffer and copies it into ``Y`` (``layout`` 1 needs none). Initial states given as
  constants are bound once; absent ones are zeros.
- a primitive per (steps, batch): made at bind for a static model; a model whose sequence
  length or batch is known at run time only makes one at the first run at each shape (the
  weights packed once per layout those primitives want, ``MAX_SHAPES`` kept).
Declined with a reason: other activations (and RNN's relu, whose NaN oneDNN maps to 0,
unless ``Config.fast_math``), ``activation_alpha`` / ``beta``, ``clip``,
``input_forget``, a ``sequence_lens`` that is not a constant equal to ``T`` everywhere,
data other than float32, or than bfloat16 on a CPU with bfloat16 arithmetic (a mixed-precision
model's: data, weights and states bf16, the bias and peepholes float32).

NaN and infinities: the primitive's GEMMs and its sigmoid / tanh give what ONNX's equations
give (a NaN input makes NaN outputs downstream of it, an infinite pre-activation saturates):
``tests/runtime/test_rnn_kernels.py`` checks them against onnx.reference and the op's own
kernel (onnxruntime's cells turn a NaN input into numbers). The implementation oneDNN picks
is in ``report.kernels``: brgemm for LSTM and RNN on AVX-512; oneDNN 3.2 has no brgemm GRU,
it runs GRU on its GEMM-based cell (named "ref", though its products are oneDNN's GEMMs).
"""
from __future__ import annotations

import ctypes as C
import math
import threading

import torch

from ...protocol import Decline
from . import capi
from .call import Slot
from .layouts import contiguous
from .compute import compute_dtype
from .memory import DTYPES, TORCH_OF, MemDesc, Memory
from .primitive import Attr, Primitive, Resources

FAMILY = "dnnl"
_DIRECTIONS = {"forward": capi.RNN_LEFT2RIGHT, "reverse": capi.RNN_RIGHT2LEFT,
               "bidirectional": capi.RNN_BIDIRECTIONAL_CONCAT}
_DEFAULT_ACTS = {"LSTM": ["sigmoid", "tanh", "tanh"], "GRU": ["sigmoid", "tanh"]}
_RNN_ACTS = {"tanh": "tanh", "relu": "relu", "sigmoid": "logistic"}
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
TYPES = (torch.float32, torch.bfloat16)
PEEPHOLE_IFO = (0, 2, 1)       # oneDNN's peephole gates i, f, o from ONNX's i, o, f


def _decline(why: str) -> Decline:
    return Decline(why, FAMILY)


def _activation(ctx, op: str, dirs: int, exact: bool):
    """The oneDNN algorithm of the node's activations (RNN: its one activation; LSTM / GRU:
    "" for the defaults), or a Decline."""
    names = [str(a).lower() for a in (ctx.attr("activations", None) or [])]
    if ctx.attr("activation_alpha", None) or ctx.attr("activation_beta", None):
        return _decline("activation_alpha / activation_beta are given")
    if op == "RNN":
        names = names or ["tanh"] * dirs
        if len(set(names)) != 1 or names[0] not in _RNN_ACTS:
            return _decline(f"activations {names}: oneDNN's RNN has one of tanh, relu, sigmoid for all directions")
        if names[0] == "relu" and exact:
            return _decline("relu: oneDNN's maps NaN to 0 (Config.fast_math takes it)")
        return _RNN_ACTS[names[0]]
    default = _DEFAULT_ACTS[op]
    if names and names not in (default, default * dirs):
        return _decline(f"activations {names}: oneDNN's {op} has the default ones only ({default})")
    return ""


def _full_length(ctx, steps: int, batch: int) -> Decline | None:
    if not ctx.has_input(4):
        return None
    lens = ctx.const(4)
    if lens is None:
        return _decline("sequence_lens is given at run time (oneDNN runs every sequence to the full length)")
    if lens.numel() != batch or not bool((lens.to(torch.int64) == steps).all()):
        return _decline("sequence_lens holds lengths below the number of steps")
    return None


def _dim(d):
    return int(d) if isinstance(d, int) else None


def rnn_kernel(ctx, store, resources: Resources, exact: bool = True):
    node = ctx.node
    op = node.op_type
    if node.domain == "" and op == "LSTM":
        return _decline("an ONNX LSTM whose weights are not constants (passes/replace_rnn.py reorders constant "
                        "ones into oneDNN's gate order)")
    direction = str(ctx.attr("direction", "forward"))
    if direction not in _DIRECTIONS:
        return _decline(f"direction {direction!r}")
    dirs = 2 if direction == "bidirectional" else 1
    act = _activation(ctx, op, dirs, exact)
    if isinstance(act, Decline):
        return act
    if ctx.attr("clip", None) is not None:
        return _decline("clip is given (oneDNN's cells do not clip)")
    if op == "LSTM" and int(ctx.attr("input_forget", 0)):
        return _decline("input_forget=1 (oneDNN's LSTM has separate input and forget gates)")
    layout = int(ctx.attr("layout", 0))
    xs = node.inputs[0].shape
    if xs is None or len(xs) != 3 or not isinstance(xs[2], int) or any(o.shape is None for o in node.outputs):
        return _decline("needs the input's rank and feature size")
    dtype = node.inputs[0].dtype.to_torch() if node.inputs[0].dtype is not None else None
    if dtype not in TYPES or compute_dtype(dtype) != dtype:
        return _decline("needs float32 data, or bfloat16 on a CPU with bfloat16 arithmetic")
    params = (3, 7)          # the bias and the peepholes: float32 to oneDNN whatever their stored type
    if any(v is not None and v.dtype is not None and v.dtype.is_float and v.dtype.to_torch() != dtype
           and not (i in params and v.is_const)
           for i, v in enumerate(node.inputs)) or \
            any(v.dtype is not None and v.dtype.is_float and v.dtype.to_torch() != dtype for v in node.outputs):
        return _decline(f"needs its data, weights, states and outputs in one type ({dtype})")
    steps, batch = (_dim(xs[1]), _dim(xs[0])) if layout else (_dim(xs[0]), _dim(xs[1]))
    w, r = ctx.const(1), ctx.const(2)
    if w is None or r is None:
        return _decline("W or R is not a constant")
    if ctx.has_input(3) and ctx.const(3) is None or ctx.has_input(7) and ctx.const(7) is None:
        return _decline("B or P is not a constant")
    if ctx.has_input(4) and (steps is None or batch is None):
        return _decline("sequence_lens with a number of steps or a batch known at run time only")
    if ctx.has_input(4):
        why = _full_length(ctx, steps, batch)
        if why is not None:
            return why
    gates = _GATES[op]
    hidden = r.shape[-1]
    inp = xs[2]
    if tuple(w.shape) != (dirs, gates * hidden, inp) or tuple(r.shape) != (dirs, gates * hidden, hidden):
        return _decline(f"W {tuple(w.shape)} / R {tuple(r.shape)} do not fit {dirs} direction(s), {gates} gates")
    if steps == 0 or batch == 0:
        return _decline("an empty sequence or batch")
    const_states = [i for i in (5, 6) if ctx.has_input(i) and ctx.const(i) is not None]
    if const_states and batch is None:
        return _decline("constant initial states with a batch known at run time only")
    lbr = op == "GRU" and bool(int(ctx.attr("linear_before_reset", 0)))
    try:
        kernel = RnnKernel(ctx, store, resources, op, act, lbr, direction, dirs, layout, inp, hidden, dtype)
        kernel.bound(steps or 1, batch or 1)      # made now: a primitive oneDNN lacks declines here
    except capi.DnnlError as exc:
        return _decline(f"oneDNN has no recurrent primitive for this node: {exc}")
    return kernel


def _bias(ctx, op: str, lbr: bool, dirs: int, hidden: int) -> torch.Tensor:
    """oneDNN's ``[1, D, G(+1), H]`` bias from ONNX's B (``Wb`` then ``Rb``), float32."""
    gates = _GATES[op]
    b = ctx.const(3)
    if b is None:
        return torch.zeros(1, dirs, gates + lbr, hidden)
    b = b.to(torch.float32).reshape(dirs, 2, gates, hidden)
    wb, rb = b[:, 0], b[:, 1]
    if lbr:                  # z, r: summed; h: Wbh, then Rbh (applied before the reset gate)
        out = torch.cat([wb[:, :2] + rb[:, :2], wb[:, 2:], rb[:, 2:]], dim=1)
    else:
        out = wb + rb
    return out.reshape(1, dirs, gates + lbr, hidden).contiguous()


def _dense(md: MemDesc) -> bool:
    """Whether a weight layout holds its padded elements and nothing else (what an artifact's
    packed form must be: ``blocked.check``)."""
    desc = md.describe()
    return desc.get("kind") == capi.FORMAT_KIND_BLOCKED and \
        desc["size"] == math.prod(desc["padded"]) * TORCH_OF[desc["dt"]].itemsize


def _state_strides(layout: int, dirs: int, batch: int, hidden: int) -> tuple[int, ...]:
    """Strides of a state ``[1, D, N, H]`` over ONNX's ``[D, N, H]`` (layout 1: ``[N, D, H]``)."""
    if layout:
        return (dirs * batch * hidden, hidden, dirs * hidden, 1)
    return (dirs * batch * hidden, batch * hidden, hidden, 1)


MAX_SHAPES = 16        # primitives kept per node for the (steps, batch) a symbolic model runs at


class RnnKernel:
    """One recurrent node's kernel: ``kernel(x, [h0], [c0], out=(Y, Y_h, Y_c))`` (the initial
    states it reads at run time only; ``reads`` names them). A primitive per (steps, batch),
    made at bind for a static model, at the first run at a shape for a symbolic one (at most
    ``MAX_SHAPES`` kept); the weights are packed once per layout those primitives want."""
    writes_out = True

    def __init__(self, ctx, store, resources: Resources, op, act, lbr, direction, dirs, layout, inp, hidden,
                 dtype: torch.dtype = torch.float32):
        node = ctx.node
        f32 = torch.float32
        self.dtype = dtype           # data, weights and states (the bias and peepholes: float32)
        self.op, self.act, self.lbr, self.layout, self.dirs = op, act, lbr, layout, dirs
        self.direction, self.inp, self.hidden = _DIRECTIONS[direction], inp, hidden
        self.store, self._resources = store, resources
        self.n_out = len(node.outputs)
        self.weights = [node.inputs[1], node.inputs[2]]
        self.bias = _bias(ctx, op, lbr, dirs, hidden)
        self.peep = None
        if op == "LSTM" and ctx.has_input(7):
            peep = ctx.const(7).to(f32).reshape(dirs, 3, hidden)[:, list(PEEPHOLE_IFO)]
            self.peep = peep.reshape(1, dirs, 3, hidden).contiguous()
        # oneDNN's LSTM takes (and gives) both states or neither: a missing one is zeros
        self.has_h0 = ctx.has_input(5) or (op == "LSTM" and ctx.has_input(6))
        self.has_c0 = op == "LSTM" and self.has_h0
        self.states = {}      # input index -> its float32 constant, "zeros" (absent) or None (read at run time)
        reads = [0]
        for i, present in ((5, self.has_h0), (6, self.has_c0)):
            if not present:
                continue
            if not ctx.has_input(i):
                self.states[i] = "zeros"
            elif ctx.const(i) is not None:
                self.states[i] = ctx.const(i).to(dtype).contiguous()
            else:
                self.states[i] = None
                reads.append(i)
        self.reads = tuple(reads)
        self._bound: dict[tuple[int, int], _Bound] = {}
        self.converted = 0           # calls that copied an input into the primitive's layout

    @property
    def impl(self) -> str:
        return next(iter(self._bound.values())).prim.impl

    @property
    def prim(self):
        return next(iter(self._bound.values())).prim

    def bound(self, steps: int, batch: int) -> "_Bound":
        key = (steps, batch)
        got = self._bound.get(key)
        if got is None:
            if len(self._bound) >= MAX_SHAPES:
                self._bound.pop(next(iter(self._bound)))
            got = self._bound[key] = _Bound(self, steps, batch)
        return got

    def __call__(self, *ts, out=None):
        x = ts[0]
        steps, batch = (x.shape[1], x.shape[0]) if self.layout else (x.shape[0], x.shape[1])
        return self.bound(int(steps), int(batch)).run(self, ts, out)


class _Bound:
    """The primitive of one (steps, batch), its argument array and its run-time slots."""

    def __init__(self, k: RnnKernel, steps: int, batch: int):
        lib = capi.load()
        f32 = torch.float32
        dt = k.dtype                 # data, weights and states; the bias and peepholes stay f32
        op, dirs, layout, inp, hidden = k.op, k.dirs, k.layout, k.inp, k.hidden
        gates = _GATES[op]
        d_h = dirs * hidden
        self.k = k
        x_shape = (batch, steps, inp) if layout else (steps, batch, inp)
        x_md = MemDesc.of((steps, batch, inp), dt, (inp, steps * inp, 1) if layout else None)
        state_dims = (1, dirs, batch, hidden)
        state_shape = (batch, dirs, hidden) if layout else (dirs, batch, hidden)     # ONNX's
        state_strides = _state_strides(layout, dirs, batch, hidden)
        state_md = MemDesc.of(state_dims, dt, state_strides)
        # Y [T, D, N, H] (layout 1: [N, T, D, H]) as oneDNN's [T, N, D*H]: a staging buffer
        # where those strides cannot say it
        self.staged_y = not layout and dirs == 2 and batch > 1
        y_md = MemDesc.of((steps, batch, d_h), dt, (d_h, steps * d_h, 1) if layout else None)
        b_md = MemDesc.of(tuple(k.bias.shape), f32)
        p_md = MemDesc.of(tuple(k.peep.shape), f32) if k.peep is not None else None
        gives_state = k.n_out > 1
        attr = Attr([])
        src_iter = state_md.handle if k.has_h0 else None
        dst_iter = state_md.handle if gives_state else None

        def make(tag: int) -> Primitive:
            wl = MemDesc.tagged([1, dirs, inp, gates, hidden], DTYPES[dt], tag)
            wi = MemDesc.tagged([1, dirs, hidden, gates, hidden], DTYPES[dt], tag)
            pd = capi.vp()
            fwd = capi.FORWARD_INFERENCE
            if op == "LSTM":
                status = lib.lstm_forward_primitive_desc_create(
                    C.byref(pd), lib.engine, fwd, k.direction, x_md.handle, src_iter,
                    state_md.handle if k.has_c0 else None, wl.handle, wi.handle,
                    p_md.handle if p_md is not None else None, None, b_md.handle, y_md.handle, dst_iter,
                    state_md.handle if gives_state else None, 0, attr.handle)
            elif op == "GRU":
                create = lib.lbr_gru_forward_primitive_desc_create if k.lbr else lib.gru_forward_primitive_desc_create
                status = create(C.byref(pd), lib.engine, fwd, k.direction, x_md.handle, src_iter, wl.handle,
                                wi.handle, b_md.handle, y_md.handle, dst_iter, 0, attr.handle)
            else:
                status = lib.vanilla_rnn_forward_primitive_desc_create(
                    C.byref(pd), lib.engine, fwd, capi.ELTWISE[k.act], k.direction, x_md.handle, src_iter,
                    wl.handle, wi.handle, b_md.handle, y_md.handle, dst_iter, 0, 0.0, 0.0, attr.handle)
            capi.check(status, f"{op} primitive_desc_create")
            return Primitive(pd, op)
        prim = make(capi.TAG_ANY)
        if not all(_dense(prim.md(capi.Q_WEIGHTS_MD, i)) for i in (0, 1)):
            prim = make(capi.TAG_ABCDE)      # ldigo: oneDNN's GEMM-based cells pad its rows otherwise
        self.prim = prim
        k._resources.need(prim.scratchpad_bytes)
        # weights: the graph's W / R seen as [1, D, K, G, H] through (0, 2, 1), packed once per layout
        consts, keep = [], [attr]
        for index, arg, rows in ((0, capi.ARG_WEIGHTS_LAYER, inp), (1, capi.ARG_WEIGHTS_ITER, hidden)):
            value = k.weights[index]
            plain = value.const if value.const.device.type == "meta" else value.const.to(dt).contiguous()
            operand = MemDesc.of((1, dirs, rows, gates, hidden), dt,
                                 (dirs * gates * hidden * rows, gates * hidden * rows, 1, hidden * rows, rows))
            want = prim.md(capi.Q_WEIGHTS_MD, index)
            packed = k.store.form(value.name, plain, (0, 2, 1), operand, want)
            consts.append((arg, Memory(want, packed.data_ptr())))
            keep += [packed, want, operand]
        consts.append((capi.ARG_BIAS, Memory(b_md, k.bias.data_ptr())))
        if k.peep is not None:
            consts.append((capi.ARG_WEIGHTS_PEEPHOLE, Memory(p_md, k.peep.data_ptr())))
        # run-time inputs: X, and the initial states not given as constants
        self.slots = [Slot(capi.ARG_SRC_LAYER, x_shape, contiguous(x_shape), dt, x_md)]
        for i, arg in ((5, capi.ARG_SRC_ITER), (6, capi.ARG_SRC_ITER_C)):
            if i not in k.states:
                continue
            c = k.states[i]
            if c is None:
                self.slots.append(Slot(arg, state_shape, contiguous(state_shape), dt,
                                       MemDesc.of(state_dims, dt, state_strides)))
                continue
            t = torch.zeros(state_shape, dtype=dt) if isinstance(c, str) else c
            if tuple(t.shape) != state_shape:
                raise capi.DnnlError(f"initial state {i} has shape {tuple(t.shape)}, not {state_shape}", 2)
            consts.append((arg, Memory(MemDesc.of(state_dims, dt, state_strides), t.data_ptr())))
            keep.append(t)
        # outputs: Y, Y_h, Y_c (an LSTM's Y_c the node does not give: a buffer of the kernel's)
        y_shape = (batch, steps, dirs, hidden) if layout else (steps, dirs, batch, hidden)
        self.y_staging = torch.empty(steps, batch, d_h, dtype=dt) if self.staged_y else None
        self.out_slots = [Slot(capi.ARG_DST_LAYER, y_shape, contiguous(y_shape), dt, y_md)]
        for j, arg in ((1, capi.ARG_DST_ITER), (2, capi.ARG_DST_ITER_C)):
            if j < k.n_out:
                self.out_slots.append(Slot(arg, state_shape, contiguous(state_shape), dt,
                                           MemDesc.of(state_dims, dt, state_strides)))
            elif j == 2 and op == "LSTM" and gives_state:
                spare = torch.empty(state_shape, dtype=dt)
                consts.append((arg, Memory(MemDesc.of(state_dims, dt, state_strides), spare.data_ptr())))
                keep.append(spare)
        if self.staged_y:
            self.out_slots[0].memory.point(self.y_staging.data_ptr())
        self._keep, self._consts = keep, consts
        run = self.slots + self.out_slots
        self._n = len(run) + len(consts) + (1 if prim.scratchpad_bytes else 0)
        self._args = (capi.ExecArg * self._n)()
        for j, slot in enumerate(run):
            self._args[j] = capi.ExecArg(slot.arg, slot.memory.handle)
        for j, (arg, mem) in enumerate(consts):
            self._args[len(run) + j] = capi.ExecArg(arg, mem.handle)
        self._exec = lib.execute
        self._tid = None
        self._stream = None

    def _thread(self) -> None:
        self._tid = threading.get_ident()
        self._stream, scratch = self.k._resources.for_thread(self.prim.scratchpad_bytes)
        if scratch is not None:
            self._scratch = scratch
            self._args[self._n - 1] = capi.ExecArg(capi.ARG_SCRATCHPAD, scratch.handle)

    def run(self, k: RnnKernel, ts, out):
        if out is None:
            out = tuple(s.empty() for s in self.out_slots)
        elif isinstance(out, torch.Tensor):
            out = (out,)
        for slot, t in zip(self.slots, ts):
            if not slot.fits(t):
                if tuple(t.shape) != slot.shape or not t.is_floating_point():
                    raise TypeError(f"oneDNN {k.op}: input is {t.dtype} {tuple(t.shape)}, "
                                    f"expected {slot.dtype} {slot.shape}")
                t = slot.stage(t)
                k.converted += 1
            slot.memory.point(t.data_ptr())
        copies = []
        for j, (slot, t) in enumerate(zip(self.out_slots, out)):
            if j == 0 and self.staged_y:
                copies.append((t, None))
                continue
            target = t if slot.fits(t) else slot.staging()
            if target is not t:
                copies.append((t, target))
            slot.memory.point(target.data_ptr())
        if self._tid != threading.get_ident():
            self._thread()
        status = self._exec(self.prim.handle, self._stream, self._n, self._args)
        if status:
            raise capi.DnnlError(f"execute {k.op}", status)
        for t, staged in copies:
            if staged is None:          # [T, N, D*H] -> Y [T, D, N, H]
                steps, batch, _ = self.y_staging.shape
                t.copy_(self.y_staging.view(steps, batch, k.dirs, -1).transpose(1, 2))
            else:
                t.copy_(staged)
        return out[0] if len(out) == 1 else out
