"""``Executor``: runs a model's generated code on validated feeds and returns NumPy outputs.

It binds the graph once (``bind.py``: kernels from the device's backend, ``backends/``;
arena views), then picks a runner:
- one stream: the single generated ``run`` function, called directly;
- several streams on CPU: ``streams_cpu.CpuStreamRunner`` (one function per stream, workers);
- CUDA: ``streams_cuda.CudaRunner`` (torch streams and events, one issuing thread).
Outputs that live in the arena, in a constant, in a feed or in a remembered shape-only value
(``shape_memo.py``) are copied before they are handed out, so the next run cannot change what
a caller holds, nor a caller what the next run reads. Runs of one executor are serialised
(the arena is shared by all runs). ``run(feeds, hook=...)`` runs a variant of the code that
calls ``hook(index, phase, outputs)`` around every node (tests: allocation checks, timing).
The backend prepares the process first (CPU: malloc keeps freed memory unless the config
says no, ``backends/cpu/host_memory.py``); ``backend_state`` is what a loaded artifact
stored for it (CPU: packed weights); ``shared_forms``, packed weights it shares with the other
per-shape compiles of the same model. After binding, the backend releases the graph's plain
copy of every weight it holds in its own form (``release_weights``: weights held once); a
weight stored only packed is read back plain for a backend that cannot take the packed form
(``packed_only``). ``direct_calls=False`` generates every kernel call through the kernel's
Python path instead of the direct call a kernel may offer (``direct.py``): the same results,
what ``benchmarks/direct_calls.py`` compares against.
Thread counts: under ``thread_policy="free_cores"`` a run takes no more threads than the
cores other processes leave free (``free_cores.py``); below the count the kernels were bound
at, it runs a binding made for its count (``bind.kernels_again``: the backend's
thread-bound kernels made again at that count, the same arena, frames and packed weights),
made at the first such run and kept (``threads_used`` counts the runs per count). Runs with
a hook, and CPU stream plans, run at the bound count.
Kernel failures surface as ``KernelError`` naming the node and op, found through the line
map of the generated source, so the hot path carries no per-node bookkeeping. A run given
cancel tokens (``run_control.py``: a caller's ``CancelToken``, a timeout) arms the executor's
``RunControl``, whose flag the generated code reads before each kernel; a stopped run raises
``RunCancelled`` naming the node it stopped before. Its wait for the run lock is bounded by
the same tokens, and ``close()`` takes that lock: it waits for the run in progress.
"""
from __future__ import annotations

import threading
import traceback
from typing import Any, Callable, Mapping

import torch

from ..errors import ConfigError, FusegraphError, KernelError, ModelClosedError, RunCancelled
from ..ops.run_limits import NO_LIMITS, RunLimits
from ..ir import Graph
from .backends import backend_for
from . import free_cores
from .bind import Binding, bind, bind_kernels, kernels_again, with_kernels
from .threads import intra_op_threads
from .codegen import GeneratedCode, generate_run_function
from .convert import to_host, to_numpy
from .feeds import convert_feeds
from .run_control import CancelToken, RunControl


class _SingleRunner:
    """One stream on one device: the generated function itself."""
    adaptable = True          # its thread-bound kernels can be made again for another count

    def __init__(self, graph: Graph, binding: Binding, filename: str, direct_calls: bool = True,
                 control: RunControl | None = None):
        self.graph, self.binding, self.filename = graph, binding, filename
        self.direct_calls, self.control = direct_calls, control
        self.code = generate_run_function(graph, binding, filename, direct=direct_calls, control=control)
        self.codes = [self.code]

    def __call__(self, tensors: list[torch.Tensor], hook: Callable | None = None) -> tuple:
        if hook is None:
            return self.code.function(*tensors)
        code = generate_run_function(self.graph, self.binding, self.filename + ":hook", hook=hook,
                                     direct=self.direct_calls, control=self.control)
        self.codes = [self.code, code]
        return code.function(*tensors)

    def close(self) -> None:
        pass


class Executor:
    def __init__(self, graph: Graph, model_name: str, plan=None, device: str = "cpu",
                 threads: int | None = None, cuda_graph: bool = False, strides: dict | None = None,
                 keep_freed_memory: bool = False, backend_state: dict | None = None,
                 exact: bool = True, cpu_kernels: str = "auto", shared_forms=None, direct_calls: bool = True,
                 planner=None, declared_shapes: dict | None = None, thread_policy: str = "fixed",
                 limits: RunLimits = NO_LIMITS):
        self.graph = graph
        self.model_name = model_name
        self.plan = plan
        self.inputs = list(graph.inputs)
        names = graph.meta.get("output_names") or [v.name for v in graph.outputs]
        self.output_names = list(names)
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"{model_name}: device {str(device)!r} was asked for, but no CUDA device is "
                              f"available (torch {torch.__version__}, CUDA build: "
                              f"{torch.version.cuda or 'no'}); use device='cpu' or 'auto'")
        self.backend = backend_for(self.device.type, keep_freed_memory=keep_freed_memory, exact=exact,
                                   kernels=cpu_kernels, shared_forms=shared_forms)
        self.backend.prepare()
        if backend_state is not None:
            self.backend.import_state(backend_state, model_name)
        if self.device.type == "cuda":       # weights live where the kernels run
            for v in graph.constants.values():
                if v.const.device != self.device:
                    v.const = self.backend.portable_weight(v).to(self.device)
        self.threads = threads
        self.bound_threads = threads or torch.get_num_threads()     # the count the kernels are made for
        self.thread_policy = thread_policy
        self.threads_used: dict[int, int] = {}       # thread count -> runs at it
        self._chosen_threads: int | None = None      # the count free_cores chose last
        self._narrow: dict[tuple[int, int], object] = {}   # (id(runner), threads) -> that runner at threads
        self._narrow_kernels: dict[int, dict[int, Callable]] = {}
        self._closed = False
        self.control = RunControl(model_name)       # the stop flag every run's code reads
        symbolic = plan is not None and plan.symbolic and planner is not None and self.device.type == "cpu"
        if symbolic:            # one binding for every input shape; plans per bucket at run time
            self.binding = bind_kernels(graph, plan, self.device, self.backend, self.control, limits)
        else:                   # strides: a loaded artifact's
            self.binding = bind(graph, plan, self.device, strides, self.backend, self.control, limits)
        self.released_bytes = self.backend.release_weights(graph, self.binding.calls)
        for c in self.binding.calls:          # a packed-only weight some kernel still reads plain
            for v in c.inputs:
                if v is not None and v.is_const and v.const.device.type == "meta":
                    v.const = self.backend.portable_weight(v)
        filename = f"<fusegraph:{graph.name}>"
        streams = getattr(plan, "streams", None)
        if symbolic:
            from .frame_runner import FrameRunner
            multi = streams if streams is not None and streams.num_streams > 1 else None
            self._runner = FrameRunner(graph, self.binding, planner, filename, model_name, self.device,
                                       declared_shapes, streams=multi, threads=threads)
        elif self.device.type == "cuda":
            from .streams_cuda import CudaRunner
            self._runner = CudaRunner(graph, self.binding, streams, filename, cuda_graph=cuda_graph,
                                      control=self.control)
        elif streams is not None and streams.num_streams > 1:
            from .streams_cpu import CpuStreamRunner
            self._runner = CpuStreamRunner(graph, self.binding, streams, filename, threads=threads,
                                           direct_calls=direct_calls, control=self.control)
        else:
            self._runner = _SingleRunner(graph, self.binding, filename, direct_calls, self.control)
        self._direct_calls = direct_calls
        self._lock = threading.Lock()
        self.backend.settle()                       # what binding's probe runs freed
        frames = getattr(self._runner, "frames", None)
        self._memo_storages = frames.memo_storages if frames is not None else \
            self.code.env.get("_MEMO_STORAGES", frozenset())      # kept current by the code / the frames
        self._const_storages = {_storage(t) for t in [v.const for v in graph.constants.values()]
                                + list(self.binding.dense.values()) if t.numel() and t.device.type != "meta"}

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def code(self) -> GeneratedCode:
        return self._runner.code

    @property
    def arena(self):
        runner_arena = getattr(self._runner, "arena", None)
        return runner_arena if runner_arena is not None else self.binding.arena

    @property
    def lock(self) -> threading.Lock:
        """Held around a run: the arena is shared by all runs of the model."""
        return self._lock

    @property
    def frame_runner(self):
        """The runner of a model with symbolic input dims (``frame_runner.py``)."""
        from .frame_runner import FrameRunner
        if not isinstance(self._runner, FrameRunner):
            raise ConfigError(f"{self.model_name}: the model has no symbolic input dim on the CPU (its shapes are "
                              f"fixed): it runs no per-shape frames")
        return self._runner

    def run_tensors(self, tensors: list[torch.Tensor], hook: Callable | None = None, runner=None,
                    tokens: tuple[CancelToken, ...] = (), magnitudes: Mapping[int, float] | None = None) -> tuple:
        """One run on converted feeds (the caller serialises runs: ``run`` holds the lock), by
        ``runner`` (default the model's); it stops at the next kernel boundary once one of
        ``tokens`` is cancelled. ``magnitudes``: input index -> its largest ``|x|`` where the
        caller keeps that input and knows it (``Backend.before_run``)."""
        if self._closed:
            raise ModelClosedError(f"{self.model_name}: the model was closed; compile or load it again to run it")
        runner = runner or self._runner
        threads = self.threads
        if hook is None and self.thread_policy == "free_cores" and getattr(runner, "adaptable", False):
            wanted = self.threads or torch.get_num_threads()
            threads = self._chosen_threads = free_cores.SAMPLER.free(wanted, self._chosen_threads)
            if threads < self.bound_threads:
                runner = self._at_threads(runner, threads, tensors)
        used = threads or torch.get_num_threads()
        self.threads_used[used] = self.threads_used.get(used, 0) + 1
        control = self.control
        control.start(tokens)
        try:
            if control.stop:
                control.stopped("before its first kernel")
            with torch.inference_mode(), intra_op_threads(threads):
                self.backend.before_run(tensors, magnitudes)
                out = runner(tensors, hook)
            if getattr(runner, "varying_allocations", False):
                self.backend.after_run()
            return out
        except RunCancelled as exc:
            raise self._located(exc, runner) from None
        except FusegraphError:
            raise
        except Exception as exc:
            raise self._kernel_error(exc, runner) from exc
        finally:
            control.finish()

    def _at_threads(self, runner, threads: int, tensors: list):
        """``runner`` with its thread-bound kernels made for ``threads`` (made once, kept)."""
        key = (id(runner), threads)
        got = self._narrow.get(key)
        if got is not None:
            return got
        kernels = self._narrow_kernels.get(threads)
        if kernels is None:
            with torch.inference_mode(), intra_op_threads(threads):
                kernels = kernels_again(self.binding, self.device, self.backend.thread_bound())
            self._narrow_kernels[threads] = kernels
        if isinstance(runner, _SingleRunner):
            got = _SingleRunner(self.graph, with_kernels(self.binding, kernels),
                                f"{runner.filename}:{threads}-threads", self._direct_calls, self.control)
        else:                                   # a FrameRunner (the model's, or a KV session's)
            got = runner.with_kernels(kernels, f"{threads}-threads", tensors)
        self._narrow[key] = got
        return got

    def convert_feeds_except(self, feeds: Mapping[str, Any], skipped: set[str]) -> list:
        """``feeds`` checked and converted for every input not in ``skipped`` (None there)."""
        kept = [v for v in self.inputs if v.name not in skipped]
        converted = iter(convert_feeds(self.model_name, kept, feeds))
        return [None if v.name in skipped else next(converted) for v in self.inputs]

    def _acquire(self, tokens: tuple[CancelToken, ...]) -> None:
        """Take the run lock; with tokens, give up (their error) once one is cancelled or past
        its deadline while another run of this model holds the lock."""
        if not tokens:
            self._lock.acquire()
            return
        if self._lock.acquire(blocking=False):
            return
        while True:
            for t in tokens:
                if t.deadline is not None and t.remaining() <= 0:
                    t.cancel_at_deadline()
                if t.cancelled:
                    raise t.error(self.model_name, "while it waited for another run of the model")
            left = min((t.remaining() for t in tokens if t.deadline is not None), default=0.05)
            if self._lock.acquire(timeout=max(0.001, min(0.05, left))):
                return

    def run(self, feeds: Mapping[str, Any], hook: Callable | None = None,
            tokens: tuple[CancelToken, ...] = ()) -> dict[str, Any]:
        tensors = convert_feeds(self.model_name, self.inputs, feeds)
        self._acquire(tokens)
        try:
            outs = self.run_tensors(tensors, hook, tokens=tokens)
            return self.outputs_to_numpy(tensors, outs)
        finally:
            self._lock.release()

    def outputs_to_numpy(self, tensors: list, outs: tuple, keep: list[bool] | None = None,
                         runner=None) -> dict[str, Any]:
        """A run's outputs as NumPy arrays (``keep``: which of them), each copied where it lives
        in the arena, a constant, a feed or a kept shape-only value (the next run or the caller
        could otherwise change it); ``runner``: the one that ran (its arena and frames)."""
        shared = None           # the constants' and feeds' storages: made only for an output outside the arena
        frames = getattr(runner, "frames", None)
        memo = frames.memo_storages if frames is not None else self._memo_storages
        arena = runner.arena if runner is not None and getattr(runner, "arena", None) is not None else self.arena
        result = {}
        for i, (name, t) in enumerate(zip(self.output_names, outs)):
            if keep is not None and not keep[i]:
                continue
            if not isinstance(t, torch.Tensor):   # a sequence or an optional (runtime/convert.py)
                result[name] = to_host(t)
                continue
            try:
                if t.numel():
                    inside = arena is not None and arena.contains(t)
                    if not inside and shared is None:
                        shared = self._const_storages | {_storage(x) for x in tensors
                                                         if isinstance(x, torch.Tensor) and x.numel()}
                    if inside or _storage(t) in shared or _storage(t) in memo:
                        t = t.clone()
                result[name] = to_numpy(t)
            except Exception as exc:   # e.g. an Expand output too large to materialise
                raise KernelError(f"{self.model_name}: output {name!r} ({tuple(t.shape)}, {t.dtype}, "
                                  f"{t.numel() * t.element_size()} bytes) could not be returned: "
                                  f"{type(exc).__name__}: {str(exc)[:200]}") from exc
        return result

    def close(self) -> None:
        """Stop worker threads (if any) once the run in progress (if any) has finished; the
        executor cannot run afterwards (``ModelClosedError``). Idempotent."""
        with self._lock:
            self._closed = True
            self._runner.close()

    def _located(self, exc: RunCancelled, runner=None) -> RunCancelled:
        """``exc`` with the node the run stopped at (found through the generated code's line
        map, as for a kernel failure)."""
        node = self._node_at(exc, runner)
        if node is None or exc.node is not None:
            return exc
        if f"node {node.name!r}" in str(exc):     # a body runner named it already
            exc.node = node.name
            return exc
        return type(exc)(f"{exc} (before node {node.name!r}, {node.op_type})", reason=exc.reason, node=node.name)

    def _node_at(self, exc: Exception, runner=None):
        runner = runner or self._runner
        codes = {c.filename: c for c in getattr(runner, "codes", [runner.code])}
        for frame in reversed(traceback.extract_tb(exc.__traceback__)):
            code = codes.get(frame.filename)
            if code is not None:
                node = code.line_to_node.get(frame.lineno)
                if node is not None:
                    return node
        return None

    def _kernel_error(self, exc: Exception, runner=None) -> KernelError:
        node = self._node_at(exc, runner)
        if node is not None:
            ins = ", ".join("_" if v is None else f"{v.name}: {v.type_str()}" for v in node.inputs)
            return KernelError(f"{self.model_name}: node {node.name!r} ({node.op_type}) failed "
                               f"with inputs ({ins}): {type(exc).__name__}: {exc}")
        return KernelError(f"{self.model_name}: run failed: {type(exc).__name__}: {exc}")


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()
