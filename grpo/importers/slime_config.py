"""slime's training arguments (``slime/utils/arguments.py`` at commit 624b824) -> LossConfig: what its policy
loss reads, each setting mapped, refused when the import does not reproduce its effect, or listed as unread."""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Mapping
from typing import Any

import grpo.importers.common as common
from grpo.config import LossConfig
from grpo.errors import GrpoInputError
from grpo.trainer_config import TrainerMapping

# slime's argument defaults (slime/utils/arguments.py at 624b824) for what its policy loss reads
SLIME_DEFAULTS: dict[str, Any] = {
    "loss_type": "policy_loss",
    "eps_clip": 0.2,
    "eps_clip_high": None,
    "eps_clip_c": None,
    "use_kl_loss": False,
    "kl_loss_coef": 0.0,
    "kl_loss_type": "k1",
    "use_unbiased_kl": False,
    "calculate_per_token_loss": False,
    "entropy_coef": 0.0,
    "advantage_estimator": "grpo",
    "use_rollout_logprobs": False,
    "use_tis": False,
    "get_mismatch_metrics": False,
    "custom_tis_function_path": None,
    "tis_clip": 2.0,
    "tis_clip_low": 0.0,
    "use_opsm": False,
    "custom_pg_loss_reducer_function_path": None,
    "keep_old_actor": False,
}
# slime's kl_loss_type -> LossConfig (compute_approx_kl: low_var_kl is k3 with the KL clamped to +-10)
KL_TYPES: dict[str, dict[str, Any]] = {
    "k1": {"kl_estimator": "k1"},
    "k2": {"kl_estimator": "k2"},
    "k3": {"kl_estimator": "k3"},
    "low_var_kl": {"kl_estimator": "k3", "kl_clamp": 10.0},
}
# the TIS functions of slime's own loss.py (custom_tis_function_path, None: vanilla) -> rollout_correction:
# vanilla_tis_function clamps exp(log_probs - rollout_log_probs) to [tis_clip_low, tis_clip]; icepop_function
# zeroes it outside
TIS_FUNCTIONS: dict[str | None, str] = {
    None: "token_truncate",
    "slime.backends.megatron_utils.loss.vanilla_tis_function": "token_truncate",
    "slime.backends.megatron_utils.loss.icepop_function": "token_mask",
}
# estimators whose advantages the dump holds and whose loss is compute_policy_loss's clip
CLIP_ESTIMATORS = ("grpo", "ppo", "reinforce_plus_plus", "reinforce_plus_plus_baseline")
NOT_READ = (
    "not read by the import: not one of the settings slime's policy loss reads (its effect, if any, is in the dump)"
)
KEEP_OLD_ACTOR = (
    "keep_old_actor: log_probs come from the previous rollout's weights, not the ones the update starts from: "
    "the current policy is not in the dump (check-run says so per step)"
)


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool | None):
        raise GrpoInputError(name, "true or false", got=repr(value)[:40])
    return bool(value)


def _refuse(name: str, value: Any, why: str) -> GrpoInputError:
    return GrpoInputError(name, f"a setting the import reproduces ({why})", got=repr(value)[:60])


def map_slime(args: Any = None) -> TrainerMapping:
    """slime's training arguments (a dict or an argparse Namespace; missing ones take slime's defaults) as a
    LossConfig, with where each went. A setting whose effect on the loss the import does not reproduce is
    refused (GrpoInputError naming it); one the loss does not read is listed in ``unsupported``."""
    if isinstance(args, Namespace):
        args = vars(args)
    if not isinstance(args, Mapping | None):
        raise GrpoInputError("config", "slime's arguments: a mapping", got=type(args).__name__)
    given = {str(k): v for k, v in (args or {}).items()}
    a = {**SLIME_DEFAULTS, **given}
    flags = {k: _flag(k, a[k]) for k, v in SLIME_DEFAULTS.items() if isinstance(v, bool)}
    _refusals(a, flags)
    kl_type = a["kl_loss_type"]
    eps = common.number("eps_clip", a["eps_clip"])
    settings: dict[str, Any] = {
        "preset": None,
        "objective": "clip",
        "epsilon_low": eps,
        "epsilon_high": eps if a["eps_clip_high"] is None else common.number("eps_clip_high", a["eps_clip_high"]),
        "dual_clip": common.optional_number("eps_clip_c", a["eps_clip_c"]),
        "beta": common.number("kl_loss_coef", a["kl_loss_coef"]) if flags["use_kl_loss"] else 0.0,
        "kl_bias_correction": flags["use_unbiased_kl"],
        "aggregation": "token-mean" if flags["calculate_per_token_loss"] else "seq-mean-token-mean",
        **KL_TYPES[kl_type],
    }
    if flags["use_tis"] or flags["get_mismatch_metrics"]:  # loss.py applies tis_func whenever either is on
        settings |= {
            "rollout_correction": TIS_FUNCTIONS[a["custom_tis_function_path"]],
            "rollout_is_min": common.number("tis_clip_low", a["tis_clip_low"]),
            "rollout_is_max": common.number("tis_clip", a["tis_clip"]),
        }
    mapped = {
        "loss_type": "policy_loss: the clipped policy loss",
        "eps_clip": "epsilon_low (and epsilon_high when eps_clip_high is None)",
        "eps_clip_high": "epsilon_high",
        "eps_clip_c": "dual_clip",
        "use_kl_loss": "beta (0 when off)",
        "kl_loss_coef": "beta",
        "kl_loss_type": "kl_estimator (low_var_kl: k3, clamped to +-10)",
        "use_unbiased_kl": "kl_bias_correction",
        "calculate_per_token_loss": "aggregation (token-mean over Σ max(mask, 1), else each rollout's token mean)",
        "use_rollout_logprobs": "the old policy: rollout_log_probs when on, else log_probs",
        "use_tis": "rollout_correction (with get_mismatch_metrics: slime applies its TIS weights when either is on)",
        "get_mismatch_metrics": "rollout_correction (slime applies its TIS weights when either is on)",
        "custom_tis_function_path": "rollout_correction: token_truncate (vanilla_tis_function), token_mask (icepop)",
        "tis_clip": "rollout_is_max",
        "tis_clip_low": "rollout_is_min",
        "entropy_coef": "nothing: 0 adds no entropy bonus",
        "use_opsm": "nothing: off",
        "custom_pg_loss_reducer_function_path": "nothing: unset",
    }
    captured = {"advantage_estimator": "in the dumped advantages"}
    unsupported = {"keep_old_actor": KEEP_OLD_ACTOR} if flags["keep_old_actor"] else {}
    known = set(mapped) | set(captured) | set(unsupported) | {"keep_old_actor"}
    unsupported |= {name: NOT_READ for name in sorted(given) if name not in known}
    captured = {k: v for k, v in captured.items() if k in given}
    return TrainerMapping(LossConfig(**settings), mapped, captured, unsupported, ())


def _refusals(a: dict[str, Any], flags: dict[str, bool]) -> None:
    """The settings whose effect on the loss the import does not reproduce, refused by name."""
    for name in ("loss_type", "advantage_estimator", "kl_loss_type", "custom_tis_function_path"):
        if not isinstance(a[name], str | None):
            raise GrpoInputError(name, "a name (a string)", got=repr(a[name])[:40])
    if a["loss_type"] != "policy_loss":
        raise _refuse("loss_type", a["loss_type"], "policy_loss only")
    if a["advantage_estimator"] not in CLIP_ESTIMATORS:
        raise _refuse(
            "advantage_estimator",
            a["advantage_estimator"],
            f"{', '.join(CLIP_ESTIMATORS)}: gspo and cispo change the ratio",
        )
    if a["kl_loss_type"] not in KL_TYPES:
        raise GrpoInputError("kl_loss_type", f"one of {', '.join(KL_TYPES)}", got=repr(a["kl_loss_type"]))
    if common.number("entropy_coef", a["entropy_coef"]) != 0:
        raise _refuse("entropy_coef", a["entropy_coef"], "0: the entropy bonus needs the training forward's entropies")
    if flags["use_opsm"]:
        raise _refuse("use_opsm", True, "off: off-policy sequence masking is not reproduced")
    if a["custom_pg_loss_reducer_function_path"] is not None:
        raise _refuse("custom_pg_loss_reducer_function_path", a["custom_pg_loss_reducer_function_path"], "unset")
    tis = flags["use_tis"] or flags["get_mismatch_metrics"]
    if tis and a["custom_tis_function_path"] not in TIS_FUNCTIONS:
        names = ", ".join(str(k) for k in TIS_FUNCTIONS if k)
        raise _refuse("custom_tis_function_path", a["custom_tis_function_path"], f"unset, {names}")
    if tis and flags["use_rollout_logprobs"]:
        name = "use_tis" if flags["use_tis"] else "get_mismatch_metrics"
        raise _refuse(
            name,
            True,
            "off with use_rollout_logprobs: slime's TIS weights then compare log_probs, not the old policy, "
            "with the sampler",
        )
    if flags["use_unbiased_kl"] and a["kl_loss_type"] == "low_var_kl" and flags["use_rollout_logprobs"]:
        raise _refuse(
            "use_unbiased_kl", True, "off with low_var_kl and use_rollout_logprobs: slime clamps after the ratio"
        )
