"""verl 0.9.1's rollout correction through GRPO Lens, against verl's own functions on the same tensors.

verl computes the IS weights on the driver with ``rollout_corr_helper.compute_rollout_correction_and_rejection_mask``
(old vs rollout log-probs: token or sequence, truncated at a float threshold or IcePop-masked outside
"lower_upper", optionally divided by their batch mean) and its policy losses multiply ``pg_losses`` by
``rollout_is_weights``. ``map_verl(actor, {"rollout_correction": ...})`` gives a LossConfig whose loss, gradient
and per-token weights equal verl's to float64 round-off, on ragged batches with an empty row and log-ratios
past verl's ±20 safety bound; a bad threshold spec is a clear error.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from reference import random_inputs

import grpo
from grpo.corrections import CORRECTION_CODES
from grpo.trainer_config import map_verl, parse_rollout_is_threshold

helper = pytest.importorskip("verl.trainer.ppo.rollout_corr_helper")
core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
pytestmark = pytest.mark.numerical

RTOL, ATOL = 1e-10, 1e-12


def actor(loss_mode: str, **fields: Any) -> Any:
    from verl.workers.config import ActorConfig, PolicyLossConfig

    return ActorConfig(
        strategy="fsdp",
        rollout_n=3,
        ppo_mini_batch_size=6,
        ppo_micro_batch_size_per_gpu=6,
        policy_loss=PolicyLossConfig(loss_mode=loss_mode),
        **fields,
    )


def inputs(seed: int, scale: float) -> tuple[torch.Tensor, ...]:
    """(logp, old, rollout, mask, advantages (B,)): ragged, one empty row, padding holding garbage, the
    rollout log-probs old + N(0, scale) with one token 25 nats off (past verl's ±20 bound)."""
    x = random_inputs(seed, B=6, T=9, garbage=None)
    g = torch.Generator().manual_seed(seed + 100)
    rollout = (x.old + scale * torch.randn(x.old.shape, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    first = int(x.mask.sum(-1).argmax())
    rollout[first, 0] = x.old[first, 0] - 25.0  # the trainer far likelier than the sampler: ratio e^25
    return x.logp, x.old, rollout, x.mask, x.advantages


def run_verl(case: dict[str, Any], tensors: tuple[torch.Tensor, ...], loss_mode: str, agg: str) -> dict[str, Any]:
    logp, old, rollout, mask, adv = tensors
    proto, kept, metrics = helper.compute_rollout_correction_and_rejection_mask(
        old_log_prob=old,
        rollout_log_prob=rollout,
        response_mask=mask,
        rollout_is=case.get("rollout_is"),
        rollout_is_threshold=case.get("rollout_is_threshold", 2.0),
        rollout_is_batch_normalize=case.get("rollout_is_batch_normalize", False),
        rollout_rs=case.get("rollout_rs"),
        rollout_rs_threshold=case.get("rollout_rs_threshold"),
    )
    weights = None if proto is None else proto.batch["rollout_is_weights"]
    mask = kept  # the driver's response mask after rejection: what the actor's loss sees
    leaf = logp.clone().requires_grad_(True)
    loss_fn = core_algos.get_policy_loss_fn(loss_mode)
    loss, pg_metrics = loss_fn(
        old_log_prob=old,
        log_prob=leaf,
        advantages=adv[:, None] * mask,
        response_mask=mask,
        loss_agg_mode=agg,
        config=actor(loss_mode),
        rollout_is_weights=weights,
    )
    (grad,) = torch.autograd.grad(loss, leaf)
    actor_metrics = {k: float(v) for k, v in pg_metrics.items()}
    return {"loss": loss.detach(), "grad": grad, "weights": weights, "metrics": metrics, "kept": kept} | {
        "actor": actor_metrics
    }


def run_lens(case: dict[str, Any], tensors: tuple[torch.Tensor, ...], loss_mode: str, agg: str) -> grpo.Breakdown:
    logp, old, rollout, mask, adv = tensors
    mapping = map_verl({"policy_loss": {"loss_mode": loss_mode}, "loss_agg_mode": agg}, {"rollout_correction": case})
    assert mapping.unsupported == {}
    batch = grpo.Batch(
        per_token_logps=logp,
        old_per_token_logps=old,
        completion_mask=mask,
        advantages=adv,
        rollout_log_probs=rollout,
    )
    return grpo.evaluate(batch, mapping.config.replace(dtype="float64"))


CASES = [
    {"rollout_is": level, "rollout_is_threshold": threshold, "rollout_is_batch_normalize": normalize}
    for level in ("token", "sequence")
    for threshold in (2.0, "1.5", "0.5_2.0", "1e-4_3.0")
    for normalize in (False, True)
]
LOSSES = [("vanilla", "token-mean"), ("vanilla", "seq-mean-token-mean"), ("gspo", "seq-mean-token-mean")]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(str(v) for v in c.values()))
@pytest.mark.parametrize(("loss_mode", "agg"), LOSSES, ids=lambda v: str(v))
@pytest.mark.parametrize("scale", [0.05, 0.5])
def test_value_gradient_weights_float64(case: dict[str, Any], loss_mode: str, agg: str, scale: float) -> None:
    tensors = inputs(int(scale * 100), scale)
    mask = tensors[3].bool()
    verl = run_verl(case, tensors, loss_mode, agg)
    bd = run_lens(case, tensors, loss_mode, agg)
    torch.testing.assert_close(bd.tokens.is_weight[mask], verl["weights"][mask], rtol=RTOL, atol=0.0)
    torch.testing.assert_close(bd.loss, verl["loss"], rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(bd.tokens.grad[mask], verl["grad"][mask], rtol=RTOL, atol=ATOL)
    if case["rollout_is_batch_normalize"]:  # the factor verl logged is the one a capture would carry
        factor = verl["metrics"]["rollout_corr/rollout_is_batch_norm_factor"]
        config = bd.config.replace(rollout_is_normalizer=factor)
        logp, old, rollout, _, adv = tensors
        batch = grpo.Batch(logp, old, completion_mask=tensors[3], advantages=adv, sampling_per_token_logps=rollout)
        torch.testing.assert_close(grpo.evaluate(batch, config).loss, verl["loss"], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("spec", [2.0, 3, "2.5", " 0.5_2.0", "1e-4_3.0", "2_2"])
def test_threshold_specs_parse_as_verl_parses_them(spec: Any) -> None:
    assert parse_rollout_is_threshold(spec) == helper._parse_rollout_is_threshold(spec)


@pytest.mark.parametrize("spec", ["3_1", "0_2", "-1", "abc", "1_x", "", True, None])
def test_bad_threshold_specs_are_refused_by_both(spec: Any) -> None:
    with pytest.raises((ValueError, TypeError)):
        helper._parse_rollout_is_threshold(spec)
    with pytest.raises(grpo.GrpoInputError) as caught:
        map_verl({}, {"rollout_correction": {"rollout_is": "token", "rollout_is_threshold": spec}})
    assert caught.value.field == "rollout_correction.rollout_is_threshold"
    assert "lower <= upper" in str(caught.value)


RS_CASES = [
    {"rollout_rs": "token_k1", "rollout_rs_threshold": "0.5_2.0"},
    {"rollout_rs": "token_k2", "rollout_rs_threshold": 0.3},
    {"rollout_rs": "seq_sum_k3", "rollout_rs_threshold": "1.5"},
    {"rollout_rs": "seq_mean_k1", "rollout_rs_threshold": "1.2"},
    {"rollout_rs": "seq_max_k2", "rollout_rs_threshold": "2.0"},
    {"rollout_rs": "token_k3,seq_mean_k2, seq_sum_k1", "rollout_rs_threshold": "2.0,0.1,0.2_4"},
    {"rollout_rs": "token_k1,seq_max_k3,seq_mean_k3", "rollout_rs_threshold": "3.0"},
    {
        "rollout_is": "sequence",
        "rollout_is_threshold": "0.5_4.0",
        "rollout_is_batch_normalize": True,
        "rollout_rs": "token_k2,seq_mean_k3",
        "rollout_rs_threshold": "1.0,0.2",
    },
]


@pytest.mark.parametrize("case", RS_CASES, ids=lambda c: c["rollout_rs"].replace(" ", ""))
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_rejection_chains_float64(case: dict[str, Any], agg: str) -> None:
    """verl's rollout_rs takes tokens and rows out of the response mask on the driver; the actor's loss
    then sees the rest. GRPO Lens marks them rejected and leaves them out the same way."""
    tensors = inputs(7, 0.5)
    verl = run_verl(case, tensors, "vanilla", agg)
    bd = run_lens(case, tensors, "vanilla", agg)
    mask, kept = tensors[3].bool(), verl["kept"].bool()
    assert (mask & ~kept).any() and kept.any()  # the criteria rejected some tokens and kept some
    rejected = bd.tokens.correction == CORRECTION_CODES.index("rejected")
    assert torch.equal(rejected, mask & ~kept) and torch.equal(bd.tokens.mask, kept)
    torch.testing.assert_close(bd.loss, verl["loss"], rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(bd.tokens.grad, verl["grad"] * kept, rtol=RTOL, atol=ATOL)
    if verl["weights"] is not None:
        torch.testing.assert_close(bd.tokens.is_weight[kept], verl["weights"][kept], rtol=RTOL, atol=0.0)
    assert float(bd.loss_without_correction) != float(bd.loss)
    # the actor's metrics are over the tokens left after the rejection (ppo_kl too, though the rejected tokens
    # keep their log-ratios in the breakdown). verl's masked_mean divides by count + 1e-8: n / (n + 1e-8) is
    # within 1e-8 of 1 for n >= 1 token, hence the relative tolerance.
    for name in ("actor/ppo_kl", "actor/pg_clipfrac", "actor/pg_clipfrac_lower"):
        assert bd.metrics[name] == pytest.approx(verl["actor"][name], rel=1e-8 + RTOL, abs=ATOL), name


@pytest.mark.parametrize(
    ("rs", "threshold", "field"),
    [
        ("token_k4", "1.0", "rollout_correction.rollout_rs"),
        ("seq_max_k1", "1.0", "rollout_correction.rollout_rs"),
        ("token_k2", "0.5_2.0", "rollout_correction.rollout_rs_threshold"),
        ("token_k1,token_k2", "1,2,3", "rollout_correction.rollout_rs_threshold"),
        ("token_k1", "3_1", "rollout_correction.rollout_rs_threshold"),
        ("token_k2", None, "rollout_correction.rollout_rs_threshold"),
    ],
)
def test_bad_rejection_specs_name_the_field(rs: str, threshold: Any, field: str) -> None:
    with pytest.raises((ValueError, TypeError)):
        helper.compute_rollout_rejection_mask(torch.zeros(1, 2), torch.ones(1, 2), rs, threshold)
    with pytest.raises(grpo.GrpoInputError) as caught:
        map_verl({}, {"rollout_correction": {"rollout_rs": rs, "rollout_rs_threshold": threshold}})
    assert caught.value.field == field


def test_no_rollout_is_means_no_weights() -> None:
    assert map_verl({}, {"rollout_correction": {"rollout_is": None}}).config.rollout_correction == "none"


def test_verl_gspo_with_token_weights_agrees_in_gradient_too() -> None:
    """verl's GSPO is the token form sg(s)·π/sg(π): a per-token IS weight weighs each token's own gradient.
    map_verl's gspo takes that form (sequence_ratio_gradient="token"), so the gradient agrees with verl's; TRL's
    form (through the row's mean log-ratio) has the same value and another gradient under these weights."""
    case = {"rollout_is": "token", "rollout_is_threshold": 2.0}
    tensors = inputs(5, 0.5)
    mask = tensors[3].bool()
    verl = run_verl(case, tensors, "gspo", "seq-mean-token-mean")
    bd = run_lens(case, tensors, "gspo", "seq-mean-token-mean")
    assert bd.config.sequence_ratio_gradient == "token"
    torch.testing.assert_close(bd.loss, verl["loss"], rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(bd.tokens.grad[mask], verl["grad"][mask], rtol=RTOL, atol=ATOL)
    logp, old, rollout, _, adv = tensors
    batch = grpo.Batch(logp, old, completion_mask=tensors[3], advantages=adv, sampling_per_token_logps=rollout)
    mean_form = grpo.evaluate(batch, bd.config.replace(sequence_ratio_gradient="mean"))
    torch.testing.assert_close(mean_form.loss, verl["loss"], rtol=RTOL, atol=ATOL)
    assert not torch.allclose(mean_form.tokens.grad[mask], verl["grad"][mask], rtol=1e-6, atol=1e-9)


BYPASS_CASES = [
    {"loss_type": "ppo_clip", "rollout_is": None, "rollout_rs": None},
    {"loss_type": "ppo_clip", "rollout_is": "sequence", "rollout_rs": "token_k1", "rollout_rs_threshold": "0.6_1.8"},
    {"loss_type": "reinforce", "rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_rs": None},
    {
        "loss_type": "reinforce",
        "rollout_is": "sequence",
        "rollout_is_threshold": "0.5_2.0",
        "rollout_is_batch_normalize": True,
        "rollout_rs": "seq_mean_k3",
        "rollout_rs_threshold": 0.3,
    },
]


@pytest.mark.parametrize("case", BYPASS_CASES, ids=lambda c: "-".join(str(v) for v in c.values()))
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_bypass_mode_float64(case: dict[str, Any], agg: str) -> None:
    """verl's bypass mode: old = rollout log-probs; IS weights and rejection from the current policy against
    the sampler, inside the loss (``compute_policy_loss_bypass_mode``): ppo_clip is the vanilla clip without
    weights, reinforce -A·log π·sg(w)."""
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.workers.config import ActorConfig, PolicyLossConfig

    rc = {"rollout_is_threshold": 2.0, "rollout_is_batch_normalize": False, "bypass_mode": True, **case}
    logp, _, rollout, mask, adv = inputs(11, 0.3)
    config = ActorConfig(
        strategy="fsdp",
        rollout_n=3,
        ppo_mini_batch_size=6,
        ppo_micro_batch_size_per_gpu=6,
        policy_loss=PolicyLossConfig(loss_mode="bypass_mode", rollout_correction=RolloutCorrectionConfig(**rc)),
    )
    leaf = logp.clone().requires_grad_(True)
    loss, _ = core_algos.compute_policy_loss_bypass_mode(
        old_log_prob=rollout,
        log_prob=leaf,
        advantages=adv[:, None] * mask,
        response_mask=mask,
        loss_agg_mode=agg,
        config=config,
    )
    (grad,) = torch.autograd.grad(loss, leaf)
    mapping = map_verl({"policy_loss": {"loss_mode": "bypass_mode", "rollout_correction": rc}, "loss_agg_mode": agg})
    assert mapping.unsupported == {} and mapping.config.rollout_bypass
    batch = grpo.Batch(logp, completion_mask=mask, advantages=adv, rollout_log_probs=rollout)
    bd = grpo.evaluate(batch, mapping.config.replace(dtype="float64"))
    torch.testing.assert_close(bd.loss, loss.detach(), rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(bd.tokens.grad, grad * bd.tokens.mask, rtol=RTOL, atol=ATOL)
    if case["rollout_rs"]:
        assert (bd.tokens.correction == CORRECTION_CODES.index("rejected")).any()


def test_bypass_needs_the_sampler_log_probs() -> None:
    config = map_verl({"policy_loss": {"loss_mode": "bypass_mode"}}).config
    with pytest.raises(grpo.GrpoInputError, match="sampling_per_token_logps"):
        grpo.evaluate(grpo.Batch([[-1.0]], advantages=[1.0]), config)
    with pytest.raises(grpo.GrpoInputError, match=r"rollout_correction\.loss_type"):
        map_verl({}, {"rollout_correction": {"bypass_mode": True, "loss_type": "dpo"}})


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rollout_corr_mismatch_metrics_are_verls(seed: int) -> None:
    """verl's compute_offpolicy_metrics on the same tensors: perplexities, KL, k3, log-ppl gaps, chi-squared."""
    logp, old, rollout, mask, adv = inputs(seed, 0.3)
    expected = helper.compute_offpolicy_metrics(old_log_prob=old, rollout_log_prob=rollout, response_mask=mask)
    batch = grpo.Batch(logp, old, completion_mask=mask, advantages=adv, rollout_log_probs=rollout)
    config = map_verl({}, {"rollout_correction": {"rollout_rs": "token_k2", "rollout_rs_threshold": 0.2}}).config
    bd = grpo.evaluate(batch, config.replace(dtype="float64"))
    assert (bd.tokens.correction == CORRECTION_CODES.index("rejected")).any()  # read before the rejection
    got = {k.removeprefix("rollout_corr/"): v for k, v in bd.metrics.items() if k.startswith("rollout_corr/")}
    assert set(got) == set(expected)
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, rel=1e-10, abs=1e-12), name
