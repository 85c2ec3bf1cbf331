"""A readable text form of a ``Graph`` (used by ``fusegraph inspect`` and FUSEGRAPH_DUMP).

Names, dims and meta come from the model: each line is passed through ``printable``, so a
control character in them (ESC, CR, NUL, a bidi override) is printed as its escape."""
from __future__ import annotations

from ..report.printable import printable
from .graph import Graph
from .nodes import Node


def _fmt_attr(v) -> str:
    if hasattr(v, "shape") and hasattr(v, "dtype"):
        return f"tensor{list(v.shape)}"
    if isinstance(v, (list, tuple)) and len(v) > 8:
        return "[" + ",".join(map(str, v[:8])) + f",...({len(v)})]"
    if isinstance(v, bytes):
        return repr(v.decode(errors="replace"))
    if isinstance(v, Graph):
        return f"<graph {v.name}: {len(v.nodes)} nodes>"
    return repr(v) if isinstance(v, str) else str(v)


def format_node(node: Node) -> str:
    outs = ", ".join(f"%{o.name}: {o.type_str()}" for o in node.outputs)
    ins = ", ".join("_" if v is None else f"%{v.name}" for v in node.inputs)
    dom = f"{node.domain}::" if node.domain else ""
    attrs = ""
    if node.attrs:
        attrs = " {" + ", ".join(f"{k}={_fmt_attr(v)}" for k, v in sorted(node.attrs.items())) + "}"
    rule = f"  # {node.meta['rule']}" if "rule" in node.meta else ""
    return printable(f"  {outs} = {dom}{node.op_type}({ins}){attrs}{rule}")


def format_graph(graph: Graph, max_constants: int = 20) -> str:
    """The graph's text; bodies of control-flow nodes follow their node, indented."""
    from .subgraphs import subgraphs
    lines = [f"graph {graph.name} (opset {dict(sorted(graph.opset.items()))})"]
    for v in graph.captures:
        lines.append(f"  outer  %{v.name}: {v.type_str()}")
    for v in graph.inputs:
        lines.append(f"  input  %{v.name}: {v.type_str()}")
    consts = list(graph.constants.values())
    for v in consts[:max_constants]:
        lines.append(f"  const  %{v.name}: {v.type_str()}")
    if len(consts) > max_constants:
        lines.append(f"  ... {len(consts) - max_constants} more constants")
    for n in graph.nodes:
        lines.append(format_node(n))
        for attr, body in subgraphs(n):
            sub = format_graph(body, max_constants).splitlines()
            lines.append(f"    {attr}: {sub[0]}")
            lines.extend("      " + ln for ln in sub[1:])
    lines.append("  return " + ", ".join(f"%{v.name}" for v in graph.outputs))
    return "\n".join(printable(line) for line in lines)
