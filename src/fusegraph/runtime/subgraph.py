"""Runners for bodies of control-flow nodes (If branches, Loop and Scan bodies).

``bind.py`` hands ``subgraph_factory(device)`` to every kernel builder as
``NodeContext.run_subgraph_factory``; a control-flow builder calls it once per body and gets
a ``BodyRunner``: the body's kernels are bound once (through the op registry, with the same
factory, so nested bodies work), its constants moved to the device once, and each call runs
the kernels in order over a flat slot list: ``runner(inputs, captures) -> outputs``.

This is the first step of issue 18: a bound straight-line interpreter, not yet generated code
and with no memory plan of its own (every body value is a fresh allocation, so nothing a body
makes aliases the enclosing arena). A kernel failure names the body node and the owner node
(``KernelError``). Each call first reads the run's stop flag (``run_control.py``), so a
cancelled run or one past its deadline stops between two Loop / Scan iterations.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from ..errors import FusegraphError, KernelError
from ..ir import Graph, is_broadcast
from ..ops import opdef_for
from ..ops.registry import NodeContext
from ..ops.run_limits import NO_LIMITS, RunLimits
from .run_control import RunControl


class BodyRunner:
    def __init__(self, body: Graph, owner: str, device: torch.device, factory: Callable,
                 control: RunControl | None = None, limits: RunLimits = NO_LIMITS):
        self.body, self.owner = body, owner
        self._control = control
        slot: dict[int, int] = {}
        for v in body.values():
            slot[id(v)] = len(slot)
        self._template: list = [None] * len(slot)
        for v in body.constants.values():
            t = v.const.contiguous() if is_broadcast(v.const) else v.const
            self._template[slot[id(v)]] = t.to(device)
        self._captures = [slot[id(v)] for v in body.captures]
        self._inputs = [slot[id(v)] for v in body.inputs]
        self._outputs = [slot[id(v)] for v in body.outputs]
        self._steps = []
        for node in body.nodes:
            kernel = opdef_for(node).build(NodeContext(node, str(device), False, factory, limits))
            ins = tuple(-1 if v is None else slot[id(v)] for v in node.inputs)
            outs = tuple(slot[id(o)] for o in node.outputs)
            self._steps.append((kernel, ins, outs, node))

    def __call__(self, inputs: Sequence, captures: Sequence) -> list:
        if len(inputs) != len(self._inputs) or len(captures) != len(self._captures):
            raise KernelError(f"node {self.owner!r}: body {self.body.name!r} takes {len(self._inputs)} "
                              f"inputs and {len(self._captures)} outer values, got {len(inputs)} and "
                              f"{len(captures)}")
        control = self._control
        if control is not None and control.stop:     # a Loop / Scan iteration is a kernel boundary
            control.stopped(f"in body {self.body.name!r} of node {self.owner!r}")
        env = list(self._template)
        for k, x in zip(self._captures, captures):
            env[k] = x
        for k, x in zip(self._inputs, inputs):
            env[k] = x
        for kernel, ins, outs, node in self._steps:
            try:
                result = kernel(*[None if k < 0 else env[k] for k in ins])
            except FusegraphError:
                raise
            except Exception as exc:
                raise KernelError(f"node {self.owner!r}: body {self.body.name!r} node {node.name!r} "
                                  f"({node.op_type}) failed: {type(exc).__name__}: {exc}") from exc
            if len(outs) == 1:
                env[outs[0]] = result
            else:
                for k, x in zip(outs, result):
                    env[k] = x
        return [env[k] for k in self._outputs]


def subgraph_factory(device, control: RunControl | None = None, limits: RunLimits = NO_LIMITS) -> Callable:
    """The ``run_subgraph_factory`` for kernels bound on ``device``: its runners stop when
    ``control`` says so and build their kernels with ``limits``."""
    dev = torch.device(device)

    def factory(body: Graph, owner: str) -> BodyRunner:
        return BodyRunner(body, owner, dev, factory, control, limits)
    return factory
