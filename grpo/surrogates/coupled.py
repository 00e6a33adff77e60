"""verl 0.9.1's policy losses whose token terms read beyond their own token (core_algos.register_policy_loss):
GMPO's geometric mean over the row, and Clip-Cov's and KL-Cov's covariance over the micro-batch.
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpo.registry import Setting, Why
from grpo.surrogates.base import (
    OBJECTIVES,
    PER_UNIT_A,
    ObjectiveInputs,
    ObjectiveSettings,
    ObjectiveTerms,
    given_inputs,
)
from grpo.surrogates.clip import ratio_bounds
from grpo.surrogates.regions import MASKED_WHY, TRUST, above, below, regions

# The covariance variants' defaults: verl 0.9.1 PolicyLossConfig's.
CLIP_COV_RATIO = 0.0002
CLIP_COV_LB = 1.0
CLIP_COV_UB = 5.0
KL_COV_RATIO = 0.0002
PPO_KL_COEF = 0.1

CLIP_COV_SETTINGS = (
    Setting(
        "clip_cov_ratio",
        CLIP_COV_RATIO,
        "verl clip_cov: the share of counted tokens whose gradient is cut (at least one).",
        gt=0.0,
        le=1.0,
        verl="policy_loss.clip_cov_ratio",
    ),
    Setting(
        "clip_cov_lb",
        CLIP_COV_LB,
        "verl clip_cov: candidates have covariance above this.",
        verl="policy_loss.clip_cov_lb",
    ),
    Setting(
        "clip_cov_ub",
        CLIP_COV_UB,
        "verl clip_cov: candidates have covariance below this.",
        verl="policy_loss.clip_cov_ub",
    ),
    Setting(
        "clip_cov_seed",
        0,
        "verl clip_cov draws its tokens with torch.randperm: the seed of that draw (verl's process RNG state).",
        int,
        ge=0,
    ),
)
KL_COV_SETTINGS = (
    Setting(
        "kl_cov_ratio",
        KL_COV_RATIO,
        "verl kl_cov: the share of counted tokens (the highest covariance, at least one) that get the |log-ratio| "
        "penalty.",
        gt=0.0,
        le=1.0,
        verl="policy_loss.kl_cov_ratio",
    ),
    Setting(
        "ppo_kl_coef",
        PPO_KL_COEF,
        "verl kl_cov: the coefficient of the |log-ratio| penalty.",
        ge=0.0,
        verl="policy_loss.ppo_kl_coef",
    ),
)


def masked_mean_verl(x: Tensor, mask: Tensor) -> Tensor:
    """verl_F.masked_mean: sum(x · mask) / (sum(mask) + 1e-8), the 1e-8 as verl adds it."""
    return (x * mask).sum() / (mask.sum() + 1e-8)


def geo_mean_why_codes(ratio: Tensor, advantages: Tensor, region: Tensor, config: ObjectiveSettings) -> Tensor:
    """GEO_MEAN_WHY's codes: the regions, and ``unbounded`` (4) for a trust-region token with A < 0 whose log-ratio
    is above ε_high: the pessimistic side keeps it as it is, so the row's geometric mean grows with its ratio."""
    code = region.long().clamp(max=3)
    free = (code == TRUST) & (advantages < 0) & (ratio.log() > config.epsilon_high)
    return torch.where(free, torch.full_like(code, 4), code)


GEO_MEAN_WHY = Why(
    names=("masked", "trust", "clip_low", "clip_high", "unbounded"),
    codes=geo_mean_why_codes,
    texts={
        "masked": MASKED_WHY,
        "trust": "its log-ratio enters the row's geometric mean as it is (inside [−ε_low, ε_high] = [-{low}, {high}], "
        "or moved against its advantage), so it gets a policy gradient through the row's ratio",
        "clip_low": "clipped low: A < 0 and log-ratio below −ε_low = -{low}: it enters the row's geometric mean as "
        "-{low}, flat: no policy gradient",
        "clip_high": "clipped high: A > 0 and log-ratio above ε_high = {high}: it enters the row's geometric mean as "
        "{high}, flat: no policy gradient",
        "unbounded": "unbounded: A < 0 and log-ratio above ε_high = {high}; the pessimistic side keeps it as it is, "
        "no clip bound acts, and the row's geometric-mean ratio, its loss and its gradient grow with this ratio",
    },
    values=lambda config: {"low": config.epsilon_low, "high": config.epsilon_high},
    no_gradient=frozenset({"clip_low", "clip_high"}),
)


@OBJECTIVES.register(
    "geo_mean",
    label="GMPO (geometric mean)",
    axis=PER_UNIT_A,
    flat="clipped: the token's log-ratio enters the row's geometric mean at its bound, so it gets no policy gradient",
    metrics={"actor/pg_clipfrac": "tokens", "actor/pg_clipfrac_lower": "tokens"},
    why=GEO_MEAN_WHY,
)
def geo_mean(
    ratio: Tensor, logp: Tensor, advantages: Tensor, config: ObjectiveSettings, inputs: ObjectiveInputs | None = None
) -> ObjectiveTerms:
    """GMPO: J_i = Ā_i · exp(mean_t clip_A(log r_t)), one term per row, averaged over the rows.

    verl ``loss_mode="geo_mean"``: each token's log-ratio is clipped to [-ε_low, ε_high] on the side
    its advantage gains from (sign(A)·min(sign(A)·x, sign(A)·clip(x))), the row's ratio is the geometric
    mean of the clipped token ratios (sum / (L + 1e-8)), Ā_i = Σ_t A / (L + 1e-8), and the loss is the
    plain mean over the micro-batch's rows, whatever loss_agg_mode says (the KL keeps it). No log-ratio clamp.
    Paper: https://arxiv.org/abs/2507.20673
    """
    given = given_inputs(ratio, logp, inputs)
    x, mask = given.log_ratio, given.mask
    sign = torch.sign(advantages)  # (B, 1), or (B, T) per token
    x_clipped = x.clamp(-config.epsilon_low, config.epsilon_high)
    x_min = sign * torch.minimum(sign * x, sign * x_clipped)  # the pessimistic side of the clip, per token
    length = mask.sum(-1, keepdim=True)  # (B, T) -> (B, 1)
    row_ratio = torch.exp((x_min * mask).sum(-1, keepdim=True) / (length + 1e-8))
    row_advantage = (advantages.expand_as(mask) * mask).sum(-1, keepdim=True) / (length + 1e-8)  # Ā_i, as verl
    surrogate = row_advantage * row_ratio  # (B, 1): Ā_i · geometric-mean ratio
    weight = mask / (mask.shape[0] * length.clamp(min=1))  # a row's tokens share its 1/B: torch.mean over rows

    xd = x.detach()
    clipped = torch.ne(xd, x_clipped.detach()).to(xd.dtype)
    positive, negative = above(advantages, 0.0), below(advantages, 0.0)
    clip_high = above(xd, config.epsilon_high) * positive  # flat: the clip bound is the chosen side
    clip_low = below(xd, -config.epsilon_low) * negative
    flags = {"actor/pg_clipfrac": clipped * positive, "actor/pg_clipfrac_lower": clipped * negative}
    region = regions(xd, clip_low, clip_high)
    return ObjectiveTerms(surrogate, x_min.detach().exp(), region, flags, weight)


def cov_why_values(config: ObjectiveSettings) -> dict[str, float | None]:
    return ratio_bounds(config) | {"lb": config.clip_cov_lb, "ub": config.clip_cov_ub, "share": config.clip_cov_ratio}


def clip_cov_why_codes(ratio: Tensor, advantages: Tensor, region: Tensor, config: ObjectiveSettings) -> Tensor:
    """CLIP_COV_WHY's codes: the regions, and ``unbounded`` (5) for a trust-region token with A < 0 above
    1 + ε_high (no dual clip here: the pessimistic min keeps A·ratio)."""
    code = region.long()
    free = (code == TRUST) & (advantages < 0) & (ratio > 1 + config.epsilon_high)
    return torch.where(free, torch.full_like(code, 5), code)


CLIP_COV_WHY = Why(
    names=("masked", "trust", "clip_low", "clip_high", "cov_clipped", "unbounded"),
    codes=clip_cov_why_codes,
    texts={
        "masked": MASKED_WHY,
        "trust": "unclipped: the surrogate is A·ratio (ratio inside [{low}, {high}] or moved against its "
        "advantage), and the covariance draw left it alone: it gets a policy gradient",
        "clip_low": "clipped low: A < 0 and ratio below 1 − ε_low = {low}: flat, no policy gradient",
        "clip_high": "clipped high: A > 0 and ratio above 1 + ε_high = {high}: flat, no policy gradient",
        "cov_clipped": "selected by clip_cov (gradient detached): its covariance (A − mean A)·(logp − mean logp) "
        "lies in (clip_cov_lb, clip_cov_ub) = ({lb}, {ub}) and the random draw of max(1, int(clip_cov_ratio · N)) "
        "tokens (clip_cov_ratio = {share}, N the counted tokens) picked it: its term is multiplied by 0, so it "
        "adds nothing to the loss and gets no policy gradient",
        "unbounded": "unbounded: A < 0 and ratio above 1 + ε_high = {high}; the pessimistic min keeps A·ratio, "
        "Clip-Cov has no dual clip, and the token's loss and gradient grow with its ratio",
    },
    values=cov_why_values,
    no_gradient=frozenset({"clip_low", "clip_high", "cov_clipped"}),
    selected="cov_clipped",
    labels={"cov_clipped": "selected by clip_cov (gradient detached)"},
)


def clip_cov_selection(cov: Tensor, mask: Tensor, config: ObjectiveSettings, like: Tensor) -> Tensor:
    """1.0 on the tokens Clip-Cov cuts: clip_num of the candidates (lb < cov < ub), drawn as verl draws them
    (torch.randperm over the candidates in row-major order; here from a generator seeded clip_cov_seed)."""
    clip_num = max(int(config.clip_cov_ratio * float(mask.sum())), 1)
    candidates = torch.nonzero((cov < config.clip_cov_ub) & (cov > config.clip_cov_lb) & (mask > 0))
    picked = torch.zeros_like(like)
    if len(candidates) > 0:
        draw = torch.Generator().manual_seed(config.clip_cov_seed)
        perm = torch.randperm(len(candidates), generator=draw).to(candidates.device)
        chosen = candidates[perm[: min(clip_num, len(candidates))]]
        picked[chosen[:, 0], chosen[:, 1]] = 1.0
    return picked


@OBJECTIVES.register(
    "clip_cov",
    label="Clip-Cov",
    axis=PER_UNIT_A,
    flat="clipped or cut: the token's term is flat (PPO clip) or 0 (picked by Clip-Cov), so no policy gradient",
    metrics={"actor/pg_clipfrac": "tokens"},
    why=CLIP_COV_WHY,
    settings=CLIP_COV_SETTINGS,
)
def clip_cov(
    ratio: Tensor, logp: Tensor, advantages: Tensor, config: ObjectiveSettings, inputs: ObjectiveInputs | None = None
) -> ObjectiveTerms:
    """Clip-Cov: PPO's clipped surrogate, with a random few high-covariance tokens' terms cut to 0.

    verl ``loss_mode="clip_cov"``: among the unclipped counted tokens whose centred covariance
    (A − mean A)·(logp − mean logp) (means over the micro-batch's counted tokens) lies in
    (clip_cov_lb, clip_cov_ub), max(1, int(clip_cov_ratio · N)) are drawn with torch.randperm and their
    term multiplied by 0. No dual clip, no log-ratio clamp; actor/pg_clipfrac is the cut share.
    Paper: https://arxiv.org/abs/2505.22617
    """
    mask = given_inputs(ratio, logp, inputs).mask
    A = advantages.expand_as(logp)  # (B, 1) -> (B, T)
    ratio_clipped = ratio.clamp(1 - config.epsilon_low, 1 + config.epsilon_high)
    surrogate = torch.minimum(A * ratio, A * ratio_clipped)  # verl: max(-A·r, -A·clip(r)), negated
    r = ratio.detach()
    clipped_by_ppo = (-A * ratio_clipped.detach() > -A * r) & (mask > 0)
    cov = (A - masked_mean_verl(A, mask)) * (logp.detach() - masked_mean_verl(logp.detach(), mask))
    cov = cov.masked_fill((mask == 0) | clipped_by_ppo, -torch.inf)
    cut = clip_cov_selection(cov, mask, config, logp.detach())  # per token, also with a ratio per row (B, 1)
    surrogate = surrogate * (1 - cut)
    positive, negative = above(A, 0.0), below(A, 0.0)
    clip_low = clipped_by_ppo.to(r.dtype) * negative
    clip_high = clipped_by_ppo.to(r.dtype) * positive
    return ObjectiveTerms(
        surrogate,
        ratio_clipped.detach(),
        regions(surrogate.detach(), clip_low, clip_high, cut),  # the cut tokens' term is flat (0): the 4th code
        {"actor/pg_clipfrac": cut},
        selected=cut,
    )


def kl_cov_why_values(config: ObjectiveSettings) -> dict[str, float | None]:
    return {"share": config.kl_cov_ratio, "coef": config.ppo_kl_coef}


KL_COV_WHY = Why(
    names=("masked", "trust", "kl_penalized"),
    codes=lambda ratio, advantages, region, config: region.long().clamp(max=TRUST),
    texts={
        "masked": MASKED_WHY,
        "trust": "not among the kl_cov_ratio = {share} share of tokens with the largest covariance: its term is "
        "A·ratio, unclipped and unpenalised, and it gets a policy gradient",
        "kl_penalized": "kl_cov: KL penalty applied: it is among the max(1, int(kl_cov_ratio · N)) tokens "
        "(kl_cov_ratio = {share}, N the counted tokens) with the largest covariance (A − mean A)·(logp − mean logp), "
        "so its term is A·ratio − ppo_kl_coef·|log-ratio| (ppo_kl_coef = {coef}): it keeps a policy gradient, "
        "pulled back toward the old policy",
    },
    values=kl_cov_why_values,
    selected="kl_penalized",
    labels={"kl_penalized": "kl_cov: KL penalty applied"},
)


@OBJECTIVES.register("kl_cov", label="KL-Cov", axis=PER_UNIT_A, why=KL_COV_WHY, settings=KL_COV_SETTINGS)
def kl_cov(
    ratio: Tensor, logp: Tensor, advantages: Tensor, config: ObjectiveSettings, inputs: ObjectiveInputs | None = None
) -> ObjectiveTerms:
    """KL-Cov: A·ratio, unclipped, minus ppo_kl_coef·|log-ratio| on the highest-covariance tokens.

    verl ``loss_mode="kl_cov"``: the max(1, int(kl_cov_ratio · N)) counted tokens with the largest
    (A − mean A)·(logp − mean logp) (torch.topk; means over the micro-batch's counted tokens) get the
    penalty; no clip, no log-ratio clamp. verl logs actor/ppo_kl as the mean |log-ratio| here.
    Paper: https://arxiv.org/abs/2505.22617
    """
    given = given_inputs(ratio, logp, inputs)
    x, mask = given.log_ratio, given.mask
    A = advantages.expand_as(logp)  # (B, 1) -> (B, T)
    valid = mask > 0
    picked = torch.zeros_like(logp.detach())
    adv_valid, logp_valid = A[valid].detach().reshape(-1), logp[valid].detach().reshape(-1)
    if adv_valid.numel():
        cov = (adv_valid - adv_valid.mean()) * (logp_valid - logp_valid.mean())
        k = min(max(1, int(len(cov) * config.kl_cov_ratio)), len(cov))
        top = torch.nonzero(valid.reshape(-1), as_tuple=True)[0][torch.topk(cov, k, largest=True).indices]
        picked.view(-1)[top] = 1.0
    surrogate = A * ratio - picked * (config.ppo_kl_coef * x.abs())
    flags = {"actor/ppo_kl": x.detach().abs()}
    # The penalised tokens keep a gradient (no region of their own): their why names them (selected).
    return ObjectiveTerms(
        surrogate, ratio.detach().expand_as(surrogate), regions(surrogate.detach()), flags, selected=picked
    )
