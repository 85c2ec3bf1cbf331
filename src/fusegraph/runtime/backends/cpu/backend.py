"""``CpuBackend``: the CPU's kernel choices, the weights it holds, and its artifact state.

- ``kernel``: with oneDNN loadable here (``dnnl/``; ``Config.cpu_kernels`` "auto" or
  "onednn"), convolutions, weight products, pools and LRN run as oneDNN primitives that write
  into their planned arena slots and hold their weights packed; a node that family cannot
  take declines with a reason (``tried``, recorded in ``report.kernels``) and, like every
  other op, runs its own portable ATen kernel. "portable" runs every node on its portable
  kernel.
- weights held once: after binding, ``release_weights`` drops the plain tensor of every
  constant that only oneDNN kernels read (they hold it packed and never read the graph's copy)
  and leaves a shape-only placeholder (``torch`` "meta" tensor) in the graph;
  ``portable_weight`` reads a packed weight back as a plain tensor (``dnnl/blocked.py``),
  for ``save()`` on a machine without the library, and for any code that needs the plain form.
- ``export_state`` / ``import_state``: the packed forms with their layout descriptions, so a
  load on a machine whose primitives want the same layouts reorders nothing; another
  machine's load unpacks and reorders (``reorders`` counts it: ``model.load_info``).
- host memory policy: ``prepare`` lets malloc keep freed memory (``host_memory.py``) unless
  the config says no; kernels learn it through ``NodeContext.freed_memory_kept``.
"""
from __future__ import annotations

import json

import torch

from ....errors import ArtifactError, ConfigError
from ..protocol import Backend, Decline
from . import host_memory
from .dnnl import DnnlKernels, available as dnnl_available, unavailable_reason
from .dnnl.blocked import check as check_blocked, unpack
from .dnnl.weights import WeightStore

KERNEL_CHOICES = ("auto", "onednn", "portable")
FORM_KEY = "dnnl"      # the packed-form key of this backend's weights in an artifact


def is_placeholder(t) -> bool:
    """A constant whose plain tensor the backend released (its shape and dtype only)."""
    return isinstance(t, torch.Tensor) and t.device.type == "meta"


class CpuBackend(Backend):
    name = "cpu"

    def __init__(self, keep_freed_memory: bool = True, exact: bool = True, kernels: str = "auto"):
        if kernels not in KERNEL_CHOICES:
            raise ConfigError(f"cpu_kernels {kernels!r}: expected one of {', '.join(KERNEL_CHOICES)}")
        if kernels == "onednn" and not dnnl_available():
            raise ConfigError(f"cpu_kernels='onednn' was asked for, but {unavailable_reason()}; "
                              f"use cpu_kernels='auto' or 'portable'")
        self.keep_freed_memory = keep_freed_memory
        self.exact = exact       # False (Config.fast_math): oneDNN's own NaN / Inf behaviour
        self.store = WeightStore()        # packed weights (made here, or provided by an artifact)
        self.dnnl = DnnlKernels(self.store) if kernels != "portable" and dnnl_available() else None
        self._tried: dict[str, list[Decline]] = {}
        self.released: dict[str, torch.Tensor] = {}   # name -> placeholder left in the graph

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
        if self.dnnl is not None:
            got = self.dnnl.kernel(ctx, opdef, (ctx.node.domain, ctx.node.op_type), self.exact)
            if got is not None and not isinstance(got, Decline):
                return got
            if got is not None:
                self._tried[ctx.node.name] = [got]
        for v in ctx.node.inputs:          # the portable kernel reads the plain weight
            if v is not None and v.is_const and is_placeholder(v.const):
                v.const = self.portable_weight(v)
        return opdef.build(ctx)

    def tried(self, node) -> list[Decline]:
        return self._tried.get(node.name, [])

    # -- weights
    def release_weights(self, graph, calls) -> int:
        """Drop the plain tensor of each constant that only this backend's kernels read (they hold
        it packed); returns the bytes released."""
        if self.dnnl is None:
            return 0
        live = {id(v) for c in calls for v in c.inputs if v is not None}
        live |= {id(v) for v in graph.outputs}
        freed = 0
        for v in graph.constants.values():
            t = v.const
            if id(v) in live or is_placeholder(t) or not self.store.holds(v.name):
                continue
            v.const = torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device="meta")
            self.released[v.name] = v.const
            freed += t.numel() * t.element_size()
        return freed

    def portable_weight(self, value):
        t = value.const
        if not is_placeholder(t):
            return t
        if self.store.holds(value.name):
            return self.store.plain(value.name, tuple(t.shape), t.dtype)
        raise ArtifactError(f"weight {value.name[:80]!r} is held only in a packed form this backend lacks")

    # -- artifact state
    def export_state(self, graph) -> dict:
        """``{"packed": {weight name: [(key, bytes, description, 0)]}}``: each weight's packed
        forms (uint8 bytes and the JSON of their layout, ``dnnl/memory.MemDesc.describe``)."""
        out = {}
        for name, forms in self.store.export().items():
            out[name] = [([FORM_KEY], data, _json_bytes(desc), 0) for desc, data in forms]
        return {"packed": out} if out else {}

    def import_state(self, state: dict, where: str = "artifact") -> None:
        """Take the packed forms of a stored model: each is checked against its bytes and handed
        to the weight store, which uses it as it is when a primitive wants that layout."""
        for name, forms in (state or {}).get("packed", {}).items():
            for key, data, desc_bytes, _threads in forms:
                self.store.provide(name, parse_form(key, data, desc_bytes, name, where), data)

    @property
    def reorders(self) -> int:
        return self.store.reorders


def _json_bytes(desc: dict) -> torch.Tensor:
    return torch.frombuffer(bytearray(json.dumps(desc, separators=(",", ":")).encode()), dtype=torch.uint8)


def parse_form(key, data: torch.Tensor, desc_bytes: torch.Tensor, name: str, where: str) -> dict:
    """The layout description of one stored packed form, checked against its bytes
    (``ArtifactError`` naming the weight otherwise: the file is untrusted)."""
    if list(key) != [FORM_KEY]:
        raise ArtifactError(f"{where}: packed form of {name[:80]!r} has unknown key {str(key)[:40]!r}")
    try:
        desc = json.loads(bytes(desc_bytes.numpy()).decode())
    except (ValueError, UnicodeDecodeError):
        desc = None
    why = check_blocked(desc, data.numel()) if desc is not None else "unreadable description"
    if why is not None:
        raise ArtifactError(f"{where}: packed form of {name[:80]!r}: {why}")
    return desc


def unpack_form(key, data, desc_bytes, name: str, where: str) -> torch.Tensor:
    """The plain tensor of a stored packed form (no oneDNN needed)."""
    return unpack(parse_form(key, data, desc_bytes, name, where), data)
