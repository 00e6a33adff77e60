"""Rewards on tokens (verl 0.9.1's ``token_level_rewards``: a process reward, a reward per turn) through every verl
estimator that reads them, against verl's own registered functions on the same tensors.

REINFORCE++ runs its discounted return back over the rewards (across a masked span, an environment's
observation, unchanged); remax and the optimal token baseline take the reward-to-go; every other estimator reads
each row's sum (verl's ``scores = token_level_rewards.sum(-1)``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import grpo
from grpo.advantages import discounted_returns
from grpo.trainer_config import map_verl

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
AlgoConfig = pytest.importorskip("verl.trainer.config").AlgoConfig

pytestmark = pytest.mark.numerical  # run again under ATEN_CPU_CAPABILITY=default by make test


def batch(seed: int) -> dict[str, torch.Tensor]:
    """16 ragged rows of 11 positions (one empty), a masked span inside some rows (an observation), rewards on
    about a third of the counted tokens (signed, with ties), 0 wherever a token does not count."""
    g = torch.Generator().manual_seed(seed)
    B, T = 16, 11
    lengths = torch.randint(2, T + 1, (B,), generator=g)
    lengths[5] = 0
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(torch.float64)
    for row in (1, 4, 9):  # an observation span in the middle: it does not count
        mask[row, 2:4] = 0.0 if lengths[row] > 5 else mask[row, 2:4]
    placed = torch.rand(B, T, generator=g) < 0.35
    rewards = torch.randint(-2, 3, (B, T), generator=g).to(torch.float64) * 0.5 * placed * mask
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) - 0.1
    return {"mask": mask, "token_rewards": rewards, "logp": logp}


def lens(data: dict[str, torch.Tensor], algorithm: dict[str, Any], **fields: Any) -> grpo.Breakdown:
    mapping = map_verl({}, algorithm)
    assert not mapping.unsupported, mapping.unsupported
    config = grpo.LossConfig.resolve({"dtype": "float64"}, base=mapping.config)
    lens_batch = grpo.Batch(
        per_token_logps=data["logp"], completion_mask=data["mask"], token_level_rewards=data["token_rewards"], **fields
    )
    return grpo.evaluate(lens_batch, config)


@pytest.mark.parametrize("gamma", [1.0, 0.9, 0.5])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reinforce_plus_plus_runs_back_over_the_rewards_as_verl(gamma: float, seed: int) -> None:
    data = batch(seed)
    expected, returns = core_algos.get_adv_estimator_fn("reinforce_plus_plus")(
        token_level_rewards=data["token_rewards"].clone(),
        response_mask=data["mask"],
        config=AlgoConfig(adv_estimator="reinforce_plus_plus", gamma=gamma),
    )
    torch.testing.assert_close(discounted_returns(data["token_rewards"], data["mask"], gamma), returns, rtol=0, atol=0)
    bd = lens(data, {"adv_estimator": "reinforce_plus_plus", "gamma": gamma})
    assert bd.per_token_advantages
    torch.testing.assert_close(bd.tokens.advantage, expected * data["mask"], rtol=1e-12, atol=1e-12)
    # each row's reward is the sum of its tokens'
    torch.testing.assert_close(bd.rows.reward, data["token_rewards"].sum(-1), rtol=0, atol=0)


def test_the_returns_by_hand() -> None:
    # one row: rewards 1 at t=0, 2 at t=3, t=1 and t=2 an observation (masked); gamma 0.5.
    # G_3 = 2; t=2,1 masked: 0, carrying G = 2; G_0 = 1 + 0.5·2 = 2.
    rewards = torch.tensor([[1.0, 0.0, 0.0, 2.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 0.0, 0.0, 1.0]], dtype=torch.float64)
    assert discounted_returns(rewards, mask, 0.5).tolist() == [[2.0, 0.0, 0.0, 2.0]]
    # the same reward on the last token alone is the closed form γ^k·R of a reward per row: 0.5², 0.5, 1 times 4
    last = torch.tensor([[0.0, 0.0, 4.0]], dtype=torch.float64)
    assert discounted_returns(last, torch.ones(1, 3, dtype=torch.float64), 0.5).tolist() == [[1.0, 2.0, 4.0]]


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "reinforce_plus_plus_baseline", "opo", "gpg"])
@pytest.mark.parametrize("seed", [0, 1])
def test_every_other_estimator_reads_the_row_sum_as_verl(estimator: str, seed: int) -> None:
    data = batch(seed)
    index = np.array([i // 4 for i in range(16)])
    expected, _ = core_algos.get_adv_estimator_fn(estimator)(
        token_level_rewards=data["token_rewards"].clone(),
        response_mask=data["mask"],
        index=index,
        config=AlgoConfig(adv_estimator=estimator),
    )
    bd = lens(data, {"adv_estimator": estimator}, group_size=4)
    counted = data["mask"].bool()
    got = bd.tokens.advantage
    torch.testing.assert_close(got[counted], expected[counted], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
def test_optimal_token_baseline_takes_the_reward_to_go(seed: int) -> None:
    data = batch(seed)
    g = torch.Generator().manual_seed(300 + seed)
    old = data["logp"] - 0.2 * torch.rand(data["logp"].shape, generator=g, dtype=torch.float64)
    pi = old.exp()
    sum_pi_squared = pi.square() + (1 - pi).square() * torch.rand(old.shape, generator=g, dtype=torch.float64)
    expected, _ = core_algos.get_adv_estimator_fn("optimal_token_baseline")(
        token_level_rewards=data["token_rewards"].clone(),
        response_mask=data["mask"],
        index=np.array([i // 4 for i in range(16)]),
        old_log_probs=old,
        sum_pi_squared=sum_pi_squared,
        rollout_is_weights=None,
        config=AlgoConfig(adv_estimator="optimal_token_baseline"),
    )
    bd = lens(
        data,
        {"adv_estimator": "optimal_token_baseline"},
        old_per_token_logps=old,
        group_size=4,
        sum_pi_squared=sum_pi_squared,
    )
    torch.testing.assert_close(bd.tokens.advantage, expected * data["mask"], rtol=1e-12, atol=1e-12)


def test_remax_takes_rewards_on_the_last_token_and_refuses_the_rest() -> None:
    data = batch(0)
    baselines = torch.full((16,), 0.25, dtype=torch.float64)
    counted = data["mask"].bool()
    last = torch.where(counted, torch.arange(11), -1).amax(-1)
    outcome = torch.zeros_like(data["token_rewards"])
    rows = torch.arange(16)[last >= 0]
    outcome[rows, last[rows]] = torch.linspace(-1, 1, len(rows), dtype=torch.float64)
    expected, _ = core_algos.get_adv_estimator_fn("remax")(
        token_level_rewards=outcome.clone(),
        reward_baselines=baselines,
        response_mask=data["mask"],
        config=AlgoConfig(adv_estimator="remax"),
    )
    bd = lens({**data, "token_rewards": outcome}, {"adv_estimator": "remax"}, reward_baselines=baselines)
    torch.testing.assert_close(bd.tokens.advantage[counted], expected[counted], rtol=1e-12, atol=1e-12)
    with pytest.raises(grpo.GrpoInputError, match="last counted token") as err:
        lens(data, {"adv_estimator": "remax"}, reward_baselines=baselines)
    assert err.value.field == "token_level_rewards"


def test_bad_token_rewards_are_named() -> None:
    logp = [[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]]
    with pytest.raises(grpo.GrpoInputError) as err:  # a reward where nothing counts
        grpo.Batch(
            per_token_logps=logp, completion_mask=[[1, 1, 0], [1, 1, 1]], token_level_rewards=[[0, 1, 2], [0, 0, 1]]
        )
    assert err.value.field == "token_level_rewards" and err.value.row == 0
    with pytest.raises(grpo.GrpoInputError) as err:
        grpo.Batch(per_token_logps=logp, token_level_rewards=[[0, 0, 1], [0, 0, 1]], rewards=[1, 1])
    assert err.value.field == "token_level_rewards"
    with pytest.raises(grpo.GrpoInputError) as err:
        grpo.Batch(per_token_logps=logp, token_level_rewards=[[0, 0, float("nan")], [0, 0, 1]])
    assert err.value.field == "token_level_rewards" and err.value.row == 0
