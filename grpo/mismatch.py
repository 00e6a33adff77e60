"""The mismatch view's data: the sampler against the trainer, per token and per row, and what the rollout
correction did about it (issue 22 item 4).

Real runs sample with one engine (vLLM, SGLang) and train with another; the two disagree on the log-probs
of the very same tokens, and the trainers correct for it (``grpo.corrections``). ``mismatch_view`` gives
the page everything it draws, computed here once: the token pairs (trainer-old log-prob, sampler log-prob)
for the diagonal scatter with the token-level bounds as lines, each row's summed and mean log-ratio with
its sequence-level bounds, the thresholds in force, what the correction did to each token and row (codes
into ``CORRECTION_CODES``), and sentences whose numbers are marked with the quantity they show
(``grpo.explain.mark``; every such number is also in the block, under ``stats`` or ``rows``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from grpo.config import LossConfig
from grpo.corrections import (
    ACTION_CODES,
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
    clamped_exp,
    off_policy_keep,
    outside,
    rejection_keep,
    rs_criteria,
    rs_statistic,
    sampler_log_ratio,
    sequence_ratio,
)
from grpo.loss import Breakdown, RolloutLogps
from grpo.marks import mark, number, parts_of, plain

SCATTER_MAX = 5000
"""Points the scatter carries at most: the tokens a correction acted on first, then the others in order."""
ROW_LIST = 6
"""Rows a sentence names one by one; past these it says how many more."""

# What a row shows when its tokens were treated differently: the strongest action among them.
ROW_PRIORITY = (NOT_COUNTED, KEPT, NOT_SCORED, TRUNCATED, MASKED, SEQUENCE_MASKED, REJECTED)

# What acting means for a correction, by the code its entry returns (never by its name).
ACTED_VERB = {
    MASKED: ("dropped", "weight 0: the policy term is dropped"),
    TRUNCATED: ("truncated", "weight clamped to the bound passed"),
}


@dataclass(frozen=True)
class _Gap:
    """The mismatch of one batch, once: old (or current, in bypass) against the sampler."""

    base: Tensor
    sampler: Tensor | None
    counted: Tensor
    """bool (B, T): counted before rollout_rs."""
    scored: Tensor
    """bool (B, T): counted and scored by the sampler (none without sampler log-probs)."""
    log_ratio: Tensor
    """(B, T) base - sampler, 0 where not scored."""


@dataclass
class _Sentences:
    """Sentences under construction; every number marked and recorded in ``stats`` (or ``rows``)."""

    rows: dict[str, Any]
    base: str
    """What the sampler's log-probs are compared with: "old", or in bypass mode "current"."""
    stats: dict[str, float] = field(default_factory=dict)
    items: list[tuple[str, str]] = field(default_factory=list)

    def q(self, name: str, value: float, digits: int = 4) -> str:
        self.stats[name] = float(value)
        return mark(f"mismatch/stats/{name}", value, digits)

    def n(self, name: str, value: int) -> str:
        return self.q(name, value, 12)

    def row_value(self, name: str, i: int, digits: int = 4) -> str:
        return mark(f"mismatch/rows/{name}/{i}", float(self.rows[name][i]), digits)

    def row_list(self, key: str, rows: list[int], value: str | None = None) -> tuple[str, str]:
        """("rows 3 and 7", "4.1 and 6.7"): each index and value marked; past ROW_LIST rows, how many more."""
        shown = rows[:ROW_LIST]
        names = [mark(f"rows/index/{i}", i, 12) for i in shown]
        values = [self.row_value(value, i) for i in shown] if value else []
        more = len(rows) - len(shown)
        tail = f" and {self.n(f'{key}_more_rows', more)} more" if more else ""
        word = "row" if len(rows) == 1 else "rows"
        return f"{word} {_join(names)}{tail}", _join(values) + (" …" if more and values else "")

    def add(self, key: str, text: str) -> None:
        self.items.append((key, text))


def _join(items: list[str]) -> str:
    if len(items) <= 2:
        return " and ".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def _level(config: LossConfig) -> tuple[str | None, int]:
    """(level, code): the chosen correction's declared level ("token", "sequence", None for none) and what
    acting means (TRUNCATED or MASKED; KEPT when it does nothing)."""
    entry = CORRECTIONS.entry(config.rollout_correction)
    if entry.level is None or entry.action is None:
        return None, KEPT
    return entry.level, ACTION_CODES[entry.action]


def mismatch_view(bd: Breakdown) -> dict[str, Any] | None:
    """The mismatch view's block of the /loss answer; None when the batch has no sampler log-probs and no
    correction acted (nothing to show)."""
    logps = bd.rollout_logps
    acted = bool((bd.tokens.correction > KEPT).any())
    if logps is None or (logps.sampler is None and not acted):
        return None
    config = bd.config
    gap = _gap(logps)
    level, code = _level(config)
    criteria = (
        []
        if config.rollout_rs is None or gap.sampler is None
        else rs_criteria(config.rollout_rs, config.rollout_rs_threshold)
    )
    rows = _rows(bd, gap, level, logps, criteria)
    s = _Sentences(rows, "current" if config.rollout_bypass else "old")
    _gap_sentence(s, bd, gap)
    if level == "sequence" and gap.sampler is not None:
        _sequence_sentence(s, bd, gap, code)
    if level == "token" and gap.sampler is not None:
        _token_sentence(s, bd, gap, code)
    if config.off_policy_mask_threshold is not None:
        _off_policy_sentence(s, bd, gap)
    if criteria:
        _rejection_sentence(s, bd, gap, criteria)
    _not_scored_sentence(s, gap)
    _loss_sentence(s, bd, level, criteria)
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
        "thresholds": _thresholds(config, level, criteria, s.base),
        "scatter": _scatter(bd, gap, config, level, criteria),
        "rows": {k: v.cpu().numpy() if isinstance(v, Tensor) else v for k, v in rows.items()},
        "row_charts": _row_charts(config, level, criteria, rows, s.base),
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


def _gap(logps: RolloutLogps) -> _Gap:
    counted = logps.counted
    base = logps.base.detach()
    if logps.sampler is None:
        none = torch.zeros_like(counted)
        return _Gap(base, None, counted, none, torch.zeros_like(base))
    sampler = logps.sampler.detach()
    scored = counted & ~torch.isnan(sampler)
    return _Gap(base, sampler, counted, scored, sampler_log_ratio(base, sampler, counted.to(base.dtype)))


def _rows(
    bd: Breakdown, gap: _Gap, level: str | None, logps: RolloutLogps, criteria: list[Criterion]
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


# --- thresholds -----------------------------------------------------------------------------------------
def _thresholds(config: LossConfig, level: str | None, criteria: list[Criterion], base: str) -> list[dict[str, Any]]:
    """The bounds in force, each with the config field it comes from and what it bounds."""
    out: list[dict[str, Any]] = []
    if level is not None:
        what = (
            f"the row's ratio exp(Σ {base} − sampler)"
            if level == "sequence"
            else f"each token's ratio exp({base} − sampler)"
        )
        for name in ("rollout_is_min", "rollout_is_max"):
            value = getattr(config, name)
            if value is not None:
                out.append({"name": name, "value": value, "quantity": f"config/{name}", "bounds": what})
    if config.off_policy_mask_threshold is not None:
        out.append(
            {
                "name": "off_policy_mask_threshold",
                "value": config.off_policy_mask_threshold,
                "quantity": "config/off_policy_mask_threshold",
                "bounds": "the mean behaviour − current log-prob of a row with A < 0",
            }
        )
    for c in criteria:
        if c.lower is not None:
            out.append(_rs_threshold(c, "lower", c.lower))
        out.append(_rs_threshold(c, "upper", c.upper))
    return out


def _rs_threshold(c: Criterion, side: str, value: float) -> dict[str, Any]:
    if c.lower is None:
        bounds = f"rollout_rs {c.name}: an upper bound on the statistic"
    else:  # verl's k1 statistic is -log r = sampler - old: its bounds are on exp(-log r) = 1/r, not on r
        low = side == "lower"
        bounds = (  # no number here: the page prints the value, tagged, before it
            f"rollout_rs {c.name}: a bound on −log r = sampler − old, kept {'at least' if low else 'at most'} "
            f"log {side}, i.e. exp(sampler − old) {'≥' if low else '≤'} {side}: the ratio r = exp(old − sampler) "
            f"{'≤' if low else '≥'} 1/{side}, not r {'≥' if low else '≤'} {side}"
        )
    return {"name": f"{c.name} {side}", "value": value, "quantity": f"mismatch/rs/{c.name}/{side}", "bounds": bounds}


def _k3_roots(upper: float) -> tuple[float, float]:
    """The two d with e^d - 1 - d = upper (d < 0 < d): where verl's k3 statistic meets its bound."""

    def solve(lo: float, hi: float) -> float:
        f_lo = math.expm1(lo) - lo - upper
        for _ in range(200):
            mid = (lo + hi) / 2
            f_mid = math.expm1(mid) - mid - upper
            if (f_mid > 0) == (f_lo > 0):
                lo, f_lo = mid, f_mid
            else:
                hi = mid
        return (lo + hi) / 2

    return solve(-(upper + 2.0), 0.0), solve(0.0, math.log(upper + 2.0) + 1.0)


def _token_lines(config: LossConfig, level: str | None, criteria: list[Criterion]) -> list[dict[str, Any]]:
    """The token-level bounds on the scatter as lines sampler = old + offset (old − sampler = -offset)."""
    lines: list[dict[str, Any]] = []
    if level == "token":
        for name, label in (("rollout_is_max", "C_max"), ("rollout_is_min", "C_min")):
            value = getattr(config, name)
            if value is not None and value > 0:
                lines.append({"offset": -math.log(value), "label": f"ratio = {label} ({number(value)})"})
    for c in criteria:
        if not c.name.startswith("token_"):
            continue
        k = c.name.rsplit("_", 1)[1]
        if c.lower is not None:  # k1: -log r in [log lower, log upper]; -log r = sampler - old
            offsets = [math.log(c.lower), math.log(c.upper)]
        elif k == "k2":  # ½(log r)² <= upper
            offsets = [math.sqrt(2 * c.upper), -math.sqrt(2 * c.upper)]
        else:  # k3: r - 1 - log r <= upper
            low, high = _k3_roots(c.upper)
            offsets = [-low, -high]
        if c.lower is not None:  # the bounds are on -log r = sampler - old, each line says which
            lines += [
                {"offset": d, "label": f"rollout_rs {c.name}: −log r = sampler − old = log {side} ({number(v)})"}
                for d, side, v in zip(offsets, ("lower", "upper"), (c.lower, c.upper), strict=True)
            ]
            continue
        lines += [{"offset": d, "label": f"rollout_rs {c.name} bound"} for d in offsets]
    return lines


# --- the scatter and the row charts -------------------------------------------------------------------------
def _scatter(
    bd: Breakdown, gap: _Gap, config: LossConfig, level: str | None, criteria: list[Criterion]
) -> dict[str, Any]:
    """The (old, sampler) pair of every scored token, what the correction did to it, and the token bounds."""
    if gap.sampler is None:
        empty = np.zeros(0, np.float32)
        return {
            **{k: empty for k in ("x", "y", "log_ratio")},
            **{k: [] for k in ("row", "position", "code", "lines")},
            "total": 0,
            "range": [-1.0, 0.0],
        }
    codes = bd.tokens.correction
    kept = codes == KEPT
    acted = (gap.scored & ~kept).nonzero()[:SCATTER_MAX]  # (n, 2), row-major: the acted on first
    room = SCATTER_MAX - acted.shape[0]
    rest = (gap.scored & kept).nonzero()[:room] if room else acted[:0]
    pick = torch.cat([acted, rest])
    rows, positions = pick[:, 0], pick[:, 1]
    x, y = gap.base[rows, positions], gap.sampler[rows, positions]
    # the lines' ends: the points' extent, a little wider (the page draws what it is given)
    both = torch.cat([x, y])
    low, high = (float(both.min()), float(both.max())) if both.numel() else (-1.0, 0.0)
    pad = 0.05 * (high - low) + 0.01
    ends = [low - pad, min(high + pad, 0.0) if high <= 0 else high + pad]
    lines = [{"label": "diagonal: sampler = old", "offset": 0.0}, *_token_lines(config, level, criteria)]
    return {
        "x": x.float().cpu().numpy(),
        "y": y.float().cpu().numpy(),
        "log_ratio": gap.log_ratio[rows, positions].float().cpu().numpy(),
        "row": rows.to(torch.int32).cpu().numpy(),
        "position": positions.to(torch.int32).cpu().numpy(),
        "code": codes[rows, positions].to(torch.int8).cpu().numpy(),
        "total": int(gap.scored.sum()),
        "range": ends,
        # each line as sampler = old + offset (its ends), and as the log-ratio old − sampler it stands at
        "lines": [
            {**line, "x": ends, "y": [e + line["offset"] for e in ends], "log_ratio": 0.0 - line["offset"]}
            for line in lines
        ],
    }


def _row_charts(
    config: LossConfig, level: str | None, criteria: list[Criterion], rows: dict[str, Tensor], base: str
) -> list[dict[str, Any]]:
    """Per-row charts: a row statistic (a field of ``rows``) with the sequence-level bounds on it."""
    charts: list[dict[str, Any]] = []
    if "sum_log_ratio" in rows:
        lines = []
        if level == "sequence":
            for name, label in (("rollout_is_max", "log C_max"), ("rollout_is_min", "log C_min")):
                value = getattr(config, name)
                if value is not None and value > 0:
                    lines.append({"value": math.log(value), "label": f"{label} (C = {number(value)})"})
        charts.append(
            {
                "field": "sum_log_ratio",
                "title": f"Per row: Σ ({base} − sampler) log-prob = log of the sequence ratio"
                + (", with the sequence bounds" if lines else ""),
                "y_label": f"Σ {base} − sampler",
                "lines": lines,
            }
        )
    for c in criteria:
        if c.name.startswith("token_"):
            continue
        bounds = [c.upper] if c.lower is None else [math.log(c.lower), math.log(c.upper)]
        charts.append(
            {
                "field": f"rs/{c.name}",
                "title": f"Per row: rollout_rs {c.name}, rejected outside its bounds",
                "y_label": c.name,
                "lines": [
                    {"value": b, "label": f"{c.name} bound ({number(b)})"}
                    if c.lower is None
                    else {"value": b, "label": f"{c.name}: −log r bound, log {side} = {number(b)}"}
                    for b, side in zip(bounds, ("upper",) if c.lower is None else ("lower", "upper"), strict=True)
                ],
            }
        )
    if "off_policy_gap" in rows and config.off_policy_mask_threshold is not None:
        charts.append(
            {
                "field": "off_policy_gap",
                "title": "Per row: mean behaviour − current log-prob (a row with A < 0 above the line is dropped)",
                "y_label": "mean behaviour − current",
                "lines": [
                    {
                        "value": config.off_policy_mask_threshold,
                        "label": f"off_policy_mask_threshold ({number(config.off_policy_mask_threshold)})",
                    }
                ],
            }
        )
    return charts


# --- sentences ---------------------------------------------------------------------------------------------
def _share(part: Tensor, whole: Tensor) -> float:
    total = int(whole.sum())
    return 100.0 * int(part.sum()) / total if total else 0.0


def _gap_sentence(s: _Sentences, bd: Breakdown, gap: _Gap) -> None:
    if gap.sampler is None:
        s.add(
            "gap",
            "The batch carries no sampler log-probs: the off-policy sequence mask measures the old log-probs "
            "against the current ones, as TRL does without vLLM.",
        )
        return
    n = int(gap.scored.sum())
    if n == 0:
        s.add("gap", "The sampler scored none of the counted tokens: there is no gap to show.")
        return
    absolute = gap.log_ratio.abs().masked_fill(~gap.scored, -1.0)
    flat = int(absolute.flatten().argmax())
    r, p = divmod(flat, absolute.shape[1])
    lengths = gap.scored.sum(-1)
    filled = [i for i in range(len(lengths)) if int(lengths[i])]
    totals = s.rows["sum_log_ratio"]
    low = min(filled, key=lambda i: (float(totals[i]), i))
    high = max(filled, key=lambda i: (float(totals[i]), -i))
    s.add(
        "gap",
        f"The sampler and the trainer disagree on the {s.n('num_scored', n)} scored tokens by "
        f"{s.q('abs_gap_mean', float(gap.log_ratio.abs()[gap.scored].mean()))} nats on average "
        f"(|{s.base} − sampler|; at most {s.q('abs_gap_max', float(absolute[r, p]))}, at row "
        f"{mark(f'rows/index/{r}', r, 12)} position {s.n('abs_gap_max_position', p)}). Summed over a row the "
        f"gaps add up: Σ ({s.base} − sampler) runs from {s.row_value('sum_log_ratio', low)} (row "
        f"{mark(f'rows/index/{low}', low, 12)}) to {s.row_value('sum_log_ratio', high)} (row "
        f"{mark(f'rows/index/{high}', high, 12)}), a sequence ratio exp(Σ) of {s.row_value('is_ratio', low)} to "
        f"{s.row_value('is_ratio', high)}.",
    )


def _bounds_text(config: LossConfig, inside: bool) -> str:
    """Where a ratio is with respect to [C_min, C_max]: "inside [C_min, C_max] = [0.5, 2]", "at most C_max = 3"
    (or, for ``inside=False``, where it left them), the bounds marked."""
    low, high = config.rollout_is_min, config.rollout_is_max
    lo = None if low is None else mark("config/rollout_is_min", low)
    hi = None if high is None else mark("config/rollout_is_max", high)
    if lo and hi:
        return f"{'inside' if inside else 'outside'} [C_min, C_max] = [{lo}, {hi}]"
    if hi:
        return f"{'at most' if inside else 'above'} C_max = {hi}"
    if lo:
        return f"{'at least' if inside else 'below'} C_min = {lo}"
    return "unbounded"


def _sequence_sentence(s: _Sentences, bd: Breakdown, gap: _Gap, code: int) -> None:
    """Rows whose ratio exp(Σ) left the bounds: dropped (mask) or clamped (truncate)."""
    config = bd.config
    name = config.rollout_correction
    ratio = s.rows["is_ratio"]
    filled = gap.counted.any(-1)
    verb, meaning = ACTED_VERB[code]
    tokens = gap.counted
    said = False
    for side, bound_name in (("above", "rollout_is_max"), ("below", "rollout_is_min")):
        bound = getattr(config, bound_name)
        if bound is None:
            continue
        hit = filled & ((ratio > bound) if side == "above" else (ratio < bound))
        rows = hit.nonzero().flatten().tolist()
        if not rows:
            continue
        said = True
        named, values = s.row_list(f"{side}_{bound_name}", rows, "is_ratio")
        share = s.q(f"{side}_token_percent", _share(tokens[hit], tokens))
        one = len(rows) == 1
        s.add(
            "sequence",
            f"{named[0].upper() + named[1:]} {'was' if one else 'were'} {verb} by {name}: "
            f"{'its ratio exp(Σ) is' if one else 'their ratios exp(Σ) are'} {values}, {side} "
            f"{'C_max' if side == 'above' else 'C_min'} = {mark(f'config/{bound_name}', bound)} ({meaning}); "
            f"{'it holds' if one else 'they hold'} {share}% of the batch's tokens.",
        )
    if not said:
        kept = ratio[filled]
        if kept.numel():
            s.add(
                "sequence",
                f"Every row's ratio exp(Σ) is {_bounds_text(config, True)} (from "
                f"{s.q('is_ratio_min', float(kept.min()))} to {s.q('is_ratio_max', float(kept.max()))}): "
                f"{name} keeps every row with its weight.",
            )


def _token_sentence(s: _Sentences, bd: Breakdown, gap: _Gap, code: int) -> None:
    """Tokens whose ratio exp(old − sampler) left the bounds."""
    config = bd.config
    name = config.rollout_correction
    ratio = clamped_exp(gap.log_ratio, config)
    hit = gap.scored & outside(ratio, config).bool()
    verb, meaning = ACTED_VERB[code]
    n = int(hit.sum())
    assert gap.sampler is not None
    if not n:
        kept = ratio[gap.scored]
        if kept.numel():
            s.add(
                "token",
                f"Every scored token's ratio exp({s.base} − sampler) is {_bounds_text(config, True)} (from "
                f"{s.q('token_ratio_min', float(kept.min()))} to {s.q('token_ratio_max', float(kept.max()))}): "
                f"{name} keeps every token with its weight.",
            )
        return
    rows = hit.any(-1).nonzero().flatten().tolist()
    named, _ = s.row_list("token_rows", rows)
    far = gap.log_ratio.abs().masked_fill(~hit, -1.0)
    r, p = divmod(int(far.flatten().argmax()), far.shape[1])
    s.add(
        "token",
        f"{s.n('token_acted', n)} token(s) were {verb} by {name} ({meaning}): "
        f"{s.q('token_acted_percent', _share(hit, gap.scored))}% of the scored tokens, in {named}. "
        f"{'Its ratio' if n == 1 else 'Their ratios'} exp({s.base} − sampler) {'is' if n == 1 else 'are'} "
        f"{_bounds_text(config, False)}; the farthest, row {mark(f'rows/index/{r}', r, 12)} "
        f"position {s.n('token_far_position', p)}, has ratio {s.q('token_far_ratio', float(ratio[r, p]))} (old "
        f"{s.q('token_far_old', float(gap.base[r, p]))}, sampler "
        f"{s.q('token_far_sampler', float(gap.sampler[r, p]))}).",
    )


def _off_policy_sentence(s: _Sentences, bd: Breakdown, gap: _Gap) -> None:
    threshold = bd.config.off_policy_mask_threshold
    assert threshold is not None
    behaviour = "old" if gap.sampler is None else "sampler"
    mean_gap = s.rows["off_policy_gap"]
    negative = (bd.advantages < 0) & gap.counted.any(-1)
    dropped = negative & (mean_gap > threshold)
    t = mark("config/off_policy_mask_threshold", threshold)
    rows = dropped.nonzero().flatten().tolist()
    if rows:
        named, values = s.row_list("off_policy", rows, "off_policy_gap")
        one = len(rows) == 1
        s.add(
            "off_policy",
            f"{named[0].upper() + named[1:]} {'was' if one else 'were'} dropped by the off-policy sequence mask: "
            f"A < 0 and {'its' if one else 'their'} mean {behaviour} − current log-prob{'' if one else 's'} "
            f"{'is' if one else 'are'} {values}, above "
            f"off_policy_mask_threshold = {t}; {'it holds' if one else 'they hold'} "
            f"{s.q('off_policy_token_percent', _share(gap.counted[dropped], gap.counted))}% of the batch's tokens.",
        )
        return
    if bool(negative.any()):
        i = max(negative.nonzero().flatten().tolist(), key=lambda k: (float(mean_gap[k]), -k))
        s.add(
            "off_policy",
            f"The off-policy sequence mask drops no row: every row with A < 0 has a mean {behaviour} − current "
            f"log-prob at most off_policy_mask_threshold = {t} (the largest, row {mark(f'rows/index/{i}', i, 12)}, "
            f"{s.row_value('off_policy_gap', i)}).",
        )
    else:
        s.add("off_policy", "The off-policy sequence mask drops no row: no row has A < 0.")


def _rejection_sentence(s: _Sentences, bd: Breakdown, gap: _Gap, criteria: list[Criterion]) -> None:
    mask = gap.counted.to(gap.base.dtype)
    rejected = bd.tokens.correction == REJECTED
    n = int(rejected.sum())
    per = []
    for c in criteria:
        k = int((gap.counted & ~rejection_keep(gap.log_ratio, mask, [c]).bool()).sum())
        per.append(f"{c.name} rejects {s.n(f'rs_{c.name}_tokens', k)}")
    if not n:
        s.add("rejected", f"rollout_rs rejects no token: {'; '.join(per)}.")
        return
    rows = rejected.any(-1).nonzero().flatten().tolist()
    named, _ = s.row_list("rejected", rows)
    s.add(
        "rejected",
        f"rollout_rs rejected {s.n('rejected_tokens', n)} token(s), "
        f"{s.q('rejected_token_percent', _share(rejected, gap.counted))}% of the batch's, in {named}: they leave "
        f"the batch (policy term, KL and the aggregation's counts). By criterion: {'; '.join(per)}.",
    )


def _not_scored_sentence(s: _Sentences, gap: _Gap) -> None:
    if gap.sampler is None:
        return
    n = int((gap.counted & ~gap.scored).sum())
    if n:
        s.add(
            "not_scored",
            f"{s.n('not_scored', n)} token(s) were not scored by the sampler (NaN): they add 0 to the gap, and at "
            "token level keep weight 1 (TRL applies no correction there).",
        )


def _loss_sentence(s: _Sentences, bd: Breakdown, level: str | None, criteria: list[Criterion]) -> None:
    loss, without = float(bd.loss), float(bd.loss_without_correction)
    L = mark("loss", loss)
    if level is None and bd.config.off_policy_mask_threshold is None and not criteria:
        s.add(
            "loss",
            f"No rollout correction is chosen: the gap is shown and changes nothing; the loss is {L}. Pick "
            "rollout_correction (TRL's default with vLLM is sequence_mask) to see what each would do.",
        )
        return
    s.add(
        "loss",
        f"With the correction the loss is {L}; without it (the same batch, every correction off) it would be "
        f"{mark('loss_without_correction', without)}, a change of {s.q('loss_change', loss - without)}.",
    )
