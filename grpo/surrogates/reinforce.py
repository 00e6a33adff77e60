"""Objectives in REINFORCE's form A·logp, with a detached weight or a penalty instead of a clip: DPPO's
divergence trust region, DRO's quadratic pull back to the old policy, VESPO's gamma weight of the row's ratio.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from grpo.errors import GrpoInputError
from grpo.registry import Reduction, Setting, Why
from grpo.surrogates.base import (
    OBJECTIVES,
    WEIGHT_ON_A_LOGP,
    Objective,
    ObjectiveInputs,
    ObjectiveSettings,
    ObjectiveTerms,
    given_inputs,
    zero_outside,
)
from grpo.surrogates.regions import MASKED_WHY, TRUST, above, regions

# VESPO's gamma weights: TRL 1.16 GRPOConfig's defaults.
VESPO_K_POS = 2.0
VESPO_LAMBDA_POS = 3.0
VESPO_K_NEG = 3.0
VESPO_LAMBDA_NEG = 2.0
VESPO_LOG_W_MIN = math.log(1e-8)  # TRL's lower clamp of the sequence log-weight
VESPO_LOG_CLAMP = 20.0  # TRL's bound on each token's log-ratio (±) and the sequence log-weight's upper clamp


def vespo_settings(side: str, advantages: str, k: float, lam: float) -> tuple[Setting, Setting]:
    """The gamma weight's shape k and rate lambda for one side of the advantages (``side`` pos or neg), TRL's names."""
    return (
        Setting(
            f"vespo_k_{side}",
            k,
            f"TRL vespo: the gamma weight's shape k for A {advantages}.",
            ge=0.0,
            trl=f"vespo_k_{side}",
        ),
        Setting(
            f"vespo_lambda_{side}",
            lam,
            f"TRL vespo: the gamma weight's rate lambda for A {advantages} (TRL clamps it to at least 1e-4).",
            trl=f"vespo_lambda_{side}",
        ),
    )


VESPO_SETTINGS = (
    *vespo_settings("pos", ">= 0", VESPO_K_POS, VESPO_LAMBDA_POS),
    *vespo_settings("neg", "< 0", VESPO_K_NEG, VESPO_LAMBDA_NEG),
)
DRO_SETTINGS = (
    Setting(
        "dro_beta",
        None,
        "verl dro: the quadratic log-ratio penalty ½·dro_beta·(logp - old)²; required by dro.",
        nullable=True,
        gt=0.0,
        verl="policy_loss.dro_beta",
    ),
)


def dppo_why_values(config: ObjectiveSettings) -> dict[str, float | None]:
    return {"low": config.epsilon_low, "high": config.epsilon_high, "c": config.dual_clip}


def dppo_why_codes(ratio: Tensor, advantages: Tensor, region: Tensor, config: ObjectiveSettings) -> Tensor:
    """Region codes, plus "truncated" (4) for a trust-region token whose ratio passed c: it keeps its gradient,
    so it has no region of its own."""
    code = region.long()
    if config.dual_clip is None:
        return code
    return torch.where((code == TRUST) & (ratio > config.dual_clip), torch.full_like(code, 4), code)


def dppo_why(divergence: str) -> Why:
    return Why(
        names=("masked", "trust", "blocked_low", "blocked_high", "truncated"),
        codes=dppo_why_codes,
        texts={
            "masked": MASKED_WHY,
            "trust": f"inside the {divergence} trust region: its term is sg(min(ratio, c))·A·logp (c = {{c}}), so it "
            "gets a policy gradient",
            "blocked_low": f"A ≤ 0 and the policy moved its probability down by a {divergence} above ε_low = {{low}}: "
            "its term is 0, no policy gradient",
            "blocked_high": f"A > 0 and the policy moved its probability up by a {divergence} above ε_high = {{high}}: "
            "its term is 0, no policy gradient",
            "truncated": "inside the trust region with ratio above c = {c}: its weight is truncated at c (truncated "
            "importance sampling); it keeps its policy gradient",
        },
        values=dppo_why_values,
        no_gradient=frozenset({"blocked_low", "blocked_high"}),
    )


def dppo_terms(
    ratio: Tensor,
    logp: Tensor,
    advantages: Tensor,
    config: ObjectiveSettings,
    valid_pos: Tensor,
    valid_neg: Tensor,
    inputs: ObjectiveInputs | None,
) -> ObjectiveTerms:
    """DPPO's term given the trust-region masks: sg(min(r, c))·A·logp where the token's divergence is inside."""
    r = ratio.detach()
    weight = r if config.dual_clip is None else r.clamp(max=config.dual_clip)  # truncated IS, detached
    positive = above(advantages, 0.0)  # (B, 1); verl takes the negative side's mask for A <= 0
    valid = (positive * valid_pos + (1 - positive) * valid_neg).to(r.dtype)
    surrogate = advantages * weight * logp * valid
    truncated = torch.zeros_like(r) if config.dual_clip is None else above(r, config.dual_clip) * valid
    blocked = 1 - valid
    flags = {"actor/pg_clipfrac": blocked, "actor/pg_clipfrac_lower": truncated}
    region = regions(surrogate.detach(), blocked * (1 - positive), blocked * positive)  # truncated: see its why
    return ObjectiveTerms(surrogate, weight, region, flags, zero_outside=zero_outside(inputs))


DPPO_METRICS: dict[str, Reduction] = {"actor/pg_clipfrac": "tokens", "actor/pg_clipfrac_lower": "tokens"}
DPPO_FLAT = "outside the divergence trust region: the token's term is 0, so it gets no policy gradient"


def register_dppo(name: str, label: str, divergence: str) -> Callable[[Objective], Objective]:
    """A DPPO variant's registry entry: the two differ only in the divergence their trust region bounds."""
    why = dppo_why(divergence)
    return OBJECTIVES.register(name, label=label, axis=WEIGHT_ON_A_LOGP, flat=DPPO_FLAT, metrics=DPPO_METRICS, why=why)


@register_dppo("dppo_tv", "DPPO (binary TV)", "probability change")
def dppo_tv(
    ratio: Tensor, logp: Tensor, advantages: Tensor, config: ObjectiveSettings, inputs: ObjectiveInputs | None = None
) -> ObjectiveTerms:
    """DPPO-TV: sg(min(r, c))·A·logp, kept only where p − p_old stays within the TV thresholds.

    verl ``loss_mode="dppo_tv"`` reads clip_ratio(_low/_high) as total-variation thresholds, not ratio
    bounds: an A > 0 token counts while p − p_old ≤ ε_high, an A ≤ 0 token while p − p_old ≥ −ε_low;
    clip_ratio_c (dual_clip here) truncates the detached ratio. The log-ratio is clamped to ±20.
    Paper: https://arxiv.org/abs/2602.04879
    """
    old = given_inputs(ratio, logp, inputs).old
    moved = logp.detach().exp() - old.exp()  # p - p_old
    valid_pos = (moved <= config.epsilon_high).to(logp.dtype)
    valid_neg = (moved >= -config.epsilon_low).to(logp.dtype)
    return dppo_terms(ratio, logp, advantages, config, valid_pos, valid_neg, inputs)


@register_dppo("dppo_kl", "DPPO (binary KL)", "binary KL")
def dppo_kl(
    ratio: Tensor, logp: Tensor, advantages: Tensor, config: ObjectiveSettings, inputs: ObjectiveInputs | None = None
) -> ObjectiveTerms:
    """DPPO-KL: sg(min(r, c))·A·logp, kept only where the binary KL of (p_old, p) stays within thresholds.

    verl ``loss_mode="dppo_kl"``: D = p_old·(log p_old − log p) + (1 − p_old)·log((1 − p_old + 1e-8) /
    (1 − p + 1e-8)); an A > 0 token counts while D ≤ ε_high or p ≤ p_old, an A ≤ 0 token while D ≤ ε_low
    or p ≥ p_old. clip_ratio_c (dual_clip here) truncates the detached ratio; log-ratio clamped to ±20.
    Paper: https://arxiv.org/abs/2602.04879
    """
    old = given_inputs(ratio, logp, inputs).old
    lp = logp.detach()
    p, p_old = lp.exp(), old.exp()
    divergence = p_old * (old - lp) + (1 - p_old) * torch.log((1.0 - p_old + 1e-8) / (1.0 - p + 1e-8))
    valid_pos = ((divergence <= config.epsilon_high) | (p <= p_old)).to(lp.dtype)
    valid_neg = ((divergence <= config.epsilon_low) | (p >= p_old)).to(lp.dtype)
    return dppo_terms(ratio, logp, advantages, config, valid_pos, valid_neg, inputs)


def dro_warnings(config: ObjectiveSettings, longest_row: int) -> list[str]:
    return [] if config.dro_beta is not None else ["dro needs dro_beta (verl raises ValueError without it)."]


@OBJECTIVES.register("dro", label="DRO", axis=WEIGHT_ON_A_LOGP, warnings=dro_warnings, settings=DRO_SETTINGS)
def dro(
    ratio: Tensor, logp: Tensor, advantages: Tensor, config: ObjectiveSettings, inputs: ObjectiveInputs | None = None
) -> ObjectiveTerms:
    """DRO: A·logp − ½·dro_beta·(logp − old)², REINFORCE with a quadratic pull back to the old policy.

    verl ``loss_mode="dro"`` (Direct Reward Optimization); no ratio, no clip, no log-ratio clamp.
    verl raises without ``dro_beta``; here the objective does too.
    Paper: https://arxiv.org/abs/2405.19107
    """
    if config.dro_beta is None:
        raise GrpoInputError("dro_beta", "a positive number: DRO's quadratic log-ratio penalty (verl requires it)")
    x = given_inputs(ratio, logp, inputs).log_ratio
    surrogate = advantages * logp - 0.5 * config.dro_beta * x.square()
    clipped = ratio.detach().expand_as(surrogate)
    return ObjectiveTerms(surrogate, clipped, regions(surrogate.detach()), zero_outside=zero_outside(inputs))


@OBJECTIVES.register(
    "vespo",
    label="VESPO (gamma weights)",
    axis=WEIGHT_ON_A_LOGP,
    metrics={"vespo/phi_seq_mean": "trl"},
    settings=VESPO_SETTINGS,
)
def vespo(
    ratio: Tensor, logp: Tensor, advantages: Tensor, config: ObjectiveSettings, inputs: ObjectiveInputs | None = None
) -> ObjectiveTerms:
    """VESPO: sg(φ(w))·A·logp with the gamma weight φ(w) = e^λ·w^k·e^(−λw) of the row's ratio w (φ(1) = 1).

    TRL ``loss_type="vespo"``: log w = clamp(Σ_t clamp(log r_t, ±20), log 1e-8, 20), a sum over the row's
    tokens, not a mean; (k, λ) = (vespo_k_pos, vespo_lambda_pos) for A ≥ 0, else the _neg pair, λ at least
    1e-4; φ's NaN and ±inf become 0. φ is detached: it only scales the REINFORCE gradient. Rows far from
    on-policy (w ≫ 1 or w ≪ 1) are damped smoothly instead of clipped.
    Paper: https://huggingface.co/papers/2602.10693
    """
    given = given_inputs(ratio, logp, inputs)
    x = given.log_ratio.detach().clamp(-VESPO_LOG_CLAMP, VESPO_LOG_CLAMP)
    log_w = given.counted_log_ratio(x).sum(-1, keepdim=True).clamp(VESPO_LOG_W_MIN, VESPO_LOG_CLAMP)  # (B, T) -> (B, 1)
    nonneg = advantages >= 0
    k = torch.where(nonneg, config.vespo_k_pos, config.vespo_k_neg)
    lam = torch.where(nonneg, config.vespo_lambda_pos, config.vespo_lambda_neg).clamp(min=1e-4)
    phi = torch.exp(lam + k * log_w - lam * log_w.exp()).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)  # (B, 1)
    surrogate = phi * advantages * logp
    flags = {"vespo/phi_seq_mean": phi}
    zero = zero_outside(inputs)
    return ObjectiveTerms(surrogate, phi.expand_as(surrogate), regions(surrogate.detach()), flags, zero_outside=zero)
