"""verl 0.9.1's advantage estimators through GRPO Lens, against verl's own registered functions.

For every outcome estimator that needs nothing but a reward per row (``algorithm.adv_estimator``: grpo with
and without the std, rloo, grpo_passk, reinforce_plus_plus_baseline, opo, gpg and the vectorised twins),
``map_verl`` picks an ``advantage`` whose values equal what verl's function writes on each counted token:
ragged rows, empty rows, groups whose rewards tie (zero std), groups of one where verl allows them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import grpo
from grpo.trainer_config import VERL_ADVANTAGES, map_verl

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
AlgoConfig = pytest.importorskip("verl.trainer.config").AlgoConfig

pytestmark = pytest.mark.numerical  # run again under ATEN_CPU_CAPABILITY=default by make test

# (verl adv_estimator, norm_adv_by_std_in_grpo): every estimator map_verl reproduces, each std switch it reads
CASES = [
    ("grpo", True),
    ("grpo", False),
    ("grpo_vectorized", True),
    ("grpo_vectorized", False),
    ("rloo", True),
    ("rloo_vectorized", True),
    ("grpo_passk", True),
    ("grpo_passk", False),
    ("reinforce_plus_plus_baseline", True),
    ("opo", True),
    ("gpg", True),
]
NEEDS_PAIRS = {"grpo_passk"}  # verl raises on a group of one


def batch(seed: int, group_size: int) -> dict[str, torch.Tensor]:
    """16 rows of ragged float64 completions (two empty), rewards with ties and zeros; the reward sits on a
    row's last counted token, as verl's reward manager writes it."""
    g = torch.Generator().manual_seed(seed)
    B, T = 16, 9
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[torch.randperm(B, generator=g)[:2]] = 0
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(torch.float64)
    rewards = torch.randint(0, 3, (B,), generator=g).to(torch.float64) * 0.5  # ties and zeros
    rewards[: max(group_size, 1)] = 1.0  # the first group all equal: zero std
    token_rewards = torch.zeros(B, T, dtype=torch.float64)
    last = (lengths - 1).clamp(min=0)
    token_rewards[torch.arange(B), last] = rewards * (lengths > 0)
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) - 0.1
    return {"mask": mask, "rewards": token_rewards.sum(-1), "token_rewards": token_rewards, "logp": logp}


def verl_advantages(estimator: str, norm: bool, data: dict[str, torch.Tensor], group_size: int) -> torch.Tensor:
    fn = core_algos.get_adv_estimator_fn(estimator)
    index = np.array([i // group_size for i in range(data["mask"].shape[0])])
    config = AlgoConfig(adv_estimator=estimator, norm_adv_by_std_in_grpo=norm)
    kwargs: dict[str, Any] = {"config": config}
    if estimator in ("grpo", "grpo_vectorized"):
        kwargs["norm_adv_by_std_in_grpo"] = norm
    advantages, _ = fn(
        token_level_rewards=data["token_rewards"].clone(), response_mask=data["mask"], index=index, **kwargs
    )
    return advantages


def lens_advantages(estimator: str, norm: bool, data: dict[str, torch.Tensor], group_size: int) -> torch.Tensor:
    mapping = map_verl({}, {"adv_estimator": estimator, "norm_adv_by_std_in_grpo": norm})
    assert not mapping.unsupported, mapping.unsupported
    config = grpo.LossConfig.resolve({"dtype": "float64"}, base=mapping.config)
    lens_batch = grpo.Batch(
        per_token_logps=data["logp"], completion_mask=data["mask"], rewards=data["rewards"], group_size=group_size
    )
    return grpo.evaluate(lens_batch, config).advantages


@pytest.mark.parametrize(("estimator", "norm"), CASES)
@pytest.mark.parametrize("group_size", [1, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_every_outcome_estimator_matches_verl(estimator: str, norm: bool, group_size: int, seed: int) -> None:
    if group_size == 1 and estimator in NEEDS_PAIRS:
        pytest.skip("verl raises on a group of one")
    if group_size == 1 and estimator == "rloo_vectorized":
        pytest.skip("verl's two RLOOs disagree on a group of one (raw reward vs 0); GRPO Lens follows rloo")
    data = batch(seed, group_size)
    expected = verl_advantages(estimator, norm, data, group_size)
    got = lens_advantages(estimator, norm, data, group_size)
    counted = data["mask"].bool()
    # one formula on the same float64 numbers: round-off of rewards of order 1 (whitening divides by a std of
    # order 1: a few ulps more). A group of one: verl makes its mean 0 and std 1 as float32 tensors, so its
    # 1 + epsilon is rounded to float32 (a relative 6e-8), where GRPO Lens keeps the batch's float64.
    rtol = 1e-7 if group_size == 1 else 1e-12
    if estimator == "grpo_vectorized" and norm:
        # verl's vectorised group statistics run in float32 whatever the rewards' dtype (groupwise.group_mean_std,
        # std from sum2 - sum²/n): a few float32 ulps of rewards of order 1
        rtol = 1e-6
    torch.testing.assert_close(got[:, None].expand_as(expected)[counted], expected[counted], rtol=rtol, atol=1e-12)


def test_passk_refuses_a_group_of_one_as_verl_does() -> None:
    data = batch(0, 1)
    with pytest.raises(ValueError):
        verl_advantages("grpo_passk", True, data, 1)
    with pytest.raises(grpo.GrpoInputError, match="group_size"):
        lens_advantages("grpo_passk", True, data, 1)


def test_every_registered_verl_estimator_is_mapped_or_said_why() -> None:
    """Each estimator verl 0.9.1 registers is either reproduced or reported with the input it needs."""
    for name in core_algos.ADV_ESTIMATOR_REGISTRY:
        mapping = map_verl({}, {"adv_estimator": name})
        assert (name in VERL_ADVANTAGES) != ("adv_estimator" in mapping.unsupported), name
