"""Generate the Python source of a graph's run function: one line per kernel call.

Inputs, outputs and intermediates are local names; kernels and constants are globals of the
generated function. A value is dropped (``del``) right after its last use, so memory is
freed as early as plain Python allows. The source is readable (``fusegraph inspect --code``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..ir import Graph, Node, Value


@dataclass
class GeneratedCode:
    source: str
    function: Callable
    line_to_node: dict[int, Node] = field(default_factory=dict)
    filename: str = "<fusegraph>"


def generate_run_function(graph: Graph, kernels: dict[int, Callable], filename: str) -> GeneratedCode:
    """``kernels`` maps ``id(node)`` to its bound kernel."""
    names: dict[int, str] = {}
    env: dict[str, object] = {}

    def local(v: Value) -> str:
        key = id(v)
        if key not in names:
            if v.is_const:
                names[key] = f"c{len(env)}"
                env[names[key]] = v.const
            else:
                names[key] = f"v{len(names)}"
        return names[key]

    params = [local(v) for v in graph.inputs]
    last_use: dict[int, int] = {}
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            if v is not None:
                last_use[id(v)] = i
    keep = {id(v) for v in graph.outputs}

    lines = [f"def run({', '.join(params)}):"]
    line_to_node: dict[int, Node] = {}
    for i, node in enumerate(graph.nodes):
        kname = f"k{i}"
        env[kname] = kernels[id(node)]
        args = ", ".join("None" if v is None else local(v) for v in node.inputs)
        outs = [local(o) for o in node.outputs]
        target = outs[0] if len(outs) == 1 else ", ".join(outs) + ","
        line_to_node[len(lines) + 1] = node
        lines.append(f"    {target} = {kname}({args})  # {node.op_type} {node.name}")
        dead = []
        for v in node.inputs:
            if v is not None and not v.is_const and last_use.get(id(v)) == i and id(v) not in keep:
                name = names[id(v)]
                if name not in dead:
                    dead.append(name)
        for o in node.outputs:
            if id(o) not in last_use and id(o) not in keep and names[id(o)] not in dead:
                dead.append(names[id(o)])
        if dead:
            lines.append(f"    del {', '.join(dead)}")
    outs = [local(v) for v in graph.outputs]
    lines.append(f"    return ({', '.join(outs)}{',' if len(outs) == 1 else ''})")
    source = "\n".join(lines) + "\n"
    code = compile(source, filename, "exec")
    exec(code, env)  # noqa: S102 - our own generated source, built from the graph above
    return GeneratedCode(source, env["run"], line_to_node, filename)
