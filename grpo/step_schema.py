"""One step schema: the tensors a run's step file holds, and when each is required.

Nothing here lists a step file's tensors: they follow from the batch-field table and the config.
- Every registered batch field a writer has (``grpo.fields.BATCH_FIELDS``, a plugin's included) is kept, under
  its table name (an alias such as verl's ``log_prob`` is renamed); beside them the display tensors
  (``row_rewards``, ``row_groups``) and what the trainer applied (``importance_sampling_ratio``). Anything
  else a writer hands over (TRL's ``prompt_ids``...) is not part of the step.
- What the config's loss reads is required: ``per_token_logps`` always (the table's ``required``), the
  advantages or what they are computed from (and what that estimator ``needs``), and each field a setting
  reads (``READS``): entropies under ``entropy_coef > 0`` or ``top_entropy_quantile < 1``, the sampler's
  log-probs under a rollout correction... A field the loss reads but can stand in for (the reference
  log-probs: the current policy, KL 0) is not required; ``stand_ins`` says which the step leaves to them.

Every writer (TRL and verl capture, the lab, the importers) writes through ``RunWriter.write_step``, which
calls ``step_tensors``: a step the loss could not reproduce is refused when it is written, naming the field
and the setting that reads it, not when check-run reads it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from grpo.advantages import ADVANTAGES
from grpo.config import LossConfig
from grpo.errors import GrpoInputError
from grpo.fields import ALIASES, BATCH_FIELDS

DISPLAY_TENSORS = ("row_rewards", "row_groups")
"""Tensors a step file may hold that are not batch fields: shown, never used by the loss."""
TRAINER_TENSORS = ("importance_sampling_ratio",)
"""What the trainer applied, recorded to be compared by check-run (never an input): TRL's importance-sampling
ratio of the rollout correction, (rows, positions) at token level or (rows, 1) at sequence level."""
TARGETS = ("advantages", "rewards", "token_level_rewards")
"""The loss reads one of these: the advantages as given, or the rewards they are computed from."""


@dataclass(frozen=True)
class Reads:
    """A setting under which the loss reads a batch field."""

    field: str
    setting: str
    """The LossConfig field whose value decides."""
    on: Callable[[LossConfig], bool]
    """Whether the loss reads ``field`` under this config."""
    what: str
    """What the loss does with it, for the error."""
    stand_in: str = ""
    """What the loss takes when the field is absent ("" = nothing: the field is required)."""


READS = (
    Reads("entropies", "entropy_coef", lambda c: c.entropy_coef > 0, "the entropy bonus, -entropy_coef · mean entropy"),
    Reads("entropies", "top_entropy_quantile", lambda c: c.top_entropy_quantile < 1, "the high-entropy mask"),
    Reads("sampling_per_token_logps", "rollout_bypass", lambda c: c.rollout_bypass, "the old log-probs of bypass"),
    Reads(
        "sampling_per_token_logps",
        "rollout_correction",
        lambda c: c.rollout_correction != "none",
        "the importance weights on the policy term",
    ),
    Reads("sampling_per_token_logps", "rollout_rs", lambda c: c.rollout_rs is not None, "the rejection of tokens"),
    Reads(
        "ref_per_token_logps",
        "beta",
        lambda c: c.beta > 0,
        "the KL penalty",
        stand_in="the current policy's log-probs: the KL is 0",
    ),
)


def required(config: LossConfig, names: Collection[str]) -> dict[str, str]:
    """Every field the loss reads under ``config`` from a step holding ``names``, with why it is required."""
    out = {name: "the loss reads it" for name, f in BATCH_FIELDS.items() if f.required}
    if not any(name in names for name in TARGETS):
        out["advantages"] = f"the loss reads the advantages (or {', '.join(TARGETS[1:])} to compute them from)"
    elif "advantages" not in names:  # computed from the rewards: the estimator's inputs too
        for name in ADVANTAGES.entry(config.advantage).needs:
            out.setdefault(name, f"advantage={config.advantage} reads it to compute the advantages from the rewards")
    for r in READS:
        if not r.stand_in and r.on(config):
            out.setdefault(r.field, f"{r.setting}={getattr(config, r.setting)} reads it ({r.what})")
    return out


def missing_for(config: LossConfig, names: Collection[str]) -> list[str]:
    """Each field the loss reads under ``config`` that ``names`` lacks, as "field: required because ..."."""
    return [f"{name}: required because {why}" for name, why in required(config, names).items() if name not in names]


def stand_ins(config: LossConfig, names: Collection[str]) -> dict[str, str]:
    """The fields the loss reads under ``config`` that ``names`` lacks and the loss stands in for, with what
    it takes instead: a recomputed loss that a trainer's own need not match (KL 0 without reference log-probs)."""
    return {
        r.field: f"{r.setting}={getattr(config, r.setting)} reads it ({r.what}); absent, the loss takes {r.stand_in}"
        for r in READS
        if r.stand_in and r.field not in names and r.on(config)
    }


def step_names() -> tuple[str, ...]:
    """Every tensor name a step file may hold: the batch fields registered now, then the display and trainer
    tensors."""
    return (*BATCH_FIELDS, *DISPLAY_TENSORS, *TRAINER_TENSORS)


def step_tensors(given: Mapping[str, Any], config: LossConfig) -> dict[str, Tensor]:
    """The tensors of one step file from what a writer has (``given``: its batch, under the table's names or
    aliases, with anything else it holds): every registered field present, the display and trainer tensors,
    detached; None values are absent. A GrpoInputError names a field given twice (name and alias) or the
    first field the loss reads under ``config`` that is missing, and the setting that reads it."""
    known = set(step_names())
    out: dict[str, Tensor] = {}
    for key, value in given.items():
        name = ALIASES.get(key, key)
        if value is None or name not in known:
            continue
        if name in out:
            raise GrpoInputError(key, f"one of {name} or its aliases, not both")
        out[name] = value.detach() if isinstance(value, Tensor) else torch.as_tensor(value)
    storages: set[int] = set()
    for name, tensor in out.items():  # safetensors refuses tensors that share memory (old = current, on-policy)
        storage = tensor.untyped_storage().data_ptr()
        if storage in storages and tensor.numel():
            out[name] = tensor.clone()
        storages.add(storage)
    for name, why in required(config, out).items():
        if name not in out:
            raise GrpoInputError(name, f"a tensor of the step: required because {why}", got="none")
    return out


def dumped_fields(keys: Iterable[str], taken: Collection[str]) -> dict[str, str]:
    """{field: the key it is under} for the per-token and per-row fields of the table that a sample of a
    trainer's dump holds among ``keys`` (by name or alias) and that its importer does not read already
    (``taken``: the dump's keys it reads and the fields it writes): what an importer adds to each step as the
    field, a plugin's included."""
    found: dict[str, str] = {}
    for key in keys:
        name = ALIASES.get(key, key)
        per_sample = name in BATCH_FIELDS and BATCH_FIELDS[name].shape != "batch"
        if per_sample and key not in taken and name not in taken and name not in found:
            found[name] = key
    return found


def sample_tensors(values: Mapping[str, Sequence[Any]], samples: int, where: str) -> dict[str, Tensor]:
    """The fields ``dumped_fields`` found, one value per sample each, as a step's tensors: (B, T) per token (1-D
    rows, 0 past each row's end), (B,) per row; a field that some of the ``samples`` lack is refused."""
    out = {}
    for name, given in values.items():
        if len(given) != samples:
            raise GrpoInputError(name, f"in every sample or in none ({where})", got=f"in {len(given)} of {samples}")
        if BATCH_FIELDS[name].shape == "token":
            rows = [torch.as_tensor(v, dtype=torch.float32) for v in given]
            out[name] = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)
        else:
            out[name] = torch.tensor([float(v) for v in given], dtype=torch.float32)
    return out
