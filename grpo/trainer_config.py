"""Trainer configs -> LossConfig: TRL 1.16 ``GRPOConfig`` and verl 0.9.1's actor config.

``map_trl`` and ``map_verl`` return the LossConfig with where each of the trainer's fields went
(``grpo.trainer_fields`` reads the fields; see there for the four places a field can land).
Semantics: shared/reference/loss-variants-spec.md §1 (TRL) and §2 (verl).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from grpo.config import LossConfig
from grpo.trainer_fields import (
    TRL_DEFAULTS,
    TRL_DIVIDED_BY_GA,
    TRL_LOSS_TYPES,
    VERL_ADVANTAGES,
    VERL_ADVANTAGES_NEED,
    VERL_KL_TYPES,
    VERL_LOSS_MODES,
    VERL_POLICY_LOSS_FIELDS,
    TrainerFields,
    parse_rollout_is_threshold,
    trl_fields,
    verl_fields,
)

# the mapping's tables, where callers have always imported them
__all__ = [
    "TRL_DEFAULTS",
    "TRL_DIVIDED_BY_GA",
    "TRL_LOSS_TYPES",
    "VERL_ADVANTAGES",
    "VERL_ADVANTAGES_NEED",
    "VERL_KL_TYPES",
    "VERL_LOSS_MODES",
    "VERL_POLICY_LOSS_FIELDS",
    "TrainerMapping",
    "from_trl",
    "from_verl",
    "map_trl",
    "map_verl",
    "parse_rollout_is_threshold",
]


@dataclass(frozen=True)
class TrainerMapping:
    """A trainer config as a LossConfig, and where each of its fields went."""

    config: LossConfig
    mapped: dict[str, str] = field(default_factory=dict)
    """trainer field -> the LossConfig field(s) it set."""
    captured: dict[str, str] = field(default_factory=dict)
    """trainer field -> where its effect is in the captured tensors."""
    unsupported: dict[str, str] = field(default_factory=dict)
    """trainer field -> why GRPO Lens does not reproduce its effect on the loss."""
    unused: tuple[str, ...] = ()
    """Fields that do not change the loss of a batch (optimiser, logging, generation engine...)."""

    @property
    def warnings(self) -> list[str]:
        return [f"{name}: {why}" for name, why in self.unsupported.items()]


def _mapping(found: TrainerFields) -> TrainerMapping:
    config = LossConfig.from_trainer_fields(found)
    return TrainerMapping(config, found.mapped, found.captured, found.unsupported, found.unused)


def map_trl(args: Any) -> TrainerMapping:
    """A TRL 1.16 ``GRPOConfig`` (or a dict of its fields) as a LossConfig, with where each field went.

    The returned loss of one micro-batch is reproduced: ``gradient_accumulation_steps`` divides it
    for grpo/bnpo/dr_grpo/sapo/luspo. For dapo/cispo the trainer divides by the generation batch's
    token count (``num_items_in_batch``), known only per batch: ``grpo.capture.trl`` sets
    ``token_normalizer`` from it; without it the batch's own token mean is used.
    """
    return _mapping(trl_fields(args))


def map_verl(actor_config: Any, algorithm: Any = None) -> TrainerMapping:
    """verl 0.9.1's actor config (a dict, an OmegaConf node or an ``ActorConfig``) as a LossConfig.

    ``algorithm`` (optional: ``norm_adv_by_std_in_grpo``) sets the advantage estimator used when
    rewards, not advantages, are given. verl's per-call normalisers (``global_batch_info``:
    ``batch_num_tokens``, ``global_batch_size``, ``dp_size``) are set by ``grpo.capture.verl``.
    """
    return _mapping(verl_fields(actor_config, algorithm))


# LossConfig from a trainer config; unsupported settings warn (strict: raise).
from_trl = LossConfig.from_trl
from_verl = LossConfig.from_verl
