"""A Breakdown assembled from evaluate's pass (grpo.loss): each term per token, per row and in total, the metrics,
the clamp counts and the warnings.

Nothing here computes the loss or its gradient: it lays out what the pass computed (the terms, still attached,
and the gradients), masking each per-token tensor where nothing counts. It takes the shortcuts of grpo.shortcuts
(a tensor that is already what a product would give is not multiplied again).
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpo.advantages import BatchAdvantages
from grpo.batch import Batch
from grpo.config import LossConfig
from grpo.corrections import (
    KEPT,
    NOT_COUNTED,
    REJECTED,
    Applied,
    sampler_log_ratio,
    sampling_sums,
    verl_mismatch_metrics,
)
from grpo.marks import plain
from grpo.metrics import MetricSums, breakdown_metrics
from grpo.objectives import OBJECTIVES, REGIONS, TRUST, above
from grpo.results import Breakdown, Inputs, Pass, RolloutLogps, RowBreakdown, Terms, TokenBreakdown, Touched
from grpo.shortcuts import code_where_counted, same_memory
from grpo.warnings_text import breakdown_warnings


def assemble(batch: Batch, config: LossConfig, inp: Inputs, t: Terms, p: Pass) -> Breakdown:
    """The Breakdown of ``batch`` under ``config`` from the pass's inputs, terms and gradients."""
    tokens, outside = _tokens(batch, inp, t, p)
    kl_out = t.kl_tokens is None  # the KL is out of the loss: tokens.kl_loss is +0.0 everywhere
    rows = _rows(tokens, inp.adv, inp.mask, inp.lengths, outside, kl_out)
    policy_sum = 0.0 - p.weighted_sum.detach()  # tokens.policy_loss.sum(), to the bit
    kl_sum = tokens.kl_loss.new_zeros(()) if kl_out else tokens.kl_loss.sum()
    sums = MetricSums(policy_sum, t.kl_zero, inp.rejected is None, t.ratio_extent)
    metrics = breakdown_metrics(
        batch, config, t.objective.flags, tokens, rows, inp.adv, inp.mask, t.ratio.detach(), sums
    )
    entropy_loss = None if t.entropy_tokens is None else t.entropy_tokens.sum()
    sampling = None
    if t.correction is not None and inp.sampler is not None and config.rollout_correction != "none":
        sampling = sampling_sums(t.correction, inp.base, inp.sampler, inp.mask)
        metrics |= sampling.metrics()  # TRL logs them only then
    metrics |= _pass_metrics(config, inp, entropy_loss, float(policy_sum + kl_sum))
    marked_warnings = breakdown_warnings(batch, config, inp, rows, p.loss, metrics["lens/ratio/max"])
    return Breakdown(
        loss=p.loss,
        objective=0.0 - p.loss,  # 0.0 - x, not -x: no -0.0 for a zero loss
        policy_loss=policy_sum,
        kl_loss=kl_sum,
        metrics=metrics,
        advantages=rows.advantage,
        rows=rows,
        tokens=tokens,
        clamp_counts=_clamp_counts(t.touched, tokens, inp.mask, config),
        warnings=tuple(plain(w) for w in marked_warnings),
        config=config,
        device=str(inp.device),
        dtype=config.dtype,
        zero_std_groups=inp.adv.zero_std_groups,
        loss_without_correction=p.loss_without_correction,
        sampled=inp.sampler is not None,
        entropy_loss=entropy_loss,
        aux_loss=p.aux_loss,
        entropy_tokens=t.entropy_tokens,
        sampling=sampling,
        entropies=inp.entropies,
        marked_warnings=marked_warnings,
        rollout_logps=_rollout_logps(inp, config),
        per_token_advantages=inp.adv.per_token,
    )


def _pass_metrics(config: LossConfig, inp: Inputs, entropy_loss: Tensor | None, policy_part: float) -> dict[str, float]:
    """The metrics of the sampler's mismatch, the router loss and the entropy bonus, when the pass has them.
    ``policy_part``: the policy and KL terms' loss."""
    metrics: dict[str, float] = {}
    if inp.sampler is not None:  # verl's mismatch diagnostics, over the tokens before its rejection
        metrics |= verl_mismatch_metrics(inp.base, inp.sampler, inp.before_rejection)
    if config.aux_loss_coef and config.aux_loss is not None:
        metrics["aux_loss"] = float(config.aux_loss)  # TRL logs the router loss itself (gathered mean)
    if entropy_loss is not None:  # the trainers' names: TRL's coefficient and policy part, verl's agg(H)
        metrics |= {
            "entropy_coef": config.entropy_coef,
            "policy_loss": policy_part * config.gradient_accumulation_steps,
            "actor/entropy_loss": float(entropy_loss) / -config.entropy_coef,
        }
    return metrics


def _tokens(batch: Batch, inp: Inputs, t: Terms, p: Pass) -> tuple[TokenBreakdown, Tensor]:
    """(the per-token tensors, (B,) each row's tokens outside the trust region)."""
    logp, mask = inp.logp.detach(), inp.mask
    # Every tensor of the breakdown that is +0.0 at every token is this one (it is never written to).
    assert t.kl is not None  # evaluate asks for the KL
    zeros = t.kl.detach() if t.kl_zero else torch.zeros_like(logp)
    # Weights are 0 where nothing counts, so the gradient is ±0 there. Without a KL term in the loss the
    # gradient is the policy term's.
    grad_policy, grad_kl = (zeros if g is None else g for g in p.grads)
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
        clipped_ratio=ratio if same_memory(clipped, t.ratio, shape) else clipped.expand(shape) * mask,
        surrogate=surrogate if t.objective.zero_outside else surrogate.expand(shape) * mask,
        kl=t.kl.detach(),
        weight=t.weight,
        loss=policy_loss if p.token_loss is t.policy_tokens else p.token_loss.detach(),
        policy_loss=policy_loss,
        kl_loss=zeros if t.kl_tokens is None else t.kl_tokens.detach(),
        grad=grad_policy if p.grads[1] is None else grad_policy + grad_kl,
        grad_policy=grad_policy,
        grad_kl=grad_kl,
        region=region,
        policy_kept=mask if t.kept is None else t.kept * mask,
        log_ratio=t.log_ratio.detach(),
        mask=inp.counted,
        **_correction_tokens(t.correction, inp, zeros, counted),
        selected=None if t.objective.selected is None else t.objective.selected.expand(shape) * mask,
        advantage=inp.adv.on_tokens().expand(shape) * mask,
        tool_output=None if batch.tool_output is None else batch.tool_output.to(inp.device),
    )
    return tokens, outside


def _region_codes(region: Tensor, inp: Inputs, shape: torch.Size, counted: Tensor) -> tuple[Tensor, Tensor]:
    """(int8 region codes (B, T), 0 where nothing counts; (B,) each row's count of tokens outside the trust
    region). An objective with one region for every token (``regions`` without indicators) gives one code.
    ``counted``: inp.counted as int8."""
    mask = inp.mask
    if region.numel() == 1:
        code = int(region.reshape(()))
        outside = inp.lengths if code > TRUST else mask.new_zeros(shape[0])
        return code_where_counted(counted, code), outside
    if region.shape[-1] == 1 and shape[-1] > 1:  # one region per row (sequence level): a row's tokens share it
        per_row = region.reshape(-1, 1)
        return counted * per_row.to(torch.int8), above(per_row, TRUST)[:, 0] * inp.lengths
    codes = region.expand(shape) * mask  # MASKED is 0
    return codes.to(torch.int8), above(codes, TRUST).sum(-1)


def _correction_tokens(applied: Applied | None, inp: Inputs, zeros: Tensor, counted: Tensor) -> dict[str, Tensor]:
    """The breakdown's per-token view of the rollout correction (the identity when none is chosen). ``zeros``: the
    breakdown's +0.0 tensor; ``counted``: inp.counted as int8."""
    mask = inp.mask
    if applied is None:
        log_ratio = zeros if inp.sampler is None else sampler_log_ratio(inp.base, inp.sampler, mask)
        # KEPT where counted, NOT_COUNTED (0) elsewhere: the bool mask's bytes read as int8 (times KEPT when it is
        # not 1), no pass (torch.where into int64 and back costs ten of them)
        code = code_where_counted(counted, KEPT)
        is_weight = mask
    else:
        log_ratio, code = applied.log_ratio * mask, applied.code
        is_weight = applied.is_weight.expand(mask.shape) * mask
    if inp.rejected is not None:  # rows and tokens verl's rollout_rs took out of the batch
        code = torch.where(inp.rejected, REJECTED, torch.where(inp.counted, code, NOT_COUNTED)).to(torch.int8)
    return {"sampler_log_ratio": log_ratio, "is_weight": is_weight, "correction": code}


def _rows(
    tokens: TokenBreakdown, adv: BatchAdvantages, mask: Tensor, lengths: Tensor, outside: Tensor, kl_out: bool
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


def _rollout_logps(inp: Inputs, config: LossConfig) -> RolloutLogps | None:
    if inp.sampler is None and config.off_policy_mask_threshold is None:
        return None
    return RolloutLogps(inp.base, inp.sampler, inp.logp.detach(), inp.before_rejection.bool())
