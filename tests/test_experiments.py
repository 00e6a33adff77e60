"""grpo.experiments: the article's notebook values reproduced, the three experiments it asks for,
and the article's grpo_loss (written here as in the article) against evaluate with the article preset."""

from __future__ import annotations

import math

import pytest
import torch
from reference import ULPS, close, close_to_scale, eps

import grpo
from grpo import experiments
from grpo.examples import ARTICLE_EXAMPLE

pytestmark = pytest.mark.numerical  # run again under ATEN_CPU_CAPABILITY=default by make test

BETA = 0.01


@pytest.fixture(scope="module")
def runs() -> dict[str, experiments.Experiment]:
    return {name: fn() for name, fn in experiments.EXPERIMENTS.items()}


def k3(ratio: float) -> float:
    """The sampled-token KL at pi_ref / pi = ratio."""
    return ratio - math.log(ratio) - 1


def test_kl_only(runs: dict[str, experiments.Experiment]) -> None:
    # cell 7: pi = pi_old = 0.5, pi_ref = 0.6, rewards [1, 0 x 7]. Ratio 1, the standardised A sum to
    # 0, so the loss is 8 · 0.01 · k3(1.2) = 8 · 0.01 · (1.2 - ln 1.2 - 1) = 0.0014143.
    e = runs["kl_only"]
    assert f"{e.series['float32'][0]:.4f}" == "0.0014" == e.reported[0]
    close(e.series["float64"][0], 8 * BETA * k3(1.2), rtol=1e-9, atol=0)
    close(e.series["float32"][0], 8 * BETA * k3(1.2), rtol=1e-4, atol=0)


def test_ratio_20_sign_is_float32_noise(runs: dict[str, experiments.Experiment]) -> None:
    # cell 9: ratio 0.1 / 0.005 = 20 shared by all eight: the notebook printed -3.8147e-06 with one
    # positive reward and 3.8147e-06 with two: ∓2^-18, a rounding residue of ±50-sized terms.
    e = runs["ratio_20"]
    assert e.series["float32"] == [-(2.0**-18), 2.0**-18]
    assert [f"{v:.4e}" for v in e.series["float32"]] == ["-3.8147e-06", "3.8147e-06"] == e.reported
    # left to right the same terms leave other residues; float64 shows the true value, 8·beta·k3(1.001)
    assert e.series["float32, left to right"] == [-(2.0**-19), 10 * 2.0**-20]
    for v in e.series["float64"]:
        close(v, 8 * BETA * k3(0.1001 / 0.1), rtol=1e-6, atol=0)
        assert v > 0


def test_positive_count(runs: dict[str, experiments.Experiment]) -> None:
    # cell 11: 1, 4, 7, 8 positive rewards of 8, shared ratio 0.4/0.3: the loss is the KL floor
    # 8 · 0.01 · k3(0.401/0.4) = 2.4958e-07 (float64), float32 noise of a few 1e-7 around it.
    e = runs["positive_count"]
    floor = 8 * BETA * k3(0.401 / 0.4)
    assert e.x == [1, 4, 7, 8]
    close(e.series["float64"], [floor] * 4, rtol=1e-7, atol=0)
    assert all(abs(v - floor) < 5e-7 for v in e.series["float32"])


def test_pi_equals_old(runs: dict[str, experiments.Experiment]) -> None:
    # cell 13: pi = pi_old in {0.4, 0.3, 0.1}, pi_ref 0.401: 0.0000 -> 0.1297 = 8 · 0.01 · k3(4.01).
    e = runs["pi_equals_old"]
    assert [f"{v:.4f}" for v in e.series["float32"]][::2] == ["0.0000", "0.1297"]
    close(e.series["float64"], [8 * BETA * k3(0.401 / p) for p in (0.4, 0.3, 0.1)], rtol=1e-9, atol=1e-15)
    assert e.series["float64"] == sorted(e.series["float64"])  # rises as pi drifts from pi_ref


def test_figure_1_kl_floor(runs: dict[str, experiments.Experiment]) -> None:
    # cell 15: 128 responses, rewards 1 one at a time, ratio 20 shared: the floor 128·0.01·k3(1.01) ≈ 6.36e-5.
    e = runs["figure_1"]
    floor = 128 * BETA * k3(1.01)
    close(e.extra["kl_floor"], floor, rtol=1e-12, atol=0)
    assert f"{floor:.2e}" == "6.36e-05"
    assert len(e.series["float32"]) == len(e.series["float64"]) == 128
    close(e.series["float64"], [floor] * 128, rtol=1e-7, atol=0)  # flat in float64
    f32 = e.series["float32"]
    assert max(f32) - min(f32) > 1e-4  # float32 scatters by more than the floor itself ...
    assert all(abs(v - floor) < 1e-3 for v in f32)  # ... around it
    close(f32[-1], floor, rtol=1e-3, atol=0)  # all rewarded: std 0, A = 0, exactly the floor up to rounding


def test_distinct_ratios(runs: dict[str, experiments.Experiment]) -> None:
    """Each response its own variable: d loss / d log pi_i = -r_i·A_i + beta·(1 - pi_ref/pi_i)."""
    e = runs["distinct_ratios"]
    pi, rewards = e.extra["pi"], torch.tensor(e.extra["rewards"], dtype=torch.float64)
    A = (rewards - rewards.mean()) / (rewards.std() + 1e-5)
    r = torch.tensor(pi, dtype=torch.float64) / 0.3
    expected = -r * A + BETA * (1 - 0.3 / torch.tensor(pi, dtype=torch.float64))
    close(e.series["float64"], expected, rtol=1e-12, atol=1e-14)
    close(e.series["float32"], expected, rtol=1e-5, atol=1e-6)
    assert all(g < 0 for g in e.series["float64"][:2]) and all(g > 0 for g in e.series["float64"][2:])
    # the loss no longer cancels: -Σ r_i A_i + beta Σ k3, against ~0 with one shared ratio
    loss = float((-r * A).sum() + BETA * sum(k3(0.3 / p) for p in pi))
    close(e.extra["loss"]["float64"], loss, rtol=1e-12, atol=0)
    assert abs(e.extra["loss_with_shared_ratio"]["float64"]) < 1e-3 < abs(loss)


def test_zero_loss_nonzero_grad(runs: dict[str, experiments.Experiment]) -> None:
    # The article's example on-policy with rewards [1, 0, 1]: mean 2/3, std √(1/3); the loss is
    # -mean_i(A_i) = 0 up to rounding while each token's gradient is -A_i / (3 rows · 2 tokens).
    e = runs["zero_loss_nonzero_grad"]
    A = torch.tensor([1 / 3, -2 / 3, 1 / 3], dtype=torch.float64) / (math.sqrt(1 / 3) + 1e-5)
    expected = (-A / 6).repeat_interleave(2)
    close(e.series["float64"], expected, rtol=1e-12, atol=1e-15)
    # the loss sums 6 terms -A_i/6 that cancel: each dtype is exact to the round-off of their size
    terms = float(2 * (A.abs() / 6).sum())
    assert abs(e.extra["loss"]["float64"]) <= ULPS * eps(torch.float64) * terms
    assert abs(e.extra["loss"]["float32"]) <= ULPS * eps(torch.float32) * terms
    close(e.extra["grad_norm"]["float64"], float(expected.norm()), rtol=1e-12, atol=0)
    assert e.extra["grad_norm"]["float64"] > 0.3


def test_constant_shift(runs: dict[str, experiments.Experiment]) -> None:
    e = runs["constant_shift"]
    assert e.extra["max_abs_grad_difference"] == {"float32": [0.0] * 5, "float64": [0.0] * 5}
    losses = e.series["float64"]
    # loss + c loses the ulps of |c| + |loss| (c up to 100), whatever computed the loss
    sizes = [abs(v) + abs(c) for v, c in zip(losses, e.x, strict=True)]
    close_to_scale([v - c for v, c in zip(losses, e.x, strict=True)], [losses[2]] * 5, sizes, 1e-12, 0.0, torch.float64)
    assert min(losses) < 0 < max(losses)  # the constant flips the sign


def test_every_experiment_is_documented(runs: dict[str, experiments.Experiment]) -> None:
    for name, e in runs.items():
        assert e.name == name and e.title and e.article and e.explanation
        assert {"float32", "float64"} <= set(e.series)
        assert all(len(v) == len(e.x) for v in e.series.values()), name
        assert experiments.run(name).series == e.series  # deterministic


# --- the article's grpo_loss, as written in the article ----------------------------------------------
def grpo_kl(pi_logprob: torch.Tensor, pi_ref_logprob: torch.Tensor) -> torch.Tensor:
    return pi_ref_logprob.exp() / pi_logprob.exp() - (pi_ref_logprob - pi_logprob) - 1


def grpo_loss(pi_logprob, pi_old_logprob, pi_ref_logprob, advantage, input_len, len_oi):  # type: ignore[no-untyped-def]
    epsilon = 0.2
    beta = 0.01

    bs, seq_len = pi_logprob.shape
    len_oi = torch.tensor([len_oi] * bs, dtype=torch.long)

    mask = torch.zeros(bs, seq_len)
    mask[:, input_len:] = 1

    ratio = torch.exp(pi_logprob - pi_old_logprob)

    ratio_clip = torch.clamp(ratio, 1 - epsilon, 1 + epsilon)

    advantage = advantage.unsqueeze(dim=1)
    policy_gradient = torch.minimum(ratio * advantage, ratio_clip * advantage)

    kl = grpo_kl(pi_logprob, pi_ref_logprob)

    loss = (policy_gradient - beta * kl) * mask

    loss = (-1 / bs) * (1 / len_oi.unsqueeze(dim=1)) * loss
    loss = loss.sum()

    return loss


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_article_grpo_loss_equals_the_article_preset(dtype: str) -> None:
    """The article's example: prompt length 3, completion length 2, advantages [-1, 2, 1]."""
    t = {"float32": torch.float32, "float64": torch.float64}[dtype]
    ex = ARTICLE_EXAMPLE
    pi = torch.tensor(ex["per_token_logps"], dtype=t, requires_grad=True)
    old = torch.tensor(ex["old_per_token_logps"], dtype=t)
    ref = torch.tensor(ex["ref_per_token_logps"], dtype=t)
    loss = grpo_loss(pi, old, ref, torch.tensor([-1, 2, 1]), 3, 2)
    (grad,) = torch.autograd.grad(loss, pi)
    batch = grpo.Batch(
        per_token_logps=ex["per_token_logps"],
        old_per_token_logps=ex["old_per_token_logps"],
        ref_per_token_logps=ex["ref_per_token_logps"],
        advantages=ex["advantages"],
        prompt_lengths=ex["prompt_lengths"],
    )
    bd = grpo.evaluate(batch, grpo.LossConfig.from_preset("article", dtype=dtype))
    # the article builds its mask and 1/len_oi in the default float32, so even its float64 run
    # carries float32 rounding of the coefficient -1/6 (relative 3e-8)
    tol = {"float32": (1e-5, 1e-6), "float64": (1e-7, 1e-12)}[dtype]
    close(bd.loss, loss.detach(), *tol)
    close(bd.tokens.grad, grad, *tol)
    assert (bd.tokens.grad[:, :3] == 0).all()  # the prompt positions
