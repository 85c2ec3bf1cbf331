"""The house's layering, read from the imports of every module under ``src/fusegraph``.

Folders by role, imports only downward (docs/architecture.md):

    cli  ->  tools, serve, testing  ->  compiler  ->  frontends, passes, plan, runtime, artifact
         ->  ops  ->  ir;   report, errors, config, config_file below all of them

Imports inside functions count too (a lazy import is still a dependency), and so do imports
under ``TYPE_CHECKING``. Among the middle layer's siblings some directions are forbidden as
well (the runtime never calls a pass, a pass never imports the runtime, the planner never the
runtime or a pass, the artifact never a frontend or a pass). No two modules import each other,
directly or round a circle, except inside ``ir/`` (its graph, nodes, printer, verifier and
subgraphs are one data structure). The package root holds only ``__init__.py``, ``errors.py``,
``config.py``, ``config_file.py`` and folders, and no module imports another module's
``_private`` name (a name that two modules need is the first one's public interface).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import fusegraph

ROOT = Path(fusegraph.__file__).parent
RANK = {    # a unit may import units of a lower rank, and siblings of its own rank unless FORBIDDEN
    "cli": 6,
    "tools": 5, "serve": 5, "testing": 5,
    "compiler": 4,
    "frontends": 3, "passes": 3, "plan": 3, "runtime": 3, "artifact": 3,
    "ops": 2,
    "ir": 1,
    "report": 0, "errors": 0, "config": 0, "config_file": 0,
}
FORBIDDEN = {   # same-rank directions that would run data backwards
    "runtime": {"frontends", "passes", "artifact"},
    "passes": {"runtime", "artifact", "frontends"},
    "plan": {"runtime", "artifact", "frontends", "passes"},
    "artifact": {"frontends", "passes"},
    "frontends": {"runtime", "passes", "artifact", "plan"},
    "serve": {"tools", "testing"},
    "config": {"config_file"},
}
ROOT_FILES = {"__init__.py", "errors.py", "config.py", "config_file.py"}
MODULES = sorted(p for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts)


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


NAMES = {_module(p): p for p in MODULES}


def _unit(module: str) -> str:
    return module.split(".")[0] if module else ""


def _imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(imported fusegraph module, names imported from it, line) for every import statement of
    the module at ``path``, wherever it stands (functions and ``TYPE_CHECKING`` blocks too);
    ``from package import submodule`` counts as an import of the submodule."""
    tree = ast.parse(path.read_text(), str(path))
    here = _module(path).split(".") if _module(path) else []
    package = here if path.name == "__init__.py" else here[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                target = ".".join(base + (node.module.split(".") if node.module else []))
            elif node.module and node.module.split(".")[0] == "fusegraph":
                target = ".".join(node.module.split(".")[1:])
            else:
                continue
            names = [a.name for a in node.names]
            subs = [f"{target}.{n}" if target else n for n in names]
            for sub, name in zip(subs, names):
                if sub in NAMES:
                    out.append((sub, [], node.lineno))
                else:
                    out.append((target, [name], node.lineno))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "fusegraph":
                    out.append((".".join(a.name.split(".")[1:]), [], node.lineno))
    return out


def test_every_unit_has_a_rank():
    units = {_unit(_module(p)) for p in MODULES} - {""}
    assert units <= set(RANK), f"units without a place in the layering: {sorted(units - set(RANK))}"


def test_package_root_holds_only_the_entry_points_and_folders():
    loose = sorted(p.name for p in ROOT.glob("*.py") if p.name not in ROOT_FILES)
    assert not loose, f"modules at the package root (move them into the folder of their role): {loose}"


@pytest.mark.parametrize("unit", sorted(RANK))
def test_no_import_runs_up_the_layers(unit):
    bad = []
    for path in MODULES:
        module = _module(path)
        if _unit(module) != unit:
            continue
        for target, _names, line in _imports(path):
            to = _unit(target)
            if not to or to == unit:      # the package root (its public API re-exports) is checked below
                continue
            if RANK[to] > RANK[unit] or to in FORBIDDEN.get(unit, ()):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not bad, "\n".join(bad)


def test_only_the_top_layers_use_the_public_api_module():
    """``import fusegraph`` (the package root re-exports the compiler) from below the compiler
    would be an upward import in disguise."""
    bad = [f"{p.relative_to(ROOT)}:{line}" for p in MODULES for target, _n, line in _imports(p)
           if target == "" and RANK.get(_unit(_module(p)), 0) <= RANK["compiler"] and _module(p)]
    assert not bad, "modules below the compiler import the package root: " + ", ".join(bad)


def test_no_import_circle_between_modules():
    edges: dict[str, set[str]] = {}
    for path in MODULES:
        module = _module(path)
        for target, _names, _line in _imports(path):
            if target != module and target in NAMES:
                edges.setdefault(module, set()).add(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:      # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 and not all(m.startswith("ir.") for m in component):
                circles.append(sorted(component))

    for v in sorted(NAMES):
        if v not in index:
            visit(v)
    assert not circles, "modules importing each other (extract what they share): " + "; ".join(
        " <-> ".join(c) for c in circles)


def test_no_module_imports_another_modules_private_names():
    bad = []
    for path in MODULES:
        for target, names, line in _imports(path):
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if private:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {', '.join(private)} from {target or 'fusegraph'}")
    assert not bad, "\n".join(bad)
