"""What every policy objective takes and returns, and the objective registry.

Every objective takes ``ratio`` ((B, T), or (B, 1) at sequence level; differentiable),
``logp`` ((B, T), the current log-probs; differentiable), ``advantages`` ((B, 1), constant; (B, T) when
the batch gives them per token, as verl hands them to its losses),
its ``settings`` (the few fields of ObjectiveSettings; a LossConfig is one) and ``inputs``
(ObjectiveInputs: the old log-probs, the log-ratio and the mask, which verl's later losses read;
None where a caller has only a ratio, as the clip view's curves), and returns ``ObjectiveTerms``.
The policy loss of a token is ``-surrogate``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

from grpo.registry import ObjectiveEntry, Registry

# The axis titles of the clip view's curves (drawn with A = ±1 and logp = 1).
PER_UNIT_A = "objective / |A|"
WEIGHT_ON_A_LOGP = "weight on A·logp"


@dataclass(frozen=True)
class ObjectiveTerms:
    """What an objective computes for each token."""

    surrogate: Tensor
    """(B, T) or (B, 1): the objective term before weighting; the policy loss is -surrogate."""
    clipped_ratio: Tensor
    """The ratio after the objective's bounds (clip: TRL's coef_2; CISPO: the capped weight)."""
    region: Tensor
    """Region codes (see REGIONS) as floats, before masking; broadcastable to the surrogate: (1, ..., 1) when every
    token is in the trust region (``regions`` without indicators)."""
    flags: dict[str, Tensor] = field(default_factory=dict)
    """0.0/1.0 indicators keyed by the trainer's metric name; the caller takes their masked mean."""
    weight: Tensor | None = None
    """(B, T): the policy term's own aggregation, for objectives that aggregate themselves (verl's geo_mean
    averages one term per row whatever loss_agg_mode says); None: the config's aggregation. The KL term
    keeps the config's aggregation either way."""
    selected: Tensor | None = None
    """(B, T) 1.0 on the tokens the objective's own rule picked (Clip-Cov's cut, KL-Cov's penalised), else 0.0;
    None when it picks none. Its why names them (Why.selected)."""
    zero_outside: bool = False
    """Whether ``surrogate`` is (B, T) and ±0 wherever the mask is 0 (so surrogate · mask is surrogate itself, to the
    bit): a multiple of logp (and of the log-ratio), which the batch holds at 0 there (``inputs.zero_outside``)."""


@dataclass(frozen=True)
class ObjectiveInputs:
    """What an objective may read beyond the ratio: the batch's constants and the log-ratio."""

    old: Tensor
    """(B, T) old log-probs (constant)."""
    log_ratio: Tensor
    """(B, T) logp - old after log_ratio_clamp (differentiable); ratio = exp(log_ratio) at token level."""
    mask: Tensor
    """(B, T) 1.0 where a token counts, else 0.0."""
    zero_outside: bool = False
    """Whether log_ratio is 0 wherever mask is 0 (so log_ratio · mask is log_ratio itself)."""

    def counted_log_ratio(self, x: Tensor) -> Tensor:
        """``x`` (a function of the log-ratio that is 0 at 0) times the mask: x itself when it is 0 there already."""
        return x if self.zero_outside else x * self.mask


def zero_outside(inputs: ObjectiveInputs | None) -> bool:
    """Whether a surrogate that is a multiple of logp (and of the log-ratio) is ±0 wherever the mask is 0."""
    return inputs is not None and inputs.zero_outside


def inputs_of(ratio: Tensor, logp: Tensor) -> ObjectiveInputs:
    """The inputs implied by a token ratio and the log-probs, every token counted (the curves' case)."""
    log_ratio = ratio.log().expand_as(logp)
    return ObjectiveInputs(old=(logp - log_ratio).detach(), log_ratio=log_ratio, mask=torch.ones_like(logp))


def given_inputs(ratio: Tensor, logp: Tensor, inputs: ObjectiveInputs | None) -> ObjectiveInputs:
    """``inputs``, or those a token ratio implies when the caller has only the ratio."""
    return inputs_of(ratio, logp) if inputs is None else inputs


class ObjectiveSettings(Protocol):
    """The settings objectives read (LossConfig fields)."""

    @property
    def epsilon_low(self) -> float:
        """The clip's lower side: the ratio's bound 1 - epsilon_low (geo_mean: the log-ratio's -epsilon_low)."""

    @property
    def epsilon_high(self) -> float:
        """The clip's upper side: the ratio's bound 1 + epsilon_high (CISPO absolute: the cap itself)."""

    @property
    def dual_clip(self) -> float | None:
        """verl's dual clip c: an A < 0 token's objective is at least c·A (None: off)."""

    @property
    def delta(self) -> float | None:
        """TRL's cap on the unclipped candidate's ratio (None: off)."""

    @property
    def cispo_bounds(self) -> str:
        """CISPO's weight bounds: absolute (TRL) or relative (verl)."""

    @property
    def sapo_temperature_pos(self) -> float:
        """SAPO's gate temperature for A > 0."""

    @property
    def sapo_temperature_neg(self) -> float:
        """SAPO's gate temperature for A <= 0."""

    @property
    def vespo_k_pos(self) -> float:
        """VESPO's gamma weight shape k for A >= 0."""

    @property
    def vespo_lambda_pos(self) -> float:
        """VESPO's gamma weight rate lambda for A >= 0."""

    @property
    def vespo_k_neg(self) -> float:
        """VESPO's gamma weight shape k for A < 0."""

    @property
    def vespo_lambda_neg(self) -> float:
        """VESPO's gamma weight rate lambda for A < 0."""

    @property
    def clip_cov_ratio(self) -> float:
        """Clip-Cov: the share of counted tokens whose term is cut."""

    @property
    def clip_cov_lb(self) -> float:
        """Clip-Cov: a candidate's covariance is above this."""

    @property
    def clip_cov_ub(self) -> float:
        """Clip-Cov: a candidate's covariance is below this."""

    @property
    def clip_cov_seed(self) -> int:
        """Clip-Cov: the seed of the draw among the candidates."""

    @property
    def kl_cov_ratio(self) -> float:
        """KL-Cov: the share of counted tokens that get the |log-ratio| penalty."""

    @property
    def ppo_kl_coef(self) -> float:
        """KL-Cov: the coefficient of the |log-ratio| penalty."""

    @property
    def dro_beta(self) -> float | None:
        """DRO: the coefficient of its quadratic log-ratio penalty (None: DRO raises)."""


class Objective(Protocol):
    """The one signature of every registered objective."""

    def __call__(
        self,
        ratio: Tensor,
        logp: Tensor,
        advantages: Tensor,
        config: ObjectiveSettings,
        inputs: ObjectiveInputs | None = None,
    ) -> ObjectiveTerms: ...

    def __hash__(self) -> int: ...  # functions are: the clip view's curve cache keys on them


class ObjectiveRegistry(Registry[Objective]):
    """The objective registry: an objective written before ObjectiveInputs existed (a plugin's
    ``fn(ratio, logp, advantages, settings)``) is registered behind an adapter that drops ``inputs``,
    so every entry is called the same way."""

    entry_type = ObjectiveEntry

    def entry(self, name: str) -> ObjectiveEntry[Objective]:
        return self.typed(name, ObjectiveEntry)

    def entries(self) -> Iterator[ObjectiveEntry[Objective]]:
        return (self.entry(name) for name in self.names())

    def register(self, name: str, *, label: str | None = None, **facts: Any) -> Callable[[Objective], Objective]:
        add = super().register(name, label=label, **facts)

        def decorate(fn: Objective) -> Objective:
            if len(inspect.signature(fn).parameters) >= 5:
                add(fn)
                return fn

            @functools.wraps(fn)
            def adapted(
                ratio: Tensor,
                logp: Tensor,
                advantages: Tensor,
                config: ObjectiveSettings,
                inputs: ObjectiveInputs | None = None,
            ) -> ObjectiveTerms:
                return fn(ratio, logp, advantages, config)

            add(adapted)
            return fn

        return decorate


OBJECTIVES = ObjectiveRegistry("objective")
