"""The page's modules keep one place for each job (read from their source, the way a reviewer would):
every request goes through static/js/api.js, every figure is built in static/js/charts/ (one module per
view, imported by that view only, on one base layout) and drawn by dom.js's one drawing call, only
state.js loads a batch into the state and holds the page's state (no other module keeps a store, no
window global but main.js's one debug handle), and no module passes 600 lines. The npm lock that
ESLint and Prettier come from is pinned and hashed."""

from __future__ import annotations

import json
import posixpath
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
JS = ROOT / "static" / "js"
MODULES = sorted(JS.rglob("*.js"))
CHARTS = JS / "charts"
MAX_LINES = 600


def _name(path: Path) -> str:
    """The module's path under static/js (charts/base.js)."""
    return path.relative_to(JS).as_posix()


def _code(path: Path) -> str:
    """The module without its comments (a comment may name what the code must not do)."""
    text = re.sub(r"/\*.*?\*/", "", path.read_text(), flags=re.S)
    return re.sub(r"(^|[^:\"'`])//.*", r"\1", text)


def _offenders(pattern: str, allowed: set[str]) -> dict[str, list[str]]:
    found = {_name(p): re.findall(pattern, _code(p)) for p in MODULES if _name(p) not in allowed}
    return {name: hits for name, hits in found.items() if hits}


def test_the_scan_sees_the_modules() -> None:
    names = {_name(p) for p in MODULES}
    assert {"api.js", "charts/base.js", "dom.js", "state.js", "main.js", "lab.js", "runs.js"} <= names
    # the patterns below do match where the code is allowed to be
    assert re.search(r"\bfetch\(", _code(JS / "api.js")) and re.search(r"\bEventSource\(", _code(JS / "api.js"))
    assert re.search(r"Plotly\.react\(", _code(JS / "dom.js"))
    assert re.search(r"\blayout\s*:", _code(CHARTS / "heatmaps.js"))


def test_every_request_goes_through_api_js() -> None:
    assert _offenders(r"\bfetch\(|\bEventSource\(|XMLHttpRequest|navigator\.sendBeacon", {"api.js"}) == {}


def test_every_figure_is_built_in_the_charts_folder_and_drawn_one_way() -> None:
    # one drawing call (dom.js plot: Plotly.react); lab.js only adds, extends and renames traces of
    # figures drawn that way, and every trace it adds comes from charts/lab.js
    assert _offenders(r"Plotly\.(?:newPlot|react|plot|update|relayout)\b", {"dom.js"}) == {}
    figure_parts = r"\b(?:layout|xaxis\d*|yaxis\d*|margin|legend|marker|colorscale|hovertemplate|barmode)\s*:"
    charts = {_name(p) for p in CHARTS.glob("*.js")}
    assert _offenders(figure_parts, charts) == {}
    # one base layout: the font and the margins are written once
    assert [_name(p) for p in MODULES if re.search(r"\bfamily\s*:", _code(p))] == ["charts/base.js"]
    bases = {_name(p): len(re.findall(r"\bconst base\s*=", _code(p))) for p in CHARTS.glob("*.js")}
    assert {name: n for name, n in bases.items() if n} == {"charts/base.js": 1}


def test_each_view_owns_its_figures() -> None:
    # a view's chart module is imported by that view's module alone; the base layout only by chart modules
    importers: dict[str, set[str]] = {}
    for path in MODULES:
        for target in re.findall(r"""\bfrom\s+["']([^"']+)["']""", _code(path)):
            imported = (path.parent / target).resolve()
            if imported.parent == CHARTS:
                importers.setdefault(_name(imported), set()).add(_name(path))
    views = {_name(p) for p in CHARTS.glob("*.js")} - {"charts/base.js"}
    assert set(importers) == views | {"charts/base.js"}, importers
    assert {m: len(who) for m, who in importers.items() if m in views} == dict.fromkeys(views, 1), importers
    assert all(who.startswith("charts/") for who in importers["charts/base.js"]), importers["charts/base.js"]


def test_the_page_state_lives_in_state_js() -> None:
    # no module keeps state of its own at module level: no top-level let or var, no top-level Map, Set or
    # array that is written to (a constant Set is a lookup table), no module-level hooks; state.js holds it all
    assert _offenders(r"(?m)^(?:export )?(?:let|var)\s+\w+", set()) == {}
    written = {}
    for path in MODULES:
        code = _code(path)
        containers = re.findall(r"(?m)^(?:export )?const (\w+) = (?:new (?:Map|Set|WeakMap)\(|\[\])", code)
        hits = [n for n in containers if re.search(rf"\b{n}\.(?:set|add|delete|clear|push|splice)\(", code)]
        if hits and _name(path) != "state.js":
            written[_name(path)] = hits
    assert written == {}
    assert _offenders(r"\bhooks\b", set()) == {}
    # one window global, the debug handle main.js sets for the tests and the benchmark
    assert _offenders(r"\bwindow\.\w+\s*=(?!=)", {"main.js"}) == {}
    assert re.findall(r"\bwindow\.(\w+)\s*=(?!=)", _code(JS / "main.js")) == ["grpoLens"]


def test_no_module_passes_600_lines() -> None:
    sizes = {_name(p): len(p.read_text().splitlines()) for p in MODULES}
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}


def test_only_state_js_loads_a_batch() -> None:
    # state.input, the uploaded file, the origin and the scenario change only in state.js (its `load`)
    pattern = r"state\.(?:input|scenario|ui\.uploadFile|ui\.origin)\s*=(?!=)"
    assert _offenders(pattern, {"state.js"}) == {}


def test_no_module_matches_the_servers_sentences() -> None:
    # the server's explanation is shown as it is, and found by explanation_keys, never by its words
    assert _offenders(r"explanation\.(?:find|filter|some|findIndex)\(", set()) == {}


def test_the_npm_lock_is_exact_and_hashed() -> None:
    manifest = json.loads((ROOT / "package.json").read_text())
    assert set(manifest) >= {"devDependencies"} and "dependencies" not in manifest
    pins = manifest["devDependencies"]
    assert set(pins) == {"eslint", "@eslint/js", "globals", "prettier"}
    assert all(re.fullmatch(r"\d+\.\d+\.\d+", v) for v in pins.values()), pins
    lock = json.loads((ROOT / "package-lock.json").read_text())
    assert lock["packages"][""]["devDependencies"] == pins
    packages = {k: v for k, v in lock["packages"].items() if k}
    assert packages, "an empty lock"
    for name, entry in packages.items():
        if entry.get("link"):
            continue
        assert entry.get("dev") is True, name  # nothing of it is a runtime dependency
        assert str(entry.get("integrity", "")).startswith("sha512-"), name
    for name, version in pins.items():
        assert packages[f"node_modules/{name}"]["version"] == version


def test_make_lint_runs_eslint_and_prettier() -> None:
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^lint:.*?\n((?:\t.*\n)+)", makefile, flags=re.M)
    assert recipe is not None and "$(NODE_STAMP)" in recipe.group(0).splitlines()[0]
    assert "eslint" in recipe.group(1) and "prettier --check" in recipe.group(1)
    assert re.search(r"npm ci --ignore-scripts --no-audit --no-fund", makefile)
    assert "node_modules/" in (ROOT / ".gitignore").read_text().split()


def test_the_dashboard_preloads_every_module_its_entry_imports() -> None:
    """index.html names every module main.js reaches (imports of imports included) in a modulepreload: the browser
    then fetches them all at once. A module left out is found only once the module importing it has been parsed,
    a serial step on every navigation before the first view (live.js, imported by runs.js, was one)."""
    html = (ROOT / "templates" / "index.html").read_text()
    preloaded = set(re.findall(r'<link rel="modulepreload" href="/static/js/([^"]+)">', html))
    reached, todo = set(), ["main.js"]
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            for spec in re.findall(r'^\s*import\b[^;]*?from\s+"(\.[^"]+)"', _code(JS / name), flags=re.M):
                todo.append(posixpath.normpath(posixpath.join(posixpath.dirname(name), spec)))  # charts/../dom.js
    assert {"runs.js", "live.js", "charts/base.js"} <= reached  # the scan follows nested imports
    assert reached - {"main.js"} - preloaded == set()
