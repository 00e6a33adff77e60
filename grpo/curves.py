"""The objective as a function of the ratio, for A = +1 and A = -1: the curves of the clip view.

The curves and the batch's points come from the same registered objective, evaluated with a unit
advantage (and logp = 1, so CISPO's and GPG's curves show the weight on A·logp), so every token
lies on its curve. Flat spans (clipped, zero gradient) are read off the objective's regions.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from grpo.config import LossConfig
from grpo.loss import Breakdown
from grpo.objectives import OBJECTIVES, REGIONS, TRUST


def unit_objective(ratio: Tensor, sign: Tensor, config: LossConfig) -> tuple[Tensor, Tensor]:
    """(surrogate, region) at ``ratio`` (N,) for advantages ``sign`` (N,) in {-1, 0, 1}."""
    r = ratio[:, None].to(torch.float64)  # (N,) -> (N, 1): one token per row
    A = sign[:, None].to(torch.float64)
    terms = OBJECTIVES.get(config.objective)(r, torch.ones_like(r), A, config)
    return terms.surrogate.detach()[:, 0], terms.region.expand_as(r)[:, 0]


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


def objective_curves(bd: Breakdown, points: int = 241, max_points: int = 500) -> dict[str, Any]:
    """Curves for A = +1 and A = -1 over a log-spaced ratio grid covering the batch, and the
    batch's counted tokens placed on them (the first ``max_points``, in row order; ``truncated``
    says when there were more)."""
    mask = bd.tokens.mask
    ratios = bd.tokens.ratio[mask].double().cpu()
    signs = torch.sign(bd.advantages.double().cpu())[:, None].expand(mask.shape)[mask.cpu()]
    low = min(0.5, float(ratios.min()) / 1.5) if ratios.numel() else 0.5
    high = max(2.0, float(ratios.max()) * 1.5) if ratios.numel() else 2.0
    low, high = max(low, 1e-6), min(high, 1e6)
    grid = torch.logspace(torch.log10(torch.tensor(low)), torch.log10(torch.tensor(high)), points, dtype=torch.float64)
    curves = {}
    for name, sign in (("positive", 1.0), ("negative", -1.0)):
        value, region = unit_objective(grid, torch.full_like(grid, sign), bd.config)
        curves[name] = {"y": value.tolist(), "flat": _flat_spans(grid, region)}
    keep = slice(0, max_points)
    value = torch.zeros(0, dtype=torch.float64)
    if ratios.numel():  # no token counts (all masked): no points, and the objectives never see an empty batch
        value, _ = unit_objective(ratios[keep], signs[keep], bd.config)
    rows, positions = mask.nonzero(as_tuple=True)
    return {
        "x": grid.tolist(),
        "positive": curves["positive"],
        "negative": curves["negative"],
        "points": {
            "ratio": ratios[keep].tolist(),
            "y": value.tolist(),
            "sign": signs[keep].tolist(),
            "region": [REGIONS[int(c)] for c in bd.tokens.region[mask][keep].tolist()],
            "row": rows[keep].tolist(),
            "position": positions[keep].tolist(),
        },
        "truncated": int(ratios.numel()) > max_points,
    }
