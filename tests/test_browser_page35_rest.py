"""The page explains itself, round three, the rest (headless Chromium): a run step's rows table shows each row's
group as the run recorded it (row_groups), the CSV names a token's region as the page does ("unbounded", not
"trust"), typing a value into an optional setting switches it on, and the heatmaps' hovers leave their row labels
readable. Screenshots go to test-artifacts/page35/.

The off-policy run is a TRL-like capture written with ``RunWriter``: two groups of two rows (row_groups 0, 0, 1, 1),
the sampler's log-probs of row 3 far from the trainer's (exp(Σ old − sampler) = exp(8 × 0.5) ≈ 54.6 > C_max 3),
under TRL's correction with vLLM (sequence_mask, C_max 3): row 3 is dropped."""

# ruff: noqa: F811  (the fixtures imported from test_browser are the test functions' parameters)
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from test_browser import ARTIFACTS, CHROMIUM, Page, browser, page, serve, server  # noqa: F401
from test_browser_runs import _port

import grpo
from grpo.runs import RunWriter, load_step

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed")

SHOTS = ARTIFACTS / "page35"
GROUPS = [0, 0, 1, 1]


def off_policy_tensors(step: int) -> dict[str, torch.Tensor]:
    """4 rows x 8 tokens: the trainer's old log-probs, the current ones 0.1 above, the sampler's equal to the old
    ones except row 3's, 0.5 below on every token (Σ old − sampler = 4: its sequence IS ratio e^4 ≈ 54.6)."""
    g = torch.Generator().manual_seed(step)
    old = -torch.rand(4, 8, generator=g, dtype=torch.float64) * 2 - 0.1
    sampler = old.clone()
    sampler[3] -= 0.5
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    return {
        "per_token_logps": old + 0.1,
        "old_per_token_logps": old,
        "sampling_per_token_logps": sampler,
        "advantages": torch.tensor([0.7071, -0.7071, -0.7071, 0.7071], dtype=torch.float64),
        "row_rewards": rewards,
        "row_groups": torch.tensor(GROUPS),
    }


def write_off_policy_run(run_dir: Path) -> None:
    """Two steps of one micro-batch each, TRL's GRPO with vLLM's default correction (sequence_mask, C_max 3), each
    file recording the loss GRPO Lens computes for it (what TRL returns)."""
    config = grpo.LossConfig.from_preset("trl-grpo", rollout_correction="sequence_mask", rollout_is_max=3.0)
    writer = RunWriter(run_dir, "trl", config)
    for step in (1, 2):
        t = off_policy_tensors(step)
        batch, stored, _ = load_step(writer.write_step(step, 0, t, {}))
        writer.write_step(step, 0, t, {"loss": float(grpo.evaluate(batch, stored).loss)})
    writer.close()


@pytest.fixture(scope="module")
def runs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    runs = tmp_path_factory.mktemp("page35") / "runs"
    runs.mkdir()
    write_off_policy_run(runs / "offpolicy")
    yield from serve({"GRPO_LENS_RUNS_DIR": str(runs), "GRPO_LENS_PROCESS_WORKERS": "0"}, _port())


def _shot(page: Page, name: str, selector: str | None = None) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    if selector is None:
        page.page.screenshot(path=str(SHOTS / name), full_page=False)
        return
    page.page.add_style_tag(content=".topbar { position: static !important; }")
    page.page.locator(selector).scroll_into_view_if_needed()
    page.painted()  # the scroll's repaint
    page.page.locator(selector).screenshot(path=str(SHOTS / name))


def open_run(page: Page, name: str) -> None:
    page.open()
    page.wait_for("document.getElementById('runs').dataset.count === '1'")
    before = page.drawn()
    page.page.select_option("#run-select", name)
    page.wait_for(f"document.getElementById('runs').dataset.open === '{name}'", timeout=120)
    page.wait_for("document.getElementById('runs').dataset.step === '1'", timeout=120)
    page.wait_drawn(before)
    page.wait_for("document.getElementById('status').className !== 'busy'")


def _rows_column(page: Page, key: str) -> list[str]:
    """The rows table's column ``key`` as shown, in row order (the cells are tagged rows/<key>/<row>)."""
    return list(
        page.page.eval_on_selector_all(
            f"#rows-table td[data-quantity^='rows/{key}/']", "cells => cells.map((c) => c.textContent)"
        )
    )


def test_a_run_steps_rows_table_shows_each_rows_group_and_reward_as_the_run_recorded_them(
    browser: Any, runs_server: str
) -> None:
    """The step's files hold row_groups 0, 0, 1, 1 (two prompts of two completions) and row_rewards 1, 0, 0, 1: the
    step story says 2 groups, and the rows table says which row is in which and its reward (it said group 0 and "–"
    for every row: the batch carries the trainer's advantages, not its groups and rewards). The step endpoint's
    breakdown stays /api/v1/loss's answer (group 0 throughout); a replay under another setting keeps the groups."""
    page = Page(browser, runs_server)
    try:
        open_run(page, "offpolicy")
        assert "2 groups" in (page.page.text_content("#run-step-story") or "")
        assert _rows_column(page, "group") == ["0", "0", "1", "1"]
        assert _rows_column(page, "reward") == ["1", "0", "0", "1"]  # the run's row_rewards ("–" before)
        # one micro-batch: nothing is joined or summed ("micro-batches 0 joined; its loss sums them" before)
        said = page.page.text_content("#run-step-label") or ""
        assert said.startswith("step 1 (one micro-batch, 0)") and "joined" not in said, said
        before = page.drawn()
        page.page.fill("#cfg-epsilon_low", "0.3")
        page.wait_drawn(before)
        assert page.last()["config"]["epsilon_low"] == 0.3
        assert _rows_column(page, "group") == ["0", "0", "1", "1"]
        step = page.page.evaluate(
            "fetch('/api/v1/runs/offpolicy/steps/1').then((r) => r.json()).then((d) => "
            "({groups: d.row_groups, breakdown: d.breakdown.rows.group}))"
        )
        assert step == {"groups": GROUPS, "breakdown": [0, 0, 0, 0]}
        page.page.evaluate("document.getElementById('rows-wrap').scrollLeft = 10000")
        _shot(page, "run-rows-groups.png", "#rows-wrap")
        assert [e for e in page.errors if "Failed to load resource" not in e] == []
        assert [u for u in page.requests if not u.startswith(runs_server)] == []
    finally:
        page.context.close()


# Ratio 49 with A < 0 under the article's clip (ε 0.2, no dual clip): min(49·A, 1.2·A) = 49·A, nothing bounds it.
UNBOUNDED = {
    "per_token_logps": [[-0.1, -0.2], [-0.3, -0.4]],
    "old_per_token_logps": [[-0.1 - float(torch.log(torch.tensor(49.0))), -0.2], [-0.3, -0.4]],
    "advantages": [-1.0, 1.0],
}


def test_the_csv_names_a_tokens_region_as_the_page_does(page: Page) -> None:
    """Row 0 position 0 has ratio 49 and A = -1 under the article's loss: the page names it "unbounded" (its hover's
    why, the summary's count); the CSV's region column says the same (it said "trust", the region code), and every
    other token keeps its region code's name (ratio 1: trust)."""
    page.open()
    answer = page.apply_json(UNBOUNDED)
    assert answer["tokens"]["ratio"][0][0] == pytest.approx(49.0, rel=1e-5)
    assert answer["tokens"]["region"][0][0] == "trust"  # the region code is unchanged (the API's parity)
    assert answer["why"]["names"][answer["tokens"]["why"][0][0]] == "unbounded"
    with page.page.expect_download() as info:
        page.page.click("#export-csv")
    lines = Path(info.value.path()).read_text().splitlines()
    header = lines[0].split(",")
    region = {(int(c[0]), int(c[1])): c[header.index("region")] for c in (line.split(",") for line in lines[1:])}
    assert region == {(0, 0): "unbounded", (0, 1): "trust", (1, 0): "trust", (1, 1): "trust"}
    page.check_clean()


def test_typing_a_value_into_an_optional_setting_switches_it_on(page: Page) -> None:
    """dual_clip is off in the article example (its box empty, its tick off); typing 3 into the box switches it
    on and the loss is computed with it (it was disabled until ticked: a value could not be typed)."""
    page.open()
    assert page.last()["config"]["dual_clip"] is None
    assert not page.page.is_checked("[aria-label='dual_clip on']")
    assert page.page.is_editable("#cfg-dual_clip")
    assert page.page.get_attribute("#cfg-dual_clip", "placeholder") == "type to set"
    before = page.drawn()
    page.page.fill("#cfg-dual_clip", "3")
    page.wait_drawn(before)
    assert page.last()["config"]["dual_clip"] == 3
    assert page.page.is_checked("[aria-label='dual_clip on']")
    assert "dual_clip=3" in page.page.url
    page.page.evaluate("document.getElementById('cfg-dual_clip').scrollIntoView({block: 'center', inline: 'nearest'})")
    page.page.evaluate("document.querySelector('.sidebar').scrollLeft = 0")
    _shot(page, "optional-setting-typed-on.png")
    before = page.drawn()
    page.page.uncheck("[aria-label='dual_clip on']")  # and off again by its tick
    page.wait_drawn(before)
    assert page.last()["config"]["dual_clip"] is None
    page.check_clean()


@pytest.mark.parametrize("scenario", ["mismatch-bf16", "article"])
def test_a_heatmaps_hover_leaves_its_row_labels_readable(page: Page, scenario: str) -> None:
    """Every counted cell of the ratio heatmap hovered in turn (the 8-row mismatch-bf16 batch; the article's, whose
    unbounded token has the longest why), at the tests' 1400 px window. Plotly puts a hover right of its cell, or
    left where it would leave the figure; a box wider than half the plot (13 px text, the gradient's line of 85
    characters: 500 to 540 px of a ~730 px plot) flipped left over "row k (A ...)" from the middle columns on. Each
    box now stays right of the labels (10 px text, the gradient's numbers on a line of their own)."""
    page.open(f"?scenario={scenario}")
    answer = page.last()
    page.current_chart("heat-ratio")
    box = page.page.locator("#heat-ratio .nsewdrag").first.bounding_box()
    assert box is not None
    labels = page.page.evaluate(
        "Math.max(...[...document.querySelectorAll('#heat-ratio .ytick text')]"
        ".map((t) => t.getBoundingClientRect().right))"
    )
    mask, rows = answer["tokens"]["mask"], len(answer["tokens"]["ratio"])
    width = max(len(r) for r in mask)
    covered, hovered = [], 0
    for k in range(rows):
        for j in range(width):
            if j >= len(mask[k]) or not mask[k][j]:
                continue
            page.page.mouse.move(
                box["x"] + box["width"] * (j + 0.5) / width, box["y"] + box["height"] * (k + 0.5) / rows
            )
            page.wait_for("document.querySelector('#heat-ratio .hoverlayer .hovertext') !== null")
            left = page.page.evaluate(
                "document.querySelector('#heat-ratio .hoverlayer .hovertext').getBoundingClientRect().left"
            )
            hovered += 1
            if left < labels:
                covered.append((k, j, left))
    assert hovered == sum(map(sum, mask)) and hovered >= 6
    assert covered == [], f"hovers over the row labels (right edge {labels}): {covered}"
    page.page.mouse.move(box["x"] + box["width"] * 0.62, box["y"] + box["height"] * 0.5)  # a middle column
    page.wait_for("document.querySelector('#heat-ratio .hoverlayer .hovertext') !== null")
    _shot(page, f"heatmap-hover-beside-row-labels-{scenario}.png", "#heat-ratio")
    page.check_clean()
