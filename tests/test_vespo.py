"""TRL 1.16's ``vespo`` loss through GRPO Lens, against TRL's own ``GRPOTrainer._compute_loss``.

TRL's method runs on a stand-in trainer (one process: its gather and reduce are the identity) whose model call
returns the batch's log-probs as the variable, so the loss, its gradient per token and the logged
``vespo/phi_seq_mean`` are TRL's own, on ragged batches with an empty row and extreme ratios (sequence
log-weights past TRL's clamps at log 1e-8 and 20).
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from reference import Inputs, leaf, random_inputs

import grpo
from grpo.trainer_config import map_trl

pytestmark = pytest.mark.numerical  # run again under ATEN_CPU_CAPABILITY=default by make test

trl = pytest.importorskip("trl")


def trl_compute_loss(
    inputs: Inputs,
    entropies: torch.Tensor | None = None,
    last_world_entropy: float = 0.0,
    tool_mask: torch.Tensor | None = None,
    **settings: Any,
) -> tuple[Any, ...]:
    """(loss, d loss / d logp, metrics, the stand-in trainer) from TRL 1.16's ``GRPOTrainer._compute_loss`` on one
    process, train mode, one accumulation step; ``settings`` are GRPOConfig fields, ``last_world_entropy`` the
    adaptive entropy controller's state, ``tool_mask`` the batch's (TRL's multi-turn tool calls: its
    ``num_items_in_batch`` then counts completion_mask · tool_mask, as ``_generate_and_score_completions`` does)."""
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, report_to=[], **settings)
    lp = leaf(inputs.logp)
    B, T = lp.shape
    H = torch.zeros(B, T, dtype=lp.dtype) if entropies is None else entropies
    accelerator = SimpleNamespace(
        num_processes=1,
        sync_gradients=True,
        gather=lambda x: x,
        gather_for_metrics=lambda x: x,
        reduce=lambda x, reduction="sum": x,
        pad_across_processes=lambda x, **_: x,
    )
    stand_in: Any = SimpleNamespace(
        args=args,
        accelerator=accelerator,
        model=SimpleNamespace(training=True),
        loss_type=args.loss_type,
        beta=args.beta,
        epsilon_low=args.epsilon,
        epsilon_high=args.epsilon_high if args.epsilon_high is not None else args.epsilon,
        importance_sampling_level=args.importance_sampling_level,
        top_entropy_quantile=args.top_entropy_quantile,
        off_policy_mask_threshold=args.off_policy_mask_threshold,
        use_vllm=False,
        vllm_importance_sampling_correction=args.vllm_importance_sampling_correction,
        max_completion_length=args.max_completion_length,
        current_gradient_accumulation_steps=1,
        entropy_coef=args.entropy_coef,
        use_adaptive_entropy=args.use_adaptive_entropy,
        _entropy_bonus_enabled=args.entropy_coef != 0.0 or args.use_adaptive_entropy,
        _last_world_entropy=last_world_entropy,
        _entropy_window_stats=None,
        aux_loss_enabled=False,
        _metrics={"train": defaultdict(list)},
        get_gamma_weights=GRPOTrainer.get_gamma_weights,
        get_high_entropy_mask=lambda *a: GRPOTrainer.get_high_entropy_mask(stand_in, *a),
        _get_per_token_logps_and_entropies=lambda *a, **k: (lp, H, None),
    )
    batch = {
        "prompt_ids": torch.zeros(B, 0, dtype=torch.long),
        "prompt_mask": torch.zeros(B, 0, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": inputs.mask,
        "advantages": inputs.advantages,
        "old_per_token_logps": inputs.old.nan_to_num(0.0),
        "ref_per_token_logps": inputs.ref.nan_to_num(0.0),
        "num_items_in_batch": inputs.mask.sum() if tool_mask is None else (inputs.mask * tool_mask).sum(),
    }
    if tool_mask is not None:
        batch["tool_mask"] = tool_mask
    loss = GRPOTrainer._compute_loss(stand_in, None, batch)
    (grad,) = torch.autograd.grad(loss, lp)
    metrics = {name: values[-1] for name, values in stand_in._metrics["train"].items()}
    return loss.detach(), grad, metrics, stand_in


def lens(inputs: Inputs, entropies: torch.Tensor | None = None, **settings: Any) -> grpo.Breakdown:
    mapping = map_trl(settings)
    assert not mapping.unsupported, mapping.unsupported
    config = grpo.LossConfig.resolve({"dtype": "float64"}, base=mapping.config)
    return grpo.evaluate(grpo.Batch(**inputs.batch_fields(), entropies=entropies), config)


def extreme_inputs(seed: int) -> Inputs:
    """Rows whose summed log-ratio passes 20 (w capped at e^20: φ underflows to 0) and log 1e-8 (w = 1e-8)."""
    x = random_inputs(seed, B=8, T=9, noise=0.3)
    logp, old, mask = x.logp.clone(), x.old.clone(), x.mask.clone()
    mask[0], mask[1] = 1.0, 1.0
    logp[0], old[0] = -0.5, -3.5  # Σ log r = 9 · 3 = 27 > 20
    logp[1], old[1] = -4.0, -0.5  # Σ log r = -31.5 < log 1e-8
    ref = x.ref.clone()
    ref[:2] = logp[:2] - 0.1
    return Inputs(logp, old, ref, mask, x.advantages, x.rewards, x.group_size)


def check(bd: grpo.Breakdown, loss: Any, grad: Any, metrics: dict[str, float]) -> None:
    scale = float(bd.tokens.loss.abs().sum()) + 1.0
    torch.testing.assert_close(bd.loss, loss, rtol=1e-11, atol=1e-14 * scale)
    torch.testing.assert_close(bd.tokens.grad, grad, rtol=1e-10, atol=1e-14 * scale)
    for name in ("vespo/phi_seq_mean", "kl", "entropy_coef", "policy_loss"):
        if name in metrics and name in bd.metrics:
            assert bd.metrics[name] == pytest.approx(metrics[name], rel=1e-10, abs=1e-14), name


SETTINGS = [
    {"loss_type": "vespo"},
    {"loss_type": "vespo", "beta": 0.04},
    {"loss_type": "vespo", "vespo_k_pos": 1.0, "vespo_lambda_pos": 0.5, "vespo_k_neg": 4.0, "vespo_lambda_neg": 0.0},
]


@pytest.mark.parametrize("settings", SETTINGS, ids=str)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vespo_is_trls(settings: dict[str, Any], seed: int) -> None:
    inputs = random_inputs(seed, B=8, T=9, noise=0.3)
    loss, grad, metrics, _ = trl_compute_loss(inputs, **settings)
    bd = lens(inputs, **settings)
    check(bd, loss, grad, metrics)
    assert "vespo/phi_seq_mean" in metrics


@pytest.mark.parametrize("seed", [0, 1])
def test_vespo_clamps_like_trl(seed: int) -> None:
    inputs = extreme_inputs(seed)
    loss, grad, metrics, _ = trl_compute_loss(inputs, loss_type="vespo")
    bd = lens(inputs, loss_type="vespo")
    check(bd, loss, grad, metrics)
    phi = bd.tokens.clipped_ratio[:2, 0]
    assert phi[0] == 0 and phi[1] < 1e-6  # far off-policy rows are damped to (almost) nothing, not clipped
    assert torch.isfinite(bd.tokens.grad).all()


def test_phi_is_one_on_policy_and_detached() -> None:
    """φ(1) = e^λ·1·e^−λ = 1: on-policy VESPO is REINFORCE A·logp (gradient -A·weight per token)."""
    inputs = random_inputs(3)
    on = Inputs(inputs.logp, inputs.logp, inputs.ref, inputs.mask, inputs.advantages, inputs.rewards, 3)
    bd = lens(on, loss_type="vespo")
    counted = bd.tokens.mask
    torch.testing.assert_close(bd.tokens.clipped_ratio[counted], torch.ones_like(bd.tokens.clipped_ratio[counted]))
    expected = -(bd.advantages[:, None] * bd.tokens.weight)
    torch.testing.assert_close(bd.tokens.grad[counted], expected.expand_as(bd.tokens.grad)[counted])


def test_map_trl_maps_vespo() -> None:
    mapping = map_trl({"loss_type": "vespo", "vespo_k_pos": 1.5})
    assert mapping.config.objective == "vespo" and mapping.config.vespo_k_pos == 1.5
    assert mapping.config.aggregation == "token-mean" and not mapping.unsupported


def test_a_real_trl_vespo_run_checks(tmp_path: Any) -> None:
    """A TRL 1.16 GRPOTrainer run on CPU with loss_type='vespo' (GA 2, num_iterations 2: off-policy rows),
    captured: every micro-batch's loss is the one TRL returned (check_run's float32 tolerance)."""
    from trainers import grpo_trainer

    import grpo.capture
    from grpo.check import check_run
    from grpo.runs import load_run

    trainer = grpo_trainer(tmp_path / "out", "vespo", steps=2)
    with grpo.capture.trl(trainer, tmp_path / "run"):
        trainer.train()
    check = check_run(load_run(tmp_path / "run"))
    assert check.ok and len(check.micro) == 4
    assert all(m.rel_error is not None and m.rel_error <= 1e-5 for m in check.micro)
