"""Algebraic simplification rules (identities of arithmetic), each with its exactness condition.

- mul_one, add_zero, sub_zero, div_one: ``x*1, 1*x, x+0, 0+x, x-0, x/1 -> x`` when the
  constant does not broadcast the result to a larger shape. Exact (``-0 + 0`` gives ``+0``
  where ``x`` was ``-0``: equal as numbers, as in every other graph optimiser).
- mul_zero: ``x*0 -> 0`` for integer / bool ``x`` (exact); for floats only under fast_math,
  since ``Inf*0`` and ``NaN*0`` are NaN.
- div_self: ``x/x -> 1`` only under fast_math (``0/0``, ``Inf/Inf``, ``NaN/NaN`` are NaN in
  floats; integer ``0/0`` is undefined).
- log_exp: ``log(exp(x)) -> x`` when ``|x| <= 1`` is provable (output of a bounded op), or
  under fast_math: outside that, fp32 ``exp`` may overflow to Inf (the rewrite would then be
  more exact than the original, but not equal to it).
- exp_log: ``exp(log(x)) -> x`` when ``x >= 0`` is provable (log of a negative is NaN), or
  under fast_math. Equal up to rounding (the rewrite is the exact value).
- neg_neg: ``-(-x) -> x``. Exact.
- sqrt_sqrt: ``sqrt(x)*sqrt(x) -> x`` when ``x >= 0`` is provable, or under fast_math.
- div_const: ``x / c -> x * (1/c)`` for float ``x`` and constant ``c`` whose reciprocal is
  finite and normal in ``x``'s type. Within 1 ulp (exact when ``c`` is a power of two).
- affine_chain: a chain of Mul / Add / Sub / Div / Neg by constants, each link used once,
  becomes at most one Mul and one Add (``x*s + t``, constants computed in 64-bit). Integers:
  exact (ring arithmetic, no Div). Floats: re-associated, equal up to rounding. The chain is
  collapsed once, at its last link, so the pass's work grows linearly with its length.
"""
from __future__ import annotations

import torch

from ..ir.shape import broadcast_shapes, numel
from .facts import const_all_equal, const_of, nonnegative, only_use, producer, shapes_equal, unit_bounded
from .rewrite import nbytes_of
from .rule import Decline, Rule


def _identity_operand(node, value, sides):
    """The non-constant operand when the constant on one of ``sides`` equals ``value``."""
    if len(node.inputs) != 2:      # malformed arity: inference reports it, not a rewrite
        return None
    for side in sides:
        c, x = node.inputs[side], node.inputs[1 - side]
        if const_all_equal(c, value) and x is not None and not x.is_const:
            if not shapes_equal(x.shape, node.outputs[0].shape):
                return Decline("the constant broadcasts the result to a larger shape")
            if x.is_graph_output and node.outputs[0].is_graph_output:
                return Decline("would make two graph outputs the same tensor")
            return x
    return None


def _neutral(name, op, value, sides):
    return Rule(name, lambda n, ctx: _identity_operand(n, value, sides), lambda n, x, ctx: x, ops=(op,),
                doc=f"{op} by {value}: result shape equals x's shape")


def _fast_or(ctx, proven: bool):
    return proven or ctx.options.fast_math


def _filled(node, ctx, value):
    out = node.outputs[0]
    if numel(out.shape) is None:
        return Decline("result shape is not static")
    if not ctx.can_materialise(nbytes_of(out.shape, out.dtype)):
        return Decline("result would exceed the fold size limit")
    return torch.full(out.shape, value, dtype=out.dtype.to_torch())


def _mul_zero(node, ctx):
    for side in (0, 1):
        if const_all_equal(node.inputs[side], 0) and not node.inputs[1 - side].is_const:
            dt = node.outputs[0].dtype
            if dt.is_float and not ctx.options.fast_math:
                return Decline("float x may be Inf/NaN, and Inf*0 is NaN (needs fast_math)")
            return _filled(node, ctx, 0)
    return None


def _div_self(node, ctx):
    if node.inputs[0] is not node.inputs[1]:
        return None
    if not ctx.options.fast_math:
        return Decline("x may be 0, Inf or NaN, where x/x is not 1 (needs fast_math)")
    return _filled(node, ctx, 1)


def _inverse_pair(outer_op, inner_op, proof):
    def check(node, ctx):
        inner = producer(node.inputs[0], inner_op)
        if inner is None:
            return None
        x = inner.inputs[0]
        if not _fast_or(ctx, proof(x)):
            return Decline(f"{outer_op}({inner_op}(x)) = x is not provable here (needs fast_math)")
        if x.is_graph_output and node.outputs[0].is_graph_output:
            return Decline("would make two graph outputs the same tensor")
        return x
    return check


def _sqrt_sqrt(node, ctx):
    a, b = (producer(v, "Sqrt") for v in node.inputs)
    if a is None or b is None or a.inputs[0] is not b.inputs[0]:
        return None
    x = a.inputs[0]
    if not _fast_or(ctx, nonnegative(x)):
        return Decline("x >= 0 is not provable (sqrt of a negative is NaN; needs fast_math)")
    if x.is_graph_output and node.outputs[0].is_graph_output:
        return Decline("would make two graph outputs the same tensor")
    return x


def _div_const(node, ctx):
    c = const_of(node.inputs[1])
    if c is None or node.inputs[0].is_const or not node.outputs[0].dtype.is_float:
        return None
    if not c.is_floating_point() or c.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        return None
    recip = (1.0 / c.double()).to(c.dtype)
    tiny = torch.finfo(c.dtype).tiny
    if not bool(torch.isfinite(recip).all()) or bool((recip.abs() < tiny).any()):
        return Decline("1/c is not finite and normal in this type")
    return recip


# ----------------------------------------------------------------- affine chains

def _affine_step(node):
    """(x, kind, constant) when ``node`` is x op constant, else None."""
    if node.domain != "":
        return None
    if node.op_type == "Neg":
        return node.inputs[0], "neg", None
    if node.op_type not in ("Mul", "Add", "Sub", "Div") or len(node.inputs) != 2:
        return None
    a, b = node.inputs
    ca, cb = const_of(a), const_of(b)
    if (ca is None) == (cb is None):
        return None
    if node.op_type in ("Mul", "Add"):
        return (b, node.op_type, ca) if ca is not None else (a, node.op_type, cb)
    if node.op_type == "Sub":
        return (a, "Sub", cb) if cb is not None else (b, "RSub", ca)
    if cb is not None and node.outputs[0].dtype.is_float:
        return a, "Div", cb
    return None


def _continues_chain(node) -> bool:
    """Whether ``node``'s only user is an affine link on it: the chain then collapses at its
    last link, in one rewrite (collapsing at every link would redo the growing chain's merge,
    and its provenance, at each one: quadratic in the chain's length)."""
    out = node.outputs[0]
    if not only_use(out) or out.is_graph_output:
        return False
    user = out.users[0]
    step = _affine_step(user)
    return step is not None and step[0] is out and user.outputs[0].dtype == out.dtype


def _affine_check(node, ctx):
    dt = node.outputs[0].dtype
    if not (dt.is_float or dt.is_integer) or _affine_step(node) is None or _continues_chain(node):
        return None
    steps, v = [], node.outputs[0]
    cur = node
    while cur is not None:
        step = _affine_step(cur)
        if step is None or (cur is not node and not only_use(cur.outputs[0])):
            break
        steps.append(step)
        cur = step[0].producer
    if len(steps) < 2:
        return None
    wide = torch.float64 if dt.is_float else torch.int64
    s, t = torch.ones((), dtype=wide), torch.zeros((), dtype=wide)
    for _, kind, c in reversed(steps):
        c = None if c is None else c.to(wide)
        if kind == "Mul":
            s, t = s * c, t * c
        elif kind == "Add":
            t = t + c
        elif kind == "Sub":
            t = t - c
        elif kind == "RSub":
            s, t = -s, c - t
        elif kind == "Div":
            s, t = s / c, t / c
        else:
            s, t = -s, -t
    x = steps[-1][0]
    target = dt.to_torch()
    s, t = s.to(target), t.to(target)
    if dt.is_float and not (bool(torch.isfinite(s).all()) and bool(torch.isfinite(t).all())):
        return Decline("merged constants overflow the value type")
    need_mul, need_add = not bool((s == 1).all()), not bool((t == 0).all())
    try:
        shape = broadcast_shapes(x.shape, tuple(s.shape) if need_mul else (),
                                 tuple(t.shape) if need_add else ())
    except ValueError:
        return None
    if not shapes_equal(shape, v.shape):
        need_mul = True
        shape = broadcast_shapes(x.shape, tuple(s.shape), tuple(t.shape) if need_add else ())
        if not shapes_equal(shape, v.shape):
            return None
    if need_mul + need_add >= len(steps):
        return None
    if not need_mul and not need_add and x.is_graph_output and v.is_graph_output:
        return Decline("would make two graph outputs the same tensor")
    return x, (s if need_mul else None), (t if need_add else None)


def _affine_rewrite(node, match, ctx):
    x, s, t = match
    y = x
    if s is not None:
        y = ctx.emit("Mul", [y, ctx.const(s, "scale")])
    if t is not None:
        y = ctx.emit("Add", [y, ctx.const(t, "shift")])
    return y


RULES = [
    _neutral("mul_one", "Mul", 1, (0, 1)),
    _neutral("add_zero", "Add", 0, (0, 1)),
    _neutral("sub_zero", "Sub", 0, (1,)),
    _neutral("div_one", "Div", 1, (1,)),
    Rule("mul_zero", _mul_zero, lambda n, z, ctx: ctx.const(z, "zeros"), ops=("Mul",),
         doc="integer/bool x, or fast_math"),
    Rule("div_self", _div_self, lambda n, o, ctx: ctx.const(o, "ones"), ops=("Div",), doc="fast_math only"),
    Rule("log_exp", _inverse_pair("Log", "Exp", unit_bounded), lambda n, x, ctx: x, ops=("Log",),
         doc="|x| <= 1 provable, or fast_math"),
    Rule("exp_log", _inverse_pair("Exp", "Log", nonnegative), lambda n, x, ctx: x, ops=("Exp",),
         doc="x >= 0 provable, or fast_math"),
    Rule("neg_neg", _inverse_pair("Neg", "Neg", lambda x: True), lambda n, x, ctx: x, ops=("Neg",), doc="always"),
    Rule("sqrt_sqrt", _sqrt_sqrt, lambda n, x, ctx: x, ops=("Mul",), doc="x >= 0 provable, or fast_math"),
    Rule("div_const", _div_const, lambda n, r, ctx: ctx.emit("Mul", [n.inputs[0], ctx.const(r, "recip")]),
         ops=("Div",), doc="float x, 1/c finite and normal"),
    Rule("affine_chain", _affine_check, _affine_rewrite, ops=("Mul", "Add", "Sub", "Div", "Neg"),
         doc="each link used once; integer chains have no Div"),
]
