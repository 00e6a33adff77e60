"""What evaluate gives and what it is assembled from: the Breakdown (per token, per row, the totals) and the
forward pass's intermediate results (the inputs on the compute device, the per-token terms, the backward pass).

grpo.loss computes them, grpo.breakdown assembles a Breakdown from them; both import this module, so neither
needs the other's types.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from grpo.advantages import BatchAdvantages
from grpo.config import LossConfig
from grpo.corrections import CORRECTION_CODES, Applied, SamplingSums
from grpo.objectives import REGIONS, ObjectiveTerms


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
    the off-policy sequence mask is on): the mismatch view (grpo.view.mismatch) reads them."""

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


Touched = dict[str, Tensor]
"""Where each clamp acted: config field name -> 1.0/0.0 indicator, (B, T) or (B, 1)."""


@dataclass(frozen=True)
class Inputs:
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
    adv: BatchAdvantages
    lengths: Tensor
    """(B,) counted tokens per row: mask.sum(-1)."""
    width: int
    """The padded completion width (T minus the shortest prompt)."""


@dataclass(frozen=True)
class Terms:
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


@dataclass(frozen=True)
class Pass:
    """evaluate's forward and backward pass over the terms: what the breakdown's assembly reads besides them."""

    loss: Tensor
    """0-d, detached: the loss (the router loss included)."""
    token_loss: Tensor
    """(B, T), attached: each token's share of the loss before the router loss (``terms.policy_tokens`` itself when
    the policy term is all of it)."""
    weighted_sum: Tensor
    """0-d, attached: terms.weighted.sum() (the policy loss is 0 minus it)."""
    grads: tuple[Tensor | None, Tensor | None]
    """d loss / d log-probs through the policy term and through the KL term (None: that term is out of the loss)."""
    loss_without_correction: Tensor
    """0-d: Breakdown.loss_without_correction."""
    aux_loss: Tensor | None
    """0-d: Breakdown.aux_loss."""
