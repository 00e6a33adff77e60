"""The Runs view told as it is (ranks, stale labels, a link to a run's step) in real headless Chromium.

A real two-rank TRL run (each rank's step files written by ``RunWriter(rank=0/1)``, their returned losses and the
trainer's logged.jsonl as TRL writes them: the step's loss is the mean over the ranks of each rank's sum) and a
real NeMo RL import (a config of no preset). No torchrun: the files are what a capture writes."""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from test_browser import ARTIFACTS, CHROMIUM, Page, browser, serve  # noqa: F401 (browser is a fixture)
from test_browser_runs import _port, shoot_section
from test_importers import nemo_jsonl, nemo_train_data

import grpo
from grpo.__main__ import main
from grpo.runs import RunWriter, load_step

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed")


def tensors(seed: int, rows: int = 4, width: int = 6) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(rows, width, generator=g) * 2 - 0.05
    return {
        "per_token_logps": (old + 0.3 * torch.randn(rows, width, generator=g)).clamp(max=-1e-3),
        "old_per_token_logps": old,
        "completion_mask": torch.arange(width)[None, :] < torch.tensor([6, 3, 5, 1])[:rows, None],
        "advantages": torch.randn(rows, generator=g),
    }


def write_two_ranks(run_dir: Path) -> dict[tuple[int, int, int], float]:
    """2 steps x 2 ranks x 2 micro-batches of TRL's, each file recording the loss GRPO Lens computes for it (what
    TRL returns), and logged.jsonl as TRL logs each step (logging_steps 1): the mean over the ranks of each rank's
    sum of its returned losses. Returns (step, rank, micro) -> loss (as tests/test_verdict.py writes its runs)."""
    config = grpo.LossConfig.from_preset("trl-grpo")
    losses = {}
    for rank in (0, 1):
        writer = RunWriter(run_dir, "trl", config, rank=rank)
        for step in (1, 2):
            for micro in (0, 1):
                t = tensors(1000 * rank + 10 * step + micro)
                batch, stored, _ = load_step(writer.write_step(step, micro, t, {}))
                losses[(step, rank, micro)] = float(grpo.evaluate(batch, stored).loss)
                writer.write_step(step, micro, t, {"loss": losses[(step, rank, micro)], "processes": 2})
        writer.close()
    logged = [{"step": s, "metrics": {"loss": sum(v for (t, _, _), v in losses.items() if t == s) / 2}} for s in (1, 2)]
    (run_dir / "logged.jsonl").write_text("".join(json.dumps(line) + "\n" for line in logged))
    return losses


@pytest.fixture(scope="module")
def ranks_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[tuple[int, int, int], float]]]:
    root = tmp_path_factory.mktemp("ranks")
    runs = root / "runs"
    runs.mkdir()
    losses = write_two_ranks(runs / "two")
    dump = root / "nemo-logs"
    dump.mkdir()
    for step in (1, 2):  # NeMo RL's train_data_step{N}.jsonl, as its Logger writes them
        (dump / f"train_data_step{step}.jsonl").write_text(nemo_jsonl(nemo_train_data(step)))
    assert main(["import", "nemo-rl", str(dump), str(runs / "nemo")]) == 0
    shutil.rmtree(dump)
    for url in serve({"GRPO_LENS_RUNS_DIR": str(runs), "GRPO_LENS_PROCESS_WORKERS": "0"}, _port()):
        yield url, losses


def open_run(page: Page, name: str, step: int = 1) -> None:
    page.page.select_option("#run-select", name)
    page.wait_for(f"document.getElementById('runs').dataset.open === '{name}'", timeout=120)
    page.wait_for(f"document.getElementById('runs').dataset.step === '{step}'", timeout=120)
    page.wait_for("document.getElementById('status').className !== 'busy'")


def pick(page: Page, select: str, value: str) -> None:
    """Choose ``value`` in a Runs view picker and wait for the step it loads to be drawn."""
    before = page.drawn()
    page.page.select_option(select, value)
    page.wait_drawn(before)
    page.wait_for("document.getElementById('status').className !== 'busy'")


def label(page: Page) -> str:
    return page.page.text_content("#run-step-label") or ""


def fmt(x: float) -> str:
    """format.js's ``fmt`` for these losses (4 significant digits, 0.001 <= |x| < 1e5)."""
    return f"{float(f'{x:.4g}')!r}".removesuffix(".0")


def test_ranks_are_labelled_chosen_and_told_as_the_trainer_logs_the_step(browser: Any, ranks_server: Any) -> None:  # noqa: F811
    """Ranks: the legend says a two-rank step is the mean over the ranks of each rank's sum (not "summed over
    micro-batches"), the trainer's logged loss is on the chart and in the label, a micro-batch index on both ranks
    shows one loss per rank (never "a + b" as one micro-batch's), and one rank can be chosen: its micro-batch is
    that file's own loss. An unknown rank is a 404 naming it."""
    url, losses = ranks_server
    page = Page(browser, url)
    try:
        page.open()
        page.wait_for("document.getElementById('runs').dataset.count === '2'")
        open_run(page, "two")
        traces = page.page.evaluate("document.getElementById('run-loss').data.map((t) => ({name: t.name, y: t.y}))")
        names = [t["name"] for t in traces]
        assert "summed over micro-batches" not in names[0] and "mean over the 2 ranks" in names[0], names
        logged = next(t for t in traces if "logged loss" in t["name"])
        step_loss = {s: sum(v for (t, _, _), v in losses.items() if t == s) / 2 for s in (1, 2)}
        assert logged["y"] == pytest.approx([step_loss[1], step_loss[2]], rel=1e-6)

        whole = label(page)  # the whole step, every rank: as the trainer logs it, each rank's sum beside
        rank_sum = {r: losses[(1, r, 0)] + losses[(1, r, 1)] for r in (0, 1)}
        assert "ranks 0, 1" in whole and "mean over the 2 ranks of each rank's sum" in whole, whole
        assert f"trainer's loss {fmt(step_loss[1])} (rank 0: {fmt(rank_sum[0])}, rank 1: {fmt(rank_sum[1])})" in whole
        assert f"the trainer's logged loss {fmt(step_loss[1])}" in whole, whole
        assert page.page.is_visible("#run-rank")
        options = page.page.evaluate("[...document.getElementById('run-rank').options].map((o) => o.textContent)")
        assert options[1:] == ["rank 0", "rank 1"] and "all 2 ranks" in options[0], options

        pick(page, "#run-micro", "0")  # micro-batch 0 on both ranks: two losses, each named by its rank
        both = label(page)
        assert " + " not in both and f"rank 0: {fmt(losses[(1, 0, 0)])}, rank 1: {fmt(losses[(1, 1, 0)])}" in both
        shoot_section(page, "runs", "runs-ranks-micro-both.png")

        pick(page, "#run-rank", "1")  # rank 1's micro-batch 0: that file, the trainer's exact number
        one = label(page)
        assert one.startswith("step 1, rank 1, micro-batch 0 · ") and fmt(losses[(1, 1, 0)]) in one, one
        assert page.last()["loss"] == pytest.approx(losses[(1, 1, 0)], rel=1e-5)
        assert any("rank=1" in u and "micro=0" in u for u in page.requests if "/steps/1" in u)
        pick(page, "#run-micro", "")  # rank 1's whole step: its sum
        rank1 = label(page)
        assert "rank 1: its loss sums its micro-batches 0, 1" in rank1 and f"loss {fmt(rank_sum[1])}" in rank1, rank1
        shoot_section(page, "runs", "runs-ranks-rank1.png")
        page.check_clean()
    finally:
        page.context.close()
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(f"{url}/api/v1/runs/two/steps/1?rank=5", timeout=60)
    assert caught.value.code == 404
    detail = json.loads(caught.value.read())["detail"][0]
    assert detail["loc"] == ["query", "rank"] and "no rank 5" in detail["msg"] and "0, 1" in detail["msg"], detail


def test_stale_labels_the_scenario_notes_after_a_preset_change(browser: Any, ranks_server: Any) -> None:  # noqa: F811
    """Stale labels, 1: the scenario's notes describe it under its own preset; under another they say so."""
    page = Page(browser, ranks_server[0])
    try:
        page.open()
        notes = page.page.text_content("#scenario-text")
        before = page.drawn()
        page.page.select_option("#preset", "trl-dapo")
        page.wait_drawn(before)
        text = page.page.text_content("#scenario-text") or ""
        assert text != notes and "no longer apply" in text and "trl-dapo" in text, text
        page.check_clean()
    finally:
        page.context.close()


def test_stale_labels_loaded_after_an_apply_json_that_failed(browser: Any, ranks_server: Any) -> None:  # noqa: F811
    """Stale labels, 2: "Loaded: JSON input" over views that still show the batch before it: it says it was not
    drawn."""
    page = Page(browser, ranks_server[0])
    try:
        page.open()
        page.page.click("#tab-json")  # a batch the server refuses (one advantage per row, two for one row)
        page.page.fill("#json-box", json.dumps({"per_token_logps": [[-1.0, -2.0]], "advantages": [1.0, 2.0]}))
        page.page.click("#apply-json")
        page.wait_for("document.getElementById('status').textContent.startsWith('error')")
        loaded = page.page.text_content("#loaded") or ""
        assert "not drawn: its request failed" in loaded, loaded
        assert page.errors == [
            "Failed to load resource: the server responded with a status of 422 (Unprocessable Entity)"
        ]
        page.errors.clear()  # the 422 this test asked for
        page.check_clean()
    finally:
        page.context.close()


def test_stale_labels_the_scenario_and_replay_menus_on_a_run(browser: Any, ranks_server: Any) -> None:  # noqa: F811
    """Stale labels, 3 and 4: no scenario is named while a run's step is loaded; the Replay menu starts on no
    preset (it always showed trl-dr_grpo), the run's own named as such."""
    page = Page(browser, ranks_server[0])
    try:
        page.open()
        page.wait_for("document.getElementById('runs').dataset.count === '2'")
        open_run(page, "two")
        menu = page.page.evaluate(
            "(() => { const s = document.getElementById('scenario');"
            " return {value: s.value, text: s.selectedOptions[0]?.textContent ?? ''}; })()"
        )
        assert menu == {"value": "", "text": "none: a run's step is loaded"}, menu
        replay = page.page.evaluate(
            "(() => { const s = document.getElementById('run-replay-preset');"
            " return {value: s.value, own: [...s.options].filter((o) => o.textContent.includes('own'))"
            ".map((o) => o.textContent)}; })()"
        )
        assert replay == {"value": "", "own": ["trl-grpo (the run's own)"]}, replay
        page.check_clean()
    finally:
        page.context.close()


def test_stale_labels_a_nemo_runs_preset_is_its_own_config(browser: Any, ranks_server: Any) -> None:  # noqa: F811
    """Stale labels, 5: an imported NeMo RL run's config has no preset: the preset menu says so, never "article"."""
    page = Page(browser, ranks_server[0])
    try:
        page.open()
        page.wait_for("document.getElementById('runs').dataset.count === '2'")
        open_run(page, "nemo")
        preset = page.page.evaluate(
            "(() => { const s = document.getElementById('preset');"
            " return {value: s.value, text: s.selectedOptions[0]?.textContent ?? ''}; })()"
        )
        assert preset == {"value": "", "text": "none: the run's own config"}, preset
        assert not page.page.is_visible("#run-rank")  # one process: no rank to choose
        page.page.evaluate("window.scrollTo(0, 0)")
        page.page.screenshot(path=str(ARTIFACTS / "runs-nemo-top.png"))
        page.check_clean()
    finally:
        page.context.close()


def test_copy_link_names_a_run_step_and_opening_it_restores_the_step(browser: Any, ranks_server: Any) -> None:  # noqa: F811
    """Copy link for a run's step: the link names the run, step, micro-batch, rank and settings (never the batch,
    which made it "too large"), and opening it shows the same step, under the same settings, with the same loss."""
    url, losses = ranks_server
    page = Page(browser, url)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=url)
    try:
        page.open()
        page.wait_for("document.getElementById('runs').dataset.count === '2'")
        open_run(page, "two")
        page.page.evaluate(
            "(() => { const s = document.getElementById('run-step'); s.value = '2';"
            " s.dispatchEvent(new Event('input')); })()"
        )
        page.wait_for("document.getElementById('runs').dataset.step === '2'")
        pick(page, "#run-micro", "1")
        pick(page, "#run-rank", "1")
        before = page.drawn()
        page.page.fill("#cfg-epsilon_high", "0.31")  # a setting moved: the step replayed there
        page.wait_drawn(before)
        page.wait_for("document.getElementById('status').className !== 'busy'")
        shown = page.last()["loss"]
        page.page.click("#copy-link")
        page.wait_for("document.getElementById('status').textContent.startsWith('link copied')")
        status = page.page.text_content("#status") or ""
        assert "too large" not in status and "settings only" not in status, status
        link = page.page.evaluate("navigator.clipboard.readText()")
        assert "run=two" in link and "step=2" in link and "micro=1" in link and "rank=1" in link, link
        assert "epsilon_high=0.31" in link and "input=" not in link and len(link) < 3000, link
    finally:
        page.context.close()
    opened = Page(browser, url)
    try:
        opened.page.goto(link)
        opened.wait_for("document.getElementById('runs').dataset.step === '2'", timeout=120)
        opened.wait_for(
            "window.grpoLens.state.ui.runStep?.rank === '1' && document.getElementById('status').className !== 'busy'"
        )
        at = opened.page.evaluate(
            "(() => { const r = document.getElementById('runs').dataset;"
            " return {open: r.open, step: r.step, micro: r.micro, rank: r.rank,"
            " eps: document.getElementById('cfg-epsilon_high').value}; })()"
        )
        assert at == {"open": "two", "step": "2", "micro": "1", "rank": "1", "eps": "0.31"}, at
        assert opened.last()["loss"] == pytest.approx(shown, rel=1e-6)
        restored = opened.page.text_content("#run-step-label") or ""
        assert f"step 2, rank 1, micro-batch 1 · trainer's loss {fmt(losses[(2, 1, 1)])}" in restored, restored
        shoot_section(opened, "runs", "runs-link-restored.png")
        opened.check_clean()
    finally:
        opened.context.close()
