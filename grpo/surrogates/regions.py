"""Which branch of its objective each token is in: the region codes, and the float indicators they are built from."""

from __future__ import annotations

import torch
from torch import Tensor

# Region codes of a token: which branch of the objective is active.
REGIONS: tuple[str, ...] = ("masked", "trust", "clip_low", "clip_high", "dual_clip")
MASKED, TRUST, CLIP_LOW, CLIP_HIGH, DUAL_CLIP = range(len(REGIONS))
# What every objective's why says of a token that does not count.
MASKED_WHY = "does not count (prompt, padding or masked out)"


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
