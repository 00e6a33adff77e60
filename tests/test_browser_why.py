"""One story per number on the page (in Chromium): each token's why in its
hover, counts that agree, descriptions with the config's numbers, one gradient sign, and every number the
page prints tagged with the quantity it shows and equal to that quantity wherever else it is printed.

The same checks at the data level, for every scenario under every preset, are in tests/test_consistency.py;
here a sample of scenarios and presets that covers every view.
"""

# ruff: noqa: F811  (the fixtures imported from test_browser are the test functions' parameters)
from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

import pytest
import torch
from test_browser import ARTIFACTS, Page, browser, page, server  # noqa: F401  (fixtures)

import grpo
from grpo.examples import SCENARIOS

# Where the page prints numbers of a loss answer (the compare table: the compare answer's).
NUMBER_VIEWS = (
    "#summary-cards",
    "#explanation",
    "#warnings",
    "#metrics-table tbody",
    "#clamp-counts",
    "#rows-table",
    "#compare-table",
    "#mismatch-thresholds",
    "#mismatch-sentences",
)

# Every text node in those views with a digit outside an element tagged with its quantity: names that hold
# digits (k1, clip_ratio/..., row 2) and the constants 0 and 1 of the formulas (A > 0, ratio above 1) are no
# quantities; anything else is an untagged number.
UNTAGGED = """(selectors) => {
  const out = [];
  for (const sel of selectors) {
    const root = document.querySelector(sel);
    if (!root) continue;
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    for (let n = walker.nextNode(); n; n = walker.nextNode()) {
      if (n.parentElement.closest('[data-quantity]')) continue;
      const text = n.textContent
        .replace(/\\brows? \\d+/g, '')
        .replace(/[A-Za-z_./-]*[A-Za-z_][A-Za-z_./-]*\\d+[A-Za-z_./\\d-]*/g, '')
        .replace(/\\b[01]\\b/g, '');
      if (/\\d/.test(text)) out.push([sel, n.textContent]);
    }
  }
  return out;
}"""

TAGGED = """() => [...document.querySelectorAll('[data-quantity]')].map(e => ({
  quantity: e.dataset.quantity, value: e.dataset.value, text: e.textContent, preset: e.dataset.preset || null,
  view: (e.closest('[id]') || {}).id }))"""


# The answer's per-row and per-token arrays are float32 numbers in JSON (its shortest form), a sentence's
# value the float64 of the same float32: they agree to float32's precision.
FLOAT32 = 1e-6


def _open_with_compare(page: Page, query: str) -> None:
    page.open(query)
    page.current_chart("compare-rows")
    page.wait_for("window.grpoLens.isCurrent('compare-grads') || !document.getElementById('compare-grads').data")


def _answer_value(answer: dict[str, Any], quantity: str) -> float | None:
    head, _, rest = quantity.partition("/")
    if head in ("loss", "policy_loss", "kl_loss", "objective") and not rest:
        return float(answer[head])
    if head == "metrics":
        return float(answer["metrics"][rest])
    if head == "rows":
        field, _, i = rest.rpartition("/")
        return float(i) if field == "index" else answer["rows"][field][int(i)]
    if head == "clamp_counts":
        return float(answer["clamp_counts"][rest])
    if head == "zero_std_groups":
        return float(answer["zero_std_groups"][int(rest)])
    if head == "config":
        config = answer["config"]
        sides = {"1+epsilon_high": 1 + config["epsilon_high"], "1-epsilon_low": 1 - config["epsilon_low"]}
        return float(sides[rest] if rest in sides else config[rest])
    return None


# A sample covering every view: sentences of each kind (unbounded, dual clip, delta, GSPO, zero std,
# negative KL, clamps, length weights), the rows and metrics tables, and Compare with the same preset;
# every scenario and every preset on screen at least once (test_the_sample_covers_every_scenario_and_preset).
SAMPLE = [
    "?scenario=article&preset=verl-gmpo&compare=verl-gmpo,verl-grpo",
    "?scenario=article&preset=article&dual_clip=3&compare=article&compare_edits=1",
    "?scenario=off-policy-clipping&preset=trl-gspo&compare=trl-gspo,trl-grpo",
    "?scenario=kl-blowup&preset=verl-grpo&compare=verl-grpo",
    "?scenario=k1-negative&preset=trl-vespo&compare=trl-vespo,article",
    "?scenario=length-bias&preset=trl-dr_grpo&compare=trl-dr_grpo,article",
    "?scenario=on-policy&preset=trl-grpo&compare=trl-grpo",
    "?scenario=all-correct&preset=trl-dapo&compare=trl-dapo",
    "?scenario=negative-loss&preset=trl-cispo&compare=trl-cispo",
    "?scenario=off-policy-clipping&preset=trl-sapo&compare=trl-sapo",
    "?scenario=kl-blowup&preset=verl-dapo&compare=verl-dapo",
    "?scenario=k1-negative&preset=verl-gspo&compare=verl-gspo",
    "?scenario=off-policy-clipping&preset=verl-clip_cov&compare=verl-clip_cov",
    "?scenario=off-policy-clipping&preset=verl-kl_cov&compare=verl-kl_cov",
    "?scenario=off-policy-clipping&preset=verl-dppo_tv&compare=verl-dppo_tv",
    "?scenario=negative-loss&preset=verl-dppo_kl&compare=verl-dppo_kl",
    # (the rollout correction set over the preset: compared with other presets, whose columns differ)
    "?scenario=mismatch-bf16&preset=trl-grpo&rollout_correction=sequence_mask&compare=article",
    "?scenario=mismatch-long-row&preset=trl-grpo&rollout_correction=sequence_mask&rollout_rs=seq_sum_k1"
    "&rollout_rs_threshold=0.5_2&off_policy_mask_threshold=0&compare=trl-dapo",
    "?scenario=mismatch-one-token&preset=verl-grpo&rollout_correction=token_mask&rollout_is_min=0.5&rollout_is_max=2"
    "&rollout_is_log_ratio_clamp=20&compare=verl-dapo",
]


def test_the_sample_covers_every_scenario_and_preset() -> None:
    """A scenario or preset added later joins the browser sample (the data-level check, tests/test_consistency.py,
    takes every pair already)."""
    pages = [dict(q.split("=", 1) for q in query[1:].split("&")) for query in SAMPLE]
    assert {p["scenario"] for p in pages} == set(SCENARIOS)
    assert {p.get("preset", "article") for p in pages} == set(grpo.PRESETS)


@pytest.mark.parametrize("query", SAMPLE)
def test_every_number_on_the_page_is_tagged_and_agrees_with_its_quantity(page: Page, query: str) -> None:
    _open_with_compare(page, query)
    page.page.evaluate("document.getElementById('rows-table').scrollIntoView()")
    answer = page.last()
    untagged = page.page.evaluate(UNTAGGED, list(NUMBER_VIEWS))
    assert untagged == [], untagged
    tagged = page.page.evaluate(TAGGED)
    assert {t["view"] for t in tagged} >= {"summary-cards", "explanation", "metrics-table", "rows-table"}
    preset = answer["config"]["preset"]
    values: dict[str, set[float]] = defaultdict(set)
    for t in tagged:
        assert t["value"] != "" or t["text"] == "–", t
        if t["preset"] not in (None, preset) or t["value"] == "":
            continue  # another preset's column of the compare table
        value = float(t["value"])
        values[t["quantity"]].add(value)
        expected = _answer_value(answer, t["quantity"])
        if expected is not None:
            assert value == pytest.approx(expected, rel=FLOAT32, abs=1e-12), t
        # the text printed is the value, to the digits shown
        printed = t["text"].rstrip("%")
        if re.fullmatch(r"-?[\d.]+(e[-+]?\d+)?", printed):
            if t["text"].endswith("%"):  # one decimal of a percentage
                assert float(printed) / 100 == pytest.approx(value, abs=5e-4), t
            else:
                assert float(printed) == pytest.approx(value, rel=5e-4, abs=1e-12), t
    # one quantity, one value: the summary, the metrics table, the sentences and compare agree
    spread = {q: v for q, v in values.items() if max(v) - min(v) > FLOAT32 * max(abs(x) for x in v)}
    assert spread == {}
    # the hovers: each number as format.js prints it, equal to the answer's
    page.current_chart("heat-grad")
    cells = page.page.evaluate("document.getElementById('heat-grad').data[0].customdata")
    for k, row in enumerate(answer["tokens"]["grad"]):
        for j, g in enumerate(row):
            if answer["tokens"]["mask"][k][j]:
                assert float(cells[k][j][4]) == pytest.approx(g, rel=5e-4, abs=1e-12)
    page.check_clean()


def test_the_why_of_each_token_counts_once_and_names_what_would_bound_it(page: Page) -> None:
    """Before: with dual_clip on, the summary said '3 of 6 tokens sit in a flat clip region' while
    clip_ratio/region_mean said 0.333, described as 'no policy gradient'; the ratio-52 token with A < 0
    was 'region: trust'."""
    page.open("?scenario=article&preset=article")
    answer = page.last()
    assert answer["why"]["counts"]["unbounded"] == 2
    text = page.page.inner_text("#explanation")
    assert "2 token(s) with A < 0 have a ratio above 1 + ε_high = 1.2 (up to 52.49) and nothing bounds them" in text
    page.current_chart("heat-ratio")
    cells = page.page.evaluate("document.getElementById('heat-ratio').data[0].customdata")
    why, names = answer["tokens"]["why"], answer["why"]["names"]
    k, j = next((k, j) for k, row in enumerate(why) for j, c in enumerate(row) if names[c] == "unbounded")
    assert "unbounded" in cells[k][j][9] and "dual_clip = off" in cells[k][j][9]

    before = page.drawn()
    page.page.evaluate("document.querySelector('[aria-label=\"dual_clip on\"]').click()")
    page.wait_drawn(before)
    answer = page.last()
    c = answer["config"]["dual_clip"]
    counts = answer["why"]["counts"]
    n = answer["metrics"]["lens/num_tokens"]
    sentence = page.page.locator("#explanation li", has_text="get no policy gradient")
    silent = sentence.locator("[data-quantity='why/no_gradient']").get_attribute("data-value")
    assert float(silent or "nan") == counts["clip_high"] + counts["clip_low"] + counts["dual_clip"] == 3
    region = sentence.locator("[data-quantity='metrics/clip_ratio/region_mean']").get_attribute("data-value")
    assert float(region or "nan") == pytest.approx((counts["clip_high"] + counts["clip_low"]) / n)
    assert "count only the clipped ones" in sentence.inner_text()
    page.current_chart("heat-ratio")
    cells = page.page.evaluate("document.getElementById('heat-ratio').data[0].customdata")
    why, names = page.last()["tokens"]["why"], page.last()["why"]["names"]
    k, j = next((k, j) for k, row in enumerate(why) for j, code in enumerate(row) if names[code] == "dual_clip")
    assert f"dual_clip = {c:g}" in cells[k][j][9] and f"held at {c:g}·A" in cells[k][j][9]
    # the hover, looked at: the dual-clip token's cell
    page.page.evaluate("document.getElementById('heat-ratio').scrollIntoView({block: 'center'})")
    box = page.page.locator("#heat-ratio .nsewdrag").first.bounding_box()
    assert box is not None
    width = len(answer["tokens"]["ratio"][0])
    rows = len(answer["tokens"]["ratio"])
    page.page.mouse.move(box["x"] + box["width"] * (j + 0.5) / width, box["y"] + box["height"] * (k + 0.5) / rows)
    page.wait_for("document.querySelector('#heat-ratio .hoverlayer .hovertext') !== null")
    ARTIFACTS.mkdir(exist_ok=True)
    chart = page.page.locator("#heat-ratio").bounding_box()
    assert chart is not None
    page.page.screenshot(
        path=str(ARTIFACTS / "why-hover.png"),
        clip={"x": chart["x"], "y": chart["y"] - 80, "width": chart["width"], "height": chart["height"] + 80},
    )
    hover = page.page.text_content("#heat-ratio .hoverlayer") or ""
    assert "dual clip" in hover and "no policy gradient" in hover
    page.check_clean()


def test_descriptions_take_their_numbers_from_the_config_on_screen(page: Page) -> None:
    """Before: actor/pg_clipfrac_lower read '(verl clip_ratio_c = 3)' whatever the dual clip was; the
    dual-clip checkbox filled 2; the GSPO hover printed 1 + 4e-4 as '1'; reward_std was 'the std of the
    rewards' while the number was the mean of per-group stds."""

    def meaning(name: str) -> str:
        return str(
            page.page.evaluate(
                "(name) => [...document.querySelectorAll('#metrics-table tbody tr')]"
                ".find(r => r.cells[0].innerText === name).title",
                name,
            )
        )

    page.open("?scenario=article&preset=verl-grpo")
    assert "c (dual_clip) = 3," in meaning("actor/pg_clipfrac_lower")
    page.open("?scenario=article&preset=verl-grpo&dual_clip=4.5&epsilon_high=0.28")
    assert "c (dual_clip) = 4.5," in meaning("actor/pg_clipfrac_lower")
    assert "1 + ε_high = 1.28" in meaning("clip_ratio/region_mean")
    page.open("?scenario=article&preset=article")
    assert "dual_clip, off here" in meaning("actor/pg_clipfrac_lower")
    page.open("?scenario=on-policy&preset=trl-grpo")
    assert "the mean of the per-group stds (advantage = group)" in meaning("reward_std")
    page.open("?scenario=on-policy&preset=trl-grpo&advantage=batch")
    assert "the std over the whole batch (advantage = batch)" in meaning("reward_std")
    # GSPO: ε_high = 4e-4 prints as 1.0004; the row's ratio and the token's own are both in the hover
    page.open("?scenario=article&preset=trl-gspo")
    answer = page.last()
    assert answer["config"]["epsilon_high"] == pytest.approx(4e-4)
    page.current_chart("heat-ratio")
    cells = page.page.evaluate("document.getElementById('heat-ratio').data[0].customdata")
    texts = [c[9] for row in cells for c in row if c[9]]
    assert any("1 + ε_high = 1.0004" in t for t in texts), texts
    assert any("sequence ratio" in c[8] and "this token's own ratio 52.49" in c[8] for row in cells for c in row)
    assert "reach 52.49" in page.page.inner_text("#explanation")
    page.check_clean()


def test_every_gradient_chart_has_one_sign_and_says_it_on_its_axis(page: Page) -> None:
    """Before: the Gradients view flipped its axis (up = raise the log-prob), Compare's did not."""
    _open_with_compare(page, "?scenario=article&compare=article,trl-dapo")
    page.current_chart("grad-tokens")
    grad = page.page.evaluate("document.getElementById('grad-tokens').layout")
    page.current_chart("compare-grads")
    compare = page.page.evaluate("document.getElementById('compare-grads').layout")
    axes = [grad["yaxis"]] + [compare[k] for k in sorted(compare) if re.fullmatch(r"yaxis\d*", k)]
    assert len(axes) == 3
    for axis in axes:  # Plotly turns autorange "reversed" into a descending range
        assert axis["range"][0] > axis["range"][1] and "raises" in axis["title"]["text"], axis
    page.check_clean()


def test_compare_charts_never_show_other_presets_than_the_table(page: Page) -> None:
    """Before: the gradient chart showed the previous presets for ~2 s after the table switched. Now a
    chart whose answer is on its way is greyed (data-stale), and is drawn from the table's answer."""
    _open_with_compare(page, "?scenario=article&compare=article,trl-dapo")
    page.current_chart("compare-grads")
    held: list[Any] = []
    page.page.route("**/api/v1/compare", lambda route: held.append(route))
    page.page.evaluate("document.querySelector('#compare-presets input[value=\"verl-grpo\"]').click()")
    page.wait_for("document.getElementById('compare-grads').dataset.stale === 'true'")
    assert page.page.evaluate("getComputedStyle(document.getElementById('compare-grads')).opacity") == "0.35"
    assert not page.page.evaluate("window.grpoLens.isCurrent('compare-grads')")
    page.wait_for("true")  # let the route handler run
    while not held:
        page.page.wait_for_timeout(50)
    held[0].continue_()
    page.page.unroute("**/api/v1/compare")
    page.wait_for("window.grpoLens.isCurrent('compare-grads')")
    heads = page.page.evaluate("[...document.querySelectorAll('#compare-table thead th')].map(t => t.innerText)")[1:]
    names = page.page.evaluate("document.getElementById('compare-grads').data.map(t => t.name)")
    assert heads == names == ["article", "trl-dapo", "verl-grpo"]
    assert page.page.evaluate("document.getElementById('compare-grads').dataset.stale") == "false"
    page.check_clean()


def test_a_pooled_heatmap_hover_prints_each_cell_s_value_as_the_answer_holds_it(page: Page) -> None:
    """Before: the pooled grid's hover printed its value with Plotly's own format (%{z:.4g}: a GSPO ratio of
    1 + 4e-4 read "1"), a number no test held to the answer. Now each cell carries its printed value beside
    its positions and its count of counted tokens, every one equal to the server's pooled grid."""
    g = torch.Generator().manual_seed(2)
    old = (-torch.rand(2, 1300, generator=g) * 2 - 0.01).tolist()
    new = (torch.tensor(old) + 1e-4 * torch.randn(2, 1300, generator=g)).clamp(max=0).tolist()
    body = {"per_token_logps": new, "old_per_token_logps": old, "rewards": [1.0, 0.0], "config": {"preset": "trl-gspo"}}
    page.open()
    data = page.apply_json(body)
    grid = data["heatmap"]
    assert grid["factor_tokens"] == 3  # pooled: 1300 positions, at most 600 columns
    for field in ("ratio", "grad"):
        page.current_chart(f"heat-{field}")
        cells = page.page.evaluate(f"document.getElementById('heat-{field}').data[0].customdata")
        want = grid["fields"][field]
        assert [len(r) for r in cells] == [len(r) for r in want]
        for r, row in enumerate(cells):
            for c, (positions, counted, printed) in enumerate(row):
                first = c * grid["factor_tokens"]
                last = min(first + 3, grid["width"]) - 1
                assert positions == (f"position {first}" if first == last else f"positions {first}–{last}")
                assert counted == grid["counted"][r][c]
                if want[r][c] is None:
                    assert printed == "–"
                else:  # the digits printed are the value's (1.0004 is not "1")
                    assert float(printed) == pytest.approx(want[r][c], rel=5e-4, abs=1e-12), (r, c, printed)
                    assert float(printed) != 1 or want[r][c] == pytest.approx(1, abs=5e-5)
    # the hover, looked at: a cell of the pooled ratio grid
    page.page.evaluate("document.getElementById('heat-ratio').scrollIntoView({block: 'center'})")
    page.current_chart("heat-ratio")
    box = page.page.locator("#heat-ratio .nsewdrag").first.bounding_box()
    assert box is not None
    page.page.mouse.move(box["x"] + box["width"] * 0.3, box["y"] + box["height"] * 0.25)
    page.wait_for("document.querySelector('#heat-ratio .hoverlayer .hovertext') !== null")
    hover = page.page.text_content("#heat-ratio .hoverlayer") or ""
    assert "counted tokens" in hover and "positions" in hover
    ARTIFACTS.mkdir(exist_ok=True)
    chart = page.page.locator("#heat-ratio").bounding_box()
    assert chart is not None
    page.page.screenshot(
        path=str(ARTIFACTS / "pooled-hover.png"),
        clip={"x": chart["x"], "y": chart["y"], "width": chart["width"], "height": chart["height"]},
    )
    page.check_clean()


# --- what each variant did (the variants' marks, one story per number) --------------------------------------------
def _legend(page: Page, chart: str) -> list[str]:
    page.current_chart(chart)
    return list(page.page.evaluate(f"document.getElementById('{chart}').data.map(t => t.name)"))


def _shoot(page: Page, selector: str, name: str, above: int = 0) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.page.evaluate(f"document.querySelector('{selector}').scrollIntoView({{block: 'center'}})")
    box = page.page.locator(selector).bounding_box()
    assert box is not None
    clip = {"x": box["x"], "y": max(box["y"] - above, 0), "width": box["width"], "height": box["height"] + above}
    page.page.screenshot(path=str(ARTIFACTS / name), clip=clip)


def _hover_cell(page: Page, chart: str, k: int, j: int, rows: int, width: int) -> str:
    page.page.evaluate(f"document.getElementById('{chart}').scrollIntoView({{block: 'center'}})")
    box = page.page.locator(f"#{chart} .nsewdrag").first.bounding_box()
    assert box is not None
    page.page.mouse.move(box["x"] + box["width"] * (j + 0.5) / width, box["y"] + box["height"] * (k + 0.5) / rows)
    page.wait_for(f"document.querySelector('#{chart} .hoverlayer .hovertext') !== null")
    return page.page.text_content(f"#{chart} .hoverlayer") or ""


def test_kl_cov_and_clip_cov_tokens_are_named_in_every_view(page: Page) -> None:
    """Before: KL-Cov's penalised tokens read "trust" everywhere; Clip-Cov's cut tokens were drawn as "dual_clip"
    in the clip-region chart; the metrics table listed every family's metrics at 0 (vespo/phi_seq_mean,
    cispo_clip_ratio under kl_cov)."""
    page.open("?scenario=off-policy-clipping&preset=verl-kl_cov&kl_cov_ratio=0.3")
    answer = page.last()
    assert answer["why"]["counts"]["kl_penalized"] == 4
    text = page.page.inner_text("#explanation")
    assert "4 of 16 tokens picked by the objective's rule" in text and "ppo_kl_coef = 0.1" in text
    legend = _legend(page, "clip-curves")
    assert "kl_cov: KL penalty applied" in legend and "dual_clip" not in legend
    assert "kl_cov: KL penalty applied" in _legend(page, "heat-ratio")  # the cells are marked
    why, names = answer["tokens"]["why"], answer["why"]["names"]
    k, j = next((k, j) for k, row in enumerate(why) for j, c in enumerate(row) if names[c] == "kl_penalized")
    hover = _hover_cell(page, "heat-ratio", k, j, len(why), len(answer["tokens"]["ratio"][0]))
    assert "kl_penalized" in hover and "KL penalty applied" in hover
    _shoot(page, "#heat-ratio", "kl_cov-hover.png", above=80)
    rows = "[...document.querySelectorAll('#metrics-table tbody tr')]"
    shown = page.page.evaluate(f"{rows}.map(r => r.cells[0].innerText)")
    assert shown == answer["metrics_logged"]
    assert "vespo/phi_seq_mean" not in shown and "cispo_clip_ratio" not in shown and "actor/ppo_kl" in shown
    assert "vespo/phi_seq_mean" in answer["metrics"]  # still in the answer: check-run compares every metric

    page.open("?scenario=off-policy-clipping&preset=verl-clip_cov&clip_cov_ratio=0.3&clip_cov_lb=-10&clip_cov_ub=10")
    answer = page.last()
    assert answer["why"]["counts"]["cov_clipped"] == 4
    legend = _legend(page, "clip-curves")
    assert "selected by clip_cov (gradient detached)" in legend and "dual_clip" not in legend
    _shoot(page, "#clip-curves", "clip_cov-region-chart.png")
    text = page.page.inner_text("#explanation")
    assert "4 selected by clip_cov (gradient detached)" in text
    page.check_clean()


def test_the_entropy_mask_is_marked_and_told_with_its_numbers(page: Page) -> None:
    """The variants' marks: the entropy mask marked on the heatmaps, and "the entropy mask kept 20% of tokens: the N
    with entropy at least T; the rest carry no policy gradient", every number tagged."""
    g = torch.Generator().manual_seed(5)
    logps = (-torch.rand(4, 10, generator=g) * 2 - 0.05).tolist()
    old = (torch.tensor(logps) + 0.3 * torch.randn(4, 10, generator=g)).clamp(max=0).tolist()
    entropies = (torch.rand(4, 10, generator=g) * 3).tolist()
    body = {
        "per_token_logps": logps,
        "old_per_token_logps": old,
        "entropies": entropies,
        "rewards": [1.0, 0.0, 0.0, 1.0],
        "config": {"preset": "trl-grpo", "top_entropy_quantile": 0.2},
    }
    page.open()
    answer = page.apply_json(body)
    masked = answer["why"]["counts"]["entropy_masked"]
    assert masked == 32  # 40 tokens, the top 20% (8) kept
    sentence = page.page.locator("#explanation li", has_text=re.compile(r"^The entropy mask"))
    assert "kept 20% of the 40 tokens: the 8 with entropy at least" in sentence.inner_text()
    assert "the rest carry no policy gradient" in sentence.inner_text()
    threshold = sentence.locator("[data-quantity='lens/why/entropy_threshold']").get_attribute("data-value")
    # TRL's threshold: the 0.8 quantile of the 40 entropies, linear between the sorted values at 0.8·39 = 31.2
    e = sorted(x for row in entropies for x in row)
    assert float(threshold or "nan") == pytest.approx(e[31] + 0.2 * (e[32] - e[31]), rel=1e-6)
    assert e[31] < float(threshold or "nan") <= e[32]  # so exactly the 8 highest are kept
    _check_mask_marked(page, ["masked by the entropy mask", "line-ew-open", 32], "entropy-mask")


def _check_mask_marked(page: Page, mark: list[Any], shots: str) -> None:
    """The explanation's numbers all tagged; the gradient heatmap marks a token mask's cells as ``mark`` ([legend
    name, symbol, cells]); screenshots of both, named after ``shots``."""
    assert page.page.evaluate(UNTAGGED, ["#explanation", "#warnings"]) == []
    page.current_chart("heat-grad")
    marks = page.page.evaluate(
        "document.getElementById('heat-grad').data.slice(1).map(t => [t.name, t.marker.symbol, t.x.length])"
    )
    assert mark in marks, marks
    _shoot(page, "#heat-grad", f"{shots}-heatmap.png")
    _shoot(page, "#explanation", f"{shots}-sentence.png")
    page.check_clean()


def test_warnings_carry_the_quantity_of_each_number(page: Page) -> None:
    """Before: warnings were plain strings with untagged numbers ("Groups [0] have zero reward std")."""
    page.open("?scenario=all-correct&preset=trl-dapo")
    answer = page.last()
    assert any("zero reward std" in w for w in answer["warnings"])
    assert page.page.evaluate(UNTAGGED, ["#warnings"]) == []
    tagged = page.page.evaluate(
        "[...document.querySelectorAll('#warnings [data-quantity]')].map(e => [e.dataset.quantity, e.dataset.value])"
    )
    groups = [float(v) for q, v in tagged if q.startswith("zero_std_groups/")]
    assert groups == [float(g) for g in answer["zero_std_groups"]] and groups
    texts = page.page.evaluate("[...document.querySelectorAll('#warnings li')].map(e => e.textContent)")
    assert texts == answer["warnings"]
    page.check_clean()


def test_tool_mask_tokens_are_marked_and_counted(page: Page) -> None:
    """The variants' marks: a tool's tokens (tool_mask 0) marked on the heatmaps though they do not count, and the
    sentence "N of the completions' M tokens are a tool's output ...", every number tagged."""
    g = torch.Generator().manual_seed(6)
    logps = (-torch.rand(3, 8, generator=g) * 2 - 0.05).tolist()
    tool = [[1, 1, 0, 0, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1], [1, 0, 1, 1, 0, 0, 1, 1]]  # 3 + 0 + 3 = 6 tool tokens
    body = {
        "per_token_logps": logps,
        "old_per_token_logps": (torch.tensor(logps) * 0.9).tolist(),
        "tool_mask": tool,
        "advantages": [1.0, -0.5, 0.7],
        "config": {"preset": "trl-dapo"},
    }
    page.open()
    answer = page.apply_json(body)
    assert answer["why"]["counts"]["tool_output"] == 6 and answer["metrics"]["lens/num_tokens"] == 18
    sentence = page.page.locator("#explanation li", has_text=re.compile(r"tool's output"))
    assert sentence.inner_text().startswith("6 of the completions' 24 tokens are a tool's output (tool_mask = 0)")
    assert "the loss counts the other 18" in sentence.inner_text()
    _check_mask_marked(page, ["tool output (tool_mask 0)", "line-ew-open", 6], "tool-mask")
