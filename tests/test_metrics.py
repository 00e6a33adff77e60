"""grpo/metrics.py: the metric lists of the step views, the Runs view and the lab come from one table."""

from __future__ import annotations

import torch
from reference import HAND

import grpo
from app import runview
from grpo import check
from grpo.lab import METRICS as LAB
from grpo.loss import objective_metrics
from grpo.metrics import METRICS, SERIES_METRICS, TOKEN_MEANS


def test_the_derived_lists_are_the_ones_the_views_used() -> None:
    """The lists as they were written by hand before the table (check.py twice, lab/train.py), and the Runs
    view's own addition: the gradient norm GRPO Lens computes, drawn apart from the trainer's grad_norm."""
    assert check.TOKEN_MEANS is TOKEN_MEANS and runview.SERIES_METRICS is SERIES_METRICS
    assert set(TOKEN_MEANS) == {
        "kl",
        "entropy",
        "clip_ratio/low_mean",
        "clip_ratio/high_mean",
        "clip_ratio/region_mean",
        "cispo_clip_ratio",
        "actor/pg_clipfrac",
        "actor/ppo_kl",
        "actor/pg_clipfrac_lower",
    }
    assert set(SERIES_METRICS) == {
        "clip_ratio/low_mean",
        "clip_ratio/high_mean",
        "clip_ratio/region_mean",
        "actor/pg_clipfrac",
        "kl",
        "entropy",
        "completions/mean_length",
        "lens/advantage/std",
        "lens/grad_norm_logps",
    }
    assert LAB[:6] == ("reward", "reward_std", "loss", "policy_loss", "kl_loss", "kl") and LAB[-1] == "grad_norm"


def test_every_breakdown_metric_in_the_table_is_one_evaluate_reports() -> None:
    """A misspelt name would be silently missing from every view: the table's names (the lab's own step
    values aside) are keys of a breakdown's metrics, and each objective metric is in the table but the
    min/max ones, which no step view averages."""
    logp = torch.as_tensor(HAND["per_token_logps"])
    fields = {k: v for k, v in HAND.items() if k != "advantages"}  # rewards and entropies: every metric reported
    # the sampler's log-probs and a rollout correction: TRL's sampling/* metrics are reported too; a MoE
    # router's captured loss: aux_loss
    batch = grpo.Batch(**fields, rewards=[1.0, 0.0], entropies=torch.ones_like(logp), sampling_per_token_logps=logp)
    config = grpo.LossConfig.from_preset(
        "verl-grpo", dtype="float64", rollout_correction="token_truncate", aux_loss_coef=0.01, aux_loss=1.5
    )
    bd = grpo.evaluate(batch, config)
    lab_values = {"loss", "policy_loss", "kl_loss", "grad_norm"}
    assert set(METRICS) - lab_values - set(bd.metrics) == set()
    assert set(objective_metrics()) - set(METRICS) == {"clip_ratio/low_min", "clip_ratio/high_max"}
