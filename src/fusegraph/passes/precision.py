"""Pass "precision": give each node a compute dtype under the mixed-precision policy
(``precision_policy.py``), converting constant weights once and inserting casts only where a
value crosses from one precision to the other.

One forward sweep in graph order. A node's target is:
- ``Config.op_precision``'s entry for the node (by name, or the name of a node fused into
  it) or, failing that, for its op type (its own, or one fused into it);
- else, for the model's last heavy ops (the logits), float32 values: under bf16 a product
  that writes float32 itself reads bf16 operands and gets ``out_dtype`` float32
  (``precision_policy.LOGITS_OUT_WHY``), any other stays float32 (``LOGITS_WHY``);
- else its policy class: ``REDUCE`` takes the policy's type, ``FOLLOW`` takes its inputs'
  reduced type when every non-constant float input has it, ``KEEP`` float32.
Only the model's own float32 values change type: a float32 constant input of a reduced node is
replaced by a converted copy (made once, shared; a product's bias and an elementwise chain's
constants stay float32: ``FLOAT32_BIAS``, ``FLOAT32_CONSTANTS``), a float32 activation by one ``Cast`` (shared
by every reduced reader), and a reduced value read by a float32 node by one ``Cast`` back.
Graph outputs keep their declared type and name (a final ``Cast`` where needed). Nodes with
bodies (If / Loop / Scan) stay float32, bodies unchanged. Output dtypes come from each op's own
inference, so an op that cannot take the reduced type fails here, naming it.

``log`` receives ``{"node", "op", "dtype", "class", "why", "code"}`` per float node (``code``: the
decision's ``precision_policy.Reason``, which what follows reads; ``why``: its text for people);
``precision_summary`` turns it into ``report.precision``.
"""
from __future__ import annotations

import torch

from ..errors import PassError
from ..ir import DType, Graph, Node, Value
from ..ir.subgraphs import subgraphs
from .manager import PassResult, is_locked
from .precision_policy import (ANY, FLOAT32_BIAS, FLOAT32_CONSTANTS, FOLLOW, FP32_OUTPUT_PRODUCTS, KEEP,
                               LOGITS_OUT_WHY, LOGITS_WHY, NORMALISATIONS, REDUCE, Classified, Reason, classify,
                               has_residual)

REDUCED = {"bf16": DType.BFLOAT16, "fp16": DType.FLOAT16}
_NAMES = {DType.FLOAT: "fp32", DType.BFLOAT16: "bf16", DType.FLOAT16: "fp16"}


def fused_sources(node: Node) -> tuple[list[str], list[str]]:
    """(names, op types) of the original nodes fused into ``node`` (``meta["fused_from"]``)."""
    return list(node.meta.get("fused_from", ())), list(node.meta.get("fused_types", ()))


class PrecisionPass:
    name = "precision"

    def __init__(self, precision: str, overrides: tuple[tuple[str, str], ...] = (), log: list | None = None):
        if precision != "fp32" and precision not in REDUCED:
            raise PassError(f"pass 'precision': unknown precision {precision!r}")
        self.default = REDUCED.get(precision)          # None: float32 unless overridden
        self.overrides = dict(overrides)
        self.log = log if log is not None else []

    # -- decisions
    def _override(self, node: Node) -> str | None:
        names, types = fused_sources(node)
        for key in [node.name, *names]:
            if key in self.overrides:
                return self.overrides[key]
        for key in [node.op_type, *types]:
            if key in self.overrides:
                return self.overrides[key]
        return None

    def _logits(self, graph: Graph, cls: dict[int, Classified]) -> set[int]:
        """Heavy nodes a graph output reaches backwards without crossing a normalisation."""
        found, seen, todo = set(), set(), list(graph.outputs)
        while todo:
            v = todo.pop()
            p = v.producer
            if p is None or id(p) in seen:
                continue
            seen.add(id(p))
            if cls[id(p)].cls == REDUCE:
                found.add(id(p))
            elif p.op_type not in NORMALISATIONS and cls[id(p)].cls != ANY:   # a shape reader carries no values
                todo.extend(x for x in p.inputs if x is not None and not x.is_const)
        return found

    def _targets(self, graph: Graph) -> dict[int, tuple[str, DType | None, str, Reason]]:
        """id(node) -> (class, forced dtype or None, why, code)."""
        cls = {id(n): classify(n.domain, n.op_type, n.attrs.get("steps", ())) for n in graph.nodes}
        logits = self._logits(graph, cls)
        out = {}
        for n in graph.nodes:
            c, why, code = cls[id(n)]
            forced = self._override(n)
            if any(True for _ in subgraphs(n)):
                c, why, code = KEEP, "owns a body (If / Loop / Scan): float32, body unchanged", Reason.OWNS_BODY
                forced = None
            if forced is not None:
                dt = DType.FLOAT if forced == "fp32" else REDUCED[forced]
                out[id(n)] = (REDUCE if dt != DType.FLOAT else KEEP, dt, f"Config.op_precision: {forced}",
                              Reason.OP_PRECISION)
            elif self.default is None and c == REDUCE:
                out[id(n)] = (KEEP, None, "precision fp32", Reason.PRECISION_FP32)
            elif id(n) in logits and c == REDUCE and self._writes_fp32(n):
                out[id(n)] = (REDUCE, self.default, LOGITS_OUT_WHY, Reason.LOGITS_FP32_OUTPUT)
            elif id(n) in logits and c == REDUCE:
                out[id(n)] = (KEEP, None, LOGITS_WHY, Reason.LOGITS_FP32)
            else:
                out[id(n)] = (c, self.default if c == REDUCE else None, why, code)
        return out

    def _writes_fp32(self, node: Node) -> bool:
        """Whether logits ``node`` can read bf16 operands and write float32 itself."""
        return (self.default == DType.BFLOAT16 and (node.domain, node.op_type) in FP32_OUTPUT_PRODUCTS
                and not has_residual(node))

    # -- rewriting
    def run(self, graph: Graph) -> PassResult:
        from ..ops import infer_node
        targets = self._targets(graph)
        self._ours: set[int] = set()          # values this pass made reduced
        self._casts: dict[tuple[int, DType], Value] = {}
        self._consts: dict[tuple[int, DType], Value] = {}
        self.n_casts = self.n_weights = 0
        declared = [(v, v.dtype) for v in graph.outputs]
        for node in list(graph.nodes):
            c, dt, why, code = targets[id(node)]
            if c == ANY:
                continue
            floats = [i for i, v in enumerate(node.inputs) if v is not None and self._is_float(v)]
            if not floats:
                continue
            if c == FOLLOW:       # the reduced type when every live float input has the same one
                live = [node.inputs[i] for i in floats if not node.inputs[i].is_const]
                same = live and len({v.dtype for v in live}) == 1 and all(id(v) in self._ours for v in live)
                dt = live[0].dtype if same else None
            target = dt or DType.FLOAT
            keep_consts = (node.domain, node.op_type) in FLOAT32_CONSTANTS
            biases = FLOAT32_BIAS.get((node.domain, node.op_type), ())
            for i in floats:
                v = node.inputs[i]
                kept = v.is_const and v.dtype == DType.FLOAT and (keep_consts or i in biases)
                if v.dtype != target and not kept:
                    node.set_input(i, self._convert(graph, v, target, node))
            if code == Reason.LOGITS_FP32_OUTPUT:
                node.attrs["out_dtype"] = int(DType.FLOAT)      # the logits stay float32
            if target != DType.FLOAT:
                for out, (odt, shape) in zip(node.outputs, infer_node(node) or []):
                    if out.dtype == DType.FLOAT:
                        if odt == DType.FLOAT and code == Reason.LOGITS_FP32_OUTPUT:
                            continue
                        if odt != target:
                            raise PassError(f"pass 'precision': node {node.name!r} ({node.op_type}) does not "
                                            f"compute in {target.name} (its inference gives {odt!r})")
                        out.dtype = target
                        self._ours.add(id(out))
            self.log.append({"node": node.name, "op": node.op_type, "dtype": _NAMES[target], "class": str(c.value),
                             "why": why, "code": str(code.value)})
        for v, dtype in declared:
            if v.dtype != dtype and v.is_graph_output:      # (one value listed twice: restored once)
                self._restore_output(graph, v, dtype)
        removed = [k for k, v in graph.constants.items() if not v.uses and not v.is_graph_output and not is_locked(v)]
        for k in removed:
            del graph.constants[k]
        stats = {"casts": self.n_casts, "weights_converted": self.n_weights,
                 "reduced_nodes": sum(1 for r in self.log if r["dtype"] != "fp32")}
        return PassResult(bool(self._ours or self.n_casts), stats)

    def _is_float(self, v: Value) -> bool:
        return v.dtype == DType.FLOAT or (id(v) in self._ours)

    def _convert(self, graph: Graph, v: Value, dtype: DType, reader: Node) -> Value:
        if v.is_const:
            key = (id(v), dtype)
            if key not in self._consts:
                c = self._consts[key] = graph.add_constant(f"{v.name}_{_NAMES[dtype]}", _converted(v.const, dtype))
                self._ours.add(id(c))
                self.n_weights += 1
            return self._consts[key]
        key = (id(v), dtype)
        if key not in self._casts:
            node = graph.add_node("Cast", [v], attrs={"to": int(dtype)}, name=f"{v.name}_to_{_NAMES[dtype]}",
                                  version=graph.opset.get("", 17), before=reader)
            node.meta["rule"] = "precision"
            out = node.outputs[0]
            out.dtype, out.shape, out.layout = dtype, v.shape, v.layout
            if dtype != DType.FLOAT:
                self._ours.add(id(out))
            self._casts[key] = out
            self.n_casts += 1
        return self._casts[key]

    def _restore_output(self, graph: Graph, v: Value, dtype: DType) -> None:
        """Cast graph output ``v`` back to its declared ``dtype``; the cast's value takes its name."""
        node = graph.add_node("Cast", [v], attrs={"to": int(dtype)}, name=f"{v.name}_to_{_NAMES.get(dtype, 'out')}",
                              version=graph.opset.get("", 17))
        node.meta["rule"] = "precision"
        out = node.outputs[0]
        out.dtype, out.shape, out.layout = dtype, v.shape, v.layout
        graph.replace_output(v, out)
        out.flags |= v.flags
        v.flags -= {"external"}
        out.name, v.name = v.name, out.name
        self.n_casts += 1


def _converted(t: torch.Tensor, dtype: DType) -> torch.Tensor:
    """``t`` in ``dtype``; a one-value broadcast (all strides 0) stays one value."""
    tdt = dtype.to_torch()
    if t.dim() and t.numel() and all(s == 0 for s in t.stride()):
        return t.reshape(-1)[:1].to(tdt).reshape((1,) * t.dim()).expand(t.shape)
    return t.to(tdt).contiguous()


def precision_summary(graph: Graph, options, log: list[dict]) -> dict:
    """``report.precision``: the policy, per-node dtypes with their reasons, the casts left in
    the graph and those folded into their producers (``fold_casts.py``), the heavy ops kept
    in float32 (with why), the logits products with bf16 operands and float32 outputs, and the
    ``op_precision`` entries no compiled node answers to."""
    by_dtype: dict[str, int] = {}
    logits_out = {r["node"] for r in log if r["code"] == Reason.LOGITS_FP32_OUTPUT}
    present = {x for n in graph.nodes
               for x in (n.name, n.op_type, *n.meta.get("fused_from", ()), *n.meta.get("fused_types", ()))}
    for r in log:
        by_dtype[r["dtype"]] = by_dtype.get(r["dtype"], 0) + 1
    return {"policy": options.precision, "op_precision": dict(options.op_precision), "nodes": list(log),
            "by_dtype": by_dtype,
            # entries naming model nodes that compute nothing at run time (folded into constants,
            # or dead): the model has them, so they are not refused, but they changed nothing
            "op_precision_unmatched": [k for k, _ in options.op_precision if k not in present],
            "casts": sum(1 for n in graph.nodes if n.op_type == "Cast" and n.meta.get("rule") == "precision"),
            "casts_folded": sum(1 for n in graph.nodes if "out_dtype" in n.attrs      # fold_casts.py
                                and n.name not in logits_out),
            "kept_fp32": [{"node": r["node"], "op": r["op"], "why": r["why"], "code": r["code"]}
                          for r in log if r["dtype"] == "fp32"             # the logits, or asked for
                          and r["code"] in (Reason.LOGITS_FP32, Reason.OP_PRECISION)],
            "fp32_logits": [{"node": r["node"], "op": r["op"], "why": r["why"], "code": r["code"]} for r in log
                            if r["code"] == Reason.LOGITS_FP32_OUTPUT]}
