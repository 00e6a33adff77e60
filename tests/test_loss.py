"""grpo.loss.evaluate: hand-derived values for every preset, the Breakdown's invariants, the
vectorised pass against a per-token loop, metrics, warnings, dtypes and devices.

Hand cases use reference.HAND (ratios [[1.5, 0.9], [0.5, 1.1, 4.0]], A = [+1, -1],
pi_ref / pi = 2 and 1/2 at the first token of each row, NaN padding).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

import pytest
import torch
from reference import (
    K3_ROW0,
    K3_ROW1,
    LN,
    ULPS,
    Inputs,
    close,
    close_breakdown,
    eps,
    evaluate64,
    leaf,
    loop_evaluate,
    random_inputs,
)

import grpo
from grpo.explain import explain
from grpo.objectives import REGIONS

pytestmark = pytest.mark.numerical  # run again under ATEN_CPU_CAPABILITY=default by make test

M, T_, LO, HI, DC = (REGIONS.index(n) for n in ("masked", "trust", "clip_low", "clip_high", "dual_clip"))
E8 = 1e-8  # verl's length epsilon
S0 = math.sqrt(1.5 * 0.9)  # row 0's sequence ratio: exp(mean(ln 1.5, ln 0.9))
S1 = (0.5 * 1.1 * 4.0) ** (1 / 3)  # row 1's: exp(mean(ln 0.5, ln 1.1, ln 4)) = 2.2^(1/3)


VESPO_PHI0 = math.exp(3 + 2 * LN(1.35) - 3 * 1.35)
VESPO_PHI1 = math.exp(2 + 3 * LN(2.2) - 2 * 2.2)
GM_A0, GM_A1 = 2 / (2 + E8), -3 / (3 + E8)  # GMPO's row advantages Σ_t A / (L + 1e-8)
GM_R0 = math.exp((0.4 + LN(0.9)) / (2 + E8))  # row 0: ln 1.5 clipped to 0.4
GM_R1 = math.exp((-0.4 + LN(1.1) + LN(4.0)) / (3 + E8))  # row 1 (A < 0): ln 0.5 raised to -0.4, ln 4 kept


def sig(x: float) -> float:
    return 1 / (1 + math.exp(-x))


# Each preset on the hand batch: expected loss, d loss / d logp (padding 0) and regions.
# The surrogate per token (clip, ε = 0.2, trust region [0.8, 1.2]):
#   row 0 (A = +1): min(1.5, 1.2) = 1.2 (clip_high, flat), min(0.9, 0.9) = 0.9 (trust)
#   row 1 (A = -1): min(-0.5, -0.8) = -0.8 (clip_low, flat), -1.1 (trust), min(-4, -1.2) = -4 (trust)
# A trust token's policy gradient is -w·A·r; a k3 token's KL gradient is beta·w·(1 - pi_ref/pi).
HAND_PRESETS: dict[str, dict[str, Any]] = {
    # seq-mean-token-mean over B = 2 rows: w = 1/(2·2) on row 0, 1/(2·3) on row 1; beta 0.01 · k3.
    # loss = -(1.2 + 0.9)/4 - (-0.8 - 1.1 - 4)/6 + 0.01·(k3_0/4 + k3_1/6)
    "article": {
        "loss": -2.1 / 4 + 5.9 / 6 + 0.01 * (K3_ROW0 / 4 + K3_ROW1 / 6),
        "grad": [[0.01 / 4 * (1 - 2), -0.9 / 4, 0], [0.01 / 6 * (1 - 0.5), 1.1 / 6, 4 / 6]],
        "region": [[HI, T_, M], [LO, T_, T_]],
        "metrics": {"clip_ratio/low_mean": 1 / 5, "clip_ratio/high_mean": 1 / 5, "clip_ratio/region_mean": 2 / 5},
    },
    # TRL grpo: the same aggregation, beta 0: only the policy part.
    "trl-grpo": {
        "loss": -2.1 / 4 + 5.9 / 6,
        "grad": [[0, -0.9 / 4, 0], [0, 1.1 / 6, 4 / 6]],
        "region": [[HI, T_, M], [LO, T_, T_]],
        # TRL logs the bias-corrected KL, k3 · r: (k3_0 · 1.5 + k3_1 · 0.5) / 5 tokens
        "metrics": {"kl": (K3_ROW0 * 1.5 + K3_ROW1 * 0.5) / 5, "clip_ratio/region_mean": 2 / 5},
    },
    # TRL dapo: token mean over the 5 tokens: -(1.2 + 0.9 - 0.8 - 1.1 - 4)/5 = 3.8/5
    "trl-dapo": {
        "loss": 3.8 / 5,
        "grad": [[0, -0.9 / 5, 0], [0, 1.1 / 5, 4 / 5]],
        "region": [[HI, T_, M], [LO, T_, T_]],
    },
    # TRL dr_grpo: token sum / (B · max_completion_length) = 3.8 / (2 · 512)
    "trl-dr_grpo": {
        "loss": 3.8 / 1024,
        "grad": [[0, -0.9 / 1024, 0], [0, 1.1 / 1024, 4 / 1024]],
        "region": [[HI, T_, M], [LO, T_, T_]],
    },
    # TRL GSPO, ε 3e-4 / 4e-4 on the sequence ratios s0 = √1.35 ≈ 1.162, s1 = 2.2^(1/3) ≈ 1.301:
    #   row 0 (A > 0): min(s0, 1.0004) = 1.0004, flat;  row 1 (A < 0): -max(s1, 1.0004) = -s1, trust.
    # loss = -(1.0004 - s1)/2; d loss / d logp_t of row 1 = (1/2)·d s1/d logp_t = (1/2)·s1/3.
    "trl-gspo": {
        "loss": (S1 - 1.0004) / 2,
        "grad": [[0, 0, 0], [S1 / 6] * 3],
        "region": [[HI, HI, M], [T_, T_, T_]],
        # TRL's sequence-level metrics count rows: 1 of 2 clipped high. verl's pg_clipfrac counts tokens: 2 of 5.
        "metrics": {"clip_ratio/high_mean": 1 / 2, "clip_ratio/low_mean": 0.0, "actor/pg_clipfrac": 2 / 5},
    },
    # TRL CISPO, cap 5 (no ratio reaches it): loss = -(1/5)·Σ sg(min(r, 5))·A·logp; grad = -r·A/5.
    "trl-cispo": {
        "loss": -(1.5 * LN(0.3) + 0.9 * LN(0.45) - 0.5 * LN(0.1) - 1.1 * LN(0.55) - 4.0 * LN(0.8)) / 5,
        "grad": [[-1.5 / 5, -0.9 / 5, 0], [0.5 / 5, 1.1 / 5, 4.0 / 5]],
        "region": [[T_, T_, M], [T_, T_, T_]],
        "metrics": {"cispo_clip_ratio": 0.0},
    },
    # TRL SAPO: (4/τ)·σ(τ(r - 1))·A with τ = 1 (A > 0), 1.05 (A < 0); seq-mean-token-mean.
    # Its gradient is -w·4σ(1 - σ)·r·A (the τ of the slope cancels the 1/τ).
    "trl-sapo": {
        "loss": -(4 * sig(0.5) + 4 * sig(-0.1)) / 4
        + (4 / 1.05) * (sig(1.05 * -0.5) + sig(1.05 * 0.1) + sig(1.05 * 3.0)) / 6,
        "grad": [
            [-4 * sig(0.5) * (1 - sig(0.5)) * 1.5 / 4, -4 * sig(-0.1) * (1 - sig(-0.1)) * 0.9 / 4, 0],
            [
                4 * sig(-0.525) * (1 - sig(-0.525)) * 0.5 / 6,
                4 * sig(0.105) * (1 - sig(0.105)) * 1.1 / 6,
                4 * sig(3.15) * (1 - sig(3.15)) * 4.0 / 6,
            ],
        ],
        "region": [[T_, T_, M], [T_, T_, T_]],
    },
    # verl GRPO: dual clip c = 3 caps row 1's r = 4 (A < 0): max(-4, -3) = -3, flat.
    # w = 1/(2·(L + 1e-8)); beta 0.001 · low_var_kl (inside its clamps).
    "verl-grpo": {
        "loss": -2.1 / (2 * (2 + E8))
        + 4.9 / (2 * (3 + E8))
        + 0.001 * (K3_ROW0 / (2 * (2 + E8)) + K3_ROW1 / (2 * (3 + E8))),
        "grad": [
            [0.001 * (1 - 2) / (2 * (2 + E8)), -0.9 / (2 * (2 + E8)), 0],
            [0.001 * (1 - 0.5) / (2 * (3 + E8)), 1.1 / (2 * (3 + E8)), 0],
        ],
        "region": [[HI, T_, M], [LO, T_, DC]],
        # pg_clipfrac: r = 1.5 (A>0) and r = 0.5 (A<0) of 5 tokens; pg_clipfrac_lower: the dual clip, 1 of 5;
        # ppo_kl = mean(old - logp) = -ln(1.5 · 0.9 · 0.5 · 1.1 · 4) / 5
        "metrics": {
            "actor/pg_clipfrac": 2 / 5,
            "actor/pg_clipfrac_lower": 1 / 5,
            "actor/ppo_kl": -LN(2.97) / 5,
            "kl": (K3_ROW0 + K3_ROW1) / 5,
        },
    },
    # verl DAPO: token mean, clip-higher 1.28 (r = 1.5 -> 1.28), dual clip 3:
    # loss = -(1.28 + 0.9 - 0.8 - 1.1 - 3)/5 = 2.72/5
    "verl-dapo": {
        "loss": 2.72 / 5,
        "grad": [[0, -0.9 / 5, 0], [0, 1.1 / 5, 0]],
        "region": [[HI, T_, M], [LO, T_, DC]],
        "metrics": {"actor/pg_clipfrac_lower": 1 / 5},
    },
    # verl GSPO: as TRL GSPO with verl's seq-mean-token-mean (L + 1e-8): row 0 adds 2·1.0004/(2 + 1e-8),
    # row 1 adds -3·s1/(3 + 1e-8), halved; row 1's tokens get s1/(2·(3 + 1e-8)) each.
    "verl-gspo": {
        "loss": -(2 * 1.0004 / (2 + E8) - 3 * S1 / (3 + E8)) / 2,
        "grad": [[0, 0, 0], [S1 / (2 * (3 + E8))] * 3],
        "region": [[HI, HI, M], [T_, T_, T_]],
        "metrics": {"actor/pg_clipfrac": 2 / 5, "actor/pg_clipfrac_lower": 0.0},
    },
    # TRL VESPO: one gamma weight per row from the summed log-ratio, w0 = 1.5·0.9 = 1.35 (A ≥ 0: k 2, λ 3),
    # w1 = 0.5·1.1·4 = 2.2 (A < 0: k 3, λ 2); φ = e^λ·w^k·e^(−λw), detached; terms φ·A·logp, token mean over 5:
    # each token's gradient is -φ_i·A_i / 5.
    "trl-vespo": {
        "loss": -(VESPO_PHI0 * (LN(0.3) + LN(0.45)) - VESPO_PHI1 * (LN(0.1) + LN(0.55) + LN(0.8))) / 5,
        "grad": [[-VESPO_PHI0 / 5] * 2 + [0], [VESPO_PHI1 / 5] * 3],
        "region": [[T_, T_, M], [T_, T_, T_]],
        "metrics": {"vespo/phi_seq_mean": (VESPO_PHI0 + VESPO_PHI1) / 2},
    },
    # verl GMPO (clip_ratio 0.4 on the log-ratio): row 0's ln 1.5 > 0.4 enters as 0.4 (flat), row 1's ln 0.5 < -0.4
    # as -0.4 (flat, A < 0); the rows' ratios are R_i = exp(Σ clipped / (L_i + 1e-8)), the loss the mean over the
    # 2 rows of -Ā_i·R_i with Ā_i = A_i·L_i/(L_i + 1e-8); a kept token gets -Ā_i·R_i / (2·(L_i + 1e-8)).
    "verl-gmpo": {
        "loss": -(GM_A0 * GM_R0 + GM_A1 * GM_R1) / 2,
        "grad": [[0, -GM_A0 * GM_R0 / (2 * (2 + E8)), 0], [0] + [-GM_A1 * GM_R1 / (2 * (3 + E8))] * 2],
        "region": [[HI, T_, M], [LO, T_, T_]],
        # verl counts a log-ratio as clipped wherever the clamp would move it: ln 4 too, though max() keeps it
        "metrics": {"actor/pg_clipfrac": 1 / 5, "actor/pg_clipfrac_lower": 2 / 5},
    },
    # verl Clip-Cov: no token's covariance (A - mean A)·(logp - mean logp) lies in (1, 5) once the clipped (1, 0) is
    # out, so nothing is cut: PPO clip without dual clip, token mean over 5: -(1.2 + 0.9 - 0.8 - 1.1 - 4)/5.
    "verl-clip_cov": {
        "loss": 3.8 / 5,
        "grad": [[0, -0.9 / 5, 0], [0, 1.1 / 5, 4 / 5]],
        "region": [[HI, T_, M], [LO, T_, T_]],
        "metrics": {"actor/pg_clipfrac": 0.0},
    },
    # verl KL-Cov: the one top-covariance token (max(1, int(5·2e-4))) is (1, 0), cov = -0.8·(ln 0.1 - mean logp)
    # ≈ 1.02; its term is A·r - 0.1·|ln 0.5| = -0.5 - 0.1·ln 2, its gradient -(1/5)·(-0.5 + 0.1).
    "verl-kl_cov": {
        "loss": (3.2 + 0.1 * LN(2)) / 5,
        "grad": [[-1.5 / 5, -0.9 / 5, 0], [0.4 / 5, 1.1 / 5, 4 / 5]],
        "region": [[T_, T_, M], [T_, T_, T_]],
        "metrics": {"actor/ppo_kl": (LN(1.5) - LN(0.9) + LN(2) + LN(1.1) + LN(4)) / 5},
    },
    # verl DPPO-TV: every token's p - p_old (0.1, -0.05; -0.1, 0.05, 0.6) is inside its side's 0.2, so all count;
    # the ratio 4 is truncated at 3: terms sg(min(r, 3))·A·logp, token mean, gradient -(1/5)·A·min(r, 3).
    "verl-dppo_tv": {
        "loss": -(1.5 * LN(0.3) + 0.9 * LN(0.45) - 0.5 * LN(0.1) - 1.1 * LN(0.55) - 3 * LN(0.8)) / 5,
        "grad": [[-1.5 / 5, -0.9 / 5, 0], [0.5 / 5, 1.1 / 5, 3 / 5]],
        "region": [[T_, T_, M], [T_, T_, T_]],
        "metrics": {"actor/pg_clipfrac": 0.0, "actor/pg_clipfrac_lower": 1 / 5},
    },
    # verl DPPO-KL: the binary KLs of the tokens that moved against their side (0.026 at (0, 0), 0.044 at (1, 0))
    # stay under 0.2, the others moved the allowed way: all count, and the numbers are DPPO-TV's.
    "verl-dppo_kl": {
        "loss": -(1.5 * LN(0.3) + 0.9 * LN(0.45) - 0.5 * LN(0.1) - 1.1 * LN(0.55) - 3 * LN(0.8)) / 5,
        "grad": [[-1.5 / 5, -0.9 / 5, 0], [0.5 / 5, 1.1 / 5, 3 / 5]],
        "region": [[T_, T_, M], [T_, T_, T_]],
        "metrics": {"actor/pg_clipfrac": 0.0, "actor/pg_clipfrac_lower": 1 / 5},
    },
}


def test_every_preset_has_a_hand_case() -> None:
    assert set(HAND_PRESETS) == set(grpo.PRESETS)


@pytest.mark.parametrize("preset", list(HAND_PRESETS))
def test_preset_by_hand(preset: str, hand_batch: grpo.Batch) -> None:
    case = HAND_PRESETS[preset]
    bd = evaluate64(hand_batch, preset)
    close(bd.loss, case["loss"])
    close(bd.tokens.grad, case["grad"])
    assert bd.tokens.region.tolist() == case["region"]
    for name, value in case.get("metrics", {}).items():
        close(bd.metrics[name], value)
    # the flat tokens get no policy gradient; the masked position nothing at all
    flat = bd.tokens.region > T_
    assert (bd.tokens.grad_policy[flat] == 0).all()
    assert bd.tokens.grad[0, 2] == 0 and bd.tokens.loss[0, 2] == 0 and bd.tokens.weight[0, 2] == 0


def test_article_parts_by_hand(hand_batch: grpo.Batch) -> None:
    """The article preset's parts apart: policy_loss, kl_loss, per-token surrogate, kl and weight."""
    bd = evaluate64(hand_batch, "article")
    close(bd.policy_loss, -2.1 / 4 + 5.9 / 6)
    close(bd.kl_loss, 0.01 * (K3_ROW0 / 4 + K3_ROW1 / 6))
    close(bd.tokens.surrogate, [[1.2, 0.9, 0], [-0.8, -1.1, -4.0]])
    close(bd.tokens.ratio, [[1.5, 0.9, 0], [0.5, 1.1, 4.0]])
    close(bd.tokens.clipped_ratio, [[1.2, 0.9, 0], [0.8, 1.1, 1.2]])
    close(bd.tokens.kl, [[K3_ROW0, 0, 0], [K3_ROW1, 0, 0]])
    close(bd.tokens.weight, [[1 / 4, 1 / 4, 0], [1 / 6, 1 / 6, 1 / 6]])
    close(bd.tokens.grad_kl, [[-0.01 / 4, 0, 0], [0.005 / 6, 0, 0]])
    # per row: the row's share of the loss and its sequence ratio exp(mean log-ratio)
    close(bd.rows.loss, [-2.1 / 4 + 0.01 * K3_ROW0 / 4, 5.9 / 6 + 0.01 * K3_ROW1 / 6])
    close(bd.rows.sequence_ratio, [S0, S1])
    close(bd.rows.length, [2, 3])
    close(bd.rows.clip_fraction, [1 / 2, 1 / 3])
    assert bd.tokens.region_names()[1] == ["clip_low", "trust", "trust"]
    close(bd.metrics["kl"], (K3_ROW0 + K3_ROW1) / 5)  # = 0.5 / 5: the two k3 values sum to 1/2
    close(bd.metrics["lens/ratio/min"], 0.5)
    close(bd.metrics["lens/ratio/max"], 4.0)
    close(bd.metrics["lens/ratio/mean"], (1.5 + 0.9 + 0.5 + 1.1 + 4.0) / 5)
    close(bd.metrics["lens/grad_norm_logps"], torch.linalg.vector_norm(bd.tokens.grad))
    close(bd.metrics["completions/mean_length"], 2.5)
    assert bd.metrics["lens/num_tokens"] == 5


# --- invariants of the Breakdown on random batches, every preset --------------------------------
@pytest.mark.parametrize("preset", list(grpo.PRESETS))
def test_breakdown_invariants(preset: str, inputs: Inputs) -> None:
    bd = evaluate64(grpo.Batch(**inputs.batch_fields()), preset, beta=0.05)
    close(bd.tokens.loss.sum(), bd.loss)
    close(bd.policy_loss + bd.kl_loss, bd.loss)
    close(bd.tokens.policy_loss + bd.tokens.kl_loss, bd.tokens.loss)
    assert float(bd.objective) == -float(bd.loss)
    close(bd.rows.loss.sum(), bd.loss)
    close(bd.rows.policy_loss + bd.rows.kl_loss, bd.rows.loss)
    close(bd.tokens.grad_policy + bd.tokens.grad_kl, bd.tokens.grad)
    masked = ~bd.tokens.mask
    assert masked.any()
    for name in ("ratio", "surrogate", "kl", "weight", "loss", "grad", "grad_policy", "grad_kl", "log_ratio"):
        assert (getattr(bd.tokens, name)[masked] == 0).all(), name
    assert (bd.tokens.region[masked] == M).all() and (bd.tokens.region[bd.tokens.mask] != M).all()
    assert bd.tokens.mask.tolist() == (inputs.mask > 0).tolist()
    close(bd.metrics["actor/pg_loss"], bd.policy_loss)


def test_grad_matches_finite_differences(inputs: Inputs) -> None:
    """bd.tokens.grad is d loss / d per_token_logps: check it against finite differences."""
    batch_fields = inputs.batch_fields()
    bd = evaluate64(grpo.Batch(**batch_fields), "verl-grpo", beta=0.05)
    i, t = next((i, t) for i in range(6) for t in range(7) if inputs.mask[i, t] and bd.tokens.region[i, t] == T_)
    h = 1e-6
    shifted = []
    for sign in (1, -1):
        lp = inputs.logp.clone()
        lp[i, t] += sign * h
        shifted.append(
            float(evaluate64(grpo.Batch(**{**batch_fields, "per_token_logps": lp}), "verl-grpo", beta=0.05).loss)
        )
    # Central differences: truncation error h²·|f⁽³⁾|/6 (f⁽³⁾ is O(1) here, so h²), and each loss is
    # exact to the round-off of its terms, ULPS·eps·Σ|token loss|, divided by 2h twice over.
    round_off = ULPS * eps(torch.float64) * float(bd.tokens.loss.abs().sum()) / h
    close((shifted[0] - shifted[1]) / (2 * h), bd.tokens.grad[i, t], rtol=1e-6, atol=round_off + h**2)


# --- the vectorised pass against a per-token loop, over the registries' combinations -----------------
def _configs() -> list[grpo.LossConfig]:
    out = []
    objectives = [
        {"objective": "clip"},
        {"objective": "clip", "dual_clip": 3.0, "log_ratio_clamp": 1.0},
        {"objective": "clip", "delta": 1.5, "epsilon_high": 0.28},
        {"objective": "cispo", "cispo_bounds": "absolute", "epsilon_high": 1.3},
        {"objective": "cispo", "cispo_bounds": "relative"},
        {"objective": "sapo"},
        {"objective": "gpg"},
    ]
    aggregations = list(grpo.AGGREGATIONS.names())
    kls = list(grpo.KL_ESTIMATORS.names())
    for k, (objective, level, aggregation) in enumerate(
        itertools.product(objectives, ("token", "sequence"), aggregations)
    ):
        extra: dict[str, Any] = {}
        if k % 3 == 0:
            extra |= {"kl_bias_correction": True}
        if k % 4 == 1:
            extra |= {"kl_log_ratio_clamp": 0.3, "kl_clamp": 0.05, "seq_log_ratio_clamp": 0.1}
        if k % 2:
            extra |= {"skip_empty_rows": True, "length_epsilon": 0.5}
        if k % 5 == 2:
            extra |= {"max_completion_length": 11}
        out.append(
            grpo.LossConfig(
                **objective,
                importance_sampling_level=level,
                aggregation=aggregation,
                kl_estimator=kls[k % 3],
                beta=0.3,
                dtype="float64",
                **extra,
            )
        )
    return out


CONFIGS = _configs()


@pytest.mark.parametrize("k", range(len(CONFIGS)))
def test_vectorised_against_loop(k: int) -> None:
    config = CONFIGS[k]
    inputs = random_inputs(100 + k)
    lp = leaf(inputs.logp)
    expected = loop_evaluate(inputs, config, lp)
    (grad,) = torch.autograd.grad(expected.loss, lp)
    bd = grpo.evaluate(grpo.Batch(**inputs.batch_fields()), config)
    close(bd.loss, expected.loss.detach(), 1e-10, 1e-12)
    close(bd.tokens.grad, grad, 1e-10, 1e-12)
    close(bd.tokens.ratio, expected.ratio, 1e-10, 1e-12)
    close(bd.tokens.surrogate, expected.surrogate, 1e-10, 1e-12)
    close(bd.tokens.kl, expected.kl, 1e-10, 1e-12)
    close(bd.tokens.weight, expected.weight, 1e-12, 1e-14)
    close(bd.tokens.loss, expected.token_loss, 1e-10, 1e-12)
    assert bd.tokens.region_names() == expected.region


# --- metrics ------------------------------------------------------------------------------------------
def test_reward_metrics_by_hand() -> None:
    # rewards [1, 0, 3, 3] in groups of 2: means 0.5 and 3, unbiased stds √0.5 and 0;
    # reward = 7/4, reward_std = the mean of the group stds, one group of two has zero std.
    inputs = random_inputs(0, B=4, T=3, empty_rows=0, garbage=None)
    batch = grpo.Batch(
        **{**inputs.batch_fields(), "advantages": None, "rewards": [1.0, 0.0, 3.0, 3.0], "group_size": 2}
    )
    bd = evaluate64(batch, "trl-grpo")
    close(bd.metrics["reward"], 7 / 4)
    close(bd.metrics["reward_std"], math.sqrt(0.5) / 2)
    close(bd.metrics["frac_reward_zero_std"], 0.5)
    assert bd.zero_std_groups == (1,)
    assert bd.rows.group.tolist() == [0, 0, 1, 1]
    close(bd.rows.reward, [1.0, 0.0, 3.0, 3.0])
    close(bd.advantages[2:], [0.0, 0.0])
    assert any("Groups [1] have zero reward std" in w for w in bd.warnings)
    # batch scaling reports the batch std: values 1, 0, 3, 3 have mean 1.75 and unbiased std 1.5
    close(evaluate64(batch, "trl-grpo", advantage="batch").metrics["reward_std"], 1.5)


def test_entropy_metric_and_lengths() -> None:
    inputs = random_inputs(2, B=3, T=4, empty_rows=0, garbage=None)
    entropies = torch.tensor([[0.5, 1.0, 7.0, 7.0], [2.0, 2.0, 2.0, 2.0], [0.0, 3.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]])
    batch = grpo.Batch(**{**inputs.batch_fields(), "completion_mask": mask, "entropies": entropies})
    bd = evaluate64(batch, "trl-dapo")
    close(bd.metrics["entropy"], (0.5 + 1 + 8 + 3) / 8)  # the masked mean over the 8 counted tokens
    assert (bd.metrics["completions/min_length"], bd.metrics["completions/max_length"]) == (2, 4)
    close(bd.metrics["completions/mean_length"], 8 / 3)
    assert "entropy" not in evaluate64(grpo.Batch(**inputs.batch_fields()), "trl-dapo").metrics


def test_clip_metrics_are_zero_for_objectives_without_them(hand_batch: grpo.Batch) -> None:
    for objective in ("sapo", "gpg"):
        bd = evaluate64(hand_batch, "article", objective=objective)
        assert all(bd.metrics[k] == 0.0 for k in grpo.loss.objective_metrics())


def test_clamp_counts_by_hand(hand_batch: grpo.Batch) -> None:
    # delta 3 touches r = 4 (one token); log_ratio_clamp 1.0 touches |ln 4| = 1.39 (one token);
    # kl_log_ratio_clamp 0.5 touches |ln 2| twice; kl_clamp 0.2 touches k3 = 0.307 only (0.193 < 0.2).
    bd = evaluate64(hand_batch, "article", delta=3.0, log_ratio_clamp=1.0, kl_log_ratio_clamp=0.5, kl_clamp=0.2)
    counts = bd.clamp_counts
    assert counts["log_ratio_clamp"] == 1
    assert counts["kl_log_ratio_clamp"] == 2
    assert counts["kl_clamp"] == 0  # after the ±0.5 clamp: k3(0.5) = 0.149 and k3(-0.5) = 0.107
    assert counts["seq_log_ratio_clamp"] == 0 and counts["dual_clip"] == 0
    # with log_ratio_clamp 1.0 the ratio 4 became e = 2.718 < 3: delta touches nothing
    assert counts["delta"] == 0
    assert evaluate64(hand_batch, "article", delta=3.0).clamp_counts["delta"] == 1
    assert evaluate64(hand_batch, "verl-grpo").clamp_counts["dual_clip"] == 1
    assert all(v == 0 for v in evaluate64(hand_batch, "article").clamp_counts.values())


# --- defaults, warnings, on-policy -----------------------------------------------------------------
def test_on_policy_without_old_and_ref() -> None:
    """No old log-probs: ratio 1 with TRL's gradient (sg(ℓ)); no reference: KL 0, and both are said."""
    inputs = random_inputs(4, garbage=None)
    batch = grpo.Batch(per_token_logps=inputs.logp, completion_mask=inputs.mask, advantages=inputs.advantages)
    bd = evaluate64(batch, "article")
    close(bd.tokens.ratio, inputs.mask)
    close(bd.tokens.kl, torch.zeros_like(inputs.mask))
    assert bd.kl_loss == 0 and bd.metrics["clip_ratio/region_mean"] == 0
    # d loss / d logp = -w·A·1 on every counted token
    close(bd.tokens.grad, -bd.tokens.weight * inputs.advantages[:, None])
    assert any("on-policy" in w for w in bd.warnings) and any("KL is 0" in w for w in bd.warnings)
    assert any("ratio is 1 everywhere" in s for s in explain(bd))


def test_warnings(hand_batch: grpo.Batch) -> None:
    assert evaluate64(hand_batch, "article").warnings == ()
    assert any("delta < 1 + epsilon_high" in w for w in evaluate64(hand_batch, "article", delta=1.1).warnings)
    assert any("CISPO caps" in w for w in evaluate64(hand_batch, "trl-cispo", epsilon_high=0.2).warnings)
    inputs = random_inputs(0)  # one fully masked row
    empty = int((inputs.mask.sum(-1) == 0).nonzero()[0, 0])
    assert any(
        f"Rows [{empty}] have no counted tokens" in w for w in evaluate64(grpo.Batch(**inputs.batch_fields())).warnings
    )


def test_warns_when_the_reference_is_dropped_or_the_constant_is_off(hand_batch: grpo.Batch) -> None:
    dropped = "ref_per_token_logps given but beta = 0"
    assert any(dropped in w for w in evaluate64(hand_batch, "trl-grpo").warnings)
    assert not any(dropped in w for w in evaluate64(hand_batch, "trl-grpo", beta=0.04).warnings)
    # Dr. GRPO divides by max_completion_length: the hand batch's longest row has 3 tokens, so 512
    # (TRL's default) is far off; 2..6 (within 2x) is not.
    far = "max_completion_length = 512 is far from the longest counted row (3 tokens)"
    assert any(far in w for w in evaluate64(hand_batch, "trl-dr_grpo").warnings)
    for constant in (2, 6):
        warnings = evaluate64(hand_batch, "trl-dr_grpo", max_completion_length=constant).warnings
        assert not any("max_completion_length" in w for w in warnings)
    # a constant that no aggregation reads warns about nothing
    assert not any("max_completion_length" in w for w in evaluate64(hand_batch, "trl-grpo").warnings)


@pytest.mark.parametrize("preset", list(grpo.PRESETS))
def test_compute_loss_backpropagates_into_the_model(preset: str, inputs: Inputs) -> None:
    """compute_loss is evaluate's loss, and its gradient reaches what produced the log-probs.

    The "model" is logp = scale · base with a parameter ``scale`` (1 here): by the chain rule
    d loss / d scale = sum(d loss / d logp · base), d loss / d logp being evaluate's tokens.grad.
    """
    fields = inputs.batch_fields()
    base = leaf(inputs.logp).detach()
    scale = torch.ones((), dtype=torch.float64, requires_grad=True)
    config = grpo.LossConfig.from_preset(preset, dtype="float64", beta=0.05)
    batch = grpo.Batch(**{**fields, "per_token_logps": scale * base})
    loss = grpo.compute_loss(batch, config)
    loss.backward()
    bd = grpo.evaluate(batch, config)
    close(loss.detach(), bd.loss)
    assert scale.grad is not None
    close(scale.grad, (bd.tokens.grad * base).sum())
    assert loss.requires_grad and not bd.loss.requires_grad


def test_compute_loss_gradient_per_token_and_without_grad(hand_batch: grpo.Batch) -> None:
    logp = leaf(torch.tensor(hand_batch.logp.tolist(), dtype=torch.float64))
    fields = {f.name: getattr(hand_batch, f.name) for f in dataclasses.fields(hand_batch)}
    batch = grpo.Batch(**{**fields, "per_token_logps": logp})
    config = grpo.LossConfig.from_preset("article", dtype="float64")
    grpo.compute_loss(batch, config).backward()
    assert logp.grad is not None
    close(logp.grad, HAND_PRESETS["article"]["grad"])  # 0 at the masked position, too
    # log-probs that need no gradient give a plain scalar with the same value
    close(grpo.compute_loss(hand_batch, config), HAND_PRESETS["article"]["loss"])


def test_prompt_lengths_exclude_leading_positions(hand_batch: grpo.Batch) -> None:
    """A prompt of 1 token per row drops the first position: the same as masking it."""
    with_prompt = evaluate64(grpo.Batch(**{**_hand_fields(), "prompt_lengths": 1}), "verl-grpo")
    masked = evaluate64(grpo.Batch(**{**_hand_fields(), "completion_mask": [[0, 1, 0], [0, 1, 1]]}), "verl-grpo")
    close(with_prompt.loss, masked.loss)
    close(with_prompt.tokens.grad, masked.tokens.grad)
    per_row = evaluate64(grpo.Batch(**{**_hand_fields(), "prompt_lengths": [0, 2]}), "article")
    assert per_row.tokens.mask.tolist() == [[True, True, False], [False, False, True]]
    # Dr. GRPO without a constant divides by the completion width: T - min(prompt) = 3 - 1
    bd = evaluate64(
        grpo.Batch(**{**_hand_fields(), "prompt_lengths": [1, 2]}), "trl-dr_grpo", max_completion_length=None
    )
    close(bd.tokens.weight[1, 2], 1 / (2 * 2))


def _hand_fields() -> dict[str, Any]:
    from reference import HAND

    return dict(HAND)


@pytest.mark.parametrize("empty", [{"completion_mask": [[0, 0]]}, {"prompt_lengths": 2}], ids=["mask", "prompt"])
def test_all_masked_batch_is_zero_not_nan(empty: dict[str, Any]) -> None:
    """Nothing counts: loss 0 and gradient 0 under every preset, including Dr. GRPO without a
    constant, whose divisor (the completion width T - min(prompt)) is 0 when all is prompt."""
    batch = grpo.Batch(per_token_logps=[[-1.0, -2.0]], advantages=[1.0], **empty)
    for preset in grpo.PRESETS:
        for extra in ({}, {"max_completion_length": None}):
            bd = evaluate64(batch, preset, beta=0.1, **extra)
            assert float(bd.loss) == 0 and (bd.tokens.grad == 0).all(), (preset, extra)
            assert (bd.tokens.weight == 0).all()
            assert all(math.isfinite(v) for v in bd.metrics.values())


def test_evaluate_does_not_modify_its_inputs(inputs: Inputs) -> None:
    fields = inputs.batch_fields()
    copies = {k: v.clone() for k, v in fields.items()}
    batch = grpo.Batch(**fields)
    evaluate64(batch, "verl-grpo", beta=0.1)
    for k, v in fields.items():
        torch.testing.assert_close(v, copies[k], equal_nan=True, rtol=0, atol=0)
    assert not batch.logp.requires_grad


# --- dtype and device --------------------------------------------------------------------------------
@pytest.mark.parametrize("preset", list(grpo.PRESETS))
def test_float32_and_float64_agree(preset: str, inputs: Inputs) -> None:
    batch = grpo.Batch(**inputs.batch_fields())
    b32 = grpo.evaluate(batch, grpo.LossConfig.from_preset(preset, beta=0.05))
    b64 = grpo.evaluate(batch, grpo.LossConfig.from_preset(preset, beta=0.05, dtype="float64"))
    assert b32.loss.dtype == torch.float32 and b32.tokens.grad.dtype == torch.float32 and b32.dtype == "float32"
    close(b32.loss, b64.loss, rtol=1e-5, atol=1e-6)
    close(b32.tokens.grad, b64.tokens.grad, rtol=1e-5, atol=1e-6)
    assert b32.tokens.region.tolist() == b64.tokens.region.tolist()


def test_float32_input_computed_in_float64() -> None:
    inputs = random_inputs(1).to(torch.float32)
    bd = evaluate64(grpo.Batch(**inputs.batch_fields()), "article")
    assert bd.loss.dtype == torch.float64


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_cuda_without_gpu_is_an_input_error(hand_batch: grpo.Batch) -> None:
    with pytest.raises(grpo.GrpoInputError, match="device") as err:
        grpo.evaluate(hand_batch, grpo.LossConfig(device="cuda"))
    assert err.value.field == "device"
    bd = grpo.evaluate(hand_batch, grpo.LossConfig(device="auto"))
    assert bd.device == "cpu" and bd.loss.device.type == "cpu"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_matches_cpu(inputs: Inputs) -> None:
    batch = grpo.Batch(**inputs.batch_fields())
    cpu = evaluate64(batch, "verl-grpo", device="cpu", beta=0.1)
    gpu = evaluate64(batch, "verl-grpo", device="cuda", beta=0.1)
    assert gpu.device.startswith("cuda")
    for name in ("ratio", "loss", "grad", "weight", "region", "mask"):
        assert getattr(gpu.tokens, name).device.type == "cuda", name
    assert gpu.rows.loss.device.type == "cuda" and gpu.advantages.device.type == "cuda"
    # two kernel sets computing one formula: round-off of the terms that cancel (reference.term_scales)
    close_breakdown(gpu, inputs, cpu.loss, cpu.tokens.grad, {}, rtol=1e-10, floor=1e-12)
    # inputs already on the GPU stay there under "auto"
    on_gpu = grpo.Batch(**{k: v.cuda() for k, v in inputs.batch_fields().items()})
    assert evaluate64(on_gpu, "verl-grpo").loss.device.type == "cuda"


def test_clamp_symmetric_matches_torch_clamp_in_value_and_gradient() -> None:
    # Values on both sides of the bound and exactly on it (torch.clamp passes the gradient there).
    from grpo.loss import clamp_symmetric

    x = torch.tensor([-30.0, -20.0, -5.0, 0.0, 20.0, 25.0], dtype=torch.float64, requires_grad=True)
    weights = torch.arange(1.0, 7.0, dtype=torch.float64)
    ours, outside = clamp_symmetric(x, 20.0)
    (g_ours,) = torch.autograd.grad((ours * weights).sum(), x)
    x2 = x.detach().clone().requires_grad_(True)
    theirs = x2.clamp(-20.0, 20.0)
    (g_theirs,) = torch.autograd.grad((theirs * weights).sum(), x2)
    torch.testing.assert_close(ours, theirs.detach(), rtol=0, atol=0)
    torch.testing.assert_close(g_ours, g_theirs, rtol=0, atol=0)
    assert outside.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]


def test_clip_cov_cut_tokens_are_not_counted_as_dual_clip() -> None:
    # Clip-Cov's cut tokens carry the fifth region code (the one the clip objective gives the dual clip), and
    # Clip-Cov ignores dual_clip as verl's clip_cov does: with dual_clip set, the count of tokens the dual clip
    # bounded must stay 0 while the cut tokens are there (clip_cov_lb/ub wide: every unclipped token is a
    # candidate; clip_cov_ratio 0.5 cuts half the counted tokens, at least one).
    g = torch.Generator().manual_seed(3)
    logp = -torch.rand(4, 8, generator=g, dtype=torch.float64)
    batch = grpo.Batch(
        per_token_logps=logp,
        old_per_token_logps=logp + 0.01 * torch.randn(4, 8, generator=g, dtype=torch.float64),
        completion_mask=torch.ones(4, 8),
        advantages=torch.tensor([1.0, -1.0, 0.5, -2.0], dtype=torch.float64),
    )
    settings = {"clip_cov_ratio": 0.5, "clip_cov_lb": -100.0, "clip_cov_ub": 100.0}
    bd = evaluate64(batch, "verl-clip_cov", dual_clip=3.0, **settings)
    dual = grpo.objectives.REGIONS.index("dual_clip")
    assert int((bd.tokens.region == dual).sum()) == int(bd.tokens.selected.sum()) == 16
    assert bd.clamp_counts["dual_clip"] == 0  # (the clip objective's count: test_clamp_counts_by_hand)
