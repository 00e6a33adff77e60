"""TRL 1.16.0's rollout correction, reproduced: a real ``GRPOTrainer`` computes the weights and the loss.

TRL computes the importance-sampling ratio in ``_generate_and_score_completions`` (old vs sampler log-probs,
once per generation batch) and applies it, with the off-policy sequence mask, in ``_compute_loss``. Both run
here as TRL wrote them, on one tiny CPU trainer: the sampler's log-probs come in through TRL's own
``rollout_func`` hook (it returns ``logprobs``; ``None`` where vLLM could not score a token), and ``use_vllm``
is turned on after construction, with a stand-in for vLLM's weight sync only. The model's forward is replaced
by chosen float64 tensors (old, reference and current log-probs), so the trainer's numbers are functions of
the same tensors GRPO Lens gets: value and gradient agree to float64 round-off, as do the weights TRL
applied and its logged ``sampling/*`` metrics. Rows are ragged; one is empty (TRL's
``mask_truncated_completions`` drops a completion without EOS); some tokens are unscored.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import grpo
from grpo.corrections import CORRECTION_CODES
from grpo.trainer_config import map_trl

pytest.importorskip("trl")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
pytestmark = pytest.mark.numerical

B, NUM_GENERATIONS = 8, 4
RTOL, ATOL = 1e-10, 1e-12
MODES = ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]


class Rollout:
    """TRL's ``rollout_func``: the completions and the sampler's log-probs of the current case."""

    def __init__(self) -> None:
        self.output: dict[str, Any] = {}

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        assert len(prompts) == len(self.output["prompt_ids"])
        return self.output


@pytest.fixture(scope="module")
def trainer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from datasets import Dataset
    from trainers import PROMPTS, char_tokenizer, digit_reward, tiny_qwen2
    from trl import GRPOConfig, GRPOTrainer

    out = tmp_path_factory.mktemp("trl-offpolicy")
    tokenizer = char_tokenizer()
    model_dir = Path(out) / "model"
    tiny_qwen2(tokenizer).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    args = GRPOConfig(
        output_dir=str(out),
        beta=0.04,
        num_generations=NUM_GENERATIONS,
        per_device_train_batch_size=B,
        gradient_accumulation_steps=1,
        max_completion_length=8,
        mask_truncated_completions=True,
        report_to=[],
        use_cpu=True,
        bf16=False,
        seed=0,
        disable_tqdm=True,
    )
    rollout = Rollout()
    trainer = GRPOTrainer(
        model=str(model_dir),
        reward_funcs=digit_reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        processing_class=tokenizer,
        rollout_func=rollout,
    )
    trainer.rollout = rollout
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    # vLLM itself is not installable here: only its weight sync is stood in for; the rest is TRL's code.
    trainer.use_vllm = True
    trainer.vllm_generation = SimpleNamespace(sync_weights=lambda: None)
    trainer._last_loaded_step = trainer.state.global_step
    return trainer


def make_case(seed: int, tokenizer: Any, scale: float) -> dict[str, Any]:
    """Ragged completions (row 5 without EOS: masked whole), log-probs old = current + noise, sampler =
    old + mismatch of size ``scale`` with NaN (None) on some tokens."""
    g = torch.Generator().manual_seed(seed)
    lengths = [8, 3, 6, 1, 7, 4, 8, 2]
    eos, digits = tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(list("0123456789ab"))
    completions = []
    for i, n in enumerate(lengths):
        ids = [digits[int(j)] for j in torch.randint(0, len(digits), (n,), generator=g)]
        if i != 5:
            ids[-1] = eos
        completions.append(ids)
    T = max(lengths)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 - 0.05
    logp = (old + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    ref = (old + 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    sampler = (old + scale * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    logprobs = [[float(sampler[i, t]) for t in range(n)] for i, n in enumerate(lengths)]
    logprobs[0][2] = None  # vLLM could not score these tokens
    logprobs[4][0] = None
    prompt = tokenizer("1+2=")["input_ids"]
    return {
        "rollout": {"prompt_ids": [prompt] * B, "completion_ids": completions, "logprobs": logprobs},
        "old": old,
        "logp": logp,
        "ref": ref,
    }


def run_trl(trainer: Any, case: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """TRL's own code: the generation step's weights and metrics, then ``_compute_loss`` and its gradient."""
    for name, value in settings.items():
        setattr(trainer, name, value)
        if hasattr(trainer.args, name):
            setattr(trainer.args, name, value)
    trainer.rollout.output = case["rollout"]
    leaf = case["logp"].clone().requires_grad_(True)

    def forward(model: Any, *args: Any, compute_entropy: bool = False, **kwargs: Any) -> Any:
        if model is trainer.ref_model:
            return case["ref"], None, None
        if compute_entropy:  # _compute_loss: the current policy, the variable
            return leaf, torch.zeros_like(leaf), None
        return case["old"], None, None  # _generate_and_score_completions: the old policy

    trainer._get_per_token_logps_and_entropies = forward
    trainer._metrics["train"].clear()
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # TRL builds the sampler tensor with torch.tensor(list)
    try:
        inputs = trainer._generate_and_score_completions([{"prompt": "1+2="}] * B)
    finally:
        torch.set_default_dtype(default)
    loss = trainer._compute_loss(trainer.model, inputs)
    (grad,) = torch.autograd.grad(loss, leaf)
    logged = {k: v[-1] for k, v in trainer._metrics["train"].items() if k.startswith("sampling/")}
    return {"inputs": inputs, "loss": loss.detach(), "grad": grad, "metrics": logged}


def run_lens(trl: dict[str, Any], case: dict[str, Any], settings: dict[str, Any]) -> grpo.Breakdown:
    inputs = trl["inputs"]
    config = map_trl({**settings, "beta": 0.04, "gradient_accumulation_steps": 1}).config
    batch = grpo.Batch(
        per_token_logps=case["logp"],
        old_per_token_logps=inputs["old_per_token_logps"],
        ref_per_token_logps=case["ref"],
        completion_mask=inputs["completion_mask"],
        advantages=inputs["advantages"],
        rollout_log_probs=inputs["sampling_per_token_logps"],
    )
    return grpo.evaluate(batch, config.replace(dtype="float64"))


CASES = [
    *({"loss_type": "dapo", "vllm_importance_sampling_mode": m} for m in MODES),
    *(
        {"loss_type": "grpo", "vllm_importance_sampling_mode": m, "vllm_importance_sampling_clip_min": 0.5}
        for m in MODES
    ),
    {
        "loss_type": "dapo",
        "vllm_importance_sampling_mode": "token_truncate",
        "vllm_importance_sampling_clip_max": None,
        "vllm_importance_sampling_clip_min": 0.8,
    },
    {"loss_type": "dapo", "vllm_importance_sampling_mode": "sequence_mask", "off_policy_mask_threshold": 0.05},
    {"loss_type": "grpo", "vllm_importance_sampling_mode": "token_mask", "off_policy_mask_threshold": 0.0},
    {"loss_type": "grpo", "importance_sampling_level": "sequence", "vllm_importance_sampling_mode": "token_truncate"},
    {"loss_type": "cispo", "epsilon_high": 5.0, "vllm_importance_sampling_mode": "sequence_truncate"},
]


def trl_settings(case: dict[str, Any]) -> dict[str, Any]:
    """The trainer attributes and GRPOConfig fields each case sets (TRL's defaults for the rest)."""
    return {
        "vllm_importance_sampling_correction": True,
        "vllm_importance_sampling_clip_min": None,
        "vllm_importance_sampling_clip_max": 3.0,
        "off_policy_mask_threshold": None,
        "importance_sampling_level": "token",
        "epsilon_high": 0.2,
        "use_vllm": True,
        **case,
    }


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{v}" for v in c.values()))
@pytest.mark.parametrize("scale", [0.1, 1.0])
def test_value_gradient_weights_metrics_float64(trainer: Any, case: dict[str, Any], scale: float) -> None:
    settings = trl_settings(case)
    if settings["loss_type"] == "cispo":
        trainer.epsilon_high = settings["epsilon_high"]
    data = make_case(int(scale * 10), trainer.processing_class, scale)
    trl = run_trl(trainer, data, settings)
    bd = run_lens(trl, data, settings)
    mask = trl["inputs"]["completion_mask"].bool()
    assert not mask[5].any() and mask.any(-1).sum() == B - 1  # the empty row, TRL's own masking
    torch.testing.assert_close(bd.loss, trl["loss"], rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(bd.tokens.grad, trl["grad"] * mask, rtol=RTOL, atol=ATOL)
    applied = trl["inputs"]["importance_sampling_ratio"].expand(mask.shape)
    torch.testing.assert_close(bd.tokens.is_weight[mask], applied[mask], rtol=RTOL, atol=0.0)
    # the correction changed the number, and at the larger mismatch its bounds acted on some tokens
    assert abs(float(bd.loss - bd.loss_without_correction)) > 1e-6
    acted = {CORRECTION_CODES[c] for c in bd.tokens.correction[mask].tolist()} - {"kept", "not_scored"}
    assert acted or scale < 0.5
    assert set(trl["metrics"]) == {k for k in bd.metrics if k.startswith("sampling/")}
    for name, value in trl["metrics"].items():
        assert bd.metrics[name] == pytest.approx(value, rel=1e-12, abs=1e-12), name
