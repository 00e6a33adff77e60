"""Per-token policy objectives: the term each token adds to J before aggregation.

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
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

from grpo.errors import GrpoInputError
from grpo.marks import mark
from grpo.registry import ObjectiveEntry, Reduction, Registry, Setting, Why

# Region codes of a token: which branch of the objective is active.
REGIONS: tuple[str, ...] = ("masked", "trust", "clip_low", "clip_high", "dual_clip")
MASKED, TRUST, CLIP_LOW, CLIP_HIGH, DUAL_CLIP = range(len(REGIONS))

# The defaults of the variants' own settings: the trainers' defaults (TRL 1.16 GRPOConfig, verl 0.9.1
# PolicyLossConfig and actor tau_pos / tau_neg agree), and LossConfig's.
SAPO_TEMPERATURE_POS = 1.0
SAPO_TEMPERATURE_NEG = 1.05
VESPO_K_POS = 2.0
VESPO_LAMBDA_POS = 3.0
VESPO_K_NEG = 3.0
VESPO_LAMBDA_NEG = 2.0
CLIP_COV_RATIO = 0.0002
CLIP_COV_LB = 1.0
CLIP_COV_UB = 5.0
KL_COV_RATIO = 0.0002
PPO_KL_COEF = 0.1

# The objectives' own settings, declared in their registrations below; LossConfig offers each under its name.
CISPO_SETTINGS = (
    Setting(
        "cispo_bounds",
        "absolute",
        "CISPO weight bounds: absolute = min(ratio, epsilon_high) (TRL); relative = "
        "clamp(ratio, 1 - epsilon_low, 1 + epsilon_high) (verl).",
        str,
        choices=("absolute", "relative"),
    ),
)
SAPO_SETTINGS = (
    Setting(
        "sapo_temperature_pos",
        SAPO_TEMPERATURE_POS,
        "SAPO gate temperature for A > 0.",
        gt=0.0,
        trl="sapo_temperature_pos",
        verl="tau_pos",
    ),
    Setting(
        "sapo_temperature_neg",
        SAPO_TEMPERATURE_NEG,
        "SAPO gate temperature for A <= 0.",
        gt=0.0,
        trl="sapo_temperature_neg",
        verl="tau_neg",
    ),
)
VESPO_SETTINGS = (
    Setting("vespo_k_pos", VESPO_K_POS, "TRL vespo: the gamma weight's shape k for A >= 0.", ge=0.0, trl="vespo_k_pos"),
    Setting(
        "vespo_lambda_pos",
        VESPO_LAMBDA_POS,
        "TRL vespo: the gamma weight's rate lambda for A >= 0 (TRL clamps it to at least 1e-4).",
        trl="vespo_lambda_pos",
    ),
    Setting("vespo_k_neg", VESPO_K_NEG, "TRL vespo: the gamma weight's shape k for A < 0.", ge=0.0, trl="vespo_k_neg"),
    Setting(
        "vespo_lambda_neg",
        VESPO_LAMBDA_NEG,
        "TRL vespo: the gamma weight's rate lambda for A < 0 (TRL clamps it to at least 1e-4).",
        trl="vespo_lambda_neg",
    ),
)
CLIP_COV_SETTINGS = (
    Setting(
        "clip_cov_ratio",
        CLIP_COV_RATIO,
        "verl clip_cov: the share of counted tokens whose gradient is cut (at least one).",
        gt=0.0,
        le=1.0,
        verl="policy_loss.clip_cov_ratio",
    ),
    Setting(
        "clip_cov_lb",
        CLIP_COV_LB,
        "verl clip_cov: candidates have covariance above this.",
        verl="policy_loss.clip_cov_lb",
    ),
    Setting(
        "clip_cov_ub",
        CLIP_COV_UB,
        "verl clip_cov: candidates have covariance below this.",
        verl="policy_loss.clip_cov_ub",
    ),
    Setting(
        "clip_cov_seed",
        0,
        "verl clip_cov draws its tokens with torch.randperm: the seed of that draw (verl's process RNG state).",
        int,
        ge=0,
    ),
)
KL_COV_SETTINGS = (
    Setting(
        "kl_cov_ratio",
        KL_COV_RATIO,
        "verl kl_cov: the share of counted tokens (the highest covariance, at least one) that get the |log-ratio| "
        "penalty.",
        gt=0.0,
        le=1.0,
        verl="policy_loss.kl_cov_ratio",
    ),
    Setting(
        "ppo_kl_coef",
        PPO_KL_COEF,
        "verl kl_cov: the coefficient of the |log-ratio| penalty.",
        ge=0.0,
        verl="policy_loss.ppo_kl_coef",
    ),
)
DRO_SETTINGS = (
    Setting(
        "dro_beta",
        None,
        "verl dro: the quadratic log-ratio penalty ½·dro_beta·(logp - old)²; required by dro.",
        nullable=True,
        gt=0.0,
        verl="policy_loss.dro_beta",
    ),
)


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


class ObjectiveSettings(Protocol):
    """The settings objectives read (LossConfig fields)."""

    @property
    def epsilon_low(self) -> float: ...
    @property
    def epsilon_high(self) -> float: ...
    @property
    def dual_clip(self) -> float | None: ...
    @property
    def delta(self) -> float | None: ...
    @property
    def cispo_bounds(self) -> str: ...
    @property
    def sapo_temperature_pos(self) -> float: ...
    @property
    def sapo_temperature_neg(self) -> float: ...
    @property
    def vespo_k_pos(self) -> float: ...
    @property
    def vespo_lambda_pos(self) -> float: ...
    @property
    def vespo_k_neg(self) -> float: ...
    @property
    def vespo_lambda_neg(self) -> float: ...
    @property
    def clip_cov_ratio(self) -> float: ...
    @property
    def clip_cov_lb(self) -> float: ...
    @property
    def clip_cov_ub(self) -> float: ...
    @property
    def clip_cov_seed(self) -> int: ...
    @property
    def kl_cov_ratio(self) -> float: ...
    @property
    def ppo_kl_coef(self) -> float: ...
    @property
    def dro_beta(self) -> float | None: ...


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

# The axis titles of the clip view's curves (drawn with A = ±1 and logp = 1).
PER_UNIT_A = "objective / |A|"
WEIGHT_ON_A_LOGP = "weight on A·logp"
# TRL's clip metrics reduce as TRL does; verl's actor/* always over the counted tokens.
CLIP_FAMILY_METRICS: dict[str, Reduction] = {
    "clip_ratio/low_mean": "trl",
    "clip_ratio/low_min": "trl",
    "clip_ratio/high_mean": "trl",
    "clip_ratio/high_max": "trl",
    "clip_ratio/region_mean": "trl",
    "actor/pg_clipfrac": "tokens",
    "actor/pg_clipfrac_lower": "tokens",
}


def above(x: Tensor, threshold: float | Tensor) -> Tensor:
    """1.0 where x > threshold, else 0.0, in x's dtype.

    Indicators stay floats, written straight from the comparison: on CPU builds the bool paths
    (``where``, ``masked_fill``, bool sums) run tens of times slower than float arithmetic.
    """
    return torch.gt(x, threshold, out=torch.empty_like(x))


def below(x: Tensor, threshold: float | Tensor) -> Tensor:
    """1.0 where x < threshold, else 0.0, in x's dtype."""
    return torch.lt(x, threshold, out=torch.empty_like(x))


def regions(
    like: Tensor, clip_low: Tensor | None = None, clip_high: Tensor | None = None, dual_clip: Tensor | None = None
) -> Tensor:
    """Float region codes from disjoint 0/1 indicators: TRUST where none is 1. Without indicators every token is
    in the trust region: one TRUST of shape (1, ..., 1) that broadcasts to ``like`` (no (B, T) pass)."""
    indicators = ((CLIP_LOW, clip_low), (CLIP_HIGH, clip_high), (DUAL_CLIP, dual_clip))
    given = [(code, indicator) for code, indicator in indicators if indicator is not None]
    if not given:
        return like.new_full((1,) * like.dim(), TRUST)
    # TRUST + Σ (code - TRUST)·indicator: small integers, exact in any order; one pass per indicator, one for TRUST
    (code, first), rest = given[0], given[1:]
    if rest and code - TRUST == 1:
        region = torch.add(first, rest[0][1], alpha=rest[0][0] - TRUST)
        rest = rest[1:]
    else:
        region = first * (code - TRUST)
    for code, indicator in rest:
        region = torch.add(region, indicator, alpha=code - TRUST)
    return region.add_(TRUST).expand_as(like)


def clipped_surrogate(ratio: Tensor, advantages: Tensor, config: ObjectiveSettings) -> Tensor:
    """The clipped surrogate as the papers write it (PPO eq. 7; CleanRL's ppo.py), for autograd.

    The reference form: the ratio, the two candidates, their minimum; then TRL's delta (a cap on
    the unclipped candidate's ratio) and verl's dual clip (for A < 0, the objective is at least
    c·A). ``clip`` below is its fast path, with the same value and gradient (tests hold them equal).
    """
    ratio_capped = ratio if config.delta is None else ratio.clamp(max=config.delta)
    ratio_clipped = ratio.clamp(1 - config.epsilon_low, 1 + config.epsilon_high)
    surrogate = torch.minimum(ratio_capped * advantages, ratio_clipped * advantages)
    if config.dual_clip is not None:
        surrogate = torch.where(advantages < 0, torch.maximum(surrogate, config.dual_clip * advantages), surrogate)
    return surrogate


def clip_warnings(config: ObjectiveSettings, longest_row: int) -> list[str]:
    if config.delta is not None and config.delta < 1 + config.epsilon_high:
        return ["delta < 1 + epsilon_high: TRL recommends delta > 1 + epsilon_high."]
    return []


CLIP_WHY_NAMES = ("masked", "trust", "clip_low", "clip_high", "dual_clip", "delta", "unbounded")


def clip_why_codes(ratio: Tensor, advantages: Tensor, region: Tensor, config: ObjectiveSettings) -> Tensor:
    """Which bound acted on each token of the clipped surrogate, as indices into CLIP_WHY_NAMES.

    The region's dual_clip code covers both caps on A < 0 tokens: the dual clip where its bound c was
    passed, else TRL's delta. A trust-region token with A < 0 above 1 + ε_high keeps A·ratio (the
    pessimistic candidate): with neither cap set nothing bounds it, so it is ``unbounded``.
    """
    code = region.long()  # masked, trust, clip_low, clip_high, dual_clip: the first five names, in order
    if config.delta is not None and config.dual_clip is not None:  # both caps: the dual clip where it acted
        capped = torch.maximum(
            ratio.clamp(max=config.delta), ratio.clamp(1 - config.epsilon_low, 1 + config.epsilon_high)
        )
        by_delta = (code == DUAL_CLIP) & (capped <= config.dual_clip)
        code = torch.where(by_delta, torch.full_like(code, 5), code)
    elif config.delta is not None:
        code = torch.where(code == DUAL_CLIP, torch.full_like(code, 5), code)
    if config.delta is None and config.dual_clip is None:
        free = (code == TRUST) & (advantages < 0) & (ratio > 1 + config.epsilon_high)
        code = torch.where(free, torch.full_like(code, 6), code)
    return code


def clip_why_values(config: ObjectiveSettings) -> dict[str, float | None]:
    return {
        "low": 1 - config.epsilon_low,
        "high": 1 + config.epsilon_high,
        "c": config.dual_clip,
        "delta": config.delta,
    }


CLIP_WHY = Why(
    names=CLIP_WHY_NAMES,
    codes=clip_why_codes,
    texts={
        "masked": "does not count (prompt, padding or masked out)",
        "trust": "unclipped: the surrogate is A·ratio, the ratio used as is (inside [1 − ε_low, 1 + ε_high] = "
        "[{low}, {high}], or moved against its advantage), so the token gets a policy gradient",
        "clip_low": "clipped low: A < 0 and ratio below 1 − ε_low = {low}, so the surrogate is the clipped "
        "{low}·A, flat in the ratio: no policy gradient",
        "clip_high": "clipped high: A > 0 and ratio above 1 + ε_high = {high}, so the surrogate is the clipped "
        "{high}·A, flat in the ratio: no policy gradient",
        "dual_clip": "dual clip: A < 0 and ratio past the bound dual_clip = {c}, so the surrogate is held at "
        "{c}·A, flat in the ratio: no policy gradient",
        "delta": "delta: A < 0 and ratio above delta = {delta}, TRL's cap on the ratio, so the surrogate is "
        "{delta}·A, flat in the ratio: no policy gradient",
        "unbounded": "unbounded: A < 0 and ratio above 1 + ε_high = {high}; the pessimistic min keeps A·ratio, "
        "no clip bound acts, and the token's loss and gradient grow with its ratio (dual_clip = {c}, "
        "delta = {delta}: setting either bounds it)",
    },
    values=clip_why_values,
    no_gradient=frozenset({"clip_low", "clip_high", "dual_clip", "delta"}),
    labels={"dual_clip": "held by the dual clip", "delta": "capped by delta"},
)


@OBJECTIVES.register(
    "clip",
    label="PPO clip",
    axis=PER_UNIT_A,
    flat="clipped: the chosen candidate is flat in the ratio, so the token gets no policy gradient",
    metrics=CLIP_FAMILY_METRICS,
    warnings=clip_warnings,
    why=CLIP_WHY,
)
def clip(
    ratio: Tensor, logp: Tensor, advantages: Tensor, config: ObjectiveSettings, inputs: ObjectiveInputs | None = None
) -> ObjectiveTerms:
    """PPO/GRPO clipped surrogate min(r·A, clip(r, 1-ε_low, 1+ε_high)·A), with dual clip and delta.

    ``epsilon_high > epsilon_low`` is DAPO's clip-higher. ``dual_clip`` c (verl ``clip_ratio_c``,
    Ye et al. 2019) bounds the loss of A < 0 tokens at -c·A. ``delta`` (TRL, INTELLECT-2) caps the
    unclipped ratio at delta; for A < 0 and delta >= 1 + ε_high it equals a dual clip at delta.
    Tokens in a flat region get no policy gradient.
    Paper: https://arxiv.org/abs/1707.06347
    """
    # The fast path of clipped_surrogate: the value on the detached ratio, then the gradient
    # autograd would take, added as float arithmetic (CPU autograd of min/clamp runs slow bool
    # kernels: 7x the whole rest of the pass). Tests hold value and gradient equal to the reference.
    A, low, high = advantages, 1 - config.epsilon_low, 1 + config.epsilon_high
    r = ratio.detach()
    capped = r if config.delta is None else r.clamp(max=config.delta)  # TRL caps only this one
    clipped = r.clamp(low, high)
    value = torch.minimum(capped * A, clipped * A)  # the pessimistic of the two candidates
    if config.dual_clip is not None:  # verl: loss = min(-c·A, max(L1, L2)) when A < 0
        floor = torch.where(A < 0, config.dual_clip * A, float("-inf"))  # (B, 1): no floor for A >= 0
        value = torch.maximum(value, floor)

    # Where the chosen candidate is flat in r (delta and dual_clip are > 1 > 1 - ε_low):
    positive, negative = above(A, 0.0), below(A, 0.0)  # (B, 1)
    clip_low = below(r, low) * negative  # A < 0 and r fell below 1 - ε_low
    cap_high = high if config.delta is None else min(high, config.delta)
    clip_high = above(r, cap_high) * positive  # A > 0 and r rose above 1 + ε_high (or delta)
    dual = torch.zeros_like(A)  # A < 0 and r capped from above: by delta, or by the dual clip
    if config.delta is not None:
        dual = above(r, max(high, config.delta)) * negative
    dual_clip_flag = None
    if config.dual_clip is not None:
        dual_clip_flag = above(torch.maximum(capped, clipped), config.dual_clip) * negative
        dual = torch.maximum(dual, dual_clip_flag)
    flat = clip_low + clip_high + dual  # disjoint

    # The gradient autograd takes through min and clamp: A·dr on the trust region, 0 where flat.
    step = ratio - r  # 0, carrying d ratio
    if not math.isfinite(float(r.max())):  # an overflowed ratio: inf - inf is NaN, and the value is not
        step = step.nan_to_num(0.0)
    surrogate = value + step * (A * (1 - flat))

    high_flag = clip_high if config.delta is None else above(capped, high) * positive
    either = clip_low + high_flag
    flags = {
        "clip_ratio/low_mean": clip_low,  # TRL: r < 1 - ε_low and A < 0
        "clip_ratio/high_mean": high_flag,  # TRL: min(r, delta) > 1 + ε_high and A > 0
        # TRL logs the min (max) over sequences of each sequence's fraction (reduced per row in loss._metrics)
        "clip_ratio/low_min": clip_low,
        "clip_ratio/high_max": high_flag,
        "clip_ratio/region_mean": either,
        "actor/pg_clipfrac": either if config.delta is None else clip_low + above(r, high) * positive,
    }
    if dual_clip_flag is not None:
        flags["actor/pg_clipfrac_lower"] = dual_clip_flag  # verl: the dual-clip fraction
    region = regions(r.expand_as(value), clip_low, clip_high, dual if config.delta or config.dual_clip else None)
    return ObjectiveTerms(surrogate, clipped, region, flags)


def cispo_warnings(config: ObjectiveSettings, longest_row: int) -> list[str]:
    if config.cispo_bounds == "absolute" and config.epsilon_high < 1:
        return [
            f"CISPO caps the weight at epsilon_high = {mark('config/epsilon_high', config.epsilon_high)} (absolute), "
            f"scaling every token down; TRL's docs recommend {mark('lens/trl/cispo_epsilon_high', 5.0)}."
        ]
    return []


def cispo_why_values(config: ObjectiveSettings) -> dict[str, float | None]:
    absolute = config.cispo_bounds == "absolute"
    return {
        "floor": None if absolute else 1 - config.epsilon_low,
        "cap": config.epsilon_high if absolute else 1 + config.epsilon_high,
    }


CISPO_WHY = Why(
    names=("masked", "trust", "capped_low", "capped_high"),
    codes=lambda ratio, advantages, region, config: region.long().clamp(max=3),
    texts={
        "masked": "does not count (prompt, padding or masked out)",
        "trust": "weight = ratio, inside its bounds [{floor}, {cap}]: the token's term is ratio·A·logp",
        "capped_low": "weight held at the floor {floor} (ratio below it); CISPO keeps the token's gradient",
        "capped_high": "weight capped at {cap} (ratio above it); CISPO keeps the token's gradient",
    },
    values=cispo_why_values,
)


@OBJECTIVES.register(
    "cispo",
    label="CISPO",
    axis=WEIGHT_ON_A_LOGP,
    metrics={"cispo_clip_ratio": "trl", "actor/pg_clipfrac": "tokens"},
    warnings=cispo_warnings,
    why=CISPO_WHY,
    settings=CISPO_SETTINGS,
)
def cispo(
    ratio: Tensor, logp: Tensor, advantages: Tensor, config: ObjectiveSettings, inputs: ObjectiveInputs | None = None
) -> ObjectiveTerms:
    """CISPO: a detached, clipped ratio times A times logp, so clipped tokens keep their gradient.

    Unlike PPO's clip, the bound only scales the REINFORCE term sg(w)·A·logp; no token is
    silenced. ``cispo_bounds="absolute"`` is TRL's w = min(r, epsilon_high) (docs: 5.0);
    ``"relative"`` is verl's w = clamp(r, 1 - epsilon_low, 1 + epsilon_high).
    Paper: https://arxiv.org/abs/2506.13585
    """
    r = ratio.detach()
    if config.cispo_bounds == "absolute":
        low, high = float("-inf"), config.epsilon_high
    else:
        low, high = 1 - config.epsilon_low, 1 + config.epsilon_high
    weight = r.clamp(min=low, max=high)
    surrogate = weight * advantages * logp
    clip_high = above(r, high)
    clip_low = None if low == float("-inf") else below(r, low)  # TRL's absolute cap has no floor
    over = clip_high if high == config.epsilon_high else above(r, config.epsilon_high)
    flags = {
        "cispo_clip_ratio": over * above(advantages, 0.0),
        "actor/pg_clipfrac": clip_high if clip_low is None else clip_low + clip_high,  # verl: ratio != clip(ratio)
    }
    region = regions(surrogate.detach(), clip_low, clip_high)
    return ObjectiveTerms(surrogate, weight, region, flags, zero_outside=zero_outside(inputs))


@OBJECTIVES.register("sapo", label="SAPO", axis=PER_UNIT_A, settings=SAPO_SETTINGS)
def sapo(
    ratio: Tensor, logp: Tensor, advantages: Tensor, config: ObjectiveSettings, inputs: ObjectiveInputs | None = None
) -> ObjectiveTerms:
    """SAPO: a soft sigmoid gate (4/τ)·σ(τ(r - 1)) replaces the hard clip; no token goes flat.

    τ is ``sapo_temperature_pos`` for A > 0 and ``sapo_temperature_neg`` otherwise. The gate's
    slope at r = 1 is 1, so on-policy SAPO has GRPO's gradient; far from 1 it decays smoothly.
    Paper: https://arxiv.org/abs/2511.20347
    """
    pos, neg = (advantages.new_tensor(t) for t in (config.sapo_temperature_pos, config.sapo_temperature_neg))
    tau = torch.where(advantages > 0, pos, neg)
    gate = torch.sigmoid(tau * (ratio - 1)) * 4 / tau
    surrogate = gate * advantages
    return ObjectiveTerms(surrogate, gate.detach(), regions(surrogate.detach()))


@OBJECTIVES.register("gpg", label="GPG", axis=WEIGHT_ON_A_LOGP)
def gpg(
    ratio: Tensor, logp: Tensor, advantages: Tensor, config: ObjectiveSettings, inputs: ObjectiveInputs | None = None
) -> ObjectiveTerms:
    """GPG: plain REINFORCE A·logp, with no ratio, no clip and no old policy.

    verl ``loss_mode="gpg"``. The value depends on logp itself, so only its gradient, -A per
    token, is comparable with the ratio-based objectives.
    Paper: https://arxiv.org/abs/2504.02546
    """
    surrogate = advantages * logp
    clipped = ratio.detach().expand_as(surrogate)
    return ObjectiveTerms(surrogate, clipped, regions(surrogate.detach()), zero_outside=zero_outside(inputs))


# --- verl 0.9.1's later policy losses (core_algos.register_policy_loss) -------------------------------
def masked_mean_verl(x: Tensor, mask: Tensor) -> Tensor:
    """verl_F.masked_mean: sum(x · mask) / (sum(mask) + 1e-8), the 1e-8 as verl adds it."""
    return (x * mask).sum() / (mask.sum() + 1e-8)


def given_inputs(ratio: Tensor, logp: Tensor, inputs: ObjectiveInputs | None) -> ObjectiveInputs:
    return inputs_of(ratio, logp) if inputs is None else inputs


def geo_mean_why_codes(ratio: Tensor, advantages: Tensor, region: Tensor, config: ObjectiveSettings) -> Tensor:
    """GEO_MEAN_WHY's codes: the regions, and ``unbounded`` (4) for a trust-region token with A < 0 whose log-ratio
    is above ε_high: the pessimistic side keeps it as it is, so the row's geometric mean grows with its ratio."""
    code = region.long().clamp(max=3)
    free = (code == TRUST) & (advantages < 0) & (ratio.log() > config.epsilon_high)
    return torch.where(free, torch.full_like(code, 4), code)


GEO_MEAN_WHY = Why(
    names=("masked", "trust", "clip_low", "clip_high", "unbounded"),
    codes=geo_mean_why_codes,
    texts={
        "masked": "does not count (prompt, padding or masked out)",
        "trust": "its log-ratio enters the row's geometric mean as it is (inside [−ε_low, ε_high] = [-{low}, {high}], "
        "or moved against its advantage), so it gets a policy gradient through the row's ratio",
        "clip_low": "clipped low: A < 0 and log-ratio below −ε_low = -{low}: it enters the row's geometric mean as "
        "-{low}, flat: no policy gradient",
        "clip_high": "clipped high: A > 0 and log-ratio above ε_high = {high}: it enters the row's geometric mean as "
        "{high}, flat: no policy gradient",
        "unbounded": "unbounded: A < 0 and log-ratio above ε_high = {high}; the pessimistic side keeps it as it is, "
        "no clip bound acts, and the row's geometric-mean ratio, its loss and its gradient grow with this ratio",
    },
    values=lambda config: {"low": config.epsilon_low, "high": config.epsilon_high},
    no_gradient=frozenset({"clip_low", "clip_high"}),
)


@OBJECTIVES.register(
    "geo_mean",
    label="GMPO (geometric mean)",
    axis=PER_UNIT_A,
    flat="clipped: the token's log-ratio enters the row's geometric mean at its bound, so it gets no policy gradient",
    metrics={"actor/pg_clipfrac": "tokens", "actor/pg_clipfrac_lower": "tokens"},
    why=GEO_MEAN_WHY,
)
def geo_mean(
    ratio: Tensor, logp: Tensor, advantages: Tensor, config: ObjectiveSettings, inputs: ObjectiveInputs | None = None
) -> ObjectiveTerms:
    """GMPO: J_i = Ā_i · exp(mean_t clip_A(log r_t)), one term per row, averaged over the rows.

    verl ``loss_mode="geo_mean"``: each token's log-ratio is clipped to [-ε_low, ε_high] on the side
    its advantage gains from (sign(A)·min(sign(A)·x, sign(A)·clip(x))), the row's ratio is the geometric
    mean of the clipped token ratios (sum / (L + 1e-8)), Ā_i = Σ_t A / (L + 1e-8), and the loss is the
    plain mean over the micro-batch's rows, whatever loss_agg_mode says (the KL keeps it). No log-ratio clamp.
    Paper: https://arxiv.org/abs/2507.20673
    """
    x, mask = given_inputs(ratio, logp, inputs).log_ratio, given_inputs(ratio, logp, inputs).mask
    sign = torch.sign(advantages)  # (B, 1), or (B, T) per token
    x_clipped = x.clamp(-config.epsilon_low, config.epsilon_high)
    x_min = sign * torch.minimum(sign * x, sign * x_clipped)  # the pessimistic side of the clip, per token
    length = mask.sum(-1, keepdim=True)  # (B, T) -> (B, 1)
    row_ratio = torch.exp((x_min * mask).sum(-1, keepdim=True) / (length + 1e-8))
    row_advantage = (advantages.expand_as(mask) * mask).sum(-1, keepdim=True) / (length + 1e-8)  # Ā_i, as verl
    surrogate = row_advantage * row_ratio  # (B, 1): Ā_i · geometric-mean ratio
    weight = mask / (mask.shape[0] * length.clamp(min=1))  # a row's tokens share its 1/B: torch.mean over rows

    xd = x.detach()
    clipped = torch.ne(xd, x_clipped.detach()).to(xd.dtype)
    positive, negative = above(advantages, 0.0), below(advantages, 0.0)
    clip_high = above(xd, config.epsilon_high) * positive  # flat: the clip bound is the chosen side
    clip_low = below(xd, -config.epsilon_low) * negative
    flags = {"actor/pg_clipfrac": clipped * positive, "actor/pg_clipfrac_lower": clipped * negative}
    region = regions(xd, clip_low, clip_high)
    return ObjectiveTerms(surrogate, x_min.detach().exp(), region, flags, weight)


def cov_why_values(config: ObjectiveSettings) -> dict[str, float | None]:
    return {
        "low": 1 - config.epsilon_low,
        "high": 1 + config.epsilon_high,
        "lb": config.clip_cov_lb,
        "ub": config.clip_cov_ub,
        "share": config.clip_cov_ratio,
    }


def clip_cov_why_codes(ratio: Tensor, advantages: Tensor, region: Tensor, config: ObjectiveSettings) -> Tensor:
    """CLIP_COV_WHY's codes: the regions, and ``unbounded`` (5) for a trust-region token with A < 0 above
    1 + ε_high (no dual clip here: the pessimistic min keeps A·ratio)."""
    code = region.long()
    free = (code == TRUST) & (advantages < 0) & (ratio > 1 + config.epsilon_high)
    return torch.where(free, torch.full_like(code, 5), code)


CLIP_COV_WHY = Why(
    names=("masked", "trust", "clip_low", "clip_high", "cov_clipped", "unbounded"),
    codes=clip_cov_why_codes,
    texts={
        "masked": "does not count (prompt, padding or masked out)",
        "trust": "unclipped: the surrogate is A·ratio (ratio inside [{low}, {high}] or moved against its "
        "advantage), and the covariance draw left it alone: it gets a policy gradient",
        "clip_low": "clipped low: A < 0 and ratio below 1 − ε_low = {low}: flat, no policy gradient",
        "clip_high": "clipped high: A > 0 and ratio above 1 + ε_high = {high}: flat, no policy gradient",
        "cov_clipped": "selected by clip_cov (gradient detached): its covariance (A − mean A)·(logp − mean logp) "
        "lies in (clip_cov_lb, clip_cov_ub) = ({lb}, {ub}) and the random draw of max(1, int(clip_cov_ratio · N)) "
        "tokens (clip_cov_ratio = {share}, N the counted tokens) picked it: its term is multiplied by 0, so it "
        "adds nothing to the loss and gets no policy gradient",
        "unbounded": "unbounded: A < 0 and ratio above 1 + ε_high = {high}; the pessimistic min keeps A·ratio, "
        "Clip-Cov has no dual clip, and the token's loss and gradient grow with its ratio",
    },
    values=cov_why_values,
    no_gradient=frozenset({"clip_low", "clip_high", "cov_clipped"}),
    selected="cov_clipped",
    labels={"cov_clipped": "selected by clip_cov (gradient detached)"},
)


def clip_cov_selection(cov: Tensor, mask: Tensor, config: ObjectiveSettings, like: Tensor) -> Tensor:
    """1.0 on the tokens Clip-Cov cuts: clip_num of the candidates (lb < cov < ub), drawn as verl draws them
    (torch.randperm over the candidates in row-major order; here from a generator seeded clip_cov_seed)."""
    clip_num = max(int(config.clip_cov_ratio * float(mask.sum())), 1)
    candidates = torch.nonzero((cov < config.clip_cov_ub) & (cov > config.clip_cov_lb) & (mask > 0))
    picked = torch.zeros_like(like)
    if len(candidates) > 0:
        draw = torch.Generator().manual_seed(config.clip_cov_seed)
        perm = torch.randperm(len(candidates), generator=draw).to(candidates.device)
        chosen = candidates[perm[: min(clip_num, len(candidates))]]
        picked[chosen[:, 0], chosen[:, 1]] = 1.0
    return picked


@OBJECTIVES.register(
    "clip_cov",
    label="Clip-Cov",
    axis=PER_UNIT_A,
    flat="clipped or cut: the token's term is flat (PPO clip) or 0 (picked by Clip-Cov), so no policy gradient",
    metrics={"actor/pg_clipfrac": "tokens"},
    why=CLIP_COV_WHY,
    settings=CLIP_COV_SETTINGS,
)
def clip_cov(
    ratio: Tensor, logp: Tensor, advantages: Tensor, config: ObjectiveSettings, inputs: ObjectiveInputs | None = None
) -> ObjectiveTerms:
    """Clip-Cov: PPO's clipped surrogate, with a random few high-covariance tokens' terms cut to 0.

    verl ``loss_mode="clip_cov"``: among the unclipped counted tokens whose centred covariance
    (A − mean A)·(logp − mean logp) (means over the micro-batch's counted tokens) lies in
    (clip_cov_lb, clip_cov_ub), max(1, int(clip_cov_ratio · N)) are drawn with torch.randperm and their
    term multiplied by 0. No dual clip, no log-ratio clamp; actor/pg_clipfrac is the cut share.
    Paper: https://arxiv.org/abs/2505.22617
    """
    mask = given_inputs(ratio, logp, inputs).mask
    A = advantages.expand_as(logp)  # (B, 1) -> (B, T)
    ratio_clipped = ratio.clamp(1 - config.epsilon_low, 1 + config.epsilon_high)
    surrogate = torch.minimum(A * ratio, A * ratio_clipped)  # verl: max(-A·r, -A·clip(r)), negated
    r = ratio.detach()
    clipped_by_ppo = (-A * ratio_clipped.detach() > -A * r) & (mask > 0)
    cov = (A - masked_mean_verl(A, mask)) * (logp.detach() - masked_mean_verl(logp.detach(), mask))
    cov = cov.masked_fill((mask == 0) | clipped_by_ppo, -torch.inf)
    cut = clip_cov_selection(cov, mask, config, logp.detach())  # per token, also with a ratio per row (B, 1)
    surrogate = surrogate * (1 - cut)
    positive, negative = above(A, 0.0), below(A, 0.0)
    clip_low = clipped_by_ppo.to(r.dtype) * negative
    clip_high = clipped_by_ppo.to(r.dtype) * positive
    return ObjectiveTerms(
        surrogate,
        ratio_clipped.detach(),
        regions(surrogate.detach(), clip_low, clip_high, cut),  # the cut tokens' term is flat (0): the 4th code
        {"actor/pg_clipfrac": cut},
        selected=cut,
    )


def kl_cov_why_values(config: ObjectiveSettings) -> dict[str, float | None]:
    return {"share": config.kl_cov_ratio, "coef": config.ppo_kl_coef}


KL_COV_WHY = Why(
    names=("masked", "trust", "kl_penalized"),
    codes=lambda ratio, advantages, region, config: region.long().clamp(max=TRUST),
    texts={
        "masked": "does not count (prompt, padding or masked out)",
        "trust": "not among the kl_cov_ratio = {share} share of tokens with the largest covariance: its term is "
        "A·ratio, unclipped and unpenalised, and it gets a policy gradient",
        "kl_penalized": "kl_cov: KL penalty applied: it is among the max(1, int(kl_cov_ratio · N)) tokens "
        "(kl_cov_ratio = {share}, N the counted tokens) with the largest covariance (A − mean A)·(logp − mean logp), "
        "so its term is A·ratio − ppo_kl_coef·|log-ratio| (ppo_kl_coef = {coef}): it keeps a policy gradient, "
        "pulled back toward the old policy",
    },
    values=kl_cov_why_values,
    selected="kl_penalized",
    labels={"kl_penalized": "kl_cov: KL penalty applied"},
)


@OBJECTIVES.register(
    "kl_cov",
    label="KL-Cov",
    axis=PER_UNIT_A,
    why=KL_COV_WHY,
    settings=KL_COV_SETTINGS,
)
def kl_cov(
    ratio: Tensor, logp: Tensor, advantages: Tensor, config: ObjectiveSettings, inputs: ObjectiveInputs | None = None
) -> ObjectiveTerms:
    """KL-Cov: A·ratio, unclipped, minus ppo_kl_coef·|log-ratio| on the highest-covariance tokens.

    verl ``loss_mode="kl_cov"``: the max(1, int(kl_cov_ratio · N)) counted tokens with the largest
    (A − mean A)·(logp − mean logp) (torch.topk; means over the micro-batch's counted tokens) get the
    penalty; no clip, no log-ratio clamp. verl logs actor/ppo_kl as the mean |log-ratio| here.
    Paper: https://arxiv.org/abs/2505.22617
    """
    given = given_inputs(ratio, logp, inputs)
    x, mask = given.log_ratio, given.mask
    A = advantages.expand_as(logp)  # (B, 1) -> (B, T)
    valid = mask > 0
    picked = torch.zeros_like(logp.detach())
    adv_valid, logp_valid = A[valid].detach().reshape(-1), logp[valid].detach().reshape(-1)
    if adv_valid.numel():
        cov = (adv_valid - adv_valid.mean()) * (logp_valid - logp_valid.mean())
        k = min(max(1, int(len(cov) * config.kl_cov_ratio)), len(cov))
        top = torch.nonzero(valid.reshape(-1), as_tuple=True)[0][torch.topk(cov, k, largest=True).indices]
        picked.view(-1)[top] = 1.0
    surrogate = A * ratio - picked * (config.ppo_kl_coef * x.abs())
    flags = {"actor/ppo_kl": x.detach().abs()}
    # The penalised tokens keep a gradient (no region of their own): their why names them (selected).
    return ObjectiveTerms(
        surrogate, ratio.detach().expand_as(surrogate), regions(surrogate.detach()), flags, selected=picked
    )


def dppo_why_values(config: ObjectiveSettings) -> dict[str, float | None]:
    return {"low": config.epsilon_low, "high": config.epsilon_high, "c": config.dual_clip}


def dppo_why_codes(ratio: Tensor, advantages: Tensor, region: Tensor, config: ObjectiveSettings) -> Tensor:
    """Region codes, plus "truncated" (4) for a trust-region token whose ratio passed c: it keeps its gradient,
    so it has no region of its own."""
    code = region.long()
    if config.dual_clip is None:
        return code
    return torch.where((code == TRUST) & (ratio > config.dual_clip), torch.full_like(code, 4), code)


def dppo_why(divergence: str) -> Why:
    return Why(
        names=("masked", "trust", "blocked_low", "blocked_high", "truncated"),
        codes=dppo_why_codes,
        texts={
            "masked": "does not count (prompt, padding or masked out)",
            "trust": f"inside the {divergence} trust region: its term is sg(min(ratio, c))·A·logp (c = {{c}}), so it "
            "gets a policy gradient",
            "blocked_low": f"A ≤ 0 and the policy moved its probability down by a {divergence} above ε_low = {{low}}: "
            "its term is 0, no policy gradient",
            "blocked_high": f"A > 0 and the policy moved its probability up by a {divergence} above ε_high = {{high}}: "
            "its term is 0, no policy gradient",
            "truncated": "inside the trust region with ratio above c = {c}: its weight is truncated at c (truncated "
            "importance sampling); it keeps its policy gradient",
        },
        values=dppo_why_values,
        no_gradient=frozenset({"blocked_low", "blocked_high"}),
    )


def dppo_terms(
    ratio: Tensor,
    logp: Tensor,
    advantages: Tensor,
    config: ObjectiveSettings,
    valid_pos: Tensor,
    valid_neg: Tensor,
    inputs: ObjectiveInputs | None,
) -> ObjectiveTerms:
    """DPPO's term given the trust-region masks: sg(min(r, c))·A·logp where the token's divergence is inside."""
    r = ratio.detach()
    weight = r if config.dual_clip is None else r.clamp(max=config.dual_clip)  # truncated IS, detached
    positive = above(advantages, 0.0)  # (B, 1); verl takes the negative side's mask for A <= 0
    valid = (positive * valid_pos + (1 - positive) * valid_neg).to(r.dtype)
    surrogate = advantages * weight * logp * valid
    truncated = torch.zeros_like(r) if config.dual_clip is None else above(r, config.dual_clip) * valid
    blocked = 1 - valid
    flags = {"actor/pg_clipfrac": blocked, "actor/pg_clipfrac_lower": truncated}
    region = regions(surrogate.detach(), blocked * (1 - positive), blocked * positive)  # truncated: see its why
    return ObjectiveTerms(surrogate, weight, region, flags, zero_outside=zero_outside(inputs))


DPPO_METRICS: dict[str, Reduction] = {"actor/pg_clipfrac": "tokens", "actor/pg_clipfrac_lower": "tokens"}
DPPO_FLAT = "outside the divergence trust region: the token's term is 0, so it gets no policy gradient"


def register_dppo(name: str, label: str, divergence: str) -> Callable[[Objective], Objective]:
    """A DPPO variant's registry entry: the two differ only in the divergence their trust region bounds."""
    why = dppo_why(divergence)
    return OBJECTIVES.register(name, label=label, axis=WEIGHT_ON_A_LOGP, flat=DPPO_FLAT, metrics=DPPO_METRICS, why=why)


@register_dppo("dppo_tv", "DPPO (binary TV)", "probability change")
def dppo_tv(
    ratio: Tensor, logp: Tensor, advantages: Tensor, config: ObjectiveSettings, inputs: ObjectiveInputs | None = None
) -> ObjectiveTerms:
    """DPPO-TV: sg(min(r, c))·A·logp, kept only where p − p_old stays within the TV thresholds.

    verl ``loss_mode="dppo_tv"`` reads clip_ratio(_low/_high) as total-variation thresholds, not ratio
    bounds: an A > 0 token counts while p − p_old ≤ ε_high, an A ≤ 0 token while p − p_old ≥ −ε_low;
    clip_ratio_c (dual_clip here) truncates the detached ratio. The log-ratio is clamped to ±20.
    Paper: https://arxiv.org/abs/2602.04879
    """
    old = given_inputs(ratio, logp, inputs).old
    moved = logp.detach().exp() - old.exp()  # p - p_old
    valid_pos = (moved <= config.epsilon_high).to(logp.dtype)
    valid_neg = (moved >= -config.epsilon_low).to(logp.dtype)
    return dppo_terms(ratio, logp, advantages, config, valid_pos, valid_neg, inputs)


@register_dppo("dppo_kl", "DPPO (binary KL)", "binary KL")
def dppo_kl(
    ratio: Tensor, logp: Tensor, advantages: Tensor, config: ObjectiveSettings, inputs: ObjectiveInputs | None = None
) -> ObjectiveTerms:
    """DPPO-KL: sg(min(r, c))·A·logp, kept only where the binary KL of (p_old, p) stays within thresholds.

    verl ``loss_mode="dppo_kl"``: D = p_old·(log p_old − log p) + (1 − p_old)·log((1 − p_old + 1e-8) /
    (1 − p + 1e-8)); an A > 0 token counts while D ≤ ε_high or p ≤ p_old, an A ≤ 0 token while D ≤ ε_low
    or p ≥ p_old. clip_ratio_c (dual_clip here) truncates the detached ratio; log-ratio clamped to ±20.
    Paper: https://arxiv.org/abs/2602.04879
    """
    old = given_inputs(ratio, logp, inputs).old
    lp = logp.detach()
    p, p_old = lp.exp(), old.exp()
    divergence = p_old * (old - lp) + (1 - p_old) * torch.log((1.0 - p_old + 1e-8) / (1.0 - p + 1e-8))
    valid_pos = ((divergence <= config.epsilon_high) | (p <= p_old)).to(lp.dtype)
    valid_neg = ((divergence <= config.epsilon_low) | (p >= p_old)).to(lp.dtype)
    return dppo_terms(ratio, logp, advantages, config, valid_pos, valid_neg, inputs)


def dro_warnings(config: ObjectiveSettings, longest_row: int) -> list[str]:
    return [] if config.dro_beta is not None else ["dro needs dro_beta (verl raises ValueError without it)."]


@OBJECTIVES.register("dro", label="DRO", axis=WEIGHT_ON_A_LOGP, warnings=dro_warnings, settings=DRO_SETTINGS)
def dro(
    ratio: Tensor, logp: Tensor, advantages: Tensor, config: ObjectiveSettings, inputs: ObjectiveInputs | None = None
) -> ObjectiveTerms:
    """DRO: A·logp − ½·dro_beta·(logp − old)², REINFORCE with a quadratic pull back to the old policy.

    verl ``loss_mode="dro"`` (Direct Reward Optimization); no ratio, no clip, no log-ratio clamp.
    verl raises without ``dro_beta``; here the objective does too.
    Paper: https://arxiv.org/abs/2405.19107
    """
    if config.dro_beta is None:
        raise GrpoInputError("dro_beta", "a positive number: DRO's quadratic log-ratio penalty (verl requires it)")
    x = given_inputs(ratio, logp, inputs).log_ratio
    surrogate = advantages * logp - 0.5 * config.dro_beta * x.square()
    clipped = ratio.detach().expand_as(surrogate)
    return ObjectiveTerms(surrogate, clipped, regions(surrogate.detach()), zero_outside=zero_outside(inputs))


# --- TRL 1.16's vespo ------------------------------------------------------------------------------------------
VESPO_LOG_W_MIN = math.log(1e-8)  # TRL's lower clamp of the sequence log-weight
VESPO_LOG_CLAMP = 20.0  # TRL's bound on each token's log-ratio (±) and the sequence log-weight's upper clamp


@OBJECTIVES.register(
    "vespo",
    label="VESPO (gamma weights)",
    axis=WEIGHT_ON_A_LOGP,
    metrics={"vespo/phi_seq_mean": "trl"},
    settings=VESPO_SETTINGS,
)
def vespo(
    ratio: Tensor, logp: Tensor, advantages: Tensor, config: ObjectiveSettings, inputs: ObjectiveInputs | None = None
) -> ObjectiveTerms:
    """VESPO: sg(φ(w))·A·logp with the gamma weight φ(w) = e^λ·w^k·e^(−λw) of the row's ratio w (φ(1) = 1).

    TRL ``loss_type="vespo"``: log w = clamp(Σ_t clamp(log r_t, ±20), log 1e-8, 20), a sum over the row's
    tokens, not a mean; (k, λ) = (vespo_k_pos, vespo_lambda_pos) for A ≥ 0, else the _neg pair, λ at least
    1e-4; φ's NaN and ±inf become 0. φ is detached: it only scales the REINFORCE gradient. Rows far from
    on-policy (w ≫ 1 or w ≪ 1) are damped smoothly instead of clipped.
    Paper: https://huggingface.co/papers/2602.10693
    """
    given = given_inputs(ratio, logp, inputs)
    x = given.log_ratio.detach().clamp(-VESPO_LOG_CLAMP, VESPO_LOG_CLAMP)
    log_w = given.counted_log_ratio(x).sum(-1, keepdim=True).clamp(VESPO_LOG_W_MIN, VESPO_LOG_CLAMP)  # (B, T) -> (B, 1)
    nonneg = advantages >= 0
    k = torch.where(nonneg, config.vespo_k_pos, config.vespo_k_neg)
    lam = torch.where(nonneg, config.vespo_lambda_pos, config.vespo_lambda_neg).clamp(min=1e-4)
    phi = torch.exp(lam + k * log_w - lam * log_w.exp()).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)  # (B, 1)
    surrogate = phi * advantages * logp
    flags = {"vespo/phi_seq_mean": phi}
    zero = zero_outside(inputs)
    return ObjectiveTerms(surrogate, phi.expand_as(surrogate), regions(surrogate.detach()), flags, zero_outside=zero)
