"""Output shapes from concrete input shapes, fast: the rules a model with symbolic input dims
evaluates once per new input shape to size and place every activation before it runs.

``rule_for(node)`` gives ``(rule, reads)``: ``rule(node, shapes, values)`` returns one shape
tuple per output (or None: no rule for this node's form), where ``shapes[i]``
is input ``i``'s concrete shape (None for an absent optional input) and ``values[i]`` its
tensor (or ``shape_ints.SmallInts``) when the caller holds it before the run (a constant, or
a value computed from the input shapes alone); ``reads(node)`` names the inputs whose
*values* the output shape depends on, so a caller knows whether the shape is computable
before the run. A rule is a few tuple operations (microseconds); an op with no rule here
gets None from ``rule_for`` and the caller falls back to running the op's portable kernel on
``meta`` tensors (no data, tens of microseconds), which also tells it when a shape depends on
data (the kernel then fails).
Rules follow the ONNX semantics the ops' kernels implement; ``tests/ops/test_shape_rules.py``
checks each against the kernel itself. Nothing here allocates or runs a kernel.
"""
from __future__ import annotations

import math
from typing import Callable


from ..ir import Node
from .shape_ints import SmallInts

Shape = tuple
Rule = Callable[[Node, list, list], list]
_RULES: dict[tuple[str, str], tuple[Rule, Callable[[Node], tuple[int, ...]]]] = {}


def _no_values(node: Node) -> tuple[int, ...]:
    return ()


def rule(*ops: str, domain: str = "", reads: Callable[[Node], tuple[int, ...]] = _no_values):
    """Register ``fn(node, shapes, values) -> [shape per output]`` for ``ops``; ``reads(node)``:
    the inputs whose values the shapes depend on."""
    def deco(fn: Rule) -> Rule:
        for op in ops:
            _RULES[(domain, op)] = (fn, reads)
        return fn
    return deco


def rule_for(node: Node) -> tuple[Rule, Callable[[Node], tuple[int, ...]]] | None:
    return _RULES.get(("" if node.domain == "ai.onnx" else node.domain, node.op_type))


def broadcast(*shapes: Shape) -> Shape:
    """Numpy broadcasting of concrete shapes (ValueError when they do not broadcast)."""
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for s in shapes:
        for i, d in enumerate(s, rank - len(s)):
            if d != 1:
                if out[i] not in (1, d):
                    raise ValueError(f"shapes {list(shapes)} do not broadcast")
                out[i] = d
    return tuple(out)


def _ints(t) -> list[int]:
    """The values of an integer tensor or ``SmallInts``, flat."""
    if t is None:
        return []
    if t.__class__ is SmallInts:
        return list(t.data)
    return [int(x) for x in t.reshape(-1).tolist()]


def _axis(a: int, rank: int) -> int:
    if not -rank <= a < max(rank, 1):
        raise ValueError(f"axis {a} is out of range for rank {rank}")
    return a + rank if a < 0 else a


# ----- elementwise: the first input's shape, or the broadcast of all ----------------------------
@rule("Relu", "Sigmoid", "Tanh", "Erf", "Sqrt", "Neg", "Abs", "Exp", "Log", "Reciprocal", "Not", "Identity",
      "Softmax", "LogSoftmax", "Cast", "CastLike", "LeakyRelu", "Elu", "Selu", "HardSigmoid", "HardSwish",
      "Softplus", "Softsign", "Gelu", "Clip", "IsNaN", "IsInf", "Sign", "Floor", "Ceil", "Round", "Mish",
      "LayerNormalization", "Dropout", "Celu", "ThresholdedRelu", "Shrink", "Swish", "InstanceNormalization",
      "BatchNormalization", "LRN")
@rule("QuantizeLinear", "DequantizeLinear")
@rule("Gelu", "LayerNorm", "MaskedSoftmax", "RMSNorm", "RotaryEmbedding", "Roll", "Requantize", domain="fusegraph")
def _same(node, shapes, values):
    if len(node.outputs) != 1 and node.op_type != "Dropout":    # statistics outputs: the kernel knows
        return None
    return [shapes[0]] * len(node.outputs)


@rule("Add", "Sub", "Mul", "Div", "Pow", "Where", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual",
      "And", "Or", "Xor", "Max", "Min", "Mod", "PRelu", "BitShift", "Sum", "Mean")
@rule("SkipLayerNorm", "ElementwiseChain", "SkipRMSNorm", "QAdd", domain="fusegraph")
def _broadcast(node, shapes, values):
    return [broadcast(*(s for s in shapes if s is not None))] * len(node.outputs)


# ----- products ----------------------------------------------------------------------------------
def _weight_columns(node, shapes) -> int:
    w = shapes[1]
    return int(w[0] if int(node.attrs.get("trans_b", 0)) else w[1])


@rule("Linear", "LinearAct", "QLinear", domain="fusegraph")
def _linear(node, shapes, values):
    return [tuple(shapes[0][:-1]) + (_weight_columns(node, shapes),)]


@rule("QLinearDynamic", domain="fusegraph")
def _linear_dynamic(node, shapes, values):
    return [tuple(shapes[0][:-1]) + (int(shapes[3][1]),)]


@rule("DynamicQuantizeLinear")
def _dynamic_quantize(node, shapes, values):
    return [tuple(shapes[0]), (), ()]


@rule("GatedActivation", domain="fusegraph")
def _gated(node, shapes, values):
    x = shapes[0]
    return [tuple(x[:-1]) + (x[-1] // 2,)]


@rule("QConv", domain="fusegraph")
def _conv(node, shapes, values):
    """``[N, M, spatial...]`` by the ONNX size formula (``auto_pad`` SAME_*: ceil(in / stride))."""
    x, w = shapes[0], shapes[1]
    a = node.attrs
    n = len(x) - 2
    k = [int(v) for v in a.get("kernel_shape") or w[2:]]
    st = [int(v) for v in a.get("strides") or [1] * n]
    d = [int(v) for v in a.get("dilations") or [1] * n]
    auto = a.get("auto_pad", "NOTSET") or "NOTSET"
    pads = [int(v) for v in a.get("pads") or [0] * (2 * n)] if auto in ("NOTSET", "") else [0] * (2 * n)
    out = []
    for i in range(n):
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            out.append(-(-x[2 + i] // st[i]))
        else:
            out.append((x[2 + i] + pads[i] + pads[n + i] - ((k[i] - 1) * d[i] + 1)) // st[i] + 1)
    if min(out, default=1) < 1:
        raise ValueError(f"QConv output size {out} from input {list(x)}")
    return [(x[0], w[0]) + tuple(out)]


@rule("MatMul", "BatchMatMul")
@rule("BatchMatMul", "QMatMul", domain="fusegraph")
def _matmul(node, shapes, values):
    a, b = shapes[0], shapes[1]
    if len(a) == 1 and len(b) == 1:
        return [()]
    if len(a) == 1:
        return [tuple(b[:-2]) + (b[-1],)]
    if len(b) == 1:
        return [tuple(a[:-1])]
    if a[-1] != b[-2]:
        raise ValueError(f"MatMul of {list(a)} and {list(b)}")
    return [broadcast(tuple(a[:-2]), tuple(b[:-2])) + (a[-2], b[-1])]


def _heads(shape: Shape, heads: int) -> Shape:
    return shape if not heads else (shape[0], heads, shape[1], shape[2] // heads)


@rule("ScaledDotProductAttention", domain="fusegraph")
def _attention(node, shapes, values):
    a = node.attrs
    split = a.get("qkv_split")
    if split is not None:
        q = tuple(shapes[0][:-1]) + (int(split[0]),)
        v = tuple(shapes[0][:-1]) + (int(split[2]),)
    else:
        q, v = shapes[0], shapes[2]
    q, v = _heads(q, int(a.get("q_heads", 0))), _heads(v, int(a.get("v_heads", 0)))
    if int(a.get("kv_repeat", 1)) > 1:          # grouped k / v heads: the query's batch and heads
        batch = tuple(q[:-2])
    else:
        batch = broadcast(tuple(q[:-2]), tuple(v[:-2]))
    if split is None and int(a.get("kv_repeat", 1)) == 1:
        k = _heads(shapes[1], int(a.get("k_heads", 0)))
        batch = broadcast(batch, tuple(k[:-2]))
    out = batch + (q[-2], v[-1])
    if int(a.get("merge_heads", 0)):
        out = out[:-3] + (out[-2], out[-3] * out[-1])
    return [out]


@rule("Gemm")
def _gemm(node, shapes, values):
    a, b = shapes[0], shapes[1]
    m = a[1] if int(node.attrs.get("transA", 0)) else a[0]
    n = b[0] if int(node.attrs.get("transB", 0)) else b[1]
    return [(m, n)]


# ----- data movement ------------------------------------------------------------------------------
@rule("Gather")
def _gather(node, shapes, values):
    data, idx = shapes[0], shapes[1]
    a = _axis(int(node.attrs.get("axis", 0)), len(data))
    return [tuple(data[:a]) + tuple(idx) + tuple(data[a + 1:])]


@rule("Transpose")
def _transpose(node, shapes, values):
    x = shapes[0]
    perm = [int(p) for p in node.attrs.get("perm", range(len(x) - 1, -1, -1))]
    return [tuple(x[p] for p in perm)]


@rule("Concat")
def _concat(node, shapes, values):
    present = [s for s in shapes if s is not None]
    a = _axis(int(node.attrs["axis"]), len(present[0]))
    out = list(present[0])
    out[a] = sum(s[a] for s in present)
    return [tuple(out)]


def _reshape_reads(node):
    return () if node.version < 5 else (1,)


@rule("Reshape", reads=_reshape_reads)
def _reshape(node, shapes, values):
    src = shapes[0]
    spec = [int(s) for s in node.attrs["shape"]] if node.version < 5 else _ints(values[1])
    allowzero = int(node.attrs.get("allowzero", 0))
    out = [src[i] if d == 0 and not allowzero else d for i, d in enumerate(spec)]
    if -1 in out:
        k = out.index(-1)
        rest = math.prod(d for i, d in enumerate(out) if i != k)
        out[k] = math.prod(src) // rest if rest else 0
    if math.prod(out) != math.prod(src):
        raise ValueError(f"Reshape of {list(src)} to {spec}")
    return [tuple(out)]


@rule("Flatten")
def _flatten(node, shapes, values):
    x = shapes[0]
    a = _axis(int(node.attrs.get("axis", 1)), len(x) + 1)
    return [(math.prod(x[:a]), math.prod(x[a:]))]


def _axes_input(node):
    return (1,) if len(node.inputs) > 1 and node.inputs[1] is not None else ()


def _axes(node, values) -> list[int]:
    if "axes" in node.attrs:
        return [int(a) for a in node.attrs["axes"]]
    return _ints(values[1]) if len(values) > 1 else []


@rule("Unsqueeze", reads=_axes_input)
def _unsqueeze(node, shapes, values):
    x = list(shapes[0])
    rank = len(x) + len(_axes(node, values))
    for a in sorted(_axis(a, rank) for a in _axes(node, values)):
        x.insert(a, 1)
    return [tuple(x)]


@rule("Squeeze", reads=_axes_input)
def _squeeze(node, shapes, values):
    x = shapes[0]
    axes = _axes(node, values)
    drop = {_axis(a, len(x)) for a in axes} if axes else {i for i, d in enumerate(x) if d == 1}
    return [tuple(d for i, d in enumerate(x) if i not in drop)]


@rule("Expand", reads=lambda node: (1,))
def _expand(node, shapes, values):
    return [broadcast(tuple(shapes[0]), tuple(_ints(values[1])))]


def _slice_reads(node):
    return tuple(i for i in range(1, len(node.inputs)) if node.inputs[i] is not None) if node.version >= 10 else ()


@rule("Slice", reads=_slice_reads)
def _slice(node, shapes, values):
    x = list(shapes[0])
    if node.version < 10:
        starts, ends = node.attrs["starts"], node.attrs["ends"]
        axes, steps = node.attrs.get("axes", list(range(len(starts)))), [1] * len(starts)
    else:
        starts, ends = _ints(values[1]), _ints(values[2])
        axes = _ints(values[3]) if len(values) > 3 and values[3] is not None else list(range(len(starts)))
        steps = _ints(values[4]) if len(values) > 4 and values[4] is not None else [1] * len(starts)
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = _axis(int(a), len(x))
        x[a] = len(range(*slice(int(s), int(e), int(st)).indices(x[a])))
    return [tuple(x)]


def _split_reads(node):
    return (1,) if node.version >= 13 and len(node.inputs) > 1 and node.inputs[1] is not None else ()


@rule("Split", reads=_split_reads)
def _split(node, shapes, values):
    x = shapes[0]
    a = _axis(int(node.attrs.get("axis", 0)), len(x))
    if node.version >= 13 and len(values) > 1 and values[1] is not None:
        parts = _ints(values[1])
    elif "split" in node.attrs:
        parts = [int(p) for p in node.attrs["split"]]
    else:
        n = len(node.outputs)
        size = -(-x[a] // n)
        parts = [size] * (n - 1) + [x[a] - size * (n - 1)]
    if sum(parts) != x[a]:
        raise ValueError(f"Split of {x[a]} into {parts}")
    return [tuple(x[:a]) + (p,) + tuple(x[a + 1:]) for p in parts]
