"""grpo.examples: each teaching scenario shows what its notes say it shows."""

from __future__ import annotations

import math

import pytest
import torch
from reference import close

import grpo
from grpo.examples import ARTICLE_EXAMPLE, SCENARIOS, scenario_batch
from grpo.objectives import REGIONS

TRUST = REGIONS.index("trust")


def run(name: str, preset: str | None = None, **overrides: object) -> grpo.Breakdown:
    s = SCENARIOS[name]
    config = grpo.LossConfig.from_preset(preset or s.preset, dtype="float64", **{**s.overrides, **overrides})
    return grpo.evaluate(scenario_batch(name), config)


def test_article_example_shape() -> None:
    """Three rows of five positions, the first three the prompt; ratios from 0.28 to 52, two of the
    six completion tokens clipped, and the ratio-52 token (A = -1) unclipped with a large gradient."""
    bd = run("article")
    assert bd.tokens.mask.tolist() == [[False] * 3 + [True] * 2] * 3
    assert ARTICLE_EXAMPLE["advantages"] == [-1.0, 2.0, 1.0]
    assert bd.tokens.region_names() == [
        ["masked"] * 3 + r for r in (["trust", "trust"], ["trust", "clip_high"], ["trust", "clip_high"])
    ]
    # row 0, position 3: r = exp(-3.4714 + 7.4321) = 52.49, A = -1, weight 1/(3 rows · 2 tokens):
    # policy gradient -w·A·r = 52.49 / 6; KL gradient beta·w·(1 - exp(ref - logp)), ref - logp = 0.1726
    r = math.exp(-3.4714 + 7.4321)
    close(bd.tokens.ratio[0, 3], r, rtol=1e-12, atol=0)
    close(bd.tokens.grad[0, 3], r / 6 + 0.01 / 6 * (1 - math.exp(-3.2988 + 3.4714)), rtol=1e-12, atol=0)
    assert len(ARTICLE_EXAMPLE["tokens"]) == 3


def test_on_policy() -> None:
    bd = run("on-policy")
    counted = bd.tokens.mask
    assert (bd.tokens.ratio[counted] == 1).all() and bd.metrics["clip_ratio/region_mean"] == 0
    # seq-mean-token-mean with ratio 1: policy loss = -mean_i(A_i) = 0 (the advantages sum to 0)
    close(bd.policy_loss, 0.0, rtol=0, atol=1e-12)
    assert bd.metrics["lens/grad_norm_logps"] > 0.1
    close(bd.tokens.grad_policy, -bd.tokens.weight * bd.advantages[:, None])


def test_off_policy_clipping_on_both_sides() -> None:
    bd = run("off-policy-clipping")
    names = {n for row in bd.tokens.region_names() for n in row}
    assert {"clip_low", "clip_high", "trust"} <= names
    flat = bd.tokens.region > TRUST
    assert (bd.tokens.grad_policy[flat] == 0).all()
    assert (bd.tokens.grad_policy[(bd.tokens.region == TRUST)] != 0).all()


def test_all_correct_group_has_no_policy_signal() -> None:
    bd = run("all-correct")
    assert bd.metrics["frac_reward_zero_std"] == 1.0 and bd.zero_std_groups == (0,)
    assert (bd.advantages == 0).all() and (bd.tokens.grad_policy == 0).all()
    close(bd.loss, bd.kl_loss)
    assert float(bd.kl_loss) > 0


def test_length_bias() -> None:
    """seq-mean-token-mean: a token of a 3-token answer weighs 4 times one of a 12-token answer;
    token-mean and Dr. GRPO weigh them the same."""
    bd = run("length-bias")
    w = bd.tokens.weight
    close(w[0, 0] / w[1, 0], 4.0)
    for aggregation in ("token-mean", "seq-mean-token-sum-norm"):
        w = run("length-bias", aggregation=aggregation).tokens.weight
        close(w[0, 0], w[1, 0])


def test_kl_blowup() -> None:
    bd = run("kl-blowup")
    assert float(bd.kl_loss) > 10 * abs(float(bd.policy_loss))
    assert float(bd.tokens.kl.max()) > 100  # k3 at ref - logp = 8.6: e^8.6 ≈ 5400
    verl = run("kl-blowup", preset="verl-grpo", beta=0.04)
    assert verl.clamp_counts["kl_clamp"] == 2 and float(verl.tokens.kl.max()) == 10.0


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenarios_are_complete(name: str) -> None:
    s = SCENARIOS[name]
    assert s.title and s.notes and s.preset in grpo.PRESETS
    bd = run(name)
    assert torch.isfinite(bd.loss)
    if "tokens" in s.request:
        assert [len(r) for r in s.request["tokens"]] == [len(r) for r in s.request["per_token_logps"]]
