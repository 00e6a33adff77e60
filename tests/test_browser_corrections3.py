"""The corrections told as they are, on the page (Corrections), in real headless Chromium: the long-row
scenario under TRL's default (sequence_mask, C_max 3, which drops row 3) with verl's rollout_rs token_k1 on
[0.965, 1.1] (19 tokens rejected). A dropped token's hover says it gets no policy gradient beside its gradient of 0;
the scatter's title names rollout_rs and its count; the k1 thresholds say they bound −log r; the summary names the
dropped row; the rows table shows the sampler ratio and the row's weight 0; the trl-grpo preset says what it leaves
out; the correction controls name verl's and TRL's settings under them; and the counts agree across the summary,
the rows table, the hovers and the Mismatch view. Screenshots go to test-artifacts/corrections3/."""

# ruff: noqa: F811  (the fixtures imported from test_browser are the test functions' parameters)
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_browser import ARTIFACTS, CHROMIUM, Page, browser, page, serve, server  # noqa: F401

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed")

SHOTS = ARTIFACTS / "corrections3"
QUERY = (
    "?scenario=mismatch-long-row&preset=trl-grpo&rollout_correction=sequence_mask&rollout_is_max=3"
    "&rollout_rs=token_k1&rollout_rs_threshold=0.965_1.1"
)
TAGGED = """(sel) => [...document.querySelectorAll(sel + ' [data-quantity]')].map(e => ({
  quantity: e.dataset.quantity, value: Number(e.dataset.value), text: e.textContent }))"""


def _shot(page: Page, selector: str, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.page.add_style_tag(content=".topbar { position: static !important; }")
    page.page.locator(selector).scroll_into_view_if_needed()
    page.painted()  # the scroll's repaint
    page.page.locator(selector).screenshot(path=str(SHOTS / name))


def _summary(page: Page, key: str) -> Any:
    """The summary's sentence of ``key`` (the answer's explanation_keys say which <li> it is)."""
    i = page.last()["explanation_keys"].index(key)
    return page.page.locator("#explanation li").nth(i)


def _hover_at(page: Page, chart: str, k: int, j: int) -> str:
    """Moves the mouse over cell (row k, position j) of a heatmap and returns the hover's text."""
    answer = page.last()
    page.page.evaluate(f"document.getElementById('{chart}').scrollIntoView({{block: 'center'}})")
    box = page.page.locator(f"#{chart} .nsewdrag").first.bounding_box()
    assert box is not None
    width = max(len(r) for r in answer["tokens"]["ratio"])
    rows = len(answer["tokens"]["ratio"])
    page.page.mouse.move(box["x"] + box["width"] * (j + 0.5) / width, box["y"] + box["height"] * (k + 0.5) / rows)
    page.wait_for(f"document.querySelector('#{chart} .hoverlayer .hovertext') !== null")
    return page.page.text_content(f"#{chart} .hoverlayer") or ""


def test_the_corrections_are_told_as_they_are(page: Page) -> None:
    page.open(QUERY)
    answer = page.last()
    m = answer["mismatch"]
    assert m["counts"]["rejected"] == 19
    # 1. a dropped token's hover: no policy gradient, beside its gradient of 0
    page.current_chart("heat-grad")
    cells = page.page.evaluate("document.getElementById('heat-grad').data[0].customdata")
    masked = answer["correction_names"].index("masked")  # sequence_mask's weight 0: the whole of row 3
    k, j = next(
        (k, j) for k, row in enumerate(answer["tokens"]["correction"]) for j, c in enumerate(row) if c == masked
    )
    assert k == 3
    why = cells[k][j][9].replace("<br>", " ")  # Plotly's hover wraps its lines with <br>
    assert "no policy gradient" in why and "gets a policy gradient" not in why
    assert float(cells[k][j][5]) == 0  # the policy part of the gradient
    hover = _hover_at(page, "heat-grad", k, j)  # its lines are joined without a space
    assert "dropped by the rollout correction" in hover and "policy gradient" in hover, hover
    assert "gets a policy gradient" not in hover
    SHOTS.mkdir(parents=True, exist_ok=True)
    chart = page.page.locator("#heat-grad").bounding_box()
    assert chart is not None
    page.page.screenshot(
        path=str(SHOTS / "dropped-token-hover.png"),
        clip={"x": chart["x"], "y": chart["y"] - 60, "width": chart["width"], "height": chart["height"] + 60},
    )
    page.page.mouse.move(0, 0)
    # 2. the scatter's title names every correction in force, rollout_rs's count included
    page.current_chart("mismatch-scatter")
    title = page.page.evaluate("document.getElementById('mismatch-scatter').layout.title.text")
    assert "sequence_mask" in title or "sequence IS" in title
    assert "rollout_rs token_k1: 19 tokens rejected" in title, title
    # 3. the k1 thresholds bound −log r, not r
    thresholds = page.page.text_content("#mismatch-thresholds") or ""
    assert "−log r = sampler − old" in thresholds and "a ratio bound on" not in thresholds
    _shot(page, "#view-mismatch", "mismatch-view.png")
    # 4. the summary names the dropped row and the rejected tokens
    sentence = _summary(page, "correction")
    text = sentence.inner_text()
    assert "the whole of row 3" in text and "rollout_rs rejected 19 token(s)" in text, text
    # 6. (trl-grpo with TRL's correction set: the preset's note is not shown)
    assert "trl_correction" not in answer["explanation_keys"]
    _shot(page, "#explanation", "summary.png")
    # 5. the rows table: the sampler ratio and the row's weight beside the policy's ratio
    page.page.evaluate("document.getElementById('rows-table').scrollIntoView()")  # drawn when in view
    page.wait_for("document.querySelector('#rows-table thead') !== null")
    head = page.page.locator("#rows-table thead").inner_text()
    for label in ("sampler ratio exp(Σ old − sampler)", "IS weight (row)", "policy ratio", "dropped", "rejected"):
        assert label in head, head
    weight = page.page.locator("#rows-table [data-quantity='rows/rollout_weight/3']")
    ratio = page.page.locator("#rows-table [data-quantity='rows/rollout_is_ratio/3']")
    assert weight.inner_text() == "0" and float(ratio.inner_text()) == pytest.approx(3.447, abs=1e-3)
    page.page.evaluate("(w => { w.scrollLeft = w.scrollWidth; })(document.getElementById('rows-wrap'))")
    _shot(page, "#view-rows", "rows-table.png")
    # 7. the consistency of the counts: summary, rows table, hovers, Mismatch view
    summary = {t["quantity"]: t["value"] for t in page.page.evaluate(TAGGED, "#explanation")}
    rows = page.page.evaluate(TAGGED, "#rows-table")
    per_row = {
        name: sum(t["value"] for t in rows if t["quantity"].startswith(f"rows/{name}/"))
        for name in ("rollout_dropped", "rollout_rejected")
    }
    hovers = [c[9].replace("<br>", " ") for row in cells for c in row]
    said = {t["quantity"]: t["value"] for t in page.page.evaluate(TAGGED, "#view-mismatch")}
    rejected, dropped = m["counts"]["rejected"], m["counts"]["masked"]
    assert summary["mismatch/counts/rejected"] == per_row["rollout_rejected"] == rejected
    assert said["mismatch/stats/rejected_tokens"] == rejected
    assert sum("rejected by verl's rollout_rs" in h for h in hovers) == rejected
    assert summary["mismatch/counts/masked"] == per_row["rollout_dropped"] == dropped
    assert sum("dropped by the rollout correction" in h for h in hovers) == dropped
    page.check_clean()


def test_the_scatter_title_does_not_say_no_correction_while_rollout_rs_rejects(page: Page) -> None:
    page.open(QUERY.replace("rollout_correction=sequence_mask", "rollout_correction=none"))
    page.current_chart("mismatch-scatter")
    title = page.page.evaluate("document.getElementById('mismatch-scatter').layout.title.text")
    rejected = page.last()["mismatch"]["counts"]["rejected"]
    assert rejected > 0 and "no correction" not in title
    assert f"rollout_rs token_k1: {rejected} tokens rejected" in title and "no IS weight" in title, title
    page.check_clean()


def test_a_trl_preset_says_what_it_leaves_out_and_the_controls_name_verl_and_trl(page: Page) -> None:
    page.open("?scenario=mismatch-long-row&preset=trl-grpo")
    answer = page.last()
    assert answer["config"]["rollout_correction"] == "none"
    text = _summary(page, "trl_correction").inner_text()
    assert "trl-grpo" in text and "use_vllm" in text and "sequence_mask" in text and "rollout_is_max = 3" in text
    _shot(page, "#explanation", "trl-grpo-note.png")
    maps = {
        "rollout_correction": ("rollout_correction.rollout_is", "vllm_importance_sampling_mode"),
        "rollout_is_max": ("rollout_is_threshold", "vllm_importance_sampling_clip_max"),
        "rollout_rs": ("rollout_correction.rollout_rs",),
        "rollout_rs_threshold": ("rollout_correction.rollout_rs_threshold", "0.5_5", "−log r"),
        "off_policy_mask_threshold": ("TRL: off_policy_mask_threshold",),
    }
    for field, words in maps.items():
        note = page.page.locator(f"#cfg-{field}-maps")
        assert note.is_visible(), field
        for w in words:
            assert w in note.inner_text(), (field, w)
    SHOTS.mkdir(parents=True, exist_ok=True)
    for field in ("rollout_correction", "rollout_rs_threshold"):  # each control with its note, as drawn
        control = page.page.locator(f"#cfg-{field}-maps").locator("xpath=..")
        control.scroll_into_view_if_needed()
        control.screenshot(path=str(SHOTS / f"control-{field}.png"))
    page.check_clean()
