"""Numbers that disagreed, told as they are ("Disagreeing numbers" and "Region labels"): one clip
fraction per meaning under its trainer's name and bounds, the same in the summary's counts, the metrics and
Compare for every preset; the clip view's GMPO points at the term the objective uses; the beta sentence read
from the presets table; what makes TRL's and verl's kl differ; negative chi2 estimates explained; ratios
printed to a few digits; "unbounded" for a ratio no clip holds.

The batch is the article's scenario unless said: rows 0-2 with A = -1, 2, 1 over two counted tokens each,
ratios (52.49, 1.457), (0.2811, 4.972), (0.9552, 2.296).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient

import grpo
from app.main import app
from grpo.answer import breakdown_to_json
from grpo.corrections import verl_mismatch_metrics
from grpo.curves import objective_curves
from grpo.examples import SCENARIOS, scenario_batch
from grpo.explain import explain_items, token_why
from grpo.glossary import metric_meanings
from grpo.marks import plain
from grpo.requests import batch_from_request

CLIP_METRICS = ("clip_ratio/region_mean", "actor/pg_clipfrac", "actor/pg_clipfrac_lower", "cispo_clip_ratio")


def _answer(preset: str, scenario: str = "article", **overrides: Any) -> dict[str, Any]:
    bd = grpo.evaluate(scenario_batch(scenario), grpo.LossConfig.from_preset(preset, dtype="float64", **overrides))
    return breakdown_to_json(bd)


def test_gmpo_names_one_clip_fraction_per_meaning_with_its_log_ratio_bounds() -> None:
    """Before: Compare 0 (clip_ratio/region_mean, which geo_mean does not compute), the summary's 2 of 6, and
    actor/pg_clipfrac 0.5 described with the ratio bounds 1.4 / 0.6; pg_clipfrac_lower 0.1667 a 'dual-clip
    fraction' with no dual clip."""
    answer = _answer("verl-gmpo")
    m, logged = answer["metrics"], answer["metrics_logged"]
    # ε = 0.4 on the log-ratio: A > 0 tokens outside [-0.4, 0.4]: log 0.2811 = -1.27, log 4.972 = 1.60,
    # log 2.296 = 0.83 (0.9552: -0.046 inside): 3 of 6. A < 0: log 52.49 = 3.96 (1.457: 0.377 inside): 1 of 6.
    assert m["actor/pg_clipfrac"] == 3 / 6 and m["actor/pg_clipfrac_lower"] == 1 / 6
    assert "clip_ratio/region_mean" not in logged  # verl's geo_mean logs no TRL clip metric: Compare shows "—"
    assert {"actor/pg_clipfrac", "actor/pg_clipfrac_lower"} <= set(logged)
    # the summary's 2 clipped high (no gradient) are the 2 of pg_clipfrac's 3 above ε_high; the third (0.2811)
    # moved against its advantage and is kept, and the meaning says pg_clipfrac counts it
    assert answer["why"]["counts"]["clip_high"] == 2
    meaning = plain_meaning("verl-gmpo", "actor/pg_clipfrac")
    assert "log-ratio outside [−ε_low, ε_high] (ε_low = 0.4, ε_high = 0.4), on either side" in meaning
    assert "1.4" not in meaning and "0.6" not in meaning and "yet are counted too" in meaning
    lower = plain_meaning("verl-gmpo", "actor/pg_clipfrac_lower")
    assert "Not a dual-clip fraction" in lower and "A < 0" in lower


def plain_meaning(preset: str, key: str) -> str:
    return metric_meanings(grpo.LossConfig.from_preset(preset))[key]


def test_pg_clipfrac_lower_with_the_dual_clip_off_says_it_counts_nothing() -> None:
    meaning = plain_meaning("trl-grpo", "actor/pg_clipfrac_lower")  # trl-grpo: dual_clip None
    assert "c (dual_clip, off here)" in meaning and "with the dual clip off it counts nothing" in meaning
    assert _answer("trl-grpo")["metrics"]["actor/pg_clipfrac_lower"] == 0.0
    assert "c (dual_clip) = 3" in plain_meaning("verl-grpo", "actor/pg_clipfrac_lower")


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("preset", list(grpo.PRESETS))
def test_the_summary_counts_agree_with_the_clip_metrics(preset: str, scenario: str) -> None:
    """The summary's counts (why/*) and each logged clip fraction, derived from the same tokens."""
    bd = grpo.evaluate(scenario_batch(scenario), grpo.LossConfig.from_preset(preset, dtype="float64"))
    answer, why = breakdown_to_json(bd), token_why(bd)
    counts, n, m = answer["why"]["counts"], answer["metrics"]["lens/num_tokens"], answer["metrics"]
    counted = bd.tokens.mask & bd.tokens.policy_kept.bool()
    a, x = bd.tokens.advantage, bd.tokens.log_ratio
    config = bd.config
    if config.objective == "geo_mean":
        outside = counted & ((x > config.epsilon_high) | (x < -config.epsilon_low))
        assert m["actor/pg_clipfrac"] * n == pytest.approx(int((outside & (a > 0)).sum()))
        assert m["actor/pg_clipfrac_lower"] * n == pytest.approx(int((outside & (a < 0)).sum()))
        assert counts["clip_high"] == int((counted & (a > 0) & (x > config.epsilon_high)).sum())
        assert counts["clip_low"] == int((counted & (a < 0) & (x < -config.epsilon_low)).sum())
        assert counts["unbounded"] == int((counted & (a < 0) & (x > config.epsilon_high)).sum())
    elif config.objective == "clip" and config.dual_clip is None and config.delta is None:
        if config.importance_sampling_level == "token":
            flat = counts["clip_low"] + counts["clip_high"]
            assert m["clip_ratio/region_mean"] * n == pytest.approx(flat)
            assert m["actor/pg_clipfrac"] == m["clip_ratio/region_mean"]
        free = counted & (a < 0) & (bd.tokens.ratio > 1 + config.epsilon_high)
        assert counts["unbounded"] == int((free & (why.codes == why.names.index("unbounded"))).sum())


def test_compare_shows_each_preset_s_clip_fractions_as_its_answer_does() -> None:
    """Compare's rows are the presets' own answers: a clip metric in a column only where metrics_logged has it
    (static/js/labels.js COMPARE_ROWS), its value the same as /loss gives for that preset."""
    api = TestClient(app)
    body = {k: v for k, v in SCENARIOS["article"].request.items() if k != "tokens"}
    presets = list(grpo.PRESETS)
    for start in range(0, len(presets), 8):
        configs = [{"preset": p} for p in presets[start : start + 8]]
        data = api.post("/api/v1/compare", json={**body, "configs": configs}).json()
        for result, config in zip(data["results"], configs, strict=True):
            single = api.post("/api/v1/loss", json={**body, "config": config}).json()
            assert result["metrics_logged"] == single["metrics_logged"]
            for name in CLIP_METRICS:
                if name in single["metrics_logged"]:
                    assert result["metrics"][name] == single["metrics"][name], (config, name)
    gmpo = api.post("/api/v1/loss", json={**body, "config": {"preset": "verl-gmpo"}}).json()
    assert "clip_ratio/region_mean" not in gmpo["metrics_logged"] and gmpo["metrics"]["actor/pg_clipfrac"] == 0.5


def test_the_clip_view_puts_a_gmpo_token_at_its_row_s_term() -> None:
    """Before: the token at ratio 52.49 (row 0, A = -1) was drawn at -52.49, its one-token row's term; GMPO's
    term for row 0 is Ā · exp(mean clipped log-ratio) = -exp((3.9607 + 0.3767) / 2) = -sqrt(52.49 · 1.457)
    = -8.747 (both tokens kept: A < 0 keeps log-ratios above ε_high)."""
    bd = grpo.evaluate(scenario_batch("article"), grpo.LossConfig.from_preset("verl-gmpo"))
    points = objective_curves(bd)["points"]
    row0 = [y for y, r in zip(points["y"], points["row"], strict=True) if r == 0]
    assert row0 == [float(bd.tokens.surrogate[0, 3])] * 2
    assert row0[0] == pytest.approx(-math.sqrt(52.49405893230762 * 1.4574670036775483), rel=1e-6)
    # row 1 (A = 2): its term 1.2951 per unit Ā = 0.6476
    row1 = [y for y, r in zip(points["y"], points["row"], strict=True) if r == 1]
    assert row1[0] == pytest.approx(float(bd.tokens.surrogate[1, 3]) / 2, rel=1e-12)
    assert objective_curves(bd)["per_row"] is True
    assert objective_curves(grpo.evaluate(scenario_batch("article"), grpo.LossConfig()))["per_row"] is False


def test_the_beta_sentence_names_the_presets_that_set_beta() -> None:
    """Before: "TRL's and verl's presets default to beta 0" while verl-grpo has beta 0.001."""
    bd = grpo.evaluate(scenario_batch("article"), grpo.LossConfig.from_preset("trl-grpo"))
    text = " ".join(plain(w) for w in bd.warnings)
    assert "default to beta 0" not in text
    # from the presets table: article 0.01, verl-grpo 0.001, every other 0
    assert "the presets that set beta: article (beta = 0.01), verl-grpo (beta = 0.001)" in text
    assert {n for n, p in grpo.PRESETS.items() if grpo.LossConfig.from_preset(n).beta} == {"article", "verl-grpo"}


def test_kl_differs_between_trl_and_verl_by_the_bias_correction_and_says_so() -> None:
    """Before: Compare's kl 1.7035 (trl-grpo) vs 0.763 (verl-grpo) for one batch, unexplained: TRL's preset
    multiplies each k3 term by the token's ratio (use_bias_correction_kl); without it TRL's kl is verl's."""
    trl, verl = _answer("trl-grpo"), _answer("verl-grpo")
    assert trl["metrics"]["kl"] != verl["metrics"]["kl"]
    plain_trl = _answer("trl-grpo", kl_bias_correction=False)["metrics"]["kl"]
    assert plain_trl == pytest.approx(verl["metrics"]["kl"], rel=1e-12)  # verl's clamp ±10 acts on no token here
    assert "kl_bias_correction (TRL use_bias_correction_kl) on here" in plain_meaning("trl-grpo", "kl")
    assert "kl_bias_correction (TRL use_bias_correction_kl) off here" in plain_meaning("verl-grpo", "kl")


def test_a_negative_chi2_estimate_is_explained() -> None:
    """The trainer's log-probs 1 below the sampler's on every token: ρ = e^-1, chi2 = e^-2 - 1 = -0.8647."""
    old, sampler = torch.full((1, 3), -2.0), torch.full((1, 3), -1.0)
    metrics = verl_mismatch_metrics(old, sampler, torch.ones(1, 3))
    assert metrics["rollout_corr/chi2_token"] == pytest.approx(math.exp(-2) - 1, rel=1e-6)
    assert metrics["rollout_corr/chi2_seq"] == pytest.approx(math.exp(-6) - 1, rel=1e-6)
    meaning = plain_meaning("verl-grpo", "rollout_corr/chi2_token")
    assert "sample estimates" in meaning and "fall below 0" in meaning


def test_a_weight_ratio_prints_a_few_digits() -> None:
    """Before: "9.9999999× less": weights 0.5 and 0.05 in float32 (0.05f = 0.0500000007) divide to 9.99999985."""
    batch = batch_from_request({"per_token_logps": [[-1.0], [-1.0] * 10], "advantages": [1.0, -1.0]})
    items = dict(explain_items(grpo.evaluate(batch, grpo.LossConfig.from_preset("trl-grpo"))))
    assert "0.05, 10× less" in items["length"] and "9.99" not in items["length"]


@pytest.mark.parametrize(("preset", "expected"), [("verl-gmpo", ["unbounded", "trust"]), ("verl-clip_cov", None)])
def test_a_ratio_no_clip_holds_is_unbounded_not_trust(preset: str, expected: list[str] | None) -> None:
    """Row 0 (A = -1): ratios 52.49 and 1.457. GMPO: log 52.49 = 3.96 > ε_high 0.4: unbounded; log 1.457 =
    0.377 inside. Clip-Cov (no dual clip, 1 + ε_high = 1.2): both above, both unbounded unless the draw cut one."""
    bd = grpo.evaluate(scenario_batch("article"), grpo.LossConfig.from_preset(preset))
    why = token_why(bd)
    row0 = why.code_names()[0][3:]
    if expected is None:
        assert all(name in ("unbounded", "cov_clipped") for name in row0) and "unbounded" in row0
    else:
        assert row0 == expected
    assert "unbounded" in breakdown_to_json(bd)["why"]["texts"]
