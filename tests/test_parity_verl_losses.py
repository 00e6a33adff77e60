"""verl 0.9.1's later policy losses through GRPO Lens, against verl's own registered functions.

For geo_mean (GMPO), clip_cov, kl_cov, dppo_tv, dppo_kl and dro, ``map_verl`` of a real ``ActorConfig``
gives a LossConfig whose loss and gradient per token equal what ``core_algos.get_policy_loss_fn(mode)``
returns on the same tensors (float64 round-off), with verl's logged metrics, on ragged batches with an
empty row and with extreme ratios (log-ratios of ±25, past dppo's ±20 clamp). clip_cov draws its tokens
with torch.randperm from the process's RNG: the test seeds it, and GRPO Lens draws with clip_cov_seed.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from reference import Inputs, leaf, random_inputs

import grpo
from grpo.objectives import DUAL_CLIP
from grpo.trainer_config import VERL_LOSS_MODES, VERL_POLICY_LOSS_FIELDS, map_verl

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")

pytestmark = pytest.mark.numerical  # run again under ATEN_CPU_CAPABILITY=default by make test

MODES = ("geo_mean", "clip_cov", "kl_cov", "dppo_tv", "dppo_kl", "dro")
AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def actor_config(loss_mode: str, agg: str, policy: dict[str, Any] | None = None, **fields: Any) -> Any:
    from verl.workers.config import ActorConfig, PolicyLossConfig

    return ActorConfig(
        strategy="fsdp",
        rollout_n=4,
        ppo_mini_batch_size=8,
        ppo_micro_batch_size_per_gpu=4,
        loss_agg_mode=agg,
        policy_loss=PolicyLossConfig(loss_mode=loss_mode, **(policy or {})),
        **fields,
    )


def extreme_inputs(seed: int) -> Inputs:
    """A ragged batch with an empty row, log-ratios spread wide and two past ±20 (dppo's clamp)."""
    x = random_inputs(seed, B=8, T=9, noise=2.0)
    logp, old = x.logp.clone(), x.old.clone()
    counted = x.mask.nonzero()
    (i, j), (k, m) = counted[0].tolist(), counted[-1].tolist()
    old[i, j], logp[i, j] = -26.0, -0.5  # log-ratio +25.5
    old[k, m], logp[k, m] = -0.5, -26.0  # log-ratio -25.5
    return Inputs(logp, old, x.ref, x.mask, x.advantages, x.rewards, x.group_size)


def verl_loss(mode: str, config: Any, inputs: Inputs, seed: int) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """verl's registered function on the batch (padding as 0, advantages per token as verl hands them)."""
    lp = leaf(inputs.logp)
    old = inputs.old.nan_to_num(0.0)
    advantages = inputs.advantages[:, None] * inputs.mask
    torch.manual_seed(seed)  # clip_cov's torch.randperm
    loss, metrics = core_algos.get_policy_loss_fn(mode)(
        old_log_prob=old,
        log_prob=lp,
        advantages=advantages,
        response_mask=inputs.mask,
        loss_agg_mode=config.loss_agg_mode,
        config=config,
    )
    (grad,) = torch.autograd.grad(loss, lp)
    return loss.detach(), grad, metrics


def lens(config: Any, inputs: Inputs, seed: int) -> grpo.Breakdown:
    mapping = map_verl(config)
    assert not mapping.unsupported, mapping.unsupported
    loss_config = grpo.LossConfig.resolve({"dtype": "float64", "clip_cov_seed": seed}, base=mapping.config)
    return grpo.evaluate(grpo.Batch(**inputs.batch_fields()), loss_config)


def check(mode: str, config: Any, inputs: Inputs, seed: int) -> grpo.Breakdown:
    loss, grad, metrics = verl_loss(mode, config, inputs, seed)
    bd = lens(config, inputs, seed)
    # The same float64 formulas: equal to round-off of the terms (exp(20) ≈ 5e8 at dppo's clamp).
    scale = float(bd.tokens.policy_loss.abs().sum()) + 1.0
    torch.testing.assert_close(bd.loss, loss, rtol=1e-11, atol=1e-13 * scale)
    torch.testing.assert_close(bd.tokens.grad, grad, rtol=1e-10, atol=1e-13 * scale)
    assert bd.tokens.grad[inputs.mask == 0].abs().sum() == 0
    for name, value in metrics.items():
        assert bd.metrics[name] == pytest.approx(value, rel=1e-9, abs=1e-12), name
    return bd


@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_value_gradient_metrics_against_verl(mode: str, agg: str, seed: int) -> None:
    policy = {"dro_beta": 0.3} if mode == "dro" else {}
    config = actor_config(mode, agg, policy, clip_ratio_high=0.28)
    check(mode, config, random_inputs(seed, B=8, T=9, noise=1.0), seed)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", [0, 1])
def test_extreme_ratios(mode: str, seed: int) -> None:
    policy = {"dro_beta": 0.05} if mode == "dro" else {}
    config = actor_config(mode, "token-mean", policy)
    bd = check(mode, config, extreme_inputs(seed), seed)
    assert torch.isfinite(bd.tokens.grad).all()
    if mode.startswith("dppo"):
        assert bd.clamp_counts["log_ratio_clamp"] == 2  # the ±25.5 log-ratios, clamped to ±20 as verl does


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_clip_cov_cuts_the_tokens_verl_draws(seed: int) -> None:
    """With bounds that make most tokens candidates, the draw decides: the same seed cuts the same tokens,
    and their gradient is 0 (verl's corr)."""
    config = actor_config("clip_cov", "token-mean", {"clip_cov_ratio": 0.2, "clip_cov_lb": -10.0, "clip_cov_ub": 10.0})
    bd = check("clip_cov", config, random_inputs(seed, B=8, T=9, noise=1.0), seed)
    cut = bd.tokens.region == DUAL_CLIP  # the region code of the cut tokens
    assert int(cut.sum()) == max(int(0.2 * float(bd.tokens.mask.sum())), 1)
    assert (bd.tokens.grad[cut] == 0).all() and (bd.tokens.loss[cut] == 0).all()


@pytest.mark.parametrize("ratio", [0.3, 0.05])
def test_kl_cov_penalises_the_top_covariance_tokens(ratio: float) -> None:
    config = actor_config("kl_cov", "seq-mean-token-mean", {"kl_cov_ratio": ratio, "ppo_kl_coef": 2.0})
    bd = check("kl_cov", config, random_inputs(4, B=8, T=9, noise=1.0), 0)
    k = max(1, int(float(bd.tokens.mask.sum()) * ratio))
    plain = bd.tokens.ratio * bd.advantages[:, None]  # A·ratio: the penalised tokens' surrogate is below it
    assert int((bd.tokens.surrogate < plain - 1e-12).logical_and(bd.tokens.mask).sum()) == k


def test_the_defaults_are_policy_loss_configs() -> None:
    """Settings a config leaves out take PolicyLossConfig's defaults (not the loss functions' fallbacks)."""
    from verl.workers.config import PolicyLossConfig

    defaults = PolicyLossConfig()
    for name, (_, default) in VERL_POLICY_LOSS_FIELDS.items():
        assert getattr(defaults, name) == default, name
    config = map_verl({"policy_loss": {"loss_mode": "kl_cov"}}).config
    assert config.ppo_kl_coef == defaults.ppo_kl_coef == 0.1  # the function's fallback would be 1.0


def test_every_registered_verl_loss_is_mapped() -> None:
    """Every loss verl 0.9.1 registers maps, but bypass_mode (the rollout correction's, another issue's)."""
    registered = set(core_algos.POLICY_LOSS_REGISTRY) - {"bypass_mode"}
    assert registered <= set(VERL_LOSS_MODES)
    for mode in registered:
        policy = {"loss_mode": mode, "dro_beta": 0.1}
        assert not map_verl({"policy_loss": policy}).unsupported, mode


def test_dro_without_beta_is_refused_as_verl_refuses_it() -> None:
    config = actor_config("dro", "token-mean")
    with pytest.raises(ValueError, match="dro_beta"):
        verl_loss("dro", config, random_inputs(0), 0)
    mapping = map_verl(config)
    assert "ValueError" in mapping.unsupported["policy_loss.dro_beta"]
    with pytest.raises(grpo.GrpoInputError, match="dro_beta"):
        grpo.evaluate(grpo.Batch(**random_inputs(0).batch_fields()), mapping.config)


def test_dppo_reads_clip_ratio_as_a_divergence_threshold() -> None:
    """Under dppo_tv, epsilon_high bounds p − p_old, not the ratio: a token whose ratio is 3 (far past
    1 + 0.2) but whose probability rose by 0.02 keeps its gradient; one whose probability rose by 0.3 does not."""
    old = torch.tensor([[0.01, 0.3]], dtype=torch.float64).log()
    logp = torch.tensor([[0.03, 0.6]], dtype=torch.float64).log()
    batch = grpo.Batch(
        per_token_logps=logp, old_per_token_logps=old, advantages=torch.tensor([1.0], dtype=torch.float64)
    )
    bd = grpo.evaluate(batch, map_verl({"policy_loss": {"loss_mode": "dppo_tv"}}).config.replace(dtype="float64"))
    assert bd.tokens.grad[0, 0] != 0 and bd.tokens.grad[0, 1] == 0
    assert bd.metrics["actor/pg_clipfrac"] == 0.5


def test_geo_mean_ignores_the_aggregation_for_the_policy_term_only() -> None:
    """verl's geo_mean is the mean over rows whatever loss_agg_mode says; its KL term keeps loss_agg_mode."""
    inputs = random_inputs(5, B=8, T=9, noise=1.0)
    losses = [lens(actor_config("geo_mean", agg, use_kl_loss=True, kl_loss_coef=0.1), inputs, 0) for agg in AGGS[:2]]
    torch.testing.assert_close(losses[0].policy_loss, losses[1].policy_loss, rtol=1e-13, atol=1e-15)
    assert abs(float(losses[0].kl_loss - losses[1].kl_loss)) > 1e-6
    for bd in losses:
        torch.testing.assert_close(bd.loss, bd.tokens.loss.sum(), rtol=1e-12, atol=1e-14)


def test_selection_shares_are_bounded_and_a_share_of_one_takes_every_token() -> None:
    """A share above 1 is refused naming its field (it used to reach torch.topk with k > N: a RuntimeError, a 500
    through the API); a share of 1 penalises every counted token."""
    for name in ("kl_cov_ratio", "clip_cov_ratio"):
        with pytest.raises(grpo.GrpoInputError, match=name):
            grpo.LossConfig(objective="kl_cov", **{name: 5.0})
    inputs = random_inputs(2, B=8, T=9, noise=1.0)
    config = actor_config("kl_cov", "token-mean", {"kl_cov_ratio": 1.0, "ppo_kl_coef": 0.5})
    bd = check("kl_cov", config, inputs, 0)
    plain = bd.tokens.ratio * bd.advantages[:, None]
    counted = bd.tokens.mask
    torch.testing.assert_close(
        bd.tokens.surrogate[counted], (plain - 0.5 * bd.tokens.log_ratio.abs())[counted], rtol=1e-12, atol=1e-14
    )
