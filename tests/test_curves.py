"""grpo.curves: the clip view's curves and the batch's points on them, against a loop reference."""

from __future__ import annotations

import pytest
import torch

import grpo
from grpo.curves import objective_curves, unit_objective
from grpo.objectives import REGIONS

pytestmark = pytest.mark.numerical


def batch(seed: int = 0) -> grpo.Batch:
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(6, 9, generator=g, dtype=torch.float64) * 2 - 0.05
    logp = torch.clamp(old + 0.6 * torch.randn(6, 9, generator=g, dtype=torch.float64), max=-1e-3)
    mask = torch.rand(6, 9, generator=g) > 0.3
    mask[2] = False  # a row with nothing counted between counted ones
    return grpo.Batch(logp, old, completion_mask=mask, rewards=torch.tensor([1.0, 0, 1, 0, 0, 1]), group_size=3)


@pytest.mark.parametrize("max_points", [1, 7, 20, 500])
@pytest.mark.parametrize("preset", ["article", "verl-grpo", "trl-dapo"])
def test_points_are_the_first_counted_tokens_in_row_order(preset: str, max_points: int) -> None:
    bd = grpo.evaluate(batch(), grpo.LossConfig.from_preset(preset))
    out = objective_curves(bd, max_points=max_points)
    mask, ratio = bd.tokens.mask, bd.tokens.ratio.detach()
    counted = [(b, t) for b in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[b, t]]  # row order
    keep = counted[:max_points]
    points = out["points"]
    assert list(zip(points["row"], points["position"], strict=True)) == keep
    assert points["ratio"] == [float(ratio[b, t]) for b, t in keep]
    assert points["sign"] == [float(torch.sign(bd.advantages[b])) for b, _ in keep]
    assert points["region"] == [REGIONS[int(bd.tokens.region[b, t])] for b, t in keep]
    expected, _ = unit_objective(torch.tensor(points["ratio"]), torch.tensor(points["sign"]), bd.config)
    assert points["y"] == expected.tolist()
    assert out["truncated"] == (len(counted) > max_points)
    # the grid covers every counted ratio, however many points are shown
    counted_ratios = [float(ratio[b, t]) for b, t in counted]
    assert out["x"][0] <= min(counted_ratios) and out["x"][-1] >= max(counted_ratios)


def test_nothing_counted_gives_curves_and_no_points() -> None:
    b = batch()
    nothing = torch.zeros(6, 9, dtype=torch.bool)
    empty = grpo.Batch(b.per_token_logps, b.old_per_token_logps, completion_mask=nothing, advantages=torch.ones(6))
    out = objective_curves(grpo.evaluate(empty, grpo.LossConfig.from_preset("article")))
    assert out["points"]["ratio"] == [] and out["truncated"] is False
    assert len(out["x"]) == len(out["positive"]["y"]) == 241


def test_reused_curves_are_the_same_and_not_shared() -> None:
    """The grid curves are computed once per (config, range): a second answer has equal values, and
    changing one answer (a caller may) leaves the next untouched."""
    bd = grpo.evaluate(batch(), grpo.LossConfig.from_preset("trl-dapo"))
    first = objective_curves(bd)
    expected = {k: (list(first[k]["y"]), [dict(s) for s in first[k]["flat"]]) for k in ("positive", "negative")}
    first["positive"]["y"][0] = 99.0
    first["positive"]["flat"].clear()
    first["x"].clear()
    second = objective_curves(bd)
    assert {k: (second[k]["y"], second[k]["flat"]) for k in ("positive", "negative")} == expected
    assert len(second["x"]) == 241
    other = objective_curves(grpo.evaluate(batch(), grpo.LossConfig.from_preset("trl-dapo", epsilon_high=0.5)))
    assert other["positive"]["flat"] != second["positive"]["flat"]  # another config: its own curves


@pytest.mark.parametrize(
    ("preset", "settings"),
    [
        ("verl-clip_cov", {"clip_cov_ratio": 0.3, "clip_cov_lb": -10.0, "clip_cov_ub": 10.0}),
        ("verl-kl_cov", {"kl_cov_ratio": 0.3}),
    ],
)
def test_a_rule_s_own_picks_do_not_bend_the_curve(preset: str, settings: dict[str, float]) -> None:
    """Before: Clip-Cov and KL-Cov picked 30% of the curve's grid points at random (their pick follows the batch's
    covariance, not the ratio): the curve zig-zagged, with "dual_clip" flat spans. Now the curve is the rule for
    the tokens it leaves (Clip-Cov: PPO's clip; KL-Cov: A·ratio), and each token the batch's rule picked sits at
    its own term per unit A."""
    bd = grpo.evaluate(batch(), grpo.LossConfig.from_preset(preset, dtype="float64", **settings))
    out = objective_curves(bd)
    x = torch.tensor(out["x"], dtype=torch.float64)
    low, high = 1 - bd.config.epsilon_low, 1 + bd.config.epsilon_high
    # PPO's clip per unit A (A = ±1): min(r, clip(r)) and -max(r, clip(r)); KL-Cov: ±r
    clipped = preset == "verl-clip_cov"
    want_pos = torch.minimum(x, x.clamp(low, high)) if clipped else x
    want_neg = -torch.maximum(x, x.clamp(low, high)) if clipped else -x
    # a picked grid point is on the line between its neighbours: exact where both are on one linear piece
    torch.testing.assert_close(torch.tensor(out["positive"]["y"], dtype=torch.float64), want_pos, rtol=0, atol=2e-2)
    torch.testing.assert_close(torch.tensor(out["negative"]["y"], dtype=torch.float64), want_neg, rtol=0, atol=2e-2)
    assert {s["region"] for s in out["positive"]["flat"] + out["negative"]["flat"]} <= {"clip_low", "clip_high"}
    points = out["points"]
    a = bd.advantages.double()
    for row, pos, y in zip(points["row"], points["position"], points["y"], strict=True):
        assert bd.tokens.selected is not None
        if bd.tokens.selected[row, pos] > 0:  # picked in this batch: its own term
            assert y == pytest.approx(float(bd.tokens.surrogate[row, pos] / a[row].abs()), rel=1e-12)
        else:  # on the curve: the rule for the tokens it leaves
            r = float(bd.tokens.ratio[row, pos])
            unit = min(r, min(max(r, low), high)) if clipped else r
            if a[row] < 0:
                unit = -(max(r, min(max(r, low), high)) if clipped else r)
            assert y == pytest.approx(unit, rel=1e-12), (row, pos)
