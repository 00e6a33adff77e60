"""Disagreeing numbers, on the page: under verl-gmpo the metrics table, Compare and the clip view
tell one clip fraction per meaning with GMPO's log-ratio bounds; Compare says what makes kl differ; the beta
warning names the presets that set beta; a ratio no clip holds reads "unbounded".

The batch is the article's scenario: rows 0-2 with A = -1, 2, 1, ratios (52.49, 1.457), (0.2811, 4.972),
(0.9552, 2.296). The library-level checks for every preset are in tests/test_numbers_agree.py.
"""

# ruff: noqa: F811  (the fixtures imported from test_browser are the test functions' parameters)
from __future__ import annotations

import math

import pytest
from test_browser import ARTIFACTS, Page, browser, page, server  # noqa: F401  (fixtures)

ROWS = """() => Object.fromEntries([...document.querySelectorAll('#compare-table tbody tr')].map(
  tr => [tr.cells[0].innerText, [...tr.cells].slice(1).map(td => td.innerText)]))"""


def _open_with_compare(page: Page, query: str) -> None:
    page.open(query)
    page.current_chart("compare-rows")
    page.wait_for("Number(document.body.dataset.compared || 0) > 0")


def test_gmpo_clip_fractions_agree_across_metrics_compare_and_the_clip_view(page: Page) -> None:
    """Before: Compare's clip_ratio/region_mean 0 for verl-gmpo (a metric geo_mean does not compute), the
    summary's 2 of 6, actor/pg_clipfrac 0.5 described with 1.4 / 0.6, pg_clipfrac_lower a 'dual-clip fraction';
    the clip view drew the ratio-52.49 token at -52.49, its row's GMPO term being -8.747."""
    _open_with_compare(page, "?scenario=article&preset=verl-gmpo&compare=verl-gmpo,trl-grpo,verl-grpo")
    answer = page.last()
    heads = page.page.evaluate("[...document.querySelectorAll('#compare-table thead th')].map(t => t.innerText)")
    assert heads[1:] == ["verl-gmpo", "trl-grpo", "verl-grpo"]
    rows = page.page.evaluate(ROWS)
    # verl-gmpo: A > 0 tokens with log-ratio outside [-0.4, 0.4]: 0.2811, 4.972, 2.296: 3 of 6; A < 0: 52.49: 1 of 6
    assert rows["actor/pg_clipfrac"][0] == "0.5" and rows["actor/pg_clipfrac_lower"][0] == "0.16667"
    assert rows["clip_ratio/region_mean"][0] == "—"  # not a 0 geo_mean never computed
    # the metrics table: the same values, with GMPO's own bounds
    table = page.page.evaluate(
        "Object.fromEntries([...document.querySelectorAll('#metrics-table tbody tr')].map("
        "tr => [tr.cells[0].innerText, [tr.cells[1].innerText, tr.title]]))"
    )
    assert table["actor/pg_clipfrac"][0] == "0.5" and table["actor/pg_clipfrac_lower"][0] == "0.16667"
    assert "clip_ratio/region_mean" not in table
    assert "(ε_low = 0.4, ε_high = 0.4), on either side" in table["actor/pg_clipfrac"][1]
    assert "1.4" not in table["actor/pg_clipfrac"][1]
    assert "Not a dual-clip fraction" in table["actor/pg_clipfrac_lower"][1]
    # the summary: the 2 of pg_clipfrac's 3 above ε_high get no gradient
    assert "2 of 6 tokens get no policy gradient: 2 clipped high" in page.page.inner_text("#explanation")
    assert answer["why"]["counts"]["clip_high"] == 2 and answer["why"]["counts"]["unbounded"] == 1
    # kl: what differs between the columns (trl-grpo 1.7035, the others 0.76298)
    assert rows["kl"][1] != rows["kl"][2]
    bias = next(v for k, v in rows.items() if k.startswith("kl_bias_correction"))
    assert bias == ["off", "on", "off"] and rows["kl_clamp"] == ["10", "—", "10"]
    assert rows["kl_estimator"] == ["k3", "k3", "k3"]
    page.page.locator("#view-compare").screenshot(path=str(ARTIFACTS / "numbers3-compare-gmpo.png"))
    page.page.locator("#metrics-table").screenshot(path=str(ARTIFACTS / "numbers3-metrics-gmpo.png"))

    # the clip view: row 0's tokens at its term -sqrt(52.49 · 1.457) = -8.747, marked unbounded / trust
    page.current_chart("clip-curves")
    traces = page.page.evaluate(
        "document.getElementById('clip-curves').data.filter(t => t.mode === 'markers')"
        ".map(t => ({name: t.name, y: [...t.y], x: [...t.x], hover: t.hovertemplate}))"
    )
    unbounded = next(t for t in traces if t["name"] == "unbounded")
    assert unbounded["x"][0] == pytest.approx(52.494, rel=1e-4)
    assert unbounded["y"][0] == pytest.approx(-math.sqrt(52.49405893230762 * 1.4574670036775483), rel=1e-5)
    assert "row's term per unit Ā" in unbounded["hover"]
    page.page.locator("#clip-curves").screenshot(path=str(ARTIFACTS / "numbers3-clip-gmpo.png"))
    page.check_clean()


def test_the_beta_warning_and_the_weight_ratio_read_true(page: Page) -> None:
    """Before: "TRL's and verl's presets default to beta 0" (verl-grpo has 0.001)."""
    page.open("?scenario=article&preset=trl-grpo")
    text = page.page.inner_text("#warnings")
    assert "default to beta 0" not in text
    assert "the presets that set beta: article (beta = 0.01), verl-grpo (beta = 0.001)" in text
    page.page.locator("#warnings").screenshot(path=str(ARTIFACTS / "numbers3-beta-warning.png"))
    page.check_clean()
