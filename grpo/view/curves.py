"""The objective as a function of the ratio, for A = +1 and A = -1: the curves of the clip view.

The curves and the batch's points come from the same registered objective, evaluated with a unit
advantage (and logp = 1, so CISPO's and GPG's curves show the weight on A·logp), so every token
lies on its curve. Flat spans (clipped, zero gradient) are read off the objective's regions.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from torch import Tensor

from grpo.config import LossConfig
from grpo.loss import Breakdown
from grpo.objectives import OBJECTIVES, REGIONS, TRUST
from grpo.view.counted import Counted


def unit_objective(ratio: Tensor, sign: Tensor, config: LossConfig) -> tuple[Tensor, Tensor]:
    """(surrogate, region) at ``ratio`` (N,) for advantages ``sign`` (N,) in {-1, 0, 1}.

    The tokens an objective's own rule picks (Clip-Cov's cut, KL-Cov's penalty: ObjectiveTerms.selected) are
    picked by the batch's covariance, not by their ratio: the curve is the rule for the tokens it leaves, so a
    token the rule picked among these N is NaN here (the curves fill it from their unpicked neighbours)."""
    r = ratio[:, None].to(torch.float64)  # (N,) -> (N, 1): one token per row
    A = sign[:, None].to(torch.float64)
    terms = OBJECTIVES.get(config.objective)(r, torch.ones_like(r), A, config)
    value, region = terms.surrogate.detach()[:, 0], terms.region.expand_as(r)[:, 0]
    if terms.selected is None:
        return value, region
    picked = terms.selected.expand_as(r)[:, 0] > 0
    return value.masked_fill(picked, float("nan")), region.masked_fill(picked, TRUST)


def _per_row(config: LossConfig) -> bool:
    """Whether the objective's term is one per row (ObjectiveTerms.weight set: verl's geo_mean), so a token's own
    ratio does not give the term the objective uses: the curve is a one-token row's, the points their row's."""
    return _weighs_rows(config, OBJECTIVES.get(config.objective))


@lru_cache(maxsize=256)
def _weighs_rows(config: LossConfig, objective: Callable[..., Any]) -> bool:
    """``_per_row``, asked of the objective once per config (a call on one token, per answer twice): ``objective``
    (the registered function) is part of the key, so a plugin that registers the name again is asked again."""
    one = torch.ones(1, 1, dtype=torch.float64)
    return objective(one, one, one, config).weight is not None


def _row_terms(bd: Breakdown) -> Tensor:
    """(B, T) float64: each token's row term per unit advantage, surrogate / |Ā| (Ā the row's mean A over its
    counted tokens, as geo_mean takes it); 0 where Ā is 0."""
    mask = bd.tokens.mask.double()
    a = bd.tokens.advantage.detach().double()
    mean_a = (a * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)  # (B, T) -> (B, 1)
    size = mean_a.abs()
    return bd.tokens.surrogate.detach().double() / size.where(size > 0, 1.0)


def _filled(x: Tensor, y: Tensor) -> Tensor:
    """``y`` on the grid ``x`` with its NaNs (tokens a rule picked) on the line through their neighbours."""
    gap = torch.isnan(y)
    if not bool(gap.any()) or bool(gap.all()):
        return y
    return torch.from_numpy(np.interp(x.numpy(), x[~gap].numpy(), y[~gap].numpy())).to(y.dtype)


def _flat_spans(x: Tensor, region: Tensor) -> list[dict[str, Any]]:
    """Contiguous spans of the grid where the region is not TRUST."""
    spans: list[dict[str, Any]] = []
    codes = region.tolist()
    xs = x.tolist()
    for i, code in enumerate(codes):
        if code == TRUST:
            continue
        name = REGIONS[int(code)]
        if spans and spans[-1]["region"] == name and spans[-1]["end"] == i - 1:
            spans[-1]["end"] = i
            spans[-1]["x1"] = xs[i]
        else:
            spans.append({"region": name, "x0": xs[i], "x1": xs[i], "end": i})
    for span in spans:
        span.pop("end")
    return spans


@lru_cache(maxsize=256)
def _grid_curves(
    config: LossConfig, objective: object, low: float, high: float, points: int
) -> tuple[tuple[float, ...], dict[str, tuple[tuple[float, ...], tuple[dict[str, Any], ...]]]]:
    """The grid and both curves: they depend on the config and the grid's ends only, so a control move
    that keeps the batch's ratio range (most of them) reuses them. ``objective`` (the registered
    function) is part of the key: a plugin that registers the name again gets its own curves."""
    grid = torch.logspace(torch.log10(torch.tensor(low)), torch.log10(torch.tensor(high)), points, dtype=torch.float64)
    curves = {}
    for name, sign in (("positive", 1.0), ("negative", -1.0)):
        value, region = unit_objective(grid, torch.full_like(grid, sign), config)
        curves[name] = (tuple(_filled(grid, value).tolist()), tuple(_flat_spans(grid, region)))
    return tuple(grid.tolist()), curves


def objective_curves(
    bd: Breakdown, points: int = 241, max_points: int = 500, tokens: Counted | None = None
) -> dict[str, Any]:
    """Curves for A = +1 and A = -1 over a log-spaced ratio grid covering the batch, and the
    batch's counted tokens placed on them (the first ``max_points``, in row order; ``truncated``
    says when there were more). ``tokens``: the breakdown's counted tokens, when the caller has them."""
    tokens = Counted(bd) if tokens is None else tokens
    mask = tokens.mask
    ratio = bd.tokens.ratio.detach()
    counted = tokens.n > 0  # no token counts (all masked): no points, and the objectives never see an empty batch
    low, high = 0.5, 2.0
    if counted:
        smallest, largest = torch.aminmax(tokens.values(ratio))
        low = min(low, float(smallest) / 1.5)
        high = max(high, float(largest) * 1.5)
    low, high = max(low, 1e-6), min(high, 1e6)
    # The first max_points counted tokens in row order: only the rows that hold them are searched.
    reach = int(torch.searchsorted(torch.tensor(tokens.lengths, dtype=torch.int64).cumsum(0), max_points)) + 1
    rows, positions = mask[:reach].nonzero(as_tuple=True)
    rows, positions = rows[:max_points], positions[:max_points]
    ratios = ratio[rows, positions].double().cpu()
    signs = torch.sign(bd.tokens.advantage.detach()[rows, positions].double()).cpu()  # each token's own A
    x, curves = _grid_curves(bd.config, OBJECTIVES.get(bd.config.objective), low, high, points)
    value = torch.zeros(0, dtype=torch.float64)
    if counted:  # each token's term per unit A on its curve; a per-row objective's (GMPO) row term below
        value, _ = unit_objective(ratios, signs, bd.config)
        for name, sign in (("positive", 1.0), ("negative", -1.0)):  # a token the unit draw picked: on its curve
            gap = torch.isnan(value) & (signs == sign)
            on_curve = np.interp(ratios[gap].numpy(), np.asarray(x), np.asarray(curves[name][0]))
            value[gap] = torch.from_numpy(on_curve).to(value.dtype)
        value = value.masked_fill(torch.isnan(value) & (signs == 0), 0.0)  # A = 0: every objective is 0
        if bd.tokens.selected is not None:  # the tokens the rule picked in this batch: their own term per unit A
            picked = bd.tokens.selected[rows, positions].cpu() > 0
            size = bd.tokens.advantage.detach()[rows, positions].double().abs().cpu()  # each token's own A
            own = bd.tokens.surrogate[rows, positions].detach().double().cpu() / size.where(size > 0, 1.0)
            value = torch.where(picked, own, value)
        if _per_row(bd.config):  # GMPO: one term per row, Ā_i · exp(mean_t clip(log r_t)): that term per unit Ā
            value = _row_terms(bd)[rows, positions].cpu()
    return {
        "x": list(x),
        **{name: {"y": list(y), "flat": [dict(span) for span in flat]} for name, (y, flat) in curves.items()},
        "points": {
            "ratio": ratios.tolist(),
            "y": value.tolist(),
            "sign": signs.tolist(),
            "region": [REGIONS[int(c)] for c in bd.tokens.region[rows, positions].tolist()],
            "row": rows.tolist(),
            "position": positions.tolist(),
        },
        "truncated": tokens.n > max_points,
        "per_row": _per_row(bd.config),  # the points are their row's term (GMPO), not on the one-token curve
    }
