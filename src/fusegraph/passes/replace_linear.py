"""Operator replacement: MatMul + Add (and plain Gemm) become one ``fusegraph::Linear``.

- matmul_add_to_linear: ``Add(MatMul(x, W), b)`` (either Add operand order) -> ``Linear(x, W,
  b)`` when W is 2-D, ``b`` varies only along the last axis (``[N]``, ``[1, N]``, a scalar;
  a non-``[N]`` constant is reshaped / broadcast to ``[N]``), the Add does not broadcast the
  result, the MatMul output feeds only this Add, and the type is floating point.
- gemm_to_linear: ``Gemm(A, B, C)`` with alpha = beta = 1 and transA = 0 -> ``Linear(A, B, C,
  trans_b=transB)``, under the same condition on C. Lets ``replace_matmul.py`` drop the
  Reshapes that exporters put around it.

Equal up to rounding (one addmm instead of a matmul and an add).
"""
from __future__ import annotations

from .facts import const_of, only_use, producer, shapes_equal
from .rule import FUSEGRAPH_DOMAIN, Decline, Rule


def _bias_vector(b, n, ctx):
    """``b`` as a value of shape [N] (a new constant when reshaping is needed), or a reason."""
    if b is None:
        return None, None
    if b.shape is not None and len(b.shape) == 1 and b.shape[0] == n:
        return b, None
    c = const_of(b)
    if c is None:
        return None, Decline("the other Add operand is not a bias along N ([N], or a constant)")
    if c.numel() == 1:
        return c.reshape(1).expand(n).contiguous(), None
    if isinstance(n, int) and c.numel() == n and c.dim() >= 1 and c.shape[-1] == n:
        return c.reshape(n), None
    return None, Decline("bias varies along more than the last axis")


def _matmul_add(node, ctx):
    for side in (0, 1):
        mm = producer(node.inputs[side], "MatMul")
        if mm is not None:
            b = node.inputs[1 - side]
            break
    else:
        return None
    x, w = mm.inputs
    y = mm.outputs[0]
    if not only_use(y):
        return Decline("MatMul output has other users")
    if w.shape is None or len(w.shape) != 2 or x.shape is None or len(x.shape) < 1:
        return Decline("weight is not 2-D (or ranks unknown)")
    if not y.dtype.is_float or not shapes_equal(y.shape, node.outputs[0].shape):
        return Decline("not floating point, or the Add broadcasts the result")
    if not ctx.supports("Linear", FUSEGRAPH_DOMAIN):
        return Decline("no Linear kernel")
    bias, why = _bias_vector(b, w.shape[1], ctx)
    return why or (x, w, bias, 0)


def _gemm(node, ctx):
    a = node.attrs
    if float(a.get("alpha", 1.0)) != 1.0 or int(a.get("transA", 0)):
        return None
    c = node.input(2)
    if c is not None and float(a.get("beta", 1.0)) != 1.0:
        return None
    w = node.input(1)
    if w is None or node.input(0) is None:   # malformed arity: inference reports it
        return None
    if w.shape is None or len(w.shape) != 2 or not node.outputs[0].dtype.is_float:
        return None
    trans_b = int(a.get("transB", 0))
    n = w.shape[0] if trans_b else w.shape[1]
    bias, why = _bias_vector(c, n, ctx)
    if why:
        return why
    return node.inputs[0], w, bias, trans_b


def _rewrite(node, match, ctx):
    x, w, bias, trans_b = match
    if bias is not None and not hasattr(bias, "producer"):
        bias = ctx.const(bias, "bias")
    inputs = [x, w] + ([bias] if bias is not None else [])
    return ctx.emit("Linear", inputs, {"trans_b": trans_b}, domain=FUSEGRAPH_DOMAIN)


RULES = [
    Rule("matmul_add_to_linear", _matmul_add, _rewrite, ops=("Add",),
         doc="2-D weight, bias along the last axis only, MatMul output used once, float"),
    Rule("gemm_to_linear", _gemm, _rewrite, ops=("Gemm",), doc="alpha = beta = 1, transA = 0, bias along N"),
]
