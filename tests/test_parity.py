"""Parity with TRL 1.16.0 and verl 0.9.1: every trl-* / verl-* preset (and the variants the spec
pairs with them) against the loop references in reference.py, value, gradient and metrics.

The references follow loss-variants-spec.md (§1 TRL, §2 verl) on one process (GA = S = 1, empty
global_batch_info). Batches are ragged, with a fully masked row and NaN in the padding.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from reference import (
    Inputs,
    close,
    close_breakdown,
    leaf,
    random_inputs,
    trl_advantages,
    trl_loss,
    verl_actor_loss,
    verl_agg_loss,
    verl_grpo_advantage,
    verl_kl_penalty,
    verl_policy_loss,
)

import grpo

pytestmark = pytest.mark.numerical  # run again under ATEN_CPU_CAPABILITY=default by make test

# float64: both sides compute the same formulas, so they agree to round-off: relative to the result,
# and absolutely to ATOL for a result of order 1 plus the round-off of the terms that cancel in it
# (reference.close_breakdown scales that part by their size).
RTOL64, ATOL64 = 1e-10, 1e-12
# float32 (the default dtype) against the reference run in float32: a few ulps of the largest term.
RTOL32, ATOL32 = 2e-5, 2e-6


def lib(inputs: Inputs, preset: str, dtype: str = "float64", **overrides: Any) -> grpo.Breakdown:
    config = grpo.LossConfig.from_preset(preset, dtype=dtype, **overrides)
    return grpo.evaluate(grpo.Batch(**inputs.batch_fields()), config)


def reference_grad(fn: Any, inputs: Inputs, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    lp = leaf(inputs.logp)
    loss, metrics = fn(lp, inputs, **kwargs)
    (grad,) = torch.autograd.grad(loss, lp)
    return loss.detach(), grad, metrics


def run_trl(lp: torch.Tensor, inputs: Inputs, **kwargs: Any) -> Any:
    return trl_loss(lp, inputs.old, inputs.ref, inputs.advantages, inputs.mask, **kwargs)


def run_verl(lp: torch.Tensor, inputs: Inputs, **kwargs: Any) -> Any:
    return verl_actor_loss(inputs.old, lp, inputs.ref, inputs.advantages, inputs.mask, **kwargs)


def check(
    bd: grpo.Breakdown, inputs: Inputs, loss: Any, grad: Any, metrics: dict[str, float], rtol: float, atol: float
) -> None:
    """Loss, gradient and metrics, each to ``atol`` plus the round-off of the terms that cancel in it."""
    close_breakdown(bd, inputs, loss, grad, metrics, rtol, atol)


# (preset, overrides, TRL _compute_loss settings): each trl-* preset, plus the settings the spec
# says change TRL's number (beta with and without the bias-corrected KL, delta, clip-higher,
# max_completion_length) and the loss types a preset reproduces by aggregation (bnpo, luspo).
TRL_CASES = [
    ("trl-grpo", {}, {"loss_type": "grpo"}),
    ("trl-grpo", {"beta": 0.04}, {"loss_type": "grpo", "beta": 0.04}),
    (
        "trl-grpo",
        {"beta": 0.04, "kl_bias_correction": False},
        {"loss_type": "grpo", "beta": 0.04, "use_bias_correction_kl": False},
    ),
    ("trl-dapo", {}, {"loss_type": "dapo"}),
    ("trl-dapo", {}, {"loss_type": "bnpo"}),  # bnpo == dapo on one micro-batch (§1.8)
    ("trl-dapo", {"epsilon_high": 0.28, "beta": 0.04}, {"loss_type": "dapo", "epsilon_high": 0.28, "beta": 0.04}),
    ("trl-dapo", {"delta": 3.0}, {"loss_type": "dapo", "delta": 3.0}),
    ("trl-dapo", {"delta": 1.1, "beta": 0.04}, {"loss_type": "dapo", "delta": 1.1, "beta": 0.04}),  # delta < 1+ε
    ("trl-dr_grpo", {}, {"loss_type": "dr_grpo"}),
    ("trl-dr_grpo", {"max_completion_length": 7}, {"loss_type": "dr_grpo", "max_completion_length": 7}),
    ("trl-grpo", {"aggregation": "seq-mean-token-sum"}, {"loss_type": "luspo"}),
    (
        "trl-gspo",
        {},
        {"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4},
    ),
    (
        "trl-gspo",
        {"beta": 0.04, "epsilon_low": 0.2, "epsilon_high": 0.2},
        {"loss_type": "grpo", "importance_sampling_level": "sequence", "beta": 0.04},
    ),
    ("trl-cispo", {}, {"loss_type": "cispo", "epsilon_high": 5.0}),
    ("trl-cispo", {"epsilon_high": 1.3, "beta": 0.04}, {"loss_type": "cispo", "epsilon_high": 1.3, "beta": 0.04}),
    ("trl-sapo", {}, {"loss_type": "sapo"}),
    ("trl-sapo", {"beta": 0.04}, {"loss_type": "sapo", "beta": 0.04}),
]

# (preset, overrides, verl settings): each verl-* preset, and the loss modes / agg modes / KL types
# of §2.2-§2.4 expressed as overrides.
VERL_CASES = [
    ("verl-grpo", {}, {"loss_agg_mode": "seq-mean-token-mean", "kl_loss_coef": 0.001}),
    ("verl-grpo", {"beta": 0.5}, {"loss_agg_mode": "seq-mean-token-mean", "kl_loss_coef": 0.5}),
    ("verl-dapo", {}, {"loss_agg_mode": "token-mean", "clip_ratio_high": 0.28}),
    (
        "verl-gspo",
        {},
        {"loss_agg_mode": "seq-mean-token-mean", "loss_mode": "gspo", "clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4},
    ),
    (
        "verl-gspo",
        {"aggregation": "token-mean"},
        {"loss_agg_mode": "token-mean", "loss_mode": "gspo", "clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4},
    ),
    (
        "verl-grpo",
        {"objective": "sapo", "beta": 0.0},
        {"loss_agg_mode": "token-mean", "loss_mode": "sapo"},  # sapo aggregates seq-mean-token-mean regardless
    ),
    (
        "verl-dapo",
        {"objective": "cispo", "cispo_bounds": "relative", "epsilon_low": 1.0, "epsilon_high": 4.0},
        {"loss_agg_mode": "token-mean", "loss_mode": "cispo", "clip_ratio_low": 1.0, "clip_ratio_high": 4.0},
    ),
    (
        "verl-dapo",
        {"objective": "cispo", "cispo_bounds": "relative", "epsilon_high": 0.2},
        {"loss_agg_mode": "token-mean", "loss_mode": "cispo"},
    ),
    ("verl-dapo", {"objective": "gpg"}, {"loss_agg_mode": "token-mean", "loss_mode": "gpg"}),
    (
        "verl-dapo",
        {"aggregation": "seq-mean-token-sum"},
        {"loss_agg_mode": "seq-mean-token-sum", "clip_ratio_high": 0.28},
    ),
    (
        "verl-dapo",
        {"aggregation": "seq-mean-token-sum-norm"},  # loss_scale_factor None: the padded width
        {"loss_agg_mode": "seq-mean-token-sum-norm", "clip_ratio_high": 0.28},
    ),
    (
        "verl-dapo",
        {"aggregation": "seq-mean-token-sum-norm", "max_completion_length": 512, "advantage": "none"},
        {"loss_agg_mode": "seq-mean-token-sum-norm", "clip_ratio_high": 0.28, "loss_scale_factor": 512},
    ),
    ("verl-dapo", {"dual_clip": 1.5}, {"loss_agg_mode": "token-mean", "clip_ratio_high": 0.28, "clip_ratio_c": 1.5}),
    (
        "verl-grpo",
        {"kl_estimator": "k1", "kl_clamp": None, "kl_log_ratio_clamp": None, "beta": 0.1},
        {"loss_agg_mode": "seq-mean-token-mean", "kl_loss_coef": 0.1, "kl_loss_type": "k1"},
    ),
    (
        "verl-grpo",
        {"kl_estimator": "k2", "kl_clamp": None, "kl_log_ratio_clamp": None, "beta": 0.1},
        {"loss_agg_mode": "seq-mean-token-mean", "kl_loss_coef": 0.1, "kl_loss_type": "mse"},
    ),
]


def _id(case: tuple[str, dict[str, Any], dict[str, Any]]) -> str:
    preset, overrides, _ = case
    return preset + "".join(f",{k}={v}" for k, v in overrides.items())


def extreme_inputs(seed: int) -> Inputs:
    """A random batch plus values that reach every clamp of §2.3-§2.4 (rows 0-2 full length).

    row 0: t0 log-ratio +25 (beyond verl's ±20); t1 ref - logp = 25 (beyond ±20; k3 far above 10).
    row 1: t0 log-ratio -25; t1 ref - logp = 4 (k3 = e^4 - 5 ≈ 49.6 > 10).
    row 2: every log-ratio 12, so GSPO's sequence log-ratio 12 > 10.
    Every other log-ratio and ref - logp stays well inside the clamps.
    """
    x = random_inputs(seed, B=6, T=5, empty_rows=0, garbage=None)
    mask = x.mask.clone()
    mask[:3] = 1.0
    logp, old, ref = x.logp.clone(), x.old.clone(), x.ref.clone()
    logp[0, :2], old[0, :2], ref[0, :2] = (
        torch.tensor([-0.5, -26.0]),
        torch.tensor([-25.5, -26.5]),
        torch.tensor([-0.5, -1.0]),
    )
    logp[1, :2], old[1, :2], ref[1, :2] = (
        torch.tensor([-26.0, -5.0]),
        torch.tensor([-1.0, -5.3]),
        torch.tensor([-26.2, -1.0]),
    )
    logp[2], old[2], ref[2] = -1.0, -13.0, -1.1
    advantages = x.advantages.clone()
    advantages[:3] = torch.tensor([1.0, -1.0, -0.5])
    return Inputs(logp, old, ref, mask, advantages, x.rewards, x.group_size)


SEEDS = [0, 1, 2, 3]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("case", TRL_CASES, ids=_id)
def test_trl_value_gradient_metrics_float64(case: Any, seed: int) -> None:
    preset, overrides, trl = case
    inputs = random_inputs(seed)
    loss, grad, metrics = reference_grad(run_trl, inputs, **trl)
    bd = lib(inputs, preset, **overrides)
    check(bd, inputs, loss, grad, metrics, RTOL64, ATOL64)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("case", VERL_CASES, ids=_id)
def test_verl_value_gradient_metrics_float64(case: Any, seed: int) -> None:
    preset, overrides, verl = case
    inputs = random_inputs(seed)
    loss, grad, metrics = reference_grad(run_verl, inputs, **verl)
    bd = lib(inputs, preset, **overrides)
    check(bd, inputs, loss, grad, metrics, RTOL64, ATOL64)


@pytest.mark.parametrize("case", TRL_CASES[::2], ids=_id)
def test_trl_float32(case: Any) -> None:
    """The default float32 evaluation against the reference run in float32."""
    preset, overrides, trl = case
    inputs = random_inputs(5).to(torch.float32)
    loss, grad, metrics = reference_grad(run_trl, inputs, **trl)
    bd = lib(inputs, preset, dtype="float32", **overrides)
    assert bd.loss.dtype == bd.tokens.grad.dtype == torch.float32
    check(bd, inputs, loss, grad, metrics, RTOL32, ATOL32)


@pytest.mark.parametrize("case", VERL_CASES[::2], ids=_id)
def test_verl_float32(case: Any) -> None:
    preset, overrides, verl = case
    inputs = random_inputs(5).to(torch.float32)
    loss, grad, metrics = reference_grad(run_verl, inputs, **verl)
    bd = lib(inputs, preset, dtype="float32", **overrides)
    check(bd, inputs, loss, grad, metrics, RTOL32, ATOL32)


@pytest.mark.parametrize("case", VERL_CASES[:4] + VERL_CASES[5:7], ids=_id)
@pytest.mark.parametrize("seed", [0, 1])
def test_verl_clamps(case: Any, seed: int) -> None:
    """Log-ratios of ±25, k3 far above 10 and a GSPO mean log-ratio of 12 hit verl's clamps:
    ±20 on the token log-ratio, ±20 / ±10 in low_var_kl, <= 10 on GSPO's sequence log-ratio."""
    preset, overrides, verl = case
    inputs = extreme_inputs(seed)
    loss, grad, metrics = reference_grad(run_verl, inputs, **verl)
    coef = verl.get("kl_loss_coef", 0.0)
    bd = lib(inputs, preset, **overrides)
    assert torch.isfinite(bd.tokens.grad).all()
    check(bd, inputs, loss, grad, metrics, RTOL64, ATOL64)
    counts = bd.clamp_counts
    if bd.config.log_ratio_clamp is not None:
        assert counts["log_ratio_clamp"] == 2  # the +25 and the -25
    if bd.config.seq_log_ratio_clamp is not None:
        assert counts["seq_log_ratio_clamp"] == int(inputs.mask[2].sum())  # row 2's tokens
    if coef:
        assert counts["kl_log_ratio_clamp"] == 1  # ref - logp = 25
        assert counts["kl_clamp"] == 2  # k3(20) and k3(4) = 49.6 are both above 10


def test_verl_clamps_change_the_number() -> None:
    """Without verl's clamps (TRL), the same extreme batch gives a different loss: the clamps
    are doing something in the case above."""
    inputs = extreme_inputs(0)
    verl = lib(inputs, "verl-grpo", beta=0.04)
    unclamped = lib(inputs, "verl-grpo", beta=0.04, log_ratio_clamp=None, kl_log_ratio_clamp=None, kl_clamp=None)
    assert abs(float(verl.loss) - float(unclamped.loss)) > 1e3  # k3(25) ≈ 7e10 · 0.04 / rows


@pytest.mark.parametrize("seed", [0, 1])
def test_trl_has_no_clamps(seed: int) -> None:
    """TRL clamps nothing (§1.4): a log-ratio of 25 enters exp as it is, k3 at x = 25 too."""
    inputs = extreme_inputs(seed)
    loss, grad, metrics = reference_grad(run_trl, inputs, loss_type="grpo", beta=0.04)
    bd = lib(inputs, "trl-grpo", beta=0.04)
    check(bd, inputs, loss, grad, metrics, RTOL64, ATOL64)
    assert float(bd.tokens.kl.max()) > 1e10  # k3(25) · ratio: unclamped
    assert all(v == 0 for v in bd.clamp_counts.values())


# --- the pairs spec §3 says agree, checked on both the references and the library --------------------
def test_trl_delta_equals_verl_dual_clip() -> None:
    """§3: TRL dapo + delta=3 == verl vanilla token-mean with clip_ratio_c=3 (log-ratios inside ±20),
    with tokens where ρ > 3 and A < 0 present; without delta they differ."""
    inputs = random_inputs(7, noise=1.5)
    assert bool(((inputs.logp - inputs.old).exp() > 3).logical_and(inputs.mask > 0).any())
    t_loss, t_grad, _ = reference_grad(run_trl, inputs, loss_type="dapo", delta=3.0)
    v_loss, v_grad, _ = reference_grad(run_verl, inputs, loss_agg_mode="token-mean", clip_ratio_c=3.0)
    close(t_loss, v_loss, RTOL64, ATOL64)
    close(t_grad, v_grad, RTOL64, ATOL64)
    a = lib(inputs, "trl-dapo", delta=3.0)
    b = lib(inputs, "verl-dapo", epsilon_high=0.2, dual_clip=3.0, log_ratio_clamp=None)
    close(a.loss, b.loss, RTOL64, ATOL64)
    close(a.tokens.grad, b.tokens.grad, RTOL64, ATOL64)
    plain = lib(inputs, "trl-dapo")
    assert abs(float(plain.loss) - float(b.loss)) > 1e-3


@pytest.mark.parametrize(
    ("trl", "verl"),
    [
        ({"loss_type": "dapo"}, {"loss_agg_mode": "token-mean", "clip_ratio_c": 1e9}),
        ({"loss_type": "grpo"}, {"loss_agg_mode": "seq-mean-token-mean", "clip_ratio_c": 1e9}),
        (
            {"loss_type": "dr_grpo", "max_completion_length": 7},
            {"loss_agg_mode": "seq-mean-token-sum-norm", "clip_ratio_c": 1e9},
        ),
        (
            {"loss_type": "grpo", "beta": 0.04, "use_bias_correction_kl": False},
            {"loss_agg_mode": "seq-mean-token-mean", "clip_ratio_c": 1e9, "kl_loss_coef": 0.04},
        ),
        (
            {"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4},
            {
                "loss_agg_mode": "seq-mean-token-mean",
                "loss_mode": "gspo",
                "clip_ratio_low": 3e-4,
                "clip_ratio_high": 4e-4,
            },
        ),
        ({"loss_type": "sapo"}, {"loss_agg_mode": "seq-mean-token-mean", "loss_mode": "sapo"}),
        (
            {"loss_type": "cispo", "epsilon_high": 5.0},
            {"loss_agg_mode": "token-mean", "loss_mode": "cispo", "clip_ratio_low": 1.0, "clip_ratio_high": 4.0},
        ),
    ],
)
def test_spec_section_3_pairs_agree(trl: dict[str, Any], verl: dict[str, Any]) -> None:
    """The references reproduce §3's table (no fully masked rows: there the seq-mean denominators
    differ by design, §3 item 5; log-ratios and k3 inside verl's clamps)."""
    inputs = random_inputs(11, T=7, empty_rows=0)
    t_loss, t_grad, _ = reference_grad(run_trl, inputs, **trl)
    v_loss, v_grad, _ = reference_grad(run_verl, inputs, **verl)
    close(t_loss, v_loss, 1e-7, 1e-9)  # verl's L + 1e-8 against TRL's L
    close(t_grad, v_grad, 1e-7, 1e-9)


def test_seq_mean_denominators_differ_with_an_empty_row() -> None:
    """§3 item 5: TRL's seq-mean divides by all B rows, verl's by the rows with a token.
    With one of 6 rows empty the two losses differ by exactly the factor 6/5."""
    inputs = random_inputs(3, empty_rows=1)
    trl = lib(inputs, "trl-grpo")
    verl = lib(inputs, "verl-grpo", beta=0.0, dual_clip=None, log_ratio_clamp=None, length_epsilon=0.0)
    close(verl.loss, trl.loss * 6 / 5, RTOL64, ATOL64)


# --- advantages ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("scale_rewards", "advantage"), [("group", "group"), ("batch", "batch"), ("none", "none")])
def test_trl_advantages(scale_rewards: str, advantage: str) -> None:
    """§1.3: group mean, unbiased std (group or batch), + 1e-4; 'none' is R - mean."""
    rewards = [1.0, 0.0, 0.0, 2.0, 0.5, 0.5, 3.0, 1.0, 0.0]
    inputs = random_inputs(0, B=9, empty_rows=0)
    batch = grpo.Batch(**{**inputs.batch_fields(), "advantages": None, "rewards": rewards, "group_size": 3})
    bd = grpo.evaluate(batch, grpo.LossConfig.from_preset("trl-grpo", advantage=advantage, dtype="float64"))
    close(bd.advantages, trl_advantages(rewards, 3, scale_rewards), RTOL64, ATOL64)
    assert bd.config.advantage_epsilon == 1e-4


@pytest.mark.parametrize("norm", [True, False])
def test_verl_grpo_advantage(norm: bool) -> None:
    """§2.5: scores are token-reward sums; 1e-6; a singleton group keeps its raw score (/(1 + 1e-6))."""
    token_rewards = torch.zeros(6, 4, dtype=torch.float64)
    token_rewards[:, -1] = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.25, 0.75])  # outcome reward on the last token
    scores = token_rewards.sum(-1).tolist()
    inputs = random_inputs(0, B=6, T=4, empty_rows=0)
    advantage = "group" if norm else "none"
    for group_size, index in ((3, [0, 0, 0, 1, 1, 1]), (2, [0, 0, 1, 1, 2, 2]), (1, [0, 1, 2, 3, 4, 5])):
        batch = grpo.Batch(**{**inputs.batch_fields(), "advantages": None, "rewards": scores, "group_size": group_size})
        bd = grpo.evaluate(batch, grpo.LossConfig.from_preset("verl-grpo", advantage=advantage, dtype="float64"))
        close(bd.advantages, verl_grpo_advantage(scores, index, norm_adv_by_std_in_grpo=norm), RTOL64, ATOL64)
    # The singleton rule: the advantage is the score itself, up to the 1e-6.
    close(bd.advantages, torch.tensor(scores, dtype=torch.float64) / (1 + 1e-6) if norm else scores, RTOL64, ATOL64)
    assert any("group_size 1" in w for w in bd.warnings)


def test_advantage_epsilons_differ() -> None:
    """§3 item 3: the same rewards under TRL (1e-4) and verl (1e-6): 0.49990 vs 0.49999990 here."""
    # rewards [1, 0, 0, 1]: group mean 0.5, unbiased std sqrt(1/3); use [1, 0] per group of 2:
    # std = sqrt(0.5) = 0.7071..., A = 0.5 / (0.7071 + eps). With [2, 1, 1, 0] in one group of 4:
    # mean 1, std = sqrt(2/3)... keep the spec's numbers: rewards [1, 0] give A = ±0.5/(√½ + eps).
    inputs = random_inputs(0, B=2, T=3, empty_rows=0)
    fields = {**inputs.batch_fields(), "advantages": None, "rewards": [1.0, 0.0], "group_size": 2}
    trl = grpo.evaluate(grpo.Batch(**fields), grpo.LossConfig.from_preset("trl-grpo", dtype="float64"))
    verl = grpo.evaluate(grpo.Batch(**fields), grpo.LossConfig.from_preset("verl-grpo", dtype="float64"))
    close(trl.advantages[0], 0.5 / (0.5**0.5 + 1e-4), RTOL64, ATOL64)
    close(verl.advantages[0], 0.5 / (0.5**0.5 + 1e-6), RTOL64, ATOL64)


# --- the reference pieces themselves, on tiny hand cases (so a wrong reference cannot pass silently)
def test_reference_agg_loss_by_hand() -> None:
    # Two rows: [1, 2] and [3, 4, 5] (the second one token longer), plus an empty row.
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]], dtype=torch.float64)
    vals = [
        [torch.tensor(1.0), torch.tensor(2.0), None],
        [torch.tensor(3.0), torch.tensor(4.0), torch.tensor(5.0)],
        [None] * 3,
    ]
    close(verl_agg_loss(vals, mask, "token-mean"), 15 / 5)
    close(verl_agg_loss(vals, mask, "seq-mean-token-sum"), (3 + 12) / 2)  # the empty row does not count
    close(verl_agg_loss(vals, mask, "seq-mean-token-mean"), (3 / (2 + 1e-8) + 12 / (3 + 1e-8)) / 2)
    close(verl_agg_loss(vals, mask, "seq-mean-token-sum-norm"), (3 + 12) / 2 / 3)  # width 3
    close(verl_agg_loss(vals, mask, "seq-mean-token-sum-norm", 10.0), (3 + 12) / 2 / 10)


def test_reference_kl_penalty_by_hand() -> None:
    logp = torch.tensor([[-1.0, -30.0]], dtype=torch.float64)
    ref = torch.tensor([[-1.5, -1.0]], dtype=torch.float64)
    mask = torch.ones(1, 2)
    k1, k2, k3 = (verl_kl_penalty(logp, ref, mask, k) for k in ("k1", "k2", "low_var_kl"))
    close(k1[0][0], 0.5)  # ℓ - ℓref
    close(k2[0][0], 0.125)  # ½ · 0.5²
    close(k3[0][0], math.exp(-0.5) + 0.5 - 1)  # e^x - x - 1 at x = -0.5
    close(k3[0][1], 10.0)  # x = 29 clamped to 20, then the estimate to 10


def test_reference_vanilla_dual_clip_by_hand() -> None:
    # One token, A = -1, ρ = 5: PPO keeps -A·ρ = 5 (the max of 5 and 1.2); dual clip caps at -A·c = 3.
    old = torch.tensor([[-2.0]], dtype=torch.float64)
    logp = (old + torch.tensor(5.0).log()).requires_grad_(True)
    loss, metrics = verl_policy_loss(old, logp, [-1.0], torch.ones(1, 1))
    close(loss, 3.0)
    assert metrics == {
        "actor/pg_clipfrac": 0.0,
        "actor/pg_clipfrac_lower": 1.0,
        "actor/ppo_kl": -float(torch.tensor(5.0).log()),
    }
