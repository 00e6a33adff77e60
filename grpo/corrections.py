"""Rollout corrections: how the sampler's log-probs reweight or mask the policy term of each token.

The sampler (vLLM, SGLang) and the trainer disagree on the log-probs of the very same tokens, so a run is
off-policy before its first update. TRL 1.16 corrects for it whenever ``use_vllm`` is set: an importance
weight from the trainer's old log-probs against the sampler's, truncated or masked, per token or per
sequence (``vllm_importance_sampling_mode``), multiplying the policy term only (the KL is left alone).
Each mode is one entry of ``CORRECTIONS``; every entry takes

- ``log_ratio`` (B, T): old - sampler per token, 0 where the position does not count or the sampler did
  not score the token (NaN: TRL then applies no correction there, ratio 1),
- ``mask`` (B, T): 1.0 where the position counts,
- its ``settings`` (``rollout_is_min``, ``rollout_is_max``; a LossConfig is one),

and returns ``Weights``: the weight that multiplies the policy term, (B, T) per token or (B, 1) per
sequence, and where its bounds acted. DeepSeek-V3.2's off-policy sequence mask (TRL's
``off_policy_mask_threshold``) is a second, independent keep-mask on the policy term (``off_policy_keep``).
``correct`` puts both together for ``grpo.loss``, which applies them in one place.

Source: TRL 1.16.0 ``GRPOTrainer._generate_and_score_completions`` (the weights, computed once per
generation batch) and ``_compute_loss`` (``per_token_loss * importance_sampling_ratio``; the mask).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from grpo.errors import GrpoInputError
from grpo.registry import CorrectionRegistry

# What the correction did to each token, as int codes (the breakdown's ``correction``).
CORRECTION_CODES: tuple[str, ...] = (
    "not_counted",
    "kept",
    "truncated",
    "masked",
    "not_scored",
    "sequence_masked",
    "rejected",
)
NOT_COUNTED, KEPT, TRUNCATED, MASKED, NOT_SCORED, SEQUENCE_MASKED, REJECTED = range(len(CORRECTION_CODES))
VERL_MEAN_EPSILON = 1e-8
"""verl's ``masked_mean`` divides by the mask's sum + 1e-8; its batch normalisation reproduces that."""
SAFETY_BOUND = 20.0
"""verl's ±20 bound on a log-ratio before exp (its SAFETY_BOUND): the rejection statistics and IS weights
here, and, as trainer_fields maps them, its policy losses' log-ratio and low_var_kl's ref - logp."""
CORRECTION_WHY: dict[str, str] = {
    "not_counted": "does not count (prompt, padding or masked out)",
    "kept": "the importance weight is applied as it is (inside its bounds), or no correction is chosen",
    "truncated": "the importance weight passed a bound and was clamped to it (truncated IS)",
    "masked": "the importance weight passed a bound, so it is 0: the token's policy term is dropped (masked IS)",
    "not_scored": "the sampler did not score this token (NaN): no correction, weight 1",
    "sequence_masked": "the off-policy sequence mask dropped the row: A < 0 and its mean sampler - current "
    "log-prob is above off_policy_mask_threshold",
    "rejected": "rejected by verl's rollout_rs: the token (or its row) failed a criterion, so it leaves the batch "
    "(policy term, KL and the aggregation's counts)",
}


class CorrectionSettings(Protocol):
    """The settings corrections read (LossConfig fields)."""

    @property
    def rollout_is_min(self) -> float | None: ...
    @property
    def rollout_is_max(self) -> float | None: ...
    @property
    def rollout_is_log_ratio_clamp(self) -> float | None: ...


@dataclass(frozen=True)
class Weights:
    """What a correction computes: one weight per token (B, T) or per sequence (B, 1)."""

    weight: Tensor
    """The importance weight multiplying the policy term (1 where there is nothing to correct)."""
    ratio: Tensor
    """The raw ratio exp(old - sampler) (summed over the row at sequence level) before the bounds."""
    acted: Tensor
    """1.0 where the bounds acted (clamped or zeroed), else 0.0."""
    code: int
    """What acting means here: TRUNCATED or MASKED (KEPT when nothing acts)."""


Correction = Callable[[Tensor, Tensor, CorrectionSettings], Weights]
ACTION_CODES = {"truncate": TRUNCATED, "mask": MASKED}
"""The code of a token whose correction acted, by the action its entry declares."""
CORRECTIONS: CorrectionRegistry[Correction] = CorrectionRegistry("rollout_correction")


def outside(ratio: Tensor, settings: CorrectionSettings) -> Tensor:
    """1.0 where the ratio is below rollout_is_min or above rollout_is_max (a bound left None is none)."""
    low = -math.inf if settings.rollout_is_min is None else settings.rollout_is_min
    high = math.inf if settings.rollout_is_max is None else settings.rollout_is_max
    return ((ratio < low) | (ratio > high)).to(ratio.dtype)


def truncated(ratio: Tensor, settings: CorrectionSettings) -> Weights:
    """TRL's ``torch.clamp(ratio, min=clip_min, max=clip_max)``."""
    low, high = settings.rollout_is_min, settings.rollout_is_max
    weight = ratio if low is None and high is None else torch.clamp(ratio, min=low, max=high)
    return Weights(weight, ratio, outside(ratio, settings), TRUNCATED)


def masked(ratio: Tensor, settings: CorrectionSettings) -> Weights:
    """TRL's ``ratio.masked_fill((ratio < clip_min) | (ratio > clip_max), 0.0)``."""
    acted = outside(ratio, settings)
    return Weights(ratio.masked_fill(acted.bool(), 0.0), ratio, acted, MASKED)


def clamped_exp(log_ratio: Tensor, settings: CorrectionSettings) -> Tensor:
    """exp of the log-ratio, clamped first to ±rollout_is_log_ratio_clamp when set (verl's SAFETY_BOUND)."""
    bound = settings.rollout_is_log_ratio_clamp
    return (log_ratio if bound is None else log_ratio.clamp(-bound, bound)).exp()


def sequence_ratio(log_ratio: Tensor, settings: CorrectionSettings) -> Tensor:
    """exp of the row's summed log-ratio (a product of token ratios, not GSPO's mean). (B, T) -> (B, 1)"""
    return clamped_exp(log_ratio.sum(dim=-1, keepdim=True), settings)


@CORRECTIONS.register("none", label="no correction")
def no_correction(log_ratio: Tensor, mask: Tensor, settings: CorrectionSettings) -> Weights:
    """No rollout correction: the sampler's log-probs, when given, are shown but change nothing.

    TRL with ``use_vllm=False`` or ``vllm_importance_sampling_correction=False``; verl without
    ``rollout_correction``.
    Paper: https://fengyao.notion.site/off-policy-rl
    """
    ones = torch.ones_like(log_ratio)
    return Weights(ones, ones, torch.zeros_like(log_ratio), KEPT)


@CORRECTIONS.register("token_truncate", label="token IS, truncated", level="token", action="truncate")
def token_truncate(log_ratio: Tensor, mask: Tensor, settings: CorrectionSettings) -> Weights:
    """Per-token weight clamp(exp(old - sampler), rollout_is_min, rollout_is_max) on the policy term (TIS).

    TRL ``vllm_importance_sampling_mode="token_truncate"``. Formula: w_t = clamp(π_old(t) / π_sampler(t),
    C_min, C_max); the policy loss of token t is w_t · (-surrogate_t). Truncation keeps every token with a
    bounded weight (biased, low variance).
    Paper: https://fengyao.notion.site/off-policy-rl
    """
    return truncated(clamped_exp(log_ratio, settings), settings)


@CORRECTIONS.register("token_mask", label="token IS, masked", level="token", action="mask")
def token_mask(log_ratio: Tensor, mask: Tensor, settings: CorrectionSettings) -> Weights:
    """Per-token weight exp(old - sampler), zeroed outside [rollout_is_min, rollout_is_max] (MIS / IcePop).

    TRL ``vllm_importance_sampling_mode="token_mask"``. Formula: w_t = ρ_t if C_min <= ρ_t <= C_max else 0,
    ρ_t = π_old(t) / π_sampler(t): a token the two engines disagree on too much is dropped from the policy term.
    Paper: https://fengyao.notion.site/off-policy-rl
    """
    return masked(clamped_exp(log_ratio, settings), settings)


@CORRECTIONS.register("sequence_truncate", label="sequence IS, truncated", level="sequence", action="truncate")
def sequence_truncate(log_ratio: Tensor, mask: Tensor, settings: CorrectionSettings) -> Weights:
    """One weight per row, clamp(exp(Σ_t (old - sampler)), rollout_is_min, rollout_is_max), on every token.

    TRL ``vllm_importance_sampling_mode="sequence_truncate"``. Formula: w_i = clamp(Π_t ρ_it, C_min, C_max)
    (the product of the token ratios, i.e. the exp of their summed logs, not GSPO's mean).
    Paper: https://fengyao.notion.site/off-policy-rl
    """
    return truncated(sequence_ratio(log_ratio, settings), settings)


@CORRECTIONS.register("sequence_mask", label="sequence IS, masked", level="sequence", action="mask")
def sequence_mask(log_ratio: Tensor, mask: Tensor, settings: CorrectionSettings) -> Weights:
    """One weight per row, exp(Σ_t (old - sampler)), zeroed outside [rollout_is_min, rollout_is_max].

    TRL's default with ``use_vllm=True`` (``vllm_importance_sampling_mode="sequence_mask"``, C_max 3.0).
    Formula: w_i = Π_t ρ_it if C_min <= Π_t ρ_it <= C_max else 0: a whole row is dropped from the policy
    term when its small per-token gaps add up past a bound.
    Paper: https://fengyao.notion.site/off-policy-rl
    """
    return masked(sequence_ratio(log_ratio, settings), settings)


def sampler_log_ratio(old: Tensor, sampler: Tensor, mask: Tensor) -> Tensor:
    """old - sampler per token, 0 where the position does not count or the sampler gave NaN (TRL:
    ``nan_to_num((old - sampling) * mask, nan=0.0)``). (B, T) -> (B, T)"""
    return torch.nan_to_num((old - sampler) * mask, nan=0.0)


def off_policy_keep(
    advantages: Tensor, logp: Tensor, behaviour: Tensor, mask: Tensor, threshold: float
) -> tuple[Tensor, Tensor]:
    """DeepSeek-V3.2's off-policy sequence mask (TRL ``get_off_policy_mask``): (keep (B, 1), mean gap (B, 1)).

    A row is kept when its advantage is >= 0 or the mean over its tokens of behaviour - current log-prob
    (the sampler's, else the old policy's; NaN counts 0) is <= ``threshold``. ``logp`` is detached.
    Paper: https://arxiv.org/abs/2512.02556
    """
    gap = torch.nan_to_num(behaviour - logp.detach(), nan=0.0)
    mean_gap = (gap * mask).sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1.0)
    return ((advantages >= 0) | (mean_gap <= threshold)).to(mask.dtype), mean_gap


class RolloutSettings(CorrectionSettings, Protocol):
    @property
    def rollout_correction(self) -> str: ...
    @property
    def off_policy_mask_threshold(self) -> float | None: ...
    @property
    def rollout_is_batch_normalize(self) -> bool: ...
    @property
    def rollout_is_normalizer(self) -> float | None: ...


@dataclass(frozen=True)
class Applied:
    """The rollout correction of one batch, as ``grpo.loss`` applies it to the policy term."""

    factor: Tensor
    """(B, T) or (B, 1): multiplies each token's policy term (the IS weight times the sequence keep)."""
    is_weight: Tensor
    """(B, T) or (B, 1): the IS weight (1 where none applies)."""
    ratio: Tensor
    """(B, T) or (B, 1): the raw IS ratio before its bounds."""
    log_ratio: Tensor
    """(B, T): old - sampler per token (0 where not scored or not counted)."""
    code: Tensor
    """(B, T) int8 codes into CORRECTION_CODES."""
    sequence: bool
    """True when the IS weight is one per row."""
    scored: Tensor | None
    """(B, T) bool: counted tokens the sampler scored; None without sampler log-probs."""


def correct(
    old: Tensor, sampler: Tensor | None, logp: Tensor, advantages: Tensor, mask: Tensor, settings: RolloutSettings
) -> Applied | None:
    """The chosen correction and the off-policy sequence mask on one batch; None when neither acts.

    Without sampler log-probs the IS correction has nothing to weigh (weight 1); the sequence mask then
    measures against the old log-probs, as TRL does.
    """
    threshold = settings.off_policy_mask_threshold
    use_is = sampler is not None and settings.rollout_correction != "none"
    if not use_is and threshold is None:
        return None
    log_ratio = torch.zeros_like(old) if sampler is None else sampler_log_ratio(old, sampler, mask)
    name = settings.rollout_correction if use_is else "none"
    w = CORRECTIONS.get(name)(log_ratio, mask, settings)
    code = torch.where(w.acted.expand_as(mask).bool(), w.code, KEPT).to(torch.int8)
    scored = None if sampler is None else (mask.bool() & ~torch.isnan(sampler))
    if scored is not None and w.weight.shape[-1] != 1:  # per token: an unscored token keeps weight 1
        code = torch.where(mask.bool() & ~scored, NOT_SCORED, code).to(torch.int8)
    weight = w.weight
    if use_is and settings.rollout_is_batch_normalize:
        weight = weight / batch_normalizer(weight, mask, settings.rollout_is_normalizer)
    factor = weight
    if threshold is not None:
        keep, _ = off_policy_keep(advantages, logp, old if sampler is None else sampler, mask, threshold)
        factor = factor * keep
        code = torch.where(keep.bool().expand_as(mask), code, SEQUENCE_MASKED).to(torch.int8)
    code = torch.where(mask.bool(), code, NOT_COUNTED).to(torch.int8)
    return Applied(factor, weight, w.ratio, log_ratio, code, weight.shape[-1] == 1, scored)


def batch_normalizer(weight: Tensor, mask: Tensor, given: float | None) -> Tensor | float:
    """verl's rollout_is_batch_normalize divisor: ``given`` (the driver's, over the whole batch), else the
    mean weight over the counted tokens (per token) or over the rows with a counted token (per sequence),
    or 1 when that mean is not above 1e-8 (verl: ``if weights_mean > 1e-8``). The means divide as verl's
    ``masked_mean`` does, by the count + VERL_MEAN_EPSILON."""
    if given is not None:
        return given
    eps = VERL_MEAN_EPSILON
    if weight.shape[-1] != 1:
        mean = (weight * mask).sum() / (mask.sum() + eps)
    else:  # each row's masked mean of its (repeated) weight, then the mean over rows with a token
        lengths = mask.sum(-1, keepdim=True)
        rows = (lengths > 0).to(weight.dtype)
        mean = (weight * lengths / (lengths + eps) * rows).sum() / rows.sum().clamp(min=eps)
    return mean if bool(mean > eps) else 1.0


SAMPLING_METRICS = (
    "sampling/sampling_logp_difference/mean",
    "sampling/sampling_logp_difference/max",
    "sampling/importance_sampling_ratio/min",
    "sampling/importance_sampling_ratio/mean",
    "sampling/importance_sampling_ratio/max",
)


@dataclass(frozen=True)
class SamplingSums:
    """What TRL's ``sampling/*`` metrics need of a batch, in a form that adds up over micro-batches: TRL computes
    them once per generation batch (every micro-batch it later trains on, on one process), so a check joins the
    micro-batches' sums before taking the means. ``delta``: |old - sampler| over the counted tokens the sampler
    scored; ``ratio``: the applied IS weight over the rows (sequence level, empty rows included) or the counted
    tokens (token level)."""

    delta_sum: float = 0.0
    delta_count: int = 0
    delta_max: float = -math.inf
    ratio_sum: float = 0.0
    ratio_count: int = 0
    ratio_min: float = math.inf
    ratio_max: float = -math.inf

    def __add__(self, other: SamplingSums) -> SamplingSums:
        return SamplingSums(
            self.delta_sum + other.delta_sum,
            self.delta_count + other.delta_count,
            max(self.delta_max, other.delta_max),
            self.ratio_sum + other.ratio_sum,
            self.ratio_count + other.ratio_count,
            min(self.ratio_min, other.ratio_min),
            max(self.ratio_max, other.ratio_max),
        )

    def metrics(self) -> dict[str, float]:
        """The five metrics on one process, 0 where nothing was counted (as TRL reports an empty batch)."""
        d, r = self.delta_count, self.ratio_count
        values = (
            self.delta_sum / d if d else 0.0,
            self.delta_max if d else 0.0,
            self.ratio_min if r else 0.0,
            self.ratio_sum / r if r else 0.0,
            self.ratio_max if r else 0.0,
        )
        return dict(zip(SAMPLING_METRICS, values, strict=True))


def sampling_sums(applied: Applied, old: Tensor, sampler: Tensor, mask: Tensor) -> SamplingSums:
    """The ``SamplingSums`` of one batch (see ``sampling_metrics``)."""
    assert applied.scored is not None
    delta = (old - sampler).abs()[applied.scored]
    flat = applied.is_weight.flatten() if applied.sequence else applied.is_weight[mask.bool()]
    d, r = delta.numel(), flat.numel()
    return SamplingSums(
        float(delta.sum()),
        d,
        float(delta.max()) if d else -math.inf,
        float(flat.sum()),
        r,
        float(flat.min()) if r else math.inf,
        float(flat.max()) if r else -math.inf,
    )


def sampling_metrics(applied: Applied, old: Tensor, sampler: Tensor, mask: Tensor) -> dict[str, float]:
    """TRL's ``sampling/*`` metrics of one batch (on one process; TRL computes them per generation batch).

    ``sampling_logp_difference``: |old - sampler| over the counted tokens the sampler scored (mean, max; 0
    when none). ``importance_sampling_ratio``: the applied weight (after truncation or masking) over the
    rows at sequence level (every row, empty ones included), over the counted tokens per token (min, mean,
    max; 0 when none).
    """
    return sampling_sums(applied, old, sampler, mask).metrics()


def sampling_over_ranks(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """One generation's ``sampling/*`` over the processes, as TRL 1.16 gathers them: the mean of the ranks'
    mean differences, the max of their maxima, and ``nanmin``/``nanmean``/``nanmax`` of the IS ratio's."""

    def kept(name: str) -> list[float]:
        return [m[name] for m in per_rank if not math.isnan(m[name])] or [math.nan]

    mean, max_, ratio_min, ratio_mean, ratio_max = SAMPLING_METRICS
    return {
        mean: sum(m[mean] for m in per_rank) / len(per_rank),
        max_: max(m[max_] for m in per_rank),
        ratio_min: min(kept(ratio_min)),
        ratio_mean: sum(kept(ratio_mean)) / len(kept(ratio_mean)),
        ratio_max: max(kept(ratio_max)),
    }


# --- rejection (verl rollout_rs): tokens or rows whose mismatch is too large leave the batch ---------------
RS_STATISTICS = ("k1", "k2", "k3")
RS_LEVELS = ("token", "seq_sum", "seq_mean", "seq_max")
RS_CRITERIA: tuple[str, ...] = tuple(
    f"{level}_{k}" for level in RS_LEVELS for k in RS_STATISTICS if (level, k) != ("seq_max", "k1")
)
"""verl 0.9.1's eleven rollout_rs options: a divergence (k1 = -log r, k2 = ½(log r)², k3 = r - 1 - log r, with
log r = old - sampler clamped to ±20) per token, or its sum, mean or max over the row."""


@dataclass(frozen=True)
class Criterion:
    name: str
    lower: float | None
    """k1 only: the ratio's lower bound (its log bounds -log r from below)."""
    upper: float


def rs_criteria(rollout_rs: str, threshold: str | float | None) -> list[Criterion]:
    """verl's comma-chained ``rollout_rs`` with ``rollout_rs_threshold`` (one for all, or one per option; a k1
    option takes "lower_upper" or an upper whose inverse is the lower), as verl 0.9.1 parses them, or
    GrpoInputError naming the field."""
    names = list(dict.fromkeys(part.strip() for part in rollout_rs.split(",") if part.strip()))
    unknown = [n for n in names if n not in RS_CRITERIA]
    if not names or unknown:
        raise GrpoInputError("rollout_rs", f"comma-separated options among {', '.join(RS_CRITERIA)}", got=rollout_rs)
    specs = [] if threshold is None else [p.strip() for p in str(threshold).split(",") if p.strip()]
    if len(specs) not in (1, len(names)):
        raise GrpoInputError("rollout_rs_threshold", f"one threshold, or one per rollout_rs option ({len(names)})")
    specs = specs * len(names) if len(specs) == 1 else specs
    out = []
    for name, spec in zip(names, specs, strict=True):
        expected = (
            "'lower_upper' or an upper bound, both finite and > 0, lower <= upper"
            if name.endswith("k1")
            else "a finite number > 0"
        )
        try:
            if name.endswith("k1"):
                low_text, high_text = spec.split("_", 1) if "_" in spec else (str(1.0 / float(spec)), spec)
                lower, upper = float(low_text), float(high_text)
            elif "_" in spec:
                raise ValueError(spec)
            else:
                lower, upper = None, float(spec)
        except (ValueError, ZeroDivisionError):
            raise GrpoInputError("rollout_rs_threshold", f"{name}: {expected}", got=repr(spec)) from None
        if not 0 < upper < math.inf or (lower is not None and not 0 < lower <= upper):  # nan: no order, refused
            raise GrpoInputError("rollout_rs_threshold", f"{name}: {expected}", got=repr(spec))
        out.append(Criterion(name, lower, upper))
    return out


def within(stat: Tensor, c: Criterion) -> Tensor:
    """bool: k1's -log r inside [log lower, log upper]; the other statistics at most ``upper``."""
    if c.lower is None:
        return stat <= c.upper
    return (stat >= math.log(c.lower)) & (stat <= math.log(c.upper))


def rejection_keep(log_ratio: Tensor, mask: Tensor, criteria: list[Criterion]) -> Tensor:
    """(B, T) 1.0 where every criterion keeps the token (verl's ``compute_rollout_rejection_mask``; sums and
    means over the counted tokens, a mean dividing by the count + 1e-8, an empty row's max 0)."""
    keep = torch.ones_like(mask)
    for c in criteria:
        keep = keep * within(rs_statistic(log_ratio, mask, c.name), c).to(mask.dtype)
    return keep


def rs_statistic(log_ratio: Tensor, mask: Tensor, name: str) -> Tensor:
    """One rollout_rs criterion's statistic: (B, T) per token, (B, 1) per row (its sum, mean or max over
    the counted tokens), as ``rejection_keep`` compares it with the criterion's bounds."""
    safe = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    level, k = name.rsplit("_", 1)
    if k == "k1":
        stat = -safe
    elif k == "k2":
        stat = 0.5 * safe**2
    else:
        stat = safe.exp() - 1.0 - safe
    if level == "seq_sum":
        stat = (stat * mask).sum(-1, keepdim=True)
    elif level == "seq_mean":
        stat = (stat * mask).sum(-1, keepdim=True) / (mask.sum(-1, keepdim=True) + VERL_MEAN_EPSILON)
    elif level == "seq_max":
        stat = stat.masked_fill(mask == 0, -math.inf).amax(-1, keepdim=True)
        stat = torch.where(torch.isinf(stat), 0.0, stat)  # a row without a counted token: 0
    return stat


VERL_MISMATCH_METRICS = (
    "training_ppl",
    "training_log_ppl",
    "kl",
    "k3_kl",
    "rollout_ppl",
    "rollout_log_ppl",
    "log_ppl_diff",
    "log_ppl_abs_diff",
    "log_ppl_diff_max",
    "log_ppl_diff_min",
    "ppl_ratio",
    "chi2_token",
    "chi2_seq",
)
"""verl 0.9.1's ``compute_offpolicy_metrics`` names (logged under ``rollout_corr/``)."""


def verl_mismatch_metrics(old: Tensor, sampler: Tensor, mask: Tensor) -> dict[str, float]:
    """verl 0.9.1's ``rollout_corr/*`` mismatch diagnostics (``compute_offpolicy_metrics``), old vs sampler
    over the counted tokens the sampler scored: perplexities (a per-row mean log-prob, exp'd, averaged over
    every row), the KL and k3 estimates of KL(π_sampler ‖ π_old), the per-row log-perplexity gap, and the
    chi-squared divergences E[ρ²] - 1 per token and per row (ρ = π_old / π_sampler, logs clamped to ±20).
    Means divide by the count + 1e-8, as verl's ``masked_mean``."""
    scored = mask * ~torch.isnan(sampler)
    old, sampler = old * scored, torch.nan_to_num(sampler, nan=0.0) * scored
    eps = VERL_MEAN_EPSILON
    # Every statistic from a few passes over (B, T): the row sums, then the two that need exp.
    lengths, row_old, row_sampler = scored.sum(-1), old.sum(-1), sampler.sum(-1)  # (B,)
    count = lengths.sum() + eps
    train, roll = row_old / (lengths + eps), row_sampler / (lengths + eps)  # mean log-prob per row
    log_ratio = old - sampler  # 0 where not scored
    gap = roll - train
    safe = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    seq = (row_old - row_sampler).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    values = {
        "training_ppl": torch.exp(-train).mean(),
        "training_log_ppl": (-train).mean(),
        "kl": (row_sampler - row_old).sum() / count,
        "k3_kl": ((log_ratio.exp() - log_ratio - 1) * scored).sum() / count,
        "rollout_ppl": torch.exp(-roll).mean(),
        "rollout_log_ppl": (-roll).mean(),
        "log_ppl_diff": gap.mean(),
        "log_ppl_abs_diff": gap.abs().mean(),
        "log_ppl_diff_max": gap.max(),
        "log_ppl_diff_min": gap.min(),
        "ppl_ratio": gap.exp().mean(),
        "chi2_token": ((2 * safe).exp() * scored).sum() / count - 1.0,
        "chi2_seq": (2.0 * seq).exp().mean() - 1.0,
    }
    assert tuple(values) == VERL_MISMATCH_METRICS
    return {f"rollout_corr/{name}": float(value) for name, value in values.items()}
