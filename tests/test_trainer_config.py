"""grpo.trainer_config and the trainer scaling fields: hand-derived cases and loop references."""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any

import pytest
import torch

import grpo
from grpo.trainer_config import map_trl


def batch() -> grpo.Batch:
    # 2 rows: lengths 2 and 1; ratio 1 (on-policy), advantages +1 and -1, beta 0:
    # per-token loss l = -A (ratio 1): row 0 tokens -1, -1; row 1 token +1.
    return grpo.Batch(
        per_token_logps=[[-0.5, -0.7], [-0.2, 0.0]],
        completion_mask=[[1, 1], [1, 0]],
        advantages=[1.0, -1.0],
    )


@pytest.mark.parametrize(
    ("aggregation", "fields", "expected"),
    [
        ("token-mean", {}, (-1 - 1 + 1) / 3),
        ("token-mean", {"token_normalizer": 6.0}, (-1 - 1 + 1) / 6),  # TRL dapo: a generation batch of 6 tokens
        ("token-mean", {"gradient_accumulation_steps": 2}, (-1 - 1 + 1) / 3 / 2),  # TRL bnpo
        ("seq-mean-token-sum", {}, (-2 + 1) / 2),
        ("seq-mean-token-sum", {"sequence_normalizer": 8.0}, (-2 + 1) / 8),  # verl global_batch_size 8
        (
            "seq-mean-token-sum-norm",
            {"max_completion_length": 4, "gradient_accumulation_steps": 2},
            (-2 + 1) / (2 * 4) / 2,
        ),
    ],
)
def test_scaling_fields_divide_the_loss(aggregation: str, fields: dict[str, Any], expected: float) -> None:
    config = grpo.LossConfig(aggregation=aggregation, beta=0.0, dtype="float64", **fields)
    bd = grpo.evaluate(batch(), config)
    assert float(bd.loss) == pytest.approx(expected, rel=1e-12)
    assert float(bd.tokens.loss.sum()) == pytest.approx(expected, rel=1e-12)
    # the gradient scales with the loss: d loss / d logp = -A * weight
    unscaled = grpo.evaluate(batch(), grpo.LossConfig(aggregation=aggregation, beta=0.0, dtype="float64"))
    factor = float(bd.loss) / float(unscaled.loss)
    torch.testing.assert_close(bd.tokens.grad, unscaled.tokens.grad * factor, rtol=1e-12, atol=0)


def test_low_min_and_high_max_are_over_sequences() -> None:
    """TRL: min (max) over rows of each row's clipped fraction; checked against a plain loop."""
    g = torch.Generator().manual_seed(3)
    old = -torch.rand(5, 6, generator=g) - 0.1
    logp = (old + 0.5 * torch.randn(5, 6, generator=g)).clamp(max=-1e-3)
    mask = torch.ones(5, 6)
    mask[1, 2:] = 0
    mask[4] = 0  # a row with no token: skipped (TRL's nanmin / nanmax)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0])
    config = grpo.LossConfig.from_preset("trl-grpo", dtype="float64")
    bd = grpo.evaluate(grpo.Batch(logp, old, completion_mask=mask, advantages=adv), config)
    low, high = [], []
    for i in range(5):
        n = int(mask[i].sum())
        if n == 0:
            continue
        r = [math.exp(float(logp[i, t] - old[i, t])) for t in range(6) if mask[i, t]]
        a = float(adv[i])
        low.append(sum(x < 0.8 and a < 0 for x in r) / n)
        high.append(sum(x > 1.2 and a > 0 for x in r) / n)
    assert bd.metrics["clip_ratio/low_min"] == pytest.approx(min(low), abs=1e-12)
    assert bd.metrics["clip_ratio/high_max"] == pytest.approx(max(high), abs=1e-12)
    assert max(high) > 0


def test_from_trl_dict_maps_every_loss_field() -> None:
    config = grpo.LossConfig.from_trl(
        {"loss_type": "dr_grpo", "beta": 0.04, "epsilon": 0.1, "epsilon_high": None, "scale_rewards": False}
        | {"max_completion_length": 16, "gradient_accumulation_steps": 2, "use_bias_correction_kl": False}
    )
    assert (config.aggregation, config.epsilon_low, config.epsilon_high) == ("seq-mean-token-sum-norm", 0.1, 0.1)
    assert (config.advantage, config.beta, config.kl_bias_correction) == ("none", 0.04, False)
    assert (config.max_completion_length, config.gradient_accumulation_steps) == (16, 2)
    dapo = grpo.LossConfig.from_trl({"gradient_accumulation_steps": 4})  # TRL's default loss_type
    assert dapo.aggregation == "token-mean" and dapo.gradient_accumulation_steps == 1  # dapo: token_normalizer
    with pytest.raises(grpo.GrpoInputError, match="loss_type"):
        grpo.LossConfig.from_trl({"loss_type": "ppo"})  # vespo is mapped now (tests/test_vespo.py)


def test_the_settings_trl_once_left_out_are_mapped() -> None:
    """The high-entropy mask, the entropy bonus and a MoE router's loss are all reproduced now (tests/
    test_entropy_mask.py, test_entropy_bonus.py, test_moe_aux.py): no warning, and strict mode passes."""
    args = {"loss_type": "grpo", "top_entropy_quantile": 0.2, "entropy_coef": 0.01, "router_aux_loss_coef": 0.001}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config = grpo.LossConfig.from_trl(args, strict=True)
    assert map_trl(args).unsupported == {}
    assert (config.top_entropy_quantile, config.entropy_coef, config.aux_loss_coef) == (0.2, 0.01, 0.001)


def test_every_grpo_config_field_lands_somewhere() -> None:
    trl = pytest.importorskip("trl")
    args = trl.GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, report_to=[], loss_type="grpo")
    mapping = map_trl(args)
    fields = {f.name for f in dataclasses.fields(args) if not f.name.startswith("_")}
    placed = set(mapping.mapped) | set(mapping.captured) | set(mapping.unsupported) | set(mapping.unused)
    assert placed == fields
    assert {"loss_type", "beta", "epsilon", "scale_rewards", "max_completion_length"} <= set(mapping.mapped)
    assert "learning_rate" in mapping.unused and "num_generations" in mapping.captured
