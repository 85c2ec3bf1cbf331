"""Every script in ``benchmarks/`` still starts: run in this process with ``--help`` (its
imports, its argument parser), it prints its usage and exits 0 (a module the scripts share,
with no ``__main__``, imports); and every fusegraph import in
the Python it hands a child process (``python -c SCRIPT``) names a module and names that exist.
A benchmark whose imports a refactor broke fails here, not on the next timing run.
Nothing is measured or compiled: ``--help`` exits while the arguments are parsed.
"""
from __future__ import annotations

import ast
import importlib
import runpy
import sys
from pathlib import Path

import pytest

BENCHMARKS = sorted((Path(__file__).resolve().parents[1] / "benchmarks").glob("*.py"))


def test_the_benchmarks_are_found():
    assert len(BENCHMARKS) >= 20, BENCHMARKS


@pytest.mark.parametrize("path", BENCHMARKS, ids=lambda p: p.name)
def test_help_prints_the_usage_and_exits_0(path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(path), "--help"])
    monkeypatch.setattr(sys, "path", list(sys.path))       # scripts put their own folders first
    if '__name__ == "__main__"' not in path.read_text():   # a module the scripts share: it imports
        runpy.run_path(str(path), run_name=path.stem)
        return
    with pytest.raises(SystemExit) as stop:
        runpy.run_path(str(path), run_name="__main__")
    out = capsys.readouterr().out
    assert stop.value.code in (0, None), f"{path.name} --help exited with {stop.value.code}\n{out}"
    assert out.startswith("usage: "), f"{path.name} --help printed no usage:\n{out}"


def _child_scripts(path: Path) -> list[ast.Module]:
    """The string constants of ``path`` that are Python importing fusegraph (a child's code)."""
    scripts = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "fusegraph" in node.value:
            try:
                tree = ast.parse(node.value)
            except SyntaxError:
                continue                                   # prose, or a template filled in later
            if any(isinstance(n, (ast.Import, ast.ImportFrom)) for n in ast.walk(tree)):
                scripts.append(tree)
    return scripts


def _missing(tree: ast.Module) -> list[str]:
    missing = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            wanted = [(a.name, None) for a in node.names if a.name.split(".")[0] == "fusegraph"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "fusegraph":
            wanted = [(node.module, a.name) for a in node.names]
        else:
            continue
        for module, name in wanted:
            try:
                mod = importlib.import_module(module)
            except ImportError:
                missing.append(module)
                continue
            if name is not None and not hasattr(mod, name):
                try:
                    importlib.import_module(f"{module}.{name}")
                except ImportError:
                    missing.append(f"{module}.{name}")
    return missing


CHILDREN = [(p, i, tree) for p in BENCHMARKS for i, tree in enumerate(_child_scripts(p))]


@pytest.mark.parametrize("path,index,tree", CHILDREN, ids=[f"{p.name}[{i}]" for p, i, _ in CHILDREN])
def test_a_child_scripts_fusegraph_imports_exist(path, index, tree):
    assert not _missing(tree), f"{path.name}'s child script {index} imports what does not exist"
