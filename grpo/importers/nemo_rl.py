"""NeMo RL's ``train_data_step{N}.jsonl`` dumps -> a run; ``ClippedPGLossConfig`` -> LossConfig.

Read from NeMo RL 0.6.0 (NVIDIA-NeMo/RL commit 7ea279a, 2026-08-22): ``nemo_rl/algorithms/grpo.py`` writes,
after each step, ``log_data`` through ``Logger.log_batched_dict_as_jsonl`` (``nemo_rl/utils/logger.py``): one
line per sample, each value sliced as a batch of one (``[[...]]`` per token, ``[x]`` per row), plus ``idx``.
Per token, aligned with ``token_ids`` (position t scores token t; the loss reads ``[:, 1:]``):
``generation_logprobs`` (the sampler's), ``prev_logprobs`` (the trainer's before the update: the old policy),
``token_loss_mask``, ``advantages``. Per row: ``rewards``, ``sample_loss_mask``, ``input_lengths``.
The dump holds neither the current log-probs, nor ``reference_policy_logprobs``, nor the returned loss.
The loss: ``ClippedPGLossFn`` in ``nemo_rl/algorithms/loss/loss_functions.py``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

import grpo.importers.common as common
from grpo import step_schema
from grpo.config import LossConfig
from grpo.corrections import SAFETY_BOUND
from grpo.errors import GrpoInputError
from grpo.fields import BATCH_FIELDS
from grpo.importers.nemo_rl_config import loss_fn_fields
from grpo.importers.nemo_rl_config import read_config as read_config
from grpo.trainer_config import TrainerMapping

READ = "NeMo RL 0.6.0 (NVIDIA-NeMo/RL commit 7ea279a, 2026-08-22)"
STEP_FILE = re.compile(r"train_data_step([0-9]{1,6})\.jsonl")
# ClippedPGLossConfig's defaults at that commit (a pydantic model; the example YAMLs set their own)
NEMO_RL_DEFAULTS: dict[str, Any] = {
    "disable_ppo_ratio": False,
    "token_level_loss": True,
    "sequence_level_importance_ratios": False,
    "ratio_clip_min": 0.2,
    "ratio_clip_max": 0.2,
    "ratio_clip_c": None,
    "reference_policy_kl_penalty": 0.01,
    "reference_policy_kl_type": "k3",
    "kl_input_clamp_value": 20.0,
    "kl_output_clamp_value": 10.0,
    "use_kl_in_reward": False,
    "use_importance_sampling_correction": False,
    "truncated_importance_sampling_type": None,
    "truncated_importance_sampling_ratio": None,
    "truncated_importance_sampling_ratio_min": None,
    "use_on_policy_kl_approximation": False,
    "force_on_policy_ratio": False,
    "use_cispo": False,
    "positive_example_nll_weight": 0.0,
}
KL_TYPES = ("k1", "k2", "k3")
MASKED_MEAN_EPSILON = 1e-8  # nemo_rl.algorithms.utils.masked_mean: Σ(values · mask) / (count + 1e-8)
PER_TOKEN = ("prev_logprobs", "generation_logprobs", "token_loss_mask", "advantages")  # what the import reads
# ... and the fields it writes from them: any other registered field a line holds (a plugin's) is written as it is
TAKEN = frozenset({*PER_TOKEN, "rewards", "sample_loss_mask", "per_token_logps", "old_per_token_logps"})
CANNOT_CHECK = [
    "the current policy's log-probs: the dump holds prev_logprobs (the old policy) and generation_logprobs "
    "(the sampler's), so the run uses prev as current: every ratio is 1 and no clip acts",
    "the loss NeMo RL returned: it is not in the dump, so check-run has no trainer loss to compare (shown as -)",
    "the KL penalty: reference_policy_logprobs are not dumped, so the reference is the current policy (KL 0)",
]


def map_nemo_rl(cfg: Any = None) -> TrainerMapping:
    """NeMo RL's ``ClippedPGLossConfig`` (the ``loss_fn`` section: a dict, the pydantic model, a whole master
    config, or a config file's path, read by ``read_config`` as NeMo RL's loader reads it; missing fields take
    its defaults) as a LossConfig, with where each field went, like ``map_trl``. A setting NeMo RL itself
    refuses is refused here, naming it."""
    given = loss_fn_fields(cfg)
    a = {**NEMO_RL_DEFAULTS, **given}
    settings = _direct_settings(a)
    mapped = dict(DIRECT)
    captured = {name: COUNTS for name in ("global_valid_toks", "global_valid_seqs")}
    unsupported: dict[str, str] = {}
    _ratio_variants(a, settings, mapped, captured, unsupported)
    if settings["beta"] > 0:
        unsupported["reference_policy_kl_penalty"] = (
            "NeMo RL multiplies the KL by exp(logp - sg(logp)) (value 1): the KL's value is reproduced, not its "
            "gradient's score-function term"
        )
        if a["use_on_policy_kl_approximation"]:
            unsupported["use_on_policy_kl_approximation"] = "the KL weighted by exp(logp - sampler) is not applied"
    correction, notes = importance_sampling(a)
    settings |= correction
    mapped |= notes
    if a["positive_example_nll_weight"]:
        unsupported["positive_example_nll_weight"] = "VAPO's NLL term on correct samples is not part of the loss"
    for name in (
        "disable_ppo_ratio",
        "use_cispo",
        "force_on_policy_ratio",
        "use_on_policy_kl_approximation",
        *IS_SETTINGS,
        "positive_example_nll_weight",
    ):
        if name in given and name not in mapped | captured | unsupported:
            mapped[name] = "nothing: at this value it leaves the loss unchanged"
    known = set(mapped) | set(captured) | set(unsupported)
    unused = tuple(sorted(name for name in given if name not in known))
    return TrainerMapping(LossConfig(**settings), mapped, captured, unsupported, unused)


DIRECT = {
    "ratio_clip_min": "epsilon_low",
    "ratio_clip_max": "epsilon_high",
    "ratio_clip_c": "dual_clip",
    "sequence_level_importance_ratios": "importance_sampling_level (exp of the row's mean log-ratio, unclamped)",
    "reference_policy_kl_penalty": "beta",
    "reference_policy_kl_type": "kl_estimator",
    "kl_input_clamp_value": "kl_log_ratio_clamp",
    "kl_output_clamp_value": "kl_clamp",
    "use_kl_in_reward": "beta = 0 when on (the KL is in the rewards, so in the advantages)",
    "token_level_loss": "aggregation (token-mean, or seq-mean-token-mean)",
}
"""The settings ``_direct_settings`` maps, and where each went."""
COUNTS = (
    "the step's counts (+ 1e-8), which the import sets per step as token_normalizer and sequence_normalizer: "
    "Σ token_mask · sample_mask and Σ sample_mask, a sample kept with no token included (step_config)"
)


def _direct_settings(a: Mapping[str, Any]) -> dict[str, Any]:
    """The LossConfig fields that NeMo RL's settings give one for one (``DIRECT``)."""
    kl_type = a["reference_policy_kl_type"]
    if kl_type not in KL_TYPES:
        raise GrpoInputError("reference_policy_kl_type", f"one of {', '.join(KL_TYPES)}", got=repr(kl_type))
    token_level = bool(a["token_level_loss"])
    penalty = a["reference_policy_kl_penalty"]
    return {
        "preset": None,
        "objective": "clip",
        "epsilon_low": common.number("ratio_clip_min", a["ratio_clip_min"]),
        "epsilon_high": common.number("ratio_clip_max", a["ratio_clip_max"]),
        "dual_clip": common.optional_number("ratio_clip_c", a["ratio_clip_c"]),
        "importance_sampling_level": "sequence" if a["sequence_level_importance_ratios"] else "token",
        "beta": 0.0 if a["use_kl_in_reward"] else common.number("reference_policy_kl_penalty", penalty),
        "kl_estimator": kl_type,
        "kl_log_ratio_clamp": common.optional_number("kl_input_clamp_value", a["kl_input_clamp_value"]),
        "kl_clamp": common.optional_number("kl_output_clamp_value", a["kl_output_clamp_value"]),
        # token level: the mean over mask = token_mask * sample_mask; else the mean over tokens of each row,
        # then over rows with sample_mask 1 (a masked-out row has no counted token: skipped, as NeMo RL)
        "aggregation": "token-mean" if token_level else "seq-mean-token-mean",
        "skip_empty_rows": True,
        "length_epsilon": MASKED_MEAN_EPSILON,  # its masked_mean: Σ / (count + 1e-8), each row's too
    }


def _ratio_variants(
    a: Mapping[str, Any],
    settings: dict[str, Any],
    mapped: dict[str, str],
    captured: dict[str, str],
    unsupported: dict[str, str],
) -> None:
    """CISPO, a loss without the ratio (GPG) and the forced on-policy ratio, into ``settings`` and the notes."""
    forced = bool(a["force_on_policy_ratio"])
    if a["use_cispo"]:
        if forced:  # ClippedPGLossFn.__init__ asserts it
            raise GrpoInputError("use_cispo", "off with force_on_policy_ratio (NeMo RL refuses the pair)", got="true")
        settings |= {"objective": "cispo", "cispo_bounds": "relative"}
        mapped["use_cispo"] = "objective cispo, clamp(ratio, 1 - ratio_clip_min, 1 + ratio_clip_max)"
    if a["disable_ppo_ratio"] and not forced:
        settings["objective"] = "gpg"
        mapped["disable_ppo_ratio"] = "objective gpg (REINFORCE: A * logp, no ratio)"
        if a["ratio_clip_c"] is not None:
            unsupported["ratio_clip_c"] = "NeMo RL caps -A * logp at -A * c for A < 0 when the ratio is off"
    if forced:
        captured["force_on_policy_ratio"] = (
            "the ratio is 1 (old = current, as NeMo RL sets prev_logprobs = curr_logprobs.detach()); its dump's "
            "prev_logprobs are then zeros (the forward is skipped unless grpo.seq_logprob_error_threshold is set), "
            "so the run's log-probs are the sampler's and the trainer-vs-sampler mismatch is not recorded"
        )
        if a["disable_ppo_ratio"]:
            mapped["disable_ppo_ratio"] = "nothing: force_on_policy_ratio takes precedence in NeMo RL (ratio 1)"


IS_SETTINGS = (
    "use_importance_sampling_correction",
    "truncated_importance_sampling_type",
    "truncated_importance_sampling_ratio",
    "truncated_importance_sampling_ratio_min",
)
TIS_TYPES = ("tis", "icepop", "seq-mask-tis")
SEQ_MASK_RS = "seq_mean_k1"
"""seq-mask-tis's row test as GRPO Lens's rejection: k1 = -log r, its mean over the row's counted tokens, kept
inside [log(1/max), log(1/min)] = NeMo RL's min <= exp(mean log r) <= max."""


def importance_sampling(a: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """NeMo RL's off-policy importance-sampling correction (``use_importance_sampling_correction`` and the
    ``truncated_importance_sampling_*`` settings) as GRPO Lens's rollout correction: (LossConfig fields, where
    each setting went). ``ClippedPGLossFn`` weighs each token's clipped loss by w = exp(prev - generation) (per
    token, or per row exp(Σ_t (prev - generation)) with ``sequence_level_importance_ratios``), unclamped in the
    log; ``tis`` clamps w to [min (default 0), max], ``icepop`` zeroes it outside [min, max], ``seq-mask-tis``
    keeps the untruncated token weights of the rows whose exp(mean log w) is inside [min, max] and zeroes the
    others. Its own checks (``__init__``'s asserts, ``__call__``'s ValueError) refuse here too, by name."""
    kind, low, high = _is_bounds(a)
    if not a["use_importance_sampling_correction"]:
        return {}, {}
    if a["force_on_policy_ratio"]:  # NeMo RL's prev = curr.detach(): the weights need the current log-probs
        raise GrpoInputError(
            "use_importance_sampling_correction",
            "off with force_on_policy_ratio: NeMo RL then weighs by exp(current - generation), and the dump holds no "
            "current log-probs",
            got="true",
        )
    sequence = bool(a["sequence_level_importance_ratios"])
    level = "sequence" if sequence else "token"
    weight = "exp(Σ_t (prev - generation)) per row" if sequence else "exp(prev - generation) per token"
    fields: dict[str, Any]
    if kind is None:
        fields = {"rollout_correction": f"{level}_truncate", "rollout_is_min": None, "rollout_is_max": None}
        note = f"rollout_correction {level}_truncate without bounds: the policy term weighted by {weight}"
        return fields, {"use_importance_sampling_correction": note}
    fields, note = _truncation(kind, level, weight, low, high)
    names = ("truncated_importance_sampling_type", "truncated_importance_sampling_ratio")
    notes = {"use_importance_sampling_correction": note} | dict.fromkeys(names, note)
    if low is not None or kind == "tis":
        notes["truncated_importance_sampling_ratio_min"] = note
    return fields, notes


def _is_bounds(a: Mapping[str, Any]) -> tuple[str | None, float | None, float | None]:
    """The truncation's (type, min, max), refused as NeMo RL's asserts and ValueError refuse them."""
    kind = a["truncated_importance_sampling_type"]
    on = bool(a["use_importance_sampling_correction"])
    high = common.optional_number("truncated_importance_sampling_ratio", a["truncated_importance_sampling_ratio"])
    low = common.optional_number(
        "truncated_importance_sampling_ratio_min", a["truncated_importance_sampling_ratio_min"]
    )
    if kind is not None and kind not in TIS_TYPES:
        raise GrpoInputError(
            "truncated_importance_sampling_type", f"null or one of {', '.join(TIS_TYPES)}", got=repr(kind)
        )
    if kind is not None and not on:
        raise GrpoInputError("truncated_importance_sampling_type", "null unless use_importance_sampling_correction")
    if kind is None and high is not None:  # __call__: ValueError("Invalid truncated importance sampling type: None")
        raise GrpoInputError("truncated_importance_sampling_ratio", "null without truncated_importance_sampling_type")
    if kind is not None and (high is None or high <= 0):
        raise GrpoInputError("truncated_importance_sampling_ratio", f"a number > 0 with {kind}", got=repr(high))
    if kind is not None and low is not None and high is not None and low > high:
        raise GrpoInputError("truncated_importance_sampling_ratio_min", f"at most the ratio ({high})", got=repr(low))
    if kind in ("icepop", "seq-mask-tis") and low is None:
        raise GrpoInputError("truncated_importance_sampling_ratio_min", f"a number with {kind}", got="null")
    if kind == "seq-mask-tis" and a["sequence_level_importance_ratios"]:
        raise GrpoInputError("truncated_importance_sampling_type", "tis or icepop with sequence-level ratios", got=kind)
    return kind, low, high


def _truncation(
    kind: str, level: str, weight: str, low: float | None, high: float | None
) -> tuple[dict[str, Any], str]:
    """A truncation type as GRPO Lens's rollout correction: (LossConfig fields, what it became)."""
    fields: dict[str, Any]
    bounds = {"rollout_is_min": 0.0 if low is None else low, "rollout_is_max": high}
    if kind == "tis":
        fields = {"rollout_correction": f"{level}_truncate", **bounds}
        note = f"rollout_correction {level}_truncate: {weight}, clamped to [min (0 when null), max]"
    elif kind == "icepop":
        fields = {"rollout_correction": f"{level}_mask", **bounds}
        note = f"rollout_correction {level}_mask: {weight}, 0 outside [min, max]"
    else:
        assert low is not None and high is not None
        upper = math.inf if low == 0 else 1.0 / low
        fields = {
            "rollout_correction": "token_truncate",
            "rollout_is_min": None,
            "rollout_is_max": None,
            "rollout_rs": SEQ_MASK_RS,
            "rollout_rs_threshold": f"{1.0 / high!r}_{upper!r}",
        }
        note = (
            f"rollout_correction token_truncate without bounds ({weight}) and rollout_rs {SEQ_MASK_RS} with "
            "bounds 1/max and 1/min: a row whose exp(mean log w) is outside [min, max] leaves the policy term"
        )
    return fields, note


# --- the dump ------------------------------------------------------------------------------------
def step_files(src: Path) -> list[tuple[int, Path]]:
    """(step, path) of every ``train_data_step{N}.jsonl`` directly in ``src``, by step; one that is a link or not a
    regular file is refused, naming it (an import reads the dump's own files only)."""
    if not src.is_dir():
        raise GrpoInputError("DIR", "a directory holding NeMo RL's train_data_step*.jsonl", got=str(src))
    found = sorted((int(m[1]), p) for p in src.iterdir() if (m := STEP_FILE.fullmatch(p.name)))
    for _, path in found:
        if path.is_symlink() or not path.is_file():
            got = "a link" if path.is_symlink() else "not a regular file"
            raise GrpoInputError(path.name, "a regular file of the dump, not a link", got=got)
    if not found:
        raise GrpoInputError("DIR", "NeMo RL's train_data_step*.jsonl files", got=f"none in {src}")
    return found


@dataclass(frozen=True)
class Reading:
    """What reading a step file needs of NeMo RL's settings beyond the LossConfig (``reading``)."""

    force_on_policy_ratio: bool = False
    """prev_logprobs may be the placeholder zeros NeMo RL dumps when it skips their forward."""
    is_level: str | None = None
    """``token`` or ``sequence`` when the importance-sampling correction is on: its weight must not overflow."""
    seq_mask_tis: bool = False
    """seq-mask-tis: a row's test reads log-ratios GRPO Lens's rejection clamps to ±20."""


def reading(cfg: Any = None) -> Reading:
    """What ``read_step`` needs of these settings (``map_nemo_rl`` has refused those it cannot reproduce)."""
    a = {**NEMO_RL_DEFAULTS, **loss_fn_fields(cfg)}
    on = bool(a["use_importance_sampling_correction"])
    level = ("sequence" if a["sequence_level_importance_ratios"] else "token") if on else None
    seq_mask = on and a["truncated_importance_sampling_type"] == "seq-mask-tis"
    return Reading(bool(a["force_on_policy_ratio"]), level, seq_mask)


def _unbatched(value: Any) -> Any:
    """A value of a batch of one (``[x]``, ``[[...]]``) as the sample's own."""
    return value[0] if isinstance(value, list) and len(value) == 1 else value


def _token_row(sample: dict[str, Any], key: str, where: str) -> Tensor:
    """One per-token list of a line, every value a finite number (else refused at its place: ``key[0][17]``)."""
    if key not in sample:
        raise GrpoInputError(key, f"a per-token list in every line ({where})", got="missing")
    given = sample[key]
    value = _unbatched(given)
    prefix = (0,) if value is not given else ()
    if not isinstance(value, list) or any(isinstance(v, list | dict | str | bool) for v in value):
        raise GrpoInputError(key, f"a list of numbers, one per token ({where})", got=type(value).__name__)
    if None in value:
        at = common.position([*prefix, value.index(None)])
        raise GrpoInputError(f"{where}: {key}{at}", "a number", got="null")
    try:
        row = torch.tensor(value, dtype=torch.float64)
    except (TypeError, ValueError, OverflowError, RuntimeError) as exc:
        raise GrpoInputError(key, f"a list of numbers, one per token ({where})") from exc
    common.finite(row, key, where, FINITE.get(key, "a finite number"), prefix)
    return row


# Why a NaN or an infinity is refused where NeMo RL dumps log-probs (every other per-token value: a finite number)
FINITE = {
    "prev_logprobs": "a finite log-prob (NeMo RL's workers write 0 where the policy gave -inf)",
    "generation_logprobs": "a finite log-prob (the sampler scored every token: a NaN makes NeMo RL's "
    "token_mult_prob_error NaN and its IS weight 0, not a token GRPO Lens can call unscored)",
}


def _row_number(sample: dict[str, Any], key: str, default: float | None, where: str) -> float | None:
    value = _unbatched(sample.get(key, default))
    if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
        return None if value is None else float(value)
    raise GrpoInputError(key, f"one number per line ({where})", got=type(value).__name__)


def step_config(config: LossConfig, mask: Tensor, sample_mask: Tensor) -> LossConfig:
    """``config`` with NeMo RL's global counts of one step: it divides the token mean by
    global_valid_toks = Σ token_mask · sample_mask and the sequence mean by global_valid_seqs = Σ sample_mask,
    each + 1e-8 (``masked_mean``). A sample kept (sample_mask 1) with no counted token still counts as a
    sequence. ``mask``: (B, T) token_mask · sample_mask; ``sample_mask``: (B,)."""
    return dataclasses.replace(
        config,
        token_normalizer=float(mask.sum()) + MASKED_MEAN_EPSILON,
        sequence_normalizer=float(sample_mask.sum()) + MASKED_MEAN_EPSILON,
    )


LOG_FLOAT32_MAX = math.log(torch.finfo(torch.float32).max)
"""exp overflows float32 past this: NeMo RL's IS weight is then 0 (``nan_to_num(posinf=0)``), GRPO Lens's inf."""


def _weights_in_range(log_ratio: Tensor, mask: Tensor, reading: Reading, where: str) -> None:
    """Refuse what NeMo RL's IS correction computes differently from GRPO Lens's: a weight exp(prev - generation)
    (per token, or of the row's sum) that overflows float32, which NeMo RL zeroes and GRPO Lens would clamp; under
    seq-mask-tis a counted token's |log-ratio| above 20, which GRPO Lens's row test clamps and NeMo RL's does not.
    ``log_ratio``: (B, T) prev - generation, 0 where not counted."""
    if reading.is_level is None:
        return
    if reading.is_level == "sequence":
        sums = log_ratio.sum(dim=-1)  # (B,)
        if bool((sums > LOG_FLOAT32_MAX).any()):
            row = int((sums > LOG_FLOAT32_MAX).nonzero()[0, 0])
            raise GrpoInputError(
                f"{where}: sample {row}",
                f"a sequence IS weight exp(Σ (prev - generation)) within float32 (Σ <= {LOG_FLOAT32_MAX:.2f}: "
                "NeMo RL sets an overflowed weight to 0)",
                got=f"Σ = {float(sums[row]):.4g}",
            )
        return
    bound = SAFETY_BOUND if reading.seq_mask_tis else LOG_FLOAT32_MAX
    far = (log_ratio.abs() if reading.seq_mask_tis else log_ratio) > bound
    if bool((far & (mask > 0)).any()):
        row, t = (int(i) for i in (far & (mask > 0)).nonzero()[0])
        why = "seq-mask-tis: GRPO Lens's row test clamps it" if reading.seq_mask_tis else "NeMo RL zeroes its weight"
        raise GrpoInputError(
            f"{where}: sample {row} token {t + 1}",
            f"prev - generation within ±{bound:.2f} under the IS correction ({why})",
            got=f"{float(log_ratio[row, t]):.4g}",
        )


@dataclass
class _Columns:
    """A dump file's samples, row by row, as the loss reads them (position 0, never scored, dropped)."""

    prev: list[Tensor] = dataclasses.field(default_factory=list)
    gen: list[Tensor] = dataclasses.field(default_factory=list)
    masks: list[Tensor] = dataclasses.field(default_factory=list)
    advs: list[Tensor] = dataclasses.field(default_factory=list)
    rewards: list[float | None] = dataclasses.field(default_factory=list)
    kept: list[float] = dataclasses.field(default_factory=list)
    more: dict[str, list[Any]] = dataclasses.field(default_factory=dict)  # the other registered fields
    zeros: bool = True  # every prev_logprobs value 0: NeMo RL's placeholder when force_on_policy_ratio skips it
    nbytes: int = 0


def _sample(line: str, where: str) -> dict[str, Any]:
    try:
        sample = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise GrpoInputError(where, "one complete JSON object per line", got=str(exc)[:80]) from exc
    if not isinstance(sample, dict):
        raise GrpoInputError(where, "a JSON object", got=type(sample).__name__)
    return sample


def _add_sample(columns: _Columns, sample: dict[str, Any], where: str) -> None:
    rows = {k: _token_row(sample, k, where) for k in PER_TOKEN}
    widths = {k: len(v) for k, v in rows.items()}
    if len(set(widths.values())) != 1:
        got = ", ".join(f"{k} {w}" for k, w in widths.items())
        raise GrpoInputError(where, "per-token lists of one length", got=got)
    columns.zeros = columns.zeros and not bool(rows["prev_logprobs"].any())
    keep = _row_number(sample, "sample_loss_mask", 1.0, where)
    columns.kept.append(keep or 0.0)
    # the loss reads [:, 1:]: position 0 (the first prompt token) is never scored
    columns.prev.append(rows["prev_logprobs"][1:])
    columns.gen.append(rows["generation_logprobs"][1:])
    columns.masks.append(rows["token_loss_mask"][1:] * (keep or 0.0))
    columns.advs.append(rows["advantages"][1:])
    columns.rewards.append(_row_number(sample, "rewards", None, where))
    for name, key in step_schema.dumped_fields(sample, TAKEN).items():
        if BATCH_FIELDS[name].shape == "token":  # aligned with token_ids, as the loss reads it: [1:]
            values = _token_row(sample, key, where)
            if len(values) != len(rows["prev_logprobs"]):
                raise GrpoInputError(key, f"one value per token like prev_logprobs ({where})", got=str(len(values)))
            columns.more.setdefault(name, []).append(values[1:])
        else:
            number = _row_number(sample, key, None, where)
            columns.more.setdefault(name, []).append(math.nan if number is None else number)


def _columns(path: Path) -> _Columns:
    """Every sample line of a dump file, checked, streamed within ``common.regular_file``'s and
    ``common.bounded_lines``'s bounds."""
    columns = _Columns()
    f, columns.nbytes = common.regular_file(path)
    with f:
        for n, raw in common.bounded_lines(f, path.name):
            line = raw.decode("utf-8", errors="replace")
            if line.strip():
                where = f"{path.name} line {n}"
                _add_sample(columns, _sample(line, where), where)
    if not columns.prev:
        raise GrpoInputError(path.name, "at least one sample line", got="none")
    return columns


def read_step(
    path: Path, step: int, config: LossConfig | None = None, how: Reading | None = None
) -> common.ImportedStep:
    """One ``train_data_step{N}.jsonl`` as a step file's tensors and meta (every line checked); with the run's
    ``config``, the step's own (``step_config``). The file is streamed line by line within the bounds of
    ``common.regular_file`` and ``common.bounded_lines``, and refused before any grid larger than it justifies."""
    how = how or Reading()
    c = _columns(path)
    common.grid_bound(len(c.prev), max(len(r) for r in c.prev), c.nbytes, path.name)
    placeholder = c.zeros and any(len(r) for r in c.prev)
    if placeholder and not how.force_on_policy_ratio:
        raise GrpoInputError(
            f"{path.name}: prev_logprobs",
            "the old policy's log-probs: these are all 0, the placeholder NeMo RL dumps when force_on_policy_ratio "
            "skips their forward (pass the run's config: --config with loss_fn.force_on_policy_ratio true)",
            got="0 everywhere",
        )
    mask = common.grid(c.masks)
    sampler = common.grid(c.gen, fill=float("nan"))
    # force_on_policy_ratio's placeholder: the run's current and old log-probs are the sampler's (the ratio is 1
    # either way), and the sampler is not also given as such (a gap of 0 would be a number NeMo RL never had)
    logps = common.grid(c.gen if placeholder else c.prev)
    _weights_in_range(torch.where(mask > 0, logps - torch.nan_to_num(sampler), 0.0), mask, how, path.name)
    tensors = {
        "per_token_logps": logps,
        "old_per_token_logps": logps.clone(),
        "completion_mask": mask,
        "advantages": common.row_advantages(common.grid(c.advs), mask, path.name),
    }
    if all(r is not None for r in c.rewards):
        tensors["row_rewards"] = torch.tensor(c.rewards, dtype=torch.float32)
    if not placeholder:  # the sampler's log-probs
        tensors[common.SAMPLER_FIELD] = common.grid(c.gen)
    tensors |= step_schema.sample_tensors(c.more, len(c.prev), path.name)
    common.checked(tensors, path.name)
    meta = {
        "imported_from": path.name,
        "trainer": "nemo-rl",
        "cannot_check": [*CANNOT_CHECK, NOT_RECORDED] if placeholder else CANNOT_CHECK,
        "sampler_vs_old": {"not_recorded": NOT_RECORDED} if placeholder else common.mismatch(logps, sampler, mask),
    }
    own = None if config is None else step_config(config, mask, torch.tensor(c.kept, dtype=torch.float64))
    return common.ImportedStep(step, None, tensors, meta, own)


NOT_RECORDED = (
    "the sampler-vs-trainer mismatch: with force_on_policy_ratio NeMo RL skips the prev_logprobs forward and dumps "
    "zeros, so the run's log-probs are the sampler's (generation_logprobs; the ratio is 1 either way) and NeMo RL's "
    "token_mult_prob_error and gen_kl_error, taken against its current log-probs, are not recorded"
)


def steps(src: Path, config: LossConfig | None = None, how: Reading | None = None) -> Iterator[common.ImportedStep]:
    for step, path in step_files(src):
        yield read_step(path, step, config, how)


def import_nemo_rl(src: str | Path, run_dir: str | Path, loss_config: Any = None) -> Path:
    """Write NeMo RL's dumps in ``src`` as a run at ``run_dir`` (new), under ``map_nemo_rl(loss_config)``
    (``loss_config``: its settings, or a config file's path, composed as NeMo RL's loader does)."""
    src = Path(src)
    files_read: list[str] = []
    if isinstance(loss_config, str | os.PathLike):
        files_read = [str(loss_config)]
        loss_config = read_config(loss_config)
    mapping = map_nemo_rl(loss_config)
    how = reading(loss_config)  # after map_nemo_rl: the settings it refuses are refused first
    files = step_files(src)
    not_read = {name: UNREAD for name in mapping.unused}
    info = {
        "imported": {
            "trainer": "nemo-rl",
            "read_as": READ,
            "from": str(src),
            "files": [p.name for _, p in files],
            "cannot_check": [*CANNOT_CHECK, NOT_RECORDED] if how.force_on_policy_ratio else CANNOT_CHECK,
            "unsupported": mapping.unsupported | not_read,
            "mapped": mapping.mapped | mapping.captured,
            "sampler_log_probs": common.SAMPLER_WHERE,
            **({"config_file": files_read[0]} if files_read else {}),
        }
    }
    return common.write_run(run_dir, "nemo-rl", mapping.config, steps(src, mapping.config, how), info)


UNREAD = (
    "not a field of ClippedPGLossConfig at 7ea279a: NeMo RL keeps it (extra='allow') and its loss never reads it; "
    "the import does not either"
)
