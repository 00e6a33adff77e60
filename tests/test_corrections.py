"""grpo/corrections.py: the rollout corrections' registry, their hand-derived values, and the invariants of
applying them in grpo.loss (policy term only, nothing changes without them, the loss without correction).

Parity with TRL's own code is in test_parity_offpolicy_trl.py.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import pytest
import torch
from api_fixtures import client

import grpo
from grpo.corrections import (
    CORRECTION_CODES,
    CORRECTION_WHY,
    CORRECTIONS,
    SAMPLING_METRICS,
    off_policy_keep,
    sampler_log_ratio,
)
from grpo.glossary import metric_meanings
from grpo.metrics import METRICS
from grpo.trainer_config import map_trl

NAN = float("nan")


def batch(**more: Any) -> grpo.Batch:
    """Two ragged rows; the sampler is 1.2 nats below old on row 0's first token (ratio e^1.2 = 3.32),
    did not score its second, and is 0.1 above old on row 1's token (ratio e^-0.1)."""
    return grpo.from_rows(
        [[-1.0, -2.0, -0.5], [-0.25]],
        old_per_token_logps=[[-1.1, -1.9, -0.5], [-0.3]],
        ref_per_token_logps=[[-1.2, -2.0, -0.4], [-0.2]],
        advantages=[1.0, -1.0],
        sampling_per_token_logps=[[-2.3, NAN, -0.5], [-0.2]],
        **more,
    )


def config(**settings: Any) -> grpo.LossConfig:
    return grpo.LossConfig.from_preset("trl-dapo", dtype="float64", beta=0.04, **settings)


def test_every_mode_is_registered_documented_and_offered() -> None:
    assert CORRECTIONS.names() == ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
    for entry in CORRECTIONS.entries():
        assert entry.doc and entry.label and entry.paper.startswith("https://")
    spec = next(s for s in grpo.FIELDS if s.name == "rollout_correction")
    assert spec.choice_names() == CORRECTIONS.names()
    assert set(CORRECTION_CODES) == {
        "not_counted",
        "kept",
        "truncated",
        "masked",
        "not_scored",
        "sequence_masked",
        "rejected",
    }
    assert set(CORRECTION_WHY) == set(CORRECTION_CODES)


@pytest.mark.parametrize(
    ("mode", "weights"),
    [
        # token: ratios e^1.2 = 3.3201 (past C_max 3), 1 (not scored), e^0 = 1; row 1: e^-0.1 = 0.9048
        ("token_truncate", [[3.0, 1.0, 1.0], [math.exp(-0.1)]]),
        ("token_mask", [[0.0, 1.0, 1.0], [math.exp(-0.1)]]),
        # sequence: exp(1.2 + 0 + 0) = 3.32 for row 0 (the NaN token adds 0), e^-0.1 for row 1
        ("sequence_truncate", [[3.0] * 3, [math.exp(-0.1)]]),
        ("sequence_mask", [[0.0] * 3, [math.exp(-0.1)]]),
    ],
)
def test_hand_derived_weights(mode: str, weights: list[list[float]]) -> None:
    bd = grpo.evaluate(batch(), config(rollout_correction=mode))
    got = [bd.tokens.is_weight[0, :3].tolist(), bd.tokens.is_weight[1, :1].tolist()]
    for row, expected in zip(got, weights, strict=True):
        assert row == pytest.approx(expected, rel=1e-12)
    codes = bd.tokens.correction_names()
    assert codes[0][0] == ("truncated" if "truncate" in mode else "masked")
    assert codes[0][1] == ("not_scored" if mode.startswith("token") else codes[0][0])
    assert codes[1][1:] == ["not_counted", "not_counted"]


def test_bounds_min_and_none() -> None:
    ratio = torch.tensor([[0.1, 0.5, 2.0, 9.0]], dtype=torch.float64).log()
    lo = grpo.LossConfig(rollout_is_min=0.4, rollout_is_max=None)
    got = CORRECTIONS.get("token_truncate")(ratio, torch.ones_like(ratio), lo)
    assert got.weight[0].tolist() == pytest.approx([0.4, 0.5, 2.0, 9.0])
    got = CORRECTIONS.get("token_mask")(ratio, torch.ones_like(ratio), lo)
    assert got.weight[0].tolist() == pytest.approx([0.0, 0.5, 2.0, 9.0]) and got.acted.tolist() == [[1, 0, 0, 0]]
    free = grpo.LossConfig(rollout_is_min=None, rollout_is_max=None)
    unbounded = CORRECTIONS.get("token_truncate")(ratio, torch.ones_like(ratio), free)
    assert unbounded.weight[0].tolist() == pytest.approx([0.1, 0.5, 2.0, 9.0])


def test_sampler_log_ratio_is_zero_where_not_scored_or_not_counted() -> None:
    old = torch.tensor([[-1.0, -2.0, 0.0]])
    sampler = torch.tensor([[-1.5, NAN, NAN]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    assert sampler_log_ratio(old, sampler, mask).tolist() == [[0.5, 0.0, 0.0]]


def test_off_policy_mask_keeps_positive_advantages_and_small_gaps() -> None:
    """Row means of sampler - current: row 0 (A < 0) 0.5 > 0.3: dropped; row 1 (A < 0) 0.1: kept;
    row 2 (A >= 0) 0.9: kept whatever its gap. NaN counts 0 and still counts in the mean's length."""
    logp = torch.tensor([[-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0]])
    sampler = torch.tensor([[-0.5, -0.5], [-0.8, NAN], [-0.1, -0.1]])
    keep, gap = off_policy_keep(torch.tensor([[-1.0], [-1.0], [0.0]]), logp, sampler, torch.ones(3, 2), 0.3)
    assert keep.flatten().tolist() == [0.0, 1.0, 1.0]
    assert gap.flatten().tolist() == pytest.approx([0.5, 0.1, 0.9])


@pytest.mark.parametrize("mode", CORRECTIONS.names())
def test_the_correction_acts_on_the_policy_term_only(mode: str) -> None:
    corrected = grpo.evaluate(batch(), config(rollout_correction=mode, off_policy_mask_threshold=0.0))
    plain = grpo.evaluate(batch(), config())
    torch.testing.assert_close(corrected.tokens.grad_kl, plain.tokens.grad_kl, rtol=0, atol=0)
    torch.testing.assert_close(corrected.kl_loss, plain.kl_loss, rtol=0, atol=0)
    # each token's policy loss is the uncorrected one times its weight (and the row's keep)
    factor = corrected.tokens.is_weight * (corrected.tokens.correction != CORRECTION_CODES.index("sequence_masked"))
    torch.testing.assert_close(corrected.tokens.policy_loss, plain.tokens.policy_loss * factor, rtol=1e-12, atol=0)
    torch.testing.assert_close(corrected.tokens.grad_policy, plain.tokens.grad_policy * factor, rtol=1e-12, atol=0)
    torch.testing.assert_close(corrected.loss, corrected.tokens.loss.sum(), rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(corrected.loss_without_correction, plain.loss, rtol=1e-12, atol=1e-15)


def test_compute_loss_applies_it_too() -> None:
    cfg = config(rollout_correction="sequence_truncate", off_policy_mask_threshold=0.0)
    torch.testing.assert_close(grpo.compute_loss(batch(), cfg), grpo.evaluate(batch(), cfg).loss, rtol=1e-12, atol=0)


def test_without_sampler_log_probs_nothing_changes() -> None:
    """No sampler field: no IS weight (and no sampling/* metric); the sequence mask measures against old."""
    plain = grpo.from_rows([[-1.0, -2.0], [-0.25]], old_per_token_logps=[[-1.1, -1.9], [-0.3]], advantages=[1.0, -1.0])
    before = grpo.evaluate(plain, config())
    after = grpo.evaluate(plain, config(rollout_correction="sequence_mask"))
    assert float(after.loss) == float(before.loss) and not set(SAMPLING_METRICS) & set(after.metrics)
    assert after.tokens.is_weight.tolist() == before.tokens.mask.double().tolist()
    # row 1 (A < 0): mean(old - current) = -0.3 - (-0.25) = -0.05 <= 0: kept at 0, dropped at -0.1
    kept = grpo.evaluate(plain, config(off_policy_mask_threshold=0.0))
    dropped = grpo.evaluate(plain, config(off_policy_mask_threshold=-0.1))
    assert float(kept.loss) == float(before.loss) and float(dropped.rows.policy_loss[1]) == 0.0


def test_sampling_metrics_hand_derived() -> None:
    bd = grpo.evaluate(batch(), config(rollout_correction="token_truncate"))
    # |old - sampler| over scored counted tokens: 1.2, 0.0, 0.1
    assert bd.metrics["sampling/sampling_logp_difference/mean"] == pytest.approx(1.3 / 3, rel=1e-12)
    assert bd.metrics["sampling/sampling_logp_difference/max"] == pytest.approx(1.2, rel=1e-12)
    # weights over counted tokens, the unscored one (1) included: 3, 1, 1, e^-0.1
    assert bd.metrics["sampling/importance_sampling_ratio/min"] == pytest.approx(math.exp(-0.1), rel=1e-12)
    assert bd.metrics["sampling/importance_sampling_ratio/mean"] == pytest.approx((5 + math.exp(-0.1)) / 4)
    assert bd.metrics["sampling/importance_sampling_ratio/max"] == pytest.approx(3.0)
    # sequence modes: over the rows
    seq = grpo.evaluate(batch(), config(rollout_correction="sequence_mask"))
    assert seq.metrics["sampling/importance_sampling_ratio/mean"] == pytest.approx(math.exp(-0.1) / 2)


def test_metrics_are_in_the_table_and_the_glossary() -> None:
    meanings = metric_meanings(grpo.LossConfig())
    for name in SAMPLING_METRICS:
        assert name in METRICS and meanings[name]


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
def test_from_trl_maps_every_setting(mode: str) -> None:
    from trl import GRPOConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        args = GRPOConfig(
            output_dir="/tmp/unused",
            use_vllm=True,
            use_cpu=True,
            bf16=False,
            report_to=[],
            vllm_importance_sampling_mode=mode,
            vllm_importance_sampling_clip_min=0.25,
            off_policy_mask_threshold=0.5,
            vllm_importance_sampling_cap=2.5,  # deprecated: GRPOConfig copies it to clip_max
        )
        mapping = map_trl(args)
        config_ = grpo.LossConfig.from_trl(args, strict=True)
    assert mapping.unsupported == {}
    assert (config_.rollout_correction, config_.rollout_is_min, config_.rollout_is_max) == (mode, 0.25, 2.5)
    assert config_.off_policy_mask_threshold == 0.5
    for name in ("use_vllm", "vllm_importance_sampling_mode", "off_policy_mask_threshold"):
        assert name in mapping.mapped


def test_from_trl_without_vllm_applies_no_weights_but_the_mask() -> None:
    mapping = map_trl({"off_policy_mask_threshold": 0.5})
    assert mapping.config.rollout_correction == "none" and mapping.config.off_policy_mask_threshold == 0.5
    assert map_trl({"use_vllm": True}).config.rollout_correction == "sequence_mask"  # TRL's defaults
    assert map_trl({"use_vllm": True, "vllm_importance_sampling_cap": 2.0}).config.rollout_is_max == 2.0
    with pytest.raises(grpo.GrpoInputError, match="vllm_importance_sampling_mode"):
        map_trl({"use_vllm": True, "vllm_importance_sampling_mode": "tokens"})


def test_bad_settings_name_the_field() -> None:
    with pytest.raises(grpo.GrpoInputError, match="rollout_correction: expected one of none, token_truncate"):
        grpo.LossConfig(rollout_correction="icepop")
    with pytest.raises(grpo.GrpoInputError, match="rollout_is_max"):
        grpo.LossConfig(rollout_is_max=0.0)


def test_warnings_say_what_happens_without_or_with_unscored_sampler_tokens() -> None:
    plain = grpo.from_rows([[-1.0, -2.0]], advantages=[1.0])
    (said,) = [w for w in grpo.evaluate(plain, config(rollout_correction="token_mask")).warnings if "sampler" in w]
    assert "no IS weight or rejection is applied" in said
    (unscored,) = [w for w in grpo.evaluate(batch(), config()).warnings if "not scored" in w]
    assert unscored.startswith("1 tokens were not scored")


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"rollout_rs": "token_k9"}, "rollout_rs"),
        ({"rollout_rs": "token_k2"}, "rollout_rs_threshold"),
        ({"rollout_rs": "token_k1", "rollout_rs_threshold": "3_1"}, "rollout_rs_threshold"),
        ({"rollout_is_min": 4.0, "rollout_is_max": 3.0}, "rollout_is_min"),
    ],
)
def test_config_cross_checks_name_the_field(settings: dict[str, Any], field: str) -> None:
    with pytest.raises(grpo.GrpoInputError) as caught:
        grpo.LossConfig(**settings)
    assert caught.value.field == field


def test_api_bad_correction_settings_are_422_naming_the_config_field() -> None:
    body = {"per_token_logps": [[-1.0, -2.0]], "advantages": [1.0], "rollout_log_probs": [[-1.0, None]]}
    for settings, field in (
        ({"rollout_rs": "token_k1", "rollout_rs_threshold": "3_1"}, "rollout_rs_threshold"),
        ({"rollout_correction": "icepop"}, "rollout_correction"),
        ({"rollout_is_max": -1}, "rollout_is_max"),
    ):
        response = client(raise_server_exceptions=False).post("/api/v1/loss", json={**body, "config": settings})
        assert response.status_code == 422
        assert response.json()["detail"][0]["loc"] == ["body", "config", field]
    ok = client().post("/api/v1/loss", json={**body, "config": {"rollout_correction": "token_mask"}})
    assert ok.status_code == 200 and any("not scored" in w for w in ok.json()["warnings"])
