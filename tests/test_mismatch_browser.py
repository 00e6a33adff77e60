"""The Mismatch view in real headless Chromium: each mismatch scenario draws the scatter of
trainer-old vs sampler log-probs around the diagonal and the per-row chart with its bounds, prints the
server's sentences with every number tagged and equal to the API's, marks the dropped cells on the
heatmaps; a batch without sampler log-probs says so; rollout_rs is a text control that round-trips and a
bad threshold spec gets the server's message; a captured run's step with sampler log-probs opens in it.
Screenshots go to /work/helpers/artifacts/mismatch/ when that folder's parent exists, else test-artifacts/."""

# ruff: noqa: F811  (the fixtures imported from test_browser are the test functions' parameters)
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from test_browser import ARTIFACTS, CHROMIUM, Page, _api_loss, browser, page, serve, server  # noqa: F401

import grpo
from grpo.examples import SCENARIOS
from grpo.requests import batch_from_request
from grpo.runs import RunWriter

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed")

HELPERS = Path("/work/helpers/artifacts")
SHOTS = HELPERS / "mismatch" if HELPERS.exists() else ARTIFACTS / "mismatch"
MISMATCH_SCENARIOS = ("mismatch-bf16", "mismatch-long-row", "mismatch-one-token")

TAGGED = """(sel) => [...document.querySelectorAll(sel + ' [data-quantity]')].map(e => ({
  quantity: e.dataset.quantity, value: Number(e.dataset.value), text: e.textContent }))"""


def _block_value(answer: dict[str, Any], quantity: str) -> float:
    """The answer's own value of a quantity the view prints (its block's stats and rows, the config, the loss)."""
    block = answer["mismatch"]
    if quantity.startswith("mismatch/stats/"):
        return float(block["stats"][quantity.removeprefix("mismatch/stats/")])
    if quantity.startswith("mismatch/rows/"):
        field, _, i = quantity.removeprefix("mismatch/rows/").rpartition("/")
        return float(block["rows"][field][int(i)])
    if quantity.startswith("mismatch/rs/"):
        name, _, side = quantity.removeprefix("mismatch/rs/").rpartition("/")
        return float(next(t["value"] for t in block["thresholds"] if t["name"] == f"{name} {side}"))
    if quantity.startswith("rows/index/"):
        return float(quantity.removeprefix("rows/index/"))
    if quantity.startswith("config/"):
        return float(answer["config"][quantity.removeprefix("config/")])
    return float(answer[quantity])


def _shot(page: Page, selector: str, name: str) -> None:
    """A screenshot of one view, the page's sticky header out of its way."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.page.add_style_tag(content=".topbar { position: static !important; }")
    page.page.locator(selector).scroll_into_view_if_needed()
    page.painted()  # the scroll's repaint
    page.page.locator(selector).screenshot(path=str(SHOTS / name))


def _check_view(page: Page, answer: dict[str, Any]) -> None:
    """The view as drawn: the server's sentences as they are, every number tagged and the API's, the charts'
    points the block's."""
    block = answer["mismatch"]
    assert page.page.evaluate("document.getElementById('view-mismatch').dataset.active") == "true"
    items = page.page.locator("#mismatch-sentences li")
    assert items.count() == len(block["sentences"])
    assert [items.nth(i).text_content() for i in range(items.count())] == block["sentences"]
    tagged = page.page.evaluate(TAGGED, "#view-mismatch")
    assert len(tagged) >= 5
    for t in tagged:
        assert t["value"] == pytest.approx(_block_value(answer, t["quantity"]), rel=1e-6, abs=1e-12), t
        assert float(t["text"]) == pytest.approx(t["value"], rel=5e-4, abs=1e-12), t
    page.current_chart("mismatch-scatter")
    traces = page.page.evaluate(
        "document.getElementById('mismatch-scatter').data.map(t => ({name: t.name, mode: t.mode, x: t.x, y: t.y,"
        " panel: t.xaxis || 'x'}))"
    )
    for panel, field in (("x", "y"), ("x2", "log_ratio")):  # sampler vs old; old − sampler vs old
        points = [t for t in traces if t["mode"] == "markers" and t["panel"] == panel]
        assert sum(len(t["x"]) for t in points) == len(block["scatter"]["x"]) == block["scatter"]["total"]
        assert {t["name"] for t in points} == {answer["correction_names"][c] for c in block["scatter"]["code"]}
        drawn = sorted(v for t in points for v in t["y"])
        assert drawn == pytest.approx(sorted(block["scatter"][field]), rel=1e-6, abs=1e-9)
    diagonal = next(t for t in traces if t["mode"] == "lines")
    assert diagonal["x"] == diagonal["y"]  # sampler = old
    assert page.page.locator("#mismatch-scatter .main-svg").count() > 0
    page.current_chart("mismatch-rows")
    rows = page.page.evaluate("document.getElementById('mismatch-rows').data.map(t => t.y.length)")
    assert sum(rows) == len(block["rows"]["code"]) * len(block["row_charts"])
    shapes = page.page.evaluate("(document.getElementById('mismatch-rows').layout.shapes || []).map(s => s.y0)")
    assert shapes == pytest.approx([line["value"] for chart in block["row_charts"] for line in chart["lines"]])


@pytest.mark.parametrize("name", MISMATCH_SCENARIOS)
def test_each_mismatch_scenario_draws_the_view_with_the_apis_numbers(page: Page, name: str) -> None:
    scenario = SCENARIOS[name]
    page.open()
    before = page.drawn()
    page.page.select_option("#scenario", name)
    page.wait_drawn(before)
    page.wait_for(f"window.grpoLens.state.scenario === '{name}'")
    answer = page.last()
    expected = _api_loss(page.server, {**scenario.request, "config": {"preset": scenario.preset, **scenario.overrides}})
    assert answer["mismatch"]["sentences"] == expected["mismatch"]["sentences"]
    assert answer["mismatch"]["stats"] == expected["mismatch"]["stats"]
    _check_view(page, answer)
    _shot(page, "#view-mismatch", f"{name}.png")
    # the dropped cells are marked on the heatmaps
    dropped = sum(
        answer["correction_names"][c] in ("masked", "sequence_masked", "rejected")
        for row in answer["tokens"]["correction"]
        for c in row
    )
    page.current_chart("heat-ratio")
    marks = page.page.evaluate(
        "document.getElementById('heat-ratio').data.filter(t => t.name && t.name.includes('rollout correction'))"
        ".map(t => t.x.length)"
    )
    assert marks == ([dropped] if dropped else [])
    if dropped:
        _shot(page, "#view-heatmaps", f"{name}-heatmaps.png")
    page.check_clean()


def test_a_batch_without_sampler_log_probs_says_so(page: Page) -> None:
    page.open("?scenario=article&preset=article")
    assert page.last()["mismatch"] is None
    assert page.page.evaluate("document.getElementById('view-mismatch').dataset.active") == "false"
    assert "No sampler log-probs in this batch" in (page.page.text_content("#mismatch-empty") or "")
    assert page.page.evaluate("document.getElementById('mismatch-scatter').hidden")
    assert page.page.locator("#mismatch-sentences li").count() == 0
    page.check_clean()


def test_rollout_rs_is_a_text_control_that_round_trips_and_a_bad_spec_is_named(page: Page, browser: Any) -> None:
    page.open("?scenario=mismatch-one-token")
    assert page.page.get_attribute("#cfg-rollout_rs", "type") == "text"
    assert page.page.get_attribute("#cfg-rollout_rs_threshold", "type") == "text"
    page.page.fill("#cfg-rollout_rs", "token_k1")
    page.page.dispatch_event("#cfg-rollout_rs", "change")
    page.page.fill("#cfg-rollout_rs_threshold", "3_1")  # lower above upper
    page.page.dispatch_event("#cfg-rollout_rs_threshold", "change")
    page.wait_for("document.getElementById('status').classList.contains('error')")
    status = page.page.inner_text("#status")
    assert "rollout_rs_threshold" in status and "'3_1'" in status, status
    before = page.drawn()
    page.page.fill("#cfg-rollout_rs_threshold", "0.5_2")
    page.page.dispatch_event("#cfg-rollout_rs_threshold", "change")
    page.wait_drawn(before)
    answer = page.last()
    assert (answer["config"]["rollout_rs"], answer["config"]["rollout_rs_threshold"]) == ("token_k1", "0.5_2")
    assert answer["mismatch"]["stats"]["rejected_tokens"] == 1  # the token 5.9 nats off: |log r| > log 2
    assert "rollout_rs rejected" in (page.page.text_content("#mismatch-sentences") or "")
    url = page.page.url
    assert "rollout_rs=token_k1" in url and "rollout_rs_threshold=0.5_2" in url
    page.errors.clear()  # the 4xx's console line, on purpose
    other = Page(browser, page.server)
    try:
        other.page.goto(url)
        other.wait_drawn(0)
        assert other.page.input_value("#cfg-rollout_rs") == "token_k1"
        assert other.page.input_value("#cfg-rollout_rs_threshold") == "0.5_2"
        assert other.last()["loss"] == answer["loss"]
        other.check_clean()
    finally:
        other.context.close()


def test_the_input_table_edits_the_sampler_log_probs(page: Page) -> None:
    """The table shows the sampler's row when the batch has one; an edit there recomputes the view, and a token
    added to a row grows the sampler's row with it (before: the table left it out, so the field no longer
    matched the batch's shape and the server refused it)."""
    page.open(
        "?scenario=mismatch-one-token&preset=verl-grpo&rollout_correction=token_mask&rollout_is_min=0.5"
        "&rollout_is_max=2&rollout_is_log_ratio_clamp=20"
    )
    cell = page.page.locator("[aria-label='row 1 sampler 3']")
    assert float(cell.input_value()) == SCENARIOS["mismatch-one-token"].request["sampling_per_token_logps"][1][3]
    before = page.drawn()
    cell.fill("-2.4")  # now within 0.03 nats of the trainer's -2.376
    cell.dispatch_event("change")
    page.wait_drawn(before)
    assert page.last()["mismatch"]["counts"]["masked"] == 0
    assert "token" not in page.last()["mismatch"]["sentence_keys"] or "keeps every token" in (
        page.page.text_content("#mismatch-sentences") or ""
    )
    before = page.drawn()
    page.page.locator(".input-row").first.locator("button", has_text="+ token").click()
    page.wait_drawn(before)
    answer = page.last()
    assert answer["mismatch"]["rows"]["length"][0] == 7 and len(answer["tokens"]["correction"][0]) == 7
    assert page.page.locator("[aria-label='row 0 sampler 6']").count() == 1
    page.check_clean()
    # a batch without the sampler's log-probs shows no sampler row
    page.open("?scenario=article&preset=article")
    assert page.page.locator("[aria-label='row 0 sampler 3']").count() == 0


def test_a_batch_past_the_per_token_limit_draws_the_whole_view(page: Page) -> None:
    """Past the server's per-token limit the answer carries one row's tokens, but the view's block covers the
    batch: every scored token in the scatter (up to its cap), every row in the row chart."""
    rows = 8
    old = [[-0.2 - 0.05 * ((3 * i + j) % 17) for j in range(40)] for i in range(rows)]
    sampler = [[v - (0.06 if i == 5 else 0.01) for v in row] for i, row in enumerate(old)]  # row 5: Σ = 2.4
    page.open("?scenario=article&preset=trl-grpo&rollout_correction=sequence_mask")
    body = {
        "per_token_logps": old,
        "sampling_per_token_logps": sampler,
        "rewards": [1.0, 0.0] * (rows // 2),
        "group_size": 4,
    }
    answer = page.apply_json(body)
    assert not answer["tokens_complete"] and answer["mismatch"]["scatter"]["total"] == rows * 40
    assert answer["mismatch"]["stats"]["above_token_percent"] == pytest.approx(100 / rows)
    _check_view(page, answer)
    page.check_clean()


# --- a captured run's step with sampler log-probs ---------------------------------------------------------------
@pytest.fixture(scope="module")
def sampled_run_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A run of two steps whose step files carry the sampler's log-probs (TRL's sequence_mask, C_max 3)."""
    root = tmp_path_factory.mktemp("sampled-runs")
    config = grpo.LossConfig.from_preset("trl-grpo", rollout_correction="sequence_mask", rollout_is_max=3.0)
    writer = RunWriter(root / "vllm-run", "trl", config)
    request = SCENARIOS["mismatch-long-row"].request
    batch = batch_from_request(request)
    for step in (1, 2):
        tensors = {
            "per_token_logps": batch.per_token_logps,
            "sampling_per_token_logps": batch.sampling_per_token_logps,
            "completion_mask": batch.mask.to(torch.int64),
            "advantages": grpo.evaluate(batch, config).advantages.float(),
        }
        assert tensors["sampling_per_token_logps"] is not None
        loss = float(grpo.evaluate(grpo.Batch(**tensors), config).loss)  # type: ignore[arg-type]
        writer.write_step(step, 0, tensors, {"loss": loss})  # type: ignore[arg-type]
    writer.update(status="done")
    yield from serve({"GRPO_LENS_RUNS_DIR": str(root), "GRPO_LENS_PROCESS_WORKERS": "0"})


def test_a_run_step_with_sampler_log_probs_opens_in_the_mismatch_view(browser: Any, sampled_run_server: str) -> None:
    page = Page(browser, sampled_run_server)
    try:
        page.open()
        page.wait_for("document.getElementById('runs').dataset.count === '1'")
        before = page.drawn()
        page.page.select_option("#run-select", "vllm-run")
        page.wait_for("document.getElementById('runs').dataset.step === '1'", timeout=120)
        page.wait_drawn(before)
        answer = page.last()
        assert answer["config"]["rollout_correction"] == "sequence_mask"
        block = answer["mismatch"]
        assert block is not None and block["sampled"]
        assert "Row 3 was dropped by sequence_mask" in (page.page.text_content("#mismatch-sentences") or "")
        _check_view(page, answer)
        _shot(page, "#view-mismatch", "run-step.png")
        page.check_clean()
    finally:
        page.context.close()
