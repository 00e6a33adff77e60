"""The GRPO loss, token by token: the importance ratio, the objective's surrogate, the KL penalty, their weights.

    ratio = exp(logp - old)                                 importance_ratio  (GSPO: the row's mean log-ratio)
    surrogate = objective(ratio, advantages)                grpo.objectives   (PPO's clip: min(r·A, clip(r)·A))
    kl = estimator(ref - logp)                              kl_penalty        (k1, k2, k3, abs; clamps)
    loss = Σ weight · (-surrogate · correction + beta · kl) _terms            (weight: grpo.aggregation)

``compute_loss`` gives that scalar, differentiable in the current log-probs, for training. ``evaluate`` runs the
same terms in one vectorised pass, forward and backward, with no Python loop over rows or tokens, and hands them to
grpo.breakdown, which lays out where every part of the loss comes from (a Breakdown, grpo.results). The current
log-probs are the only variable: old and reference log-probs and the advantages are constants. In ``evaluate`` the
policy and KL terms read the log-probs through two leaves holding the same values, so one backward pass gives their
gradients apart (their sum is the gradient of the loss). The speed shortcuts the pass takes, each equal bit for bit
to the plain expression, are in grpo.shortcuts.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from grpo.advantages import BatchAdvantages, compute_advantages, reward_columns, row_values
from grpo.aggregation import AGGREGATIONS
from grpo.batch import Batch
from grpo.breakdown import assemble
from grpo.config import LossConfig
from grpo.corrections import correct, rejection_keep, rs_criteria, sampler_log_ratio
from grpo.errors import GrpoInputError
from grpo.kl import KL_ESTIMATORS
from grpo.metrics import masked_mean, objective_metrics
from grpo.objectives import OBJECTIVES, ObjectiveInputs, above
from grpo.results import Breakdown, Inputs, Pass, RolloutLogps, RowBreakdown, Terms, TokenBreakdown, Touched
from grpo.shortcuts import clamp_symmetric, counted_row_sum, filled_kl, filled_kl_is_zero

# What grpo.loss has always offered, wherever it now lives (the results, advantages, metrics and shortcuts
# modules), and its own functions.
__all__ = [
    "DTYPES",
    "BatchAdvantages",
    "Breakdown",
    "RolloutLogps",
    "RowBreakdown",
    "TokenBreakdown",
    "Touched",
    "clamp_symmetric",
    "compute_advantages",
    "compute_loss",
    "counted_row_sum",
    "entropy_bonus",
    "entropy_threshold",
    "evaluate",
    "high_entropy_mask",
    "importance_ratio",
    "kl_penalty",
    "masked_mean",
    "objective_metrics",
    "policy_kept",
    "reference_free_constant",
    "reference_free_kl",
    "reference_free_zero",
    "resolve_device",
    "reward_columns",
    "router_part",
    "row_values",
    "token_terms",
]

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def resolve_device(name: str, input_device: torch.device) -> torch.device:
    """``auto``: the input's device (every tensor evaluate creates lives there); else cpu or cuda."""
    if name == "auto":
        return input_device
    if name == "cuda":
        if not torch.cuda.is_available():
            raise GrpoInputError("device", "cpu or auto: this machine has no CUDA GPU", got="'cuda'")
        return input_device if input_device.type == "cuda" else torch.device("cuda")
    return torch.device("cpu")


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
    correction: the values kl_penalty gives token by token (a -0.0 and 0 · inf = NaN included); the clamps touch
    nothing, as there. (B, T) -> (B, T)"""
    return filled_kl(like, reference_free_constant(like, config), ratio if config.kl_bias_correction else None)


def reference_free_constant(like: Tensor, config: LossConfig) -> float:
    """The one value of the reference-free KL before the bias correction (``kl_penalty`` of a 0-d zero)."""
    zero = like.detach().new_zeros(())
    return float(kl_penalty(zero, zero, zero, zero, config, bias_correct=False))


def reference_free_zero(
    like: Tensor, config: LossConfig, ratio: Tensor, extent: tuple[Tensor, Tensor] | None = None
) -> bool:
    """Whether ``reference_free_kl`` is +0.0 at every token (grpo.shortcuts.filled_kl_is_zero). ``extent``: the
    ratio's (min, max), when known."""
    ratio_or_none = ratio if config.kl_bias_correction else None
    return filled_kl_is_zero(reference_free_constant(like, config), ratio_or_none, extent)


def _inputs(batch: Batch, config: LossConfig) -> Inputs:
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
    return Inputs(
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


def policy_kept(inp: Inputs, config: LossConfig) -> Tensor | None:
    """The token mask on the policy term in the compute dtype, or None when every counted token keeps it."""
    if config.top_entropy_quantile >= 1:
        return None
    if inp.entropies is None:
        raise GrpoInputError("entropies", "per-token entropies: top_entropy_quantile < 1 masks the policy term by them")
    return high_entropy_mask(inp.entropies, inp.counted, config.top_entropy_quantile).to(inp.dtype)


def _terms(inp: Inputs, logp_policy: Tensor, logp_kl: Tensor, config: LossConfig, want_kl: bool) -> Terms:
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
    kl, kl_zero, extent = _kl_term(inp, logp_kl, ratio, config, touched, want_kl)
    weight = AGGREGATIONS.get(config.aggregation)(inp.mask, config, inp.width)
    policy_weight = weight if objective.weight is None else objective.weight  # geo_mean aggregates itself
    if config.gradient_accumulation_steps != 1:  # the trainer's scaling of one micro-batch's loss
        weight = weight / config.gradient_accumulation_steps
        policy_weight = policy_weight / config.gradient_accumulation_steps
    weighted = policy_weight * objective.surrogate
    # beta = 0 leaves the KL out of the loss entirely, as TRL does (so an overflowed KL cannot
    # turn the loss into NaN through 0 · inf); the KL is still reported.
    kl_tokens = weight * (config.beta * kl) if config.beta and kl is not None else None
    return Terms(
        ratio=ratio,
        log_ratio=log_ratio,
        objective=objective,
        kl=kl,
        weight=weight,
        policy_tokens=0.0 - weighted,
        weighted=weighted,
        kl_tokens=kl_tokens,
        touched=touched,
        kept=kept,
        correction=correction,
        uncorrected=uncorrected,
        entropy_tokens=entropy_bonus(inp, config, weight, kept),
        kl_zero=kl_zero,
        ratio_extent=extent,
    )


def _kl_term(
    inp: Inputs, logp: Tensor, ratio: Tensor, config: LossConfig, touched: Touched, want_kl: bool
) -> tuple[Tensor | None, bool, tuple[Tensor, Tensor] | None]:
    """(kl (B, T) or None when not asked for and out of the loss, whether it is +0.0 at every token, the importance
    ratio's (min, max) when taken). Without reference log-probs and with beta 0 the KL is reported only: one
    constant, filled in (``reference_free_kl``)."""
    if not inp.ref_given and not config.beta and want_kl:
        # one pass finds the ratio's extent: whether it is finite here, its smallest and largest in the metrics
        extent = torch.aminmax(ratio.detach()) if config.kl_bias_correction and ratio.shape[-1] > 1 else None
        if reference_free_zero(logp, config, ratio, extent):
            return torch.zeros_like(logp.detach()), True, extent
        return reference_free_kl(logp, config, ratio), False, extent
    if want_kl or config.beta:
        return kl_penalty(logp, inp.ref, inp.old, inp.mask, config, touched), False, None
    return None, False, None


def token_terms(t: Terms) -> Tensor:
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


def entropy_bonus(inp: Inputs, config: LossConfig, weight: Tensor, kept: Tensor | None) -> Tensor | None:
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
    """The loss of ``batch`` under ``config``, with its per-row and per-token breakdown (grpo.breakdown)."""
    config = config or LossConfig()
    inp = _inputs(batch, config)
    with torch.enable_grad():
        logp_policy = inp.logp.detach().requires_grad_(True)  # two leaves over the same memory
        logp_kl = inp.logp.detach().requires_grad_(True)
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
    loss = loss.detach()
    without = _uncorrected_loss(batch, config, t, inp, loss.clone())
    aux = router_part(config, loss) if config.aux_loss_coef else None
    return assemble(batch, config, inp, t, Pass(loss, token_loss, weighted_sum, (grads[0], grads[1]), without, aux))


def _uncorrected_loss(batch: Batch, config: LossConfig, t: Terms, inp: Inputs, loss: Tensor) -> Tensor:
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
