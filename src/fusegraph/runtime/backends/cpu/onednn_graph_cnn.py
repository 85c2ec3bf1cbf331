"""The CNN kernels written as oneDNN Graph partitions (``onednn_graph.py``): a fused
convolution (bias, residual add, activation) and 2-D average pooling over channels-last
float32 CPU data of static shape. Max pooling declines: oneDNN's max pool turns a window of
NaN (and one of -inf) into -FLT_MAX, where ONNX (and torch's kernel) give NaN (-inf).

Each builder returns a kernel (its ``onednn_graph`` attribute is the ``GraphKernel``), or a
reason string when the node is not one these kernels
cover (the caller then keeps its ideep / ATen kernel): symmetric padding only (an
asymmetric pad would be an op outside the partition), static shapes, more than one channel
and more than one spatial position (a channels-last tensor with one of those has two valid
stride patterns, and the partition is specialised on one). Inputs are made channels-last
before the call (a no-op for the layout pass's choice; the graph input of a network's first
convolution is converted once). The activations oneDNN Graph fuses are
``onednn_graph.POST_OP_IR`` (the ones it computes as ONNX does on NaN and +-Inf); the caller
applies any other after the partition. No pass logic here.
"""
from __future__ import annotations

import torch

from .onednn_graph import GraphKernel, ir_list, post_ops, with_post_op

CL = torch.channels_last


def _static_cl(shape) -> bool:
    return (shape is not None and len(shape) == 4 and all(isinstance(d, int) and d > 0 for d in shape)
            and shape[1] > 1 and shape[2] * shape[3] > 1)


def _zeros(shape):
    return torch.zeros(tuple(shape)).contiguous(memory_format=CL)


def conv_kernel(name: str, x_shape, y_shape, w: torch.Tensor, bias: torch.Tensor | None, stride, padding,
                dilation, groups: int, residual: bool, activation: str, params: list[float], exact: bool = True):
    """``act(conv(x, w) + bias [+ z])`` as one partition: a kernel ``(x[, z]) -> y``, or a reason."""
    if activation not in post_ops(exact):
        return f"activation {activation!r} is not fused by oneDNN Graph"
    if not (_static_cl(x_shape) and _static_cl(y_shape)):
        return "needs static 4-D shapes with more than one channel and position"
    lines = ["graph(%x : Tensor" + (", %z : Tensor" if residual else "") + ", %w : Tensor"
             + (", %b : Tensor" if bias is not None else "") + "):"]
    if bias is None:
        lines.append("  %b : NoneType = prim::Constant()")
    lines += [f"  %st : int[] = prim::Constant[value={ir_list(stride)}]()",
              f"  %pd : int[] = prim::Constant[value={ir_list(padding)}]()",
              f"  %dl : int[] = prim::Constant[value={ir_list(dilation)}]()",
              f"  %gr : int = prim::Constant[value={int(groups)}]()"]
    for i, p in enumerate(params[:2]):
        lines.append(f"  %p{i} : float = prim::Constant[value={float(p)!r}]()")
    conv = "%y" if not residual else "%c"
    lines.append(f"  {conv} : Tensor = aten::conv2d(%x, %w, %b, %st, %pd, %dl, %gr)")
    if residual:
        lines += ["  %one : int = prim::Constant[value=1]()", "  %y : Tensor = aten::add(%c, %z, %one)"]
    ir = with_post_op(lines, activation, exact)
    constants = {"w": w.contiguous()}
    if bias is not None:
        constants["b"] = bias.contiguous()
    examples = (lambda: [_zeros(x_shape), _zeros(y_shape)]) if residual else (lambda: [_zeros(x_shape)])
    kernel = GraphKernel(name, ir, constants, examples)
    if not kernel.ok:
        return kernel.reason
    if residual:
        def conv_add(x, w, b, z, out=None):
            y = kernel(x.contiguous(memory_format=CL), z.contiguous(memory_format=CL))
            if out is not None:
                out.copy_(y)
                return out
            return y
        conv_add.writes_out, conv_add.onednn_graph = False, kernel
        return conv_add

    def conv(x, w=None, b=None):
        return kernel(x.contiguous(memory_format=CL))
    conv.writes_out, conv.onednn_graph = False, kernel
    return conv


def pool_kernel(name: str, kind: str, x_shape, y_shape, kernel_size, stride, padding, dilation,
                ceil_mode: bool, count_include_pad: bool = False):
    """2-D ``avg`` pooling as one partition: a kernel ``x -> y``, or a reason (``max``: always)."""
    if kind == "max":
        return "oneDNN's max pooling turns NaN and -inf windows into -FLT_MAX"
    if not (_static_cl(x_shape) and y_shape is not None and len(y_shape) == 4
            and all(isinstance(d, int) and d > 0 for d in y_shape)):
        return "needs static 4-D shapes with more than one channel and position"
    if kind == "avg" and any(d != 1 for d in dilation):
        return "dilated average pooling"
    lines = ["graph(%x : Tensor):",
             f"  %k : int[] = prim::Constant[value={ir_list(kernel_size)}]()",
             f"  %st : int[] = prim::Constant[value={ir_list(stride)}]()",
             f"  %pd : int[] = prim::Constant[value={ir_list(padding)}]()",
             f"  %cm : bool = prim::Constant[value={int(bool(ceil_mode))}]()",
             f"  %ci : bool = prim::Constant[value={int(bool(count_include_pad))}]()",
             "  %dv : NoneType = prim::Constant()",
             "  %r : Tensor = aten::avg_pool2d(%x, %k, %st, %pd, %cm, %ci, %dv)",
             "  return (%r)"]
    kernel = GraphKernel(name, "\n".join(lines), {}, lambda: [_zeros(x_shape)])
    if not kernel.ok:
        return kernel.reason

    def pool(x):
        return kernel(x.contiguous(memory_format=CL))
    pool.onednn_graph = kernel
    return pool
