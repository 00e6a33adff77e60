"""The metrics the views show, written once: how each combines over a step and which views draw it.

Names are the trainers' own (``Breakdown.metrics``; the objectives' entries say which clip metrics they
report and how each reduces within a micro-batch) plus the lab's step values (``loss``, ``grad_norm``).
``grpo.check`` (a step's token-weighted means, the Runs view's series) and ``grpo.lab`` (what every
step logs) take their lists from this table.

``breakdown_metrics`` computes a breakdown's metrics from evaluate's pass (grpo.breakdown calls it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from grpo.advantages import BatchAdvantages, unbiased_std
from grpo.batch import Batch
from grpo.config import LossConfig
from grpo.corrections import SAMPLING_METRICS, VERL_MISMATCH_METRICS
from grpo.objectives import OBJECTIVES
from grpo.results import RowBreakdown, TokenBreakdown


@dataclass(frozen=True)
class Metric:
    name: str
    token_mean: bool = False
    """A mean over counted tokens: a step's value is its micro-batches' token-weighted mean."""
    series: bool = False
    """Drawn per step in the Runs view (trainer beside recomputed)."""
    lab: bool = False
    """Logged by the lab at every step."""


METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric("reward", lab=True),
        Metric("reward_std", lab=True),
        Metric("loss", lab=True),
        Metric("policy_loss", lab=True),
        Metric("kl_loss", lab=True),
        Metric("kl", token_mean=True, series=True, lab=True),
        Metric("clip_ratio/low_mean", token_mean=True, series=True, lab=True),
        Metric("clip_ratio/high_mean", token_mean=True, series=True, lab=True),
        Metric("clip_ratio/region_mean", token_mean=True, series=True, lab=True),
        Metric("cispo_clip_ratio", token_mean=True),
        Metric("vespo/phi_seq_mean"),  # a mean over rows (TRL: one value per sequence), not over tokens
        Metric("actor/pg_clipfrac", token_mean=True, series=True),
        Metric("actor/ppo_kl", token_mean=True),
        Metric("actor/pg_clipfrac_lower", token_mean=True),
        Metric("entropy", token_mean=True, series=True, lab=True),
        Metric("completions/mean_length", series=True, lab=True),
        Metric("completions/min_length", lab=True),
        Metric("completions/max_length", lab=True),
        Metric("lens/advantage/std", series=True, lab=True),
        Metric("frac_reward_zero_std", lab=True),
        Metric("grad_norm", lab=True),
        Metric("aux_loss"),  # a MoE router's loss, captured (TRL logs its gathered mean per loss call)
        Metric("lens/grad_norm_logps", series=True),
        # TRL's rollout-correction metrics, over its generation batch (present when a correction is chosen)
        *(Metric(name) for name in SAMPLING_METRICS),
        # verl's mismatch diagnostics (rollout_corr/*), present when the batch has the sampler's log-probs
        *(Metric(f"rollout_corr/{name}") for name in VERL_MISMATCH_METRICS),
    )
}
TOKEN_MEANS = tuple(name for name, m in METRICS.items() if m.token_mean)
SERIES_METRICS = tuple(name for name, m in METRICS.items() if m.series)
LAB_METRICS = tuple(name for name, m in METRICS.items() if m.lab)


def logged_metrics(config: Any, names: Iterable[str]) -> list[str]:
    """Of a breakdown's metric ``names``, those the trainer logs under ``config``, in their order.

    A breakdown carries every objective's metrics (0 where its objective defines none: verl logs 0 too, and
    check-run compares them); the page shows only the ones the config's objective reports, as its registry
    entry lists them. Metrics no objective claims (kl, lengths, lens/...) are always shown.
    """
    own = OBJECTIVES.entry(config.objective).metrics
    claimed = {name for entry in OBJECTIVES.entries() for name in entry.metrics}
    return [name for name in names if name not in claimed or name in own]


# --- a breakdown's metrics ------------------------------------------------------------------------------------


def objective_metrics() -> tuple[str, ...]:
    """Metrics every breakdown carries, 0 when its objective does not define them (verl logs 0
    too): those of every registered objective, in registration order."""
    return tuple(dict.fromkeys(name for entry in OBJECTIVES.entries() for name in entry.metrics))


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of x over the positions that count. (B, T) -> ()"""
    return (x * mask).sum() / mask.sum().clamp(min=1)


@dataclass(frozen=True)
class MetricSums:
    """What the metrics can take from evaluate instead of another pass over (B, T)."""

    policy: Tensor
    """0-d: tokens.policy_loss.sum()."""
    kl_zero: bool
    """tokens.kl is +0.0 at every token."""
    zero_outside: bool
    """tokens.log_ratio is 0 wherever nothing counts and the importance ratio 1 there (no rejection)."""
    ratio_extent: tuple[Tensor, Tensor] | None
    """torch.aminmax of the (B, T) raw importance ratio, when evaluate took it already."""


def breakdown_metrics(
    batch: Batch,
    config: LossConfig,
    flags: dict[str, Tensor],
    tokens: TokenBreakdown,
    rows: RowBreakdown,
    adv: BatchAdvantages,
    mask: Tensor,
    raw_ratio: Tensor,
    sums: MetricSums,
) -> dict[str, float]:
    """Breakdown.metrics of one pass: the objective's ``flags`` (its clip indicators), the trainers' loss, KL,
    length and advantage metrics, and GRPO Lens's own (``lens/``); ``raw_ratio``: the importance ratio before the
    mask, (B, T) or (B, 1)."""
    lengths = rows.length
    counted = lengths.sum()  # counts: exact in either order
    n_tokens = counted.clamp(min=1)
    counted_rows = lengths > 0
    metrics = _flag_metrics(config, flags, mask, lengths, n_tokens)
    any_counted = float(counted) > 0
    ratio_min, ratio_max = ratio_range(tokens, mask, raw_ratio, counted_rows, sums)
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


def _flag_metrics(
    config: LossConfig, flags: dict[str, Tensor], mask: Tensor, lengths: Tensor, n_tokens: Tensor
) -> dict[str, float]:
    """Every objective's metrics (0 where this one defines none), this objective's from its indicator ``flags``."""
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
    return metrics


def ratio_range(
    tokens: TokenBreakdown, mask: Tensor, raw_ratio: Tensor, counted_rows: Tensor, sums: MetricSums
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
