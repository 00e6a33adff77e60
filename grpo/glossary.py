"""The metrics a GRPO run logs, under each trainer's name: what they mean, what healthy looks like.

``key`` is the name in ``Breakdown.metrics`` (None: a concept the breakdown shows elsewhere).
Names are TRL 1.16 (``GRPOTrainer._metrics``), verl 0.9.1 (``actor/*`` from the policy loss,
``critic/*`` and ``response_length/*`` from ``metric_utils``) and OpenRLHF 0.11 (its PPO trainer's
logged keys); "—" where the trainer logs no such metric.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Term:
    key: str | None
    trl: str
    verl: str
    openrlhf: str
    meaning: str
    healthy: str


GLOSSARY: tuple[Term, ...] = (
    Term(
        None,
        "loss",
        "actor/pg_loss (+ kl_coef · actor/kl_loss)",
        "policy_loss",
        "The scalar that is backpropagated: minus the objective. Its sign and size depend on the batch's "
        "advantages, the clip and the KL; adding a constant would not change training.",
        "Any sign. Near 0 on-policy is normal. Judge training by reward, KL and clip fraction, not by the loss.",
    ),
    Term(
        "clip_ratio/region_mean",
        "clip_ratio/region_mean",
        "actor/pg_clipfrac",
        "clip_ratio",
        "Fraction of tokens on a flat part of the clipped surrogate (A > 0 with r > 1 + ε_high, or A < 0 with "
        "r < 1 - ε_low): they get no policy gradient.",
        "Exactly 0 on-policy (one update per batch). A few percent with several updates per batch; a sustained "
        "10-20% or more means updates are too large.",
    ),
    Term(
        "clip_ratio/low_mean",
        "clip_ratio/low_mean",
        "—",
        "—",
        "Fraction of tokens with A < 0 whose ratio fell below 1 - ε_low (clipped on the low side).",
        "Small; compare with high_mean to see which side clipping acts on. Not verl's pg_clipfrac_lower.",
    ),
    Term(
        "clip_ratio/high_mean",
        "clip_ratio/high_mean",
        "—",
        "—",
        "Fraction of tokens with A > 0 whose ratio rose above 1 + ε_high (clipped on the high side; DAPO's "
        "clip-higher raises ε_high to let these grow).",
        "Small. If it dominates, raising ε_high (clip-higher) lets good tokens move further.",
    ),
    Term(
        "actor/pg_clipfrac_lower",
        "— (delta plays this role)",
        "actor/pg_clipfrac_lower",
        "—",
        "Fraction of tokens with A < 0 whose ratio passed the dual-clip bound c (verl clip_ratio_c = 3): "
        "the dual-clip fraction, not a low-side clip fraction.",
        "About 0. Non-zero means some bad tokens became far more likely than when sampled.",
    ),
    Term(
        "cispo_clip_ratio",
        "cispo_clip_ratio",
        "actor/pg_clipfrac (cispo)",
        "—",
        "CISPO: fraction of A > 0 tokens whose ratio passed the cap; their weight is capped but they keep a gradient.",
        "Small; CISPO never silences a token, so a larger value is less alarming than for PPO's clip.",
    ),
    Term(
        "kl",
        "kl",
        "actor/kl_loss",
        "kl",
        "Mean per-token estimate of KL(π_θ ‖ π_ref) over the tokens that count (k3 unless chosen otherwise; "
        "TRL multiplies it by the ratio when use_bias_correction_kl is on).",
        "Starts at 0 and grows slowly. Sudden spikes mean the policy is leaving the reference; a few tokens "
        "with π ≪ π_ref can dominate (k3 grows exponentially).",
    ),
    Term(
        "actor/ppo_kl",
        "—",
        "actor/ppo_kl",
        "ppo_kl",
        "Mean of log π_old - log π_θ over the tokens: how far the current policy moved from the sampling policy.",
        "0 on-policy; small (|value| below about 0.01) when updates are well-sized.",
    ),
    Term(
        "entropy",
        "entropy",
        "actor/entropy",
        "entropy",
        "Mean entropy of the policy's next-token distribution over the tokens that count (needs logits).",
        "Decreases slowly. A collapse towards 0 early means the policy stopped exploring.",
    ),
    Term(
        "reward",
        "reward",
        "critic/score/mean",
        "reward",
        "Mean reward of the batch's completions.",
        "Rises over training; the real measure of progress.",
    ),
    Term(
        "reward_std",
        "reward_std",
        "critic/score/std",
        "—",
        "Standard deviation of the rewards (TRL: the mean of the per-group stds).",
        "Non-zero: the groups contain a signal to learn from.",
    ),
    Term(
        "frac_reward_zero_std",
        "frac_reward_zero_std",
        "— (DAPO filter_groups drops these)",
        "—",
        "Fraction of groups whose completions all got the same reward: their advantages are 0 and they add "
        "no policy gradient.",
        "Low. Near 1 means the prompts are all too easy or all too hard: no signal.",
    ),
    Term(
        "completions/mean_length",
        "completions/mean_length",
        "response_length/mean",
        "response_length",
        "Mean number of counted completion tokens per row.",
        "Stable or slowly changing; jumps often come with length bias of the aggregation.",
    ),
    Term(
        "grad_norm",
        "grad_norm (of the model's parameters)",
        "actor/grad_norm (parameters)",
        "—",
        "Here: the norm of d loss / d log-prob over the tokens, the signal before it reaches the model. "
        "Trainers log the parameter-gradient norm, which also depends on the model.",
        "Non-zero whenever advantages are; a zero loss with a non-zero grad_norm is normal on-policy.",
    ),
    Term(
        "ratio/mean",
        "— (sampling/importance_sampling_ratio is vLLM's)",
        "—",
        "—",
        "Importance ratio π_θ / π_old over the tokens (min, mean, max).",
        "Exactly 1 on-policy; within 1 ± ε for most tokens when updates are well-sized.",
    ),
    Term(
        "advantage/mean",
        "—",
        "critic/advantages/mean",
        "advantages",
        "Mean advantage over the rows; group-normalised advantages average 0 within each group.",
        "About 0 with group normalisation; the spread matters more than the mean.",
    ),
)
