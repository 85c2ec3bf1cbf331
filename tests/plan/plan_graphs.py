"""Small IR graphs for the planner tests, built with the IR API and typed by hand (no kernels)."""
from __future__ import annotations

import random

from fusegraph.ir import DType, Graph


def op(graph: Graph, op_type: str, inputs, shape, dtype=DType.FLOAT, n_out: int = 1, name=None):
    node = graph.add_node(op_type, inputs, outputs=n_out, name=name)
    for o in node.outputs:
        o.dtype, o.shape = dtype, tuple(shape)
    return node.outputs[0] if n_out == 1 else node.outputs


def chain(n: int = 4, shape=(1, 8, 4, 4)) -> Graph:
    """x -> Conv -> Relu -> Conv -> Relu ... (Conv is opaque, Relu may work in place)."""
    g = Graph("chain")
    v = g.add_input("x", DType.FLOAT, shape)
    for i in range(n):
        v = op(g, "Conv" if i % 2 == 0 else "Relu", [v], shape, name=f"n{i}")
    g.outputs.append(v)
    return g


def branchy(width: int = 4, big=(1, 64, 8, 8), small=(1, 4, 8, 8)) -> Graph:
    """``width`` branches, each: a big expansion then a small reduction, joined by Concat.

    Running one branch to completion before starting the next keeps one big tensor live;
    running every expansion first (the default order here) keeps ``width`` of them."""
    g = Graph("branchy")
    x = g.add_input("x", DType.FLOAT, small)
    h = op(g, "Conv", [x], small, name="stem")
    expanded = [op(g, "Conv", [h], big, name=f"expand{i}") for i in range(width)]
    reduced = [op(g, "Conv", [e], small, name=f"reduce{i}") for i, e in enumerate(expanded)]
    cat = op(g, "Concat", reduced, (1, 4 * width, 8, 8), name="cat")
    g.outputs.append(op(g, "Conv", [cat], small, name="head"))
    return g


def random_dag(seed: int, n: int = 12, max_in: int = 3) -> Graph:
    """A random DAG of opaque ops with random tensor sizes; sinks become graph outputs."""
    rng = random.Random(seed)
    g = Graph(f"dag{seed}")
    values = [g.add_input("x", DType.FLOAT, (1, 16))]
    used = set()
    for i in range(n):
        k = rng.randint(1, min(max_in, len(values)))
        ins = rng.sample(values, k)
        used.update(v.name for v in ins)
        out = op(g, "Op", ins, (1, rng.choice([1, 4, 16, 64, 256])), name=f"n{i}")
        values.append(out)
    for v in values[1:]:
        if v.name not in used:
            g.outputs.append(v)
    return g


def typed_dag(seed: int, n: int = 7) -> Graph:
    """Random DAG mixing opaque ops, Relu / Add (in place when an input dies there) and Identity
    (a view), over a few tensor sizes; sinks become outputs."""
    rng = random.Random(seed)
    g = Graph(f"typed{seed}")
    values = [g.add_input("x", DType.FLOAT, (1, 16))]
    used = set()
    for i in range(n):
        kind = rng.choice(["Op", "Op", "Relu", "Add", "Identity"])
        if kind == "Add":
            a = rng.choice(values)
            same = [v for v in values if v.shape == a.shape]
            ins = [a, rng.choice(same)]
        elif kind in ("Relu", "Identity"):
            ins = [rng.choice(values)]
        else:
            ins = rng.sample(values, rng.randint(1, min(3, len(values))))
        shape = ins[0].shape if kind != "Op" else (1, rng.choice([4, 16, 64, 256]))
        used.update(v.name for v in ins)
        values.append(op(g, kind, ins, shape, name=f"n{i}"))
    for v in values[1:]:
        if v.name not in used:
            g.outputs.append(v)
    return g
