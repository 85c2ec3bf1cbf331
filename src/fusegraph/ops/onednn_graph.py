"""oneDNN Graph kernels: small TorchScript graphs whose ops oneDNN compiles into one partition.

PyTorch reaches oneDNN's convolution and pooling two ways. ``torch.ops.mkldnn.*`` (ideep)
builds the primitive descriptor again on every call — ~15-20 us of fixed cost on this
class of machine, more than the arithmetic of most convolutions in a mobile network. The
oneDNN Graph bridge of TorchScript (LLGA) compiles a partition once and then only executes
it: a call costs ~5 us in all (a 1x1 group convolution of 3.6M multiply-adds: 24 us against
40 us, ``benchmarks/bench_conv_kernels.py``). This module builds such kernels:

- ``GraphKernel(name, ir, constants, examples, partitions)`` parses ``ir`` (TorchScript IR
  text), replaces the graph inputs named in ``constants`` by those tensors as constants (so
  oneDNN treats them as weights and keeps its reordered copy), and runs it on ``examples``
  with the LLGA fuser on until the profiling executor has specialised it. With
  ``partitions=n`` it is usable only when every computing op ended inside exactly n oneDNN
  partitions (``ok``); otherwise ``reason`` says what stayed outside and the caller keeps its
  other kernel. ``partitions=None`` accepts any graph that compiles (a script segment, where
  the other ops run as TorchScript's aten calls); ``partitions`` then says how many it made.
- A partition is compiled for the intra-op thread count in force; a call under another
  count (a stream worker with fewer threads) compiles a copy for that count once, so
  oneDNN never forks more threads than the caller was given.
- The executor guards the input sizes and strides the graph was specialised for; another
  shape runs the unfused TorchScript graph (the same aten ops, correct but slower), so
  callers only build kernels for static shapes and pass inputs in the layout they promised.

The global TorchScript switches touched while compiling (LLGA on, the profiling executor)
are put back afterwards. ``AVAILABLE`` is False when this torch has no LLGA bridge; tests
switch it off to exercise the other kernels. Knows no op semantics: callers write the IR,
ending it with ``with_post_op`` (the activations oneDNN fuses after an anchor, ``POST_OP_IR``,
only those it computes as ONNX does on NaN and +-Inf).
"""
from __future__ import annotations

import re
import threading
from typing import Callable

import torch

_get_threads = torch.get_num_threads


def _available() -> bool:
    try:
        return (torch.backends.mkldnn.is_available() and hasattr(torch._C, "_jit_set_llga_enabled")
                and hasattr(torch._C, "parse_ir") and hasattr(torch._C, "_create_function_from_graph"))
    except Exception:   # noqa: BLE001 - a torch without TorchScript
        return False


AVAILABLE = _available()
_compile_lock = threading.Lock()
_NOT_COMPUTE = ("prim::", "aten::size", "aten::dim", "aten::len")


def _function(name: str, ir: str, constants: dict[str, torch.Tensor]):
    graph = torch._C.parse_ir(ir)
    inputs = list(graph.inputs())
    by_name = {v.debugName(): v for v in inputs}
    missing = set(constants) - set(by_name)
    if missing:
        raise ValueError(f"{name}: IR has no inputs {sorted(missing)}")
    first = next(iter(graph.nodes()))
    for key, tensor in constants.items():
        c = graph.insertConstant(tensor)
        c.node().moveBefore(first)
        by_name[key].replaceAllUsesWith(c)
    for i in reversed([i for i, v in enumerate(inputs) if v.debugName() in constants]):
        graph.eraseInput(i)
    return torch._C._create_function_from_graph(re.sub(r"\W", "_", name) or "kernel", graph)


def _scan(graph) -> tuple[list[str], int]:
    """(computing ops of an optimised graph that are not inside a oneDNN partition, number of
    partitions)."""
    outside: list[str] = []
    groups = 0

    def walk(block):
        nonlocal groups
        for node in block.nodes():
            kind = node.kind()
            if kind == "prim::oneDNNFusionGroup":
                groups += 1
                continue
            if not kind.startswith(_NOT_COMPUTE):
                outside.append(kind)
            for sub in node.blocks():
                walk(sub)
    walk(graph)
    return outside, groups


class GraphKernel:
    """A TorchScript graph run through oneDNN Graph partitions; call it with the graph's
    remaining (non-constant) inputs. Check ``ok`` before using it."""

    def __init__(self, name: str, ir: str, constants: dict[str, torch.Tensor],
                 examples: Callable[[], list[torch.Tensor]], partitions: int | None = 1):
        self.name = name
        self._ir, self._constants, self._examples, self._partitions = ir, constants, examples, partitions
        self._fns: dict[int, Callable] = {}
        self.reason = ""
        self.partitions = 0
        self.example_output = None
        self.ok = AVAILABLE and self._compile() is not None

    def _compile(self):
        """The function compiled for the current thread count, or None (``reason`` set)."""
        threads = _get_threads()
        with _compile_lock:
            fn = self._fns.get(threads)
            if fn is not None:
                return fn
            fn = _function(self.name, self._ir, self._constants)
            examples = self._examples()
            llga = torch._C._jit_llga_enabled()
            profiling = torch._C._jit_set_profiling_executor(True)
            runs = torch._C._jit_get_num_profiled_runs() + 1   # profile, then specialise and run fused
            torch._C._jit_set_llga_enabled(True)
            try:
                with torch.no_grad():
                    for _ in range(runs):
                        out = fn(*examples)
                graph = torch.jit.last_executed_optimized_graph()
            except RuntimeError as exc:      # the bridge rejected the graph: keep the other kernel
                self.reason = f"oneDNN Graph failed to compile it: {exc}"
                return None
            finally:
                torch._C._jit_set_llga_enabled(llga)
                torch._C._jit_set_profiling_executor(profiling)
            outside, groups = _scan(graph)
            self.partitions = groups
            if self._partitions is not None and (outside or groups != self._partitions):
                self.reason = (f"oneDNN Graph made {groups} partition(s) (wanted {self._partitions})"
                               + (f"; left outside: {', '.join(sorted(set(outside)))}" if outside else ""))
                return None
            self._fns[threads] = fn
            self.example_output = out        # the compiled graph's result on ``examples``
            return fn

    def __call__(self, *inputs):
        fn = self._fns.get(_get_threads())
        if fn is None:
            fn = self._compile()
            if fn is None:      # cannot happen for a kernel that compiled once; keep it loud
                raise RuntimeError(f"{self.name}: oneDNN Graph kernel failed to compile: {self.reason}")
        return fn(*inputs)


# activation -> IR lines computing %r from %y (%p0, %p1: its parameters), for the activations
# oneDNN Graph fuses into a partition as post-ops ("" and "none": no activation) and computes
# as ONNX does on NaN and +-Inf. FusedConv and LinearAct name theirs differently (swish / silu).
# ReLU is written as ``elu(y, alpha=0)``: oneDNN computes ``aten::relu`` as max(y, 0), which
# turns NaN into 0, while its ELU (y > 0 ? y : 0 * (exp(y) - 1)) keeps NaN, fuses the same
# and costs the same (a negative input gives -0.0 instead of 0.0). Absent, so the caller applies
# them after the partition: hardtanh (oneDNN's clip turns NaN into the lower bound), GELU
# (+inf gives NaN; its tanh form is computed as the erf form), hardsigmoid (left outside).
RELU_IR = "aten::elu({y}, {zero}, {one}, {one})"
POST_OP_IR = {
    "": [],
    "none": [],
    "relu": ["%r0 : float = prim::Constant[value=0.]()", "%r1 : float = prim::Constant[value=1.]()",
             "%r : Tensor = " + RELU_IR.format(y="%y", zero="%r0", one="%r1")],
    "sigmoid": ["%r : Tensor = aten::sigmoid(%y)"],
    "tanh": ["%r : Tensor = aten::tanh(%y)"],
    "hardswish": ["%r : Tensor = aten::hardswish(%y)"],
    "swish": ["%sg : Tensor = aten::sigmoid(%y)", "%r : Tensor = aten::mul(%y, %sg)"],
    "silu": ["%sg : Tensor = aten::sigmoid(%y)", "%r : Tensor = aten::mul(%y, %sg)"],
    "leaky_relu": ["%r : Tensor = aten::leaky_relu(%y, %p0)"],
}


def with_post_op(lines: list[str], activation: str) -> str:
    """IR text: ``lines`` (which compute ``%y``), then ``activation`` of it, returned."""
    act = POST_OP_IR[activation]
    return "\n".join(lines + ["  " + s for s in act] + ["  return (%r)" if act else "  return (%y)"])


def ir_list(values) -> str:
    """``[a, b]`` for an int[] constant in TorchScript IR."""
    return "[" + ", ".join(str(int(v)) for v in values) + "]"
