"""Constant folding: a node whose inputs are all constants is evaluated at compile time with
the op's own kernel, and its outputs become constants (keeping their Value identity).

One sweep in node order folds whole constant chains, since each folded output is a constant
by the time its users are visited. Before running a kernel the pass bounds what it would
allocate: every output's shape must be known (shape inference runs kernels on meta tensors,
so a 10^15-element ConstantOfShape gets a shape without allocating) and no larger than
``fold_size_limit``. Ops that are impure or not foldable per the registry, nodes whose
outputs are flagged, unknown sizes and oversize outputs are declined, and each decline is
kept in ``FoldLog`` with its reason for the compile report. The result is checked again
after the run. An oversized output that the registry says is one value repeated (``splat``:
ConstantOfShape, Expand of a scalar) is folded as a stride-0 broadcast of that value when its
logical size is within ``fold_broadcast_limit``; the runtime materialises it once at bind time
and the artifact stores one element. An ``If`` whose condition is a constant is replaced by
its taken branch (``inline_if.py``). Nothing else here knows any particular op.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..ir import DType, Graph, Node
from ..ir.shape import is_static, numel
from ..ops import infer_node, opdef_for
from ..ops.registry import NodeContext
from .inline_if import inline_constant_if
from .manager import PassOptions, PassResult, is_locked


@dataclass
class FoldLog:
    """Latest decline reason per node name (cleared when the node folds or disappears)."""
    declined: dict[str, dict] = field(default_factory=dict)

    def entries(self, graph: Graph) -> list[dict]:
        alive = {n.name for n in graph.nodes}
        return [dict(d) for name, d in self.declined.items() if name in alive]


def _human(nbytes: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if nbytes < 1024 or unit == "EiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return str(nbytes)


class ConstantFold:
    name = "constant_fold"

    def __init__(self, options: PassOptions, log: FoldLog | None = None):
        self.options = options
        self.log = log if log is not None else FoldLog()

    def run(self, graph: Graph) -> PassResult:
        folded, declined = 0, 0
        for node in list(graph.nodes):
            if node.op_type == "If" and node.domain == "" and inline_constant_if(graph, node) is None:
                folded += 1      # its constant condition picked a branch, now inlined
                continue
            if not all(v is None or v.is_const for v in node.inputs):
                continue
            reason = self._try_fold(graph, node)
            if reason is None:
                folded += 1
                self.log.declined.pop(node.name, None)
            else:
                declined += 1
                self.log.declined[node.name] = {"node": node.name, "op": node.op_type, "reason": reason}
        in_bodies = self._fold_bodies(graph)
        stats = {"folded": folded} if folded else {}
        if in_bodies:
            stats["folded_in_bodies"] = in_bodies
        if declined:
            stats["declined"] = declined
        return PassResult(folded > 0 or in_bodies > 0, stats)

    def _fold_bodies(self, graph: Graph) -> int:
        """Fold inside the bodies of control-flow nodes (their declines are not logged: the
        log names nodes of the main graph)."""
        from ..ir.subgraphs import subgraphs
        n = 0
        for node in graph.nodes:
            for _, body in subgraphs(node):
                r = ConstantFold(self.options).run(body)
                n += r.stats.get("folded", 0) + r.stats.get("folded_in_bodies", 0)
        return n

    def _try_fold(self, graph: Graph, node: Node) -> str | None:
        """Fold ``node``; return None on success, else the reason it was not folded."""
        try:
            opdef = opdef_for(node)
        except Exception as exc:  # unsupported op: leave it for the runtime to report
            return f"no kernel: {exc}"
        if not opdef.pure:
            return "op is impure"
        if not opdef.foldable:
            return "op is marked not foldable"
        if any(is_locked(o) for o in node.outputs):
            return "an output is flagged external/no_fuse"
        limit = self.options.fold_size_limit
        expected = self._expected_outputs(node)
        if isinstance(expected, str):
            return expected
        for (dtype, shape), out in zip(expected, node.outputs):
            size = numel(shape) * max(dtype.itemsize, 1)
            if size > limit:
                if opdef.splat is not None and len(node.outputs) == 1:
                    return self._fold_splat(graph, node, opdef, dtype, shape, size)
                return (f"output %{out.name} would be {_human(size)} ({numel(shape)} elements), over "
                        f"the fold limit of {_human(limit)} (Config.fold_size_limit)")
        try:
            kernel = opdef.build(NodeContext(node))
            with torch.no_grad():
                result = kernel(*[None if v is None else v.const for v in node.inputs])
        except Exception as exc:
            return f"kernel failed at compile time: {type(exc).__name__}: {exc}"
        results = list(result) if isinstance(result, (tuple, list)) else [result]
        if len(results) != len(node.outputs) or not all(isinstance(t, torch.Tensor) for t in results):
            return "kernel did not return one tensor per output"
        tensors = []
        for t, (dtype, shape), out in zip(results, expected, node.outputs):
            if tuple(t.shape) != tuple(shape) or DType.from_torch(t.dtype) != dtype:
                return (f"kernel returned {DType.from_torch(t.dtype).name}{list(t.shape)} for %{out.name}, "
                        f"inference said {dtype.name}{list(shape)}")
            tensors.append(_own(t, node))
        graph.fold_to_constants(node, tensors)
        return None

    def _fold_splat(self, graph: Graph, node: Node, opdef, dtype: DType, shape: tuple, size: int) -> str | None:
        """Fold a one-value output over the size limit as that value broadcast with stride 0
        (one element of storage), when its logical size is within ``fold_broadcast_limit``."""
        out, cap = node.outputs[0], self.options.fold_broadcast_limit
        over = (f"output %{out.name} would be {_human(size)} ({numel(shape)} elements), over the fold "
                f"limit of {_human(self.options.fold_size_limit)} (Config.fold_size_limit)")
        if size > cap:
            return (f"{over} and over the broadcast limit of {_human(cap)} for one value repeated "
                    f"(Config.fold_broadcast_limit)")
        try:
            with torch.no_grad():
                value = opdef.splat(NodeContext(node), [None if v is None else v.const for v in node.inputs])
        except Exception as exc:
            return f"{over}; its fill value failed at compile time: {type(exc).__name__}: {exc}"
        if value is None:
            return f"{over}, and it is not one value repeated"
        if DType.from_torch(value.dtype) != dtype:
            return f"{over}; its fill value is {DType.from_torch(value.dtype).name}, inference said {dtype.name}"
        base = value.detach().reshape((1,) * len(shape)).clone()
        graph.fold_to_constants(node, [base.expand(shape)])
        return None

    @staticmethod
    def _expected_outputs(node: Node):
        """Static (dtype, shape) per output, or the reason they are not known before running."""
        try:
            inferred = infer_node(node) or [(None, None)] * len(node.outputs)
        except Exception as exc:
            return f"shape inference failed: {exc}"
        result = []
        for out, (dtype, shape) in zip(node.outputs, inferred):
            dtype = dtype if dtype not in (None, DType.UNDEFINED) else out.dtype
            shape = shape if is_static(shape) else out.shape
            if not is_static(shape):
                return f"size of %{out.name} is unknown before evaluation, so it cannot be bounded"
            if dtype in (None, DType.UNDEFINED, DType.STRING):
                return f"dtype of %{out.name} is unknown or not numeric"
            result.append((DType(dtype), tuple(shape)))
        return result


def _own(t: torch.Tensor, node: Node) -> torch.Tensor:
    """A contiguous tensor owning exactly its storage: no view into an input constant or into
    a sibling output (the artifact's safetensors refuses shared storage)."""
    t = t.detach()
    whole = t.is_contiguous() and t.storage_offset() == 0 and \
        t.untyped_storage().nbytes() == t.numel() * t.element_size()
    ptr = t.untyped_storage().data_ptr()
    shared = any(v is not None and v.const.numel() and v.const.untyped_storage().data_ptr() == ptr
                 for v in node.inputs)
    return t.contiguous().clone() if not whole or shared else t
