"""What a backend is: the runtime's one place for device-specific kernel choices.

A backend answers these questions, and nothing else in the runtime asks them:

- ``kernel(ctx, opdef) -> kernel | Decline``: the kernel one node runs. A backend returns
  either a kernel of its own (a oneDNN primitive writing into the arena), or the op's own
  portable ATen kernel (``opdef.build(ctx)``) for
  ops it has nothing better for, or ``Decline(reason)`` when it has a kernel family for the
  op but not for this node (bind then takes the portable kernel and records the reason in
  ``report.kernels``, the way fusion records its declines);
- a kernel may offer ``direct(tensors, out) -> Direct | None``: the call with tensors that are
  the same on every run (arena views), made without the kernel's Python path; the generated
  code then executes it itself (``runtime/direct.py``);
- ``export_state(graph)`` / ``import_state(state, where)``: what the backend made at bind time that
  an artifact should carry so a load on the same machine makes nothing again (CPU: the
  packed weights), and ``portable_weight(value)``: the plain form of a weight the backend
  holds only in its own layout (``release_weights`` dropped the graph's copy).

Knows no op and no device.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping


@dataclass(frozen=True)
class Direct:
    """A kernel call the generated code makes itself: ``call.execute(call.handle, stream,
    call.n, call.args)`` returns a status, ``call.fail(status)`` raises for a nonzero one, and
    ``call.on_thread()`` points the call at the calling thread's resources and returns its
    stream. With ``limit``, only while ``state.m < limit`` (a guarded node's fast kernel; the
    kernel itself otherwise); ``measure(state, out, True)`` after the call (``cpu/guard.py``)."""
    call: object
    limit: float | None = None
    state: object = None
    measure: Callable | None = None


@dataclass(frozen=True)
class Decline:
    """The backend has a kernel family for this op, but not for this node: why."""
    reason: str
    family: str = ""


class Backend:
    """The portable backend: every op's own kernel, no state. Device backends
    subclass it."""

    name = "portable"
    freed_memory_kept = False     # the host keeps memory a run frees (CPU malloc policy)

    def kernel(self, ctx, opdef) -> Callable | Decline:
        return opdef.build(ctx)

    def bind_start(self, graph) -> None:
        """Before the nodes' kernels are asked for: a look at the whole graph."""

    def before_run(self, tensors, magnitudes: Mapping[int, float] | None = None) -> None:
        """Before each run, with its input tensors; ``magnitudes``: input index -> the largest
        ``|x|`` of that input as the caller already knows it (NaN where it holds a NaN), for
        inputs it keeps itself (a KV session's cache)."""

    def tried(self, node) -> list[Decline]:
        """Kernel families the backend tried for ``node`` and declined before the kernel it gave
        (recorded in ``report.kernels`` like a decline)."""
        return []

    def portable(self, ctx, opdef) -> Callable:
        """The op's own kernel, for a node this backend declined."""
        return opdef.build(ctx)

    def thread_bound(self) -> set[str]:
        """The nodes whose kernels were made for the thread count of their binding (they run
        that many threads whatever the count at the call): a binding for another count makes
        these again (``bind.kernels_again``)."""
        return set()

    def weight_forms(self) -> dict[str, int]:
        """Per weight name, how many forms of it the backend holds (``drop_weight_forms``
        goes back to such a count)."""
        return {}

    def drop_weight_forms(self, counts: dict[str, int]) -> None:
        """Forget the forms made since ``weight_forms()`` returned ``counts``."""

    def prepare(self) -> None:
        """Process-level set-up before binding (CPU: the host-memory policy)."""

    def settle(self) -> None:
        """After binding's one-off work (probe runs, packing): release what it freed."""

    def after_run(self) -> None:
        """After a run whose allocations change size with its input shapes (a model with
        symbolic dims): keep the memory those leave free from growing without bound."""

    def export_state(self, graph) -> dict:
        return {}

    def import_state(self, state: dict, where: str = "artifact") -> None:
        """Take what ``export_state`` wrote (a loaded artifact's, named ``where`` in errors):
        the kernels bound afterwards use it. Called before binding."""

    def release_weights(self, graph, calls) -> int:
        """Drop the graph's plain copy of weights the backend holds in its own form and no call
        reads at run time; returns the bytes released."""
        return 0

    def portable_weight(self, value):
        """The plain tensor of a constant ``value`` (the backend may hold it only packed)."""
        return value.const
