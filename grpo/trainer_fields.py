"""TRL 1.16 ``GRPOConfig`` and verl 0.9.1's actor config, field by field, as LossConfig settings.

Every field of the trainer's config lands in exactly one place of the returned ``TrainerFields``:
``mapped`` (it set LossConfig settings), ``captured`` (its effect is already in the tensors a capture
records: sampling temperature, truncation masks, reward weights...), ``unsupported`` (set to a value
that changes the loss in a way GRPO Lens does not reproduce; the reason says how) or ``unused``
(it does not change the loss of a batch: learning rate, logging...). Nothing is dropped silently.
The settings are a plain dict, so ``grpo.config`` (LossConfig.from_trl) and ``grpo.presets`` build on
them; ``grpo.trainer_config`` turns them into a checked LossConfig.
Semantics: shared/reference/loss-variants-spec.md §1 (TRL) and §2 (verl).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from grpo.advantages import ADVANTAGES
from grpo.corrections import CORRECTIONS, SAFETY_BOUND, rs_criteria
from grpo.errors import GrpoInputError
from grpo.objectives import OBJECTIVES

# The objectives' own settings by the trainer config field they map from (their registrations declare it):
# TRL GRPOConfig fields, verl actor fields, and verl's actor.policy_loss fields.
TRL_DECLARED = {s.trl: s for s in OBJECTIVES.settings() if s.trl is not None}
VERL_ACTOR_DECLARED = {s.verl: s for s in OBJECTIVES.settings() if s.verl is not None and "." not in s.verl}
VERL_POLICY_LOSS_PREFIX = "policy_loss."
VERL_POLICY_LOSS_DECLARED = tuple(
    s for s in OBJECTIVES.settings() if s.verl is not None and s.verl.startswith(VERL_POLICY_LOSS_PREFIX)
)

# TRL 1.16.0 GRPOConfig defaults for the fields that matter to the loss (spec §1.11); a dict given to
# from_trl falls back to these.
TRL_DEFAULTS: dict[str, Any] = {
    "loss_type": "dapo",
    "beta": 0.0,
    "epsilon": 0.2,
    "epsilon_high": None,
    "delta": None,
    "importance_sampling_level": "token",
    "scale_rewards": "group",
    "max_completion_length": 512,
    **{name: s.default for name, s in TRL_DECLARED.items()},
    "use_bias_correction_kl": True,
    "gradient_accumulation_steps": 1,
    "top_entropy_quantile": 1.0,
    "off_policy_mask_threshold": None,
    "use_vllm": False,
    "vllm_importance_sampling_correction": True,
    "vllm_importance_sampling_mode": "sequence_mask",
    "vllm_importance_sampling_clip_min": None,
    "vllm_importance_sampling_clip_max": 3.0,
    "vllm_importance_sampling_cap": None,
    "entropy_coef": 0.0,
    "use_adaptive_entropy": False,
    "router_aux_loss_coef": None,
}
# loss_type -> (objective, aggregation); the aggregation divides by the trainer's normaliser (below).
TRL_LOSS_TYPES: dict[str, tuple[str, str]] = {
    "grpo": ("clip", "seq-mean-token-mean"),
    "bnpo": ("clip", "token-mean"),
    "dr_grpo": ("clip", "seq-mean-token-sum-norm"),
    "dapo": ("clip", "token-mean"),
    "luspo": ("clip", "seq-mean-token-sum"),
    "cispo": ("cispo", "token-mean"),
    "sapo": ("sapo", "seq-mean-token-mean"),
    "vespo": ("vespo", "token-mean"),  # dapo's normaliser
}
# TRL fields that set LossConfig fields one to one (or nearly): trainer field -> where it went
TRL_MAPPED: dict[str, str] = {
    "loss_type": "objective, aggregation",
    "epsilon": "epsilon_low (and epsilon_high when that is None)",
    "epsilon_high": "epsilon_high",
    "delta": "delta",
    "beta": "beta",
    "use_bias_correction_kl": "kl_bias_correction",
    "importance_sampling_level": "importance_sampling_level",
    "scale_rewards": "advantage",
    "max_completion_length": "max_completion_length",
    **{name: s.name for name, s in TRL_DECLARED.items()},
}
# Loss types whose returned loss is divided by gradient_accumulation_steps (spec §1.8); the others
# (dapo, cispo) divide by a token count over the generation batch instead (token_normalizer).
TRL_DIVIDED_BY_GA = ("grpo", "bnpo", "dr_grpo", "sapo", "luspo")
TRL_CAPTURED: dict[str, str] = {
    "num_generations": "rows of one prompt: the captured row_groups",
    "temperature": "applied to the logits before the captured log-probs",
    "top_p": "sampling: in the captured completions",
    "top_k": "sampling: in the captured completions",
    "min_p": "sampling: in the captured completions",
    "repetition_penalty": "sampling: in the captured completions",
    "generation_kwargs": "sampling: in the captured completions",
    "mask_truncated_completions": "in the captured completion_mask",
    "num_iterations": "in the captured old_per_token_logps",
    "steps_per_generation": "in the captured old log-probs and token_normalizer (dapo, cispo)",
    "generation_batch_size": "in the captured token_normalizer (dapo, cispo)",
    "reward_weights": "in the trainer's advantages, captured as given",
    "multi_objective_aggregation": "in the trainer's advantages, captured as given",
    "cast_lm_head_to_fp32": "in the captured log-probs",
    "disable_dropout": "in the captured log-probs",
}


@dataclass(frozen=True)
class TrainerFields:
    """A trainer config as LossConfig settings, and where each of its fields went."""

    settings: dict[str, Any]
    """LossConfig field -> value, for the fields the trainer's config decides."""
    mapped: dict[str, str] = field(default_factory=dict)
    """trainer field -> the LossConfig field(s) it set."""
    captured: dict[str, str] = field(default_factory=dict)
    """trainer field -> where its effect is in the captured tensors."""
    unsupported: dict[str, str] = field(default_factory=dict)
    """trainer field -> why GRPO Lens does not reproduce its effect on the loss."""
    unused: tuple[str, ...] = ()
    """Fields that do not change the loss of a batch (optimiser, logging, generation engine...)."""
    recipe: str | None = None
    """The preset named after the trainer's loss (``trl-dapo``), which labels the config when it exists."""

    @property
    def warnings(self) -> list[str]:
        return [f"{name}: {why}" for name, why in self.unsupported.items()]


def _fields(args: Any) -> dict[str, Any]:
    """A config object (dataclass, OmegaConf, mapping) as a plain dict of its fields."""
    if isinstance(args, Mapping):
        return {str(k): _plain(v) for k, v in args.items()}
    if type(args).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        container = OmegaConf.to_container(args, resolve=True)
        assert isinstance(container, dict)
        return {str(k): v for k, v in container.items()}
    if dataclasses.is_dataclass(args) and not isinstance(args, type):
        return {f.name: _plain(getattr(args, f.name)) for f in dataclasses.fields(args) if not f.name.startswith("_")}
    raise GrpoInputError(
        "config", "a trainer config: a dataclass, an OmegaConf object or a dict", got=type(args).__name__
    )


def _plain(value: Any) -> Any:
    if (dataclasses.is_dataclass(value) and not isinstance(value, type)) or type(value).__module__.startswith(
        "omegaconf"
    ):
        return _fields(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _finish(fields: dict[str, Any], settings: dict[str, Any], mapped: dict[str, str], **rest: Any) -> TrainerFields:
    captured, unsupported = rest.get("captured", {}), rest.get("unsupported", {})
    known = set(mapped) | set(captured) | set(unsupported)
    unused = tuple(sorted(name for name in fields if name not in known))
    return TrainerFields(settings, mapped, captured, unsupported, unused, rest.get("recipe"))


def trl_fields(args: Any) -> TrainerFields:
    """A TRL 1.16 ``GRPOConfig`` (or a dict of its fields) as LossConfig settings, with where each field went
    (what the settings reproduce: ``grpo.trainer_config.map_trl``)."""
    given = _fields(args)
    a = {**TRL_DEFAULTS, **given}
    mapped: dict[str, str] = {}
    unsupported: dict[str, str] = {}
    loss_type = a["loss_type"]
    if loss_type not in TRL_LOSS_TYPES:
        raise GrpoInputError(
            "loss_type", f"a TRL loss_type GRPO Lens reproduces: {', '.join(TRL_LOSS_TYPES)}", got=repr(loss_type)
        )
    objective, aggregation = TRL_LOSS_TYPES[loss_type]
    epsilon_high = a["epsilon"] if a["epsilon_high"] is None else a["epsilon_high"]
    scale = a["scale_rewards"]
    advantage = {True: "group", False: "none"}.get(scale, scale) if isinstance(scale, bool) else scale
    if advantage not in ("group", "batch", "none"):
        raise GrpoInputError("scale_rewards", "group, batch, none, True or False", got=repr(scale))
    settings: dict[str, Any] = {
        "objective": objective,
        "aggregation": aggregation,
        "epsilon_low": float(a["epsilon"]),
        "epsilon_high": float(epsilon_high),
        "delta": a["delta"],
        "cispo_bounds": "absolute",
        "beta": float(a["beta"]),
        "kl_estimator": "k3",
        "kl_bias_correction": bool(a["use_bias_correction_kl"]),
        "importance_sampling_level": a["importance_sampling_level"],
        "advantage": advantage,
        "advantage_epsilon": 1e-4,
        "max_completion_length": int(a["max_completion_length"]),
        "skip_empty_rows": False,
        **{s.name: s.type(a[name]) for name, s in TRL_DECLARED.items()},
        "gradient_accumulation_steps": int(a["gradient_accumulation_steps"]) if loss_type in TRL_DIVIDED_BY_GA else 1,
    }
    mapped |= TRL_MAPPED | {
        "gradient_accumulation_steps": "gradient_accumulation_steps"
        if loss_type in TRL_DIVIDED_BY_GA
        else "token_normalizer (with num_items_in_batch, set by the capture)",
    }
    if a.get("multi_objective_aggregation") == "normalize_then_sum":  # per reward function, then over the batch
        settings["advantage"] = "normalize-then-sum"
        mapped["multi_objective_aggregation"] = (
            "advantage normalize-then-sum (rewards per function (B, K) and reward_weights: batch fields); "
            "sum_then_normalize, TRL's default: Σ w·r, then scale_rewards"
        )
    settings["top_entropy_quantile"] = float(a["top_entropy_quantile"])
    mapped["top_entropy_quantile"] = "top_entropy_quantile (the quantile over one rank's entropies: on several, TRL's "
    "is over all ranks')"
    _map_trl_rollout_correction(a, settings, mapped)
    _map_trl_entropy_and_router(a, "router_aux_loss_coef" in given, settings, mapped)
    captured = {k: v for k, v in TRL_CAPTURED.items() if k in given}
    return _finish(given, settings, mapped, unsupported=unsupported, captured=captured, recipe=f"trl-{loss_type}")


def _map_trl_entropy_and_router(
    a: dict[str, Any], router_given: bool, settings: dict[str, Any], mapped: dict[str, str]
) -> None:
    """TRL's entropy bonus (its adaptive coefficient too) and a Mixture-of-Experts router's loss."""
    settings["entropy_coef"] = float(a["entropy_coef"])
    settings["entropy_weighting"] = "tokens"
    # TRL divides the bonus by gradient_accumulation_steps for every loss type (dapo/cispo/vespo too)
    settings["entropy_accumulation_steps"] = int(a["gradient_accumulation_steps"])
    mapped["entropy_coef"] = "entropy_coef (the mean entropy over the tokens the policy term acts on, ÷ GA: "
    "entropy_accumulation_steps)"
    if a["use_adaptive_entropy"]:
        mapped["use_adaptive_entropy"] = (
            "entropy_coef: a step applies the controller's coefficient, entropy_coef while the last window's "
            "entropy <= entropy_target, else 0; after each optimiser step the coefficient moves by "
            "entropy_coef_delta (up when the window's entropy <= entropy_target, else down) within "
            "[entropy_coef_min, entropy_coef_max]. The config gives the first step's; a captured step's own is "
            "its logged entropy_coef"
        )
    if a["router_aux_loss_coef"] is not None:
        settings["aux_loss_coef"] = float(a["router_aux_loss_coef"])
    if router_given:
        mapped["router_aux_loss_coef"] = (
            "aux_loss_coef (None: the model's own coefficient, set per step by the capture), with the router loss the "
            "model returned captured as aux_loss and divided by entropy_accumulation_steps, as TRL adds it"
        )


def _map_trl_rollout_correction(a: dict[str, Any], settings: dict[str, Any], mapped: dict[str, str]) -> None:
    """TRL's vLLM importance-sampling correction and off-policy sequence mask (grpo.corrections).

    TRL applies the IS weights only with ``use_vllm`` and ``vllm_importance_sampling_correction`` (both its
    defaults but the first); the deprecated ``vllm_importance_sampling_cap`` sets clip_max, as GRPOConfig
    does. (loss_type="vespo" takes the weight inside its own phi instead of multiplying the loss by it.)
    """
    mode = a["vllm_importance_sampling_mode"]
    if mode not in CORRECTIONS or mode == "none":
        raise GrpoInputError(
            "vllm_importance_sampling_mode",
            "token_truncate, token_mask, sequence_truncate or sequence_mask",
            got=repr(mode),
        )
    high = a["vllm_importance_sampling_clip_max"]
    high = a["vllm_importance_sampling_cap"] if a["vllm_importance_sampling_cap"] is not None else high
    on = bool(a["use_vllm"] and a["vllm_importance_sampling_correction"])
    settings |= {
        "rollout_correction": mode if on else "none",
        "rollout_is_min": a["vllm_importance_sampling_clip_min"],
        "rollout_is_max": high,
        "off_policy_mask_threshold": a["off_policy_mask_threshold"],
    }
    applied = "" if on else " (off: TRL applies it only with use_vllm and vllm_importance_sampling_correction)"
    mapped |= {
        "use_vllm": "rollout_correction (TRL weighs the sampler's log-probs only with vLLM)",
        "vllm_importance_sampling_correction": "rollout_correction" + applied,
        "vllm_importance_sampling_mode": "rollout_correction" + applied,
        "vllm_importance_sampling_clip_min": "rollout_is_min",
        "vllm_importance_sampling_clip_max": "rollout_is_max",
        "vllm_importance_sampling_cap": "rollout_is_max (deprecated spelling of clip_max)",
        "off_policy_mask_threshold": "off_policy_mask_threshold (against the sampler's log-probs, else the old ones)",
    }


# verl 0.9.1: policy_loss.loss_mode -> LossConfig settings (spec §2.3)
VERL_LOSS_MODES: dict[str, dict[str, Any]] = {
    "vanilla": {"objective": "clip", "log_ratio_clamp": SAFETY_BOUND},
    "gspo": {
        "objective": "clip",
        "importance_sampling_level": "sequence",
        "sequence_ratio_gradient": "token",  # sg(s)·pi/sg(pi): each token's gradient carries its own advantage
        "seq_log_ratio_clamp": 10.0,
        "dual_clip": None,
        "log_ratio_clamp": None,
    },
    "sapo": {
        "objective": "sapo",
        "log_ratio_clamp": SAFETY_BOUND,
        "aggregation": "seq-mean-token-mean",
        "dual_clip": None,
    },
    "cispo": {"objective": "cispo", "cispo_bounds": "relative", "log_ratio_clamp": SAFETY_BOUND, "dual_clip": None},
    "gpg": {"objective": "gpg", "dual_clip": None},
    # verl's later losses: no dual clip and no log-ratio clamp but where the function has them (dppo reads
    # clip_ratio as a divergence threshold and clip_ratio_c as its truncation, both through the same fields)
    "geo_mean": {"objective": "geo_mean", "dual_clip": None, "log_ratio_clamp": None},
    "clip_cov": {"objective": "clip_cov", "dual_clip": None, "log_ratio_clamp": None},
    "kl_cov": {"objective": "kl_cov", "dual_clip": None, "log_ratio_clamp": None},
    "dppo_tv": {"objective": "dppo_tv", "log_ratio_clamp": SAFETY_BOUND},
    "dppo_kl": {"objective": "dppo_kl", "log_ratio_clamp": SAFETY_BOUND},
    "dro": {"objective": "dro", "dual_clip": None, "log_ratio_clamp": None},
}
# verl actor fields that set LossConfig fields directly: trainer field -> where it went
VERL_MAPPED: dict[str, str] = {
    "clip_ratio": "epsilon_low, epsilon_high (when the low/high fields are None)",
    "clip_ratio_low": "epsilon_low",
    "clip_ratio_high": "epsilon_high",
    "clip_ratio_c": "dual_clip (vanilla; dppo: the truncation of the detached ratio)",
    "loss_agg_mode": "aggregation",
    "loss_scale_factor": "max_completion_length (seq-mean-token-sum-norm's constant)",
    "policy_loss": "objective and its clamps (loss_mode); rollout_correction weights reach the loss as "
    "rollout_is_weights, which grpo.capture.verl reports as unsupported when a call passes them",
    "use_kl_loss": "beta (0 when off)",
    "kl_loss_coef": "beta",
    **{name: s.name for name, s in VERL_ACTOR_DECLARED.items()},
}
# Loss modes verl refuses without a setting PolicyLossConfig leaves None: loss_mode -> {LossConfig field: why}
VERL_LOSS_MODE_NEEDS: dict[str, dict[str, str]] = {
    "dro": {"dro_beta": "verl 0.9.1 raises ValueError for dro without a positive dro_beta"},
}
# verl 0.9.1 PolicyLossConfig's own settings (its defaults, not the loss functions' fallbacks) -> LossConfig
VERL_POLICY_LOSS_FIELDS: dict[str, tuple[str, Any]] = {
    str(s.verl).removeprefix(VERL_POLICY_LOSS_PREFIX): (s.name, s.default) for s in VERL_POLICY_LOSS_DECLARED
}
VERL_KL_TYPES: dict[str, dict[str, Any]] = {
    "low_var_kl": {"kl_estimator": "k3", "kl_log_ratio_clamp": SAFETY_BOUND, "kl_clamp": 10.0},
    "k3": {"kl_estimator": "k3", "kl_log_ratio_clamp": SAFETY_BOUND, "kl_clamp": 10.0},
    "kl": {"kl_estimator": "k1"},
    "k1": {"kl_estimator": "k1"},
    "mse": {"kl_estimator": "k2"},
    "k2": {"kl_estimator": "k2"},
    "mse+": {"kl_estimator": "k2"},
    "k2+": {"kl_estimator": "k2"},
    "abs": {"kl_estimator": "abs"},
}
# verl's "+" types: the base type's value with k2's gradient (straight through; k2+ is k2 itself)
VERL_KL_TYPES |= {
    f"{name}+": {**settings, "kl_gradient": "k2"}
    for name, settings in VERL_KL_TYPES.items()
    if not name.endswith("+") and settings["kl_estimator"] != "k2"
}
VERL_KL_UNSUPPORTED = {
    "full": "verl 0.9.1 itself raises NotImplementedError for 'full' (it would need every vocabulary logit)"
}
VERL_AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
VERL_CAPTURED = {
    "global_batch_info": "token_normalizer / sequence_normalizer, set per micro-batch by the capture",
    "ppo_micro_batch_size": "the captured micro-batches",
    "ppo_micro_batch_size_per_gpu": "the captured micro-batches",
    "ppo_mini_batch_size": "global_batch_size: sequence_normalizer, set by the capture",
    "ppo_epochs": "in the captured old log-probs",
}


# verl 0.9.1's algorithm.adv_estimator -> the advantage (with the std, without it: norm_adv_by_std_in_grpo);
# estimators that read the std switch have two entries, the rest one for both
VERL_ADVANTAGES: dict[str, tuple[str, str]] = {
    "grpo": ("group", "none"),
    "grpo_vectorized": ("group", "none"),
    "rloo": ("rloo", "rloo"),
    "rloo_vectorized": ("rloo", "rloo"),
    "grpo_passk": ("passk", "passk-no-std"),
    "reinforce_plus_plus_baseline": ("reinforce-pp-baseline", "reinforce-pp-baseline"),
    "opo": ("opo", "opo"),
    "gpg": ("gpg", "gpg"),
    # the rewards per reward function (rewards (B, K), reward_weights: gdpo_reward_keys, gdpo_reward_weights)
    "gdpo": ("gdpo", "gdpo"),  # verl's trainer never passes gdpo its norm_adv_by_std_in_grpo: always by the std
    "remax": ("remax", "remax"),  # the greedy completion's reward per row: reward_baselines
    "reinforce_plus_plus": ("reinforce-pp", "reinforce-pp"),  # one advantage per token, algorithm.gamma
    "optimal_token_baseline": ("optimal-token-baseline", "optimal-token-baseline"),  # sum_pi_squared per token
}
VERL_ADVANTAGES_NEED = {
    "gae": "a critic's value per token (GAE): out of scope, GRPO Lens has no critic",
    "tir_optimal_token_baseline": "sum_pi_squared (Σπ² over the vocabulary per token, from the logits) and the "
    "turn layout of a multi-turn rollout: a batch of log-probs does not hold them",
}


def _map_verl_algorithm(
    alg: dict[str, Any], settings: dict[str, Any], mapped: dict[str, str], unsupported: dict[str, str]
) -> None:
    """verl's ``algorithm`` config: the advantage estimator and its std switch."""
    name = str(alg.get("adv_estimator", "grpo"))
    by_std = bool(alg.get("norm_adv_by_std_in_grpo", True))
    if name in VERL_ADVANTAGES:
        settings["advantage"] = VERL_ADVANTAGES[name][0 if by_std else 1]
        mapped["adv_estimator"] = "advantage" + (
            " (a group of one keeps its raw reward, as verl's rloo; rloo_vectorized gives it 0)"
            if name == "rloo_vectorized"
            else ""
        )
        mapped["norm_adv_by_std_in_grpo"] = "advantage (with or without the std)"
        if ADVANTAGES.entry(settings["advantage"]).per_token:  # a discounted return per token
            settings["gamma"] = float(alg.get("gamma", 1.0))
            mapped["gamma"] = "gamma"
    else:
        need = VERL_ADVANTAGES_NEED.get(name, "an estimator verl 0.9.1 does not register")
        unsupported["adv_estimator"] = f"{name!r} needs {need}; given advantages are reproduced as they are"
    correction = alg.get("rollout_correction")
    if isinstance(correction, dict):
        _map_verl_rollout_correction(correction, settings, mapped)


def parse_rollout_is_threshold(spec: Any) -> tuple[float, float | None]:
    """verl 0.9.1's ``rollout_is_threshold``: (upper, lower). A number or a number's string truncates at
    upper (TIS); ``"lower_upper"`` (``"1e-4_3.0"``) zeroes weights outside [lower, upper] (IcePop). Both
    positive and lower <= upper, or GrpoInputError naming the field and saying what was expected."""
    expected = "a positive number (truncate at it) or 'lower_upper' with 0 < lower <= upper (IcePop mask)"
    field_name = "rollout_correction.rollout_is_threshold"
    if isinstance(spec, bool) or not isinstance(spec, int | float | str):
        raise GrpoInputError(field_name, expected, got=repr(spec)[:80])
    text = str(spec).strip()
    try:
        lower_text, upper_text = text.split("_", 1) if "_" in text else (None, text)
        upper = float(upper_text)
        lower = None if lower_text is None else float(lower_text)
    except ValueError:
        raise GrpoInputError(field_name, expected, got=repr(spec)[:80]) from None
    if not 0 < upper < float("inf") or (lower is not None and not 0 < lower <= upper):
        raise GrpoInputError(field_name, expected, got=repr(spec)[:80])
    return upper, lower


VERL_ROLLOUT_IS = {"token": "token", "sequence": "sequence"}


def _map_verl_rollout_correction(
    rc: dict[str, Any], settings: dict[str, Any], mapped: dict[str, str], bypass: bool = False
) -> None:
    """verl's ``algorithm.rollout_correction``: IS weights (token or sequence, truncated or IcePop-masked,
    batch-normalised) from ``compute_rollout_correction_and_rejection_mask``, read with verl's ``.get``
    defaults. The weights multiply the policy loss (``pg_losses * rollout_is_weights``), never the KL."""
    level = rc.get("rollout_is")
    if level is not None:
        if level not in VERL_ROLLOUT_IS:
            raise GrpoInputError("rollout_correction.rollout_is", "token, sequence or null", got=repr(level)[:80])
        upper, lower = parse_rollout_is_threshold(rc.get("rollout_is_threshold", 2.0))
        settings |= {
            "rollout_correction": f"{level}_{'truncate' if lower is None else 'mask'}",
            "rollout_is_min": lower,
            "rollout_is_max": upper,
            "rollout_is_log_ratio_clamp": SAFETY_BOUND,
            "rollout_is_batch_normalize": bool(rc.get("rollout_is_batch_normalize", False)),
        }
    mapped |= {
        "rollout_correction.rollout_is": "rollout_correction (token_/sequence_; truncate or, for 'lower_upper', "
        "mask) with verl's ±20 log-ratio clamp",
        "rollout_correction.rollout_is_threshold": "rollout_is_max (and rollout_is_min for 'lower_upper')",
        "rollout_correction.rollout_is_batch_normalize": "rollout_is_batch_normalize (the driver's factor over "
        "the whole batch: rollout_is_normalizer)",
    }
    if rc.get("rollout_rs") is not None:
        rs, threshold = str(rc["rollout_rs"]), rc.get("rollout_rs_threshold")
        try:
            rs_criteria(rs, threshold)
        except GrpoInputError as exc:
            raise GrpoInputError(f"rollout_correction.{exc.field}", exc.expected, got=exc.got) from exc
        settings |= {"rollout_rs": rs, "rollout_rs_threshold": str(threshold)}
    mapped |= {
        "rollout_correction.rollout_rs": "rollout_rs (a rejected token leaves the batch, as verl's response mask)",
        "rollout_correction.rollout_rs_threshold": "rollout_rs_threshold",
    }
    if rc.get("bypass_mode") or bypass:
        loss_type = rc.get("loss_type", "ppo_clip")
        if loss_type not in ("ppo_clip", "reinforce"):
            raise GrpoInputError("rollout_correction.loss_type", "ppo_clip or reinforce", got=repr(loss_type)[:80])
        settings["rollout_bypass"] = True
        if loss_type == "ppo_clip":  # the clip's ratio pi / pi_rollout is the correction: no IS weights
            settings["rollout_correction"] = "none"
        else:  # -A · log pi · sg(w), w from the current policy against the sampler
            settings["objective"] = "gpg"
    mapped |= {
        "rollout_correction.bypass_mode": "rollout_bypass (the sampler's log-probs as old)",
        "rollout_correction.loss_type": "rollout_bypass's loss: ppo_clip (vanilla clip, no IS weights) or "
        "reinforce (gpg times the IS weights)",
    }


def verl_fields(actor_config: Any, algorithm: Any = None) -> TrainerFields:
    """verl 0.9.1's actor config (a dict, an OmegaConf node or an ``ActorConfig``) and, optionally, its
    ``algorithm`` config as LossConfig settings (what they reproduce: ``grpo.trainer_config.map_verl``)."""
    a = _fields(actor_config)
    mapped: dict[str, str] = {}
    unsupported: dict[str, str] = {}
    policy = a.get("policy_loss") or {}
    loss_mode = policy.get("loss_mode", "vanilla") if isinstance(policy, dict) else "vanilla"
    bypass = loss_mode == "bypass_mode"  # verl's apply_bypass_mode: vanilla's clip (or reinforce) on rollout
    loss_mode = "vanilla" if bypass else loss_mode
    if loss_mode not in VERL_LOSS_MODES:
        raise GrpoInputError(
            "policy_loss.loss_mode",
            f"a verl loss_mode GRPO Lens reproduces: {', '.join(VERL_LOSS_MODES)}",
            got=repr(loss_mode),
        )
    clip = float(a.get("clip_ratio", 0.2))
    low, high = a.get("clip_ratio_low"), a.get("clip_ratio_high")
    agg = a.get("loss_agg_mode", "token-mean")
    if agg not in VERL_AGGREGATIONS:
        raise GrpoInputError("loss_agg_mode", f"one of {', '.join(VERL_AGGREGATIONS)}", got=repr(agg))
    use_kl = bool(a.get("use_kl_loss", False))
    settings: dict[str, Any] = {
        "epsilon_low": clip if low is None else float(low),
        "epsilon_high": clip if high is None else float(high),
        "dual_clip": float(a.get("clip_ratio_c", 3.0)),
        "aggregation": agg,
        "max_completion_length": a.get("loss_scale_factor"),
        "skip_empty_rows": True,
        "length_epsilon": 1e-8,
        "beta": float(a.get("kl_loss_coef", 0.001)) if use_kl else 0.0,
        "kl_estimator": "k3",
        "kl_gradient": "estimator",
        **{s.name: s.type(a.get(name, s.default)) for name, s in VERL_ACTOR_DECLARED.items()},
        "advantage": "group",
        "advantage_epsilon": 1e-6,
        **VERL_LOSS_MODES[loss_mode],
    }
    mapped |= VERL_MAPPED
    for name, (field_name, default) in VERL_POLICY_LOSS_FIELDS.items():
        value = policy.get(name, default) if isinstance(policy, dict) else default
        settings[field_name] = value if value is None else float(value)
        if isinstance(policy, dict) and name in policy:
            mapped[f"policy_loss.{name}"] = field_name
    for name, why in VERL_LOSS_MODE_NEEDS.get(loss_mode, {}).items():
        if settings[name] is None:
            unsupported[f"policy_loss.{name}"] = why
    _map_verl_kl(a, settings, mapped, unsupported)
    settings["entropy_coef"] = float(a.get("entropy_coeff") or 0.0)
    settings["entropy_weighting"] = "aggregation"  # verl: agg_loss(entropy, mask, loss_agg_mode)
    if "entropy_coeff" in a:
        mapped["entropy_coeff"] = "entropy_coef (the entropies aggregated as the loss: loss_agg_mode)"
    if algorithm is not None:
        _map_verl_algorithm(_fields(algorithm), settings, mapped, unsupported)
    if bypass:  # the rollout_correction config apply_bypass_mode copied into policy_loss
        correction = policy.get("rollout_correction")
        _map_verl_rollout_correction(correction if isinstance(correction, dict) else {}, settings, mapped, True)
    captured = {k: v for k, v in VERL_CAPTURED.items() if k in a}
    return _finish(a, settings, mapped, unsupported=unsupported, captured=captured)


def _map_verl_kl(
    a: dict[str, Any], settings: dict[str, Any], mapped: dict[str, str], unsupported: dict[str, str]
) -> None:
    """verl's ``kl_loss_type``: the estimator and its clamps, set with use_kl_loss off too (the estimator a
    beta > 0 would use)."""
    kl_type = a.get("kl_loss_type", "low_var_kl")
    use_kl = bool(a.get("use_kl_loss", False))
    settings |= VERL_KL_TYPES.get(kl_type, {})
    if use_kl and kl_type not in VERL_KL_TYPES:
        known = ", ".join(VERL_KL_TYPES)
        unsupported["kl_loss_type"] = VERL_KL_UNSUPPORTED.get(kl_type, f"{kl_type!r} is not a verl KL type ({known})")
    elif use_kl:
        mapped["kl_loss_type"] = "kl_estimator and its clamps"
    elif "kl_loss_type" in a:
        mapped["kl_loss_type"] = "nothing: use_kl_loss is off"


def checked(found: TrainerFields, strict: bool, source: str) -> TrainerFields:
    """``found`` when GRPO Lens reproduces every setting; else a warning (``strict``: GrpoInputError naming the
    first setting it does not). The warning points at the caller of the LossConfig constructor."""
    if found.unsupported:
        message = f"{source} settings GRPO Lens does not reproduce: " + "; ".join(found.warnings)
        if strict:
            name = next(iter(found.unsupported))
            raise GrpoInputError(name, "a setting GRPO Lens reproduces", got=found.unsupported[name])
        warnings.warn(message, stacklevel=3)
    return found
