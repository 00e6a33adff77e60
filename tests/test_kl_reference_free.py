"""The KL a breakdown reports without reference log-probs (beta 0): computed once and filled in
(grpo.loss.reference_free_kl), it is kl_penalty's value at every token, bit for bit (the sign of a zero included),
for every estimator, gradient form, clamp and dtype; the loss, gradient and metrics are those of the same batch
evaluated through kl_penalty itself."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from reference import random_inputs

import grpo
from grpo.kl import KL_ESTIMATORS
from grpo.loss import kl_penalty

pytestmark = pytest.mark.numerical  # run again under ATEN_CPU_CAPABILITY=default by make test


def batch_without_reference(seed: int) -> grpo.Batch:
    x = random_inputs(seed)
    return grpo.Batch(
        per_token_logps=x.logp, old_per_token_logps=x.old, completion_mask=x.mask, advantages=x.advantages
    )


@pytest.mark.parametrize("estimator", KL_ESTIMATORS.names())
@pytest.mark.parametrize("gradient", ["estimator", "k2"])
@pytest.mark.parametrize("clamps", [(None, None), (20.0, 10.0), (1e-3, 1e-3)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_reference_free_kl_is_kl_penalty_token_by_token(
    estimator: str, gradient: str, clamps: tuple[float | None, float | None], dtype: str
) -> None:
    batch = batch_without_reference(0)
    x_clamp, kl_clamp = clamps
    config = grpo.LossConfig(
        beta=0.0,
        kl_estimator=estimator,
        kl_gradient=gradient,
        kl_log_ratio_clamp=x_clamp,
        kl_clamp=kl_clamp,
        dtype=dtype,
    )
    bd = grpo.evaluate(batch, config)
    logp = batch.logp.to(getattr(torch, dtype))
    expected = kl_penalty(logp, logp.detach(), logp.detach(), batch.mask_float.to(logp.dtype), config)
    assert bd.tokens.kl.dtype == expected.dtype and bd.tokens.kl.is_contiguous()
    assert torch.equal(bd.tokens.kl, expected)
    assert torch.equal(torch.signbit(bd.tokens.kl), torch.signbit(expected))  # k1's -0.0 stays -0.0
    assert bd.clamp_counts["kl_log_ratio_clamp"] == bd.clamp_counts["kl_clamp"] == 0


@pytest.mark.parametrize("preset", ["trl-grpo", "trl-cispo", "verl-grpo", "verl-gmpo", "verl-dppo_kl"])
def test_the_breakdown_is_the_one_through_kl_penalty(preset: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same batch evaluated with the shortcut off (every KL through kl_penalty): identical numbers."""
    import grpo.loss

    batch = batch_without_reference(1)
    config = grpo.LossConfig.from_preset(preset, beta=0.0, dtype="float64")
    fast = grpo.evaluate(batch, config)
    monkeypatch.setattr(
        grpo.loss, "reference_free_kl", lambda like, config: kl_penalty(like, like.detach(), like, like, config)
    )
    slow = grpo.evaluate(batch, replace(config))
    assert torch.equal(fast.loss, slow.loss)
    for name in ("kl", "loss", "grad", "grad_kl", "policy_loss", "kl_loss"):
        assert torch.equal(getattr(fast.tokens, name), getattr(slow.tokens, name)), name
    assert fast.metrics == slow.metrics
    assert fast.clamp_counts == slow.clamp_counts
