"""evaluate(batch, config) -> Breakdown: the loss, and where every part of it comes from.

One vectorised pass, forward and backward, with no Python loop over rows or tokens. The current
log-probs are the only variable: old and reference log-probs and the advantages are constants.
The policy and KL terms read the log-probs through two leaves holding the same values, so one
backward pass gives their gradients apart (their sum is the gradient of the loss).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from grpo.advantages import ADVANTAGES, AdvantageInputs, group_std_mean, takes_inputs, unbiased_std
from grpo.aggregation import AGGREGATIONS
from grpo.batch import Batch
from grpo.config import PRESETS, REGISTRIES, LossConfig
from grpo.corrections import (
    CORRECTION_CODES,
    KEPT,
    NOT_COUNTED,
    REJECTED,
    Applied,
    SamplingSums,
    correct,
    rejection_keep,
    rs_criteria,
    sampler_log_ratio,
    sampling_sums,
    verl_mismatch_metrics,
)
from grpo.errors import GrpoInputError
from grpo.fields import BATCH_FIELDS
from grpo.kl import KL_ESTIMATORS
from grpo.marks import MAX_DIGITS, mark, mark_all, plain
from grpo.objectives import OBJECTIVES, REGIONS, TRUST, ObjectiveInputs, ObjectiveTerms, above

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def objective_metrics() -> tuple[str, ...]:
    """Metrics every breakdown carries, 0 when its objective does not define them (verl logs 0
    too): those of every registered objective, in registration order."""
    return tuple(dict.fromkeys(name for entry in OBJECTIVES.entries() for name in entry.metrics))


@dataclass(frozen=True)
class TokenBreakdown:
    """Per-token tensors, all (B, T); zero (region ``masked``) where a position does not count."""

    ratio: Tensor
    """Importance ratio pi/pi_old (at sequence level, the row's ratio on each of its tokens)."""
    clipped_ratio: Tensor
    """The ratio after the objective's bounds (clip: clamp(ratio, 1-ε_low, 1+ε_high))."""
    surrogate: Tensor
    """The objective's term before weighting (its policy loss is -surrogate)."""
    kl: Tensor
    """The KL estimate entering the loss as beta·kl (after clamps and bias correction)."""
    weight: Tensor
    """The aggregation coefficient: loss = sum(weight · (-surrogate + beta·kl))."""
    loss: Tensor
    """This token's share of the loss; the shares sum to the loss."""
    policy_loss: Tensor
    """weight · (-surrogate)."""
    kl_loss: Tensor
    """weight · beta · kl."""
    grad: Tensor
    """d loss / d per_token_logps, from autograd."""
    grad_policy: Tensor
    """The policy term's part of grad."""
    grad_kl: Tensor
    """The KL term's part of grad."""
    region: Tensor
    """int8 codes into REGIONS: masked, trust, clip_low, clip_high, dual_clip."""
    policy_kept: Tensor
    """1.0 where the policy term acts, 0.0 where a token mask took it out (TRL's high-entropy mask: the
    surrogate is 0 there, the KL still counts) or the position does not count."""
    log_ratio: Tensor
    """log pi - log pi_old (after log_ratio_clamp)."""
    mask: Tensor
    """bool: the positions that count."""
    sampler_log_ratio: Tensor
    """log pi_old - log pi_sampler (0 without sampler log-probs, where it did not score a token, or where
    nothing counts): the mismatch the rollout correction weighs."""
    is_weight: Tensor
    """The rollout correction's importance weight on the policy term (1 where none applies; 0 where
    nothing counts); the sequence mask is in ``correction``, not here."""
    correction: Tensor
    """int8 codes into CORRECTION_CODES: kept, truncated, masked, not_scored, sequence_masked (0: does not
    count)."""
    advantage: Tensor
    """The advantage the token's term is scaled by: its row's, or its own when the batch gives them per token."""

    selected: Tensor | None = None
    """1.0 on the tokens the objective's own rule picked (Clip-Cov's cut, KL-Cov's penalised: ObjectiveTerms
    .selected), 0.0 elsewhere; None when the objective picks no tokens."""
    tool_output: Tensor | None = None
    """bool: the completion's tokens the batch's ``tool_mask`` took out (a tool's output: they do not count, so
    every tensor above is 0 there); None without a tool mask."""

    def correction_names(self) -> list[list[str]]:
        return [[CORRECTION_CODES[c] for c in row] for row in self.correction.tolist()]

    def region_names(self) -> list[list[str]]:
        return [[REGIONS[c] for c in row] for row in self.region.tolist()]


@dataclass(frozen=True)
class RowBreakdown:
    """Per-row tensors, all (B,)."""

    advantage: Tensor
    reward: Tensor | None
    length: Tensor
    """Counted tokens of the row."""
    loss: Tensor
    """The row's share of the loss."""
    policy_loss: Tensor
    kl_loss: Tensor
    sequence_ratio: Tensor
    """exp(mean log-ratio over the row's tokens): GSPO's ratio."""
    clip_fraction: Tensor
    """Fraction of the row's tokens outside the trust region."""
    group: Tensor
    """Group index of the row (consecutive rows of group_size)."""


@dataclass(frozen=True)
class Breakdown:
    """A loss and where every part of it comes from."""

    loss: Tensor
    """0-d: the scalar a trainer would backpropagate; the sum of tokens.loss."""
    objective: Tensor
    """0-d: J = -loss."""
    policy_loss: Tensor
    """0-d: the policy term's part of the loss."""
    kl_loss: Tensor
    """0-d: beta · aggregated KL; loss = policy_loss + kl_loss (+ entropy_loss)."""
    metrics: dict[str, float]
    """Trainer metrics under their own names (TRL, verl), meaning what the trainer means; GRPO Lens's
    own quantities under ``lens/`` (``lens/grad_norm_logps``, ``lens/ratio/max``, ...)."""
    advantages: Tensor
    """(B,): the advantages used (given, or computed from rewards); given per token, a row's value where it is
    the same on all its counted tokens, else their mean (``tokens.advantage`` holds each token's)."""
    rows: RowBreakdown
    tokens: TokenBreakdown
    clamp_counts: dict[str, int]
    """Tokens each clamp or cap field touched (0 when the field is off)."""
    warnings: tuple[str, ...]
    config: LossConfig
    device: str
    dtype: str
    zero_std_groups: tuple[int, ...]
    loss_without_correction: Tensor
    """0-d: the same batch's loss with the rollout correction and the sequence mask off (= loss when none
    is chosen), so a user sees what the correction did to the number."""
    sampled: bool = False
    """Whether the batch carried the sampler's log-probs (the tokens' sampler_log_ratio means something)."""
    aux_loss: Tensor | None = None
    """0-d: the MoE router's part, aux_loss_coef · aux_loss / entropy_accumulation_steps: the value the trainer
    added, captured, not recomputed (None when aux_loss_coef is 0). loss includes it; no token carries it."""
    entropy_loss: Tensor | None = None
    """0-d: the entropy bonus's part of the loss, -entropy_coef · mean entropy (None when entropy_coef is 0)."""
    entropy_tokens: Tensor | None = None
    """(B, T): each token's share of entropy_loss (no gradient: the entropies are inputs)."""
    sampling: SamplingSums | None = None
    """What TRL's ``sampling/*`` metrics need of this batch, in sums a check joins over a generation batch's
    micro-batches (None when TRL would not log them: no sampler log-probs, or no correction chosen)."""
    entropies: Tensor | None = None
    """(B, T): the batch's per-token entropies as given (None when the batch has none): what the high-entropy
    mask read (``entropy_threshold``)."""
    marked_warnings: tuple[str, ...] = ()
    """``warnings`` with each number marked with the quantity it shows (grpo.marks; ``warnings`` is their
    plain text)."""
    rollout_logps: RolloutLogps | None = None
    """The log-probs the rollout correction compared (None unless the batch has the sampler's log-probs or
    the off-policy sequence mask is on): the mismatch view (grpo.mismatch) reads them."""

    per_token_advantages: bool = False
    """Whether the batch gave its advantages per token (B, T) (``tokens.advantage``; a row's may vary)."""


@dataclass(frozen=True)
class RolloutLogps:
    """The log-probs behind the rollout correction, detached, (B, T), in the compute dtype."""

    base: Tensor
    """What the sampler's are compared with: old (in bypass mode the current ones); 0 where nothing counts."""
    sampler: Tensor | None
    """The sampler's (NaN where it did not score a counted token), or None."""
    current: Tensor
    """The current policy's (the off-policy sequence mask measures against them)."""
    counted: Tensor
    """bool: the positions that count before verl's rollout_rs (its rejection reads these)."""


def resolve_device(name: str, input_device: torch.device) -> torch.device:
    """``auto``: the input's device (every tensor evaluate creates lives there); else cpu or cuda."""
    if name == "auto":
        return input_device
    if name == "cuda":
        if not torch.cuda.is_available():
            raise GrpoInputError("device", "cpu or auto: this machine has no CUDA GPU", got="'cuda'")
        return input_device if input_device.type == "cuda" else torch.device("cuda")
    return torch.device("cpu")


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of x over the positions that count. (B, T) -> ()"""
    return (x * mask).sum() / mask.sum().clamp(min=1)


def clamp_symmetric(x: Tensor, bound: float) -> tuple[Tensor, Tensor]:
    """(x clamped to [-bound, bound], 1.0 where the clamp touched x).

    The gradient is torch.clamp's (1 inside, boundary included; 0 outside), written as float
    arithmetic: CPU autograd of clamp runs bool kernels that cost more than the rest of the pass.
    Tests hold it equal to torch.clamp in value and gradient.
    """
    outside = above(x.detach().abs(), bound)
    return x.detach().clamp(-bound, bound) + (x - x.detach()) * (1 - outside), outside


Touched = dict[str, Tensor]
"""Where each clamp acted: config field name -> 1.0/0.0 indicator, (B, T) or (B, 1)."""


class _CountedRowSum(torch.autograd.Function):
    """Each row's sum of an x that is already 0 wherever the mask is 0: the value of (x · mask).sum(-1) to the bit,
    without the product; the gradient that product gives, grad · mask. (B, T) -> (B, 1)"""

    @staticmethod
    def forward(ctx: Any, x: Tensor, mask: Tensor) -> Tensor:
        ctx.save_for_backward(mask)
        return x.sum(-1, keepdim=True)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        (mask,) = ctx.saved_tensors
        return grad * mask, None


def counted_row_sum(x: Tensor, mask: Tensor) -> Tensor:
    """(x · mask).sum(-1, keepdim=True) for an x already 0 wherever the mask is 0, in one pass (``_CountedRowSum``)."""
    out: Tensor = _CountedRowSum.apply(x, mask)  # type: ignore[no-untyped-call]  # torch's Function.apply is untyped
    return out


def importance_ratio(
    logp: Tensor,
    old: Tensor,
    mask: Tensor,
    config: LossConfig,
    touched: Touched | None = None,
    lengths: Tensor | None = None,
    zero_outside: bool = False,
) -> tuple[Tensor, Tensor]:
    """(ratio, log_ratio): ratio (B, T), or (B, 1) at sequence level; log_ratio (B, T).

    At sequence level (GSPO) the ratio is exp(mean log-ratio over the row), differentiable
    through the mean as in TRL; with ``sequence_ratio_gradient="token"`` verl's token form
    sg(s)·pi/sg(pi) (B, T): the same value, and the same gradient while a row has one advantage
    (with per-token advantages each token's gradient then carries its own). ``touched`` records where
    the clamps acted. ``lengths``: mask.sum(-1) when known; ``zero_outside``: logp - old is 0 wherever the mask is.
    """
    touched = {} if touched is None else touched
    log_ratio = logp - old
    if config.log_ratio_clamp is not None:
        log_ratio, touched["log_ratio_clamp"] = clamp_symmetric(log_ratio, config.log_ratio_clamp)
    if config.importance_sampling_level == "token":
        return log_ratio.exp(), log_ratio
    total = counted_row_sum(log_ratio, mask) if zero_outside else (log_ratio * mask).sum(-1, keepdim=True)
    counts = mask.sum(-1, keepdim=True) if lengths is None else lengths[:, None]
    seq = total / counts.clamp(min=1)  # (B, T) -> (B, 1)
    if config.sequence_ratio_gradient == "token":  # verl: log s_t = logp - sg(logp) + sg(log s), (B, T)
        seq = logp - logp.detach() + seq.detach()
    if config.seq_log_ratio_clamp is not None:  # verl GSPO: an upper clamp only
        touched["seq_log_ratio_clamp"] = above(seq.detach(), config.seq_log_ratio_clamp)
        seq = seq.clamp(max=config.seq_log_ratio_clamp)
    return seq.exp(), log_ratio


def kl_penalty(
    logp: Tensor,
    ref: Tensor,
    old: Tensor,
    mask: Tensor,
    config: LossConfig,
    touched: Touched | None = None,
    bias_correct: bool = True,
) -> Tensor:
    """Per-token KL estimate (B, T): clamp x = ref - logp, estimate, clamp, k2's gradient if asked
    (straight through), bias-correct (when the config asks and ``bias_correct``)."""
    touched = {} if touched is None else touched
    x = ref - logp
    if config.kl_log_ratio_clamp is not None:
        x, touched["kl_log_ratio_clamp"] = clamp_symmetric(x, config.kl_log_ratio_clamp)
    kl = KL_ESTIMATORS.get(config.kl_estimator)(x)
    if config.kl_clamp is not None:
        kl, touched["kl_clamp"] = clamp_symmetric(kl, config.kl_clamp)
    if config.kl_gradient == "k2":  # verl's "+": the value above, the gradient of ½(logp - ref)², unclamped
        k2 = 0.5 * (logp - ref).square()
        kl = k2 - k2.detach() + kl.detach()
    if config.kl_bias_correction and bias_correct:  # TRL / DeepSeek-V3.2: KL · differentiable ratio (before delta)
        kl = kl * importance_ratio(logp, old, mask, config)[0]
    return kl


def reference_free_kl(like: Tensor, config: LossConfig, ratio: Tensor) -> Tensor:
    """The KL a breakdown reports for a batch without reference log-probs while it stays out of the loss (beta 0).
    The reference is then the current policy itself, so x = ref - logp is +0 at every token (a - a is +0 for every
    finite a) and every estimate, clamps and straight-through included, is one constant: ``kl_penalty`` of a 0-d
    zero, filled in, times ``ratio`` (the policy's importance ratio, the values kl_penalty recomputes) under the bias
    correction. The values kl_penalty gives token by token (a -0.0 and 0 · inf = NaN included), in one or two passes
    instead of the estimator's and its clamps' dozen; the clamps touch nothing, as there. (B, T) -> (B, T)"""
    kl = torch.full_like(like.detach(), reference_free_constant(like, config))
    return kl * ratio.detach() if config.kl_bias_correction else kl


def reference_free_constant(like: Tensor, config: LossConfig) -> float:
    """The one value of the reference-free KL before the bias correction (``kl_penalty`` of a 0-d zero)."""
    zero = like.detach().new_zeros(())
    return float(kl_penalty(zero, zero, zero, zero, config, bias_correct=False))


def reference_free_zero(
    like: Tensor, config: LossConfig, ratio: Tensor, extent: tuple[Tensor, Tensor] | None = None
) -> bool:
    """Whether ``reference_free_kl`` is +0.0 at every token: its constant is +0.0 (k1, k2, k3, ...) and, under the
    bias correction, every ratio is finite (+0 times a finite ratio >= 0 is +0.0; times inf it is NaN). A finite sum
    proves every ratio finite; a sum that overflows says no, and the KL is then computed. ``extent``: the ratio's
    (min, max), when known."""
    constant = reference_free_constant(like, config)
    if constant != 0.0 or math.copysign(1.0, constant) < 0:
        return False
    if not config.kl_bias_correction:
        return True
    if extent is not None:
        return bool(torch.isfinite(extent[0])) and bool(torch.isfinite(extent[1]))
    return bool(torch.isfinite(ratio.detach().sum()))


@dataclass(frozen=True)
class _Advantages:
    values: Tensor
    """(B,) one per row, or (B, T) when the batch gives them per token (0 where nothing counts)."""
    reward: Tensor | None
    metrics: dict[str, float]
    zero_std_groups: tuple[int, ...]
    group_size: int

    @property
    def per_token(self) -> bool:
        return self.values.dim() == 2

    def on_tokens(self) -> Tensor:
        """(B, 1) or (B, T): what the objectives multiply each token's term by (broadcast over the row)."""
        return self.values if self.per_token else self.values[:, None]

    def of_rows(self, mask: Tensor) -> Tensor:
        """(B,): one per row; given per token, a row's value where it is the same on every counted token
        (bit for bit the per-row input's), else its mean over them (0 for a row with none)."""
        if not self.per_token:
            return self.values
        return row_values(self.values, mask)


def row_values(per_token: Tensor, mask: Tensor) -> Tensor:
    """(B, T) per-token values -> (B,): the row's value where its counted tokens agree, else their mean.
    ``mask`` (B, T) 0.0/1.0 (or bool)."""
    weights = mask.to(per_token.dtype)
    first = per_token.gather(-1, weights.argmax(-1, keepdim=True)).squeeze(-1)  # first counted token's value
    length = weights.sum(-1)
    varies = ((per_token != first[:, None]) & (weights > 0)).any(-1)
    mean = (per_token * weights).sum(-1) / length.clamp(min=1)
    return torch.where(varies, mean, first * (length > 0))


def compute_advantages(batch: Batch, config: LossConfig, device: torch.device, dtype: torch.dtype) -> _Advantages:
    """Advantages (B,) from the batch: given (per row, or per token (B, T)), or from rewards by
    ``config.advantage``."""
    B = batch.shape[0]
    G = int(batch.group_size or B)
    if batch.rewards is None:
        assert batch.advantages is not None  # the Batch holds exactly one of the two
        return _Advantages(batch.advantages.to(device, dtype), None, {}, (), G)
    entry = ADVANTAGES.entry(config.advantage)
    missing = [name for name in entry.needs if name not in batch.extra]
    if missing:
        doc = BATCH_FIELDS[missing[0]].doc.rstrip(".")
        raise GrpoInputError(missing[0], f"{doc}: advantage {config.advantage} reads it")
    per_function, weights = reward_columns(batch, device, dtype)
    rewards = (per_function * weights).sum(-1)  # TRL's Σ_k w_k·r_k (one reward function: r, as given)
    grouped = rewards.view(-1, G)  # (B,) -> (B/G, G)
    lengths = batch.mask.sum(dim=-1).to(device, dtype).view(-1, G)  # counted tokens per row
    if takes_inputs(entry.fn):
        baselines = batch.extra.get("reward_baselines")
        given = AdvantageInputs(
            per_function=per_function.view(-1, G, per_function.shape[-1]),
            weights=weights,
            mask=batch.mask_float.to(device, dtype),
            gamma=config.gamma,
            baselines=None if baselines is None else baselines.to(device, dtype).view(-1, G),
            old=(batch.per_token_logps if batch.old_per_token_logps is None else batch.old_per_token_logps)
            .detach()
            .to(device, dtype),
            sum_pi_squared=batch.extra.get("sum_pi_squared"),
            token_rewards=batch.extra.get("token_level_rewards"),
        )
        values = entry.fn(grouped, config.advantage_epsilon, lengths, inputs=given)
    else:
        values = entry.fn(grouped, config.advantage_epsilon, lengths)
    values = values.reshape(batch.shape) if entry.per_token else values.reshape(B)
    group_std = unbiased_std(grouped)  # (B/G, 1)
    zero = (
        torch.isclose(group_std, torch.zeros_like(group_std)).reshape(-1)
        if G > 1
        else torch.zeros(B // G, dtype=torch.bool, device=device)
    )
    spread = ADVANTAGES.entry(config.advantage).reward_std or group_std_mean  # TRL's reward_std
    metrics = {
        "reward": float(rewards.mean()),
        "reward_std": float(spread(grouped)),
        "frac_reward_zero_std": float(zero.to(dtype).mean()),
    }
    zero_groups = tuple(int(g) for g in zero.nonzero().flatten().tolist())
    return _Advantages(values, rewards, metrics, zero_groups, G)


def reward_columns(batch: Batch, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """(rewards (B, K), weights (K,)): the batch's rewards per reward function (K = 1 for one per row) and
    reward_weights (all 1 when not given), whose length must be K."""
    assert batch.rewards is not None
    rewards = batch.rewards.to(device, dtype)
    per_function = rewards if rewards.dim() == 2 else rewards[:, None]
    K = per_function.shape[-1]
    given = batch.extra.get("reward_weights")
    if given is None:
        return per_function, torch.ones(K, device=device, dtype=dtype)
    weights = given.to(device, dtype).reshape(-1)
    if weights.numel() != K:
        raise GrpoInputError(
            "reward_weights",
            f"{K} weights, one per reward function (rewards has {K} per row)",
            got=f"{weights.numel()}",
        )
    return per_function, weights


@dataclass(frozen=True)
class _Inputs:
    """The batch's constants on the compute device and dtype: everything but the variable log-probs."""

    device: torch.device
    dtype: torch.dtype
    counted: Tensor
    """(B, T) bool."""
    mask: Tensor
    """(B, T) 0.0 / 1.0 in the compute dtype."""
    logp: Tensor
    """(B, T) the current log-probs, on the compute device and dtype (with the caller's graph)."""
    old: Tensor
    ref: Tensor
    ref_given: bool
    """Whether the batch held reference log-probs (without them ``ref`` is the current log-probs, detached)."""
    entropies: Tensor | None
    """(B, T) as the batch holds them (their dtype: TRL compares them as they are), or None."""
    sampler: Tensor | None
    """(B, T) the sampler's log-probs (NaN where it did not score a counted token), or None."""
    base: Tensor
    """(B, T): the log-probs the sampler's are compared with: old, or in bypass mode the current ones (constant)."""
    before_rejection: Tensor
    """(B, T) 0.0 / 1.0: the counted positions before verl's rollout_rs (its IS weights read these)."""
    rejected: Tensor | None
    """(B, T) bool: counted positions rollout_rs took out of the batch (None: no rejection)."""
    adv: _Advantages
    lengths: Tensor
    """(B,) counted tokens per row: mask.sum(-1)."""
    width: int
    """The padded completion width (T minus the shortest prompt)."""


def _inputs(batch: Batch, config: LossConfig) -> _Inputs:
    device = resolve_device(config.device, batch.logp.device)
    dtype = DTYPES[config.dtype]

    def load(value: Tensor | None) -> Tensor | None:  # the Batch holds 0 wherever nothing counts
        return None if value is None else value.to(device, dtype)

    logp = batch.logp.to(device, dtype)
    old, ref = load(batch.old_per_token_logps), load(batch.ref_per_token_logps)
    old = logp.detach() if old is None else old  # on-policy: old is the current policy, held constant
    sampler = load(batch.sampling_per_token_logps)
    base = old
    if config.rollout_bypass:  # verl: old_log_probs = rollout_log_probs; corrections weigh current vs sampler
        if sampler is None:
            raise GrpoInputError("sampling_per_token_logps", "the sampler's log-probs: rollout_bypass uses them as old")
        old, base = torch.where(torch.isnan(sampler), logp.detach(), sampler), logp.detach()
    counted, before = batch.mask.to(device), batch.mask_float.to(device, dtype)
    rejected = None
    if config.rollout_rs is not None and sampler is not None:  # verl: the response mask after rejection
        criteria = rs_criteria(config.rollout_rs, config.rollout_rs_threshold)
        keep = rejection_keep(sampler_log_ratio(base, sampler, before), before, criteria).bool()
        rejected, counted = counted & ~keep, counted & keep
    mask = before if rejected is None else counted.to(dtype)
    return _Inputs(
        device=device,
        dtype=dtype,
        counted=counted,
        mask=mask,
        logp=logp,
        old=old,
        ref=logp.detach() if ref is None else ref,
        ref_given=ref is not None,
        entropies=None if batch.entropies is None else batch.entropies.to(device),
        sampler=sampler,
        base=base,
        before_rejection=before,
        rejected=rejected,
        adv=compute_advantages(batch, config, device, dtype),
        lengths=mask.sum(-1),
        width=int(batch.shape[1] - int(batch.prompt_length_tensor().min())),
    )


@dataclass(frozen=True)
class _Terms:
    """The per-token terms of the loss, still attached to the log-probs they were computed from."""

    ratio: Tensor
    log_ratio: Tensor
    objective: ObjectiveTerms
    kl: Tensor | None
    """None when the KL was not asked for (compute_loss with beta = 0)."""
    weight: Tensor
    policy_tokens: Tensor
    """weight · -surrogate, written 0 - weight·surrogate: a zero is +0.0, as when the KL's zeros were added to it."""
    weighted: Tensor
    """weight · surrogate (policy_tokens = 0 - weighted)."""
    kl_tokens: Tensor | None
    """weight · beta · kl; None when the KL is out of the loss (beta 0)."""
    touched: Touched
    kept: Tensor | None
    """The token mask on the policy term (None: every counted token keeps it)."""
    correction: Applied | None
    """The rollout correction on the policy term (None: none chosen)."""
    uncorrected: Tensor | None
    """(B, T) or (B, 1): the surrogate before the correction (None when there is none), for the loss without it."""
    entropy_tokens: Tensor | None
    """(B, T) -entropy_coef · w_H · H per token (None: no entropy bonus)."""
    kl_zero: bool = False
    """Whether ``kl`` is +0.0 at every token (``reference_free_zero``): the breakdown's zero tensors are then that
    one tensor."""
    ratio_extent: tuple[Tensor, Tensor] | None = None
    """torch.aminmax of the (B, T) importance ratio, when it was taken."""


def entropy_threshold(entropies: Tensor, counted: Tensor, quantile: float) -> Tensor | None:
    """The high-entropy mask's threshold: the (1 - quantile) quantile of the counted tokens' entropies
    (``torch.quantile`` over them as float32, linear interpolation, as TRL takes it); None when none counts."""
    local = entropies[counted].float()
    return None if local.numel() == 0 else torch.quantile(local, 1 - quantile)


def high_entropy_mask(entropies: Tensor, counted: Tensor, quantile: float) -> Tensor:
    """TRL's ``get_high_entropy_mask`` on one process: 1.0 where a counted token's entropy is at least
    ``entropy_threshold``, else 0.0; in the entropies' dtype. (B, T) -> (B, T)."""
    threshold = entropy_threshold(entropies, counted, quantile)
    if threshold is None:
        return torch.zeros_like(entropies)
    return ((entropies * counted) >= threshold).logical_and_(counted).to(entropies.dtype)


def policy_kept(inp: _Inputs, config: LossConfig) -> Tensor | None:
    """The token mask on the policy term in the compute dtype, or None when every counted token keeps it."""
    if config.top_entropy_quantile >= 1:
        return None
    if inp.entropies is None:
        raise GrpoInputError("entropies", "per-token entropies: top_entropy_quantile < 1 masks the policy term by them")
    return high_entropy_mask(inp.entropies, inp.counted, config.top_entropy_quantile).to(inp.dtype)


def _terms(inp: _Inputs, logp_policy: Tensor, logp_kl: Tensor, config: LossConfig, want_kl: bool) -> _Terms:
    """Every per-token term, from the log-probs the policy and the KL terms read (the same values)."""
    touched: Touched = {}
    A = inp.adv.on_tokens()  # (B, 1) broadcast over the row's tokens, or (B, T) given per token
    zero_outside = inp.rejected is None  # the Batch holds 0 wherever nothing counts, unless rollout_rs took tokens
    ratio, log_ratio = importance_ratio(logp_policy, inp.old, inp.mask, config, touched, inp.lengths, zero_outside)
    given = ObjectiveInputs(old=inp.old, log_ratio=log_ratio, mask=inp.mask, zero_outside=zero_outside)
    objective = OBJECTIVES.get(config.objective)(ratio, logp_policy, A, config, given)
    kept = policy_kept(inp, config)
    if kept is not None:  # a token mask on the policy term only (TRL multiplies the per-token loss by it)
        objective = replace(objective, surrogate=objective.surrogate * kept)
    # The rollout correction, in this one place: the IS weight (constant) and the off-policy sequence mask
    # multiply the policy term only, as TRL's per_token_loss * importance_sampling_ratio, before the KL.
    correction = correct(inp.base, inp.sampler, logp_policy, A, inp.before_rejection, config)
    uncorrected = None if correction is None else objective.surrogate.detach()
    if correction is not None:
        objective = replace(objective, surrogate=objective.surrogate * correction.factor, zero_outside=False)
    kl, kl_zero, extent = None, False, None
    if not inp.ref_given and not config.beta and want_kl:
        # one pass finds the ratio's extent: whether it is finite here, its smallest and largest in the metrics
        extent = torch.aminmax(ratio.detach()) if config.kl_bias_correction and ratio.shape[-1] > 1 else None
        kl_zero = reference_free_zero(logp_kl, config, ratio, extent)  # reported only: one constant (times the ratio)
        kl = torch.zeros_like(logp_kl.detach()) if kl_zero else reference_free_kl(logp_kl, config, ratio)
    elif want_kl or config.beta:
        kl = kl_penalty(logp_kl, inp.ref, inp.old, inp.mask, config, touched)
    weight = AGGREGATIONS.get(config.aggregation)(inp.mask, config, inp.width)
    policy_weight = weight if objective.weight is None else objective.weight  # geo_mean aggregates itself
    if config.gradient_accumulation_steps != 1:  # the trainer's scaling of one micro-batch's loss
        weight = weight / config.gradient_accumulation_steps
        policy_weight = policy_weight / config.gradient_accumulation_steps
    weighted = policy_weight * objective.surrogate
    policy_tokens = 0.0 - weighted
    # beta = 0 leaves the KL out of the loss entirely, as TRL does (so an overflowed KL cannot
    # turn the loss into NaN through 0 · inf); the KL is still reported.
    kl_tokens = weight * (config.beta * kl) if config.beta and kl is not None else None
    entropy_tokens = entropy_bonus(inp, config, weight, kept)
    return _Terms(
        ratio,
        log_ratio,
        objective,
        kl,
        weight,
        policy_tokens,
        weighted,
        kl_tokens,
        touched,
        kept,
        correction,
        uncorrected,
        entropy_tokens,
        kl_zero,
        extent,
    )


def token_terms(t: _Terms) -> Tensor:
    """Each token's policy and KL terms, summed (the policy term alone when the KL is out of the loss)."""
    return t.policy_tokens if t.kl_tokens is None else t.policy_tokens + t.kl_tokens


def router_part(config: LossConfig, like: Tensor) -> Tensor:
    """aux_loss_coef · aux_loss / entropy_accumulation_steps, as TRL adds a MoE model's router loss (0 when off)."""
    if not config.aux_loss_coef:
        return like.new_zeros(())
    if config.aux_loss is None:
        raise GrpoInputError(
            "aux_loss", "the router loss the model returned (captured): aux_loss_coef > 0 adds it to the loss"
        )
    return like.new_tensor(config.aux_loss_coef * config.aux_loss / config.entropy_accumulation_steps)


def entropy_bonus(inp: _Inputs, config: LossConfig, weight: Tensor, kept: Tensor | None) -> Tensor | None:
    """-entropy_coef · w_H · H per token, or None when the bonus is off. w_H: TRL's mean over the counted tokens
    the policy term acts on (÷ entropy_accumulation_steps), or verl's aggregation weights (agg_loss)."""
    if not config.entropy_coef:
        return None
    if inp.entropies is None:
        raise GrpoInputError("entropies", "per-token entropies: entropy_coef > 0 adds -entropy_coef · mean entropy")
    entropies = inp.entropies.to(inp.dtype) * inp.mask  # the batch holds 0 where nothing counts
    if config.entropy_weighting == "aggregation":  # verl: agg_loss(entropy, response_mask, loss_agg_mode)
        w = weight
    else:  # TRL: Σ H·m_eff / max(Σ m_eff, 1) / GA, m_eff = mask · entropy mask
        effective = inp.mask if kept is None else inp.mask * kept
        w = effective / effective.sum().clamp(min=1.0) / config.entropy_accumulation_steps
    return -config.entropy_coef * w * entropies


def compute_loss(batch: Batch, config: LossConfig | None = None) -> Tensor:
    """The scalar loss of ``batch`` under ``config``, differentiable in ``batch.per_token_logps``.

    For training: when ``per_token_logps`` is a model's output (it requires grad), the gradient of
    the returned loss flows back into the model. The value and the gradient are those of
    ``evaluate(batch, config)`` (its ``loss`` and ``tokens.grad``), without the breakdown.
    """
    config = config or LossConfig()
    inp = _inputs(batch, config)
    terms = _terms(inp, inp.logp, inp.logp, config, want_kl=False)
    loss = token_terms(terms).sum() + router_part(config, terms.weight)
    return loss if terms.entropy_tokens is None else loss + terms.entropy_tokens.sum()


def evaluate(batch: Batch, config: LossConfig | None = None) -> Breakdown:
    """The loss of ``batch`` under ``config``, with its per-row and per-token breakdown."""
    config = config or LossConfig()
    inp = _inputs(batch, config)
    logp, mask, adv = inp.logp.detach(), inp.mask, inp.adv
    with torch.enable_grad():
        logp_policy = logp.detach().requires_grad_(True)  # two leaves over the same memory
        logp_kl = logp.detach().requires_grad_(True)
        t = _terms(inp, logp_policy, logp_kl, config, want_kl=True)
        token_loss = token_terms(t)
        if t.entropy_tokens is not None:  # a constant per token: it moves the loss, not the gradient
            token_loss = token_loss + t.entropy_tokens
        weighted_sum = t.weighted.sum()
        if token_loss is t.policy_tokens:  # Σ(0 - w·s) is 0 - Σ w·s to the bit; its backward has one pass fewer
            loss = (0.0 - weighted_sum) + router_part(config, t.weight)
        else:
            loss = token_loss.sum() + router_part(config, t.weight)
        grads = torch.autograd.grad(loss, [logp_policy, logp_kl], allow_unused=True)
    assert t.kl is not None  # want_kl
    # Every tensor of the breakdown that is +0.0 at every token is this one (it is never written to).
    zeros = t.kl.detach() if t.kl_zero else torch.zeros_like(logp)
    # Weights are 0 where nothing counts, so the gradient is ±0 there. Without a KL term in the loss the
    # gradient is the policy term's.
    grad_policy, grad_kl = (zeros if g is None else g for g in grads)
    grad = grad_policy if grads[1] is None else grad_policy + grad_kl

    shape = logp.shape
    ratio = t.ratio.detach().expand(shape) * mask
    # 1 where a token counts, the code of the trust region and of "kept": the bool mask's bytes read as int8
    counted = inp.counted.view(torch.int8)
    region, outside = _region_codes(t.objective.region, inp, shape, counted)
    clipped = t.objective.clipped_ratio
    policy_loss = t.policy_tokens.detach()
    surrogate = t.objective.surrogate.detach()
    # Masked positions hold logp = old = ref = 0, so kl and log_ratio are already 0 there.
    tokens = TokenBreakdown(
        ratio=ratio,
        clipped_ratio=ratio if _same(clipped, t.ratio, shape) else clipped.expand(shape) * mask,
        surrogate=surrogate if t.objective.zero_outside else surrogate.expand(shape) * mask,
        kl=t.kl.detach(),
        weight=t.weight,
        loss=policy_loss if token_loss is t.policy_tokens else token_loss.detach(),
        policy_loss=policy_loss,
        kl_loss=zeros if t.kl_tokens is None else t.kl_tokens.detach(),
        grad=grad,
        grad_policy=grad_policy,
        grad_kl=grad_kl,
        region=region,
        policy_kept=mask if t.kept is None else t.kept * mask,
        log_ratio=t.log_ratio.detach(),
        mask=inp.counted,
        **_correction_tokens(t.correction, inp, zeros, counted),
        selected=None if t.objective.selected is None else t.objective.selected.expand(shape) * mask,
        advantage=adv.on_tokens().expand(shape) * mask,
        tool_output=None if batch.tool_output is None else batch.tool_output.to(inp.device),
    )
    kl_out = t.kl_tokens is None  # the KL is out of the loss: tokens.kl_loss is +0.0 everywhere
    rows = _rows(tokens, adv, mask, inp.lengths, outside, kl_out)
    policy_sum = 0.0 - weighted_sum.detach()  # tokens.policy_loss.sum(), to the bit
    kl_sum = zeros.new_zeros(()) if kl_out else tokens.kl_loss.sum()
    sums = _Sums(policy_sum, t.kl_zero, inp.rejected is None, t.ratio_extent)
    metrics = _metrics(batch, config, t.objective.flags, tokens, rows, adv, mask, t.ratio.detach(), sums)
    sampling = None
    if t.correction is not None and inp.sampler is not None and config.rollout_correction != "none":
        sampling = sampling_sums(t.correction, inp.base, inp.sampler, mask)
        metrics |= sampling.metrics()  # TRL logs them only then
    if inp.sampler is not None:  # verl's mismatch diagnostics, over the tokens before its rejection
        metrics |= verl_mismatch_metrics(inp.base, inp.sampler, inp.before_rejection)
    entropy_loss = None if t.entropy_tokens is None else t.entropy_tokens.sum()
    if config.aux_loss_coef and config.aux_loss is not None:
        metrics["aux_loss"] = float(config.aux_loss)  # TRL logs the router loss itself (gathered mean)
    if entropy_loss is not None:  # the trainers' names: TRL's coefficient and policy part, verl's agg(H)
        policy_part = float(policy_sum + kl_sum) * config.gradient_accumulation_steps
        metrics |= {
            "entropy_coef": config.entropy_coef,
            "policy_loss": policy_part,
            "actor/entropy_loss": float(entropy_loss) / -config.entropy_coef,
        }
    marked_warnings = _warnings(batch, config, inp, rows, loss, metrics["lens/ratio/max"])
    return Breakdown(
        loss=loss.detach(),
        objective=0.0 - loss.detach(),  # 0.0 - x, not -x: no -0.0 for a zero loss
        policy_loss=policy_sum,
        kl_loss=kl_sum,
        metrics=metrics,
        advantages=rows.advantage,
        rows=rows,
        tokens=tokens,
        clamp_counts=_clamp_counts(t.touched, tokens, mask, config),
        warnings=tuple(plain(w) for w in marked_warnings),
        config=config,
        device=str(inp.device),
        dtype=config.dtype,
        zero_std_groups=adv.zero_std_groups,
        loss_without_correction=_uncorrected_loss(batch, config, t, inp, loss.detach().clone()),
        sampled=inp.sampler is not None,
        entropy_loss=entropy_loss,
        aux_loss=router_part(config, loss).detach() if config.aux_loss_coef else None,
        entropy_tokens=t.entropy_tokens,
        sampling=sampling,
        entropies=inp.entropies,
        marked_warnings=marked_warnings,
        rollout_logps=_rollout_logps(inp, config),
        per_token_advantages=adv.per_token,
    )


def _rollout_logps(inp: _Inputs, config: LossConfig) -> RolloutLogps | None:
    if inp.sampler is None and config.off_policy_mask_threshold is None:
        return None
    return RolloutLogps(inp.base, inp.sampler, inp.logp.detach(), inp.before_rejection.bool())


def _same(a: Tensor, b: Tensor, shape: torch.Size) -> bool:
    """Whether ``a`` and ``b`` broadcast to ``shape`` read the same memory the same way (so hold the same values)."""
    x, y = a.expand(shape), b.expand(shape)
    return x.data_ptr() == y.data_ptr() and x.stride() == y.stride() and x.dtype == y.dtype


def _code(counted: Tensor, code: int) -> Tensor:
    """int8 ``code`` where a token counts, else 0, from ``counted`` (int8 0/1: itself when the code is 1)."""
    return counted if code == 1 else counted * code


def _region_codes(region: Tensor, inp: _Inputs, shape: torch.Size, counted: Tensor) -> tuple[Tensor, Tensor]:
    """(int8 region codes (B, T), 0 where nothing counts; (B,) each row's count of tokens outside the trust
    region). An objective with one region for every token (``regions`` without indicators) gives one code.
    ``counted``: inp.counted as int8."""
    mask = inp.mask
    if region.numel() == 1:
        code = int(region.reshape(()))
        outside = inp.lengths if code > TRUST else mask.new_zeros(shape[0])
        return _code(counted, code), outside
    if region.shape[-1] == 1 and shape[-1] > 1:  # one region per row (sequence level): a row's tokens share it
        per_row = region.reshape(-1, 1)
        return counted * per_row.to(torch.int8), above(per_row, TRUST)[:, 0] * inp.lengths
    codes = region.expand(shape) * mask  # MASKED is 0
    return codes.to(torch.int8), above(codes, TRUST).sum(-1)


@dataclass(frozen=True)
class _Sums:
    """What the metrics can take from evaluate instead of another pass over (B, T)."""

    policy: Tensor
    """0-d: tokens.policy_loss.sum()."""
    kl_zero: bool
    """tokens.kl is +0.0 at every token."""
    zero_outside: bool
    """tokens.log_ratio is 0 wherever nothing counts and the importance ratio 1 there (no rejection)."""
    ratio_extent: tuple[Tensor, Tensor] | None
    """torch.aminmax of the (B, T) raw importance ratio, when evaluate took it already."""


def _correction_tokens(applied: Applied | None, inp: _Inputs, zeros: Tensor, counted: Tensor) -> dict[str, Tensor]:
    """The breakdown's per-token view of the rollout correction (the identity when none is chosen). ``zeros``: the
    breakdown's +0.0 tensor; ``counted``: inp.counted as int8."""
    mask = inp.mask
    if applied is None:
        log_ratio = zeros if inp.sampler is None else sampler_log_ratio(inp.base, inp.sampler, mask)
        # KEPT where counted, NOT_COUNTED (0) elsewhere: the bool mask's bytes read as int8 (times KEPT when it is
        # not 1), no pass (torch.where into int64 and back costs ten of them)
        code = _code(counted, KEPT)
        is_weight = mask
    else:
        log_ratio, code = applied.log_ratio * mask, applied.code
        is_weight = applied.is_weight.expand(mask.shape) * mask
    if inp.rejected is not None:  # rows and tokens verl's rollout_rs took out of the batch
        code = torch.where(inp.rejected, REJECTED, torch.where(inp.counted, code, NOT_COUNTED)).to(torch.int8)
    return {"sampler_log_ratio": log_ratio, "is_weight": is_weight, "correction": code}


def _uncorrected_loss(batch: Batch, config: LossConfig, t: _Terms, inp: _Inputs, loss: Tensor) -> Tensor:
    """The loss of the same batch with the rollout correction, the sequence mask and the rejection off: from
    this pass's terms when no rejection changed the counted tokens, else from a second pass without it. The
    entropy bonus and the router loss, constants of the inputs, are in both. ``loss``: this pass's (detached)."""
    if inp.rejected is None and t.uncorrected is None and t.entropy_tokens is None and not config.aux_loss_coef:
        return loss  # no correction acted: the sum below is this pass's loss, term for term (+0.0 added)
    bonus = router_part(config, t.weight) + (0.0 if t.entropy_tokens is None else t.entropy_tokens.sum().detach())
    if inp.rejected is None:
        if t.uncorrected is None:
            return token_terms(t).sum().detach() + bonus
        kl = 0.0 if t.kl_tokens is None else t.kl_tokens.detach().sum()
        return (t.weight * -t.uncorrected).sum() + kl + bonus
    off = replace(config, rollout_correction="none", off_policy_mask_threshold=None, rollout_rs=None)
    inp = _inputs(batch, off)
    with torch.no_grad():
        t = _terms(inp, inp.logp.detach(), inp.logp.detach(), off, want_kl=False)
        return token_terms(t).sum() + bonus


def _rows(
    tokens: TokenBreakdown, adv: _Advantages, mask: Tensor, lengths: Tensor, outside: Tensor, kl_out: bool
) -> RowBreakdown:
    """``lengths``: each row's counted tokens; ``outside``: each row's tokens outside the trust region; ``kl_out``:
    tokens.kl_loss is +0.0 everywhere."""
    B = mask.shape[0]
    policy = tokens.policy_loss.sum(-1)
    return RowBreakdown(
        advantage=adv.of_rows(mask),
        reward=adv.reward,
        length=lengths,
        loss=policy if tokens.loss is tokens.policy_loss else tokens.loss.sum(-1),
        policy_loss=policy,
        kl_loss=lengths.new_zeros(B) if kl_out else tokens.kl_loss.sum(-1),
        sequence_ratio=(tokens.log_ratio.sum(-1) / lengths.clamp(min=1)).exp(),
        clip_fraction=outside / lengths.clamp(min=1),
        group=torch.arange(B, device=mask.device) // adv.group_size,
    )


def _metrics(
    batch: Batch,
    config: LossConfig,
    flags: dict[str, Tensor],
    tokens: TokenBreakdown,
    rows: RowBreakdown,
    adv: _Advantages,
    mask: Tensor,
    raw_ratio: Tensor,
    sums: _Sums,
) -> dict[str, float]:
    lengths = rows.length
    counted = lengths.sum()  # counts: exact in either order
    n_tokens = counted.clamp(min=1)
    flat_mask = mask.view(-1)

    def masked_sum(x: Tensor) -> Tensor:
        if x.shape[-1] == 1:  # one value per row: the row's value times its counted tokens
            return torch.dot(x.reshape(-1), lengths)
        return torch.dot(x.reshape(-1), flat_mask)

    metrics = dict.fromkeys(objective_metrics(), 0.0)
    reductions = OBJECTIVES.entry(config.objective).metrics
    done: dict[int, float] = {}  # objectives share indicator tensors between metric names
    for name, flag in flags.items():
        if flag.shape[-1] == 1 and reductions.get(name) == "trl":
            metrics[name] = float(flag.mean())  # TRL's masked_batch_mean: per-row flags, one per row
        else:  # token-level flags (verl: always), over the tokens that count
            if id(flag) not in done:
                done[id(flag)] = float(masked_sum(flag) / n_tokens)
            metrics[name] = done[id(flag)]
    # TRL 1.16: the min (max) over sequences of each sequence's clip fraction, gathered over
    # processes; rows without a counted token are NaN there and skipped (nanmin / nanmax). At
    # sequence level each row's flag is its fraction, empty rows included (TRL squeezes the flag).
    counted_rows = lengths > 0
    for name, reduce in (("clip_ratio/low_min", torch.min), ("clip_ratio/high_max", torch.max)):
        if name not in flags:
            continue
        if flags[name].shape[-1] == 1:
            metrics[name] = float(reduce(flags[name]))
        elif bool(counted_rows.any()):
            per_row = (flags[name] * mask).sum(-1)[counted_rows] / lengths[counted_rows]
            metrics[name] = float(reduce(per_row))
    any_counted = float(counted) > 0
    ratio_min, ratio_max = _ratio_range(tokens, mask, raw_ratio, counted_rows, sums)
    masked_log_ratio = tokens.log_ratio if sums.zero_outside else tokens.log_ratio * mask
    # An objective's own reading of a shared name wins (verl's kl_cov logs the mean |log-ratio| as actor/ppo_kl).
    metrics |= {
        name: value
        for name, value in {
            # over the tokens that count: verl's rejection leaves log-ratios on the tokens it took out
            "actor/ppo_kl": 0.0 - float(masked_log_ratio.sum() / n_tokens),
        }.items()
        if name not in flags
    }
    metrics |= {
        "kl": 0.0 if sums.kl_zero else float(tokens.kl.sum() / n_tokens),  # kl is 0 where nothing counts
        "actor/pg_loss": float(sums.policy),
        "actor/kl_loss": 0.0 if sums.kl_zero else float(torch.dot(tokens.weight.view(-1), tokens.kl.view(-1))),
        "actor/kl_coef": config.beta,
        "completions/mean_length": float(rows.length.mean()),
        "completions/min_length": float(rows.length.min()),
        "completions/max_length": float(rows.length.max()),
        # GRPO Lens's own quantities: no trainer logs these under these names (TRL's num_tokens is a
        # running total with prompts, grad_norm the norm over the model's parameters).
        "lens/num_tokens": float(counted),
        "lens/grad_norm_logps": float(tokens.grad.norm()),
        "lens/ratio/min": float(ratio_min) if any_counted else 1.0,
        "lens/ratio/mean": float(tokens.ratio.sum() / n_tokens) if any_counted else 1.0,
        "lens/ratio/max": float(ratio_max) if any_counted else 1.0,
        "lens/advantage/mean": float(rows.advantage.mean()),
        "lens/advantage/std": float(unbiased_std(rows.advantage, dim=None)) if rows.advantage.numel() > 1 else 0.0,
    }
    if batch.entropies is not None:
        metrics["entropy"] = float(masked_mean(batch.entropies.to(mask.device, mask.dtype), mask))
    return metrics | adv.metrics


def _ratio_range(
    tokens: TokenBreakdown, mask: Tensor, raw_ratio: Tensor, counted_rows: Tensor, sums: _Sums
) -> tuple[Tensor, Tensor]:
    """(smallest, largest) importance ratio over the counted tokens, the smallest as 1 / (1 / min): the values of
    1 / max(mask / raw ratio) and max(tokens.ratio) (ratios are > 0; 1/x is monotone). With ``sums.zero_outside``
    the raw ratio is 1 wherever nothing counts (or, in verl's token form of the sequence ratio, the ratio of a row's
    counted tokens), so one pass over it finds both when they lie on either side of 1."""
    if raw_ratio.shape[-1] == 1:  # one ratio per row (sequence level): the rows with a counted token
        per_row = raw_ratio.reshape(-1)[counted_rows]
        if per_row.numel():
            low, high = torch.aminmax(per_row)
            return 1 / (1 / low), high
    elif sums.zero_outside:
        low, high = torch.aminmax(raw_ratio) if sums.ratio_extent is None else sums.ratio_extent
        if bool(low < 1) and bool(high > 1):  # neither is an uncounted position's 1
            return 1 / (1 / low), high
    return 1 / (mask / raw_ratio).max(), tokens.ratio.max()


def _clamp_counts(touched: Touched, tokens: TokenBreakdown, mask: Tensor, config: LossConfig) -> dict[str, int]:
    """Counted tokens each clamp or cap touched; fields that are off touch nothing."""
    flat_mask = mask.reshape(-1)

    def count(indicator: Tensor) -> int:
        return int(torch.dot(indicator.expand(mask.shape).reshape(-1), flat_mask))

    counts = dict.fromkeys(("log_ratio_clamp", "seq_log_ratio_clamp", "kl_log_ratio_clamp", "kl_clamp"), 0)
    counts |= {name: count(indicator) for name, indicator in touched.items()}
    counts["delta"] = count(above(tokens.ratio, config.delta)) if config.delta is not None else 0
    dual = REGIONS.index("dual_clip")
    # the dual_clip region code is the dual clip's only where the objective applies it: Clip-Cov's cut tokens
    # share the code (its why names them cov_clipped) and Clip-Cov ignores dual_clip, as verl's clip_cov does
    rule = OBJECTIVES.entry(config.objective).why
    applied = rule is None or rule.names[dual : dual + 1] == ("dual_clip",)
    counts["dual_clip"] = int((tokens.region == dual).sum()) if config.dual_clip is not None and applied else 0
    return counts


def _presets_with_beta() -> str:
    """Which presets put the KL in the loss, read from the presets table: "the presets that set beta: article
    (beta = 0.01), verl-grpo (beta = 0.001); every other preset has beta 0"."""
    default = LossConfig().beta
    with_beta = {name: p.settings.get("beta", default) for name, p in PRESETS.items()}
    named = [f"{name} (beta = {mark(f'lens/presets/{name}/beta', b)})" for name, b in with_beta.items() if b]
    if not named:
        return "every preset has beta 0"
    return f"the presets that set beta: {', '.join(named)}; every other preset has beta 0"


def _warnings(
    batch: Batch, config: LossConfig, inp: _Inputs, rows: RowBreakdown, loss: Tensor, metrics_ratio_max: float
) -> tuple[str, ...]:
    adv = inp.adv
    out = []
    if batch.old_per_token_logps is None:
        out.append("No old_per_token_logps: on-policy, so the ratio is 1 everywhere and nothing can clip.")
    if batch.ref_per_token_logps is None:
        out.append("No ref_per_token_logps: the reference is the current policy, so the KL is 0.")
    elif config.beta == 0:
        out.append(
            f"ref_per_token_logps given but beta = {mark('config/beta', config.beta)}: the KL is reported but left "
            f"out of the loss (set beta to include it; {_presets_with_beta()})."
        )
    sampler = batch.sampling_per_token_logps
    if sampler is None and (config.rollout_correction != "none" or config.rollout_rs is not None):
        out.append(
            f"rollout_correction {config.rollout_correction} / rollout_rs {config.rollout_rs} weigh the sampler's "
            "log-probs, and the batch has none (sampling_per_token_logps): no IS weight or rejection is applied."
        )
    unscored = 0 if sampler is None else int(torch.isnan(sampler).sum())  # NaN only at counted tokens
    if unscored:
        out.append(
            f"{mark('lens/warnings/unscored_tokens', unscored, MAX_DIGITS)} tokens were not scored by the sampler "
            "(NaN): TRL gives them no correction (weight 1, a log-ratio of 0 in sequence sums and in the off-policy "
            "mask) and leaves them out of sampling/sampling_logp_difference; verl has no such case (its "
            "rollout_log_probs hold no NaN)."
        )
    if adv.zero_std_groups:
        out.append(
            f"Groups {mark_all('zero_std_groups', list(adv.zero_std_groups))} have zero reward std: their advantages "
            "are 0, so they give no policy gradient."
        )
    if batch.rewards is not None and adv.group_size == 1:
        out.append(
            f"group_size {mark('lens/group_size', adv.group_size, MAX_DIGITS)}: each advantage is the raw reward "
            f"(verl's rule); TRL requires groups of {mark('lens/trl/min_group_size', 2, MAX_DIGITS)} or more."
        )
    empty = (rows.length == 0).nonzero().flatten().tolist()
    if empty:
        rows_text = "[" + ", ".join(mark(f"rows/index/{i}", i, MAX_DIGITS) for i in empty) + "]"
        out.append(f"Rows {rows_text} have no counted tokens: they add nothing but may still count in sequence means.")
    longest = int(rows.length.max())
    for kind, registry in REGISTRIES.items():  # each chosen variant's own warnings
        out += registry.entry(getattr(config, kind)).warnings(config, longest)  # marked (grpo.marks) or plain
    if not math.isfinite(float(rows.sequence_ratio.max())) or not math.isfinite(metrics_ratio_max):
        out.append(
            f"An importance ratio overflowed to inf ({config.dtype}): set log_ratio_clamp "
            f"(verl: {mark('lens/verl/log_ratio_clamp', 20)}) or use float64."
        )
    if not torch.isfinite(loss):
        out.append("The loss is not finite: a KL or ratio overflowed. Set kl_log_ratio_clamp / log_ratio_clamp.")
    return tuple(out)
