"""The charts' confusions (Confusions), in real headless Chromium: a heatmap's hover names the position
when the batch gave no token strings (no empty "token:"); cells that do not count look unlike a neutral value (a
ratio of 1) and the heatmap says which they are; no chart offers Plotly's "Share chart…" (nothing leaves this
machine); every section is drawn on beforeprint (and when asked), so printouts and full-page screenshots are whole;
the gradients chart keeps its axis title and ticks inside the figure, and a heatmap's hover leaves the row labels
readable. Screenshots go to test-artifacts/confusions-charts/."""

# ruff: noqa: F811  (the fixtures imported from test_browser are the test functions' parameters)
from __future__ import annotations

from pathlib import Path

import pytest
from test_browser import ARTIFACTS, CHROMIUM, Page, browser, page, server  # noqa: F401

from grpo.examples import SCENARIOS

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed")

SHOTS = ARTIFACTS / "confusions-charts"
# the article's example without its token strings: the page has only positions to show
NO_TEXT = {k: v for k, v in SCENARIOS["article"].request.items() if k != "tokens"}


def _shot(page: Page, selector: str, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.page.add_style_tag(content=".topbar { position: static !important; }")
    page.page.locator(selector).scroll_into_view_if_needed()
    page.painted()  # the scroll's repaint
    page.page.locator(selector).screenshot(path=str(SHOTS / name))


def _hover_at(page: Page, chart: str, k: int, j: int) -> str:
    """Moves the mouse over cell (row k, position j) of a heatmap; the hover's text."""
    answer = page.last()
    page.page.evaluate(f"document.getElementById('{chart}').scrollIntoView({{block: 'center'}})")
    page.wait_for(f"window.grpoLens.isCurrent('{chart}')")
    box = page.page.locator(f"#{chart} .nsewdrag").first.bounding_box()
    assert box is not None
    width = max(len(r) for r in answer["tokens"]["ratio"])
    rows = len(answer["tokens"]["ratio"])
    page.page.mouse.move(box["x"] + box["width"] * (j + 0.5) / width, box["y"] + box["height"] * (k + 0.5) / rows)
    page.wait_for(f"document.querySelector('#{chart} .hoverlayer .hovertext') !== null")
    return page.page.text_content(f"#{chart} .hoverlayer") or ""


def test_a_hover_without_token_strings_shows_no_empty_token(page: Page) -> None:
    page.open()
    page.apply_json(NO_TEXT)
    assert "text" not in page.last()["tokens"]
    hover = _hover_at(page, "heat-ratio", 0, 4)
    assert "token:" not in hover, hover
    assert "position 4" in hover and "ratio" in hover, hover
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.page.locator("#heat-ratio").screenshot(path=str(SHOTS / "hover-no-token-strings.png"))
    page.check_clean()


def test_a_hover_with_token_strings_names_the_token(page: Page) -> None:
    page.open()
    hover = _hover_at(page, "heat-ratio", 0, 4)
    token = page.last()["tokens"]["text"][0][4]
    assert f"token: {token}" in hover, hover
    page.check_clean()


def test_a_hover_shows_the_tokens_entropy(page: Page) -> None:
    page.open()
    entropies = [[0.5 + 0.25 * j for j in range(len(r))] for r in SCENARIOS["article"].request["per_token_logps"]]
    page.apply_json({**SCENARIOS["article"].request, "entropies": entropies})
    hover = _hover_at(page, "heat-ratio", 0, 4)
    assert "entropy 1.5" in hover, hover


def test_cells_that_do_not_count_look_unlike_a_ratio_of_1(page: Page) -> None:
    page.open()
    page.current_chart("heat-ratio")
    layout = page.page.evaluate(
        "(({plot_bgcolor, xaxis}) => ({plot_bgcolor, title: xaxis.title.text}))"
        "(document.getElementById('heat-ratio').layout)"
    )
    bg = layout["plot_bgcolor"].lstrip("#")
    rgb = [int(bg[i : i + 2], 16) for i in (0, 2, 4)]
    # the scale's centre (a ratio of 1) is #f7f7f7: the bare cells are far darker than it
    assert sum(rgb) / 3 < 0xC0, layout
    assert "not counted" in layout["title"], layout
    _shot(page, "#heat-ratio", "heat-ratio-not-counted.png")
    page.check_clean()


def test_no_chart_offers_share_chart(page: Page) -> None:
    page.open()
    page.current_chart("heat-ratio")
    page.current_chart("grad-tokens")
    titles = page.page.evaluate("[...document.querySelectorAll('.modebar-btn')].map(b => b.dataset.title)")
    assert titles, "the charts have a modebar"
    assert not [t for t in titles if "Share" in t or "Cloud" in t], titles
    assert page.page.locator("text=Share chart").count() == 0
    page.check_clean()


def test_every_section_is_drawn_before_printing(page: Page) -> None:
    page.open()
    page.wait_for("Number(document.body.dataset.experiments || 0) > 0")
    ids = page.page.evaluate("[...document.querySelectorAll('.chart')].map(el => el.id)")
    page.page.evaluate("window.dispatchEvent(new Event('beforeprint'))")
    page.wait_for(f"{ids!r}.every(id => window.grpoLens.isCurrent(id))", timeout=90)
    blank = page.page.evaluate(
        "[...document.querySelectorAll('.chart')].filter(el => !el.querySelector('.main-svg')).map(el => el.id)"
    )
    assert blank == [], blank
    # and painted: no section is skipped as off screen (content-visibility: auto) in a full-page screenshot
    skipped = page.page.evaluate(
        "[...document.querySelectorAll('.view')].filter(v => getComputedStyle(v).contentVisibility === 'auto').length"
    )
    assert skipped == 0
    page.page.emulate_media(media="print")
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.page.screenshot(path=str(SHOTS / "print-full-page.png"), full_page=True)
    page.check_clean()


def test_the_gradients_chart_keeps_its_axis_title_and_ticks(page: Page) -> None:
    page.open()
    page.current_chart("grad-tokens")
    chart = page.page.locator("#grad-tokens").bounding_box()
    title = page.page.locator("#grad-tokens .ytitle").bounding_box()
    assert chart is not None and title is not None
    assert title["x"] >= chart["x"] and title["y"] >= chart["y"], (title, chart)
    assert title["y"] + title["height"] <= chart["y"] + chart["height"], (title, chart)
    ticks = page.page.locator("#grad-tokens .ytick text").all_text_contents()
    assert len(ticks) >= 3, ticks
    _shot(page, "#grad-tokens", "gradients-axis.png")
    # Compare's gradients, one panel per preset: each axis title inside the figure, each panel's ticks drawn
    page.current_chart("compare-grads")
    chart = page.page.locator("#compare-grads").bounding_box()
    titles = page.page.locator("#compare-grads .infolayer [class^='g-y'][class$='title']")
    assert chart is not None and titles.count() >= 2
    for i in range(titles.count()):
        box = titles.nth(i).bounding_box()
        assert box is not None and box["x"] >= chart["x"] and box["y"] >= chart["y"], (i, box, chart)
    # every tick label inside the figure (the top panel's were above it), at least 3 per panel
    ticks = page.page.evaluate(
        "[...document.querySelectorAll('#compare-grads .yaxislayer-above')].map(g => [...g.querySelectorAll('text')]"
        ".map(t => t.getBoundingClientRect().top))"
    )
    assert len(ticks) >= 2 and all(len(p) >= 3 for p in ticks), ticks
    assert min(min(p) for p in ticks) >= chart["y"], (ticks, chart)
    _shot(page, "#compare-grads", "compare-gradients-axes.png")
    page.check_clean()


def test_a_hover_leaves_the_row_labels_readable(page: Page) -> None:
    page.open()
    answer = page.last()
    width = max(len(r) for r in answer["tokens"]["ratio"])
    _hover_at(page, "heat-ratio", 0, width - 1)  # the rightmost cell: its hover opens to the left
    hover = page.page.locator("#heat-ratio .hoverlayer .hovertext").bounding_box()
    labels = page.page.locator("#heat-ratio .ytick text").first.bounding_box()
    assert hover is not None and labels is not None
    assert hover["x"] >= labels["x"] + labels["width"], (hover, labels)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.page.locator("#heat-ratio").screenshot(path=str(SHOTS / "hover-row-labels.png"))
    page.check_clean()
