"""The page explains itself: one browser test per finding that is about the page.

The sentences themselves are checked numerically in tests/test_explain.py; here, that the page shows
what the library says, with the views the findings asked for.
"""

# ruff: noqa: F811  (the fixtures imported from test_browser are the test functions' parameters)
from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from test_browser import ARTIFACTS, Page, _api_loss, _masked, browser, page, server  # noqa: F401  (fixtures)

from grpo.examples import SCENARIOS


def _chart(page: Page, chart_id: str) -> dict[str, Any]:
    page.current_chart(chart_id)
    return dict(
        page.page.evaluate(
            f"(() => {{ const el = document.getElementById('{chart_id}'); "
            "return {data: el.data.map(t => ({name: t.name, x: t.x, y: t.y, z: t.z, "
            "zmid: t.zmid, customdata: t.customdata, yaxis: t.yaxis})), layout: el.layout}; })()"
        )
    )


def test_1_a_negative_kl_is_drawn_on_a_diverging_scale_and_explained(page: Page) -> None:
    page.open("?scenario=k1-negative&preset=article&beta=0.04&kl_estimator=k1")
    data = page.last()
    assert min(v for row in data["tokens"]["kl"] for v in row) == pytest.approx(-8.6, abs=1e-5)
    kl = _chart(page, "heat-kl")["data"][0]
    assert kl["zmid"] == 0 and kl["z"] == _masked(data, "kl")  # -8.6 is the deepest blue, not the palest cell
    text = page.page.inner_text("#explanation")
    assert "The KL estimate is negative on 5 of 9 tokens" in text and "on every token alike" in text
    assert "itself negative" in text
    for field in ("surrogate", "loss", "grad"):
        assert _chart(page, f"heat-{field}")["data"][0]["zmid"] == 0
    page.check_clean()


def test_2_switching_to_advantages_carries_the_computed_advantages(page: Page) -> None:
    page.open("?scenario=on-policy")
    data = page.last()
    loss, computed = data["loss"], data["rows"]["advantage"]
    assert computed[0] == pytest.approx(0.866, abs=1e-3)  # not the raw reward 1
    before = page.drawn()
    page.page.select_option("#in-target", "advantages")
    page.wait_drawn(before)
    shown = [float(page.page.input_value(f"[aria-label='row {i} advantages']")) for i in range(len(computed))]
    assert shown == computed
    assert page.last()["loss"] == pytest.approx(loss, rel=1e-6, abs=1e-9)  # the loss did not jump
    page.check_clean()


def test_4_a_negative_loss_scenario_names_its_rows_and_tokens(page: Page) -> None:
    page.open("?scenario=negative-loss")
    assert page.last()["loss"] < 0
    first = page.page.inner_text("#explanation li:first-child")
    assert first.startswith("The loss is negative") and "most negative loss shares: row" in first
    assert "token(s) with A > 0 have a ratio above 1" in first
    page.check_clean()


def test_5_the_header_names_what_is_loaded_and_a_failed_request_is_marked(page: Page, tmp_path: Path) -> None:
    page.open()
    assert page.page.inner_text("#loaded") == f"Loaded: {SCENARIOS['article'].title}"
    before = page.drawn()
    cell = page.page.locator("[aria-label='row 1 logp 4']")
    cell.fill("-0.25")
    cell.dispatch_event("change")
    page.wait_drawn(before)
    assert page.page.inner_text("#loaded").endswith(", edited")
    assert "(edited)" in page.page.inner_text("#scenario-title")
    assert page.page.inner_text("#scenario-text") != SCENARIOS["article"].notes
    good = tmp_path / "batch.jsonl"
    good.write_text(
        json.dumps({"per_token_logps": [-0.3, -0.6], "reward": 1.0})
        + "\n"
        + json.dumps({"per_token_logps": [-0.9], "reward": 0.0})
    )
    page.page.click("#tab-upload")
    before = page.drawn()
    page.page.set_input_files("#upload-file", str(good))
    page.wait_drawn(before)
    assert page.page.inner_text("#loaded") == "Loaded: uploaded batch.jsonl"
    assert page.page.inner_text("#scenario-title") == "From the file batch.jsonl"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"per_token_logps": "nope"}')
    page.page.set_input_files("#upload-file", str(bad))
    page.wait_for("document.body.classList.contains('stale')")
    assert page.page.is_visible("#stale-note") and "failed" in page.page.inner_text("#stale-note")
    assert page.page.inner_text("#upload-error") != ""
    before = page.drawn()
    page.page.select_option("#scenario", "on-policy")
    page.wait_drawn(before)
    assert not page.page.is_visible("#stale-note")
    page.errors.clear()  # the failed upload's 422 is logged by the browser as a failed resource
    page.check_clean()


def test_6_compare_counted_tokens_own_scales_constant_and_sentences(page: Page) -> None:
    page.open("?scenario=article&compare=article,trl-dapo,trl-dr_grpo")
    chart = _chart(page, "compare-weights")
    counted = page.last()["rows"]["length"]  # 2 counted tokens per row: three of five positions are prompt
    assert chart["data"][0]["x"] == [f"r{i} ({n})" for i, n in enumerate(counted)] and counted[0] == 2
    assert [t["yaxis"] for t in chart["data"]] == ["y", "y2", "y3"]  # every preset on its own scale
    dr = chart["data"][2]["y"][0]
    sentences = page.page.inner_text("#compare-lengths")
    assert "trl-dr_grpo:" not in sentences  # equal lengths: no length sentence is true to say
    before = int(page.page.evaluate("Number(document.body.dataset.compared || 0)"))
    page.page.fill("#compare-L", "64")
    page.page.dispatch_event("#compare-L", "change")
    page.wait_for(f"Number(document.body.dataset.compared || 0) > {before}")
    page.wait_for("window.grpoLens.isCurrent('compare-weights')")
    after = page.page.evaluate("document.getElementById('compare-weights').data[2].y[0]")
    assert after == pytest.approx(dr * 512 / 64, rel=1e-6)  # weight 1/(B·L): L 512 -> 64
    page.page.select_option("#scenario", "length-bias")
    page.wait_for("window.grpoLens.state.scenario === 'length-bias'")
    page.current_chart("compare-weights")
    page.wait_for("document.getElementById('compare-lengths').innerText.includes('article:')")
    text = page.page.inner_text("#compare-lengths")
    assert "4× less" in text and "no per-token length bias" in text
    page.check_clean()


def test_7_clipped_cells_are_marked_and_hover_names_a_bound_only_where_it_acted(page: Page) -> None:
    page.open("?scenario=off-policy-clipping")
    data = page.last()
    chart = _chart(page, "heat-surrogate")
    marks = chart["data"][1]
    regions = data["tokens"]["region"]
    clipped = [(j, k) for k, row in enumerate(regions) for j, g in enumerate(row) if g not in ("trust", "masked")]
    labels = chart["data"][0]["y"]
    assert sorted(zip(marks["x"], marks["y"], strict=True)) == sorted((j, labels[k]) for j, k in clipped)
    why = [[data["why"]["names"][c] for c in row] for row in data["tokens"]["why"]]
    for k, row in enumerate(chart["data"][0]["customdata"]):
        for j, cell in enumerate(row):
            named = "clipped" in cell[9] and "flat in the ratio" in cell[9]
            assert named == (why[k][j] in ("clip_low", "clip_high")), (k, j, cell[9])
            assert regions[k][j] in ("clip_low", "clip_high") or not named
    page.check_clean()


def test_8_every_metric_and_choice_is_explained_with_its_formula(page: Page) -> None:
    page.open("?scenario=article&preset=verl-grpo")
    rows = page.page.evaluate(
        "[...document.querySelectorAll('#metrics-table tbody tr')].map(r => [r.cells[0].innerText, r.title])"
    )
    blank = [name for name, title in rows if not title]
    assert blank == [], blank  # actor/pg_clipfrac, actor/kl_loss included
    glossary = (
        page.page.text_content("#glossary-table") or ""
    )  # off screen: innerText is empty under content-visibility
    assert "beta × actor/kl_loss" in glossary and "Σ kl_t / N" in glossary
    assert "A_i = R_i − mean_g R" in glossary and "std of the whole batch" in glossary
    assert "k3 = eˣ − x − 1" in glossary and "Σ_it ℓ_it / (B · L)" in glossary
    assert "Share of ALL counted tokens" in glossary
    page.check_clean()


def test_10_log_ticks_sticky_row_labels(page: Page) -> None:
    page.open("?scenario=off-policy-clipping")
    layout = _chart(page, "clip-curves")["layout"]
    assert "0.5" in layout["xaxis"]["ticktext"] and "2" in layout["xaxis"]["ticktext"]
    assert page.page.evaluate("getComputedStyle(document.querySelector('.tok-grid .lab')).position") == "sticky"
    ARTIFACTS.mkdir(exist_ok=True)
    page.page.screenshot(path=str(ARTIFACTS / "clipping.png"))
    page.check_clean()


def test_9_upload_tab_lists_tensors_examples_and_exports(page: Page, tmp_path: Path) -> None:
    page.open()
    page.page.click("#tab-upload")
    listing = page.page.inner_text("#upload-help")
    for name in ("per_token_logps", "(B, T)", "group_size", "() scalar", "bfloat16", "token_ids"):
        assert name in listing, name
    links = page.page.evaluate("[...document.querySelectorAll('#upload-help a')].map(a => a.getAttribute('href'))")
    assert links == [f"/api/v1/examples/{f}" for f in ("json", "jsonl", "safetensors", "npz")]
    paths = []
    for fmt in ("safetensors", "npz"):  # both exported from the scenario, then read back
        with page.page.expect_download() as info:
            page.page.click(f"#export-{fmt}")
        paths.append(tmp_path / f"input.{fmt}")
        paths[-1].write_bytes(Path(info.value.path()).read_bytes())
    expected = _api_loss(page.server, {**SCENARIOS["article"].request, "config": {"preset": "article"}})["loss"]
    for path in paths:
        before = page.drawn()
        page.page.set_input_files("#upload-file", str(path))
        page.wait_drawn(before)
        assert page.last()["loss"] == expected
    page.check_clean()


def test_11_upload_menu_formats_and_extensions_come_from_the_options(page: Page) -> None:
    """The upload's label, accepted extensions, example links and export buttons are /api/v1/options's
    formats (a new format is one entry in the library, not an edit of the page)."""
    page.open()
    with urllib.request.urlopen(f"{page.server}/api/v1/options") as r:
        formats = json.load(r)["formats"]
    page.page.click("#tab-upload")
    assert page.page.get_attribute("#upload-file", "accept") == formats["accept"]
    accepted = formats["accept"].split(",")
    assert accepted == [ext for f in formats["upload"] for ext in f["extensions"]] and ".pth" in accepted
    label = page.page.inner_text("#upload-label")
    shown = [f["label"] for f in formats["upload"]]
    assert label.startswith(f"A batch file: {', '.join(shown[:-1])} or {shown[-1]} ")
    links = page.page.evaluate("[...document.querySelectorAll('#upload-help a')].map(a => a.getAttribute('href'))")
    assert links == [f"/api/v1/examples/{f['name']}" for f in formats["upload"] if f["export"]]
    buttons = page.page.evaluate("[...document.querySelectorAll('#export-formats button')].map(b => b.id)")
    assert buttons == [f"export-{f['name']}" for f in formats["upload"] if f["export"] and f["name"] != "json"]
    page.check_clean()
