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


# --- the estimators that read more than one reward per row -------------------------------------------------
def gdpo_verl(
    data: dict[str, torch.Tensor], components: torch.Tensor, weights: list[float] | None, group_size: int
) -> torch.Tensor:
    """verl's gdpo as its trainer (ray_trainer.compute_advantage) calls it: the config, the per-key scores in
    non_tensor_batch (verl makes them float32 and writes each on the row's last response position: the
    attention mask's response part minus 1), and no norm_adv_by_std_in_grpo (so the function's default, True)."""
    B, T = data["mask"].shape
    P = 2
    lengths = data["mask"].sum(-1).long()
    attention = torch.cat(
        [torch.ones(B, P), (torch.arange(T)[None, :] < lengths[:, None].clamp(min=1)).float()], 1
    ).long()
    keys = [f"r{k}" for k in range(components.shape[1])]
    config = AlgoConfig(adv_estimator="gdpo", gdpo_reward_keys=keys, gdpo_reward_weights=weights)
    advantages, _ = core_algos.get_adv_estimator_fn("gdpo")(
        token_level_rewards=data["token_rewards"].clone(),
        response_mask=data["mask"],
        index=np.array([i // group_size for i in range(B)]),
        config=config,
        non_tensor_batch={key: components[:, k].numpy() for k, key in enumerate(keys)},
        batch={"prompts": torch.ones(B, P), "attention_mask": attention},
    )
    return advantages


@pytest.mark.parametrize("norm", [True, False])  # verl's trainer never passes gdpo the switch: both map by the std
@pytest.mark.parametrize("weights", [None, [1.0, 0.5, 2.0]])
@pytest.mark.parametrize("seed", [0, 1])
def test_gdpo_matches_verl_per_reward_function(norm: bool, weights: list[float] | None, seed: int) -> None:
    """Three reward functions (B, 3), ties and a zero-std group in each: verl normalises each within the
    group, sums them weighted and whitens over the tokens. verl holds the per-key scores as float32 (so does
    the test's batch: the same numbers) and computes in float32: a few float32 ulps of results of order 1."""
    group_size = 4
    data = batch(seed, group_size)
    g = torch.Generator().manual_seed(100 + seed)
    components = torch.randint(0, 3, (16, 3), generator=g).to(torch.float64) * 0.5
    components[:group_size, 1] = 1.0  # one function ties in the first group
    expected = gdpo_verl(data, components, weights, group_size)
    mapping = map_verl({}, {"adv_estimator": "gdpo", "norm_adv_by_std_in_grpo": norm})
    assert not mapping.unsupported, mapping.unsupported
    extra = {} if weights is None else {"reward_weights": weights}
    lens_batch = grpo.Batch(
        per_token_logps=data["logp"], completion_mask=data["mask"], rewards=components, group_size=group_size, **extra
    )
    got = grpo.evaluate(lens_batch, grpo.LossConfig.resolve({"dtype": "float64"}, base=mapping.config)).advantages
    counted = data["mask"].bool()
    torch.testing.assert_close(
        got[:, None].expand_as(expected)[counted], expected[counted].double(), rtol=2e-6, atol=2e-6
    )


@pytest.mark.parametrize("group_size", [1, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_gdpo_with_one_reward_per_row_is_verls_fallback(group_size: int, seed: int) -> None:
    """Without gdpo_reward_keys verl's gdpo normalises the token-level rewards (one reward function): float64."""
    data = batch(seed, group_size)
    expected = verl_advantages("gdpo", True, data, group_size)
    got = lens_advantages("gdpo", True, data, group_size)
    counted = data["mask"].bool()
    rtol = 1e-7 if group_size == 1 else 1e-12  # a group of one: verl's mean 0 / std 1 are float32 (see above)
    torch.testing.assert_close(got[:, None].expand_as(expected)[counted], expected[counted], rtol=rtol, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_remax_matches_verl(seed: int) -> None:
    data = batch(seed, 4)
    g = torch.Generator().manual_seed(200 + seed)
    baselines = torch.randint(0, 3, (4,), generator=g).to(torch.float64).repeat_interleave(4) * 0.5  # one per prompt
    expected, _ = core_algos.get_adv_estimator_fn("remax")(
        token_level_rewards=data["token_rewards"].clone(),
        reward_baselines=baselines,
        response_mask=data["mask"],
        config=AlgoConfig(adv_estimator="remax"),
    )
    mapping = map_verl({}, {"adv_estimator": "remax"})
    assert not mapping.unsupported, mapping.unsupported
    lens_batch = grpo.Batch(
        per_token_logps=data["logp"], completion_mask=data["mask"], rewards=data["rewards"], reward_baselines=baselines
    )
    got = grpo.evaluate(lens_batch, grpo.LossConfig.resolve({"dtype": "float64"}, base=mapping.config)).advantages
    counted = data["mask"].bool()
    torch.testing.assert_close(got[:, None].expand_as(expected)[counted], expected[counted], rtol=1e-12, atol=1e-12)
    with pytest.raises(grpo.GrpoInputError, match="reward_baselines"):
        grpo.evaluate(grpo.Batch(per_token_logps=data["logp"], rewards=data["rewards"]), mapping.config)


@pytest.mark.parametrize("gamma", [1.0, 0.9, 0.5])
@pytest.mark.parametrize("seed", [0, 1])
def test_reinforce_plus_plus_matches_verl_per_token(gamma: float, seed: int) -> None:
    """The discounted return per token, whitened over the batch's tokens: (B, T), as verl's; a mask with a hole
    (a tool's tokens) that the return carries across."""
    data = batch(seed, 4)
    data["mask"][3, 1] = 0.0 if data["mask"][3].sum() > 2 else data["mask"][3, 1]
    expected, _ = core_algos.get_adv_estimator_fn("reinforce_plus_plus")(
        token_level_rewards=data["token_rewards"].clone(),
        response_mask=data["mask"],
        config=AlgoConfig(adv_estimator="reinforce_plus_plus", gamma=gamma),
    )
    mapping = map_verl({}, {"adv_estimator": "reinforce_plus_plus", "gamma": gamma})
    assert not mapping.unsupported, mapping.unsupported
    assert mapping.config.gamma == gamma
    lens_batch = grpo.Batch(per_token_logps=data["logp"], completion_mask=data["mask"], rewards=data["rewards"])
    bd = grpo.evaluate(lens_batch, grpo.LossConfig.resolve({"dtype": "float64"}, base=mapping.config))
    assert bd.per_token_advantages
    torch.testing.assert_close(bd.tokens.advantage, expected * data["mask"], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("group_size", [1, 4])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_optimal_token_baseline_matches_verl(group_size: int, seed: int) -> None:
    """Σπ² per token and the old log-probs: the per-position baseline over each group, its zero tail, and a
    group of one (no baseline), as verl's function gives them ((B, T), one per token)."""
    data = batch(seed, group_size)
    g = torch.Generator().manual_seed(300 + seed)
    old = data["logp"] - 0.2 * torch.rand(data["logp"].shape, generator=g, dtype=torch.float64)
    pi = old.exp()
    sum_pi_squared = pi.square() + (1 - pi).square() * torch.rand(old.shape, generator=g, dtype=torch.float64)
    if group_size == 4:  # make the first group's longest row the only longest: its tail gets baseline 0
        data["mask"][1] = 0.0
        data["mask"][1, :9] = 1.0
        data["mask"][0, 7:] = data["mask"][2, 7:] = data["mask"][3, 7:] = 0.0
        data["token_rewards"] = torch.zeros_like(data["token_rewards"])
        last = data["mask"].cumsum(-1).argmax(-1)
        data["token_rewards"][torch.arange(16), last] = data["rewards"] * (data["mask"].sum(-1) > 0)
    expected, _ = core_algos.get_adv_estimator_fn("optimal_token_baseline")(
        token_level_rewards=data["token_rewards"].clone(),
        response_mask=data["mask"],
        index=np.array([i // group_size for i in range(16)]),
        old_log_probs=old,
        sum_pi_squared=sum_pi_squared,
        rollout_is_weights=None,
        config=AlgoConfig(adv_estimator="optimal_token_baseline"),
    )
    mapping = map_verl({}, {"adv_estimator": "optimal_token_baseline"})
    assert not mapping.unsupported, mapping.unsupported
    lens_batch = grpo.Batch(
        per_token_logps=data["logp"],
        old_per_token_logps=old,
        completion_mask=data["mask"],
        rewards=data["rewards"],
        group_size=group_size,
        sum_pi_squared=sum_pi_squared,
    )
    bd = grpo.evaluate(lens_batch, grpo.LossConfig.resolve({"dtype": "float64"}, base=mapping.config))
    assert bd.per_token_advantages
    torch.testing.assert_close(bd.tokens.advantage, expected * data["mask"], rtol=1e-12, atol=1e-12)
    without = grpo.Batch(per_token_logps=data["logp"], rewards=data["rewards"], group_size=group_size)
    with pytest.raises(grpo.GrpoInputError, match="sum_pi_squared"):
        grpo.evaluate(without, mapping.config)


def scan_roundings(positions: int, chunk: int) -> int:
    """The most roundings on any term's path through ``linear_scan`` over a row of ``positions``: per level, 2
    per step of a chunk's run back (a multiply, an add), ``chunk`` for the reach Π a, 2 to carry the next chunk
    in."""
    levels = 1
    while positions > chunk:
        positions, levels = -(-positions // chunk), levels + 1
    return levels * (3 * chunk + 2)


@pytest.mark.parametrize("gamma", [1.0, 0.99, 0.5, 0.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_reinforce_plus_plus_chunked_scan_holds_to_verls_loop_on_long_rows(gamma: float, seed: int) -> None:
    """Token-level rewards on rows longer than a chunk (three levels of the scan), observation spans across the
    chunks' edges, an empty row: the returns and the whitened advantages against verl's own function.

    Tolerance, derived: every return is a sum of terms γ^k·r_s; a sum computed with at most n roundings on any
    term's path is within n·u·S of the exact one, S = Σ γ^k·|r_s| (verl's returns of |r|, in float64), u the
    unit roundoff (and, where γ^k runs into the subnormals, at most half the least subnormal per rounding). The
    scan's n is ``scan_roundings`` (float32 accumulation over each chunk, at each level); verl's
    loop rounds twice per position, n = 2T. So ours is within n_scan·u·S of the exact sum (verl's function in
    float64, itself within 2T·2^-53·S) and within (n_scan + 2T)·u·S of verl's float32; a row no longer than a
    chunk is verl's exact arithmetic (tests/test_token_rewards.py holds it to atol 0)."""
    from grpo.advantages import SCAN_CHUNK, discounted_returns

    g = torch.Generator().manual_seed(seed)
    B, T = 4, SCAN_CHUNK**2 + 37  # past two levels of chunks
    mask = (torch.rand(B, T, generator=g) > 0.1).to(torch.float64)
    mask[0, SCAN_CHUNK - 5 : 3 * SCAN_CHUNK + 9] = 0.0  # an observation across two chunks' edges
    mask[3] = 0.0  # an empty row
    # float32 values, so both dtypes start from the same numbers
    rewards = (torch.randn(B, T, generator=g) * (torch.rand(B, T, generator=g) < 0.05)).double() * mask
    config = AlgoConfig(adv_estimator="reinforce_plus_plus", gamma=gamma)
    verl = core_algos.get_adv_estimator_fn("reinforce_plus_plus")
    exact_adv, exact = verl(token_level_rewards=rewards.clone(), response_mask=mask, config=config)
    _, S = verl(token_level_rewards=rewards.abs(), response_mask=mask, config=config)
    _, verl32 = verl(token_level_rewards=rewards.float(), response_mask=mask.float(), config=config)
    n_scan, n_verl = scan_roundings(T, SCAN_CHUNK), 2 * T
    u32, u64 = 2.0**-24, 2.0**-53
    eta32, eta64 = 2.0**-150, 2.0**-1075  # a rounding into the subnormals errs by up to half the least one

    def within(got: torch.Tensor, want: torch.Tensor, roundings: float, eta: float) -> bool:
        return bool(((got - want).abs() <= roundings * S + (n_scan + n_verl) * eta).all())

    ours32 = discounted_returns(rewards.float(), mask.float(), gamma).double()
    assert within(ours32, exact, n_scan * u32 + n_verl * u64, eta32)
    assert within(ours32, verl32.double(), (n_scan + n_verl) * u32, eta32)
    ours64 = discounted_returns(rewards, mask, gamma)
    assert within(ours64, exact, (n_scan + n_verl) * u64, eta64)

    # whitened: (x - μ)/σ moves by at most (|Δx| + |Δμ| + |A|·|Δσ|)/σ, each Δ at most the returns' largest error
    mapping = map_verl({}, {"adv_estimator": "reinforce_plus_plus", "gamma": gamma})
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64)
    lens_batch = grpo.Batch(per_token_logps=logp, completion_mask=mask, token_level_rewards=rewards)
    bd = grpo.evaluate(lens_batch, grpo.LossConfig.resolve({"dtype": "float64"}, base=mapping.config))
    counted = mask.bool()
    sigma = exact[counted].std()
    error = (n_scan + n_verl) * u64 * S.max()
    atol = float(3 * error * (1 + exact_adv.abs().max()) / sigma) if sigma > 0 else 0.0
    torch.testing.assert_close(bd.tokens.advantage, exact_adv * mask, rtol=0, atol=atol)
