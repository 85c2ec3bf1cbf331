"""``CpuBackend``: the CPU's kernel choices, lowering and artifact state (``protocol.py``).

- ``kernel``: FusedConv (``conv.py``), LinearAct (``linear.py``), MaxPool / AveragePool
  (``pool.py``) take oneDNN kernels where they fit (float16 convolutions and products: float32
  inside, float16 storage), or decline with a reason; every other op takes its own portable
  kernel. Every kernel then runs under the threading policy
  (``threading_policy.with_policy``: small calls on one intra-op thread).
- ``lower``: runs of consecutive nodes of one generated function (or of one piece of a
  stream's function between its events) become script segments (``segments.py``), on CPU
  with static input shapes, when the config asks for them: several streams run the same
  fused kernels as one.
- ``export_state`` / ``import_state``: the convolutions' prepacked (blocked) weights
  (``prepack.py``), handed to the kernel builders as an argument, and the segment layout
  (``segments_stored.py``), so a load on the same build and CPU reorders no weight, runs no
  probe and compiles nothing: segments and partitions compile at their first call
  (``compiles_lazily``; ``onednn_graph.compiles`` counts).
- host memory policy: ``prepare`` lets malloc keep freed memory (``host_memory.py``) unless
  the config says no; kernels learn it through ``NodeContext.freed_memory_kept``.
"""
from __future__ import annotations

from ....errors import ArtifactError
from ..protocol import Backend, Decline, Deferred, Lowered
from . import host_memory, prepack
from . import script_ops  # noqa: F401  (registers the ops' TorchScript emitters)
from .conv import fused_conv_kernel, twin_of
from .linear import linear_act_kernel
from .pool import pool_kernel_for
from .segments import available as segments_available, form_segments
from .segments_stored import from_layout, layout
from .threading_policy import with_policy

_FAMILIES = {
    ("", "MaxPool"): pool_kernel_for,
    ("", "AveragePool"): pool_kernel_for,
}


class CpuBackend(Backend):
    name = "cpu"

    def __init__(self, keep_freed_memory: bool = True, segments: bool = True, exact: bool = True):
        self.keep_freed_memory = keep_freed_memory
        self.segments = segments
        self.exact = exact       # False (Config.fast_math): oneDNN's own NaN / Inf behaviour
        self.provided: dict[str, list] = {}   # weight name -> [(key, make(), threads)]
        self.stored_segments: list | None = None   # a loaded artifact's segment layout
        self.compiles_lazily = False
        self._layout: list[list[str]] = []     # the segments made, for export_state

    # -- host memory
    def prepare(self) -> None:
        if self.keep_freed_memory:
            host_memory.keep_freed_memory()

    def settle(self) -> None:
        host_memory.release_free_memory()

    @property
    def freed_memory_kept(self) -> bool:
        return host_memory.freed_memory_kept()

    # -- kernels
    def kernel(self, ctx, opdef):
        key = (ctx.node.domain, ctx.node.op_type)
        if key == ("fusegraph", "FusedConv"):
            got = fused_conv_kernel(ctx, opdef, self.provided, self.exact)
        elif key == ("fusegraph", "LinearAct"):
            got = linear_act_kernel(ctx, opdef, self.exact)
        elif key in _FAMILIES:
            got = _FAMILIES[key](ctx, opdef)
        else:
            return with_policy(opdef.build(ctx))
        if isinstance(got, (Decline, Deferred)):
            return got
        return with_policy(got)

    def portable(self, ctx, opdef):
        return with_policy(opdef.build(ctx))

    # -- lowering
    def lowers(self, graph, streams: int) -> bool:
        return self.segments and segments_available(graph, "cpu")

    def lower(self, graph, calls, binding, probe, readers=None) -> Lowered:
        if self.stored_segments is not None:
            segs = from_layout(graph, calls, binding, self.stored_segments, readers, self.exact)
        else:
            segs = form_segments(graph, calls, binding, probe, readers, self.exact)
        lowered = Lowered(segs.calls, segs.made, segs.dropped, segs.not_writable)
        self._layout += layout(lowered)
        return lowered

    # -- artifact state
    def export_state(self, graph) -> dict:
        """``{"packed": {weight name: [(key, bytes, descriptor, threads)]}}``: the oneDNN blocked
        forms this model's convolutions made for their weights."""
        out: dict[str, list] = {}
        for node in graph.nodes if prepack.AVAILABLE else ():
            v = node.inputs[1] if node.op_type == "FusedConv" and len(node.inputs) > 1 else None
            if v is None or not v.is_const or v.name in out:
                continue
            forms, seen = [], []
            twin = twin_of(v.const)       # a float16 weight's float32 copy (conv.fp32_twin), packed instead
            for key, p, threads in prepack.packed_for(v.const if twin is None else twin):
                if (key, threads) not in seen:       # the same weight bound twice: one copy
                    seen.append((key, threads))
                    forms.append((key, *prepack.to_bytes(p), threads))
            if forms:
                out[v.name] = forms
        state: dict = {"packed": out} if out else {}
        if self._layout:
            state["segments"] = list(self._layout)
        return state

    def import_state(self, state: dict, where: str = "artifact") -> None:
        """Take a stored state: each packed form is rebuilt (over the loaded bytes) when a
        kernel asks for it; a descriptor that does not describe its bytes is an ``ArtifactError``."""
        state = state or {}
        if "segments" in state:
            self.stored_segments = state["segments"]
        self.compiles_lazily = True
        if not prepack.AVAILABLE:
            return

        def maker(name, key, data, md):
            def make():
                t = prepack.rebuild(data, md, key[0])
                if t is None:
                    raise ArtifactError(f"{where}: the prepacked form of {name[:80]!r} does not match its descriptor")
                return t
            return make
        self.provided = {name: [(key, maker(name, key, data, md), threads) for key, data, md, threads in lst]
                         for name, lst in state.get("packed", {}).items()}

