"""The Lab view in real headless Chromium: before any run, one line says what a run draws and no empty
chart is on the page; a run grows its charts from the event stream; a click on a point opens that step's
batch in the breakdown views; a canned comparison overlays two runs named by what differs; clearing the
runs takes their charts away again. Every wait is a condition polled in the page with a deadline (a
deadline guards against a hang, it is not a timing). Screenshots go to test-artifacts/ (look at them)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_lab_server import lab_server

import grpo
from grpo.lab import LabConfig
from grpo.lab.train import train
from grpo.runs import RunWriter

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed")
playwright_api = pytest.importorskip("playwright.sync_api")
expect = playwright_api.expect


def wait_for(page: Any, expression: str, timeout: float = 60_000) -> None:
    """Until the JS expression is truthy, evaluated every 100 ms; raises after `timeout` ms. (Not
    page.wait_for_function: it evals its predicate in the page, which the page's CSP refuses.)"""
    deadline = time.monotonic() + timeout / 1000
    while not page.evaluate(expression):
        if time.monotonic() > deadline:
            raise TimeoutError(f"still false after {timeout / 1000:g} s: {expression}")
        page.wait_for_timeout(100)


def shoot(page: Any, selector: str, name: str) -> None:
    """A picture of a whole section. Off-screen sections skip rendering (`.view` has content-visibility:
    auto): a section taller than the window comes out blank below the fold, and the sections above it
    change size as they render, which moves it. So, for the picture only, every section renders (and the
    sticky top bar stays at the top, not over the section), and the picture waits for two frames painted
    with that layout."""
    style = page.add_style_tag(
        content=".view { content-visibility: visible !important; } .topbar { position: static !important; }"
    )
    page.locator(selector).scroll_into_view_if_needed()
    page.evaluate("() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))")
    page.locator(selector).screenshot(path=str(ARTIFACTS / name))
    style.evaluate("(node) => node.remove()")


def scroll_through_lab(page: Any, runs: int) -> None:
    """Each lab chart scrolled to in turn, as a reader would, until it holds every run (a chart is drawn
    when it is on screen: the picture of the whole section then shows them all)."""
    for chart in page.evaluate("[...document.querySelectorAll('#lab-charts .lab-chart')].map((n) => n.id)"):
        page.evaluate(f"document.getElementById('{chart}').scrollIntoView({{block: 'center'}})")
        wait_for(page, f"document.getElementById('{chart}').data?.length >= {runs}", 60_000)


def points(page: Any, chart: str) -> int:
    return int(page.evaluate(f"document.getElementById('{chart}').data.reduce((n, t) => n + t.x.length, 0)"))


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def url(runs_dir: Path) -> Iterator[str]:
    with lab_server(runs_dir) as (base, _):
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
        ARTIFACTS.mkdir(exist_ok=True)
        pg.goto(f"{url}/#view-lab")
        wait_for(pg, "document.body.dataset.lab === 'ready'", 120_000)
        yield pg
        assert not errors, errors
        assert not [u for u in outside if not u.startswith("data:")], outside
        browser.close()


def test_before_any_run_a_line_says_what_comes_and_no_empty_chart_is_drawn(page: Any) -> None:
    metrics = page.evaluate("window.grpoLens.state.ui.lab.info.metrics.length")
    assert metrics > 10  # the trainers' logged metrics, one chart each once a run exists
    expect(page.locator("#lab-empty")).to_be_visible()
    assert f"the {metrics} metrics, one chart each" in page.text_content("#lab-empty")
    assert page.locator("#lab-charts *").count() == 0
    assert page.locator("#view-lab .js-plotly-plot").count() == 0
    shoot(page, "#view-lab", "lab-empty.png")


def test_a_run_grows_its_charts_and_a_point_opens_the_step(page: Any) -> None:
    # The lab's top in view: the reward chart is on screen, the last metric's chart far below it.
    page.evaluate("window.scrollTo(0, document.getElementById('view-lab').offsetTop)")
    last = page.evaluate("'lab-chart-' + window.grpoLens.state.ui.lab.info.metrics.at(-1).replace(/[^a-z0-9]+/gi, '-')")
    # The reward chart's and the last chart's point counts at every frame that draws steps (the lab
    # counts its points on <body> once per frame): recorded in the page, so no frame is missed.
    page.evaluate(
        """(last) => {
        window.seenPoints = [];
        const count = (id) => (document.getElementById(id).data || []).reduce((n, t) => n + t.x.length, 0);
        new MutationObserver(() => window.seenPoints.push([count('lab-chart-reward'), count(last)]))
            .observe(document.body, { attributes: true, attributeFilter: ['data-lab-points'] });
    }""",
        last,
    )
    page.fill("#lab-steps", "40")
    page.fill("#lab-seed", "2")
    page.click("#lab-start")
    expect(page.locator("#lab-empty")).to_be_hidden(timeout=60_000)
    wait_for(page, "!!document.querySelector('#lab-runs li[data-status=done]')", 300_000)
    reward_seen = [r for r, _ in page.evaluate("window.seenPoints")]
    assert reward_seen == sorted(reward_seen)  # only ever appended to
    assert any(0 < n < 40 for n in reward_seen), reward_seen  # drawn while it trained, not at the end
    assert points(page, "lab-chart-reward") == 40
    assert points(page, "lab-overlay") == 80  # reward and loss
    # The chart off screen was never drawn while the run trained; scrolled to, it shows every step.
    assert {n for _, n in page.evaluate("window.seenPoints")} == {0}
    for chart in (last, "lab-chart-kl"):
        page.locator(f"#{chart}").scroll_into_view_if_needed()
        wait_for(page, f"document.getElementById('{chart}').data?.[0]?.x.length === 40", 60_000)
    scroll_through_lab(page, 1)
    shoot(page, "#view-lab", "lab-run.png")

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
    shoot(page, "#view-heatmaps", "lab-opened-step.png")


def test_a_comparison_overlays_runs_named_by_what_differs(page: Any) -> None:
    page.click("#lab-comparisons button[data-comparison=kl-leash]")
    assert "kl grows" in page.text_content("#lab-watch-text")
    expect(page.locator("#lab-runs li")).to_have_count(2, timeout=60_000)
    kl = "document.getElementById('lab-chart-kl')"
    wait_for(page, f"{kl} && {kl}.data && {kl}.data.length === 2", 60_000)  # the second run's traces added
    names = page.evaluate(f"{kl}.data.map((t) => t.name)")
    assert names == ["beta=0", "beta=0.04"]
    wait_for(page, f"{kl}.data.every((t) => t.x.length >= 5)", 240_000)
    scroll_through_lab(page, 2)
    shoot(page, "#view-lab", "lab-comparison.png")
    # The form shows what ran (the last run: the article's preset with beta 0.04), not its defaults.
    assert page.input_value("#lab-overrides") == '{"beta":0.04}'
    assert page.input_value("#lab-preset") == "article" and page.input_value("#lab-steps") == "150"

    # Reloaded, the page draws both runs again (the link holds them), named as before, with the watch text.
    ids = page.evaluate("window.grpoLens.state.ui.lab.runs.map((r) => r.id)")
    assert page.evaluate("location.hash") == f"#lab={'%2C'.join(ids)}&comparison=kl-leash"
    page.reload()
    wait_for(page, "document.body.dataset.labRestored === '2'", 120_000)
    # Reopened at the lab's top, the charts on screen are drawn with both runs, each by one Plotly.react
    # (both runs are on the page before the first frame draws); a chart far below is not drawn at all
    # until it is scrolled to (all 18 built, then each run's traces added and renamed one chart at a
    # time, held a reopened comparison's first point back: the reload figure of bench/page.py).
    page.evaluate("window.scrollTo(0, document.getElementById('view-lab').offsetTop)")
    overlay = "document.getElementById('lab-overlay')"
    wait_for(page, f"{overlay}.data?.length === 4 && {overlay}.data.every((t) => t.x.length >= 5)", 120_000)
    last = (
        "document.getElementById('lab-chart-'"
        " + window.grpoLens.state.ui.lab.info.metrics.at(-1).replace(/[^a-z0-9]+/gi, '-'))"
    )
    assert page.evaluate(f"{last}.getBoundingClientRect().top") > page.evaluate("innerHeight + 150")
    assert page.evaluate(f"{last}.data === undefined && !{last}.classList.contains('js-plotly-plot')")
    page.evaluate("window.scrollTo(0, 0)")  # away and back: the charts come into view
    page.evaluate("document.getElementById('lab-chart-kl').scrollIntoView()")
    wait_for(page, f"{kl}.data?.length === 2 && {kl}.data.every((t) => t.x.length >= 5)", 120_000)
    assert page.evaluate(f"{kl}.data.map((t) => t.name)") == ["beta=0", "beta=0.04"]
    assert "kl grows" in page.text_content("#lab-watch-text")
    assert page.input_value("#lab-overrides") == '{"beta":0.04}'
    scroll_through_lab(page, 2)
    shoot(page, "#view-lab", "lab-reloaded.png")
    page.click("#lab-clear")
    expect(page.locator("#lab-runs li")).to_have_count(0)
    assert page.locator("#lab-charts *").count() == 0  # no run, no chart: the line is back
    expect(page.locator("#lab-empty")).to_be_visible()


def test_a_saved_lab_run_opens_from_its_link(page: Any, url: str, runs_dir: Path) -> None:
    """A lab run this server process never ran (written before a restart): its link draws its charts from
    the saved run, every step, and the form shows what it ran."""
    config = LabConfig(task="count", steps=6, seed=3, num_iterations=2, loss=grpo.LossConfig.from_preset("article"))
    fields = config.to_dict()
    body = {k: v for k, v in fields.items() if k != "loss"} | {"config": fields["loss"]}
    writer = RunWriter(runs_dir / "saved-lab", "lab", config.loss, info={"lab": body, "status": "done"})
    train(config, writer)
    writer.close()
    page.goto(f"{url}/#lab=saved-lab")
    wait_for(page, "document.body.dataset.labRestored === '1'", 120_000)
    page.evaluate("window.scrollTo(0, document.getElementById('view-lab').offsetTop)")
    wait_for(page, "document.getElementById('lab-chart-reward').data?.[0]?.x.length === 6", 120_000)
    assert points(page, "lab-overlay") == 12  # reward and loss at each of the 6 steps
    assert page.input_value("#lab-steps") == "6" and page.input_value("#lab-iterations") == "2"
    assert page.input_value("#lab-seed") == "3" and page.input_value("#lab-task") == "count"
