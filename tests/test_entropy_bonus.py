"""The entropy bonus: TRL 1.16's ``entropy_coef`` (static, and the coefficient an adaptive step applies) and
verl 0.9.1's ``entropy_coeff``, against the trainers' own loss functions on the same tensors.

TRL: ``GRPOTrainer._compute_loss`` on the one-process stand-in of tests/test_vespo.py (value, gradient and the
logged ``entropy_coef`` and ``policy_loss``), with and without the high-entropy mask, whose tokens the bonus
shares. verl: ``verl.workers.utils.losses.ppo_loss`` with the entropies in its model output (value and
``actor/entropy_loss``) under every loss_agg_mode. The entropies are inputs: the bonus moves the loss, never the
gradient with respect to the log-probs.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from reference import Inputs, random_inputs
from test_vespo import trl_compute_loss

import grpo
from grpo.trainer_config import map_trl, map_verl

pytestmark = pytest.mark.numerical  # run again under ATEN_CPU_CAPABILITY=default by make test


def entropies_of(inputs: Inputs, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(inputs.mask.shape, generator=g, dtype=torch.float64) * 3) * inputs.mask


def lens(inputs: Inputs, entropies: torch.Tensor, mapping: Any, **overrides: Any) -> grpo.Breakdown:
    assert not mapping.unsupported, mapping.unsupported
    config = grpo.LossConfig.resolve({"dtype": "float64", **overrides}, base=mapping.config)
    return grpo.evaluate(grpo.Batch(**inputs.batch_fields(), entropies=entropies), config)


TRL_SETTINGS = [
    {"loss_type": "grpo", "entropy_coef": 0.01},
    {"loss_type": "dapo", "entropy_coef": 0.3, "beta": 0.04},
    {"loss_type": "dapo", "entropy_coef": 0.3, "top_entropy_quantile": 0.5},
    {"loss_type": "vespo", "entropy_coef": 0.05},
    {"loss_type": "grpo", "entropy_coef": 0.02, "use_adaptive_entropy": True},  # last window's entropy 0: applied
]


@pytest.mark.parametrize("settings", TRL_SETTINGS, ids=str)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_trl_entropy_bonus(settings: dict[str, Any], seed: int) -> None:
    inputs = random_inputs(seed, B=8, T=9, noise=0.4)
    H = entropies_of(inputs, seed)
    loss, grad, metrics, _ = trl_compute_loss(inputs, H, **settings)
    bd = lens(inputs, H, map_trl(settings))
    scale = float(bd.tokens.loss.abs().sum()) + 1.0
    torch.testing.assert_close(bd.loss, loss, rtol=1e-11, atol=1e-14 * scale)
    torch.testing.assert_close(bd.tokens.grad, grad, rtol=1e-10, atol=1e-14 * scale)
    assert bd.metrics["policy_loss"] == pytest.approx(metrics["policy_loss"], rel=1e-10, abs=1e-14)
    if not settings.get("use_adaptive_entropy"):  # adaptive: TRL logs the coefficient after its update
        assert bd.metrics["entropy_coef"] == metrics["entropy_coef"]
    # its own term: the loss without it is the same config with entropy_coef 0, and the sum still holds
    off = lens(inputs, H, map_trl(settings), entropy_coef=0.0)
    assert bd.entropy_loss is not None and off.entropy_loss is None
    torch.testing.assert_close(bd.loss, off.loss + bd.entropy_loss, rtol=1e-12, atol=1e-14 * scale)
    torch.testing.assert_close(bd.tokens.loss.sum(), bd.loss, rtol=1e-12, atol=1e-14 * scale)
    assert torch.equal(bd.tokens.grad, off.tokens.grad)  # the entropies carry no gradient here
    assert float(bd.entropy_loss) < 0  # a bonus: it lowers the loss


def test_adaptive_step_that_applies_nothing() -> None:
    """TRL applies the coefficient only while the last window's entropy is at or below entropy_target (0.2 by
    default): above it the step adds nothing, which GRPO Lens reproduces with the step's coefficient, 0."""
    inputs = random_inputs(3, B=8, T=9)
    H = entropies_of(inputs, 3)
    settings = {"loss_type": "grpo", "entropy_coef": 0.02, "use_adaptive_entropy": True}
    loss, _, _, trainer = trl_compute_loss(inputs, H, last_world_entropy=5.0, **settings)
    assert trainer.entropy_coef == pytest.approx(0.02 - 0.005)  # the controller moved it down for the next step
    bd = lens(inputs, H, map_trl(settings), entropy_coef=0.0)
    torch.testing.assert_close(bd.loss, loss, rtol=1e-11, atol=1e-14)
    assert "use_adaptive_entropy" in map_trl(settings).mapped


def verl_ppo_loss(config: Any, inputs: Inputs, entropies: torch.Tensor) -> tuple[float, dict[str, Any]]:
    """verl's actor loss with the model output (log-probs and entropies) in its no-padding layout."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import ppo_loss

    B, T = inputs.mask.shape
    P = 2
    lengths = inputs.mask.sum(-1).long().tolist()
    flat: dict[str, list[torch.Tensor]] = {"log_probs": [], "entropy": []}
    for i in range(B):  # each sequence is prompt + response; position t scores token t + 1
        for key, values in (("log_probs", inputs.logp.nan_to_num(0.0)), ("entropy", entropies)):
            segment = torch.zeros(P + lengths[i], dtype=torch.float64)
            segment[P - 1 : P - 1 + lengths[i]] = values[i, : lengths[i]]
            flat[key].append(segment)
    data = TensorDict(
        {
            "prompts": torch.ones(B, P, dtype=torch.long),
            "responses": torch.ones(B, T, dtype=torch.long),
            "attention_mask": torch.cat([torch.ones(B, P), inputs.mask], 1).long(),
            "response_mask": inputs.mask,
            "old_log_probs": inputs.old.nan_to_num(0.0),
            "advantages": inputs.advantages[:, None] * inputs.mask,
            "ref_log_prob": inputs.ref.nan_to_num(0.0),
        },
        batch_size=[B],
    )
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=None, global_batch_size=None)
    loss, metrics = ppo_loss(config, {key: torch.cat(parts) for key, parts in flat.items()}, data)
    return float(loss), metrics


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("seed", [0, 1])
def test_verl_entropy_coeff(agg: str, seed: int) -> None:
    pytest.importorskip("verl")
    from verl.workers.config import ActorConfig, PolicyLossConfig

    fields = {"loss_agg_mode": agg, "entropy_coeff": 0.01, "use_kl_loss": True, "kl_loss_coef": 0.04}
    config = ActorConfig(
        strategy="fsdp",
        rollout_n=4,
        ppo_mini_batch_size=8,
        ppo_micro_batch_size_per_gpu=4,
        policy_loss=PolicyLossConfig(),
        **fields,
    )
    inputs = random_inputs(seed, B=8, T=9, noise=0.4, empty_rows=0)
    H = entropies_of(inputs, seed)
    loss, metrics = verl_ppo_loss(config, inputs, H)
    mapping = map_verl(config)
    # verl's horizon is the padded width; ppo_loss hands agg_loss a bool mask, whose int64 row lengths + 1e-8
    # become float32, where the 1e-8 rounds away: the actor divides by L itself, not L + 1e-8
    bd = lens(inputs, H, mapping, max_completion_length=inputs.mask.shape[1], length_epsilon=0.0)
    assert float(bd.loss) == pytest.approx(loss, rel=1e-9, abs=1e-12)
    assert bd.metrics["actor/entropy_loss"] == pytest.approx(float(metrics["actor/entropy_loss"].aggregate()), rel=1e-9)
    assert mapping.config.entropy_coef == 0.01 and mapping.config.entropy_weighting == "aggregation"


def test_the_bonus_needs_the_entropies() -> None:
    batch = grpo.Batch(**random_inputs(0).batch_fields())
    with pytest.raises(grpo.GrpoInputError, match="entropies"):
        grpo.evaluate(batch, grpo.LossConfig.from_preset("trl-dapo", entropy_coef=0.01))


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_a_real_trl_run_with_the_bonus_checks(tmp_path: Any, loss_type: str) -> None:
    """A TRL 1.16 GRPOTrainer run on CPU with entropy_coef 0.05 (GA 2: TRL divides the bonus by it for every loss
    type), captured: every micro-batch's loss is the one TRL returned (check_run's float32 tolerance)."""
    pytest.importorskip("trl")
    from trainers import grpo_trainer

    import grpo.capture
    from grpo.check import check_run
    from grpo.runs import load_run

    trainer = grpo_trainer(tmp_path / "out", loss_type, steps=2, entropy_coef=0.05)
    with grpo.capture.trl(trainer, tmp_path / "run"):
        trainer.train()
    check = check_run(load_run(tmp_path / "run"))
    assert check.ok and len(check.micro) == 4
    assert all(m.rel_error is not None and m.rel_error <= 1e-5 for m in check.micro)


def test_a_real_adaptive_run_records_each_step_s_coefficient(tmp_path: Any) -> None:
    """use_adaptive_entropy: the first step applies 0 (no window measured yet: TRL starts its last entropy at inf);
    with entropy_target above the tiny model's entropy (~3.7 nats) every later step applies the controller's
    coefficient, raised by entropy_coef_delta after each step. The capture records what each call applied."""
    pytest.importorskip("trl")
    from trainers import grpo_trainer

    import grpo.capture
    from grpo.check import check_run
    from grpo.runs import load_run, load_step

    settings = {"entropy_coef": 0.05, "use_adaptive_entropy": True, "entropy_target": 10.0, "entropy_coef_delta": 0.01}
    trainer = grpo_trainer(tmp_path / "out", "grpo", steps=3, **settings)
    with grpo.capture.trl(trainer, tmp_path / "run"):
        trainer.train()
    run = load_run(tmp_path / "run")
    applied = [load_step(ref.path)[1].entropy_coef for ref in run.steps]
    # step 1: 0; step 2: 0.05 + 0.01 (raised after step 1); step 3: 0.07: two micro-batches each
    assert applied == pytest.approx([0.0, 0.0, 0.06, 0.06, 0.07, 0.07])
    check = check_run(run)
    assert check.ok and all(m.rel_error is not None and m.rel_error <= 1e-5 for m in check.micro)
    assert any("actor/entropy_loss" in m.metrics or "policy_loss" in m.metrics for m in check.micro[2:])
