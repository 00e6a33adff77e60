"""The Runs view before any run, in real headless Chromium: with an empty runs directory the view says in one line
what a run is and how to get one, and shows nothing that would act on a run (no status bar, chart, slider, timeline
control, anomaly sentence or replay); once a run is written (grpo.runs.RunWriter), the Runs tab or a reload brings
the whole view back and the run's charts are drawn. Screenshots in /tmp/shots_empty/."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_browser import CHROMIUM, Page, browser, serve  # noqa: F401 (browser is a fixture)
from test_run_events import tensors

import grpo
from grpo.runs import RunWriter

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed")
SHOTS = Path("/tmp/shots_empty")
RUNS_TAB = 'nav.viewnav a[href="#runs"]'
# what acts on a run or speaks of one: the step's status bar, the charts, the pickers, the timeline's controls,
# the anomalies' sentence and the replay line
OF_A_RUN = [
    "#run-select",
    "#run-step-story",
    "#run-info",
    "#run-loss",
    "#run-charts",
    "#run-step",
    "#run-micro",
    "#run-timeline",
    "#timeline-other",
    "#timeline-x",
    "#timeline-none",
    "#run-replay-preset",
    "#run-replay",
    "#run-replay-chart",
]
# every element of the view on screen, but the heading and the one line (and what the line holds)
SHOWN_BESIDES_THE_LINE = """[...document.querySelectorAll('#runs *')]
  .filter((e) => e.checkVisibility() && e.id !== 'runs-heading' && !e.closest('#runs-empty'))
  .map((e) => e.id || e.tagName)"""


@pytest.fixture(scope="module")
def empty_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    runs_dir = tmp_path_factory.mktemp("empty-runs")
    # no large-request worker: the page reads a small run (thread lane); a worker would import torch, unused
    for url in serve({"GRPO_LENS_RUNS_DIR": str(runs_dir), "GRPO_LENS_PROCESS_WORKERS": "0"}):
        yield url, runs_dir


def shoot(page: Page, name: str) -> None:
    SHOTS.mkdir(exist_ok=True)
    page.page.evaluate("document.getElementById('runs').scrollIntoView()")
    page.painted()  # the scroll's repaint
    page.page.screenshot(path=str(SHOTS / name), full_page=False)


def write_run(runs_dir: Path, steps: int) -> None:
    """A finished TRL run of ``steps`` one-micro-batch steps, as a capture writes it."""
    writer = RunWriter(runs_dir / "written", "trl", grpo.LossConfig.from_preset("trl-grpo"))
    for step in range(1, steps + 1):
        writer.write_step(step, 0, tensors(step), {})
    writer.close()
    writer.update(status="done")


def assert_the_run_is_shown(page: Page, steps: int) -> None:
    """The whole view back, the run opened: its loss chart and timeline drawn over its steps."""
    page.wait_for("document.getElementById('runs').dataset.count === '1'")
    assert not page.page.is_visible("#runs-empty")
    for selector in ("#run-select", "#run-step", "#run-micro", "#timeline-other", "#timeline-x", "#run-replay"):
        assert page.page.is_visible(selector), selector
    page.page.select_option("#run-select", "written")
    page.wait_for("document.getElementById('runs').dataset.step === '1'", timeout=120)
    page.wait_for("document.getElementById('run-timeline').dataset.open === 'written'", timeout=120)
    loss = page.page.evaluate("document.getElementById('run-loss').data.map(t => t.y.length)")
    assert loss[:2] == [steps, steps]  # the trainer's and the recomputed loss, a point per step
    timeline = page.page.evaluate("document.getElementById('timeline-loss').firstChild.data[0].x.length")
    assert timeline == steps
    assert page.page.is_visible("#run-step-story") and page.page.is_visible("#run-info")
    # the anomalies say what the timeline found: listed, or "None found" (never both)
    listed = page.page.locator("#timeline-anomalies li").count()
    assert page.page.is_visible("#timeline-none") == (listed == 0)


def test_no_run_says_what_a_run_is_and_shows_nothing_of_one(browser: Any, empty_runs: tuple[str, Path]) -> None:  # noqa: F811
    url, runs_dir = empty_runs
    page = Page(browser, url)
    try:
        page.open()
        page.wait_for("document.getElementById('runs').dataset.count === '0'")
        page.page.click(RUNS_TAB)
        shoot(page, "01-no-run.png")
        shown = [selector for selector in OF_A_RUN if page.page.is_visible(selector)]
        assert page.page.is_visible("#runs-empty"), f"no line saying what a run is; shown: {shown}"
        line = page.page.text_content("#runs-empty") or ""
        # what a run is, and each way the page and the package offer to get one (all of them exist)
        for named in ("A run is", "grpo.capture.trl", "grpo.capture.verl", "python -m grpo import", "the Lab"):
            assert named in line, named
        assert page.page.is_visible("#view-lab")  # the Lab it names is on the page
        assert shown == []
        assert page.page.evaluate(SHOWN_BESIDES_THE_LINE) == []
        assert "None found" not in (page.page.inner_text("#runs") or "")

        # a run written while the page is open: the Runs tab lists the runs again
        write_run(runs_dir, steps=3)
        page.page.click(RUNS_TAB)
        assert_the_run_is_shown(page, steps=3)
        shoot(page, "02-run-written-tab.png")
        # and a reload shows it as well
        page.open()
        page.page.click(RUNS_TAB)
        assert_the_run_is_shown(page, steps=3)
        shoot(page, "03-run-written-reload.png")
        assert page.errors == []
    finally:
        page.context.close()
