"""The mismatch view's data (grpo.mismatch): the sampler against the trainer per token and
per row, the bounds in force, what the correction did, and sentences whose every number is recomputed here
from the batch's own log-probs (plain Python over the request's lists, not the library's tensors)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

import grpo
from grpo.answer import breakdown_to_json
from grpo.corrections import CORRECTION_CODES
from grpo.examples import SCENARIOS, scenario_batch
from grpo.explain import number
from grpo.requests import batch_from_request
from grpo.view.mismatch import mismatch_view
from grpo.view.mismatch_charts import SCATTER_MAX, _k3_roots

pytestmark = pytest.mark.numerical

MISMATCH_SCENARIOS = ("mismatch-bf16", "mismatch-long-row", "mismatch-one-token")


def _config(name: str, **overrides: Any) -> grpo.LossConfig:
    s = SCENARIOS[name]
    return grpo.LossConfig.from_preset(s.preset, dtype="float64", **{**s.overrides, **overrides})


def _view(name: str, **overrides: Any) -> tuple[dict[str, Any], grpo.Breakdown]:
    bd = grpo.evaluate(scenario_batch(name), _config(name, **overrides))
    view = mismatch_view(bd)
    assert view is not None
    return view, bd


def _gaps(name: str) -> list[list[float]]:
    """old - sampler per token, from the scenario's request (old = current: no old_per_token_logps)."""
    req = SCENARIOS[name].request
    old = req.get("old_per_token_logps", req["per_token_logps"])
    return [
        [o - s for o, s in zip(ro, rs, strict=True)]
        for ro, rs in zip(old, req["sampling_per_token_logps"], strict=True)
    ]


def _sentence(view: dict[str, Any], key: str) -> list[Any]:
    return view["sentence_parts"][view["sentence_keys"].index(key)]


def _numbers(parts: list[Any]) -> dict[str, float]:
    return {p["quantity"]: p["value"] for p in parts if not isinstance(p, str)}


def _resolve(view: dict[str, Any], answer: dict[str, Any], quantity: str) -> float:
    """The block's (or the answer's) own value of a quantity a sentence prints."""
    head, _, rest = quantity.partition("/")
    if quantity.startswith("mismatch/stats/"):
        return float(view["stats"][quantity.removeprefix("mismatch/stats/")])
    if quantity.startswith("mismatch/rows/"):
        field, _, i = quantity.removeprefix("mismatch/rows/").rpartition("/")
        return float(view["rows"][field][int(i)])
    if head == "rows" and rest.startswith("index/"):
        return float(rest.removeprefix("index/"))
    if head == "config":
        return float(answer["config"][rest])
    return float(answer[quantity])  # loss, loss_without_correction


# --- null when there is nothing to show ---------------------------------------------------------------------
@pytest.mark.parametrize("name", [n for n in SCENARIOS if n not in MISMATCH_SCENARIOS])
def test_no_sampler_and_no_correction_gives_no_block(name: str) -> None:
    bd = grpo.evaluate(
        scenario_batch(name), grpo.LossConfig.from_preset("trl-grpo", rollout_correction="sequence_mask")
    )
    assert mismatch_view(bd) is None and breakdown_to_json(bd)["mismatch"] is None


def test_the_off_policy_mask_without_sampler_has_a_block_with_no_scatter() -> None:
    """TRL's off-policy sequence mask without vLLM measures old against current: a row with A < 0 whose mean
    old - current is above the threshold is dropped, and the view says so (no token pairs to draw)."""
    body = {
        "per_token_logps": [[-1.0, -1.0], [-1.0, -1.0, -1.0], [-0.5]],
        "old_per_token_logps": [[-0.6, -0.8], [-1.0, -1.1, -0.9], [-0.5]],
        "advantages": [-1.0, -1.0, 1.0],
    }
    bd = grpo.evaluate(batch_from_request(body), grpo.LossConfig(off_policy_mask_threshold=0.25, dtype="float64"))
    view = mismatch_view(bd)
    assert view is not None and not view["sampled"] and view["scatter"]["total"] == 0
    # row 0: mean old - current = (0.4 + 0.2) / 2 = 0.3 > 0.25 (A < 0): dropped; row 1: mean 0; row 2: A > 0
    assert view["rows"]["off_policy_gap"].tolist() == pytest.approx([0.3, 0.0, 0.0], abs=1e-12)
    parts = _sentence(view, "off_policy")
    assert "Row 0 was dropped by the off-policy sequence mask" in "".join(
        p if isinstance(p, str) else p["text"] for p in parts
    )
    numbers = _numbers(parts)
    assert numbers["mismatch/rows/off_policy_gap/0"] == pytest.approx(0.3, abs=1e-12)
    assert numbers["config/off_policy_mask_threshold"] == 0.25
    assert numbers["mismatch/stats/off_policy_token_percent"] == pytest.approx(100 * 2 / 6)
    assert [CORRECTION_CODES[c] for c in view["rows"]["code"]] == ["sequence_masked", "kept", "kept"]


# --- the scenarios, recomputed ----------------------------------------------------------------------------------
def test_bf16_noise_keeps_every_row_and_the_gap_is_the_mean_absolute_difference() -> None:
    view, bd = _view("mismatch-bf16")
    gaps = _gaps("mismatch-bf16")
    flat = [abs(g) for row in gaps for g in row]
    numbers = _numbers(_sentence(view, "gap"))
    assert numbers["mismatch/stats/num_scored"] == len(flat) == 75
    assert numbers["mismatch/stats/abs_gap_mean"] == pytest.approx(sum(flat) / len(flat), rel=1e-12)
    assert numbers["mismatch/stats/abs_gap_max"] == pytest.approx(max(flat), rel=1e-12)
    sums = [sum(row) for row in gaps]
    low, high = sums.index(min(sums)), sums.index(max(sums))
    assert numbers[f"mismatch/rows/sum_log_ratio/{low}"] == pytest.approx(min(sums), rel=1e-12, abs=1e-12)
    assert numbers[f"mismatch/rows/is_ratio/{high}"] == pytest.approx(math.exp(max(sums)), rel=1e-12)
    assert f"rows/index/{low}" in numbers and f"rows/index/{high}" in numbers
    # TRL's sequence_mask with C_max 3: every exp(Σ) is below 3, so nothing acts
    assert max(math.exp(x) for x in sums) < 3
    kept = _numbers(_sentence(view, "sequence"))
    assert kept["mismatch/stats/is_ratio_max"] == pytest.approx(math.exp(max(sums)), rel=1e-12)
    assert kept["config/rollout_is_max"] == 3.0
    assert view["counts"]["masked"] == 0 and view["counts"]["kept"] == 75
    assert float(bd.loss) == float(bd.loss_without_correction) + view["stats"]["loss_change"]


def test_a_long_row_whose_small_gaps_add_up_is_dropped_by_sequence_mask() -> None:
    view, bd = _view("mismatch-long-row")
    gaps = _gaps("mismatch-long-row")
    assert max(abs(g) for row in gaps for g in row) < 0.05  # every token ratio within 1.05 of 1
    sums = [sum(row) for row in gaps]
    assert [math.exp(x) > 3 for x in sums] == [False, False, False, True]
    parts = _sentence(view, "sequence")
    text = "".join(p if isinstance(p, str) else p["text"] for p in parts)
    assert text.startswith("Row 3 was dropped by sequence_mask: its ratio exp(Σ) is ")
    numbers = _numbers(parts)
    assert numbers["rows/index/3"] == 3
    assert numbers["mismatch/rows/is_ratio/3"] == pytest.approx(math.exp(sums[3]), rel=1e-12)
    assert numbers["config/rollout_is_max"] == 3.0
    lengths = [len(row) for row in gaps]
    assert numbers["mismatch/stats/above_token_percent"] == pytest.approx(100 * lengths[3] / sum(lengths))
    # without the mask: the same batch under rollout_correction none
    off = grpo.evaluate(scenario_batch("mismatch-long-row"), _config("mismatch-long-row", rollout_correction="none"))
    loss = _numbers(_sentence(view, "loss"))
    assert loss["loss_without_correction"] == pytest.approx(float(off.loss), rel=1e-12, abs=1e-15)
    assert loss["loss"] == float(bd.loss)
    assert loss["mismatch/stats/loss_change"] == pytest.approx(float(bd.loss) - float(off.loss), rel=1e-12)
    # the row's tokens are masked, its weight 0; the chart draws Σ with log C_max
    assert [CORRECTION_CODES[c] for c in view["rows"]["code"]] == ["kept", "kept", "kept", "masked"]
    assert view["rows"]["is_weight"].tolist() == pytest.approx([math.exp(x) for x in sums[:3]] + [0.0], rel=1e-12)
    chart = view["row_charts"][0]
    assert chart["field"] == "sum_log_ratio" and [line["value"] for line in chart["lines"]] == [math.log(3.0)]


def test_sequence_truncate_clamps_the_long_row_at_c_max() -> None:
    view, _ = _view("mismatch-long-row", rollout_correction="sequence_truncate")
    text = "".join(p if isinstance(p, str) else p["text"] for p in _sentence(view, "sequence"))
    assert text.startswith("Row 3 was truncated by sequence_truncate") and "weight clamped" in text
    assert view["rows"]["is_weight"][3] == 3.0
    assert [CORRECTION_CODES[c] for c in view["rows"]["code"]] == ["kept", "kept", "kept", "truncated"]


def test_one_token_the_sampler_scored_far_lower_is_masked_by_icepop() -> None:
    view, _ = _view("mismatch-one-token")
    gaps = _gaps("mismatch-one-token")
    far = max(((abs(g), i, j) for i, row in enumerate(gaps) for j, g in enumerate(row)))
    assert far[1:] == (1, 3) and far[0] == pytest.approx(5.9, abs=1e-9)
    numbers = _numbers(_sentence(view, "token"))
    assert numbers["mismatch/stats/token_acted"] == 1
    assert numbers["mismatch/stats/token_acted_percent"] == pytest.approx(100 / 24)
    assert numbers["rows/index/1"] == 1 and numbers["mismatch/stats/token_far_position"] == 3
    assert numbers["mismatch/stats/token_far_ratio"] == pytest.approx(math.exp(gaps[1][3]), rel=1e-12)
    req = SCENARIOS["mismatch-one-token"].request
    assert numbers["mismatch/stats/token_far_old"] == req["per_token_logps"][1][3]
    assert numbers["mismatch/stats/token_far_sampler"] == req["sampling_per_token_logps"][1][3]
    assert (numbers["config/rollout_is_min"], numbers["config/rollout_is_max"]) == (0.5, 2.0)
    # the scatter: the masked token first, then the others; the bounds as lines sampler = old - log C
    scatter = view["scatter"]
    assert (scatter["row"][0], scatter["position"][0], CORRECTION_CODES[scatter["code"][0]]) == (1, 3, "masked")
    assert scatter["total"] == len(scatter["x"]) == 24
    assert sorted(line["offset"] for line in scatter["lines"]) == pytest.approx([-math.log(2.0), 0.0, math.log(2.0)])
    for line in scatter["lines"]:  # drawn from end to end: sampler = old + offset, i.e. old − sampler = -offset
        assert [y - x for x, y in zip(line["x"], line["y"], strict=True)] == pytest.approx([line["offset"]] * 2)
        assert line["log_ratio"] == -line["offset"] and line["x"] == scatter["range"]
    assert scatter["log_ratio"].tolist() == pytest.approx((scatter["x"] - scatter["y"]).tolist(), abs=1e-6)
    for x, y, i, j in zip(scatter["x"], scatter["y"], scatter["row"], scatter["position"], strict=True):
        assert (x, y) == pytest.approx((req["per_token_logps"][i][j], req["sampling_per_token_logps"][i][j]), rel=1e-6)
    # sequence_mask would drop the whole row instead
    seq, _ = _view("mismatch-one-token", rollout_correction="sequence_mask", rollout_is_min=None)
    assert _numbers(_sentence(seq, "sequence"))["mismatch/rows/is_ratio/1"] == pytest.approx(math.exp(sum(gaps[1])))


def test_rollout_rs_rejections_are_counted_per_criterion() -> None:
    """token_k1 with ratio bounds [0.5, 2] rejects the one token whose |old - sampler| passes log 2;
    seq_max_k2 0.5 rejects every row whose largest ½(old - sampler)² passes 0.5: row 1 (½·5.9² = 17.4)."""
    view, bd = _view(
        "mismatch-one-token",
        rollout_correction="none",
        rollout_rs="token_k1,seq_max_k2",
        rollout_rs_threshold="0.5_2,0.5",
    )
    gaps = _gaps("mismatch-one-token")
    numbers = _numbers(_sentence(view, "rejected"))
    token_k1 = sum(abs(g) > math.log(2) for row in gaps for g in row)
    seq_max = sum(len(row) for row in gaps if max(0.5 * g * g for g in row) > 0.5)
    assert (numbers["mismatch/stats/rs_token_k1_tokens"], numbers["mismatch/stats/rs_seq_max_k2_tokens"]) == (1, 6)
    assert token_k1 == 1 and seq_max == 6
    assert numbers["mismatch/stats/rejected_tokens"] == 6 == view["counts"]["rejected"]
    assert numbers["mismatch/stats/rejected_token_percent"] == pytest.approx(100 * 6 / 24)
    assert view["rows"]["rs/seq_max_k2"].tolist() == pytest.approx([max(0.5 * g * g for g in row) for row in gaps])
    assert [c["field"] for c in view["row_charts"]] == ["sum_log_ratio", "rs/seq_max_k2"]
    assert view["row_charts"][1]["lines"][0]["value"] == 0.5
    offsets = sorted(line["offset"] for line in view["scatter"]["lines"])
    assert offsets == pytest.approx([math.log(0.5), 0.0, math.log(2.0)])
    assert float(bd.loss) != float(bd.loss_without_correction)


def test_in_bypass_mode_the_gap_is_current_minus_sampler() -> None:
    """verl's bypass: the sampler's log-probs stand in for old, so the correction weighs current − sampler; the
    view's x is the current log-prob and its sentences say so (here current = the request's per_token_logps)."""
    view, _ = _view("mismatch-one-token", rollout_bypass=True)
    assert view["x_label"].startswith("current log-prob")
    assert all("old − sampler" not in text for text in view["sentences"])
    assert "|current − sampler|" in view["sentences"][0]
    req = SCENARIOS["mismatch-one-token"].request
    assert view["scatter"]["x"][0] == pytest.approx(req["per_token_logps"][1][3])


def test_k3_bounds_meet_the_statistic() -> None:
    for upper in (0.01, 0.5, 3.0):
        low, high = _k3_roots(upper)
        assert low < 0 < high
        for d in (low, high):
            assert math.expm1(d) - d == pytest.approx(upper, rel=1e-9)


def test_unscored_tokens_are_said_and_left_off_the_scatter() -> None:
    req = dict(SCENARIOS["mismatch-bf16"].request)
    sampled = [list(row) for row in req["sampling_per_token_logps"]]
    sampled[0][2] = None
    sampled[5][0] = None
    bd = grpo.evaluate(batch_from_request({**req, "sampling_per_token_logps": sampled}), _config("mismatch-bf16"))
    view = mismatch_view(bd)
    assert view is not None
    assert _numbers(_sentence(view, "not_scored"))["mismatch/stats/not_scored"] == 2
    assert view["scatter"]["total"] == 73 and view["stats"]["num_scored"] == 73


def test_the_scatter_is_capped_with_the_acted_tokens_first() -> None:
    """A batch past SCATTER_MAX scored tokens: the tokens the correction acted on all come, before the kept."""
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(8, 1000, generator=g, dtype=torch.float64) - 0.1
    sampler = old - 0.02 * torch.randn(8, 1000, generator=g, dtype=torch.float64)
    sampler[3, 17] = old[3, 17] - 4.0
    batch = grpo.Batch(per_token_logps=old, sampling_per_token_logps=sampler, advantages=[1.0, -1.0] * 4)
    bd = grpo.evaluate(batch, grpo.LossConfig(rollout_correction="token_mask", rollout_is_min=0.5, rollout_is_max=2.0))
    view = mismatch_view(bd)
    assert view is not None
    s = view["scatter"]
    assert s["total"] == 8000 and len(s["x"]) == SCATTER_MAX
    assert (int(s["row"][0]), int(s["position"][0]), CORRECTION_CODES[s["code"][0]]) == (3, 17, "masked")


# --- every number a sentence prints is the block's (or the answer's) ---------------------------------------------
CONFIGS: list[dict[str, Any]] = [
    {},
    {"rollout_correction": "none"},
    {"rollout_correction": "token_truncate", "rollout_is_max": 1.02},
    {"rollout_correction": "sequence_mask", "rollout_is_min": 0.99, "rollout_is_max": 1.2},
    {"off_policy_mask_threshold": 0.0},
    {"rollout_rs": "token_k2,seq_mean_k3,seq_sum_k1", "rollout_rs_threshold": "0.0005,0.001,0.5_1.5"},
    {"rollout_correction": "sequence_truncate", "rollout_is_batch_normalize": True},
    {"rollout_bypass": True, "rollout_correction": "token_mask", "rollout_is_min": 0.99, "rollout_is_max": 1.01},
]


@pytest.mark.parametrize("name", MISMATCH_SCENARIOS)
@pytest.mark.parametrize("overrides", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "own")
def test_every_number_in_a_sentence_is_the_blocks_own(name: str, overrides: dict[str, Any]) -> None:
    bd = grpo.evaluate(scenario_batch(name), _config(name, **overrides))
    answer = breakdown_to_json(bd)
    view = answer["mismatch"]
    assert view is not None
    assert len(view["sentences"]) == len(view["sentence_parts"]) == len(view["sentence_keys"]) >= 2
    for parts, text in zip(view["sentence_parts"], view["sentences"], strict=True):
        assert "".join(p if isinstance(p, str) else p["text"] for p in parts) == text
        for p in parts:
            if isinstance(p, str):
                continue
            assert p["text"] == number(p["value"], len(p["text"])) or float(p["text"]) == pytest.approx(
                p["value"], rel=5e-3, abs=1e-12
            ), p
            assert p["value"] == pytest.approx(_resolve(view, answer, p["quantity"]), rel=1e-12, abs=1e-15), p
    # the row codes are the strongest action among each row's token codes
    codes = bd.tokens.correction
    order = ["not_counted", "kept", "not_scored", "truncated", "masked", "sequence_masked", "rejected"]
    for i, row_code in enumerate(view["rows"]["code"]):
        names = {CORRECTION_CODES[c] for c in codes[i].tolist()}
        assert CORRECTION_CODES[row_code] == max(names, key=order.index)


# --- the API ---------------------------------------------------------------------------------------------------
def test_the_loss_answer_carries_the_block_as_the_library_computes_it() -> None:
    from api_fixtures import client, ragged_body

    s = SCENARIOS["mismatch-long-row"]
    config = {"preset": s.preset, **s.overrides}
    answer = client().post("/api/v1/loss", json={**s.request, "config": config}).json()
    bd = grpo.evaluate(scenario_batch("mismatch-long-row"), grpo.LossConfig.from_preset(s.preset, **s.overrides))
    view = mismatch_view(bd)
    assert view is not None
    block = answer["mismatch"]
    assert block["sentences"] == view["sentences"] and block["sentence_keys"] == view["sentence_keys"]
    assert block["stats"] == pytest.approx(view["stats"], rel=1e-6)
    for field, values in view["rows"].items():  # float32 in JSON (its shortest form) reads back exactly
        assert (np.asarray(block["rows"][field], dtype=values.dtype) == values).all(), field
    assert (np.asarray(block["scatter"]["x"], dtype=np.float32) == view["scatter"]["x"]).all()
    assert [c["field"] for c in block["row_charts"]] == ["sum_log_ratio"]
    # a batch without the sampler's log-probs: the key, null
    plain_answer = client().post("/api/v1/loss", json=ragged_body(3)).json()
    assert "mismatch" in plain_answer and plain_answer["mismatch"] is None


def test_a_bad_rollout_rs_threshold_gets_a_4xx_naming_the_field() -> None:
    from api_fixtures import client

    s = SCENARIOS["mismatch-one-token"]
    for rs, spec in (("token_k1", "3_1"), ("seq_sum_k2", "3_1"), ("token_k1,seq_sum_k2", "0.5_2,0.1,4")):
        config = {"preset": s.preset, "rollout_rs": rs, "rollout_rs_threshold": spec}
        r = client().post("/api/v1/loss", json={**s.request, "config": config})
        assert r.status_code == 422, r.text
        detail = r.json()["detail"][0]
        assert "rollout_rs_threshold" in detail["loc"] or "rollout_rs_threshold" in detail["msg"], detail
    bad = client().post("/api/v1/loss", json={**s.request, "config": {"preset": s.preset, "rollout_rs": "seq_k9"}})
    assert bad.status_code == 422 and "rollout_rs" in bad.text and "token_k1" in bad.text


RANDOM_CONFIGS: list[dict[str, Any]] = [
    {"rollout_correction": "token_mask", "rollout_is_min": 0.8, "rollout_is_max": 1.25},
    {"rollout_correction": "sequence_mask", "off_policy_mask_threshold": 0.1},
    {
        "rollout_correction": "sequence_truncate",
        "rollout_rs": "seq_mean_k1,token_k3",
        "rollout_rs_threshold": "0.9_1.1,0.02",
    },
    {"rollout_bypass": True, "rollout_correction": "token_truncate", "rollout_is_batch_normalize": True},
    {"rollout_rs": "seq_max_k2", "rollout_rs_threshold": "0.01"},
]


@pytest.mark.parametrize("seed", range(10))
def test_random_ragged_batches_with_unscored_tokens_give_a_consistent_block(seed: int) -> None:
    """Holes in the mask, prompts, tokens the sampler did not score: the block is built, every sentence's
    numbers are its own, the scatter holds exactly the scored tokens and the counts are the tokens'."""
    from api_fixtures import ragged_body

    body = ragged_body(seed)
    g = np.random.default_rng(100 + seed)
    sampler = []
    for i, row in enumerate(body["old_per_token_logps"]):
        out: list[float | None] = []
        for j, v in enumerate(row):
            counted = body["completion_mask"][i][j] and j >= body["prompt_lengths"][i]
            out.append(None if counted and g.random() < 0.15 else min(v - 0.1 * g.standard_normal(), -1e-4))
        sampler.append(out)
    fields = {k: v for k, v in body.items() if k != "tokens"}
    batch = batch_from_request({**fields, "sampling_per_token_logps": sampler})
    bd = grpo.evaluate(batch, grpo.LossConfig(dtype="float64", **RANDOM_CONFIGS[seed % len(RANDOM_CONFIGS)]))
    answer = breakdown_to_json(bd)
    view = answer["mismatch"]
    assert view is not None
    for parts in view["sentence_parts"]:
        for p in parts:
            if not isinstance(p, str):
                assert p["value"] == pytest.approx(_resolve(view, answer, p["quantity"]), rel=1e-12, abs=1e-15), p
    assert bd.rollout_logps is not None and bd.rollout_logps.sampler is not None
    scored = bd.rollout_logps.counted & ~torch.isnan(bd.rollout_logps.sampler)
    assert view["scatter"]["total"] == int(scored.sum()) == len(view["scatter"]["x"])
    assert sum(view["counts"].values()) == int(bd.rollout_logps.counted.sum())
