"""Nested graphs: which attributes of a node hold bodies, and how outer reads are wired.

A node owning bodies (If, Loop, Scan, SequenceMap) carries, after its ONNX inputs, one
*implicit* input per outer-scope value its bodies read. Every body of the node has the same
number of ``captures``; capture ``i`` of each body stands for the node's implicit input ``i``
(a body that does not read it leaves its capture unused). So the enclosing graph's use-def
links, dead-code elimination, lifetimes and ordering treat outer reads as ordinary inputs.
"""
from __future__ import annotations

from typing import Iterator

from .graph import Graph
from .nodes import Node


def subgraphs(node: Node) -> Iterator[tuple[str, Graph]]:
    """(attribute name, body) for every graph-valued attribute (lists of graphs included)."""
    for name, value in node.attrs.items():
        if isinstance(value, Graph):
            yield name, value
        elif isinstance(value, (list, tuple)) and value and all(isinstance(g, Graph) for g in value):
            for g in value:
                yield name, g


def implicit_count(node: Node) -> int:
    """How many trailing inputs of ``node`` are outer values its bodies read."""
    for _, g in subgraphs(node):
        return len(g.captures)
    return 0


def walk_graphs(graph: Graph) -> Iterator[Graph]:
    """``graph`` and every body nested in it, outermost first."""
    yield graph
    for node in graph.nodes:
        for _, g in subgraphs(node):
            yield from walk_graphs(g)


def prune_captures(node: Node) -> int:
    """Drop the captures no body of ``node`` reads any more, with their implicit inputs;
    return how many went. Keeps use-def links straight (the outer value loses that use)."""
    bodies = [g for _, g in subgraphs(node)]
    k = implicit_count(node)
    if not bodies or not k:
        return 0
    first = len(node.inputs) - k
    keep = [i for i in range(k) if any(g.captures[i].uses or g.captures[i].is_graph_output for g in bodies)]
    if len(keep) == k:
        return 0
    kept_values = [node.inputs[first + i] for i in keep]
    for i in range(first, len(node.inputs)):
        node.set_input(i, None)
    del node.inputs[first:]
    for v in kept_values:
        node.inputs.append(None)
        node.set_input(len(node.inputs) - 1, v)
    for g in bodies:
        g.captures = [g.captures[i] for i in keep]
    return k - len(keep)
