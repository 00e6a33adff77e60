"""TRL 1.16's high-entropy token mask (``top_entropy_quantile``, the 80/20 paper) in GRPO Lens.

Against TRL's own ``GRPOTrainer.get_high_entropy_mask`` (on one process: its gather is the identity), the
loss's invariants (the mask zeroes the policy term and its gradient, never the KL), the why of each masked
token, and a real TRL run with the mask captured by ``grpo.capture.trl`` and checked by ``check_run``.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from reference import random_inputs

import grpo
from grpo.explain import ENTROPY_MASKED, token_why
from grpo.loss import high_entropy_mask

pytestmark = pytest.mark.numerical  # run again under ATEN_CPU_CAPABILITY=default by make test


def trl_mask(entropies: torch.Tensor, mask: torch.Tensor, quantile: float) -> torch.Tensor:
    """TRL's method itself, on a stand-in trainer whose accelerator is one process (pad and gather: identity)."""
    from trl import GRPOTrainer

    accelerator = SimpleNamespace(pad_across_processes=lambda x, **_: x, gather=lambda x: x)
    stand_in: Any = SimpleNamespace(accelerator=accelerator)
    out: torch.Tensor = GRPOTrainer.get_high_entropy_mask(stand_in, entropies, mask, 1 - quantile)
    return out


def entropies_of(seed: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged rows (one empty) of entropies in [0, 3), some tied."""
    inputs = random_inputs(seed, B=6, T=9)
    g = torch.Generator().manual_seed(seed)
    entropies = (torch.rand(6, 9, generator=g) * 3).to(dtype)
    entropies[:, ::3] = entropies[0, 0]  # ties at the threshold's side
    return entropies, inputs.mask


@pytest.mark.parametrize("quantile", [0.2, 0.5, 0.8, 1e-3])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_mask_is_trls(quantile: float, seed: int, dtype: torch.dtype) -> None:
    pytest.importorskip("trl")
    entropies, mask = entropies_of(seed, dtype)
    ours = high_entropy_mask(entropies, mask.bool(), quantile)
    assert torch.equal(ours.bool(), trl_mask(entropies, mask, quantile))


def test_no_counted_token_keeps_nothing() -> None:
    entropies = torch.rand(2, 3)
    assert not high_entropy_mask(entropies, torch.zeros(2, 3, dtype=torch.bool), 0.2).any()


def batch(seed: int) -> grpo.Batch:
    inputs = random_inputs(seed, B=6, T=9)
    entropies, _ = entropies_of(seed, torch.float64)
    return grpo.Batch(**inputs.batch_fields(), entropies=entropies)


@pytest.mark.parametrize("preset", ["trl-grpo", "trl-dapo", "trl-cispo", "trl-gspo", "verl-grpo"])
def test_the_mask_silences_the_policy_term_only(preset: str) -> None:
    """Per token: policy loss and policy gradient are the unmasked ones times the mask; the KL is untouched."""
    b = batch(3)
    whole = grpo.evaluate(b, grpo.LossConfig.from_preset(preset, dtype="float64", beta=0.04))
    masked = grpo.evaluate(b, grpo.LossConfig.from_preset(preset, dtype="float64", beta=0.04, top_entropy_quantile=0.2))
    kept = masked.tokens.policy_kept
    counted = b.mask
    assert 0 < kept[counted].sum() < counted.sum()  # some kept, some masked
    assert torch.equal(kept.bool(), high_entropy_mask(b.entropies, counted, 0.2).bool())  # type: ignore[arg-type]
    torch.testing.assert_close(masked.tokens.policy_loss, whole.tokens.policy_loss * kept, rtol=1e-12, atol=1e-15)
    if preset == "trl-gspo":
        # one ratio per row, the mean of all its log-ratios: a masked token's own term is 0, but the kept tokens'
        # terms still move it (as in TRL, where the (B, 1) loss is multiplied by the mask)
        assert (masked.tokens.grad_policy[counted & (kept == 0)] != 0).any()
    else:
        torch.testing.assert_close(masked.tokens.grad_policy, whole.tokens.grad_policy * kept, rtol=1e-12, atol=1e-15)
    assert torch.equal(masked.tokens.kl_loss, whole.tokens.kl_loss)
    assert torch.equal(masked.tokens.grad_kl, whole.tokens.grad_kl)
    # the loss is still the sum of the per-token shares
    torch.testing.assert_close(masked.loss, masked.tokens.loss.sum(), rtol=1e-12, atol=1e-15)


def test_masked_tokens_say_why() -> None:
    b = batch(4)
    bd = grpo.evaluate(b, grpo.LossConfig.from_preset("trl-grpo", dtype="float64", top_entropy_quantile=0.2))
    why = token_why(bd)
    code = why.names.index(ENTROPY_MASKED)
    masked = b.mask & (bd.tokens.policy_kept == 0)
    assert torch.equal(why.codes == code, masked)
    assert ENTROPY_MASKED in why.no_gradient and "top_entropy_quantile 0.2" in why.texts[ENTROPY_MASKED]


def test_without_entropies_the_mask_names_the_field() -> None:
    b = grpo.Batch(**random_inputs(0).batch_fields())
    with pytest.raises(grpo.GrpoInputError, match="entropies"):
        grpo.evaluate(b, grpo.LossConfig.from_preset("trl-grpo", top_entropy_quantile=0.2))


def test_from_trl_maps_the_quantile() -> None:
    pytest.importorskip("trl")
    from trl import GRPOConfig

    mapping = grpo.trainer_config.map_trl(
        GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, report_to=[], top_entropy_quantile=0.2)
    )
    assert mapping.config.top_entropy_quantile == 0.2 and "top_entropy_quantile" not in mapping.unsupported


def test_a_real_trl_run_with_the_mask_checks(tmp_path: Path) -> None:
    """A TRL 1.16 GRPOTrainer run on CPU with top_entropy_quantile=0.2, captured: every micro-batch's loss is
    the one TRL returned (check_run's float32 tolerance)."""
    pytest.importorskip("trl")
    from trainers import grpo_trainer

    import grpo.capture
    from grpo.check import check_run
    from grpo.runs import load_run

    trainer = grpo_trainer(tmp_path / "out", "grpo", steps=2, top_entropy_quantile=0.2)
    with grpo.capture.trl(trainer, tmp_path / "run"):
        trainer.train()
    check = check_run(load_run(tmp_path / "run"))
    assert check.ok and len(check.micro) == 4
    assert all(m.rel_error is not None and m.rel_error <= 1e-5 for m in check.micro)
