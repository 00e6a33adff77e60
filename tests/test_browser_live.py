"""A run watched live in real headless Chromium: the test writes a run's step files one by one (run.json status
"running") while the Runs view shows it, and each step appears in the timeline's charts and the step picker
without a reload, its values those of the timeline API; the stream ends when the run's status becomes "done".
Screenshots in /tmp/shots_live/."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_browser import CHROMIUM, Page, browser, serve  # noqa: F401 (browser is a fixture)
from test_run_events import tensors

import grpo
from grpo.runs import RunWriter

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed")
SHOTS = Path("/tmp/shots_live")
LOSS_TRACE = """(() => { const node = document.getElementById('timeline-loss')?.firstChild;
  const t = node?.data?.find((t) => t.name && t.name.startsWith('recomputed'));
  return t ? {x: Array.from(t.x), y: Array.from(t.y)} : null; })()"""


@pytest.fixture(scope="module")
def live_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    runs_dir = tmp_path_factory.mktemp("live-runs")
    env = {"GRPO_LENS_RUNS_DIR": str(runs_dir), "GRPO_LENS_PROCESS_WORKERS": "0", "GRPO_LENS_WATCH_INTERVAL": "0.2"}
    writer = RunWriter(runs_dir / "growing", "trl", grpo.LossConfig.from_preset("trl-grpo"))
    for step in (1, 2):
        writer.write_step(step, 0, tensors(step), {})
    for url in serve(env):
        yield url, runs_dir


def api_timeline(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/api/v1/runs/growing/timeline", timeout=60) as answer:
        return dict(json.load(answer))


def shoot(page: Page, name: str) -> None:
    SHOTS.mkdir(exist_ok=True)
    page.page.evaluate("document.getElementById('run-timeline').scrollIntoView()")
    page.painted()  # the scroll's repaint
    page.page.screenshot(path=str(SHOTS / name), full_page=False)


def test_a_run_written_step_by_step_is_drawn_as_it_grows(browser: Any, live_runs: tuple[str, Path]) -> None:  # noqa: F811
    url, runs_dir = live_runs
    writer = RunWriter(runs_dir / "growing", "trl", grpo.LossConfig.from_preset("trl-grpo"), resume=True)
    page = Page(browser, url)
    try:
        page.open()
        page.page.select_option("#run-select", "growing")
        page.wait_for("document.getElementById('run-timeline').dataset.live === 'running'", timeout=120)
        page.wait_for("document.getElementById('run-timeline').dataset.liveSteps === '2'")
        shoot(page, "01-live-two-steps.png")
        for step in range(3, 7):
            writer.write_step(step, 0, tensors(step), {})
            page.wait_for(f"document.getElementById('run-timeline').dataset.liveSteps === '{step}'")
            page.wait_for(f"({LOSS_TRACE})?.x.length === {step}")
            drawn = page.page.evaluate(LOSS_TRACE)
            answer = api_timeline(url)
            assert drawn["x"] == [s["step"] for s in answer["steps"]] == list(range(1, step + 1))
            assert drawn["y"] == [s["loss"]["recomputed"] for s in answer["steps"]]  # the API's numbers, drawn
            if step == 4:
                shoot(page, "02-live-four-steps.png")
        assert page.page.evaluate("document.getElementById('run-step').max") == "6"  # the step picker grew
        charts = page.page.evaluate("Array.from(document.querySelectorAll('#timeline-charts .plot-container')).length")
        assert charts >= 2  # the loss and the series the answer carries, all extended
        writer.update(status="done")
        page.wait_for("document.getElementById('run-timeline').dataset.live === 'done'")
        shoot(page, "03-live-done-six-steps.png")
        page.check_clean()
    finally:
        page.context.close()
