"""What the timeline keeps of each step file (``FileFacts``: sums, counts, its top tokens) and the series a step
(or one rank of it) joins from its files' facts, named as the trainers log them (``SERIES``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from grpo.corrections import MASKED, NOT_SCORED, REJECTED, SEQUENCE_MASKED
from grpo.loss import Breakdown
from grpo.objectives import CLIP_HIGH, CLIP_LOW, DUAL_CLIP

TOP_TOKENS = 16
"""Tokens each file keeps of each kind (its largest |loss|, KL, mismatch; its clipped; its lowest entropy)."""


@dataclass(frozen=True)
class Series:
    name: str
    label: str
    description: str
    trainer: dict[str, str] = field(default_factory=dict)
    """The trainer's logged name for it, by run source."""
    metric: str | None = None
    """The breakdown metric it is (the trainer's name where the breakdown carries it), else computed here."""


SERIES: tuple[Series, ...] = (
    Series("policy_loss", "policy part of the loss", "The policy term's part of the step's loss, joined as the loss."),
    Series("kl_loss", "KL part of the loss", "beta times the aggregated KL: the KL term's part of the step's loss."),
    Series("kl", "KL to the reference", "The mean KL estimate over counted tokens.", {"trl": "kl"}, "kl"),
    Series(
        "clip_low", "clip fraction, low side", "Share of counted tokens clipped below 1 - epsilon_low with A < 0.",
        {"trl": "clip_ratio/low_mean"}, "clip_ratio/low_mean",
    ),
    Series(
        "clip_high", "clip fraction, high side", "Share of counted tokens clipped above 1 + epsilon_high with A > 0.",
        {"trl": "clip_ratio/high_mean"}, "clip_ratio/high_mean",
    ),
    Series(
        "clip_region", "clip fraction, either side", "Share of counted tokens whose ratio the clip bounded.",
        {"trl": "clip_ratio/region_mean", "verl": "actor/pg_clipfrac"}, "clip_ratio/region_mean",
    ),
    Series(
        "clip_dual", "dual-clip fraction", "Share of counted tokens with A < 0 capped by the dual clip c.",
        {"verl": "actor/pg_clipfrac_lower"}, "actor/pg_clipfrac_lower",
    ),
    Series("correction_masked", "correction: masked share", "Share of counted tokens the rollout correction masked."),
    Series(
        "correction_reweighted", "correction: reweighted share",
        "Share of counted tokens the rollout correction kept with an importance weight other than 1.",
    ),
    Series("correction_mean_weight", "correction: mean weight", "Mean importance weight over the tokens it kept."),
    Series(
        "mismatch_mean", "training/sampler mismatch, mean", "Mean |old - sampler| log-prob over counted scored tokens.",
        {"trl": "sampling/sampling_logp_difference/mean"},
    ),
    Series(
        "mismatch_max", "training/sampler mismatch, max", "Largest |old - sampler| log-prob over counted tokens.",
        {"trl": "sampling/sampling_logp_difference/max"},
    ),
    Series(
        "mismatch_kl", "training/sampler KL", "verl's KL between the training and the sampler's policies.",
        {"verl": "rollout_corr/kl"}, "rollout_corr/kl",
    ),
    Series(
        "entropy", "entropy", "Mean entropy over counted tokens.",
        {"trl": "entropy", "verl": "actor/entropy"}, "entropy",
    ),
    Series("advantage_std", "advantage spread", "Standard deviation (unbiased) of the rows' advantages."),
    Series("zero_advantage_rows", "rows with zero advantage", "Share of the step's rows whose advantage is 0."),
    Series("length_mean", "response length, mean", "Mean counted tokens per row."),
    Series("length_max", "response length, max", "Most counted tokens in a row."),
)  # fmt: skip
LABELS = {s.name: s.label for s in SERIES}


@dataclass(frozen=True)
class FileFacts:
    """What the timeline keeps of one step file once its breakdown is gone."""

    counted: int
    total: int
    rows: int
    policy_loss: float
    kl_loss: float
    abs_loss: float
    metrics: dict[str, float]
    """The file's own values of the series that are breakdown metrics."""
    correction: list[float] | None
    """(masked, reweighted, weight sum, weight count) over counted tokens; None: the batch has no sampler log-probs."""
    mismatch: list[float] | None
    """(sum, count, max) of |old - sampler| over counted scored tokens; None: no sampler log-probs."""
    advantage: list[float]
    """(rows, mean, sum of squared deviations, zero rows) of the rows' advantages."""
    lengths: list[int]
    """(sum, max) of the rows' counted tokens."""
    top: dict[str, list[list[Any]]]
    """[row, col, value] of the file's largest tokens: ``loss``, ``kl``, ``mismatch``, ``clipped``, ``entropy``."""


def _top(values: Tensor, where: Tensor, k: int, largest: bool = True) -> list[list[Any]]:
    """[row, col, value] of the ``k`` positions of ``where`` with the largest |value| (or smallest value)."""
    keyed = values.abs() if largest else -values
    if largest:  # a token that adds nothing carries nothing
        where = where & (values != 0)
    n = min(k, int(where.sum()))
    if n == 0:
        return []
    idx = torch.topk(keyed.masked_fill(~where, -math.inf).flatten(), n).indices
    width = values.shape[1]
    return [[i // width, i % width, v] for i, v in zip(idx.tolist(), values.flatten()[idx].tolist(), strict=True)]


def file_facts(bd: Breakdown, k: int) -> FileFacts:
    t = bd.tokens
    counted = t.mask
    n = int(counted.sum())
    clipped = counted & ((t.region == CLIP_LOW) | (t.region == CLIP_HIGH) | (t.region == DUAL_CLIP))
    top = {"loss": _top(t.loss, counted, k), "kl": _top(t.kl, counted, k), "clipped": _top(t.log_ratio, clipped, k)}
    correction = mismatch = None
    if bd.rollout_logps is not None:
        masked = counted & ((t.correction == MASKED) | (t.correction == SEQUENCE_MASKED) | (t.correction == REJECTED))
        kept = counted & ~masked
        reweighted = kept & (t.is_weight != 1)
        correction = [
            int(masked.sum()),
            int(reweighted.sum()),
            float(t.is_weight[kept].double().sum()),
            int(kept.sum()),
        ]
    if bd.sampled:
        scored = counted & (t.correction != NOT_SCORED)
        gap = t.sampler_log_ratio.abs()[scored].double()
        mismatch = [float(gap.sum()), gap.numel(), float(gap.max()) if gap.numel() else 0.0]
        top["mismatch"] = _top(t.sampler_log_ratio, scored, k)
    if bd.entropies is not None:
        top["entropy"] = _top(bd.entropies, counted, k, largest=False)
    adv = bd.advantages.double()
    mean = float(adv.mean())
    lengths = bd.rows.length
    names = [s.metric for s in SERIES if s.metric is not None and s.metric in bd.metrics]
    if bd.config.dual_clip is None and bd.config.delta is None and "actor/pg_clipfrac_lower" in names:
        names.remove("actor/pg_clipfrac_lower")  # no dual clip: the series cannot exist, never a 0
    return FileFacts(
        n, t.mask.numel(), int(adv.numel()), float(bd.policy_loss), float(bd.kl_loss),
        float(t.loss.double().abs().sum()),
        {m: float(bd.metrics[m]) for m in names}, correction, mismatch,
        [int(adv.numel()), mean, float(((adv - mean) ** 2).sum()), int((adv == 0).sum())],
        [int(lengths.sum()), int(lengths.max())], top,
    )  # fmt: skip


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def _advantage_std(parts: list[list[float]]) -> float | None:
    """The unbiased std of every row's advantage, from each file's (rows, mean, squared deviations) (Chan et al.)."""
    n, mean, m2 = 0.0, 0.0, 0.0
    for rows, m, sq, _ in parts:
        total = n + rows
        if total:
            delta = m - mean
            mean, m2 = mean + delta * rows / total, m2 + sq + delta * delta * n * rows / total
        n = total
    return math.sqrt(m2 / (n - 1)) if n > 1 else None


def series_of(facts: list[FileFacts], ranks: int, joined: dict[str, float] | None, source: Any) -> dict[str, Any]:
    """A step's (or a rank's) series from its files' facts; ``joined``: the breakdown metrics joined as the
    trainer logs them (the check's ``lens_mean``), else each metric's plain mean over the files."""
    if not facts:
        return dict.fromkeys((s.name for s in SERIES), None)
    out: dict[str, Any] = {}
    for s in SERIES:
        if s.metric is None:
            continue
        name = s.trainer.get(source, s.metric) if all(s.trainer.get(source) in f.metrics for f in facts) else s.metric
        values = [f.metrics.get(name) for f in facts]
        plain = None if None in values else sum(v for v in values if v is not None) / len(values)
        out[s.name] = plain if joined is None or plain is None else joined.get(name, plain)
    counted = sum(f.counted for f in facts)
    out["policy_loss"] = sum(f.policy_loss for f in facts) / ranks
    out["kl_loss"] = sum(f.kl_loss for f in facts) / ranks
    cor = [f.correction for f in facts]
    if None in cor:
        out |= dict.fromkeys(("correction_masked", "correction_reweighted", "correction_mean_weight"), None)
    else:
        masked, reweighted, weights, kept = (sum(c[i] for c in cor if c is not None) for i in range(4))
        out["correction_masked"], out["correction_reweighted"] = _ratio(masked, counted), _ratio(reweighted, counted)
        out["correction_mean_weight"] = _ratio(weights, kept)
    gaps = [f.mismatch for f in facts]
    if None in gaps:
        out["mismatch_mean"] = out["mismatch_max"] = None
    else:
        out["mismatch_mean"] = _ratio(sum(g[0] for g in gaps if g), sum(g[1] for g in gaps if g))
        out["mismatch_max"] = max(g[2] for g in gaps if g is not None)
    rows = sum(f.rows for f in facts)
    out["advantage_std"] = _advantage_std([f.advantage for f in facts])
    out["zero_advantage_rows"] = _ratio(sum(f.advantage[3] for f in facts), rows)
    out["length_mean"] = _ratio(sum(f.lengths[0] for f in facts), rows)
    out["length_max"] = max(f.lengths[1] for f in facts)
    return {s.name: out[s.name] for s in SERIES}
