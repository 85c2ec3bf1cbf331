"""``CpuBackend``: the CPU's kernel choices, the weights it holds, and its artifact state.

- ``kernel``: with oneDNN loadable here (``dnnl/``; ``Config.cpu_kernels`` "auto" or
  "onednn"), convolutions, weight products, pools, LRN, layer and RMS norms, bfloat16 joins and
  static-shape attention run as oneDNN primitives that write into their planned arena slots and hold their
  weights packed; a node that family cannot take declines with a reason (``tried``, recorded
  in ``report.kernels``) and, like every other op, runs its own portable ATen kernel; other
  attention and embedding lookups run torch kernels that write into planned memory
  (``attention.py``, with the per-thread ``workspace.py``). "portable" runs every node on its
  portable kernel.
- weights held once: after binding, ``release_weights`` replaces the graph's plain tensor of
  every weight only oneDNN kernels read with a shape-only placeholder (a "meta" tensor that
  remembers the store holding the weight: ``dnnl/weights.py``); ``portable_weight`` reads a
  packed weight back as a plain tensor (``dnnl/blocked.py``, torch alone) for a kernel that
  needs it.
- ``export_state`` / ``import_state``: the packed forms with their layout descriptions and
  orientation, so a load on a machine whose primitives want the same layouts reorders nothing;
  another machine's load unpacks and reorders (``reorders`` counts it: ``model.load_info``);
  ``stored_plain`` reads a stored form back for a model no CPU backend will run.
- host memory policy: ``prepare`` lets malloc keep freed memory (``host_memory.py``) unless
  the config says no; kernels learn it through ``NodeContext.freed_memory_kept``.
"""
from __future__ import annotations

import json
import math
from typing import Mapping

import torch

from ....config import CPU_KERNELS
from ....errors import ArtifactError, ConfigError
from ....ops.registry import kernel_writes_out
from ....ops.value_range import Fact, tensor_fact, union
from .guard_plan import GuardPlan, guard_plan
from ..protocol import Backend, Decline
from . import host_memory
from .attention import attention_kernel, embedding_kernel
from .layer_norm import layer_norm_kernel
from .quantize import dequantize_kernel, qadd_kernel, quantize_kernel, requantize_kernel
from .rms_norm import rms_norm_kernel
from .rotary_gating import gated_kernel, rotary_kernel
from .guard import Guarded, Measuring, RunState
from .workspace import Workspace
from .dnnl import DnnlKernels, available as dnnl_available, unavailable_reason
from .dnnl.blocked import check as check_blocked
from .dnnl.memory import TORCH_OF
from .dnnl.weights import SharedForms, WeightStore
from ...kv_cache import kv_pairs

# a guarded node admitted only below this input magnitude has the values it reads measured
# where they are made (``guard_plan.py``): images in 0..255 or normalised ones sit well below it
MEASURE_BELOW = 1e4
_PLANNED = {   # (domain, op) -> the torch kernel that writes into planned memory (attention.py, layer_norm.py,
              # rms_norm.py, rotary_gating.py, quantize.py)
    ("fusegraph", "ScaledDotProductAttention"): attention_kernel,
    ("", "Gather"): lambda ctx, opdef, ws: embedding_kernel(ctx),
    ("fusegraph", "LayerNorm"): lambda ctx, opdef, ws: layer_norm_kernel(ctx, ws),
    ("fusegraph", "SkipLayerNorm"): lambda ctx, opdef, ws: layer_norm_kernel(ctx, ws),
    ("fusegraph", "RMSNorm"): lambda ctx, opdef, ws: rms_norm_kernel(ctx, ws),
    ("fusegraph", "SkipRMSNorm"): lambda ctx, opdef, ws: rms_norm_kernel(ctx, ws),
    ("fusegraph", "RotaryEmbedding"): lambda ctx, opdef, ws: rotary_kernel(ctx, ws),
    ("fusegraph", "GatedActivation"): lambda ctx, opdef, ws: gated_kernel(ctx, ws),
    ("", "QuantizeLinear"): lambda ctx, opdef, ws: quantize_kernel(ctx, ws),
    ("", "DequantizeLinear"): lambda ctx, opdef, ws: dequantize_kernel(ctx),
    ("fusegraph", "QAdd"): lambda ctx, opdef, ws: qadd_kernel(ctx, ws),
    ("fusegraph", "Requantize"): lambda ctx, opdef, ws: requantize_kernel(ctx, ws),
}
FORM_KEY = "dnnl"      # the packed-form key of this backend's weights in an artifact


def is_placeholder(t) -> bool:
    """A constant whose plain tensor the backend released (its shape and dtype only)."""
    return isinstance(t, torch.Tensor) and t.device.type == "meta"


class CpuBackend(Backend):
    name = "cpu"

    def __init__(self, keep_freed_memory: bool = False, exact: bool = True, kernels: str = "auto",
                 shared_forms: SharedForms | None = None):
        if kernels not in CPU_KERNELS:
            raise ConfigError(f"cpu_kernels {kernels!r}: expected one of {', '.join(CPU_KERNELS)}")
        if kernels == "onednn" and not dnnl_available():
            raise ConfigError(f"cpu_kernels='onednn' was asked for, but {unavailable_reason()}; "
                              f"use cpu_kernels='auto' or 'portable'")
        self.keep_freed_memory = keep_freed_memory
        self.growth_release = host_memory.GrowthRelease()     # after runs of shapes that vary
        self.exact = exact       # False (Config.fast_math): oneDNN's own NaN / Inf behaviour
        self.kernels = kernels
        self.store = WeightStore(shared_forms)   # packed weights (made here, provided by an artifact, shared)
        self.workspace = Workspace()      # scratch the torch kernels share (attention scores)
        self.dnnl = DnnlKernels(self.store) if kernels != "portable" and dnnl_available() else None
        self._tried: dict[str, list[Decline]] = {}
        self._thread_bound: set[str] = set()      # nodes given a oneDNN kernel (made for a thread count)
        self.where = "artifact"
        self.guards = GuardPlan({}, {})     # which nodes run fast below which input magnitude, what they measure
        self.run_state = RunState()

    # -- host memory
    def prepare(self) -> None:
        if self.keep_freed_memory:
            host_memory.keep_freed_memory()

    def settle(self) -> None:
        host_memory.release_free_memory()

    def after_run(self) -> None:
        if not self.keep_freed_memory:
            self.growth_release.after_run()

    @property
    def freed_memory_kept(self) -> bool:
        return host_memory.freed_memory_kept()

    # -- kernels
    def bind_start(self, graph) -> None:
        """Before binding: the exact kernels that can run fast, and under which input
        magnitude (``guard_plan.py``, from the weights' own magnitudes: the plain tensors, or
        a loaded model's packed bytes); whether its steps run one row (a decoder feeding its
        KV cache back: ``dnnl/linear_runtime.py`` holds its weights for that)."""
        if self.dnnl is not None:
            self.dnnl.one_row_steps = bool(kv_pairs(graph, [v.name for v in graph.outputs])[0])
        self.guards = guard_plan(graph, self._const_fact, MEASURE_BELOW) if self.exact and self.dnnl is not None \
            else GuardPlan({}, {})

    def before_run(self, tensors, magnitudes: Mapping[int, float] | None = None) -> None:
        if self.run_state.needed:
            self.run_state.measure(tensors, magnitudes)

    def _const_fact(self, value) -> Fact:
        """A constant's fact (``finite.ConstantFacts``): its packed forms' when the backend
        released its plain tensor (a NaN or an infinity in any of them counts)."""
        t = value.const
        if not is_placeholder(t):
            return tensor_fact(t)
        forms = self.store.forms.get(value.name, []) + self.store.provided.get(value.name, [])
        if not forms:
            return Fact(math.inf, True, True)
        return union(*(tensor_fact(p.data.view(TORCH_OF[p.desc["dt"]])) for p in forms))

    def kernel(self, ctx, opdef):
        """The node's kernel (``_choose``); a producer of values the guard plan measures
        measures them after each call (the nodes reading them were admitted on it)."""
        measures = self.guards.measured.get(ctx.node.name, ())
        got = self._choose(ctx, opdef, measures)
        if not measures or isinstance(got, Guarded):
            return got
        if isinstance(got, Decline):
            got = self.portable(ctx, opdef)
        return Measuring(got, measures, self.run_state, kernel_writes_out(opdef, got))

    def _choose(self, ctx, opdef, measures: tuple[int, ...]):
        key = (ctx.node.domain, ctx.node.op_type)
        limit = self.guards.limits.get(ctx.node.name)
        if limit is not None and self.dnnl is not None:
            fast = self.dnnl.kernel(ctx, opdef, key, False)
            if fast is not None and not isinstance(fast, Decline):
                self._thread_bound.add(ctx.node.name)
                self._note_slow(ctx, fast)
                return Guarded(fast, lambda: self._exact(ctx, opdef, key), limit, self.run_state,
                               len(ctx.node.inputs), measures)
        if self.dnnl is not None:
            got = self.dnnl.kernel(ctx, opdef, key, self.exact)
            if got is not None and not isinstance(got, Decline):
                self._thread_bound.add(ctx.node.name)
                self._note_slow(ctx, got)
                return got
            if got is not None:
                self._tried[ctx.node.name] = [got]
        if self.kernels != "portable" and key in _PLANNED:     # torch kernels into planned memory
            got = _PLANNED[key](ctx, opdef, self.workspace)
            if got is not None and not isinstance(got, Decline):
                return got
            if got is not None:
                self._tried.setdefault(ctx.node.name, []).append(got)
        for v in ctx.node.inputs:          # the portable kernel reads the plain weight
            if v is not None and v.is_const and is_placeholder(v.const):
                v.const = self.portable_weight(v)
        return opdef.build(ctx)

    def _note_slow(self, ctx, kernel) -> None:
        """A oneDNN kernel on a fallback implementation: its reason goes with the declines."""
        if getattr(kernel, "slow", None):
            self._tried[ctx.node.name] = [Decline(kernel.slow, "dnnl")]

    def _exact(self, ctx, opdef, key):
        """A guarded node's exact kernel: oneDNN's exact form, else the op's own."""
        got = self.dnnl.kernel(ctx, opdef, key, True)
        return got if got is not None and not isinstance(got, Decline) else opdef.build(ctx)

    def tried(self, node) -> list[Decline]:
        return self._tried.get(node.name, [])

    def thread_bound(self) -> set[str]:
        return set(self._thread_bound)

    def weight_forms(self) -> dict[str, int]:
        return {name: len(forms) for name, forms in self.store.forms.items()}

    def drop_weight_forms(self, counts: dict[str, int]) -> None:
        self.store.drop_forms(counts)

    # -- weights
    def release_weights(self, graph, calls) -> int:
        """Replace the plain tensor of each constant that only this backend's kernels read (they
        hold it packed) with a placeholder; returns the bytes released."""
        if self.dnnl is None:
            return 0
        live = {id(v) for c in calls for v in c.inputs if v is not None}
        live |= {id(v) for v in graph.outputs}
        freed = 0
        for v in graph.constants.values():
            t = v.const
            if id(v) in live or is_placeholder(t) or not self.store.holds(v.name):
                continue
            v.const = self.store.release(v.name, t)
            freed += t.numel() * t.element_size()
        return freed

    def portable_weight(self, value):
        t = value.const
        if not is_placeholder(t):
            return t
        try:
            return as_placeholder(t, self.store.plain(value.name, t))
        except ValueError as exc:
            raise ArtifactError(f"{self.where}: {exc}") from None

    # -- artifact state
    def export_state(self, graph) -> dict:
        """``{"packed": {weight name: [(key, bytes, description, 0)]}}``: each weight's packed
        forms (uint8 bytes and the JSON of their layout, ``dnnl/memory.MemDesc.describe``); the
        key is ``["dnnl", *perm]``, the weight's orientation in the form (``dnnl/weights.py``)."""
        out = {}
        stored = {name: v.const.dtype for name, v in graph.constants.items() if v.const is not None}
        for name, forms in self.store.export(stored).items():
            out[name] = [([FORM_KEY, *perm], data, _json_bytes(desc), 0) for desc, data, perm in forms]
        return {"packed": out} if out else {}

    def import_state(self, state: dict, where: str = "artifact") -> None:
        """Take the packed forms of a stored model: each is checked against its bytes and handed
        to the weight store, which uses it as it is when a primitive wants that layout."""
        self.where = where
        for name, forms in (state or {}).get("packed", {}).items():
            for key, data, desc_bytes, _threads in forms:
                desc, perm = parse_form(key, data, desc_bytes, name, where)
                self.store.provide(name, desc, data, perm)

    @property
    def reorders(self) -> int:
        return self.store.reorders


def _json_bytes(desc: dict) -> torch.Tensor:
    return torch.frombuffer(bytearray(json.dumps(desc, separators=(",", ":")).encode()), dtype=torch.uint8)


def parse_form(key, data: torch.Tensor, desc_bytes: torch.Tensor, name: str, where: str) -> tuple[dict, tuple]:
    """The layout description and orientation of one stored packed form, checked against its
    bytes (``ArtifactError`` naming the weight otherwise: the file is untrusted)."""
    key = list(key)
    perm = key[1:]
    if not key or key[0] != FORM_KEY or not all(isinstance(i, int) and not isinstance(i, bool) for i in perm) \
            or sorted(perm) != list(range(len(perm))) or not 1 <= len(perm) <= 12:
        raise ArtifactError(f"{where}: packed form of {name[:80]!r} has a malformed key {str(key)[:40]!r}")
    try:
        desc = json.loads(bytes(desc_bytes.numpy()).decode())
    except (ValueError, UnicodeDecodeError):
        desc = None
    why = check_blocked(desc, data.numel()) if desc is not None else "unreadable description"
    if why is not None:
        raise ArtifactError(f"{where}: packed form of {name[:80]!r}: {why}")
    return desc, tuple(perm)


def stored_plain(value, forms: list, where: str) -> torch.Tensor:
    """The plain tensor of packed-only weight ``value`` (its graph placeholder) from its stored
    forms ``(key, bytes, description, threads)``, for a model no CPU backend runs (no oneDNN
    needed)."""
    store = WeightStore()
    for key, data, desc_bytes, _threads in forms:
        desc, perm = parse_form(key, data, desc_bytes, value.name, where)
        store.provide(value.name, desc, data, perm)
    try:
        return as_placeholder(value.const, store.plain(value.name, value.const))
    except ValueError as exc:
        raise ArtifactError(f"{where}: {exc}") from None


def as_placeholder(t: torch.Tensor, plain: torch.Tensor) -> torch.Tensor:
    """``plain`` in placeholder ``t``'s dtype and strides (contiguous unless they are a dense
    permutation: an artifact's strides are untrusted)."""
    plain = plain.to(t.dtype)
    order = sorted(range(t.dim()), key=lambda d: -t.stride(d))
    acc, dense = 1, True
    for d in reversed(order):
        dense = dense and (t.shape[d] == 1 or t.stride(d) == acc)
        acc *= t.shape[d]
    if not dense or plain.stride() == t.stride() or plain.numel() == 0:
        return plain
    return torch.empty_strided(tuple(t.shape), t.stride(), dtype=t.dtype).copy_(plain)
