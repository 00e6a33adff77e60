"""The metrics the views show, written once: how each combines over a step and which views draw it.

Names are the trainers' own (``Breakdown.metrics``; the objectives' entries say which clip metrics they
report and how each reduces within a micro-batch) plus the lab's step values (``loss``, ``grad_norm``).
``grpo.check`` (a step's token-weighted means, the Runs view's series) and ``grpo.lab`` (what every
step logs) take their lists from this table.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from grpo.corrections import SAMPLING_METRICS, VERL_MISMATCH_METRICS
from grpo.objectives import OBJECTIVES


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
