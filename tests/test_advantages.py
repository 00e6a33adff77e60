"""grpo.advantages: group / batch / none by hand, singleton groups, and the invariances the article
states (advantages sum to 0 per group; shifting the rewards changes nothing)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from reference import close

import grpo
from grpo.advantages import ADVANTAGES

pytestmark = pytest.mark.numerical  # run again under ATEN_CPU_CAPABILITY=default by make test

# Rewards [1, 0, 3, 3] in two groups of two.
#   group 0: mean 0.5, unbiased std √((0.5² + 0.5²)/1) = √0.5; group 1: mean 3, std 0.
#   batch: mean 1.75, deviations -0.75 -1.75 1.25 1.25, Σd² = 6.75, unbiased std √(6.75/3) = 1.5.
REWARDS = torch.tensor([[1.0, 0.0], [3.0, 3.0]], dtype=torch.float64)
EPS = 1e-4
# Counted tokens per row (opo and reinforce-pp-baseline weigh by them; the others ignore them).
LENGTHS = torch.tensor([[2.0, 1.0], [3.0, 1.0]], dtype=torch.float64)
ALPHA32 = float(torch.tensor(4 / 3, dtype=torch.float32))


def whitened_by_hand() -> list[list[float]]:
    """reinforce-pp-baseline: R - group mean = [0.5, -0.5 | 0, 0], each row's value on its tokens (weights
    2, 1, 3, 1: N = 7), then verl's masked_whiten: mean Σw·c / (N + 1e-8), unbiased variance
    Σw·(c - mean)² / (N + 1e-8) · N / (N - 1), (c - mean) / √(var + 1e-8)."""
    c, w, n = [0.5, -0.5, 0.0, 0.0], [2, 1, 3, 1], 7
    mean = sum(wi * ci for wi, ci in zip(w, c, strict=True)) / (n + 1e-8)
    var = sum(wi * (ci - mean) ** 2 for wi, ci in zip(w, c, strict=True)) / (n + 1e-8) * n / (n - 1)
    a = [(ci - mean) / math.sqrt(var + 1e-8) for ci in c]
    return [a[:2], a[2:]]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("group", [[0.5 / (math.sqrt(0.5) + EPS), -0.5 / (math.sqrt(0.5) + EPS)], [0.0, 0.0]]),
        ("batch", [[0.5 / (1.5 + EPS), -0.5 / (1.5 + EPS)], [0.0, 0.0]]),  # group mean, batch std
        ("none", [[0.5, -0.5], [0.0, 0.0]]),  # Dr. GRPO: R - group mean, no std
        ("rloo", [[1.0, -1.0], [0.0, 0.0]]),  # G/(G-1)·(R - mean) = 2·(±0.5): R minus the other's reward
        # only the best of a group: best - second best (1 - 0 in group 0; a tie, 0, in group 1), / (std + eps)
        ("passk", [[1 / (math.sqrt(0.5) + EPS), 0.0], [0.0, 0.0]]),
        ("passk-no-std", [[1.0, 0.0], [0.0, 0.0]]),
        ("opo", [[1 / 3, -2 / 3], [0.0, 0.0]]),  # baseline Σlen·R / Σlen = (2·1 + 1·0) / 3 = 2/3 in group 0
        # α = 4 rows / 3 nonzero rewards, rounded to float32 as verl's int tensor division gives it; α·(R - mean)
        ("gpg", [[ALPHA32 * 0.5, -ALPHA32 * 0.5], [0.0, 0.0]]),
        ("reinforce-pp-baseline", whitened_by_hand()),
    ],
)
def test_estimators_by_hand(name: str, expected: list[list[float]]) -> None:
    close(ADVANTAGES.get(name)(REWARDS, EPS, LENGTHS), expected)


def test_every_estimator_has_a_hand_case() -> None:
    assert set(ADVANTAGES.names()) == {
        "group",
        "batch",
        "none",
        "rloo",
        "passk",
        "passk-no-std",
        "opo",
        "gpg",
        "reinforce-pp-baseline",
        # by hand in tests/test_advantages_multi.py (they read more than one reward per row, or give (B, T))
        "gdpo",
        "normalize-then-sum",
        "remax",
        "reinforce-pp",
        "optimal-token-baseline",
    }


def test_singleton_groups_keep_the_raw_reward() -> None:
    """verl: a group of one has mean 0 and std 1, so its advantage is reward / (1 + eps)."""
    rewards = torch.tensor([[2.0], [-1.0], [0.0]], dtype=torch.float64)
    close(ADVANTAGES.get("group")(rewards, 1e-6), rewards / (1 + 1e-6))
    close(ADVANTAGES.get("none")(rewards, 1e-6), rewards)


def test_article_epsilon_by_hand() -> None:
    # The notebook's grpo_advantage on one positive reward of 8: mean 1/8, unbiased std √(1/8) = 0.35355;
    # A = (1 - 1/8) / (√(1/8) + 1e-5) for the rewarded one, (-1/8) / (...) for the others.
    rewards = torch.tensor([[1.0] + [0.0] * 7], dtype=torch.float64)
    std = math.sqrt((7 / 8) ** 2 / 7 + 7 * (1 / 8) ** 2 / 7)
    close(std, math.sqrt(1 / 8))
    close(ADVANTAGES.get("group")(rewards, 1e-5), [[(7 / 8) / (std + 1e-5)] + [(-1 / 8) / (std + 1e-5)] * 7])


def test_evaluate_uses_the_preset_epsilon() -> None:
    fields = {"per_token_logps": [[-1.0], [-2.0]], "rewards": [1.0, 0.0]}
    for preset, eps in (("article", 1e-5), ("trl-grpo", 1e-4), ("verl-grpo", 1e-6)):
        bd = grpo.evaluate(grpo.Batch(**fields), grpo.LossConfig.from_preset(preset, dtype="float64"))
        close(bd.advantages, [0.5 / (math.sqrt(0.5) + eps), -0.5 / (math.sqrt(0.5) + eps)])


rewards_strategy = st.lists(st.floats(-100, 100, allow_nan=False, allow_infinity=False), min_size=2, max_size=24)


@given(
    rewards=rewards_strategy,
    G=st.sampled_from([2, 3, 4, 8]),
    shift=st.floats(-50, 50),
    name=st.sampled_from(["group", "batch", "none"]),
)
def test_sum_to_zero_per_group_and_shift_invariance(rewards: list[float], G: int, shift: float, name: str) -> None:
    """Every estimator subtracts the group mean, so each group's advantages sum to ~0; adding one
    constant to all rewards leaves the advantages unchanged. (G >= 2: a singleton keeps its raw
    reward, verl's rule, so neither holds there.)"""
    n = len(rewards) // G * G
    if n == 0:
        return
    r = torch.tensor(rewards[:n], dtype=torch.float64).view(-1, G)
    A = ADVANTAGES.get(name)(r, 1e-4)
    scale = 1 + r.abs().max()
    close(A.sum(-1), torch.zeros(A.shape[0], dtype=torch.float64), rtol=0, atol=1e-9 * scale * G / 1e-4)
    shifted = ADVANTAGES.get(name)(r + shift, 1e-4)
    close(shifted, A, rtol=1e-6, atol=1e-9 * (scale + abs(shift)) / 1e-4)


@given(rewards=st.lists(st.floats(-10, 10), min_size=4, max_size=4), c=st.floats(0.1, 100))
def test_group_scale_invariance_without_epsilon(rewards: list[float], c: float) -> None:
    """With eps = 0, scaling a group's rewards by c > 0 leaves group-normalised advantages unchanged."""
    r = torch.tensor([rewards], dtype=torch.float64)
    if float(r.std()) < 1e-3:
        return
    close(ADVANTAGES.get("group")(c * r, 0.0), ADVANTAGES.get("group")(r, 0.0), rtol=1e-9, atol=1e-9)
