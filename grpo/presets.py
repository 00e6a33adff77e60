"""Presets: named sets of LossConfig choices, data only (``LossConfig.from_preset(name, **overrides)``).

The article's loss is written out. The trainers' presets are their own configs of each recipe, mapped by
``grpo.trainer_fields`` like any run's config, so they hold no second copy of the trainers' defaults and
cannot drift from the mapping a run is checked by. ``PRESETS`` is whole once this module is imported;
``grpo.config`` checks each preset against LossConfig and adds plugins' (``register_preset``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grpo.trainer_fields import TrainerFields, trl_fields, verl_fields


@dataclass(frozen=True)
class Preset:
    """A named set of LossConfig choices, with what it reproduces and where that comes from."""

    name: str
    doc: str
    source: str
    settings: dict[str, Any]


ARTICLE = Preset(
    "article",
    "The article's grpo_loss: clip 0.2, beta 0.01, k3, per-sequence token mean, eps 1e-5.",
    "shared/reference/grpo-loss-analysis.txt (grpo_loss.py)",
    {
        "objective": "clip",
        "epsilon_low": 0.2,
        "epsilon_high": 0.2,
        "beta": 0.01,
        "kl_estimator": "k3",
        "aggregation": "seq-mean-token-mean",
        "advantage": "group",
        "advantage_epsilon": 1e-5,
    },
)

# name -> (the tooltip, where the recipe comes from, the trainer's config fields)
TRL_RECIPES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "trl-grpo": (
        "TRL 1.16 GRPOTrainer, loss_type='grpo': per-sequence token mean, beta 0.",
        "TRL 1.16.0 GRPOConfig defaults with loss_type='grpo'",
        {"loss_type": "grpo"},
    ),
    "trl-dapo": (
        "TRL 1.16 default loss_type='dapo': token mean over the batch, beta 0.",
        "TRL 1.16.0 GRPOConfig defaults (loss_type='dapo')",
        {"loss_type": "dapo"},
    ),
    "trl-dr_grpo": (
        "TRL loss_type='dr_grpo': token sum / (rows x max_completion_length=512).",
        "TRL 1.16.0 GRPOConfig defaults with loss_type='dr_grpo' (TRL's recipe also sets "
        "scale_rewards='none', i.e. advantage='none')",
        {"loss_type": "dr_grpo"},
    ),
    "trl-gspo": (
        "TRL GSPO: loss_type='grpo' with importance_sampling_level='sequence', eps 3e-4/4e-4.",
        "TRL 1.16.0 docs (GSPO paper settings)",
        {"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4},
    ),
    "trl-cispo": (
        "TRL loss_type='cispo': detached weight min(ratio, 5) times A times logp, token mean.",
        "TRL 1.16.0 docs (epsilon_high=5.0 recommended)",
        {"loss_type": "cispo", "epsilon_high": 5.0},
    ),
    "trl-sapo": (
        "TRL loss_type='sapo': soft sigmoid gate (temperatures 1.0 / 1.05), per-sequence mean.",
        "TRL 1.16.0 GRPOConfig defaults with loss_type='sapo'",
        {"loss_type": "sapo"},
    ),
    "trl-vespo": (
        "TRL loss_type='vespo': gamma weight of the row's summed log-ratio (k, λ = 2, 3 / 3, 2) on A·logp, token mean.",
        "TRL 1.16.0 GRPOConfig defaults with loss_type='vespo'",
        {"loss_type": "vespo"},
    ),
}
VERL_RECIPES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "verl-grpo": (
        "verl 0.9.1 GRPO recipe: vanilla clip + dual clip 3, seq-mean-token-mean, low_var_kl 0.001.",
        "loss-variants-spec.md §2.7 (adv_estimator=grpo, use_kl_loss=True, kl_loss_coef=0.001)",
        {"loss_agg_mode": "seq-mean-token-mean", "use_kl_loss": True, "kl_loss_coef": 0.001},
    ),
    "verl-dapo": (
        "verl 0.9.1 DAPO recipe: token-mean, clip 0.2 / 0.28, dual clip 3, no KL.",
        "loss-variants-spec.md §2.7 (clip_ratio_high=0.28, use_kl_loss=False)",
        {"loss_agg_mode": "token-mean", "clip_ratio_high": 0.28},
    ),
    "verl-gspo": (
        "verl 0.9.1 GSPO: sequence ratio (log clamped at 10), seq-mean-token-mean, 3e-4 / 4e-4.",
        "loss-variants-spec.md §2.3 gspo and §2.7",
        {
            "policy_loss": {"loss_mode": "gspo"},
            "loss_agg_mode": "seq-mean-token-mean",
            "clip_ratio_low": 3e-4,
            "clip_ratio_high": 4e-4,
        },
    ),
    "verl-gmpo": (
        "verl 0.9.1 GMPO (loss_mode='geo_mean'): geometric-mean ratio per row, log-ratio clipped to ±0.4.",
        "GMPO paper (arXiv 2507.20673: clip range (e^-0.4, e^0.4)); verl 0.9.1 core_algos geo_mean",
        {"policy_loss": {"loss_mode": "geo_mean"}, "clip_ratio": 0.4},
    ),
    "verl-clip_cov": (
        "verl 0.9.1 Clip-Cov: PPO clip, plus 0.02% of tokens with covariance in (1, 5) cut at random.",
        "verl 0.9.1 PolicyLossConfig defaults with loss_mode='clip_cov' (Entropy-Mechanism paper, arXiv 2505.22617)",
        {"policy_loss": {"loss_mode": "clip_cov"}},
    ),
    "verl-kl_cov": (
        "verl 0.9.1 KL-Cov: unclipped A·ratio, 0.1·|log-ratio| on the 0.02% highest-covariance tokens.",
        "verl 0.9.1 PolicyLossConfig defaults with loss_mode='kl_cov' (Entropy-Mechanism paper, arXiv 2505.22617)",
        {"policy_loss": {"loss_mode": "kl_cov"}},
    ),
    "verl-dppo_tv": (
        "verl 0.9.1 DPPO-TV: tokens whose probability moved by more than 0.2 lose their term; ratio truncated at 3.",
        "verl 0.9.1 ActorConfig / PolicyLossConfig defaults with loss_mode='dppo_tv' (arXiv 2602.04879)",
        {"policy_loss": {"loss_mode": "dppo_tv"}},
    ),
    "verl-dppo_kl": (
        "verl 0.9.1 DPPO-KL: tokens whose binary KL passed 0.2 in their advantage's direction lose their term.",
        "verl 0.9.1 ActorConfig / PolicyLossConfig defaults with loss_mode='dppo_kl' (arXiv 2602.04879)",
        {"policy_loss": {"loss_mode": "dppo_kl"}},
    ),
}


def _recipe(found: TrainerFields) -> dict[str, Any]:
    """A trainer recipe's settings as a preset's (a recipe GRPO Lens does not reproduce is no preset)."""
    assert not found.unsupported, found.unsupported
    return dict(found.settings)


PRESETS: dict[str, Preset] = {
    ARTICLE.name: ARTICLE,
    **{name: Preset(name, doc, source, _recipe(trl_fields(args))) for name, (doc, source, args) in TRL_RECIPES.items()},
    **{
        name: Preset(name, doc, source, _recipe(verl_fields(args)))
        for name, (doc, source, args) in VERL_RECIPES.items()
    },
}
