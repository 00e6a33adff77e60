"""Pooling a per-token grid into blocks, for heatmaps with more cells than the pixels they are drawn in.

A heatmap of 64 rows x 4096 tokens drawn 800 pixels wide shows one pixel per five tokens: the browser
would pick one of them, unsaid. Here each block of ``factor_rows`` x ``factor_tokens`` cells becomes
one cell holding its counted token farthest from ``center`` (sign kept), so a single large surrogate,
KL or gradient still shows after pooling; a block with no counted token is NaN (drawn as a gap).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass(frozen=True)
class Pooled:
    """A grid pooled into blocks of ``factor_rows`` x ``factor_tokens`` cells."""

    values: Tensor
    """(ceil(B / factor_rows), ceil(T / factor_tokens)): each block's counted value farthest from
    center; NaN where none counts."""
    counted: Tensor
    """Same shape, int64: how many counted tokens each block holds."""
    factor_rows: int
    """Rows per block."""
    factor_tokens: int
    """Token positions per block."""


def pool_factors(rows: int, tokens: int, max_rows: int, max_tokens: int) -> tuple[int, int]:
    """The smallest whole factors that bring a (rows, tokens) grid within (max_rows, max_tokens)."""
    return max(1, math.ceil(rows / max_rows)), max(1, math.ceil(tokens / max_tokens))


def pool_extreme(values: Tensor, mask: Tensor, factor_rows: int, factor_tokens: int, center: float = 0.0) -> Pooled:
    """Pool ``values`` (B, T) over blocks, keeping in each the counted value (``mask`` (B, T) true)
    farthest from ``center``; ties go to the first in row-major order within the block."""
    B, T = values.shape
    rows, cols = math.ceil(B / factor_rows), math.ceil(T / factor_tokens)
    pad = (0, cols * factor_tokens - T, 0, rows * factor_rows - B)
    v = F.pad(values, pad)  # (B, T) -> (rows·fr, cols·ft), in the values' own dtype
    m = F.pad(mask.to(torch.bool), pad)
    # (rows·fr, cols·ft) -> (rows, cols, fr·ft): each block's cells in row-major order
    v = v.reshape(rows, factor_rows, cols, factor_tokens).permute(0, 2, 1, 3).reshape(rows, cols, -1)
    m = m.reshape(rows, factor_rows, cols, factor_tokens).permute(0, 2, 1, 3).reshape(rows, cols, -1)
    distance = torch.where(m, (v - center).abs(), torch.full_like(v, -1.0))  # uncounted cells never win
    pick = distance.argmax(dim=-1, keepdim=True)  # argmax returns the first maximum: row-major ties
    counted = m.sum(dim=-1)
    pooled = torch.where(counted > 0, v.gather(-1, pick)[..., 0], torch.full_like(counted, math.nan, dtype=v.dtype))
    return Pooled(values=pooled, counted=counted, factor_rows=factor_rows, factor_tokens=factor_tokens)
