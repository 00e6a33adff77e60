"""grpo.kl: k1, k2, k3 by hand, k3's stable form, closed-form gradients, clamps and TRL's
bias-corrected KL."""

from __future__ import annotations

import math

import pytest
import torch
from reference import K3_ROW0, K3_ROW1, Inputs, close, close_to_scale, evaluate64

import grpo
from grpo.kl import KL_ESTIMATORS

pytestmark = pytest.mark.numerical  # run again under ATEN_CPU_CAPABILITY=default by make test

LN2 = math.log(2)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # x = ln(pi_ref / pi) at pi_ref/pi = 2, 1/2 and 1
        ("k1", [-LN2, LN2, 0.0]),  # k1 = log(pi / pi_ref) = -x
        ("k2", [0.5 * LN2**2, 0.5 * LN2**2, 0.0]),  # ½x²
        ("k3", [1 - LN2, LN2 - 0.5, 0.0]),  # e^x - x - 1: 2 - ln 2 - 1 and 1/2 + ln 2 - 1
    ],
)
def test_estimators_by_hand(name: str, expected: list[float]) -> None:
    x = torch.tensor([LN2, -LN2, 0.0], dtype=torch.float64)
    close(KL_ESTIMATORS.get(name)(x), expected)


def test_k3_is_the_stable_form() -> None:
    """k3 = exp(x) - x - 1 in float64 over a wide range, finite where the article's ratio of exps
    is not, and exact near 0 where exp(x) - x - 1 cancels to nothing."""
    x = torch.linspace(-30, 30, 601, dtype=torch.float64)
    # the naive form adds terms of size e^x, |x| and 1: each side is a few ulps of their sum, which
    # near x = 0 is far larger than k3 itself (any kernel set may round exp differently)
    terms = x.exp() + x.abs() + 1
    close_to_scale(KL_ESTIMATORS.get("k3")(x), torch.exp(x) - x - 1, terms, rtol=0, floor=0, dtype=torch.float64)
    # two tiny probabilities with a moderate ratio: the article's pi_ref.exp() / pi.exp() underflows to
    # 0 / 0 = nan in float32, while x = ref - logp = 1 gives k3 = e - 2
    logp, ref = torch.tensor(-120.0), torch.tensor(-119.0)
    assert torch.isnan(ref.exp() / logp.exp() - (ref - logp) - 1)
    close(KL_ESTIMATORS.get("k3")(ref - logp), math.e - 2, rtol=1e-6, atol=0)
    # near 0, k3 = x²/2 + x³/6 + ...: in float32, exp(x) - x - 1 at |x| = 1e-4 is mostly rounding
    # (error ~ ulp(1) = 1.2e-7 against a value of 5e-9); expm1(x) - x keeps it within 2e-3.
    small = torch.tensor([1e-4, -1e-4, 3e-4], dtype=torch.float32)
    exact = small.double() ** 2 / 2 + small.double() ** 3 / 6
    close(KL_ESTIMATORS.get("k3")(small), exact, rtol=2e-3, atol=0)
    naive = (torch.exp(small) - small - 1).double()
    assert ((naive - exact).abs() / exact).max() > 0.5


def test_policies_match_kl_is_zero(inputs: Inputs) -> None:
    fields = {**inputs.batch_fields(), "ref_per_token_logps": inputs.logp}
    for name in KL_ESTIMATORS.names():
        bd = evaluate64(grpo.Batch(**fields), "article", kl_estimator=name, kl_bias_correction=True)
        assert (bd.tokens.kl == 0).all() and bd.kl_loss == 0 and bd.metrics["kl"] == 0
        if name != "k1":  # k2 and k3 are flat at x = 0; k1's gradient is 1 whatever pi_ref is
            assert (bd.tokens.grad_kl == 0).all()


# --- closed-form gradients through evaluate -----------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "grad"),
    [
        ("k1", lambda lp, ref: torch.ones_like(lp)),  # d(logp - ref)/d logp = 1
        ("k2", lambda lp, ref: lp - ref),  # d ½(logp - ref)² = logp - ref
        ("k3", lambda lp, ref: 1 - torch.exp(ref - lp)),  # d(e^x - x - 1), x = ref - logp: 1 - pi_ref/pi
    ],
)
def test_kl_closed_form_gradient(name: str, grad: object, inputs: Inputs) -> None:
    """d (beta·w·kl) / d logp = beta·w·dk/dlogp on every counted token."""
    beta = 0.3
    bd = evaluate64(grpo.Batch(**inputs.batch_fields()), "article", kl_estimator=name, beta=beta)
    lp, ref = (torch.nan_to_num(t) for t in (inputs.logp, inputs.ref))
    expected = beta * bd.tokens.weight * grad(lp, ref)  # type: ignore[operator]
    close(bd.tokens.grad_kl, expected)


def test_bias_corrected_k3_closed_form(inputs: Inputs) -> None:
    """TRL's k3·r (r the differentiable ratio): d/d logp = r·(logp - ref); on-policy too (r = 1)."""
    batch = grpo.Batch(**inputs.batch_fields())
    bd = evaluate64(batch, "trl-dapo", beta=0.5)
    lp, ref = (torch.nan_to_num(t) for t in (inputs.logp, inputs.ref))
    close(bd.tokens.grad_kl, 0.5 * bd.tokens.weight * bd.tokens.ratio * (lp - ref))
    plain = evaluate64(batch, "trl-dapo", beta=0.5, kl_bias_correction=False)
    close(plain.tokens.grad_kl, 0.5 * plain.tokens.weight * (1 - torch.exp(ref - lp)))
    on_policy = grpo.Batch(**{**inputs.batch_fields(), "old_per_token_logps": None})
    bd = evaluate64(on_policy, "trl-dapo", beta=0.5)
    close(bd.tokens.grad_kl, 0.5 * bd.tokens.weight * (lp - ref))  # not 1 - pi_ref/pi, even at r = 1


def test_bias_corrected_k3_by_hand(hand_batch: grpo.Batch) -> None:
    # TRL trl-dapo beta 0.1: kl = k3·r at the two tokens with a reference: k3_0·1.5 and k3_1·0.5; weight 1/5.
    bd = evaluate64(hand_batch, "trl-dapo", beta=0.1)
    close(bd.tokens.kl, [[K3_ROW0 * 1.5, 0, 0], [K3_ROW1 * 0.5, 0, 0]])
    close(bd.kl_loss, 0.1 * (K3_ROW0 * 1.5 + K3_ROW1 * 0.5) / 5)
    # gradient r·(logp - ref): 1.5·(ln 0.3 - ln 0.6) = -1.5 ln 2 and 0.5·(ln 0.1 - ln 0.05) = 0.5 ln 2
    close(bd.tokens.grad_kl, [[0.1 / 5 * -1.5 * LN2, 0, 0], [0.1 / 5 * 0.5 * LN2, 0, 0]])


def test_bias_correction_at_sequence_level(hand_batch: grpo.Batch) -> None:
    # GSPO: the correction multiplies by the row's sequence ratio, s0 = √1.35, s1 = 2.2^(1/3).
    bd = evaluate64(hand_batch, "trl-gspo", beta=0.1)
    close(bd.tokens.kl, [[K3_ROW0 * math.sqrt(1.35), 0, 0], [K3_ROW1 * 2.2 ** (1 / 3), 0, 0]])


def test_kl_clamps_value_and_gradient() -> None:
    """verl's low_var_kl: x = ref - logp clamped to ±20, the estimate to ±10; beyond a clamp the
    value is flat and the gradient 0."""
    logp = [[-30.0, -4.0, -1.0, -0.2]]
    ref = [[-1.0, -1.0, -1.2, -0.2]]  # x = 29 (both clamps), 3 (k3 = e^3 - 4 = 16.1 > 10), -0.2, 0
    batch = grpo.Batch(per_token_logps=logp, ref_per_token_logps=ref, advantages=[0.0])
    bd = evaluate64(batch, "verl-grpo", beta=1.0)
    k3_small = math.exp(-0.2) + 0.2 - 1
    close(bd.tokens.kl, [[10.0, 10.0, k3_small, 0.0]])
    w = 1 / (4 + 1e-8)
    close(bd.tokens.grad_kl, [[0.0, 0.0, w * (1 - math.exp(-0.2)), 0.0]])
    assert bd.clamp_counts["kl_log_ratio_clamp"] == 1 and bd.clamp_counts["kl_clamp"] == 2
    # without the ±10 clamp, x = 20 gives k3 = e^20 - 21
    bd = evaluate64(batch, "verl-grpo", beta=1.0, kl_clamp=None)
    close(bd.tokens.kl[0, 0], math.exp(20) - 21)


def test_unknown_kl_estimator_lists_the_valid_names() -> None:
    with pytest.raises(grpo.GrpoInputError, match="k1, k2, k3") as err:
        grpo.LossConfig(kl_estimator="low_var_kl")
    assert err.value.field == "kl_estimator"
