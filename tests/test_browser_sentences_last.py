"""The last misleading sentences a newcomer found, on the page (headless Chromium): a run step whose files record
no rollout says so (not "captured before GRPO Lens recorded the rollout"); without old_per_token_logps a differing
sampler is not called on-policy; Compare says which columns leave the batch's sampler log-probs out; a verl preset
mirrors verl's default correction (none) and the correction controls name verl's and TRL's settings. Screenshots
go to test-artifacts/sentences_last/."""

# ruff: noqa: F811  (the fixtures imported from test_browser are the test functions' parameters)
from __future__ import annotations

from typing import Any

import pytest
from test_browser import ARTIFACTS, Page, browser, page, server  # noqa: F401  (fixtures)
from test_browser_page35_rest import open_run, runs_server  # noqa: F401  (runs_server: a fixture)

SHOTS = ARTIFACTS / "sentences_last"

# The sampler differs from the policy at row 0 token 0 and row 1 token 1 (by 0.2); no old log-probs.
OFF_POLICY = {
    "per_token_logps": [[-0.5, -1.0], [-0.2, -0.3]],
    "sampling_per_token_logps": [[-0.7, -1.0], [-0.2, -0.1]],
    "advantages": [1.0, -1.0],
}
CORRECTED = "?scenario=mismatch-long-row&preset=trl-grpo&rollout_correction=sequence_mask&rollout_is_max=3"


def _shot(page: Page, selector: str, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.page.add_style_tag(content=".topbar { position: static !important; }")
    page.page.locator(selector).scroll_into_view_if_needed()
    page.page.locator(selector).screenshot(path=str(SHOTS / name))


def test_a_run_step_without_rollout_records_says_its_files_lack_them(browser: Any, runs_server: str) -> None:
    """The page35 off-policy run is written by today's RunWriter with no rollout meta."""
    page = Page(browser, runs_server)
    try:
        open_run(page, "offpolicy")
        story = page.page.text_content("#run-step-story") or ""
        assert story.startswith("rollout unknown") and "captured before" not in story, story
        assert "do not record" in story and "TRL capture" in story
        _shot(page, "#run-step-story", "run-rollout-unknown.png")
    finally:
        page.context.close()


def test_a_differing_sampler_without_old_logps_is_not_called_on_policy(page: Page) -> None:
    page.open("?preset=trl-grpo&rollout_correction=token_truncate")
    answer = page.apply_json(OFF_POLICY)
    assert answer["tokens"]["ratio"] == [[1.0, 1.0], [1.0, 1.0]]
    shown = page.page.inner_text("#warnings")
    assert "No old_per_token_logps" in shown and "on-policy" not in shown
    assert "compares π_old with the sampler" in shown
    _shot(page, "#warnings", "warning-sampler-without-old.png")
    page.check_clean()


def _compare(page: Page, query: str) -> list[dict[str, str]]:
    page.open(query)
    page.current_chart("compare-rows")
    page.wait_for("Number(document.body.dataset.compared || 0) > 0")
    return list(
        page.page.eval_on_selector_all(
            "#compare-notes li", "items => items.map((li) => ({preset: li.dataset.preset, text: li.innerText}))"
        )
    )


def test_compare_says_which_columns_leave_the_runs_correction_out(page: Page) -> None:
    """The main view corrects (sequence_mask, C_max 3); Compare's presets as they are apply none: each column
    says so. With 'apply my edits to every preset' every column corrects alike: no note."""
    notes = _compare(page, CORRECTED + "&compare=trl-grpo,verl-grpo")
    assert [n["preset"] for n in notes] == ["trl-grpo", "verl-grpo"]
    assert all("applies no rollout correction" in n["text"] for n in notes)
    _shot(page, "#view-compare", "compare-correction-notes.png")
    assert _compare(page, CORRECTED + "&compare=trl-grpo,verl-grpo&compare_edits=1") == []
    page.check_clean()


@pytest.mark.parametrize("preset", ["trl-grpo", "verl-grpo"])
def test_a_trainer_preset_mirrors_or_says_its_default_correction(page: Page, preset: str) -> None:
    """trl-grpo applies none and says TRL's vLLM default (sequence_mask, C_max 3) is left out; verl-grpo applies
    none, as verl's rollout_correction does by default (rollout_is and rollout_rs null), and says nothing of TRL's.
    The correction controls name the verl and TRL settings they stand for under either preset."""
    page.open(f"?scenario=mismatch-long-row&preset={preset}")
    answer = page.last()
    assert answer["config"]["rollout_correction"] == "none" and answer["config"]["rollout_rs"] is None
    summary = page.page.inner_text("#explanation")
    assert ("applies no rollout correction: TRL v1.16" in summary) == (preset == "trl-grpo")
    for field, words in {
        "rollout_correction": ("verl: rollout_correction.rollout_is", "TRL: vllm_importance_sampling_mode"),
        "rollout_rs": ("verl: rollout_correction.rollout_rs",),
    }.items():
        note = page.page.locator(f"#cfg-{field}-maps")
        assert note.is_visible(), field
        assert all(w in note.inner_text() for w in words), (field, note.inner_text())
    _shot(page, "#explanation", f"{preset}-summary.png")
    _shot(page, "#cfg-rollout_correction-maps >> xpath=..", f"{preset}-correction-control.png")
    page.check_clean()
