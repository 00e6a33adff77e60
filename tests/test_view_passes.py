"""The view-model's int8 and bit-select passes (grpo.view.why, grpo.view.counted) against the plain expressions
they replace: a boolean gather's min and max, bincount, masked_fill."""

from __future__ import annotations

import math

import pytest
import torch

from grpo.view.counted import extent
from grpo.view.why import code_counts, indicator

SPECIALS = [math.nan, math.inf, -math.inf, 0.0, 1e-45, 3.4e38, -2.5]


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b  # ±0 compare equal: which zero a tie gives is no number


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_extent_is_the_gathered_min_and_max(dtype: torch.dtype) -> None:
    # values[where.bool()].min()/max() is the reference, specials (NaN, ±inf, zero, subnormal) included
    g = torch.Generator().manual_seed(0)
    for _ in range(500):
        B, T = (int(x) for x in torch.randint(1, 6, (2,), generator=g))
        values = torch.randn(B, T, generator=g, dtype=dtype)
        special = torch.tensor(SPECIALS, dtype=dtype)[torch.randint(0, len(SPECIALS), (B, T), generator=g)]
        values = torch.where(torch.rand(B, T, generator=g) < 0.3, special, values)
        where = (torch.rand(B, T, generator=g) < 0.4).to(torch.int8)
        where[int(torch.randint(0, B, (1,), generator=g)), int(torch.randint(0, T, (1,), generator=g))] = 1
        picked = values[where.bool()]
        low, high = extent(values, where)
        assert _same(low, float(picked.min())) and _same(high, float(picked.max()))


def test_code_counts_is_bincount() -> None:
    g = torch.Generator().manual_seed(1)
    for shape in [(3, 4), (2, 5), (1, 0), (0, 4), (7, 6), (5, 1), (4, 4)]:
        for n in (1, 2, 9, 13):
            codes = torch.randint(0, n, shape, generator=g, dtype=torch.int8)
            for c in (codes, codes.t(), codes[1:], codes[:, 1:]):  # odd lengths, odd offsets, transposed
                assert torch.equal(code_counts(c, n), torch.bincount(c.flatten(), minlength=n))


def test_indicator_is_the_comparison() -> None:
    x = torch.tensor([[-1.0, 0.0, -0.0, math.nan, 2.0]])
    for compare in (torch.eq, torch.lt, torch.gt):
        got = indicator(compare, x, 0.0)
        assert got.dtype == torch.int8
        assert torch.equal(got.bool(), compare(x, 0.0))
