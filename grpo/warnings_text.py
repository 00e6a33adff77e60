"""The breakdown's warnings: sentences on what the batch lacks, what the config leaves out and what overflowed
(``Breakdown.warnings``, and ``marked_warnings`` with each number tagged with the quantity it shows).

The sentences a chosen variant adds are its registry entry's (``warnings``); these are the ones about the batch
and the pass.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from grpo.batch import Batch
from grpo.config import PRESETS, REGISTRIES, LossConfig
from grpo.marks import MAX_DIGITS, mark, mark_all
from grpo.results import Inputs, RowBreakdown


def _presets_with_beta() -> str:
    """Which presets put the KL in the loss, read from the presets table: "the presets that set beta: article
    (beta = 0.01), verl-grpo (beta = 0.001); every other preset has beta 0"."""
    default = LossConfig().beta
    with_beta = {name: p.settings.get("beta", default) for name, p in PRESETS.items()}
    named = [f"{name} (beta = {mark(f'lens/presets/{name}/beta', b)})" for name, b in with_beta.items() if b]
    if not named:
        return "every preset has beta 0"
    return f"the presets that set beta: {', '.join(named)}; every other preset has beta 0"


def breakdown_warnings(
    batch: Batch, config: LossConfig, inp: Inputs, rows: RowBreakdown, loss: Tensor, metrics_ratio_max: float
) -> tuple[str, ...]:
    """What a reader of the breakdown should know about its batch and config, each number marked with the quantity
    it shows (grpo.marks; ``grpo.marks.plain`` gives the text): missing inputs, groups without a gradient, empty
    rows, the chosen variants' own warnings, overflows."""
    adv = inp.adv
    out = []
    if batch.old_per_token_logps is None and batch.sampling_per_token_logps is None:
        out.append("No old_per_token_logps: on-policy, so the ratio is 1 everywhere and nothing can clip.")
    elif batch.old_per_token_logps is None:  # π_old = π, but the sampler's log-probs differ from both
        out.append(
            "No old_per_token_logps: π_old is the current policy, so the ratio π/π_old is 1 everywhere and nothing "
            "can clip; the sampler's log-probs (sampling_per_token_logps) still differ, and the rollout correction "
            "compares π_old with the sampler."
        )
    if batch.ref_per_token_logps is None:
        out.append("No ref_per_token_logps: the reference is the current policy, so the KL is 0.")
    elif config.beta == 0:
        out.append(
            f"ref_per_token_logps given but beta = {mark('config/beta', config.beta)}: the KL is reported but left "
            f"out of the loss (set beta to include it; {_presets_with_beta()})."
        )
    sampler = batch.sampling_per_token_logps
    if sampler is None and (config.rollout_correction != "none" or config.rollout_rs is not None):
        out.append(
            f"rollout_correction {config.rollout_correction} / rollout_rs {config.rollout_rs} weigh the sampler's "
            "log-probs, and the batch has none (sampling_per_token_logps): no IS weight or rejection is applied."
        )
    unscored = 0 if sampler is None else int(torch.isnan(sampler).sum())  # NaN only at counted tokens
    if unscored:
        out.append(
            f"{mark('lens/warnings/unscored_tokens', unscored, MAX_DIGITS)} tokens were not scored by the sampler "
            "(NaN): TRL gives them no correction (weight 1, a log-ratio of 0 in sequence sums and in the off-policy "
            "mask) and leaves them out of sampling/sampling_logp_difference; verl has no such case (its "
            "rollout_log_probs hold no NaN)."
        )
    if adv.zero_std_groups:
        out.append(
            f"Groups {mark_all('zero_std_groups', list(adv.zero_std_groups))} have zero reward std: their advantages "
            "are 0, so they give no policy gradient."
        )
    if batch.rewards is not None and adv.group_size == 1:
        out.append(
            f"group_size {mark('lens/group_size', adv.group_size, MAX_DIGITS)}: each advantage is the raw reward "
            f"(verl's rule); TRL requires groups of {mark('lens/trl/min_group_size', 2, MAX_DIGITS)} or more."
        )
    empty = (rows.length == 0).nonzero().flatten().tolist()
    if empty:
        rows_text = "[" + ", ".join(mark(f"rows/index/{i}", i, MAX_DIGITS) for i in empty) + "]"
        out.append(f"Rows {rows_text} have no counted tokens: they add nothing but may still count in sequence means.")
    longest = int(rows.length.max())
    for kind, registry in REGISTRIES.items():  # each chosen variant's own warnings
        out += registry.entry(getattr(config, kind)).warnings(config, longest)  # marked (grpo.marks) or plain
    if not math.isfinite(float(rows.sequence_ratio.max())) or not math.isfinite(metrics_ratio_max):
        out.append(
            f"An importance ratio overflowed to inf ({config.dtype}): set log_ratio_clamp "
            f"(verl: {mark('lens/verl/log_ratio_clamp', 20)}) or use float64."
        )
    if not torch.isfinite(loss):
        out.append("The loss is not finite: a KL or ratio overflowed. Set kl_log_ratio_clamp / log_ratio_clamp.")
    return tuple(out)
