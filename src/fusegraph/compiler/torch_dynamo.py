"""``torch.compile(model, backend="fusegraph", options={...})``: the Dynamo backend.

Dynamo hands each FX graph it captured (one per region between graph breaks) to
``fusegraph_backend`` with example inputs; Dynamo keeps its own guards and graph breaks, so
torch's semantics stay torch's. Each graph is wrapped so that its parameters and buffers (the
placeholders Dynamo lifts from ``nn.Module`` attributes) become frozen constants, as Inductor's
``freezing=True`` does: they are shared, not copied, and a later in-place change to the weights
is not seen (compile again). Sizes Dynamo passes as ``SymInt`` inputs are read from the tensor
they come from. The wrapper goes through ``torch.export`` (symbolic dims of a dynamic recompile
become ``Dim.DYNAMIC``, so one fusegraph model serves every later size) and ``fg.compile``.

``options`` map 1:1 onto ``fg.Config`` fields (``Config.from_dict``: unknown keys are refused with
the closest name). A graph Dynamo hands over again (a recompilation: the same code, weights and
input shapes / dtypes / dynamic dims, the same config) reuses the model compiled before; a
recompilation for a new shape reuses the frozen weights (no copy) and says which earlier
compile of the same code it follows: ``model.report.torch_compile``, and ``COMPILES`` here.

Inference only: outputs carry no autograd history. This file holds no optimisation.
"""
from __future__ import annotations

import hashlib
import inspect
import weakref
from typing import Any

import torch

from ..errors import UnsupportedOpError

COMPILES: list[dict[str, Any]] = []          # one record per backend call, newest last
_CACHE: dict[tuple, Any] = {}


def _cached(key, frozen: dict):
    """The model compiled before for ``key``, if its weights are still these very tensors."""
    for k in [k for k, (_, refs) in _CACHE.items() if any(r() is None for r in refs)]:
        del _CACHE[k]                     # the module is gone: drop its models
    hit = _CACHE.get(key)
    if hit is None:
        return None
    model, refs = hit
    if len(refs) != len(frozen) or any(r() is not t for r, t in zip(refs, frozen.values())):
        del _CACHE[key]                   # freed weights whose addresses came back: not a hit
        return None
    return model


def _config(options: dict | None):
    from ..config import Config
    data = {k: (tuple(v) if isinstance(v, list) else v) for k, v in (options or {}).items()}
    return Config.from_dict(data) if data else Config()


def _is_frozen(node, example) -> bool:
    if isinstance(example, torch.nn.Parameter):
        return True
    source = str(getattr(node.meta.get("grapharg"), "source", ""))
    return "ParamBufferSource" in source or "_buffers" in source or "_parameters" in source


class _Frozen(torch.nn.Module):
    """The Dynamo graph with its weights as buffers and its size inputs read from tensors."""

    def __init__(self, gm: torch.fx.GraphModule, plan: list[tuple], frozen: dict[str, torch.Tensor]):
        super().__init__()
        self.gm = gm
        self.plan = plan                      # per placeholder: ("arg", j) | ("const", name) | ("size", j, d)
        for name, t in frozen.items():
            self.register_buffer(name, t.detach())

    def forward(self, *args):
        full = []
        for step in self.plan:
            if step[0] == "arg":
                full.append(args[step[1]])
            elif step[0] == "const":
                full.append(getattr(self, step[1]))
            else:
                full.append(args[step[1]].shape[step[2]])
        return self.gm(*full)


def _plan(gm, example_inputs):
    """(wrapper plan, frozen tensors, user input names, user example tensors, dynamic_shapes)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    plan, frozen, names, user, dynamic = [], {}, [], [], {}
    sym_at: dict[str, tuple[int, int]] = {}
    for node, ex in zip(placeholders, example_inputs):
        if isinstance(ex, torch.Tensor) and _is_frozen(node, ex):
            name = f"w{len(frozen)}_{node.name}"[:80]
            frozen[name] = ex
            plan.append(("const", name))
        elif isinstance(ex, torch.Tensor):
            j = len(user)
            name = node.name.strip("_") or f"input_{j}"
            names.append(name)
            user.append(ex)
            plan.append(("arg", j))
            fake = node.meta.get("example_value")
            dims = {}
            for d, size in enumerate(getattr(fake, "shape", ())):
                if isinstance(size, torch.SymInt) and size.node.maybe_as_int() is None:
                    dims[d] = torch.export.Dim.DYNAMIC
                    sym_at.setdefault(str(size.node.expr), (j, d))
            if dims:
                dynamic[name] = dims
        else:
            plan.append(("sym", node))
    for i, step in enumerate(plan):
        if step[0] == "sym":
            val = step[1].meta.get("example_value")
            where = sym_at.get(str(val.node.expr)) if isinstance(val, torch.SymInt) else None
            if where is None:
                raise UnsupportedOpError(f"torch.compile graph input {step[1].name} ({val!r}) is a "
                                         f"non-tensor input that is not a tensor's size; fusegraph "
                                         f"compiles tensor inputs only", node=step[1].name)
            plan[i] = ("size",) + where
    return plan, frozen, names, user, dynamic


def _export(wrapper: _Frozen, names, user, dynamic):
    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names]
    sig = inspect.Signature([inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)] + params)

    class Graph(_Frozen):
        def forward(self, *args):
            return _Frozen.forward(self, *args)
    Graph.forward.__signature__ = sig
    wrapper.__class__ = Graph
    return torch.export.export(wrapper, tuple(user), dynamic_shapes=dynamic or None, strict=False)


def fusegraph_backend(gm: torch.fx.GraphModule, example_inputs, *, options: dict | None = None,
                      mode: str | None = None):
    """Compile one Dynamo FX graph with fusegraph; returns the callable Dynamo runs."""
    from ..frontends.torch import import_exported
    from .driver import compile as fg_compile
    config = _config(options)
    if not any(n.op == "call_function" or n.op == "call_method" or n.op == "call_module"
               for n in gm.graph.nodes):
        return gm.forward
    plan, frozen, names, user, dynamic = _plan(gm, list(example_inputs))
    code = hashlib.sha1(gm.code.encode()).hexdigest()[:12]
    shapes = tuple((tuple(t.shape), str(t.dtype), tuple(sorted(dynamic.get(n, {})))) for n, t in zip(names, user))
    key = (code, shapes, tuple(t.data_ptr() for t in frozen.values()), repr(config))
    ops = repr([str(n.target) for n in gm.graph.nodes if n.op == "call_function"])
    ops += repr([t.data_ptr() for t in frozen.values()])
    graph_id = hashlib.sha1(ops.encode()).hexdigest()[:12]   # the same ops on the same weights
    earlier = [c for c in COMPILES if c["graph"] == graph_id]
    record = {"graph": graph_id, "code": code, "inputs": names, "shapes": [s[0] for s in shapes],
              "dynamic": {n: sorted(d) for n, d in dynamic.items()}, "frozen_constants": len(frozen),
              "compile": len(earlier) + 1}
    state: dict[str, Any] = {"model": _cached(key, frozen)}
    if state["model"] is not None:
        record["reused"] = "the compiled model (same code, weights, input specs and config)"
        COMPILES.append(record)
        state["model"].report.torch_compile = record
    user_slots = [i for i, step in enumerate(plan) if step[0] == "arg"]

    def build():
        # torch.export runs here, at the first call, not inside Dynamo's tracing: an export
        # nested in the backend call would add its guards to the frame Dynamo is tracing
        ep = _export(_Frozen(gm, plan, frozen), names, user, dynamic)
        model = fg_compile(import_exported(ep, f"torch.compile graph {code}"), config)
        _CACHE[key] = (model, [weakref.ref(t) for t in frozen.values()])
        if earlier:
            record["reused"] = (f"recompile {len(earlier) + 1} of graph {graph_id} (for shapes {record['shapes']}"
                                f"{', dynamic ' + str(record['dynamic']) if dynamic else ''}): the frozen "
                                f"weights, shared without copying; the graph is compiled again")
        COMPILES.append(record)
        model.report.torch_compile = record
        return model

    @torch._dynamo.disable
    def run(*args):
        model = state["model"]
        if model is None:
            model = state["model"] = build()
        in_names = [i.name for i in model.inputs]
        outs = model.run({name: args[slot] for name, slot in zip(in_names, user_slots)})
        return tuple(torch.from_numpy(outs[n]) for n in model.graph.meta["output_names"])

    run.fusegraph_state = state
    return run
