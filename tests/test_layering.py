"""Layers point one way: ``app`` uses ``grpo``, never the reverse, and the library needs no web package.

The import statements are read the way a reader would, every one of them (module level, inside functions,
under ``if TYPE_CHECKING``), so an import moved into a function to dodge the rule still counts. A second
test runs the library in a fresh interpreter where the web stack cannot be imported at all: what a team
gets when it installs ``grpo`` into its training environment without the server's extra.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from api_fixtures import ROOT, ragged_body

# The server's packages: the library must work where none of them is installed.
WEB = ("app", "fastapi", "starlette", "uvicorn", "pydantic", "pydantic_settings", "jinja2", "plotly", "httpx")


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every import statement in ``path``; relative imports resolve inside grpo."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.lineno, "grpo" if node.level else node.module or ""))
    return found


def test_the_library_imports_nothing_from_the_app_or_the_web_stack() -> None:
    files = sorted((ROOT / "grpo").rglob("*.py"))
    assert len(files) > 20  # the scan saw the library, not an empty folder
    offending = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in files
        for line, module in imported_modules(path)
        if module.split(".")[0] in WEB
    ]
    assert offending == []


def test_the_scan_sees_imports_inside_functions(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from app.responses import dumps\n    import fastapi.routing\n")
    assert imported_modules(source) == [(2, "app.responses"), (3, "fastapi.routing")]


BLOCK_WEB = f"""
import sys
class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {WEB!r}:
            raise ImportError(f"{{name}} is not installed in this environment")
sys.meta_path.insert(0, Blocked())
"""


def test_the_library_and_its_cli_work_without_the_web_stack(tmp_path: Path) -> None:
    batch = tmp_path / "batch.json"
    batch.write_text(json.dumps(ragged_body(1)))
    script = BLOCK_WEB + (
        "import grpo, grpo.capture, grpo.check, grpo.lab\n"
        "from grpo.__main__ import main\n"
        f"raise SystemExit(main(['eval', {str(batch)!r}, '--json']))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout)
    # loss = policy_loss + kl_loss, each a float32 sum: equal to round-off of the larger part
    parts = answer["policy_loss"] + answer["kl_loss"]
    assert abs(answer["loss"] - parts) <= 1e-6 * max(1.0, abs(answer["policy_loss"]), abs(answer["kl_loss"]))
    assert len(answer["tokens"]["ratio"]) == len(ragged_body(1)["per_token_logps"])


def app_imports() -> dict[str, set[str]]:
    """app module -> the app modules its import statements name (``from app import x`` included)."""
    graph: dict[str, set[str]] = {}
    for path in sorted((ROOT / "app").glob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == "app":
                names |= {f"app.{alias.name}" for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("app."):
                names.add(str(node.module))
            elif isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names if alias.name.startswith("app.")}
        graph[f"app.{path.stem}"] = names
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One path per module that leads back to itself (depth-first from each module)."""
    found = []
    for start in sorted(graph):
        stack = [(start, [start])]
        seen: set[str] = set()
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph.get(node, ())):
                if nxt == start:
                    found.append([*path, start])
                    stack.clear()
                    break
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
    return found


def test_the_app_modules_form_no_import_cycle() -> None:
    graph = app_imports()
    assert graph.get("app.main")  # the scan saw the app
    assert cycles(graph) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [
        ["a", "b", "c", "a"],
        ["b", "c", "a", "b"],
        [
            "c",
            "a",
            "b",
            "c",
        ],
    ]


def test_no_private_name_is_imported_across_modules() -> None:
    private = [
        f"{path.relative_to(ROOT)}:{node.lineno} imports {node.module}.{alias.name}"
        for folder in ("app", "grpo")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("app", "grpo")
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__")
    ]
    assert private == []


# The page's view-model (grpo.view) and the names its modules were imported by before it had a package.
VIEW_MODULES = ("answer", "explain", "glossary", "curves", "pooling", "examples", "experiments", "token_fields")
VIEW = {"grpo.view", *(f"grpo.{m}" for m in VIEW_MODULES)}
# What may read the view: the view itself, its old names, and what shows a breakdown (the CLI, the HTML report).
VIEW_READERS = {"__main__.py", "report.py", "report_figures.py", *(f"{m}.py" for m in VIEW_MODULES)}


def view_imports(path: Path) -> list[str]:
    """The view modules ``path``'s import statements name (``from grpo import answer`` included)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import | ast.ImportFrom) else []
        if isinstance(node, ast.ImportFrom) and node.module in ("grpo", "grpo.view"):
            names = [f"{node.module}.{name}" for name in names]
        if isinstance(node, ast.ImportFrom):
            names.append(node.module or "")
        found += [n for n in names if any(n == v or n.startswith(f"{v}.") for v in VIEW)]
    return found


def test_the_math_never_imports_the_view() -> None:
    grpo = ROOT / "grpo"
    math = [p for p in sorted(grpo.rglob("*.py")) if "view" not in p.relative_to(grpo).parts[:1]]
    math = [p for p in math if p.parent != grpo or p.name not in VIEW_READERS]
    assert {"loss.py", "objectives.py", "advantages.py", "config.py"} <= {p.name for p in math}
    offending = [f"{p.relative_to(ROOT)} imports {m}" for p in math for m in view_imports(p)]
    assert offending == []


def test_the_view_scan_sees_every_form(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "import grpo.loss\nfrom grpo import answer, loss\nfrom grpo.view.pooling import pool_factors\n"
        "def f():\n    import grpo.explain\n"
    )
    assert sorted(view_imports(source)) == ["grpo.answer", "grpo.explain", "grpo.view.pooling"]
