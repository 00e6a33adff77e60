"""The Lab view in real headless Chromium: start a run, watch its charts grow from the event stream,
click a point to open that step's batch in the breakdown views; a canned comparison overlays two
runs named by what differs. Screenshots go to test-artifacts/ (look at them)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_lab_server import lab_server

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed")
playwright_api = pytest.importorskip("playwright.sync_api")


def wait_for(page: Any, expression: str, timeout: float = 60_000) -> None:
    """Poll a JS expression until truthy (wait_for_function evals in the page: the CSP forbids it)."""
    deadline = time.monotonic() + timeout / 1000
    while not page.evaluate(expression):
        if time.monotonic() > deadline:
            raise TimeoutError(f"still false after {timeout / 1000:g} s: {expression}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with lab_server(tmp_path_factory.mktemp("runs")) as (base, _):
        yield base


@pytest.fixture(scope="module")
def page(url: str) -> Iterator[Any]:
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"],
        )
        pg = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        outside: list[str] = []
        pg.on("request", lambda r: outside.append(r.url) if not r.url.startswith(url) else None)
        pg.goto(f"{url}/#view-lab")
        wait_for(pg, "document.querySelectorAll('#lab-comparisons button').length >= 5", 120_000)
        yield pg
        assert not errors, errors
        assert not [u for u in outside if not u.startswith("data:")], outside
        browser.close()


def points(page: Any, chart: str) -> int:
    return int(page.evaluate(f"document.getElementById('{chart}').data.reduce((n, t) => n + t.x.length, 0)"))


def test_a_run_grows_its_charts_and_a_point_opens_the_step(page: Any) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.fill("#lab-steps", "40")
    page.fill("#lab-seed", "2")
    page.click("#lab-start")
    seen = []  # the reward chart's point count, polled while the run trains
    deadline = time.monotonic() + 300
    while not page.evaluate("!!document.querySelector('#lab-runs li[data-status=done]')"):
        seen.append(points(page, "lab-chart-reward"))
        assert time.monotonic() < deadline, seen
        time.sleep(0.05)
    assert seen == sorted(seen)  # only ever appended to
    assert any(0 < n < 40 for n in seen), seen  # drawn while it trained, not at the end
    assert points(page, "lab-chart-reward") == 40
    assert points(page, "lab-chart-kl") == 40
    assert points(page, "lab-overlay") == 80  # reward and loss
    page.locator("#view-lab").screenshot(path=str(ARTIFACTS / "lab-run.png"))

    # Click the 5th point of the reward chart: the step's batch becomes every view's input.
    drawn = int(page.evaluate("document.body.dataset.drawn || 0"))
    page.evaluate(
        """() => {
        const node = document.getElementById('lab-chart-reward');
        node.emit('plotly_click', { points: [{ data: node.data[0], x: node.data[0].x[4], pointIndex: 4 }] });
    }"""
    )
    wait_for(page, f"Number(document.body.dataset.drawn) > {drawn}", 60_000)
    opened = page.evaluate("window.grpoLens.last")
    assert len(opened["rows"]["loss"]) == 64  # 8 prompts x 8 completions
    assert "Step 5 of lab run" in page.text_content("#lab-opened")
    assert page.text_content("#scenario-title").endswith("step 5")
    page.locator("#view-heatmaps").screenshot(path=str(ARTIFACTS / "lab-opened-step.png"))


def test_a_comparison_overlays_runs_named_by_what_differs(page: Any) -> None:
    page.click("#lab-comparisons button[data-comparison=kl-leash]")
    assert "kl grows" in page.text_content("#lab-watch-text")
    wait_for(page, "document.querySelectorAll('#lab-runs li').length === 2", 60_000)
    names = page.evaluate("document.getElementById('lab-chart-kl').data.map((t) => t.name)")
    assert names == ["beta=0", "beta=0.04"]
    wait_for(page, "document.getElementById('lab-chart-kl').data.every((t) => t.x.length >= 5)", 240_000)
    page.locator("#view-lab").screenshot(path=str(ARTIFACTS / "lab-comparison.png"))
    page.click("#lab-clear")
    assert page.evaluate("document.getElementById('lab-chart-kl').data.length") == 0
