"""The clip's softer alternatives, none of which silences a token: CISPO's capped detached weight, SAPO's smooth
gate, and GPG's plain REINFORCE with no bound at all.
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpo.marks import mark
from grpo.registry import Setting, Why
from grpo.surrogates.base import (
    OBJECTIVES,
    PER_UNIT_A,
    WEIGHT_ON_A_LOGP,
    ObjectiveInputs,
    ObjectiveSettings,
    ObjectiveTerms,
    zero_outside,
)
from grpo.surrogates.regions import MASKED_WHY, above, below, regions

# SAPO's gate temperatures: TRL 1.16 GRPOConfig's defaults (verl 0.9.1's actor tau_pos / tau_neg agree).
SAPO_TEMPERATURE_POS = 1.0
SAPO_TEMPERATURE_NEG = 1.05

CISPO_SETTINGS = (
    Setting(
        "cispo_bounds",
        "absolute",
        "CISPO weight bounds: absolute = min(ratio, epsilon_high) (TRL); relative = "
        "clamp(ratio, 1 - epsilon_low, 1 + epsilon_high) (verl).",
        str,
        choices=("absolute", "relative"),
    ),
)
SAPO_SETTINGS = (
    Setting(
        "sapo_temperature_pos",
        SAPO_TEMPERATURE_POS,
        "SAPO gate temperature for A > 0.",
        gt=0.0,
        trl="sapo_temperature_pos",
        verl="tau_pos",
    ),
    Setting(
        "sapo_temperature_neg",
        SAPO_TEMPERATURE_NEG,
        "SAPO gate temperature for A <= 0.",
        gt=0.0,
        trl="sapo_temperature_neg",
        verl="tau_neg",
    ),
)


def cispo_warnings(config: ObjectiveSettings, longest_row: int) -> list[str]:
    if config.cispo_bounds == "absolute" and config.epsilon_high < 1:
        return [
            f"CISPO caps the weight at epsilon_high = {mark('config/epsilon_high', config.epsilon_high)} (absolute), "
            f"scaling every token down; TRL's docs recommend {mark('lens/trl/cispo_epsilon_high', 5.0)}."
        ]
    return []


def cispo_why_values(config: ObjectiveSettings) -> dict[str, float | None]:
    absolute = config.cispo_bounds == "absolute"
    return {
        "floor": None if absolute else 1 - config.epsilon_low,
        "cap": config.epsilon_high if absolute else 1 + config.epsilon_high,
    }


CISPO_WHY = Why(
    names=("masked", "trust", "capped_low", "capped_high"),
    codes=lambda ratio, advantages, region, config: region.long().clamp(max=3),
    texts={
        "masked": MASKED_WHY,
        "trust": "weight = ratio, inside its bounds [{floor}, {cap}]: the token's term is ratio·A·logp",
        "capped_low": "weight held at the floor {floor} (ratio below it); CISPO keeps the token's gradient",
        "capped_high": "weight capped at {cap} (ratio above it); CISPO keeps the token's gradient",
    },
    values=cispo_why_values,
)


@OBJECTIVES.register(
    "cispo",
    label="CISPO",
    axis=WEIGHT_ON_A_LOGP,
    metrics={"cispo_clip_ratio": "trl", "actor/pg_clipfrac": "tokens"},
    warnings=cispo_warnings,
    why=CISPO_WHY,
    settings=CISPO_SETTINGS,
)
def cispo(
    ratio: Tensor, logp: Tensor, advantages: Tensor, config: ObjectiveSettings, inputs: ObjectiveInputs | None = None
) -> ObjectiveTerms:
    """CISPO: a detached, clipped ratio times A times logp, so clipped tokens keep their gradient.

    Unlike PPO's clip, the bound only scales the REINFORCE term sg(w)·A·logp; no token is
    silenced. ``cispo_bounds="absolute"`` is TRL's w = min(r, epsilon_high) (docs: 5.0);
    ``"relative"`` is verl's w = clamp(r, 1 - epsilon_low, 1 + epsilon_high).
    Paper: https://arxiv.org/abs/2506.13585
    """
    r = ratio.detach()
    if config.cispo_bounds == "absolute":
        low, high = float("-inf"), config.epsilon_high
    else:
        low, high = 1 - config.epsilon_low, 1 + config.epsilon_high
    weight = r.clamp(min=low, max=high)
    surrogate = weight * advantages * logp
    clip_high = above(r, high)
    clip_low = None if low == float("-inf") else below(r, low)  # TRL's absolute cap has no floor
    over = clip_high if high == config.epsilon_high else above(r, config.epsilon_high)
    flags = {
        "cispo_clip_ratio": over * above(advantages, 0.0),
        "actor/pg_clipfrac": clip_high if clip_low is None else clip_low + clip_high,  # verl: ratio != clip(ratio)
    }
    region = regions(surrogate.detach(), clip_low, clip_high)
    return ObjectiveTerms(surrogate, weight, region, flags, zero_outside=zero_outside(inputs))


@OBJECTIVES.register("sapo", label="SAPO", axis=PER_UNIT_A, settings=SAPO_SETTINGS)
def sapo(
    ratio: Tensor, logp: Tensor, advantages: Tensor, config: ObjectiveSettings, inputs: ObjectiveInputs | None = None
) -> ObjectiveTerms:
    """SAPO: a soft sigmoid gate (4/τ)·σ(τ(r - 1)) replaces the hard clip; no token goes flat.

    τ is ``sapo_temperature_pos`` for A > 0 and ``sapo_temperature_neg`` otherwise. The gate's
    slope at r = 1 is 1, so on-policy SAPO has GRPO's gradient; far from 1 it decays smoothly.
    Paper: https://arxiv.org/abs/2511.20347
    """
    pos, neg = (advantages.new_tensor(t) for t in (config.sapo_temperature_pos, config.sapo_temperature_neg))
    tau = torch.where(advantages > 0, pos, neg)
    gate = torch.sigmoid(tau * (ratio - 1)) * 4 / tau
    surrogate = gate * advantages
    return ObjectiveTerms(surrogate, gate.detach(), regions(surrogate.detach()))


@OBJECTIVES.register("gpg", label="GPG", axis=WEIGHT_ON_A_LOGP)
def gpg(
    ratio: Tensor, logp: Tensor, advantages: Tensor, config: ObjectiveSettings, inputs: ObjectiveInputs | None = None
) -> ObjectiveTerms:
    """GPG: plain REINFORCE A·logp, with no ratio, no clip and no old policy.

    verl ``loss_mode="gpg"``. The value depends on logp itself, so only its gradient, -A per
    token, is comparable with the ratio-based objectives.
    Paper: https://arxiv.org/abs/2504.02546
    """
    surrogate = advantages * logp
    clipped = ratio.detach().expand_as(surrogate)
    return ObjectiveTerms(surrogate, clipped, regions(surrogate.detach()), zero_outside=zero_outside(inputs))
