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
- ``lazy=True`` compiles nothing until the first call, on copies of that call's inputs (a
  loaded artifact's segments: same build, checked when it was compiled); should the bridge
  then refuse the graph, it runs as plain TorchScript (the same aten ops, unfused).
  ``compiles`` counts the compilations (tests: a load compiles nothing).
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
compiles = [0]     # TorchScript graphs compiled in this process (tests read it)
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


# bf16 / fp16 results (mixed precision) of a fused and an unfused run round at different
# points, and deep random nets amplify that (resnet50's 60-node run: ~10 % apart): they must
# agree in relative L2 within this and have NaN in the same places; a wrong kernel is off by
# orders of magnitude (DenseNet's bridge bug: 1e21)
REDUCED_REL_L2 = 0.25


def close(got, want, rtol: float = 1e-4, atol: float = 1e-5) -> bool:
    """``got`` matches ``want`` (same shape and dtype; fp32: rtol 1e-4, atol 1e-5 of the output's
    scale, NaN where NaN; bf16 / fp16: ``REDUCED_REL_L2``): a fused result against its reference."""
    if not isinstance(got, torch.Tensor) or not isinstance(want, torch.Tensor) or got.shape != want.shape \
            or got.dtype != want.dtype:
        return False
    if want.dtype in (torch.bfloat16, torch.float16):
        g, w = got.float(), want.float()
        nan = torch.isnan(w)
        if not torch.equal(nan, torch.isnan(g)):
            return False
        same = nan | (g == w)                     # NaN, and equal values (infinities too)
        g, w = g.masked_fill(same, 0), w.masked_fill(same, 0)
        return bool(torch.equal(g, w) or (torch.linalg.vector_norm(g - w) <= REDUCED_REL_L2 * torch.linalg.vector_norm(w)))
    scale = float(want.abs().max()) if want.numel() and want.is_floating_point() else 1.0
    scale = scale if scale == scale and scale != float("inf") else 1.0
    return bool(torch.allclose(got, want, rtol=rtol, atol=atol * max(1.0, scale), equal_nan=True))


class GraphKernel:
    """A TorchScript graph run through oneDNN Graph partitions; call it with the graph's
    remaining (non-constant) inputs. Check ``ok`` before using it."""

    def __init__(self, name: str, ir: str, constants: dict[str, torch.Tensor],
                 examples: Callable[[], list[torch.Tensor]] | None, partitions: int | None = 1,
                 lazy: bool = False):
        self.name = name
        self._ir, self._constants, self._examples, self._partitions = ir, constants, examples, partitions
        self._fns: dict[int, Callable] = {}
        self.reason = ""
        self.partitions = 0
        self.example_output = None
        self.lazy = lazy
        self.ok = AVAILABLE and (lazy or self._compile() is not None)

    def _compile(self):
        """The function compiled for the current thread count, or None (``reason`` set)."""
        threads = _get_threads()
        with _compile_lock:
            fn = self._fns.get(threads)
            if fn is not None:
                return fn
            fn = _function(self.name, self._ir, self._constants)
            compiles[0] += 1
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
            lazy_first = self._examples is None      # lazy: the first call's inputs are the examples
            if lazy_first:
                layouts = [(t.shape, t.stride(), t.dtype) for t in inputs]
                copies = [torch.empty_strided(sz, st, dtype=dt).copy_(t) for (sz, st, dt), t in zip(layouts, inputs)]
                self._examples = lambda: copies
            fn = self._compile()
            if lazy_first:
                if fn is not None:
                    fn = self._checked(fn)
                # later copies (another thread count) compile on zeros: hold no input alive
                self._examples = lambda: [torch.empty_strided(sz, st, dtype=dt).zero_() for sz, st, dt in layouts]
            if fn is None and self.lazy:
                fn = self._fns[_get_threads()] = self._unfused()
            if fn is None:      # cannot happen for a kernel that compiled once; keep it loud
                raise RuntimeError(f"{self.name}: oneDNN Graph kernel failed to compile: {self.reason}")
        return fn(*inputs)

    def _checked(self, fn):
        """A lazily compiled graph's first result against the same IR run unfused (on the same
        inputs): the check a compile makes against the per-node kernels, so that a stored
        segment layout naming a run the bridge computes wrongly is caught. On a mismatch the
        unfused graph is kept (``reason`` says why)."""
        got = self.example_output
        plain = self._unfused()
        want = plain(*self._examples())
        got, want = (got if isinstance(got, tuple) else (got,)), (want if isinstance(want, tuple) else (want,))
        if all(close(g, w) for g, w in zip(got, want)) and len(got) == len(want):
            return fn
        self.reason = "the fused graph differs from the same graph unfused"
        self._fns[_get_threads()] = plain
        return plain

    def _unfused(self):
        """The graph as plain TorchScript, optimised with the oneDNN Graph fuser off."""
        fn = _function(self.name, self._ir, self._constants)
        llga = torch._C._jit_llga_enabled()
        torch._C._jit_set_llga_enabled(False)
        try:
            with torch.no_grad():
                for _ in range(torch._C._jit_get_num_profiled_runs() + 1):
                    fn(*self._examples())
        finally:
            torch._C._jit_set_llga_enabled(llga)
        return fn


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


# The post-ops under Config.fast_math (exact away from NaN / Inf): ReLU as relu, hardtanh
# fused, GELU's erf form.
FAST_POST_OP_IR = {**POST_OP_IR, "relu": ["%r : Tensor = aten::relu(%y)"],
                   "hardtanh": ["%r : Tensor = aten::hardtanh(%y, %p0, %p1)"],
                   "gelu": ["%gn : str = prim::Constant[value=\"none\"]()", "%r : Tensor = aten::gelu(%y, %gn)"]}


def post_ops(exact: bool = True) -> dict:
    """The activations a partition fuses: exact on NaN / Inf, or the fast variant's."""
    return POST_OP_IR if exact else FAST_POST_OP_IR


def with_post_op(lines: list[str], activation: str, exact: bool = True) -> str:
    """IR text: ``lines`` (which compute ``%y``), then ``activation`` of it, returned."""
    act = post_ops(exact)[activation]
    return "\n".join(lines + ["  " + s for s in act] + ["  return (%r)" if act else "  return (%y)"])


def ir_list(values) -> str:
    """``[a, b]`` for an int[] constant in TorchScript IR."""
    return "[" + ", ".join(str(int(v)) for v in values) + "]"
