"""A Mixture-of-Experts model's router loss: TRL 1.16 adds router_aux_loss_coef · aux_loss / GA to the loss.

The router loss comes from the router's logits, not the tokens' log-probs, so it cannot be recomputed: the
capture records the value the model returned with each micro-batch, and the check adds it. A real GRPOTrainer
run of a tiny Qwen2-MoE (4 experts, 2 per token, built from a config) is captured and checked; without the
captured router loss the same micro-batches miss the trainer's returned loss.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from trainers import char_tokenizer, grpo_trainer

import grpo
from grpo.check import check_run
from grpo.errors import GrpoInputError
from grpo.runs import load_run, load_step
from grpo.trainer_config import map_trl

pytest.importorskip("trl")


def tiny_moe(model_dir: Path) -> None:
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    tokenizer = char_tokenizer()
    torch.manual_seed(0)
    config = Qwen2MoeConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=64,
        router_aux_loss_coef=0.01,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    Qwen2MoeForCausalLM(config).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)


@pytest.fixture(scope="module")
def moe_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import grpo.capture

    root = tmp_path_factory.mktemp("moe")
    tiny_moe(root / "model")
    overrides = {"beta": 0.0, "num_iterations": 1, "max_completion_length": 8}
    trainer = grpo_trainer(root / "out", "grpo", steps=2, model_dir=root / "model", **overrides)
    assert trainer.aux_loss_enabled and trainer.router_aux_loss_coef == 0.01  # the model's own coefficient
    with grpo.capture.trl(trainer, root / "run"):
        trainer.train()
    return root / "run"


def test_the_router_loss_is_captured_and_the_run_checks(moe_run: Path) -> None:
    run = load_run(moe_run)
    assert "router_aux_loss_coef" not in run.info["unsupported"]
    check = check_run(run)
    assert check.ok and len(check.micro) == 4
    assert all(m.rel_error is not None and m.rel_error <= 1e-5 for m in check.micro)
    for ref in run.steps:
        batch, config, info = load_step(ref.path)
        assert config.aux_loss_coef == 0.01 and config.aux_loss == info["meta"]["scaling"]["aux_loss"] > 0
        bd = grpo.evaluate(batch, config)
        # loss = policy + KL + 0.01 · aux / GA(2), the router part apart and in no token
        assert float(bd.aux_loss) == pytest.approx(0.01 * config.aux_loss / 2, rel=1e-6)
        assert float(bd.loss) == pytest.approx(float(bd.policy_loss + bd.kl_loss + bd.aux_loss), abs=1e-7)
        # without it the recomputed loss misses the trainer's by the router part
        plain = grpo.evaluate(batch, dataclasses.replace(config, aux_loss_coef=0.0))
        assert abs(float(plain.loss) - info["meta"]["loss"]) == pytest.approx(float(bd.aux_loss), rel=1e-3)


def test_a_coefficient_without_the_captured_value_names_it() -> None:
    batch = grpo.Batch(per_token_logps=-torch.rand(2, 3), advantages=torch.tensor([1.0, -1.0]))
    with pytest.raises(GrpoInputError) as caught:
        grpo.evaluate(batch, grpo.LossConfig(aux_loss_coef=0.01))
    assert caught.value.field == "aux_loss"


def test_map_trl_maps_the_coefficient() -> None:
    mapping: Any = map_trl({"router_aux_loss_coef": 0.02})
    assert mapping.config.aux_loss_coef == 0.02 and "router_aux_loss_coef" in mapping.mapped
