"""grpo.pooling: block pooling of a per-token grid against a plain loop, a hand-worked grid, and the
mask (uncounted cells never chosen, empty blocks NaN)."""

from __future__ import annotations

import math

import pytest
import torch

from grpo.pooling import pool_extreme, pool_factors


def loop_reference(
    values: list[list[float]], mask: list[list[bool]], fr: int, ft: int, center: float
) -> tuple[list[list[float]], list[list[int]]]:
    """One block at a time: the first counted cell (row-major) farthest from center."""
    B, T = len(values), len(values[0])
    out, counts = [], []
    for r0 in range(0, B, fr):
        out_row, count_row = [], []
        for t0 in range(0, T, ft):
            best, best_distance, n = math.nan, -1.0, 0
            for i in range(r0, min(r0 + fr, B)):
                for j in range(t0, min(t0 + ft, T)):
                    if not mask[i][j]:
                        continue
                    n += 1
                    if abs(values[i][j] - center) > best_distance:
                        best, best_distance = values[i][j], abs(values[i][j] - center)
            out_row.append(best)
            count_row.append(n)
        out.append(out_row)
        counts.append(count_row)
    return out, counts


@pytest.mark.parametrize(
    ("B", "T", "fr", "ft", "center"), [(7, 23, 2, 5, 0.0), (5, 64, 1, 4, 1.0), (9, 10, 3, 10, 0.0)]
)
def test_pool_extreme_matches_a_loop(B: int, T: int, fr: int, ft: int, center: float) -> None:
    g = torch.Generator().manual_seed(B * 100 + T)
    values = torch.randn(B, T, generator=g, dtype=torch.float64).round(decimals=1)  # rounded: ties happen
    mask = torch.rand(B, T, generator=g) > 0.3
    mask[-1] = False  # a row that counts nowhere: its blocks may be empty
    pooled = pool_extreme(values, mask, fr, ft, center)
    want, counts = loop_reference(values.tolist(), mask.tolist(), fr, ft, center)
    # exact: pooling chooses values, it computes none
    assert pooled.values.shape == (math.ceil(B / fr), math.ceil(T / ft))
    torch.testing.assert_close(pooled.values, torch.tensor(want, dtype=torch.float64), equal_nan=True, rtol=0, atol=0)
    assert pooled.counted.tolist() == counts


def test_pool_extreme_by_hand() -> None:
    # Blocks of 1 row x 2 tokens, center 1 (the ratio's): [0.5, 1.2] -> 0.5 (|-0.5| > |0.2|);
    # [1.1, 3.0] with 3.0 masked -> 1.1; [0.9, 1.1] a tie at 0.1 -> 0.9 (the first); [2, 4] all masked -> NaN.
    values = torch.tensor([[0.5, 1.2, 1.1, 3.0], [0.9, 1.1, 2.0, 4.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    pooled = pool_extreme(values, mask, 1, 2, center=1.0)
    assert pooled.values[0].tolist() == [0.5, pytest.approx(1.1)]
    assert pooled.values[1, 0].item() == pytest.approx(0.9) and math.isnan(pooled.values[1, 1].item())
    assert pooled.counted.tolist() == [[2, 1], [2, 0]]


def test_pool_factors_bring_the_grid_within_the_limits() -> None:
    assert pool_factors(64, 1024, 256, 512) == (1, 2)
    assert pool_factors(64, 1025, 256, 512) == (1, 3)
    assert pool_factors(600, 100, 256, 512) == (3, 1)
    assert pool_factors(3, 5, 256, 512) == (1, 1)
