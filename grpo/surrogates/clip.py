"""PPO's clipped surrogate, as GRPO, DAPO (clip-higher), TRL (delta) and verl (dual clip) compute it.

Paper: https://arxiv.org/abs/1707.06347
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from grpo.registry import Reduction, Why
from grpo.surrogates.base import OBJECTIVES, PER_UNIT_A, ObjectiveInputs, ObjectiveSettings, ObjectiveTerms
from grpo.surrogates.regions import DUAL_CLIP, MASKED_WHY, TRUST, above, below, regions

# TRL's clip metrics reduce as TRL does; verl's actor/* always over the counted tokens.
CLIP_FAMILY_METRICS: dict[str, Reduction] = {
    "clip_ratio/low_mean": "trl",
    "clip_ratio/low_min": "trl",
    "clip_ratio/high_mean": "trl",
    "clip_ratio/high_max": "trl",
    "clip_ratio/region_mean": "trl",
    "actor/pg_clipfrac": "tokens",
    "actor/pg_clipfrac_lower": "tokens",
}


def clipped_surrogate(ratio: Tensor, advantages: Tensor, config: ObjectiveSettings) -> Tensor:
    """The clipped surrogate as the papers write it (PPO eq. 7; CleanRL's ppo.py), for autograd.

    The reference form: the ratio, the two candidates, their minimum; then TRL's delta (a cap on
    the unclipped candidate's ratio) and verl's dual clip (for A < 0, the objective is at least
    c·A). ``clip`` below is its fast path, with the same value and gradient (tests hold them equal).
    """
    ratio_capped = ratio if config.delta is None else ratio.clamp(max=config.delta)
    ratio_clipped = ratio.clamp(1 - config.epsilon_low, 1 + config.epsilon_high)
    surrogate = torch.minimum(ratio_capped * advantages, ratio_clipped * advantages)
    if config.dual_clip is not None:
        surrogate = torch.where(advantages < 0, torch.maximum(surrogate, config.dual_clip * advantages), surrogate)
    return surrogate


def clip_warnings(config: ObjectiveSettings, longest_row: int) -> list[str]:
    if config.delta is not None and config.delta < 1 + config.epsilon_high:
        return ["delta < 1 + epsilon_high: TRL recommends delta > 1 + epsilon_high."]
    return []


CLIP_WHY_NAMES = ("masked", "trust", "clip_low", "clip_high", "dual_clip", "delta", "unbounded")


def clip_why_codes(ratio: Tensor, advantages: Tensor, region: Tensor, config: ObjectiveSettings) -> Tensor:
    """Which bound acted on each token of the clipped surrogate, as indices into CLIP_WHY_NAMES.

    The region's dual_clip code covers both caps on A < 0 tokens: the dual clip where its bound c was
    passed, else TRL's delta. A trust-region token with A < 0 above 1 + ε_high keeps A·ratio (the
    pessimistic candidate): with neither cap set nothing bounds it, so it is ``unbounded``.
    """
    code = region.long()  # masked, trust, clip_low, clip_high, dual_clip: the first five names, in order
    if config.delta is not None and config.dual_clip is not None:  # both caps: the dual clip where it acted
        capped = torch.maximum(
            ratio.clamp(max=config.delta), ratio.clamp(1 - config.epsilon_low, 1 + config.epsilon_high)
        )
        by_delta = (code == DUAL_CLIP) & (capped <= config.dual_clip)
        code = torch.where(by_delta, torch.full_like(code, 5), code)
    elif config.delta is not None:
        code = torch.where(code == DUAL_CLIP, torch.full_like(code, 5), code)
    if config.delta is None and config.dual_clip is None:
        free = (code == TRUST) & (advantages < 0) & (ratio > 1 + config.epsilon_high)
        code = torch.where(free, torch.full_like(code, 6), code)
    return code


def ratio_bounds(config: ObjectiveSettings) -> dict[str, float | None]:
    """The clip's bounds on the ratio, as a why's texts name them: {low} = 1 - ε_low, {high} = 1 + ε_high."""
    return {"low": 1 - config.epsilon_low, "high": 1 + config.epsilon_high}


def clip_why_values(config: ObjectiveSettings) -> dict[str, float | None]:
    return ratio_bounds(config) | {"c": config.dual_clip, "delta": config.delta}


CLIP_WHY = Why(
    names=CLIP_WHY_NAMES,
    codes=clip_why_codes,
    texts={
        "masked": MASKED_WHY,
        "trust": "unclipped: the surrogate is A·ratio, the ratio used as is (inside [1 − ε_low, 1 + ε_high] = "
        "[{low}, {high}], or moved against its advantage), so the token gets a policy gradient",
        "clip_low": "clipped low: A < 0 and ratio below 1 − ε_low = {low}, so the surrogate is the clipped "
        "{low}·A, flat in the ratio: no policy gradient",
        "clip_high": "clipped high: A > 0 and ratio above 1 + ε_high = {high}, so the surrogate is the clipped "
        "{high}·A, flat in the ratio: no policy gradient",
        "dual_clip": "dual clip: A < 0 and ratio past the bound dual_clip = {c}, so the surrogate is held at "
        "{c}·A, flat in the ratio: no policy gradient",
        "delta": "delta: A < 0 and ratio above delta = {delta}, TRL's cap on the ratio, so the surrogate is "
        "{delta}·A, flat in the ratio: no policy gradient",
        "unbounded": "unbounded: A < 0 and ratio above 1 + ε_high = {high}; the pessimistic min keeps A·ratio, "
        "no clip bound acts, and the token's loss and gradient grow with its ratio (dual_clip = {c}, "
        "delta = {delta}: setting either bounds it)",
    },
    values=clip_why_values,
    no_gradient=frozenset({"clip_low", "clip_high", "dual_clip", "delta"}),
    labels={"dual_clip": "held by the dual clip", "delta": "capped by delta"},
)


@OBJECTIVES.register(
    "clip",
    label="PPO clip",
    axis=PER_UNIT_A,
    metrics=CLIP_FAMILY_METRICS,
    warnings=clip_warnings,
    why=CLIP_WHY,
    flat="clipped: the chosen candidate is flat in the ratio, so the token gets no policy gradient",
)
def clip(
    ratio: Tensor, logp: Tensor, advantages: Tensor, config: ObjectiveSettings, inputs: ObjectiveInputs | None = None
) -> ObjectiveTerms:
    """PPO/GRPO clipped surrogate min(r·A, clip(r, 1-ε_low, 1+ε_high)·A), with dual clip and delta.

    ``epsilon_high > epsilon_low`` is DAPO's clip-higher. ``dual_clip`` c (verl ``clip_ratio_c``,
    Ye et al. 2019) bounds the loss of A < 0 tokens at -c·A. ``delta`` (TRL, INTELLECT-2) caps the
    unclipped ratio at delta; for A < 0 and delta >= 1 + ε_high it equals a dual clip at delta.
    Tokens in a flat region get no policy gradient.
    Paper: https://arxiv.org/abs/1707.06347
    """
    # The fast path of clipped_surrogate: the value on the detached ratio, then the gradient
    # autograd would take, added as float arithmetic (CPU autograd of min/clamp runs slow bool
    # kernels: 7x the whole rest of the pass). Tests hold value and gradient equal to the reference.
    A, low, high = advantages, 1 - config.epsilon_low, 1 + config.epsilon_high
    r = ratio.detach()
    capped = r if config.delta is None else r.clamp(max=config.delta)  # TRL caps only this one
    clipped = r.clamp(low, high)
    value = torch.minimum(capped * A, clipped * A)  # the pessimistic of the two candidates
    if config.dual_clip is not None:  # verl: loss = min(-c·A, max(L1, L2)) when A < 0
        floor = torch.where(A < 0, config.dual_clip * A, float("-inf"))  # (B, 1): no floor for A >= 0
        value = torch.maximum(value, floor)

    # Where the chosen candidate is flat in r (delta and dual_clip are > 1 > 1 - ε_low):
    positive, negative = above(A, 0.0), below(A, 0.0)  # (B, 1)
    clip_low = below(r, low) * negative  # A < 0 and r fell below 1 - ε_low
    cap_high = high if config.delta is None else min(high, config.delta)
    clip_high = above(r, cap_high) * positive  # A > 0 and r rose above 1 + ε_high (or delta)
    dual = torch.zeros_like(A)  # A < 0 and r capped from above: by delta, or by the dual clip
    if config.delta is not None:
        dual = above(r, max(high, config.delta)) * negative
    dual_clip_flag = None
    if config.dual_clip is not None:
        dual_clip_flag = above(torch.maximum(capped, clipped), config.dual_clip) * negative
        dual = torch.maximum(dual, dual_clip_flag)
    flat = clip_low + clip_high + dual  # disjoint

    # The gradient autograd takes through min and clamp: A·dr on the trust region, 0 where flat.
    step = ratio - r  # 0, carrying d ratio
    if not math.isfinite(float(r.max())):  # an overflowed ratio: inf - inf is NaN, and the value is not
        step = step.nan_to_num(0.0)
    surrogate = value + step * (A * (1 - flat))

    high_flag = clip_high if config.delta is None else above(capped, high) * positive
    either = clip_low + high_flag
    flags = {
        "clip_ratio/low_mean": clip_low,  # TRL: r < 1 - ε_low and A < 0
        "clip_ratio/high_mean": high_flag,  # TRL: min(r, delta) > 1 + ε_high and A > 0
        # TRL logs the min (max) over sequences of each sequence's fraction (reduced per row in loss._metrics)
        "clip_ratio/low_min": clip_low,
        "clip_ratio/high_max": high_flag,
        "clip_ratio/region_mean": either,
        "actor/pg_clipfrac": either if config.delta is None else clip_low + above(r, high) * positive,
    }
    if dual_clip_flag is not None:
        flags["actor/pg_clipfrac_lower"] = dual_clip_flag  # verl: the dual-clip fraction
    region = regions(r.expand_as(value), clip_low, clip_high, dual if config.delta or config.dual_clip else None)
    return ObjectiveTerms(surrogate, clipped, region, flags)
