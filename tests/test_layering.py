"""The house's layering, read from the imports of every module under ``src/fusegraph``.

Data flows one way (docs/architecture.md): ``ops/`` knows no runtime, frontend, artifact or
pass; ``runtime/`` no frontend or pass; passes and the planner no runtime; ``artifact/`` not
the compiler. Imports inside functions count too (a lazy import is still a dependency). And
the packages' module-level imports form no cycle.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import fusegraph

ROOT = Path(fusegraph.__file__).parent
FORBIDDEN = {
    "ops": {"runtime", "frontends", "artifact", "passes", "compiler"},
    "runtime": {"frontends", "passes", "artifact", "compiler"},
    "passes": {"runtime", "artifact", "compiler", "frontends"},
    "plan": {"runtime", "artifact", "compiler", "frontends", "passes"},
    "ir": {"ops", "runtime", "frontends", "passes", "plan", "artifact", "compiler"},
    "artifact": {"compiler", "frontends", "passes"},
    "frontends": {"runtime", "passes", "artifact", "compiler"},
}


def _unit(path: Path) -> str:
    """Top-level unit of a module: its subpackage, or the module's own name."""
    rel = path.relative_to(ROOT)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imports(path: Path, top_level_only: bool) -> set[str]:
    """Units of fusegraph a module imports."""
    tree = ast.parse(path.read_text(), str(path))
    rel = path.relative_to(ROOT)
    package = list(rel.parts[:-1])
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                parts = base + (node.module.split(".") if node.module else [])
                targets = [parts] if node.module else [base + [a.name] for a in node.names]
            elif node.module and node.module.split(".")[0] == "fusegraph":
                targets = [node.module.split(".")[1:]]
            else:
                continue
        elif isinstance(node, ast.Import):
            targets = [a.name.split(".")[1:] for a in node.names if a.name.split(".")[0] == "fusegraph"]
        else:
            continue
        for t in targets:
            if t:
                found.add(t[0])
    found.discard(_unit(path))
    return found


# No known exception: subgraph attributes are ir.Graph from import on (FlexAttention's
# modifiers included), and control flow gets its body runner injected by the runtime.
KNOWN: set[str] = set()
MODULES = sorted(p for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("unit", sorted(FORBIDDEN))
def test_no_backward_imports(unit):
    bad = []
    for path in MODULES:
        if _unit(path) == unit:
            for target in _imports(path, top_level_only=False) & FORBIDDEN[unit]:
                bad.append(f"{path.relative_to(ROOT)} imports {target}")
    assert set(bad) <= KNOWN, "\n".join(sorted(set(bad) - KNOWN))


def test_no_import_cycle_between_units():
    edges: dict[str, set[str]] = {}
    for path in MODULES:
        if path.name != "__init__.py" or len(path.relative_to(ROOT).parts) > 1:
            edges.setdefault(_unit(path), set()).update(_imports(path, top_level_only=True))
    edges.pop("__init__", None)
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(u: str) -> None:
        state[u] = 1
        stack.append(u)
        for v in sorted(edges.get(u, ())):
            if v not in edges:
                continue
            if state.get(v) == 1:
                cycle = stack[stack.index(v):] + [v]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if v not in state:
                visit(v)
        stack.pop()
        state[u] = 2

    for u in sorted(edges):
        if u not in state:
            visit(u)
