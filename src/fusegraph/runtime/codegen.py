"""Generate the Python source of a model's run function(s): one line per kernel call.

A model compiles to one module of source with one function per stream (one function in all
for a single stream). Kernels, constants, arena views and events are globals of that module;
intermediates are local names. A node bound with ``out=`` (``bind.NodeCall.out``) is emitted
as ``k3(v1, v2, out=a3)`` and its value *is* the arena view ``a3``; any other node as
``v3 = k3(v1, v2)``, followed by a copy when its result may alias the arena untracked
(``guard``). A local is dropped (``del``) right after its last use in its function.

For several functions (``FunctionSpec``), values cross through a per-run list ``E``: a value
is stored into its slot right after it is made (``exports``) and loaded right before its first
use in another function (``imports``; the only importer clears the slot, ``consume``, so
the tensor is freed after its last use); ``before`` / ``after`` hold the extra lines the stream
layer needs (event waits before a call, event records after it, stream switches). Exports
precede the ``after`` lines, so a record always publishes the value first. With ``hook``,
every call is bracketed by ``_hook(index, 0, None)`` and ``_hook(index, 1, outputs)`` (debug
runs: allocation checks, timestamps). A call whose kernel offers a prepared form for its
fixed arena views is made by the line itself (``direct.py``), with the locals that
``D0()`` returns at the top of the function. With a run control, each call is preceded by
``if _RC.stop: _RC.stopped()`` (one attribute read: a cancelled run or one past its deadline
stops there, ``run_control.py``). The source is readable (``fusegraph inspect --code``).
The single-stream ``run`` leaves the nodes that depend only on the input shapes to a second
function, ``_memo_fill``, called when those shapes are new (``shape_memo.py``); a call may
read other values than its node's inputs (``NodeCall.args``: a Shape derived from them).
This file decides nothing about placement, kernels or streams; ``bind.py``, the backends and ``streams_*.py`` do.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..errors import PlanError
from ..ir import Node, Value
from .bind import Binding, NodeCall
from .direct import LOCALS, ThreadEntry, direct_form, direct_lines
from .shape_memo import fill_epilogue, memo_globals, memo_prologue, shape_only_calls


STOP_FLAG, STOP_CALL = "_RC.stop", "_RC.stopped()"   # read before each call (run_control.py)


@dataclass
class GeneratedCode:
    source: str
    function: Callable                        # the entry function (``run`` or stream 0)
    line_to_node: dict[int, Node] = field(default_factory=dict)
    filename: str = "<fusegraph>"
    functions: dict[str, Callable] = field(default_factory=dict)
    env: dict[str, object] = field(default_factory=dict)
    shape_kernels: int = 0                    # calls run once per input shapes (``_memo_fill``, or the frame's)


class Names:
    """Value -> name in the generated module, and the module's globals; shared by its functions."""

    def __init__(self, constants: dict[int, object] | None = None):
        self.constants = constants or {}   # id(value) -> the tensor to use instead of value.const
        self.env: dict[str, object] = {}
        self._names: dict[int, str] = {}
        self._globals: set[int] = set()
        self._n = 0

    def add_global(self, prefix: str, obj) -> str:
        name = f"{prefix}{len(self.env)}"
        self.env[name] = obj
        return name

    def set_global(self, v: Value, obj) -> str:
        name = self.add_global("a", obj)
        self._names[id(v)] = name
        self._globals.add(id(v))
        return name

    def is_local(self, v: Value) -> bool:
        return id(v) not in self._globals and not v.is_const

    def __call__(self, v: Value) -> str:
        key = id(v)
        if key not in self._names:
            if v.is_const:
                self._names[key] = self.add_global("c", self.constants.get(key, v.const))
                self._globals.add(key)
            else:
                self._names[key] = f"v{self._n}"
                self._n += 1
        return self._names[key]


@dataclass
class FunctionSpec:
    name: str
    calls: list[NodeCall]
    params: list[str] = field(default_factory=list)          # parameter names
    param_values: list[Value] = field(default_factory=list)  # values bound to the first params
    imports: dict[int, int] = field(default_factory=dict)    # id(value) -> slot of E
    exports: dict[int, int] = field(default_factory=dict)    # id(value) -> slot of E
    consume: set[int] = field(default_factory=set)           # imports whose slot is cleared on load
    before: dict[int, list[str]] = field(default_factory=dict)  # call position -> lines
    after: dict[int, list[str]] = field(default_factory=dict)   # call position -> lines
    prologue: list[str] = field(default_factory=list)
    epilogue: list[str] = field(default_factory=list)
    returns: list[Value] | None = None
    hook: bool = False
    direct: bool = False          # kernels that offer it are called directly (``direct.py``)
    checks: bool = False          # read the run's stop flag (``_RC``) before each call


def _label(node: Node) -> str:
    """The trailing comment of a call line: op type and node name as ``ascii()`` literals, so a
    string from the model (newlines, U+2028, NUL, quotes) can never leave the comment."""
    return f"{ascii(node.op_type)} {ascii(node.name)}"


def _emit(spec: FunctionSpec, names: Names, lines: list[str], line_to_node: dict[int, Node]) -> None:
    for v, p in zip(spec.param_values, spec.params):
        names._names.setdefault(id(v), p)
    lines.append(f"def {spec.name}({', '.join(spec.params)}):")
    entry = ThreadEntry() if spec.direct else None
    if entry is not None:
        lines.append(f"    {LOCALS} = {names.add_global('D', entry)}()")
    lines.extend("    " + s for s in spec.prologue)
    last_use: dict[int, int] = {}
    for pos, call in enumerate(spec.calls):
        for v in call.inputs:
            if v is not None:
                last_use[id(v)] = pos
    keep = {id(v) for v in spec.returns or ()}
    loaded: set[int] = set(id(v) for v in spec.param_values)
    for pos, call in enumerate(spec.calls):
        node = call.node
        lines.extend("    " + s for s in spec.before.get(pos, ()))
        for v in call.inputs:
            if v is not None and id(v) in spec.imports and id(v) not in loaded:
                loaded.add(id(v))
                slot = spec.imports[id(v)]
                clear = f"; E[{slot}] = None" if id(v) in spec.consume else ""
                lines.append(f"    {names(v)} = E[{slot}]{clear}")
        if spec.checks:
            line_to_node[len(lines) + 1] = node
            lines.append(f"    if {STOP_FLAG}: {STOP_CALL}")
        if spec.hook:
            lines.append(f"    _hook({call.index}, 0, None)")
        kname = names.add_global("k", call.kernel)
        args = ", ".join("None" if v is None else names(v) for v in call.inputs)
        outs = [names(o) for o in node.outputs]
        line_to_node[len(lines) + 1] = node
        d = _direct(call, names) if entry is not None else None
        if d is not None:
            for s in direct_lines(d, entry, kname, args, outs[0]):
                line_to_node[len(lines) + 1] = node
                lines.append(f"    {s}  # {_label(node)}")
        elif call.out is not None:
            target = outs[0] if len(outs) == 1 else "(" + ", ".join(outs) + ",)"
            sep = ", " if args else ""
            lines.append(f"    {kname}({args}{sep}out={target})  # {_label(node)}")
        else:
            target = outs[0] if len(outs) == 1 else ", ".join(outs) + ","
            lines.append(f"    {target} = {kname}({args})  # {_label(node)}")
            if call.guard:
                for o in outs:
                    lines.append(f"    if _AL <= {o}.data_ptr() < _AH: {o} = {o}.clone()")
        if spec.hook:
            lines.append(f"    _hook({call.index}, 1, ({', '.join(outs)},))")
        for o in node.outputs:
            if id(o) in spec.exports:
                lines.append(f"    E[{spec.exports[id(o)]}] = {names(o)}")
        lines.extend("    " + s for s in spec.after.get(pos, ()))
        dead: list[str] = []
        out_ids = {id(o) for o in node.outputs}
        for v in list(call.inputs) + list(node.outputs):
            if v is None or not names.is_local(v) or id(v) in keep or names(v) in dead:
                continue
            lu = last_use.get(id(v))
            if lu == pos or (lu is None and id(v) in out_ids):
                dead.append(names(v))
        if dead:
            lines.append(f"    del {', '.join(dead)}")
    lines.extend("    " + s for s in spec.epilogue)
    if spec.returns is not None:
        outs = [names(v) for v in spec.returns]
        lines.append(f"    return ({', '.join(outs)}{',' if len(outs) == 1 else ''})")
    if lines[-1].startswith("def "):
        lines.append("    pass")
    lines.append("")


def _direct(call: NodeCall, names: Names):
    """The call's ``Direct`` when it writes one planned view and reads only planned views and
    constants (the same tensors on every run), else None."""
    if call.out is None or len(call.out) != 1 or len(call.node.outputs) != 1:
        return None
    if any(v is not None and names.is_local(v) for v in call.inputs):
        return None
    tensors = tuple(None if v is None else names.env[names(v)] for v in call.inputs)
    return direct_form(call.kernel, tensors, call.out[0])


def generate_module(specs: list[FunctionSpec], names: Names, filename: str,
                    extra_globals: dict | None = None) -> GeneratedCode:
    """Compile the functions of ``specs`` into one module; the first one is the entry.
    ``filename`` (it names the graph) is kept printable: ``ascii()`` escapes, at most 200 chars."""
    filename = ascii(filename)[1:-1][:200]
    lines: list[str] = []
    line_to_node: dict[int, Node] = {}
    for spec in specs:
        _emit(spec, names, lines, line_to_node)
    for line in lines:   # every line is the generator's own: one ASCII line, no control characters
        if not (line.isascii() and line.isprintable()):
            raise PlanError(f"{filename}: refusing to compile a generated line holding a control or "
                            f"non-ASCII character: {line[:120]!r}")
    source = "\n".join(lines) + "\n"
    env = names.env
    env.update(extra_globals or {})
    code = compile(source, filename, "exec")
    exec(code, env)  # noqa: S102 - our own generated source, built from the graph above
    functions = {s.name: env[s.name] for s in specs}
    return GeneratedCode(source, functions[specs[0].name], line_to_node, filename, functions, env)


def arena_names(binding: Binding, calls: list[NodeCall] | None = None) -> Names:
    """A ``Names`` where every value written with ``out=`` (by ``calls``, default the
    binding's) is its arena view (a global)."""
    names = Names(binding.dense)
    for call in binding.calls if calls is None else calls:
        if call.out is not None:
            for o, view in zip(call.node.outputs, call.out):
                names.set_global(o, view)
    return names


def arena_globals(binding: Binding) -> dict:
    """``_AL`` / ``_AH``: the arena's address range, for the alias guard."""
    if binding.arena is None:
        return {"_AL": 0, "_AH": 0}
    return {"_AL": binding.arena.lo, "_AH": binding.arena.hi}


def control_globals(control) -> dict:
    """``_RC``: the run control whose ``stop`` the generated code reads before each call."""
    return {"_RC": control}


def generate_run_function(graph, binding: Binding, filename: str, hook: Callable | None = None,
                          direct: bool = True, control=None) -> GeneratedCode:
    """The single-stream ``run(*inputs) -> outputs`` function for ``binding``'s order; with
    ``direct``, kernels that offer it are called directly (``direct.py``), else every call goes
    through the kernel's Python path (``Executor(direct_calls=False)``: what
    ``benchmarks/direct_calls.py`` compares against); with ``control``
    (``run_control.RunControl``), every call is preceded by a read of its stop flag (the
    shape-only calls of ``_memo_fill`` are not)."""
    memo = shape_only_calls(graph, binding.calls) if hook is None else None
    memo_ids = {id(c.node) for c in memo.calls} if memo else set()
    calls = [c for c in binding.calls if id(c.node) not in memo_ids]
    names = arena_names(binding, calls)
    params = [names(v) for v in graph.inputs]
    spec = FunctionSpec("run", calls, params=params, param_values=list(graph.inputs),
                        returns=list(graph.outputs), hook=hook is not None, direct=direct,
                        checks=control is not None)
    extra = arena_globals(binding)
    if control is not None:
        extra.update(control_globals(control))
    specs = [spec]
    if memo:    # shape-only nodes run once per input shapes (shape_memo.py)
        result_names = [names(v) for v in memo.results]
        spec.prologue = memo_prologue(params, result_names)
        specs.append(FunctionSpec("_memo_fill", memo.calls, params=params + ["_key"],
                                  param_values=list(graph.inputs), returns=memo.results,
                                  epilogue=fill_epilogue(result_names)))
        extra.update(memo_globals())
    if hook is not None:
        extra["_hook"] = hook
    code = generate_module(specs, names, filename, extra)
    code.shape_kernels = len(memo.skipped()) if memo else 0
    return code


def generate_frame_run_function(graph, binding: Binding, memo, frame_values: list[Value], filename: str,
                                frames, hook: Callable | None = None, control=None) -> GeneratedCode:
    """The ``run(*inputs) -> outputs`` function of a model with symbolic input dims: its first
    lines take the frame of the inputs' shapes (``frames.FrameBuilder``: made on a miss) and
    unpack it into the shape-only and computed values (``memo.held``) and the arena views of
    ``frame_values`` (the outputs of the calls bound with ``FRAME_OUTPUTS``); every call then
    writes its view; the frame builder computes those values (``shape_program.py``). ``hook``
    and ``control`` as for ``generate_run_function`` (with a hook the computed nodes also run
    in line, so that it sees every node)."""
    memo_ids = memo.skipped() if memo else set()
    # a debug run (``hook``) runs the shape-only and computed nodes again in line, so it sees every node
    calls = [c for c in binding.calls if hook is not None or id(c.node) not in memo_ids]
    names = Names(binding.dense)
    params = [names(v) for v in graph.inputs]
    spec = FunctionSpec("run", calls, params=params, param_values=list(graph.inputs),
                        returns=list(graph.outputs), hook=hook is not None, checks=control is not None)
    unpacked = [names(v) for v in (memo.held if memo else [])] + [names(v) for v in frame_values]
    key = "(" + "".join(f"{p}.shape, " for p in params) + ")"
    spec.prologue = [f"_f = _FRAMES.get({key})",
                     "if _f is None:",
                     f"    _f = _FRAME({', '.join(params)})"]
    if unpacked:
        spec.prologue.append(f"{', '.join(unpacked)}, = _f")
    specs = [spec]
    extra = {"_FRAMES": frames.frames, "_FRAME": frames, "_AL": 0, "_AH": 0}
    if control is not None:
        extra.update(control_globals(control))
    if hook is not None:
        extra["_hook"] = hook
    code = generate_module(specs, names, filename, extra)
    code.shape_kernels = len(memo.skipped()) if memo else 0
    return code
