"""The report of `python -m grpo report` in real headless Chromium, opened from its file with the network cut:
every chart it holds is drawn, nothing is requested beyond the file itself, and no script fails."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_browser import ARTIFACTS, CHROMIUM, browser  # noqa: F401 (browser is a fixture)
from test_report import FIGURES, write_run

from grpo.__main__ import main

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed")
DRAWN = "[...document.querySelectorAll('.js-plotly-plot')].filter((d) => d.querySelector('svg.main-svg g')).length"


def test_the_report_opens_offline_with_every_chart_drawn(browser: Any, tmp_path: Path) -> None:  # noqa: F811
    run = write_run(tmp_path, "differ", differ=6)
    out = tmp_path / "report.html"
    assert main(["report", str(run), "--html", str(out), "--jobs", "1"]) == 0
    (data,) = FIGURES.findall(out.read_text(encoding="utf-8"))
    charts = len(json.loads(data)["figures"])
    assert charts >= 4  # the loss, a series at least, two heatmaps of a worst step

    context = browser.new_context(viewport={"width": 1200, "height": 900}, offline=True)
    requested: list[str] = []
    errors: list[str] = []

    def only_the_file(route: Any) -> None:
        requested.append(route.request.url)
        if route.request.url.startswith("file://"):
            route.continue_()
        else:
            route.abort()

    context.route("**/*", only_the_file)
    page = context.new_page()
    page.on("request", lambda r: requested.append(r.url))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(out.as_uri())
    page.wait_for_function(f"{DRAWN} === {charts}", timeout=60_000)
    assert page.evaluate("document.querySelectorAll('.js-plotly-plot').length") == charts
    assert page.text_content("#verdict") == "differ"
    assert errors == []
    assert {u for u in requested if not u.startswith("file://")} == set(), requested
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
    context.close()
