"""The torch frontend's ATen handlers, part one: elementwise, activation, linear-algebra,
convolution, normalisation, pooling, softmax and attention ops (shape, indexing and creation
ops are in ``torch_ops_shape.py``; the table itself in ``torch_table.py``).

Each handler takes the ``Importer`` (``frontends/torch.py``) and the op's arguments bound by name
from its schema, and returns the IR value(s) it built, in the op forms ``torch.onnx`` emits at
opset 17 (linear: MatMul + Add / Gemm; gelu: the erf formula; attention: MatMul, Mul, Add,
Softmax, MatMul), so the fusion rules match them as they match an ONNX export. Keys are ATen
overload names (``aten.add.Tensor``) or packets (``aten.add``: every overload). Facts only:
no optimisation, no pass logic.
"""
from __future__ import annotations

import math

import torch

from .torch_table import aten, out_dtype, promote

def _binary(op_type: str, a_name="self", b_name="other"):
    def handler(cx, a):
        dt = out_dtype(cx)
        x, y = cx.v(a[a_name], dt), cx.v(a[b_name], dt)
        alpha = a.get("alpha")
        if alpha not in (None, 1):
            y = cx.emit("Mul", [y, cx.const(alpha, dt)])
        return cx.emit(op_type, [x, y])
    return handler


aten("aten.add.Tensor", "aten.add.Scalar")(_binary("Add"))
aten("aten.sub.Tensor", "aten.sub.Scalar")(_binary("Sub"))
aten("aten.mul.Tensor", "aten.mul.Scalar")(_binary("Mul"))
aten("aten.maximum", "aten.max.other")(_binary("Max"))
aten("aten.minimum", "aten.min.other")(_binary("Min"))


@aten("aten.rsub.Scalar", "aten.rsub.Tensor")
def _rsub(cx, a):
    dt = out_dtype(cx)
    x, y = cx.v(a["self"], dt), cx.v(a["other"], dt)
    if a.get("alpha") not in (None, 1):
        x = cx.emit("Mul", [x, cx.const(a["alpha"], dt)])
    return cx.emit("Sub", [y, x])


@aten("aten.div.Tensor", "aten.div.Scalar", "aten.div.Tensor_mode", "aten.div.Scalar_mode")
def _div(cx, a):
    dt, mode = out_dtype(cx), a.get("rounding_mode")
    if mode is None or not dt.is_floating_point:
        if mode == "floor" and not dt.is_floating_point:
            raise cx.unsupported("with rounding_mode='floor' on integers is not mapped")
        return cx.emit("Div", [cx.v(a["self"], dt), cx.v(a["other"], dt)])
    q = cx.emit("Div", [cx.v(a["self"], dt), cx.v(a["other"], dt)])
    if mode == "floor":
        return cx.emit("Floor", [q])
    return cx.emit("Mul", [cx.emit("Sign", [q]), cx.emit("Floor", [cx.emit("Abs", [q])])])


@aten("aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor", "aten.pow.Scalar")
def _pow(cx, a):
    dt = out_dtype(cx)
    base = a["self"]
    exp = a["exponent"]
    return cx.emit("Pow", [cx.v(base, dt), cx.v(exp, dt if not isinstance(exp, int) else dt)])


def _compare(op_type: str, negate: bool = False):
    def handler(cx, a):
        dt = promote(cx, a["self"], a["other"])
        out = cx.emit(op_type, [cx.v(a["self"], dt), cx.v(a["other"], dt)])
        return cx.emit("Not", [out]) if negate else out
    return handler


for _name, _op, _neg in (("eq", "Equal", False), ("ne", "Equal", True), ("lt", "Less", False),
                         ("le", "LessOrEqual", False), ("gt", "Greater", False),
                         ("ge", "GreaterOrEqual", False)):
    aten(f"aten.{_name}.Tensor", f"aten.{_name}.Scalar")(_compare(_op, _neg))


def _logical(op_type: str):
    def handler(cx, a):
        if out_dtype(cx) != torch.bool:
            raise cx.unsupported("on non-boolean tensors is not mapped")
        return cx.emit(op_type, [cx.v(a["self"], torch.bool), cx.v(a["other"], torch.bool)])
    return handler


aten("aten.__and__.Tensor", "aten.bitwise_and.Tensor", "aten.logical_and")(_logical("And"))
aten("aten.__or__.Tensor", "aten.bitwise_or.Tensor", "aten.logical_or")(_logical("Or"))
aten("aten.logical_xor", "aten.bitwise_xor.Tensor")(_logical("Xor"))


@aten("aten.logical_not", "aten.bitwise_not")
def _not(cx, a):
    if cx.dtype_of(a["self"]) != torch.bool and str(cx.node.target).startswith("aten.bitwise"):
        raise cx.unsupported("on non-boolean tensors is not mapped")
    return cx.emit("Not", [cx.v(a["self"], torch.bool)])


def _unary(op_type: str, **attrs):
    def handler(cx, a):
        return cx.emit(op_type, [cx.v(a["self"], out_dtype(cx))], dict(attrs) or None)
    return handler


for _name, _op in (("relu", "Relu"), ("tanh", "Tanh"), ("sigmoid", "Sigmoid"), ("exp", "Exp"),
                   ("log", "Log"), ("sqrt", "Sqrt"), ("abs", "Abs"), ("neg", "Neg"), ("erf", "Erf"),
                   ("sin", "Sin"), ("cos", "Cos"), ("floor", "Floor"), ("ceil", "Ceil"),
                   ("reciprocal", "Reciprocal"), ("sign", "Sign"), ("hardswish", "HardSwish"),
                   ("round", "Round"), ("softplus", "Softplus")):
    aten(f"aten.{_name}")(_unary(_op))
aten("aten.hardsigmoid")(_unary("HardSigmoid", alpha=1.0 / 6, beta=0.5))


@aten("aten.rsqrt")
def _rsqrt(cx, a):
    return cx.emit("Reciprocal", [cx.emit("Sqrt", [cx.v(a["self"], out_dtype(cx))])])


@aten("aten.silu")
def _silu(cx, a):
    x = cx.v(a["self"])
    return cx.emit("Mul", [x, cx.emit("Sigmoid", [x])])


@aten("aten.leaky_relu")
def _leaky(cx, a):
    return cx.emit("LeakyRelu", [cx.v(a["self"])], {"alpha": float(a["negative_slope"])})


@aten("aten.elu")
def _elu(cx, a):
    if a.get("scale", 1) != 1 or a.get("input_scale", 1) != 1:
        raise cx.unsupported("with scale / input_scale is not mapped")
    return cx.emit("Elu", [cx.v(a["self"])], {"alpha": float(a["alpha"])})


@aten("aten.gelu")
def _gelu(cx, a):
    x = cx.v(a["self"])
    dt = out_dtype(cx)
    if a.get("approximate", "none") == "tanh":      # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        cube = cx.emit("Mul", [cx.emit("Pow", [x, cx.const(3.0, dt)]), cx.const(0.044715, dt)])
        inner = cx.emit("Mul", [cx.emit("Add", [x, cube]), cx.const(math.sqrt(2 / math.pi), dt)])
        half = cx.emit("Mul", [x, cx.const(0.5, dt)])
        return cx.emit("Mul", [half, cx.emit("Add", [cx.emit("Tanh", [inner]), cx.const(1.0, dt)])])
    e = cx.emit("Erf", [cx.emit("Div", [x, cx.const(1.4142135381698608, dt)])])
    return cx.emit("Mul", [cx.emit("Mul", [x, cx.emit("Add", [e, cx.const(1.0, dt)])]), cx.const(0.5, dt)])


def _clip_bound(cx, value, dt):
    return cx.const(value, dt) if value is not None and not isinstance(value, torch.fx.Node) else (
        cx.v(value, dt) if value is not None else None)


@aten("aten.hardtanh")
def _hardtanh(cx, a):
    dt = out_dtype(cx)
    return cx.emit("Clip", [cx.v(a["self"]), cx.const(a["min_val"], dt), cx.const(a["max_val"], dt)])


@aten("aten.clamp", "aten.clamp.Tensor", "aten.clip")
def _clamp(cx, a):
    dt = out_dtype(cx)
    return cx.emit("Clip", [cx.v(a["self"], dt), _clip_bound(cx, a.get("min"), dt), _clip_bound(cx, a.get("max"), dt)])


@aten("aten.clamp_min")
def _clamp_min(cx, a):
    dt = out_dtype(cx)
    return cx.emit("Max", [cx.v(a["self"], dt), cx.v(a["min"], dt)])


@aten("aten.where.self", "aten.where.ScalarOther", "aten.where.ScalarSelf", "aten.where.Scalar")
def _where(cx, a):
    dt = out_dtype(cx)
    return cx.emit("Where", [cx.v(a["condition"], torch.bool), cx.v(a["self"], dt), cx.v(a["other"], dt)])


@aten("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def _masked_fill(cx, a):
    dt = out_dtype(cx)
    return cx.emit("Where", [cx.v(a["mask"], torch.bool), cx.v(a["value"], dt), cx.v(a["self"], dt)])


# ----------------------------------------------------------------- linear algebra
def _transpose_last2(cx, x, rank: int):
    perm = list(range(rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    return cx.emit("Transpose", [x], {"perm": perm})


@aten("aten.linear")
def _linear(cx, a):
    x, w, b = a["input"], a["weight"], a["bias"]
    rank = len(cx.shape(x))
    if rank == 2 and b is not None:
        return cx.emit("Gemm", [cx.v(x), cx.v(w), cx.v(b)], {"transB": 1})
    y = cx.emit("MatMul", [cx.v(x), cx.emit("Transpose", [cx.v(w)], {"perm": [1, 0]})])
    return y if b is None else cx.emit("Add", [y, cx.v(b)])


@aten("aten.addmm")
def _addmm(cx, a):
    beta, alpha = a.get("beta", 1), a.get("alpha", 1)
    return cx.emit("Gemm", [cx.v(a["mat1"]), cx.v(a["mat2"]), cx.v(a["self"])],
                   {"alpha": float(alpha), "beta": float(beta)})


@aten("aten.mm", "aten.bmm", "aten.matmul")
def _matmul(cx, a):
    return cx.emit("MatMul", [cx.v(a["self"]), cx.v(a["mat2"] if "mat2" in a else a["other"])])


@aten("aten.t")
def _t(cx, a):
    rank = len(cx.shape(a["self"]))
    return cx.v(a["self"]) if rank < 2 else cx.emit("Transpose", [cx.v(a["self"])], {"perm": [1, 0]})


# ----------------------------------------------------------------- convolution / pooling
def _pair(v, n):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return v * n if len(v) == 1 else v


@aten("aten.conv1d", "aten.conv2d", "aten.conv3d", "aten.convolution")
def _conv(cx, a):
    x, w, b = a["input"], a["weight"], a["bias"]
    n = len(cx.shape(w)) - 2
    if isinstance(a.get("padding"), str):
        raise cx.unsupported(f"with padding={a['padding']!r} is not mapped")
    pads = _pair(a["padding"], n)
    attrs = {"strides": _pair(a["stride"], n), "pads": pads + pads, "dilations": _pair(a["dilation"], n),
             "group": int(a["groups"]), "kernel_shape": list(cx.shape(w)[2:])}
    ins = [cx.v(x), cx.v(w)] + ([cx.v(b)] if b is not None else [])
    if a.get("transposed"):
        attrs["output_padding"] = _pair(a["output_padding"], n)
        return cx.emit("ConvTranspose", ins, attrs)
    return cx.emit("Conv", ins, attrs)


@aten("aten.max_pool2d", "aten.max_pool1d", "aten.max_pool2d_with_indices")
def _max_pool(cx, a):
    k = list(a["kernel_size"])
    n = len(k)
    stride = _pair(a["stride"], n) if a["stride"] else k
    pads = _pair(a["padding"], n)
    out = cx.emit("MaxPool", [cx.v(a["self"])], {"kernel_shape": k, "strides": stride, "pads": pads + pads,
                                                "dilations": _pair(a["dilation"], n),
                                                "ceil_mode": int(bool(a["ceil_mode"]))})
    return [out, None] if "with_indices" in str(cx.node.target) else out


@aten("aten.avg_pool2d", "aten.avg_pool1d")
def _avg_pool(cx, a):
    if a.get("divisor_override") is not None:
        raise cx.unsupported("with divisor_override is not mapped")
    k = list(a["kernel_size"])
    n = len(k)
    stride = _pair(a["stride"], n) if a["stride"] else k
    pads = _pair(a["padding"], n)
    return cx.emit("AveragePool", [cx.v(a["self"])], {"kernel_shape": k, "strides": stride, "pads": pads + pads,
                                                     "ceil_mode": int(bool(a["ceil_mode"])),
                                                     "count_include_pad": int(bool(a["count_include_pad"]))})


@aten("aten.adaptive_avg_pool2d", "aten.adaptive_avg_pool1d", "aten._adaptive_avg_pool2d")
def _adaptive_avg(cx, a):
    out = [int(s) for s in a["output_size"]]
    if all(s == 1 for s in out):
        return cx.emit("GlobalAveragePool", [cx.v(a["self"])])
    spatial = cx.shape(a["self"])[-len(out):]
    if all(isinstance(d, int) and d % s == 0 for d, s in zip(spatial, out)):
        k = [d // s for d, s in zip(spatial, out)]
        return cx.emit("AveragePool", [cx.v(a["self"])], {"kernel_shape": k, "strides": k})
    raise cx.unsupported(f"to output size {out} from {spatial} (not a whole divisor) is not mapped")


# ----------------------------------------------------------------- normalisation / softmax
@aten("aten.batch_norm", "aten._native_batch_norm_legit_no_training")
def _batch_norm(cx, a):
    if a.get("training"):
        raise cx.unsupported("in training mode (call module.eval() before compiling)")
    x = a["input"]
    c = cx.shape(x)[1]
    dt = cx.dtype_of(x)
    w = cx.v(a["weight"]) if a["weight"] is not None else cx.const(torch.ones(c, dtype=dt))
    b = cx.v(a["bias"]) if a["bias"] is not None else cx.const(torch.zeros(c, dtype=dt))
    y = cx.emit("BatchNormalization", [cx.v(x), w, b, cx.v(a["running_mean"]), cx.v(a["running_var"])],
                {"epsilon": float(a["eps"]), "momentum": float(a.get("momentum") or 0.1)})
    return [y, None, None] if "native" in str(cx.node.target) else y


@aten("aten.layer_norm", "aten.native_layer_norm")
def _layer_norm(cx, a):
    x, shape = a["input"], [int(s) for s in a["normalized_shape"]]
    dt = cx.dtype_of(x)
    w = cx.v(a["weight"]) if a["weight"] is not None else cx.const(torch.ones(shape, dtype=dt))
    ins = [cx.v(x), w] + ([cx.v(a["bias"])] if a["bias"] is not None else [])
    y = cx.emit("LayerNormalization", ins, {"axis": -len(shape), "epsilon": float(a["eps"])})
    return [y, None, None] if "native" in str(cx.node.target) else y


@aten("aten.softmax.int", "aten._softmax", "aten.log_softmax.int", "aten._log_softmax")
def _softmax(cx, a):
    op = "LogSoftmax" if "log_softmax" in str(cx.node.target) else "Softmax"
    return cx.emit(op, [cx.v(a["self"], out_dtype(cx))], {"axis": int(a["dim"])})


@aten("aten.scaled_dot_product_attention")
def _sdpa(cx, a):
    """softmax(q @ k^T * scale + mask) @ v, as torch.onnx writes it (the attention rules fuse it)."""
    if a.get("dropout_p"):
        raise cx.unsupported("with dropout_p > 0 is not mapped")
    if a.get("enable_gqa"):
        raise cx.unsupported("with enable_gqa is not mapped")
    q, k, v = a["query"], a["key"], a["value"]
    qs, ks = cx.shape(q), cx.shape(k)
    dt = cx.dtype_of(q)
    scale = a.get("scale")
    scale = float(scale) if scale is not None else 1.0 / math.sqrt(qs[-1])
    scores = cx.emit("MatMul", [cx.v(q), _transpose_last2(cx, cx.v(k), len(ks))])
    scores = cx.emit("Mul", [scores, cx.const(scale, dt)])
    mask = a.get("attn_mask")
    if a.get("is_causal"):
        L, S = qs[-2], ks[-2]
        if not (isinstance(L, int) and isinstance(S, int)):
            raise cx.unsupported("with is_causal and a symbolic sequence length is not mapped")
        bias = torch.zeros(L, S, dtype=dt).masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), float("-inf"))
        scores = cx.emit("Add", [scores, cx.const(bias)])
    if mask is not None:
        if cx.dtype_of(mask) == torch.bool:
            m = cx.emit("Where", [cx.v(mask), cx.const(0.0, dt), cx.const(float("-inf"), dt)])
        else:
            m = cx.v(mask, dt)
        scores = cx.emit("Add", [scores, m])
    probs = cx.emit("Softmax", [scores], {"axis": -1})
    return cx.emit("MatMul", [probs, cx.v(v)])

