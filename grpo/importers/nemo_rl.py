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
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from grpo import step_schema
from grpo.config import LossConfig
from grpo.errors import GrpoInputError
from grpo.fields import BATCH_FIELDS
from grpo.importers import common
from grpo.runs import read_regular
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
    """NeMo RL's ``ClippedPGLossConfig`` (the ``loss_fn`` section: a dict or the pydantic model; missing
    fields take its defaults) as a LossConfig, with where each field went, like ``map_trl``."""
    given = _fields(cfg)
    a = {**NEMO_RL_DEFAULTS, **given}
    mapped: dict[str, str] = {}
    captured: dict[str, str] = {}
    unsupported: dict[str, str] = {}
    kl_type = a["reference_policy_kl_type"]
    if kl_type not in KL_TYPES:
        raise GrpoInputError("reference_policy_kl_type", f"one of {', '.join(KL_TYPES)}", got=repr(kl_type))
    token_level = bool(a["token_level_loss"])
    penalty = a["reference_policy_kl_penalty"]
    settings: dict[str, Any] = {
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
    mapped |= {
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
    captured["global_valid_toks"] = captured["global_valid_seqs"] = (
        "the step's counts (+ 1e-8), which the import sets per step as token_normalizer and sequence_normalizer: "
        "Σ token_mask · sample_mask and Σ sample_mask, a sample kept with no token included (step_config)"
    )
    if a["use_cispo"]:
        settings |= {"objective": "cispo", "cispo_bounds": "relative"}
        mapped["use_cispo"] = "objective cispo, clamp(ratio, 1 - ratio_clip_min, 1 + ratio_clip_max)"
    if a["disable_ppo_ratio"]:
        settings["objective"] = "gpg"
        mapped["disable_ppo_ratio"] = "objective gpg (REINFORCE: A * logp, no ratio)"
        if a["ratio_clip_c"] is not None:
            unsupported["ratio_clip_c"] = "NeMo RL caps -A * logp at -A * c for A < 0 when the ratio is off"
    if a["force_on_policy_ratio"]:
        captured["force_on_policy_ratio"] = "the ratio is 1: old log-probs equal to the current ones in the batch"
    if settings["beta"] > 0:
        unsupported["reference_policy_kl_penalty"] = (
            "NeMo RL multiplies the KL by exp(logp - sg(logp)) (value 1): the KL's value is reproduced, not its "
            "gradient's score-function term"
        )
        if a["use_on_policy_kl_approximation"]:
            unsupported["use_on_policy_kl_approximation"] = "the KL weighted by exp(logp - sampler) is not applied"
    if a["use_importance_sampling_correction"]:
        kind = a["truncated_importance_sampling_type"] or "plain"
        unsupported["use_importance_sampling_correction"] = (
            f"the sampler importance weights exp(prev - generation) ({kind}) are not applied"
        )
    if a["positive_example_nll_weight"]:
        unsupported["positive_example_nll_weight"] = "VAPO's NLL term on correct samples is not part of the loss"
    for name in (
        "disable_ppo_ratio",
        "use_cispo",
        "force_on_policy_ratio",
        "use_on_policy_kl_approximation",
        "use_importance_sampling_correction",
        "truncated_importance_sampling_type",
        "truncated_importance_sampling_ratio",
        "truncated_importance_sampling_ratio_min",
        "positive_example_nll_weight",
    ):
        if name in given and name not in mapped | captured | unsupported:
            mapped[name] = "nothing: at this value it leaves the loss unchanged"
    known = set(mapped) | set(captured) | set(unsupported)
    unused = tuple(sorted(name for name in given if name not in known))
    return TrainerMapping(LossConfig(**settings), mapped, captured, unsupported, unused)


def _fields(cfg: Any) -> dict[str, Any]:
    if cfg is None:
        return {}
    if hasattr(cfg, "model_dump"):  # NeMo RL's pydantic ClippedPGLossConfig
        cfg = cfg.model_dump()
    if not isinstance(cfg, Mapping):
        raise GrpoInputError("config", "NeMo RL's loss_fn settings: a mapping", got=type(cfg).__name__)
    if isinstance(cfg.get("loss_fn"), Mapping):  # the whole master config
        cfg = cfg["loss_fn"]
    return {str(k): v for k, v in cfg.items()}


# --- the dump ------------------------------------------------------------------------------------
def step_files(src: Path) -> list[tuple[int, Path]]:
    """(step, path) of every ``train_data_step{N}.jsonl`` directly in ``src``, by step."""
    if not src.is_dir():
        raise GrpoInputError("DIR", "a directory holding NeMo RL's train_data_step*.jsonl", got=str(src))
    found = sorted((int(m[1]), p) for p in src.iterdir() if (m := STEP_FILE.fullmatch(p.name)) and p.is_file())
    if not found:
        raise GrpoInputError("DIR", "NeMo RL's train_data_step*.jsonl files", got=f"none in {src}")
    return found


def _unbatched(value: Any) -> Any:
    """A value of a batch of one (``[x]``, ``[[...]]``) as the sample's own."""
    return value[0] if isinstance(value, list) and len(value) == 1 else value


def _token_row(sample: dict[str, Any], key: str, where: str) -> Tensor:
    if key not in sample:
        raise GrpoInputError(key, f"a per-token list in every line ({where})", got="missing")
    value = _unbatched(sample[key])
    if not isinstance(value, list) or any(isinstance(v, list | dict | str | bool) for v in value):
        raise GrpoInputError(key, f"a list of numbers, one per token ({where})", got=type(value).__name__)
    try:
        return torch.tensor([float("nan") if v is None else v for v in value], dtype=torch.float64)
    except (TypeError, ValueError, OverflowError) as exc:
        raise GrpoInputError(key, f"a list of numbers, one per token ({where})") from exc


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


def read_step(path: Path, step: int, config: LossConfig | None = None) -> common.ImportedStep:
    """One ``train_data_step{N}.jsonl`` as a step file's tensors and meta (every line checked); with the run's
    ``config``, the step's own (``step_config``)."""
    prev, gen, masks, advs, rewards, kept = [], [], [], [], [], []
    more: dict[str, list[Any]] = {}  # the other registered fields, by the lines that hold them
    lines = read_regular(path).decode("utf-8", errors="replace").splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path.name} line {n}"
        try:
            sample = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise GrpoInputError(where, "one complete JSON object per line", got=str(exc)[:80]) from exc
        if not isinstance(sample, dict):
            raise GrpoInputError(where, "a JSON object", got=type(sample).__name__)
        rows = {k: _token_row(sample, k, where) for k in PER_TOKEN}
        widths = {k: len(v) for k, v in rows.items()}
        if len(set(widths.values())) != 1:
            got = ", ".join(f"{k} {w}" for k, w in widths.items())
            raise GrpoInputError(where, "per-token lists of one length", got=got)
        keep = _row_number(sample, "sample_loss_mask", 1.0, where)
        kept.append(keep or 0.0)
        # the loss reads [:, 1:]: position 0 (the first prompt token) is never scored
        prev.append(rows["prev_logprobs"][1:])
        gen.append(rows["generation_logprobs"][1:])
        masks.append(rows["token_loss_mask"][1:] * (keep or 0.0))
        advs.append(rows["advantages"][1:])
        rewards.append(_row_number(sample, "rewards", None, where))
        for name, key in step_schema.dumped_fields(sample, TAKEN).items():
            if BATCH_FIELDS[name].shape == "token":  # aligned with token_ids, as the loss reads it: [1:]
                values = _token_row(sample, key, where)
                if len(values) != len(rows["prev_logprobs"]):
                    raise GrpoInputError(key, f"one value per token like prev_logprobs ({where})", got=str(len(values)))
                more.setdefault(name, []).append(values[1:])
            else:
                number = _row_number(sample, key, None, where)
                more.setdefault(name, []).append(math.nan if number is None else number)
    if not prev:
        raise GrpoInputError(path.name, "at least one sample line", got="none")
    mask = common.grid(masks)
    logps = common.grid(prev)
    tensors = {
        "per_token_logps": logps,
        "old_per_token_logps": logps.clone(),
        "completion_mask": mask,
        "advantages": common.row_advantages(common.grid(advs), mask, path.name),
    }
    if all(r is not None for r in rewards):
        tensors["row_rewards"] = torch.tensor(rewards, dtype=torch.float32)
    sampler, sampler_meta = common.sampler_entry(gen)
    tensors |= sampler
    tensors |= step_schema.sample_tensors(more, len(prev), path.name)
    common.checked(tensors, path.name)
    meta = {
        "imported_from": path.name,
        "trainer": "nemo-rl",
        "cannot_check": CANNOT_CHECK,
        "sampler_vs_old": common.mismatch(logps, common.grid(gen, fill=float("nan")), mask),
        **sampler_meta,
    }
    own = None if config is None else step_config(config, mask, torch.tensor(kept, dtype=torch.float64))
    return common.ImportedStep(step, None, tensors, meta, own)


def steps(src: Path, config: LossConfig | None = None) -> Iterator[common.ImportedStep]:
    for step, path in step_files(src):
        yield read_step(path, step, config)


def import_nemo_rl(src: str | Path, run_dir: str | Path, loss_config: Any = None) -> Path:
    """Write NeMo RL's dumps in ``src`` as a run at ``run_dir`` (new), under ``map_nemo_rl(loss_config)``."""
    src = Path(src)
    mapping = map_nemo_rl(loss_config)
    files = step_files(src)
    info = {
        "imported": {
            "trainer": "nemo-rl",
            "read_as": READ,
            "from": str(src),
            "files": [p.name for _, p in files],
            "cannot_check": CANNOT_CHECK,
            "unsupported": mapping.unsupported,
            "mapped": mapping.mapped,
            "sampler_log_probs": common.SAMPLER_WHERE[common.sampler_is_a_field()],
        }
    }
    return common.write_run(run_dir, "nemo-rl", mapping.config, steps(src, mapping.config), info)
