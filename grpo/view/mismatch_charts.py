"""The mismatch view's charts: the token scatter (old against sampler) with the token-level bounds as lines,
the per-row charts with the sequence-level bounds, and the thresholds in force (grpo.view.mismatch).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from grpo.config import LossConfig
from grpo.corrections import KEPT, Criterion
from grpo.loss import Breakdown
from grpo.marks import number
from grpo.view.mismatch_gap import Gap

SCATTER_MAX = 5000
"""Points the scatter carries at most: the tokens a correction acted on first, then the others in order."""


def thresholds(config: LossConfig, level: str | None, criteria: list[Criterion], base: str) -> list[dict[str, Any]]:
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
def scatter(
    bd: Breakdown, gap: Gap, config: LossConfig, level: str | None, criteria: list[Criterion]
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


def row_charts(
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
