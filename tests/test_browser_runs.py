"""The Runs view in real headless Chromium: open a captured TRL run, move the step slider, see every
view change to that step's batch, and replay the run under another preset; a run whose run.json the
rules refuse is listed, disabled, with the reason."""

from __future__ import annotations

import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_browser import ARTIFACTS, CHROMIUM, ROOT, Page, browser, serve  # noqa: F401 (browser is a fixture)

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed")
PORTS = range(8300, 8400)  # this feature's loopback ports


def _port() -> int:
    for port in PORTS:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 8300-8399")


@pytest.fixture(scope="module")
def runs_server(trl_runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    runs_dir = tmp_path_factory.mktemp("runs-dir")
    shutil.copytree(trl_runs["grpo"], runs_dir / "trl-grpo-run")
    (runs_dir / "broken").mkdir()  # a run.json the rules refuse: listed, not openable
    (runs_dir / "broken" / "run.json").write_text("{nope")
    port = _port()
    # no large-request worker: the page reads a small run (thread lane); a worker would import torch, unused
    yield from serve({"GRPO_LENS_RUNS_DIR": str(runs_dir), "GRPO_LENS_PROCESS_WORKERS": "0"}, port)


def shoot_section(page: Page, section: str, name: str) -> None:
    """A screenshot of the viewport with the element ``section`` scrolled into it, as test-artifacts/``name``."""
    ARTIFACTS.mkdir(exist_ok=True)
    page.page.evaluate(f"document.getElementById('{section}').scrollIntoView()")
    page.painted()  # the scroll's repaint
    page.page.screenshot(path=str(ARTIFACTS / name), full_page=False)


def test_a_captured_run_steps_through_every_view(browser: Any, runs_server: str) -> None:  # noqa: F811
    page = Page(browser, runs_server)
    try:
        page.open()
        page.wait_for("document.getElementById('runs').dataset.count === '2'")
        broken = page.page.evaluate(
            "(() => { const o = document.querySelector('#run-select option[value=broken]');"
            " return {disabled: o.disabled, text: o.textContent}; })()"
        )
        assert broken["disabled"] and "unreadable" in broken["text"] and "valid JSON" in broken["text"]
        before = page.drawn()
        page.page.select_option("#run-select", "trl-grpo-run")
        page.wait_for("document.getElementById('runs').dataset.step === '1'", timeout=120)
        drawn = page.wait_drawn(before)
        info = page.page.text_content("#run-info") or ""
        assert "Every micro-batch matches the trainer" in info
        loss_chart = page.page.evaluate("document.getElementById('run-loss').data.map(t => ({name: t.name, y: t.y}))")
        assert [len(t["y"]) for t in loss_chart[:2]] == [4, 4] and loss_chart[2]["y"] == []  # no mismatch marker
        step1 = page.last()
        assert len(step1["rows"]["loss"]) == 8  # step 1's two micro-batches of 4 rows, joined
        heat1 = page.heatmap("ratio")

        page.page.evaluate(
            "(() => { const s = document.getElementById('run-step'); s.value = '2';"
            " s.dispatchEvent(new Event('input')); })()"
        )
        page.wait_for("document.getElementById('runs').dataset.step === '2'")
        page.wait_drawn(drawn)
        step2 = page.last()
        assert step2["loss"] != step1["loss"]
        assert page.heatmap("ratio") != heat1  # the views changed with the step
        label = page.page.text_content("#run-step-label") or ""
        assert label.startswith("step 2")

        page.page.select_option("#run-replay-preset", "trl-dr_grpo")
        page.page.click("#run-replay")
        page.wait_for("Boolean(document.getElementById('run-replay-chart').data)")
        names = page.page.evaluate("document.getElementById('run-replay-chart').data.map(t => t.name)")
        assert "loss (trl-dr_grpo)" in names and "loss (as captured)" in names
        shoot_section(page, "runs", "runs-view.png")
        shoot_section(page, "view-heatmaps", "runs-step2-heatmaps.png")
        page.check_clean()
    finally:
        page.context.close()


def test_a_step_says_its_rollout_and_the_picker_offers_what_it_holds(browser: Any, runs_server: str) -> None:  # noqa: F811
    """The capture recorded each step's rollout (num_iterations 2: step 2 trains on step 1's completions);
    the label prints the loss the chart draws; the picker offers the step's 2 micro-batches; a failed load
    says so and greys the view; charts keep one unit per axis, gaps where the trainer logged nothing."""
    page = Page(browser, runs_server)
    try:
        page.open()
        page.wait_for("document.getElementById('runs').dataset.count === '2'")
        page.page.select_option("#run-select", "trl-grpo-run")
        page.wait_for("document.getElementById('runs').dataset.step === '1'", timeout=120)
        story = page.page.text_content("#run-step-story") or ""
        assert story.startswith("rollout 1, iteration 1 of 2: completions sampled for this step")
        options = page.page.evaluate("[...document.querySelectorAll('#run-micro option')].map((o) => o.value)")
        assert options == ["", "0", "1"]
        chart = page.page.evaluate("document.getElementById('run-loss').data[1].y[0]")
        assert float(page.page.get_attribute("#run-step-label", "data-lens-loss") or "nan") == chart
        page.page.evaluate(
            "(() => { const s = document.getElementById('run-step'); s.value = '2';"
            " s.dispatchEvent(new Event('input')); })()"
        )
        page.wait_for("document.getElementById('runs').dataset.step === '2'")
        story = page.page.text_content("#run-step-story") or ""
        assert story.startswith("rollout 1, iteration 2 of 2: the same completions as step 1 after 1 update")
        # Units apart: reward and lengths on charts of their own; a logged series is null where not logged.
        units = page.page.evaluate(
            "[...document.querySelectorAll('#run-charts .run-chart')].map((n) => n.layout.yaxis.title.text)"
        )
        assert "reward" in units and "tokens" in units and len(units) == len(set(units))
        assert page.page.evaluate("document.getElementById('run-loss').layout.yaxis.automargin") is True
        notes = page.page.text_content("#run-notes") or ""
        assert "grad_norm ≠ lens/grad_norm_logps" in notes

        # A micro-batch the step does not hold (forced into the picker): the 404 is said, the view greyed.
        page.page.evaluate(
            "(() => { const s = document.getElementById('run-micro');"
            " s.append(new Option('3', '3')); s.value = '3'; s.dispatchEvent(new Event('change')); })()"
        )
        page.wait_for("document.getElementById('runs').classList.contains('stale')")
        assert (page.page.text_content("#run-step-label") or "").startswith("failed: ")
        page.errors = [e for e in page.errors if "404" not in e]  # the browser logs the refused fetch itself
        page.page.select_option("#run-micro", "1")
        page.wait_for("!document.getElementById('runs').classList.contains('stale')")
        assert (page.page.text_content("#run-step-label") or "").startswith("step 2, micro-batch 1")
        shoot_section(page, "runs", "runs-story.png")
        page.check_clean()
    finally:
        page.context.close()
