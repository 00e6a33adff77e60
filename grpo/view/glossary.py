"""The metrics a GRPO run logs, under each trainer's name: what they mean, what healthy looks like.

``keys`` are the names in ``Breakdown.metrics`` a term explains. Names are TRL 1.16
(``GRPOTrainer._metrics``), verl 0.9.1 (``actor/*`` from the policy loss, ``critic/*`` and
``response_length/*`` from ``metric_utils``) and OpenRLHF 0.11 (its PPO trainer's logged keys);
"—" where the trainer logs no such metric. A key under a trainer's name means what that trainer
means; GRPO Lens's own quantities are under ``lens/``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from grpo.advantages import ADVANTAGES, group_std_mean
from grpo.config import LossConfig
from grpo.corrections import VERL_MISMATCH_METRICS
from grpo.marks import mark, parts_of, plain


@dataclass(frozen=True)
class Term:
    keys: tuple[str, ...]
    """The Breakdown.metrics keys this term explains (empty: shown elsewhere on the page)."""
    trl: str
    verl: str
    openrlhf: str
    meaning: str
    """The meaning with settings by name ("1 + ε_high"): the glossary, which follows no config."""
    healthy: str
    template: str
    """The meaning with {placeholders} for settings (SETTINGS): ``render`` fills in a config's numbers."""

    def render(self, config: LossConfig) -> str:
        """The meaning under ``config``: every setting it names followed by its value there."""
        return plain(self.marked(config))

    def marked(self, config: LossConfig) -> str:
        """``render`` with each number marked with the setting it shows (grpo.marks.mark)."""
        return self.template.format_map({k: show(config) for k, (_, show) in SETTINGS.items()})


def _reward_std(config: LossConfig) -> str:
    spread = ADVANTAGES.entry(config.advantage).reward_std or group_std_mean
    doc = (inspect.getdoc(spread) or "").splitlines()[0]  # "TRL's reward_std under ...: <what>. (n, G) -> ()"
    what = doc.split(": ", 1)[-1].split(".")[0]  # "the mean of the per-group stds"
    return f"{what} (advantage = {config.advantage})"


def _optional(name: str, label: str) -> Callable[[LossConfig], str]:
    def show(config: LossConfig) -> str:
        value = getattr(config, name)
        return f"{label} ({name}, off here)" if value is None else f"{label} ({name}) = {mark(f'config/{name}', value)}"

    return show


# Each placeholder a meaning may hold: (as the glossary writes it, as a config's metrics table writes it).
SETTINGS: dict[str, tuple[str, Callable[[LossConfig], str]]] = {
    "high": ("1 + ε_high", lambda c: f"1 + ε_high = {mark('config/1+epsilon_high', 1 + c.epsilon_high)}"),
    "low": ("1 - ε_low", lambda c: f"1 - ε_low = {mark('config/1-epsilon_low', 1 - c.epsilon_low)}"),
    "eps_high": ("ε_high", lambda c: f"ε_high = {mark('config/epsilon_high', c.epsilon_high)}"),
    "eps_low": ("ε_low", lambda c: f"ε_low = {mark('config/epsilon_low', c.epsilon_low)}"),
    "kl_bias": (
        "kl_bias_correction",
        lambda c: f"kl_bias_correction (TRL use_bias_correction_kl) {'on' if c.kl_bias_correction else 'off'} here",
    ),
    "c": ("c (dual_clip)", _optional("dual_clip", "c")),
    "delta": ("delta", _optional("delta", "delta")),
    "beta": ("beta", lambda c: f"beta = {mark('config/beta', c.beta)}"),
    "aggregation": ("aggregation", lambda c: f"aggregation ({c.aggregation})"),
    "reward_std": (
        "the mean of the per-group stds, or the std over the whole batch under scale_rewards='batch' "
        "(advantage = batch)",
        _reward_std,
    ),
}


def _t(keys: tuple[str, ...], names: tuple[str, str, str], template: str, healthy: str) -> Term:
    meaning = template.format_map({k: symbolic for k, (symbolic, _) in SETTINGS.items()})
    return Term(keys, *names, meaning, healthy, template)


# Meanings that differ under an objective: its registry entry says which metrics it reports, and verl's
# geo_mean computes actor/pg_clipfrac(_lower) on the log-ratio (core_algos.compute_policy_loss_geo_mean).
OBJECTIVE_TERMS: dict[str, tuple[Term, ...]] = {
    "geo_mean": (
        _t(
            ("actor/pg_clipfrac",),
            ("—", "actor/pg_clipfrac (geo_mean)", "—"),
            "GMPO (verl geo_mean): share of ALL counted tokens that have A > 0 and a log-ratio outside "
            "[−ε_low, ε_high] ({eps_low}, {eps_high}), on either side (verl: Σ [log r ≠ clamp(log r)] · [A > 0] / N). "
            "Those above ε_high enter the row's geometric mean at ε_high and get no policy gradient; those below "
            "−ε_low moved against their advantage and enter as they are (the pessimistic side keeps them), yet "
            "are counted too.",
            "About 0 on-policy; a sustained 10-20% or more means updates are too large.",
        ),
        _t(
            ("actor/pg_clipfrac_lower",),
            ("—", "actor/pg_clipfrac_lower (geo_mean)", "—"),
            "GMPO (verl geo_mean): the same count for A < 0: share of ALL counted tokens that have A < 0 and a "
            "log-ratio outside [−ε_low, ε_high] ({eps_low}, {eps_high}), on either side. Not a dual-clip fraction "
            "(geo_mean has none): those below −ε_low are clipped (no policy gradient); those above ε_high are kept "
            "as they are and nothing bounds them.",
            "About 0 on-policy; tokens above ε_high with A < 0 pull their row's loss up without bound.",
        ),
    ),
}


# Under a verl preset TRL's sampling/importance_sampling_ratio is listed beside verl's own names (the table lists
# by objective): what TRL would log for the same correction, which no TRL run applied.
VERL_PRESET_TERMS: tuple[Term, ...] = (
    _t(
        (
            "sampling/importance_sampling_ratio/min",
            "sampling/importance_sampling_ratio/mean",
            "sampling/importance_sampling_ratio/max",
        ),
        ("sampling/importance_sampling_ratio/min, /mean, /max", "rollout_corr/rollout_is_min, _mean, _max", "—"),
        "What TRL would log as its rollout-correction weight for this correction (a verl preset: verl logs the "
        "weight it applies as rollout_corr/rollout_is_*), after truncation or masking: w = π_old / π_sampler per "
        "token (token_* modes, over the counted tokens) or Π_t of it per row (sequence_* modes, over the rows); "
        "truncate clamps w to [C_min, C_max], mask sets it to 0 outside. A min of 0 means whole tokens or rows were "
        "dropped.",
        "Near 1. A mean well above 1 or a min of 0 at every step means the sampler and trainer disagree "
        "by more than the bounds allow (raise the cap, or fix the mismatch).",
    ),
)


def _terms(config: LossConfig) -> tuple[Term, ...]:
    """GLOSSARY, then the config's objective's own meanings, then a verl preset's (each replaces those of the same
    keys)."""
    verl = VERL_PRESET_TERMS if (config.preset or "").startswith("verl-") else ()
    return GLOSSARY + OBJECTIVE_TERMS.get(config.objective, ()) + verl


def metric_meanings(config: LossConfig) -> dict[str, str]:
    """Each metric key's meaning under ``config`` (the metrics table shows these, one per key)."""
    return dict(_meanings(config))


def metric_meaning_parts(config: LossConfig) -> dict[str, list[str | dict[str, Any]]]:
    """``metric_meanings`` with each number apart, tagged with the setting it shows (grpo.marks.parts_of)."""
    return {key: [dict(p) if isinstance(p, dict) else p for p in parts] for key, parts in _meaning_parts(config)}


# A config's texts are the same for every batch: rendered once per config (an answer is built per request).
@lru_cache(maxsize=64)
def _meanings(config: LossConfig) -> tuple[tuple[str, str], ...]:
    return tuple((key, term.render(config)) for term in _terms(config) for key in term.keys)


@lru_cache(maxsize=64)
def _meaning_parts(config: LossConfig) -> tuple[tuple[str, list[str | dict[str, Any]]], ...]:
    return tuple((key, parts_of(term.marked(config))) for term in _terms(config) for key in term.keys)


GLOSSARY: tuple[Term, ...] = (
    _t(
        (),
        ("loss", "actor/pg_loss (+ kl_coef · actor/kl_loss)", "policy_loss"),
        "The scalar that is backpropagated: minus the objective. Its sign and size depend on the batch's "
        "advantages, the clip and the KL; adding a constant would not change training.",
        "Any sign. Near 0 on-policy is normal. Judge training by reward, KL and clip fraction, not by the loss.",
    ),
    _t(
        ("clip_ratio/region_mean", "actor/pg_clipfrac"),
        ("clip_ratio/region_mean", "actor/pg_clipfrac", "clip_ratio"),
        "Fraction of counted tokens clipped at a bound of the clipped surrogate (A > 0 with r > {high}, or A < 0 "
        "with r < {low}; verl: Σ [clip(r)·A < r·A] / N): these get no policy gradient. Tokens held by the dual "
        "clip {c} or capped by {delta} get none either but are not counted here (actor/pg_clipfrac_lower counts "
        "the dual-clip ones). TRL at sequence level: the mean over rows of each row's flag.",
        "Exactly 0 on-policy (one update per batch). A few percent with several updates per batch; a sustained "
        "10-20% or more means updates are too large.",
    ),
    _t(
        ("clip_ratio/low_mean", "clip_ratio/low_min"),
        ("clip_ratio/low_mean, clip_ratio/low_min", "—", "—"),
        "Share of ALL counted tokens (not of the A < 0 ones) that have A < 0 and a ratio below "
        "{low}, i.e. clipped on the low side: Σ [A < 0 and r < 1 - ε_low] / N (low_mean). low_min (TRL): the same "
        "indicator averaged within each sequence, then the smallest of those per-sequence fractions.",
        "Small; compare with high_mean to see which side clipping acts on. Not verl's pg_clipfrac_lower.",
    ),
    _t(
        ("clip_ratio/high_mean", "clip_ratio/high_max"),
        ("clip_ratio/high_mean, clip_ratio/high_max", "—", "—"),
        "Share of ALL counted tokens that have A > 0 and a ratio above {high}, i.e. clipped on the "
        "high side: Σ [A > 0 and r > 1 + ε_high] / N (high_mean; DAPO's clip-higher raises {eps_high} to let these "
        "grow). "
        "high_max (TRL): the largest per-sequence fraction of such tokens.",
        "Small. If it dominates, raising ε_high (clip-higher) lets good tokens move further.",
    ),
    _t(
        ("actor/pg_clipfrac_lower",),
        ("— (delta plays this role)", "actor/pg_clipfrac_lower", "—"),
        "Fraction of counted tokens with A < 0 whose ratio passed the dual-clip bound {c}, verl's clip_ratio_c: "
        "the dual-clip fraction, not a low-side clip fraction; with the dual clip off it counts nothing.",
        "About 0. Non-zero means some bad tokens became far more likely than when sampled.",
    ),
    _t(
        ("vespo/phi_seq_mean",),
        ("vespo/phi_seq_mean", "—", "—"),
        "VESPO: the mean over rows of each row's gamma weight φ(w) = e^λ·w^k·e^(−λw), w the row's summed "
        "importance ratio; φ(1) = 1, and far off-policy rows get a weight near 0.",
        "Near 1 on-policy; well below 1 means many rows are far off-policy and barely update.",
    ),
    _t(
        ("entropy_coef", "actor/entropy_loss", "policy_loss"),
        ("entropy_coef, policy_loss", "actor/entropy_loss", "—"),
        "The entropy bonus: the loss is the policy part (TRL's policy_loss) minus entropy_coef times the mean "
        "entropy (verl's actor/entropy_loss is that mean, weighted as the loss weights its tokens; TRL takes the "
        "plain mean over the tokens the policy term acts on). The entropies are inputs: the bonus moves the loss, "
        "not the gradient of the log-probs shown here.",
        "A small coefficient (1e-3 to 1e-2); TRL's adaptive control raises it while the entropy sits at or below "
        "its target.",
    ),
    _t(
        ("aux_loss",),
        ("aux_loss", "—", "—"),
        "A Mixture-of-Experts model's router load-balancing loss, as the model returned it for the micro-batch. "
        "TRL adds router_aux_loss_coef · aux_loss / gradient_accumulation_steps to the loss. It comes from the "
        "router's logits, not the tokens' log-probs: GRPO Lens adds the captured value, it does not recompute it.",
        "Near its floor when the experts share the tokens evenly; rising means the router is collapsing onto few "
        "experts.",
    ),
    _t(
        ("cispo_clip_ratio",),
        ("cispo_clip_ratio", "actor/pg_clipfrac (cispo)", "—"),
        "CISPO: fraction of A > 0 tokens whose ratio passed the cap; their weight is capped but they keep a gradient.",
        "Small; CISPO never silences a token, so a larger value is less alarming than for PPO's clip.",
    ),
    _t(
        ("kl",),
        ("kl", "actor/kl_loss", "kl"),
        "Mean per-token estimate of KL(π_θ ‖ π_ref) over the counted tokens, a plain token mean whatever the "
        "aggregation: kl = Σ kl_t / N (k3 unless chosen otherwise; TRL multiplies each kl_t by the token's ratio "
        "when use_bias_correction_kl is on, TRL's default; {kl_bias}, so TRL's and verl's kl differ for the same "
        "batch as soon as a ratio is not 1). verl's actor/kl_loss is the same estimate aggregated like the loss "
        "(e.g. a mean of per-row means), so the two differ when rows differ in length; the KL part of the loss "
        "is {beta} × actor/kl_loss.",
        "Starts at 0 and grows slowly. Sudden spikes mean the policy is leaving the reference; a few tokens "
        "with π ≪ π_ref can dominate (k3 grows exponentially).",
    ),
    _t(
        ("actor/ppo_kl",),
        ("—", "actor/ppo_kl", "ppo_kl"),
        "Mean of log π_old - log π_θ over the tokens: how far the current policy moved from the old one "
        "(old_per_token_logps; a separate sampler's log-probs, vLLM's, are compared in the Mismatch view).",
        "0 on-policy; small (|value| below about 0.01) when updates are well-sized.",
    ),
    _t(
        ("actor/kl_loss",),
        ("— (TRL logs kl)", "actor/kl_loss", "—"),
        "The KL estimate aggregated as the loss aggregates its tokens, with its {aggregation}: under "
        "seq-mean-token-mean Σ_i (Σ_t kl_it / |o_i|) / B, under token-mean Σ kl_t / N; the loss's KL part is "
        "{beta} × actor/kl_loss. kl is instead the plain token mean Σ kl_t / N.",
        "Behaves like kl; equal to it when every row has the same length or the aggregation is token-mean.",
    ),
    _t(
        ("actor/pg_loss", "actor/kl_coef"),
        ("— (TRL logs the total loss)", "actor/pg_loss, actor/kl_loss, actor/kl_coef", "policy_loss, kl"),
        "verl's parts of the loss: the aggregated policy loss, the aggregated KL before its coefficient, and the "
        "coefficient {beta} (kl_loss_coef); loss = pg_loss + kl_coef · kl_loss.",
        "pg_loss near 0 on-policy; kl_loss behaves like kl.",
    ),
    _t(
        (),
        ("advantage estimator: group / batch / none", "adv_estimator (grpo, ...)", "advantage_estimator"),
        "group: A_i = (R_i − mean_g R) / (std_g R + eps), per group of completions of one prompt (GRPO). batch: "
        "centred per group, divided by the std of the whole batch. none: A_i = R_i − mean_g R, centred and not "
        "divided by any std (Dr. GRPO), so the scale follows the rewards.",
        "group is the default; none avoids the question-level difficulty bias of the std; the std is the "
        "unbiased one, eps as each trainer sets it.",
    ),
    _t(
        (),
        ("KL estimator: k1 / k2 / k3", "kl_loss_type: kl / mse / low_var_kl", "kl_estimator"),
        "With x = ref − logp per token: k1 = −x = logp − ref (unbiased for samples from the current policy, "
        "negative wherever π < π_ref, gradient 1 per token); k2 = x² / 2 (never negative, gradient −x); "
        "k3 = eˣ − x − 1 (never negative, unbiased for samples from the current policy, "
        "gradient 1 − eˣ, grows exponentially when π ≪ π_ref). Schulman's approximations of KL(π_θ ‖ π_ref).",
        "k3 is TRL's and verl's default (verl clamps it to ±10); k1 can make beta·KL negative.",
    ),
    _t(
        (),
        ("aggregation: loss_type", "loss_agg_mode", "—"),
        "How per-token terms ℓ_it become the loss. seq-mean-token-mean: (1/B) Σ_i (1/|o_i|) Σ_t ℓ_it (GRPO). "
        "token-mean: Σ_it ℓ_it / Σ_i |o_i| (DAPO). seq-mean-token-sum: (1/B) Σ_i Σ_t ℓ_it. seq-mean-token-sum-norm: "
        "Σ_it ℓ_it / (B · L) with L = max_completion_length (Dr. GRPO).",
        "Per-sequence means weigh a short row's tokens more (length bias); token-mean and Dr. GRPO's constant do not.",
    ),
    _t(
        ("entropy",),
        ("entropy", "actor/entropy", "entropy"),
        "Mean entropy of the policy's next-token distribution over the tokens that count (needs logits).",
        "Decreases slowly. A collapse towards 0 early means the policy stopped exploring.",
    ),
    _t(
        ("reward",),
        ("reward", "critic/score/mean", "reward"),
        "Mean reward of the batch's completions.",
        "Rises over training; the real measure of progress.",
    ),
    _t(
        ("reward_std",),
        ("reward_std", "critic/score/std", "—"),
        "The spread of the rewards as TRL logs it: {reward_std}.",
        "Non-zero: the groups contain a signal to learn from.",
    ),
    _t(
        ("frac_reward_zero_std",),
        ("frac_reward_zero_std", "— (DAPO's filter_groups drops these groups)", "—"),
        "Fraction of groups whose completions all got the same reward: their advantages are 0 and they add "
        "no policy gradient.",
        "Low. Near 1 means the prompts are all too easy or all too hard: no signal.",
    ),
    _t(
        ("completions/mean_length", "completions/min_length", "completions/max_length"),
        ("completions/mean_length", "response_length/mean", "response_length"),
        "Mean (min, max) number of counted completion tokens per row.",
        "Stable or slowly changing; jumps often come with length bias of the aggregation.",
    ),
    _t(
        ("lens/num_tokens",),
        ("— (num_tokens is a running total of prompt and completion tokens)", "—", "—"),
        "GRPO Lens: the number of counted completion tokens in this batch.",
        "Whatever the batch holds; the divisor of token-mean.",
    ),
    _t(
        ("lens/grad_norm_logps",),
        ("— (grad_norm is of the model's parameters)", "— (actor/grad_norm: parameters)", "—"),
        "GRPO Lens: the norm of d loss / d log-prob over the tokens, the signal before it reaches the model. "
        "Trainers log the parameter-gradient norm, which also depends on the model.",
        "Non-zero whenever advantages are; a zero loss with a non-zero gradient norm is normal on-policy.",
    ),
    _t(
        ("lens/ratio/min", "lens/ratio/mean", "lens/ratio/max"),
        ("— (sampling/importance_sampling_ratio is vLLM's)", "—", "—"),
        "GRPO Lens: importance ratio π_θ / π_old over the tokens (min, mean, max).",
        "Exactly 1 on-policy; within 1 ± ε for most tokens when updates are well-sized.",
    ),
    _t(
        ("sampling/sampling_logp_difference/mean", "sampling/sampling_logp_difference/max"),
        ("sampling/sampling_logp_difference/mean, /max", "rollout_corr/kl (signed, a mean)", "—"),
        "How far the sampler's log-probs (vLLM's) are from the trainer's old ones on the same tokens: "
        "|log π_old − log π_sampler| over the counted tokens the sampler scored (mean, max). TRL logs it per "
        "generation batch, when use_vllm and its importance-sampling correction are on.",
        "Small: about 1e-3 to 1e-2 per token for bf16 engines. Larger means the two engines disagree (a "
        "kernel or precision mismatch, stale weights) and the correction has much to fix.",
    ),
    _t(
        (
            "sampling/importance_sampling_ratio/min",
            "sampling/importance_sampling_ratio/mean",
            "sampling/importance_sampling_ratio/max",
        ),
        ("sampling/importance_sampling_ratio/min, /mean, /max", "rollout_corr/rollout_is_min, _mean, _max", "—"),
        "The rollout-correction weight TRL applied to the policy term, after truncation or masking: "
        "w = π_old / π_sampler per token (token_* modes, over the counted tokens) or Π_t of it per row "
        "(sequence_* modes, over the rows); truncate clamps w to [C_min, C_max], mask sets it to 0 outside. "
        "A min of 0 means whole tokens or rows were dropped.",
        "Near 1. A mean well above 1 or a min of 0 at every step means the sampler and trainer disagree "
        "by more than the bounds allow (raise the cap, or fix the mismatch).",
    ),
    _t(
        tuple(f"rollout_corr/{name}" for name in VERL_MISMATCH_METRICS),
        ("— (sampling/sampling_logp_difference)", "rollout_corr/*", "—"),
        "verl's mismatch diagnostics, old vs sampler log-probs over the counted tokens the sampler scored: "
        "training_ppl / rollout_ppl = the mean over rows of exp(−mean log-prob of the row) (log_ppl: without the "
        "exp); kl = mean(log π_sampler − log π_old); k3_kl = mean(ρ − log ρ − 1) with ρ = π_old / π_sampler; "
        "log_ppl_diff = per row mean log π_sampler − mean log π_old (mean, mean of |·|, max, min); ppl_ratio = "
        "mean over rows of exp(log_ppl_diff); chi2_token = mean(ρ²) − 1; chi2_seq = mean over rows of "
        "(Π_t ρ_t)² − 1 (logs clamped at verl's SAFETY_BOUND, so ρ stays within e^±SAFETY_BOUND). chi2_token and "
        "chi2_seq are sample estimates over the drawn tokens, not the divergence itself (which is never negative): "
        "they fall below 0 when the trainer gives the sampled tokens less probability than the sampler did (ρ < 1 "
        "on most of them, mean(ρ²) < 1), as verl logs them.",
        "kl and k3_kl near 0 and ppl_ratio near 1 when the engines agree; chi2_seq grows with length and "
        "explodes first: sequence-level IS weights then need a tight threshold or a mask.",
    ),
    _t(
        ("lens/advantage/mean", "lens/advantage/std"),
        ("—", "critic/advantages/mean", "advantages"),
        "GRPO Lens: mean (and std) of the advantages over the rows; group-normalised advantages average 0 "
        "within each group.",
        "About 0 with group normalisation; the spread matters more than the mean.",
    ),
)
