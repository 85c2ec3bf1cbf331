"""``fusegraph::ElementwiseChain`` of per-channel affine steps as one oneDNN binary primitive.

The chains this takes are a pre-activation BatchNorm and its activation (DenseNet's BN + ReLU
after every Concat: ``Mul i0 c, Add p c', Relu p``): one live input, then binary steps each
with a constant operand that broadcasts over the input (per channel, or one value), and at
most a final Relu. The first step is the primitive's own operation (``src0 op src1``), the
later ones its binary post-ops, the Relu an eltwise post-op that keeps NaN (``elu`` with alpha
0, as in ``conv.py``; applied after the primitive in place with torch where the
implementation's post-ops are not known to be exact). One pass over the tensor, computed in
float32 and rounded once for a bfloat16 input: what the op's own kernel (``rounded_once``)
computes, in four passes fewer (densenet121 in bfloat16: benchmarks/RESULTS.md, "Mixed
precision against OpenVINO bf16 (issue 16)"). A float32 chain
declines: the op's own kernel writes the first step's result and updates it in place, and
measured as fast. Constants are bound once, in float32. Anything else declines with its
reason, and the op's own kernel runs.
"""
from __future__ import annotations

import torch

from ...protocol import Decline
from . import capi
from .call import DnnlKernel, Slot
from .activation_post_ops import activation_after, activation_post_ops
from .layouts import dtype_of, static_shape, strides_of
from .memory import MemDesc, Memory
from .primitive import Attr, create, exact_post_ops

TYPES = (torch.bfloat16,)
COMMUTATIVE = {"Add": "add", "Mul": "mul"}
ORDERED = {"Sub": "sub", "Div": "div"}       # only as ``p op c`` / ``x op c``


def _operand(ctx, arg: str, xs: tuple):
    """The float32 constant ``arg`` (``i<k>``) as a rank-``len(xs)`` tensor that broadcasts over
    ``xs``, or None."""
    if not (arg[:1] == "i" and arg[1:].isdigit()):
        return None
    c = ctx.const(int(arg[1:]))
    if c is None or not c.is_floating_point() or c.device.type not in ("cpu",) or c.dim() > len(xs):
        return None
    shape = (1,) * (len(xs) - c.dim()) + tuple(c.shape)
    if any(d not in (1, x) for d, x in zip(shape, xs)):
        return None
    return c.float().reshape(shape).contiguous()


def _steps(ctx, steps: list[str], live: int, xs: tuple):
    """[(oneDNN algorithm, constant)] of the binary steps, and whether a final Relu follows; or
    a reason string."""
    out, relu = [], False
    for k, step in enumerate(steps):
        op, *args = str(step).split()
        if op == "Relu" and args == ["p"] and k == len(steps) - 1 and k:
            relu = True
            continue
        if len(args) != 2:
            return f"step {step!r} is not a binary step with a constant"
        first = f"i{live}" if k == 0 else "p"
        if args[0] == first:
            other = args[1]
        elif args[1] == first and op in COMMUTATIVE:
            other = args[0]
        else:
            return f"step {step!r} does not read the running value first"
        alg = COMMUTATIVE.get(op) or ORDERED.get(op)
        c = _operand(ctx, other, xs)
        if alg is None or c is None:
            return f"step {step!r}: not add / sub / mul / div by a constant that broadcasts over the input"
        out.append((alg, c))
    return (out, relu) if out else "no binary step"


def chain_kernel(ctx, resources, exact: bool = True):
    node = ctx.node
    live = [i for i in range(ctx.n_inputs) if ctx.const(i) is None]
    if len(live) != 1:
        return Decline("needs exactly one non-constant input", "dnnl")
    x_v, y_v = node.inputs[live[0]], node.outputs[0]
    xs = static_shape(x_v)
    dtype = dtype_of(x_v)
    if dtype == torch.float32:
        return Decline("float32: the op's own kernel, its steps in place, is as fast here "
                       "(densenet121 34.9 against 35.8-36.5 ms with the primitive)", "dnnl")
    if xs is None or not 2 <= len(xs) <= 5 or dtype not in TYPES or static_shape(y_v) != xs \
            or y_v.dtype != x_v.dtype:
        return Decline("needs a bfloat16 input of static rank-2..5 shape, and an output like it", "dnnl")
    parsed = _steps(ctx, list(ctx.attr("steps")), live[0], xs)
    if isinstance(parsed, str):
        return Decline(parsed, "dnnl")
    steps, relu = parsed
    (alg, first), rest = steps[0], steps[1:]
    x_md = MemDesc.of(xs, dtype, strides_of(x_v))
    y_md = MemDesc.of(xs, dtype, strides_of(y_v))
    mds = [MemDesc.of(tuple(c.shape), torch.float32) for _, c in steps]
    post = [("binary", a, md) for (a, _), md in zip(rest, mds[1:])]
    act, after = activation_post_ops("relu" if relu else "", [], exact)
    lib = capi.load()

    def make(post_ops):
        attr = Attr(post_ops)
        return create("binary", lambda pd: lib.binary_primitive_desc_create(
            pd, lib.engine, capi.BINARY[alg], x_md.handle, mds[0].handle, y_md.handle, attr.handle))
    try:
        prim = make(post + act)
        if exact and act and not exact_post_ops(prim.impl):
            prim, after = make(post), activation_after("relu", [])
    except capi.DnnlError as exc:
        return Decline(f"oneDNN has no binary primitive for this chain: {exc}", "dnnl")
    if prim.is_reference:
        return Decline(f"oneDNN offers only its reference binary primitive ({prim.impl})", "dnnl")
    consts = [(capi.ARG_SRC_1, Memory(mds[0], first.data_ptr()))]
    consts += [(capi.arg_post_op_src1(j), Memory(md, c.data_ptr())) for j, ((_, c), md) in
               enumerate(zip(rest, mds[1:]))]
    x_slot = Slot(capi.ARG_SRC, xs, strides_of(x_v), dtype, x_md)
    return DnnlKernel(prim, [x_slot], Slot(capi.ARG_DST, xs, strides_of(y_v), dtype, y_md), consts, resources,
                      (live[0],), after=after, keep=tuple(c for _, c in steps) + tuple(mds))
