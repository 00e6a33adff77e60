"""The breakdown's warnings: sentences on what the batch lacks, what the config leaves out and what overflowed
(``Breakdown.warnings``, and ``marked_warnings`` with each number tagged with the quantity it shows).

Each warning is a rule of a table: its tag, when it applies and its sentence. The sentences a chosen variant adds
are its registry entry's (``warnings``), given between the batch's and the pass's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from grpo.batch import Batch
from grpo.config import PRESETS, REGISTRIES, LossConfig
from grpo.marks import MAX_DIGITS, mark, mark_all
from grpo.results import Inputs, RowBreakdown


@dataclass(frozen=True)
class WarningFacts:
    """What the rules read: the batch, the config and the pass's results."""

    batch: Batch
    config: LossConfig
    inp: Inputs
    rows: RowBreakdown
    loss: Tensor
    metrics_ratio_max: float
    unscored: int
    """Counted tokens the sampler did not score (NaN in sampling_per_token_logps)."""
    empty: list[int]
    """The rows without a counted token."""


def no_values(f: WarningFacts) -> dict[str, object]:
    """The values of a sentence without placeholders."""
    return {}


@dataclass(frozen=True)
class WarningRule:
    """One warning: a short tag naming it, when it applies, and its sentence."""

    tag: str
    applies: Callable[[WarningFacts], bool]
    text: str
    """The sentence, its ``{placeholders}`` filled from ``values`` (numbers marked, grpo.marks)."""
    values: Callable[[WarningFacts], Mapping[str, object]] = no_values

    def sentence(self, facts: WarningFacts) -> str:
        return self.text.format(**self.values(facts))


def _presets_with_beta() -> str:
    """Which presets put the KL in the loss, read from the presets table: "the presets that set beta: article
    (beta = 0.01), verl-grpo (beta = 0.001); every other preset has beta 0"."""
    default = LossConfig().beta
    with_beta = {name: p.settings.get("beta", default) for name, p in PRESETS.items()}
    named = [f"{name} (beta = {mark(f'lens/presets/{name}/beta', b)})" for name, b in with_beta.items() if b]
    if not named:
        return "every preset has beta 0"
    return f"the presets that set beta: {', '.join(named)}; every other preset has beta 0"


def _ratio_overflowed(f: WarningFacts) -> bool:
    return not math.isfinite(float(f.rows.sequence_ratio.max())) or not math.isfinite(f.metrics_ratio_max)


# What the batch lacks and what the config leaves out, in the order they are given.
BATCH_RULES = (
    WarningRule(
        "on_policy",
        lambda f: f.batch.old_per_token_logps is None and f.batch.sampling_per_token_logps is None,
        "No old_per_token_logps: on-policy, so the ratio is 1 everywhere and nothing can clip.",
    ),
    WarningRule(  # π_old = π, but the sampler's log-probs differ from both
        "no_old_with_sampler",
        lambda f: f.batch.old_per_token_logps is None and f.batch.sampling_per_token_logps is not None,
        "No old_per_token_logps: π_old is the current policy, so the ratio π/π_old is 1 everywhere and nothing "
        "can clip; the sampler's log-probs (sampling_per_token_logps) still differ, and the rollout correction "
        "compares π_old with the sampler.",
    ),
    WarningRule(
        "no_ref",
        lambda f: f.batch.ref_per_token_logps is None,
        "No ref_per_token_logps: the reference is the current policy, so the KL is 0.",
    ),
    WarningRule(
        "beta_zero",
        lambda f: f.batch.ref_per_token_logps is not None and f.config.beta == 0,
        "ref_per_token_logps given but beta = {beta}: the KL is reported but left out of the loss (set beta to "
        "include it; {presets}).",
        lambda f: {"beta": mark("config/beta", f.config.beta), "presets": _presets_with_beta()},
    ),
    WarningRule(
        "correction_without_sampler",
        lambda f: (
            f.batch.sampling_per_token_logps is None
            and (f.config.rollout_correction != "none" or f.config.rollout_rs is not None)
        ),
        "rollout_correction {correction} / rollout_rs {rs} weigh the sampler's log-probs, and the batch has none "
        "(sampling_per_token_logps): no IS weight or rejection is applied.",
        lambda f: {"correction": f.config.rollout_correction, "rs": f.config.rollout_rs},
    ),
    WarningRule(
        "unscored_tokens",
        lambda f: f.unscored > 0,
        "{count} tokens were not scored by the sampler (NaN): TRL gives them no correction (weight 1, a log-ratio "
        "of 0 in sequence sums and in the off-policy mask) and leaves them out of sampling/sampling_logp_difference; "
        "verl has no such case (its rollout_log_probs hold no NaN).",
        lambda f: {"count": mark("lens/warnings/unscored_tokens", f.unscored, MAX_DIGITS)},
    ),
    WarningRule(
        "zero_std_groups",
        lambda f: bool(f.inp.adv.zero_std_groups),
        "Groups {groups} have zero reward std: their advantages are 0, so they give no policy gradient.",
        lambda f: {"groups": mark_all("zero_std_groups", list(f.inp.adv.zero_std_groups))},
    ),
    WarningRule(
        "single_completion_groups",
        lambda f: f.batch.rewards is not None and f.inp.adv.group_size == 1,
        "group_size {size}: each advantage is the raw reward (verl's rule); TRL requires groups of {least} or more.",
        lambda f: {
            "size": mark("lens/group_size", f.inp.adv.group_size, MAX_DIGITS),
            "least": mark("lens/trl/min_group_size", 2, MAX_DIGITS),
        },
    ),
    WarningRule(
        "empty_rows",
        lambda f: bool(f.empty),
        "Rows {rows} have no counted tokens: they add nothing but may still count in sequence means.",
        lambda f: {"rows": "[" + ", ".join(mark(f"rows/index/{i}", i, MAX_DIGITS) for i in f.empty) + "]"},
    ),
)
# What overflowed in the pass, after the chosen variants' own warnings.
PASS_RULES = (
    WarningRule(
        "ratio_overflow",
        _ratio_overflowed,
        "An importance ratio overflowed to inf ({dtype}): set log_ratio_clamp (verl: {clamp}) or use float64.",
        lambda f: {"dtype": f.config.dtype, "clamp": mark("lens/verl/log_ratio_clamp", 20)},
    ),
    WarningRule(
        "loss_not_finite",
        lambda f: not bool(torch.isfinite(f.loss)),
        "The loss is not finite: a KL or ratio overflowed. Set kl_log_ratio_clamp / log_ratio_clamp.",
    ),
)


def variant_warnings(config: LossConfig, longest_row: int) -> list[str]:
    """Each chosen variant's own warnings (its registry entry's), marked (grpo.marks) or plain."""
    return [
        line
        for kind, registry in REGISTRIES.items()
        for line in registry.entry(getattr(config, kind)).warnings(config, longest_row)
    ]


def breakdown_warnings(
    batch: Batch, config: LossConfig, inp: Inputs, rows: RowBreakdown, loss: Tensor, metrics_ratio_max: float
) -> tuple[str, ...]:
    """What a reader of the breakdown should know about its batch and config, each number marked with the quantity
    it shows (grpo.marks; ``grpo.marks.plain`` gives the text): missing inputs, groups without a gradient, empty
    rows, the chosen variants' own warnings, overflows."""
    sampler = batch.sampling_per_token_logps
    unscored = 0 if sampler is None else int(torch.isnan(sampler).sum())  # NaN only at counted tokens
    empty = (rows.length == 0).nonzero().flatten().tolist()
    facts = WarningFacts(batch, config, inp, rows, loss, metrics_ratio_max, unscored, empty)
    out = [rule.sentence(facts) for rule in BATCH_RULES if rule.applies(facts)]
    out += variant_warnings(config, int(rows.length.max()))
    out += [rule.sentence(facts) for rule in PASS_RULES if rule.applies(facts)]
    return tuple(out)
