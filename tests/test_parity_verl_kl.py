"""verl 0.9.1's KL types through GRPO Lens, against verl's own ``core_algos.kl_penalty`` on the same tensors.

For every ``kl_loss_type`` verl registers (the plain ones and the straight-through "+" ones, whose value is
the base type's and whose gradient is k2's), ``map_verl`` gives a LossConfig whose per-token KL and its
gradient equal verl's, token by token, on ragged batches with extreme log-ratios (where the ±20 / ±10 clamps
act) and equal log-probs. ``full`` raises in verl itself: ``map_verl`` reports it as unsupported.
"""

from __future__ import annotations

import pytest
import torch
from reference import random_inputs

import grpo
from grpo.trainer_config import VERL_KL_TYPES, map_verl

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")

pytestmark = pytest.mark.numerical  # run again under ATEN_CPU_CAPABILITY=default by make test


def verl_types() -> list[str]:
    """The KL types verl 0.9.1's kl_penalty accepts: each base type, with and without "+"."""
    base = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
    return [*base, *(f"{name}+" for name in base)]


def extreme_inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logp, ref, mask) in float64: ragged rows, NaN padding, log-ratios spread to ±30 (past verl's clamps)
    and some tokens where ref equals logp."""
    inputs = random_inputs(seed, B=6, T=9)
    g = torch.Generator().manual_seed(seed)
    ref = inputs.logp + 20 * torch.randn(inputs.logp.shape, generator=g, dtype=torch.float64)
    ref[:, ::4] = inputs.logp[:, ::4]  # equal log-probs: k2's gradient 0, abs's kink
    return inputs.logp, ref.clamp(max=-1e-3), inputs.mask


def lens_kl(kl_type: str, logp: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """GRPO Lens's per-token KL and its gradient per counted token, under map_verl's config for ``kl_type``."""
    mapping = map_verl({"use_kl_loss": True, "kl_loss_type": kl_type, "kl_loss_coef": 1.0})
    assert not mapping.unsupported, mapping.unsupported
    config = grpo.LossConfig.resolve({"dtype": "float64"}, base=mapping.config)
    batch = grpo.Batch(
        per_token_logps=logp,
        old_per_token_logps=logp,
        ref_per_token_logps=ref,
        completion_mask=mask,
        advantages=torch.zeros(logp.shape[0], dtype=torch.float64),
    )
    bd = grpo.evaluate(batch, config)
    return bd.tokens.kl, bd.tokens.grad_kl / bd.tokens.weight.where(bd.tokens.weight != 0, 1.0)


def verl_kl(kl_type: str, logp: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    lp = logp.nan_to_num(-1.0).detach().requires_grad_(True)
    out = core_algos.kl_penalty(lp, ref.nan_to_num(-1.0), kl_type)
    (grad,) = torch.autograd.grad(out.sum(), lp)
    return out.detach(), grad


@pytest.mark.parametrize("kl_type", verl_types())
@pytest.mark.parametrize("seed", [0, 1])
def test_every_verl_kl_type_value_and_gradient(kl_type: str, seed: int) -> None:
    logp, ref, mask = extreme_inputs(seed)
    value, grad = lens_kl(kl_type, logp, ref, mask)
    expected_value, expected_grad = verl_kl(kl_type, logp, ref)
    counted = mask.bool()
    # The same formula on the same float64 numbers: equal to a few ulps of the terms (e^20 ≈ 5e8 at the clamp)
    torch.testing.assert_close(value[counted], expected_value[counted], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad[counted], expected_grad[counted], rtol=1e-12, atol=1e-12)


def test_plus_types_keep_the_value_and_take_k2s_gradient() -> None:
    """k3+ is k3's number with the gradient logp - ref (k2's), unclamped where k3's clamps act."""
    logp, ref, mask = extreme_inputs(3)
    plain, plain_grad = lens_kl("k3", logp, ref, mask)
    plus, plus_grad = lens_kl("k3+", logp, ref, mask)
    counted = mask.bool()
    assert torch.equal(plain[counted], plus[counted])
    torch.testing.assert_close(plus_grad[counted], (logp - ref)[counted], rtol=1e-12, atol=1e-12)
    clamped = counted & (plain == 10)  # verl's clamp of the estimate acted: k3's own gradient is 0 there
    assert clamped.any() and (plain_grad[clamped] == 0).all() and (plus_grad[clamped] != 0).all()


def test_every_verl_kl_type_is_mapped() -> None:
    assert set(verl_types()) <= set(VERL_KL_TYPES)


def test_full_is_unsupported_because_verl_raises() -> None:
    logp = torch.full((1, 2), -1.0)
    with pytest.raises(NotImplementedError):
        core_algos.kl_penalty(logp, logp, "full")
    mapping = map_verl({"use_kl_loss": True, "kl_loss_type": "full"})
    assert "NotImplementedError" in mapping.unsupported["kl_loss_type"]
