"""The mismatch view's data: the sampler against the trainer, per token and per row, and what the rollout
correction did about it.

Real runs sample with one engine (vLLM, SGLang) and train with another; the two disagree on the log-probs
of the very same tokens, and the trainers correct for it (``grpo.corrections``). ``mismatch_view`` gives
the page everything it draws, computed here once: the token pairs (trainer-old log-prob, sampler log-prob)
for the diagonal scatter with the token-level bounds as lines, each row's summed and mean log-ratio with
its sequence-level bounds, the thresholds in force, what the correction did to each token and row (codes
into ``CORRECTION_CODES``), and sentences whose numbers are marked with the quantity they show
(``grpo.marks.mark``; every such number is also in the block, under ``stats`` or ``rows``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from grpo.config import LossConfig
from grpo.corrections import (
    CORRECTION_CODES,
    CORRECTIONS,
    KEPT,
    MASKED,
    NOT_COUNTED,
    NOT_SCORED,
    REJECTED,
    SEQUENCE_MASKED,
    TRUNCATED,
    Criterion,
    off_policy_keep,
    rs_criteria,
    rs_statistic,
    sequence_ratio,
)
from grpo.loss import Breakdown, RolloutLogps
from grpo.marks import parts_of, plain
from grpo.view.counted import correction_acted
from grpo.view.mismatch_charts import row_charts, scatter, thresholds
from grpo.view.mismatch_gap import Gap, correction_level, gap_of
from grpo.view.mismatch_sentences import mismatch_sentences

# What a row shows when its tokens were treated differently: the strongest action among them.
ROW_PRIORITY = (NOT_COUNTED, KEPT, NOT_SCORED, TRUNCATED, MASKED, SEQUENCE_MASKED, REJECTED)


def mismatch_view(bd: Breakdown) -> dict[str, Any] | None:
    """The mismatch view's block of the /loss answer; None when the batch has no sampler log-probs and no
    correction acted (nothing to show)."""
    logps = bd.rollout_logps
    acted = correction_acted(bd)
    if logps is None or (logps.sampler is None and not acted):
        return None
    config = bd.config
    gap = gap_of(logps)
    level, code = correction_level(config)
    criteria = (
        []
        if config.rollout_rs is None or gap.sampler is None
        else rs_criteria(config.rollout_rs, config.rollout_rs_threshold)
    )
    rows = _rows(bd, gap, level, logps, criteria)
    s = mismatch_sentences(bd, gap, rows, level, code, criteria)
    entry = CORRECTIONS.entry(config.rollout_correction)
    counts = _counts(bd)
    return {
        "correction": config.rollout_correction,
        # every correction in force, as the scatter's title names them (the IS weight's label alone said "no
        # correction" while rollout_rs rejected tokens); the IS weight's own label is is_label
        "correction_label": _in_force(config, entry.label, criteria, counts),
        "is_label": entry.label,
        "level": level,
        "sampled": gap.sampler is not None,
        "x_label": "current log-prob (bypass: the sampler's stand in for old)"
        if config.rollout_bypass
        else "trainer's old log-prob",
        "y_label": "sampler's log-prob",
        "thresholds": thresholds(config, level, criteria, s.base),
        "scatter": scatter(bd, gap, config, level, criteria),
        "rows": {k: v.cpu().numpy() if isinstance(v, Tensor) else v for k, v in rows.items()},
        "row_charts": row_charts(config, level, criteria, rows, s.base),
        "counts": counts,
        "stats": s.stats,
        "sentence_keys": [key for key, _ in s.items],
        "sentences": [plain(text) for _, text in s.items],
        "sentence_parts": [parts_of(text) for _, text in s.items],
    }


def mismatch_items(bd: Breakdown) -> list[tuple[str, str]]:
    """The view's sentences as plain text with their keys (none when the view has nothing to show)."""
    view = mismatch_view(bd)
    return [] if view is None else list(zip(view["sentence_keys"], view["sentences"], strict=True))


def _rows(
    bd: Breakdown, gap: Gap, level: str | None, logps: RolloutLogps, criteria: list[Criterion]
) -> dict[str, Tensor]:
    """Per row: counted and scored tokens, Σ and mean of old − sampler, the sequence ratio exp(Σ) (and at
    sequence level the weight applied), each sequence-level rollout_rs criterion's statistic, the off-policy
    mask's mean gap, and the strongest action on the row's tokens."""
    config = bd.config
    mask = gap.counted.to(gap.base.dtype)
    rows: dict[str, Tensor] = {"length": gap.counted.sum(-1), "code": _row_codes(bd.tokens.correction)}
    if gap.sampler is not None:
        scored = gap.scored.sum(-1)
        total = gap.log_ratio.sum(-1)
        rows |= {
            "scored": scored,
            "sum_log_ratio": total,
            "mean_log_ratio": total / scored.clamp(min=1),
            "is_ratio": sequence_ratio(gap.log_ratio, config).squeeze(-1),
        }
        if level == "sequence":  # the weight each row's tokens got (after bounds and batch normalisation)
            kept = bd.tokens.mask
            first = kept.to(torch.int64).argmax(-1, keepdim=True)
            weight = bd.tokens.is_weight.gather(-1, first).squeeze(-1)
            rows["is_weight"] = torch.where(kept.any(-1), weight, torch.ones_like(weight))
    for c in criteria:  # a sequence criterion's statistic, one per row (a token criterion's are on the scatter)
        stat = rs_statistic(gap.log_ratio, mask, c.name)
        if stat.shape[-1] == 1:
            rows[f"rs/{c.name}"] = stat.squeeze(-1)
    threshold = config.off_policy_mask_threshold
    if threshold is not None:
        behaviour = gap.base if gap.sampler is None else gap.sampler
        _, mean_gap = off_policy_keep(bd.advantages[:, None], logps.current, behaviour, mask, threshold)
        rows["off_policy_gap"] = mean_gap.squeeze(-1)
    return rows


def _row_codes(codes: Tensor) -> Tensor:
    """(B,) int8: the strongest action among each row's tokens (ROW_PRIORITY)."""
    out = torch.full(codes.shape[:1], NOT_COUNTED, dtype=torch.int8, device=codes.device)
    for code in ROW_PRIORITY[1:]:  # a stronger action overwrites a weaker one
        out = torch.where((codes == code).any(-1), code, out).to(torch.int8)
    return out


def _in_force(config: LossConfig, label: str, criteria: list[Criterion], counts: dict[str, int]) -> str:
    """Every correction in force with what it did: "sequence IS, masked (26 tokens acted on) · rollout_rs
    token_k1: 19 tokens rejected"; "no IS weight" first when rollout_correction is none but rollout_rs or the
    off-policy mask is on."""
    acted = counts["masked"] + counts["truncated"]
    parts = [label + (f" ({acted} tokens acted on)" if acted else "")] if config.rollout_correction != "none" else []
    if criteria:
        parts.append(f"rollout_rs {config.rollout_rs}: {counts['rejected']} tokens rejected")
    if config.off_policy_mask_threshold is not None:
        parts.append(f"off-policy mask: {counts['sequence_masked']} tokens dropped")
    if config.rollout_correction == "none" and parts:
        parts.insert(0, "no IS weight (rollout_correction none)")
    return " · ".join(parts) or label


def _counts(bd: Breakdown) -> dict[str, int]:
    found = torch.bincount(bd.tokens.correction.flatten().long(), minlength=len(CORRECTION_CODES)).tolist()
    return {name: int(n) for name, n in zip(CORRECTION_CODES, found, strict=True) if name != "not_counted"}
