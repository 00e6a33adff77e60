"""Shortcuts evaluate takes for speed (bench/core.py), each held equal to the computation it replaces, bit for bit.

- The KL a breakdown reports without reference log-probs (beta 0): computed once and filled in
  (grpo.loss.reference_free_kl), it is kl_penalty's value at every token (the sign of a zero included), for every
  estimator, gradient form, clamp and dtype; the loss, gradient and metrics are those of the same batch evaluated
  through kl_penalty itself.
- The loss without correction when no correction, rejection, entropy bonus or router loss acted: this pass's loss,
  which is the sum it was computed as before ((policy + KL per token).sum() + 0.0).
- The passes evaluate leaves out (bench/core.py's families): the zero tensors it shares instead of adding them, the
  loss as 0 - Σ w·s, the row and metric sums taken from what it has, one aminmax for the ratio's range, one region
  code per row or per batch, the mask product skipped where a term is already 0 outside the mask: every one is
  held here to the expression it replaces, over presets, objectives and batches of every kind, bit for bit.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from reference import random_inputs

import grpo
from grpo.config import PRESETS
from grpo.kl import KL_ESTIMATORS
from grpo.loss import counted_row_sum, kl_penalty
from grpo.objectives import OBJECTIVES, TRUST, above, regions

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
    monkeypatch.setattr(grpo.loss, "reference_free_zero", lambda *args: False)  # no zero shortcut either
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


# --- the passes evaluate leaves out ---------------------------------------------------------------------------------


def batches(seed: int) -> dict[str, grpo.Batch]:
    """Batches of every kind the shortcuts depend on: with and without reference, sampler log-probs (and so
    corrections and rejection), entropies, a tool mask, advantages per token."""
    x = random_inputs(seed, B=8, T=9, garbage=None)
    g = torch.Generator().manual_seed(seed)
    fields = x.batch_fields()
    entropies = torch.rand(8, 9, generator=g, dtype=torch.float64) * 3 * x.mask
    sampler = (x.old + 0.3 * torch.randn(8, 9, generator=g, dtype=torch.float64)).clamp(max=-1e-3) * x.mask
    no_ref = {k: v for k, v in fields.items() if k != "ref_per_token_logps"}
    per_token = x.advantages[:, None] * x.mask + 0.1 * torch.randn(8, 9, generator=g, dtype=torch.float64) * x.mask
    return {
        "plain": grpo.Batch(**fields),
        "sampled": grpo.Batch(**fields, entropies=entropies, sampling_per_token_logps=sampler),
        "no-ref": grpo.Batch(**no_ref),
        "no-ref-per-token": grpo.Batch(**{**no_ref, "advantages": per_token}),
        "tool": grpo.Batch(**fields, tool_mask=(torch.rand(8, 9, generator=g) > 0.3).double()),
    }


def configs() -> dict[str, grpo.LossConfig]:
    out = {f"{p}-beta{beta}": grpo.LossConfig.from_preset(p, beta=beta) for p in PRESETS for beta in (0.0, 0.04)}
    for objective in OBJECTIVES.names():
        for level in ("token", "sequence"):
            settings = {"objective": objective, "importance_sampling_level": level, "beta": 0.0, "dtype": "float32"}
            out[f"{objective}-{level}"] = grpo.LossConfig(**settings, dro_beta=0.1 if objective == "dro" else None)
    out |= {
        "entropy-mask-bonus": grpo.LossConfig.from_preset("trl-dapo", top_entropy_quantile=0.2, entropy_coef=0.01),
        "is-correction": grpo.LossConfig.from_preset("verl-grpo", rollout_correction="token_truncate", beta=0.0),
        "rejection": grpo.LossConfig.from_preset(
            "verl-grpo", rollout_rs="token_k1", rollout_rs_threshold="0.05_0.6", beta=0.0
        ),
        "sequence-mask": grpo.LossConfig.from_preset("trl-dapo", rollout_correction="sequence_mask", beta=0.0),
        "k3+": grpo.LossConfig.from_preset("verl-grpo", beta=0.01, kl_gradient="k2"),
        "token-form-gspo": grpo.LossConfig.from_preset("verl-gspo", beta=0.0),
    }
    return out


KINDS = ("plain", "sampled", "no-ref", "no-ref-per-token", "tool")
CASES = [(c, b, seed) for c in configs() for b in KINDS for seed in (0, 1)]


@pytest.mark.parametrize(("config_name", "batch_name", "seed"), CASES)
def test_every_shortcut_is_the_expression_it_replaces(config_name: str, batch_name: str, seed: int) -> None:
    config, batch = configs()[config_name], batches(seed)[batch_name]
    try:
        bd = grpo.evaluate(batch, config)
    except grpo.GrpoInputError:
        pytest.skip("an input this config needs is missing from this batch")
    t, mask = bd.tokens, bd.tokens.mask.to(bd.tokens.ratio.dtype)
    entropy = 0.0 if bd.entropy_tokens is None else bd.entropy_tokens
    # the token sums, once added with zeros and now shared: the same values
    assert torch.equal(t.loss, t.policy_loss + t.kl_loss + entropy)
    assert torch.equal(t.grad, t.grad_policy + t.grad_kl)
    router = 0.0 if bd.aux_loss is None else bd.aux_loss
    assert torch.equal(bd.loss, t.loss.sum() + router)  # 0 - Σ w·s is Σ (0 - w·s), to the bit
    assert torch.equal(bd.policy_loss, t.policy_loss.sum()) and torch.equal(bd.kl_loss, t.kl_loss.sum())
    zeros = t.loss == 0  # no -0.0 in a token's loss (the policy term is written 0 - w·s)
    assert not torch.signbit(t.loss[zeros]).any()
    # every tensor is 0 where nothing counts (the mask products skipped where a term is 0 there already)
    for name in ("ratio", "clipped_ratio", "surrogate", "loss", "policy_loss", "grad", "advantage"):
        assert (getattr(t, name)[~t.mask] == 0).all(), name
    # rows and metrics from the sums evaluate has: the (B, T) expressions they replace
    assert torch.equal(bd.rows.length, mask.sum(-1))
    assert torch.equal(bd.rows.loss, t.loss.sum(-1)) and torch.equal(bd.rows.kl_loss, t.kl_loss.sum(-1))
    outside = above(t.region.to(mask.dtype), TRUST).sum(-1)
    assert torch.equal(bd.rows.clip_fraction, outside / mask.sum(-1).clamp(min=1))
    n = mask.sum().clamp(min=1)
    m = bd.metrics
    assert m["lens/num_tokens"] == float(mask.sum())
    assert m["kl"] == float(t.kl.sum() / n)
    assert m["actor/kl_loss"] == float(torch.dot(t.weight.view(-1), t.kl.view(-1)))
    if config.objective != "kl_cov":  # kl_cov logs its own mean |log-ratio| under this name
        assert m["actor/ppo_kl"] == 0.0 - float((t.log_ratio * mask).sum() / n)
    if bool(t.mask.any()):
        counted = t.ratio[t.mask]
        assert m["lens/ratio/max"] == float(t.ratio.max()) or not counted.isfinite().all()
        assert m["lens/ratio/min"] == float(1 / (1 / counted.min())) or not counted.isfinite().all()


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize(
    "shift", [0.0, 0.5, -0.5, 3.0, -3.0], ids=["around-1", "all-above", "all-below", "far-above", "far-below"]
)
def test_the_ratio_range_is_the_one_over_the_counted_tokens(level: str, shift: float) -> None:
    """The one-pass range (aminmax over the raw ratio, 1 outside the mask) falls back where the ratios all lie on one
    side of 1: every case gives the min and max over the counted tokens, the min as 1 / max(mask / ratio)."""
    x = random_inputs(3, B=8, T=9)
    moved = (
        {"old_per_token_logps": x.old - shift * x.mask} if shift > 0 else {"per_token_logps": x.logp + shift * x.mask}
    )
    batch = grpo.Batch(**{**x.batch_fields(), **moved})  # ratios moved up (old lowered) or down (logp lowered)
    config = grpo.LossConfig(importance_sampling_level=level, beta=0.0)
    bd = grpo.evaluate(batch, config)
    t = bd.tokens
    raw = torch.where(t.mask, t.ratio, 1.0)
    assert bd.metrics["lens/ratio/min"] == float(1 / (t.mask.to(raw.dtype) / raw).max())
    assert bd.metrics["lens/ratio/max"] == float(t.ratio.max())


def test_the_counted_row_sum_has_the_masked_products_value_and_gradient() -> None:
    x = random_inputs(4, B=8, T=9)
    mask = x.mask
    values = (torch.randn(8, 9, dtype=torch.float64) * mask).requires_grad_(True)
    fast = counted_row_sum(values, mask)
    slow = (values * mask).sum(-1, keepdim=True)
    weights = torch.randn(8, 1, dtype=torch.float64)
    (fast_grad,) = torch.autograd.grad((fast * weights).sum(), values)
    (slow_grad,) = torch.autograd.grad((slow * weights).sum(), values)
    assert torch.equal(fast, slow) and torch.equal(fast_grad, slow_grad)
    assert torch.autograd.gradcheck(lambda v: counted_row_sum(v * mask, mask), (values.detach().requires_grad_(),))


@pytest.mark.parametrize("given", [(0,), (1,), (2,), (0, 1), (0, 2), (1, 2), (0, 1, 2)])
def test_regions_are_trust_plus_each_indicators_code(given: tuple[int, ...]) -> None:
    g = torch.Generator().manual_seed(5)
    which = torch.randint(0, 4, (6, 7), generator=g)  # 0: trust, 1..3: the indicator of that code (disjoint)
    indicators = [(which == k + 1).double() if k in given else None for k in range(3)]
    region = regions(torch.zeros(6, 7, dtype=torch.float64), *indicators)
    expected = torch.full((6, 7), float(TRUST), dtype=torch.float64)
    for k, indicator in enumerate(indicators):
        if indicator is not None:
            expected += indicator * (k + 1)
    assert torch.equal(region, expected)
    assert regions(torch.zeros(6, 7)).shape == (1, 1) and float(regions(torch.zeros(6, 7))) == TRUST
