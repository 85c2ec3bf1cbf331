"""PyTorch frontend: an ``nn.Module`` (with example inputs) or a ``torch.export.ExportedProgram``
becomes an IR ``Graph``.

The module goes through ``torch.export`` (non-strict); its ATen-level FX graph is walked once,
node by node, and each ATen op is mapped onto fusegraph's ONNX-typed ops by the table in
``torch_ops.py`` / ``torch_ops_shape.py`` (opset 17, the same op forms ``torch.onnx`` emits, so
the passes see what they see from an ONNX export). Parameters, buffers and lifted constants
become graph constants that share the module's memory (``detach()``, no copy). ``torch.export.Dim``
symbols become named symbolic dims (the ``Dim``'s name when the dynamic shapes give it); the
shape arithmetic that depends on them (``sym_size``, ``operator.mul`` ...) becomes small int64
Shape / Mul / Concat nodes. Input names are the forward signature's, output names follow the
output pytree (``output`` for one tensor, dict keys, ``output_0``... for tuples); the flattening is
recorded in ``graph.meta["torch_out_spec"]``. An ATen op without a mapping is an
``UnsupportedOpError`` naming the op and the user source line it came from.

Optimises nothing: constant subgraphs, transposed weights and the like are left to the passes.
"""
from __future__ import annotations

import operator
import re
from typing import Any

import torch

from ..errors import ModelLoadError, UnsupportedOpError
from ..ir import DType, Graph, Value
from . import torch_ops, torch_ops_shape  # noqa: F401 - their handlers register into the table
from . import torch_table

OPSET = 17


def export_module(module: torch.nn.Module, example_inputs: Any = None, dynamic_shapes: Any = None,
                  strict: bool = False) -> "torch.export.ExportedProgram":
    """``torch.export`` of ``module`` on ``example_inputs`` (a tensor, a tuple of args, or a dict
    of keyword arguments), with the typed error this package raises when it fails."""
    if example_inputs is None:
        raise ModelLoadError(f"compiling a torch module ({type(module).__name__}) needs example inputs: "
                             f"fg.compile(module, example_inputs=(x,))")
    args, kwargs = example_inputs, {}
    if isinstance(args, dict):
        args, kwargs = (), dict(args)
    elif not isinstance(args, (tuple, list)):
        args = (args,)
    try:
        return torch.export.export(module, tuple(args), kwargs, dynamic_shapes=dynamic_shapes, strict=strict)
    except Exception as exc:  # torch raises many types here; the message is what helps
        raise ModelLoadError(f"torch.export of {type(module).__name__} failed: "
                             f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from exc


def import_torch(model: Any, example_inputs: Any = None, dynamic_shapes: Any = None) -> Graph:
    """Build an IR graph from an ``nn.Module`` (exported here) or an ``ExportedProgram``."""
    if isinstance(model, torch.export.ExportedProgram):
        ep, name = model, "ExportedProgram"
        dim_names = {}
    elif isinstance(model, torch.nn.Module):
        ep, name = export_module(model, example_inputs, dynamic_shapes), type(model).__name__
        dim_names = _dim_names(ep, dynamic_shapes)
    else:
        raise ModelLoadError(f"cannot import a {type(model).__name__} with the torch frontend")
    return import_exported(ep, name, dim_names)


def _dim_names(ep, dynamic_shapes) -> dict[str, str]:
    """{sympy symbol name: Dim name} from the ``dynamic_shapes`` given to torch.export."""
    if not dynamic_shapes:
        return {}
    user = [n for n in ep.graph.nodes if n.op == "placeholder" and n.name in ep.graph_signature.user_inputs]
    if isinstance(dynamic_shapes, dict):
        specs = [dynamic_shapes.get(n.name) for n in user]
    else:
        specs = list(dynamic_shapes)
    out: dict[str, str] = {}
    for node, spec in zip(user, specs):
        if spec is None:
            continue
        items = spec.items() if isinstance(spec, dict) else enumerate(spec)
        val = node.meta.get("val")
        for axis, dim in items:
            dname = getattr(dim, "__name__", None)
            if dname and val is not None and axis < val.dim() and isinstance(val.shape[axis], torch.SymInt):
                out[str(val.shape[axis].node.expr)] = dname
    return out


class Importer:
    """Walks one ExportedProgram; the op handlers (``torch_ops``) build nodes through it."""

    def __init__(self, ep, name: str, dim_names: dict[str, str]):
        self.ep = ep
        self.where = name
        self.dim_names = dim_names
        self.graph = Graph(name, {"": OPSET})
        self.graph.meta["source"] = name
        self.env: dict[Any, Any] = {}
        self.node = None                       # the FX node being mapped
        self.op_counts: dict[str, int] = {}    # ATen overloads seen (graph.meta["torch_op_counts"])

    # ----- helpers the handlers use ------------------------------------------------------
    def emit(self, op_type: str, inputs, attrs: dict | None = None, n_out: int = 1, domain: str = ""):
        label = self.node.name if self.node is not None else op_type.lower()
        n = self.graph.add_node(op_type, inputs, outputs=n_out, attrs=attrs, domain=domain, name=label)
        if self.node is not None:
            n.meta["torch_node"] = self.node.name
            trace = self.node.meta.get("stack_trace")
            if trace:
                n.meta["source_line"] = source_line(trace)
        return n.outputs[0] if n_out == 1 else list(n.outputs)

    def const(self, data, dtype: torch.dtype | None = None) -> Value:
        t = data if isinstance(data, torch.Tensor) else torch.tensor(data, dtype=dtype)
        if dtype is not None and t.dtype != dtype:
            t = t.to(dtype)
        return self.graph.add_constant(self.graph.fresh_name("c"), t)

    def val(self, arg):
        """The meta value (a FakeTensor, a SymInt, a number) of an FX argument."""
        if isinstance(arg, torch.fx.Node):
            return arg.meta.get("val")
        return arg

    def dtype_of(self, arg) -> torch.dtype:
        v = self.val(arg)
        if isinstance(v, torch.Tensor):
            return v.dtype
        if isinstance(v, (bool, torch.SymBool)):
            return torch.bool
        if isinstance(v, (int, torch.SymInt)):
            return torch.int64
        return torch.get_default_dtype()

    def v(self, arg, dtype: torch.dtype | None = None) -> Value:
        """The IR value of an FX argument (a Python number becomes a scalar constant), cast to
        ``dtype`` when given and different."""
        if isinstance(arg, torch.fx.Node):
            value = self.env[arg]
            if isinstance(self.val(arg), (torch.SymInt, torch.SymFloat)):
                value = self.emit("Squeeze", [value, self.const([0], torch.int64)])
            if not isinstance(value, Value):
                raise UnsupportedOpError(f"{self.where}: {arg.name} is not a tensor here", node=arg.name)
        else:
            return self.const(arg, dtype or self.dtype_of(arg))
        if dtype is not None and self.dtype_of(arg) != dtype:
            value = self.emit("Cast", [value], {"to": int(DType.from_torch(dtype))})
        return value

    def ints(self, seq) -> Value:
        """An int64 1-D value from a list of ints and SymInt-valued FX nodes (a shape argument)."""
        if isinstance(seq, torch.fx.Node):
            return self.v(seq, torch.int64)
        parts, run = [], []
        for item in seq:
            if isinstance(item, torch.fx.Node):
                if run:
                    parts.append(self.const(run, torch.int64))
                    run = []
                parts.append(self.env[item])
            else:
                run.append(int(item))
        if run or not parts:
            parts.append(self.const(run, torch.int64))
        return parts[0] if len(parts) == 1 else self.emit("Concat", parts, {"axis": 0})

    def static(self, seq) -> list[int] | None:
        """The ints of a shape argument when none of them is symbolic, else None."""
        if isinstance(seq, torch.fx.Node):
            return None
        out = []
        for item in seq:
            v = self.val(item)
            if isinstance(v, torch.SymInt):
                if not v.node.is_constant() and not isinstance(v.node.maybe_as_int(), int):
                    return None
                v = int(v.node.maybe_as_int())
            out.append(int(v))
        return out

    def shape(self, arg) -> tuple:
        """The (possibly symbolic) shape of an FX tensor argument as Python dims."""
        return tuple(self.val(arg).shape)

    def unsupported(self, why: str) -> UnsupportedOpError:
        n = self.node
        line = source_line(n.meta.get("stack_trace", "")) if n is not None else ""
        op = str(n.target) if n is not None else "?"
        return UnsupportedOpError(f"{self.where}: ATen op {op} (node {n.name if n is not None else '?'}) "
                                  f"{why}{f' at {line}' if line else ''}", node=getattr(n, "name", None),
                                  op_type=op)

    # ----- the walk ----------------------------------------------------------------------
    def run(self) -> Graph:
        ep, g = self.ep, self.graph
        sig = ep.graph_signature
        lifted = {**sig.inputs_to_parameters, **sig.inputs_to_buffers,
                  **getattr(sig, "inputs_to_lifted_tensor_constants", {})}
        for node in ep.graph.nodes:
            if node.op == "placeholder":
                if node.name in lifted:
                    fqn = lifted[node.name]
                    t = ep.state_dict.get(fqn)
                    if t is None:
                        t = ep.constants.get(fqn)
                    if not isinstance(t, torch.Tensor):
                        raise ModelLoadError(f"{self.where}: constant {fqn!r} is not a tensor")
                    self.env[node] = g.add_constant(_clean(fqn), t.detach())
                elif node.name in sig.user_inputs:
                    val = node.meta.get("val")
                    if isinstance(val, torch.Tensor):
                        self.env[node] = g.add_input(node.name, DType.from_torch(val.dtype), self._dims(val))
                    else:
                        self.env[node] = val  # a non-tensor input was specialised by export
                else:
                    raise UnsupportedOpError(f"{self.where}: input {node.name} ({node.target}) is neither a "
                                             f"user input nor a parameter / buffer / constant")
            elif node.op == "call_function":
                self.node = node
                self.env[node] = self._call(node)
            elif node.op == "output":
                self._outputs(node)
        self.node = None
        g.meta["torch_op_counts"] = self.op_counts
        return g

    def _call(self, node):
        target = node.target
        if target is operator.getitem:
            seq, idx = self.env[node.args[0]], node.args[1]
            return seq[idx]
        if target in _SYM_BINARY:
            a, b = (self.ints([x]) for x in node.args)
            return self.emit(_SYM_BINARY[target], [a, b])
        if not isinstance(target, torch._ops.OpOverload):
            raise self.unsupported("is not an ATen op (no mapping for a Python callable)")
        name = str(target)
        self.op_counts[name] = self.op_counts.get(name, 0) + 1
        handler = torch_table.lookup(name)
        if handler is None:
            raise self.unsupported("has no fusegraph mapping")
        out = handler(self, torch_table.bind(target, node.args, node.kwargs))
        if out is torch_table.SKIP:
            return None
        if torch_table.is_inplace(target) and isinstance(node.args[0], torch.fx.Node):
            self.env[node.args[0]] = out     # later readers of the mutated tensor see the result
        self._hint(out, node.meta.get("val"))
        return out

    def _hint(self, out, val) -> None:
        if isinstance(out, Value) and out.producer is not None and isinstance(val, torch.Tensor):
            out.dtype = DType.from_torch(val.dtype)
            out.shape = self._dims(val)

    def _dims(self, val) -> tuple:
        dims = []
        for d in val.shape:
            if isinstance(d, int):
                dims.append(d)
            elif d.node.maybe_as_int() is not None:
                dims.append(int(d.node.maybe_as_int()))
            else:
                expr = str(d.node.expr)
                dims.append(self.dim_names.get(expr, expr) if re.fullmatch(r"[A-Za-z_]\w*", expr) else None)
        return tuple(dims)

    def _outputs(self, node) -> None:
        from torch.utils import _pytree as pytree
        g, sig = self.graph, self.ep.graph_signature
        flat = list(node.args[0])
        user = flat[len(flat) - len(sig.user_outputs):]
        names = output_names(self.ep.call_spec.out_spec, len(user))
        for arg, name in zip(user, names):
            value = self.env.get(arg) if isinstance(arg, torch.fx.Node) else None
            if not isinstance(value, Value):
                raise UnsupportedOpError(f"{self.where}: output {name!r} is not a tensor ({arg!r})")
            if value.producer is None or any(value is o for o in g.outputs):
                value = g.add_node("Identity", [value], name=f"{name}_identity").outputs[0]
            g.outputs.append(value)
        g.meta["output_names"] = names
        g.meta["input_names"] = [v.name for v in g.inputs]
        g.meta["torch_out_spec"] = pytree.treespec_dumps(self.ep.call_spec.out_spec)


_SYM_BINARY = {operator.mul: "Mul", operator.add: "Add", operator.sub: "Sub", operator.floordiv: "Div",
               operator.mod: "Mod"}


def import_exported(ep, name: str = "ExportedProgram", dim_names: dict[str, str] | None = None) -> Graph:
    return Importer(ep, name, dim_names or {}).run()


def output_names(spec, n: int) -> list[str]:
    """Names of the flattened outputs from the output pytree spec."""
    from torch.utils import _pytree as pytree
    try:
        tree = pytree.tree_unflatten(list(range(n)), spec)
        paths = [p for p, _ in pytree.tree_flatten_with_path(tree)[0]]
    except Exception:
        paths = [(i,) for i in range(n)]
    if n == 1 and not paths[0]:
        return ["output"]
    names = []
    for path in paths:
        parts = []
        for k in path:
            key = getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))
            parts.append(str(key))
        joined = "_".join(parts) if parts else "output"
        names.append(joined if not joined[0].isdigit() else f"output_{joined}")
    seen: dict[str, int] = {}
    out = []
    for nm in names:
        nm = _clean(nm)
        if nm in seen:
            seen[nm] += 1
            nm = f"{nm}_{seen[nm]}"
        seen.setdefault(nm, 0)
        out.append(nm)
    return out


def source_line(trace: str) -> str:
    """``file:line (code)`` of the innermost frame of an FX node's stack trace."""
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)', trace or "")
    if not frames:
        return ""
    f, line, fn, code = frames[-1]
    return f"{f}:{line} in {fn}: {code.strip()}"


def _clean(name: str) -> str:
    return re.sub(r"[^0-9A-Za-z_.]", "_", name)
