"""Shortcuts evaluate takes for speed (bench/core.py), each held equal to the computation it replaces, bit for bit.

- The KL a breakdown reports without reference log-probs (beta 0): computed once and filled in
  (grpo.loss.reference_free_kl), it is kl_penalty's value at every token (the sign of a zero included), for every
  estimator, gradient form, clamp and dtype; the loss, gradient and metrics are those of the same batch evaluated
  through kl_penalty itself.
- The loss without correction when no correction, rejection, entropy bonus or router loss acted: this pass's loss,
  which is the sum it was computed as before ((policy + KL per token).sum() + 0.0).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from reference import random_inputs

import grpo
from grpo.kl import KL_ESTIMATORS
from grpo.loss import kl_penalty

pytestmark = pytest.mark.numerical  # run again under ATEN_CPU_CAPABILITY=default by make test


def batch_without_reference(seed: int, extreme: bool = False) -> grpo.Batch:
    x = random_inputs(seed)
    logp, old = x.logp.clone(), x.old.clone()
    if extreme:  # a log-ratio of 100: exp overflows float32 (inf), and 0 · inf is NaN in the bias-corrected KL
        i, j = x.mask.nonzero()[0].tolist()
        logp[i, j], old[i, j] = -0.5, -100.5
    return grpo.Batch(per_token_logps=logp, old_per_token_logps=old, completion_mask=x.mask, advantages=x.advantages)


@pytest.mark.parametrize("estimator", KL_ESTIMATORS.names())
@pytest.mark.parametrize("gradient", ["estimator", "k2"])
@pytest.mark.parametrize("clamps", [(None, None), (20.0, 10.0), (1e-3, 1e-3)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    ("bias_correction", "level", "extreme"),
    [(False, "token", False), (True, "token", False), (True, "sequence", False), (True, "token", True)],
)
def test_the_reference_free_kl_is_kl_penalty_token_by_token(
    estimator: str,
    gradient: str,
    clamps: tuple[float | None, float | None],
    dtype: str,
    bias_correction: bool,
    level: str,
    extreme: bool,
) -> None:
    batch = batch_without_reference(0, extreme)
    x_clamp, kl_clamp = clamps
    config = grpo.LossConfig(
        beta=0.0,
        kl_estimator=estimator,
        kl_gradient=gradient,
        kl_log_ratio_clamp=x_clamp,
        kl_clamp=kl_clamp,
        kl_bias_correction=bias_correction,
        importance_sampling_level=level,
        dtype=dtype,
    )
    bd = grpo.evaluate(batch, config)
    logp = batch.logp.to(getattr(torch, dtype))
    old = batch.old_per_token_logps.to(logp.dtype)  # type: ignore[union-attr]
    expected = kl_penalty(logp, logp.detach(), old, batch.mask_float.to(logp.dtype), config)
    assert bd.tokens.kl.dtype == expected.dtype and bd.tokens.kl.is_contiguous()
    assert torch.equal(bd.tokens.kl.nan_to_num(7.0), expected.nan_to_num(7.0))  # NaN where kl_penalty has NaN
    assert torch.equal(torch.signbit(bd.tokens.kl), torch.signbit(expected))  # k1's -0.0 stays -0.0
    assert bd.clamp_counts["kl_log_ratio_clamp"] == bd.clamp_counts["kl_clamp"] == 0
    if extreme and dtype == "float32" and level == "token":
        assert bool(bd.tokens.kl.isnan().any())  # the case is there


@pytest.mark.parametrize(
    "preset", ["trl-grpo", "trl-cispo", "trl-gspo", "trl-vespo", "verl-grpo", "verl-gmpo", "verl-dppo_kl"]
)
def test_the_breakdown_is_the_one_through_kl_penalty(preset: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same batch evaluated with the shortcut off (every KL through kl_penalty): identical numbers."""
    import grpo.loss

    batch = batch_without_reference(1)
    batch_old = batch.old_per_token_logps.to(torch.float64)  # type: ignore[union-attr]
    config = grpo.LossConfig.from_preset(preset, beta=0.0, dtype="float64")
    fast = grpo.evaluate(batch, config)
    monkeypatch.setattr(
        grpo.loss,
        "reference_free_kl",
        lambda like, config, ratio: kl_penalty(like, like.detach(), batch_old, batch.mask_float.to(like.dtype), config),
    )
    slow = grpo.evaluate(batch, replace(config))
    assert torch.equal(fast.loss, slow.loss)
    for name in ("kl", "loss", "grad", "grad_kl", "policy_loss", "kl_loss"):
        assert torch.equal(getattr(fast.tokens, name), getattr(slow.tokens, name)), name
    assert fast.metrics == slow.metrics
    assert fast.clamp_counts == slow.clamp_counts


@pytest.mark.parametrize("preset", ["trl-grpo", "trl-dapo", "trl-sapo", "verl-grpo", "verl-gmpo", "verl-kl_cov"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_the_loss_without_correction_is_the_sum_it_was(preset: str, beta: float) -> None:
    x = random_inputs(2)
    batch = grpo.Batch(**x.batch_fields())
    bd = grpo.evaluate(batch, grpo.LossConfig.from_preset(preset, beta=beta))
    assert torch.equal(bd.loss_without_correction, (bd.tokens.policy_loss + bd.tokens.kl_loss).sum() + 0.0)
    assert bd.loss_without_correction is not bd.loss
