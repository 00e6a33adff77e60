"""The mismatch of one batch, once: the trainer's old (or current, in bypass) log-probs against the sampler's.

``gap_of`` is what the mismatch view's charts and sentences read (grpo.view.mismatch); ``correction_level`` is the
chosen correction's declared level and what acting means for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from grpo.config import LossConfig
from grpo.corrections import ACTION_CODES, CORRECTIONS, KEPT, sampler_log_ratio
from grpo.loss import RolloutLogps


@dataclass(frozen=True)
class Gap:
    """The mismatch of one batch, once: old (or current, in bypass) against the sampler."""

    base: Tensor
    sampler: Tensor | None
    counted: Tensor
    """bool (B, T): counted before rollout_rs."""
    scored: Tensor
    """bool (B, T): counted and scored by the sampler (none without sampler log-probs)."""
    log_ratio: Tensor
    """(B, T) base - sampler, 0 where not scored."""


def correction_level(config: LossConfig) -> tuple[str | None, int]:
    """(level, code): the chosen correction's declared level ("token", "sequence", None for none) and what
    acting means (TRUNCATED or MASKED; KEPT when it does nothing)."""
    entry = CORRECTIONS.entry(config.rollout_correction)
    if entry.level is None or entry.action is None:
        return None, KEPT
    return entry.level, ACTION_CODES[entry.action]


def gap_of(logps: RolloutLogps) -> Gap:
    counted = logps.counted
    base = logps.base.detach()
    if logps.sampler is None:
        none = torch.zeros_like(counted)
        return Gap(base, None, counted, none, torch.zeros_like(base))
    sampler = logps.sampler.detach()
    scored = counted & ~torch.isnan(sampler)
    return Gap(base, sampler, counted, scored, sampler_log_ratio(base, sampler, counted.to(base.dtype)))
