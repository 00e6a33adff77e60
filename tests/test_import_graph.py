"""No import cycle among the modules of ``grpo/`` and ``app/``, every import statement counted.

Each module's import statements are read with ``ast``: those at module level and those inside functions
(an import moved into a function to dodge a cycle still makes one: the two modules still need each other).
Imports under ``if TYPE_CHECKING:`` are left out: they never run, so they cannot make a cycle at import time.
An edge goes to the module an import names: ``import grpo.a.b`` to ``grpo.a.b``; ``from grpo.a import b``
to ``grpo.a``, and to ``grpo.a.b`` too when that is a module (``grpo/a/__init__.py`` runs first and is read
for ``b``); ``from grpo import x`` to ``grpo.x`` when ``x`` is a module, else to ``grpo``. The parents that
``import grpo.a.b`` runs first, and the top packages ``grpo`` and ``app`` before a submodule, are not edges:
``grpo/__init__.py`` imports the whole library for its users, so each would join every module to it, a
dependency of the import system, not of the code.
"""

from __future__ import annotations

import ast
from pathlib import Path

from api_fixtures import ROOT

PACKAGES = ("grpo", "app")


def module_names() -> dict[str, Path]:
    """Dotted name -> file, for every module and package of grpo/ and app/."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement under ``tree``, at any depth, except those in ``if TYPE_CHECKING:`` blocks."""
    found: list[ast.Import | ast.ImportFrom] = []
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, ast.Import | ast.ImportFrom):
            found.append(child)
        elif isinstance(child, ast.If) and _is_type_checking(child):
            found += [n for branch in child.orelse for n in import_nodes(ast.Module([branch], []))]
        else:
            found += import_nodes(child)
    return found


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The module ``from ... import`` names, relative imports resolved against ``module``."""
    if not node.level:
        return node.module or ""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    base = parts[: len(parts) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def edges(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of grpo/ and app/ that ``module``'s import statements name."""
    targets: set[str] = set()
    for node in import_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets |= {alias.name for alias in node.names}
            continue
        source = _absolute(node, module, path.name == "__init__.py")
        named = {f"{source}.{alias.name}" for alias in node.names}
        targets |= named & known.keys()
        if source not in PACKAGES or named - known.keys():  # a subpackage's __init__, or a name a module defines
            targets.add(source)
    return {t for t in targets if t in known and t != module}


def import_graph() -> dict[str, set[str]]:
    known = module_names()
    return {module: edges(module, path, known) for module, path in known.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle as a path that ends where it starts, or [] when there is none (depth-first search)."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" once every path from it is seen
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = "done"
        path.pop()
        return []

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return []


def test_grpo_and_app_have_no_import_cycle() -> None:
    graph = import_graph()
    assert {"grpo", "grpo.loss", "grpo.capture.trl_hooks", "app.main"} <= set(graph)  # the scan saw both trees
    assert "grpo.config" in graph["grpo.loss"]
    cycle = find_cycle(graph)
    assert cycle == [], "import cycle: " + " -> ".join(cycle)


def test_function_level_imports_count_and_type_checking_ones_do_not(tmp_path: Path) -> None:
    (tmp_path / "grpo").mkdir()
    source = tmp_path / "grpo" / "a.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "from . import b\n"
        "if TYPE_CHECKING:\n    from grpo.c import C\n"
        "def f():\n    from grpo.d import e\n    import grpo.f\n"
    )
    known = {name: tmp_path for name in ("grpo", "grpo.a", "grpo.b", "grpo.c", "grpo.d", "grpo.d.e", "grpo.f")}
    # ``from . import b`` is the module grpo.b (the top package is no edge); ``from grpo.d import e`` both the
    # package grpo.d (its __init__ runs and is read for e) and the module grpo.d.e; grpo.c only for a type checker
    assert edges("grpo.a", source, known) == {"grpo.b", "grpo.d", "grpo.d.e", "grpo.f"}
    source.write_text("from grpo import b, g\nimport grpo.d.e as e\n")  # g: a name grpo/__init__.py defines
    assert edges("grpo.a", source, known) == {"grpo", "grpo.b", "grpo.d.e"}


def test_the_search_finds_a_cycle_and_names_it() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"b", "d"}, "d": set()}) == ["b", "c", "b"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []  # a diamond is no cycle


def test_no_module_registers_a_preset_as_it_is_imported() -> None:
    """The preset table is built whole by grpo.presets: no module of grpo/ or app/ adds to it when imported
    (a preset registered at import would make the table depend on which modules were imported first)."""
    found = []
    for module, path in module_names().items():
        for statement in ast.parse(path.read_text(), str(path)).body:
            if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            calls = [n for n in ast.walk(statement) if isinstance(n, ast.Call)]
            names = {getattr(c.func, "id", getattr(c.func, "attr", "")) for c in calls}
            if "register_preset" in names:
                found.append(f"{module}:{statement.lineno}")
    assert found == []
    from grpo.config import PRESETS
    from grpo.presets import PRESETS as BUILT

    assert PRESETS is BUILT and {"article", "trl-dapo", "verl-grpo"} <= set(BUILT)
