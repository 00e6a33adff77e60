"""Real trainers on CPU for the capture tests: a tiny random Qwen2 built from a config, a character
tokenizer built in code, prompts made here (nothing from a hub)."""

from __future__ import annotations

import os
import string
from pathlib import Path
from typing import Any

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing from a hub: the model is built here
CHARS = string.ascii_lowercase + string.digits + " +="
PROMPTS = [f"{a}+{b}=" for a in range(4) for b in range(4)]  # 16 prompts


def char_tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate(CHARS)}}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", padding_side="left")


def tiny_qwen2(tokenizer: Any, seed: int = 0) -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(config)


def save_model(model_dir: Path) -> None:
    tokenizer = char_tokenizer()
    tiny_qwen2(tokenizer).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)


def digit_reward(completions: list[str], **kwargs: Any) -> list[float]:
    """A reward with spread inside groups: the share of digits in the completion."""
    return [sum(c.isdigit() for c in text) / max(len(text), 1) for text in completions]


def grpo_trainer(
    output_dir: Path,
    loss_type: str,
    steps: int = 4,
    model_dir: Path | None = None,
    rollout_func: Any = None,
    **overrides: Any,
) -> Any:
    """A TRL 1.16 GRPOTrainer on CPU: 16 prompts, num_generations 4, accumulation 2, num_iterations 2, beta 0.04.

    ``model_dir``: the model saved there already (several processes of one run share it; another architecture),
    else saved here. ``rollout_func``: TRL's hook giving completions and the sampler's log-probs."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = char_tokenizer()
    settings: dict[str, Any] = {
        "output_dir": str(output_dir),
        "loss_type": loss_type,
        "beta": 0.04,
        "num_generations": 4,
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 2,
        "num_iterations": 2,
        "max_completion_length": 16,
        "max_steps": steps,
        "learning_rate": 5e-3,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": [],
        "use_cpu": True,
        "bf16": False,
        "seed": 0,
        "dataloader_num_workers": 0,
        "disable_tqdm": True,
        **overrides,
    }
    args = GRPOConfig(**settings)
    if model_dir is None:
        model_dir = Path(output_dir) / "model"  # the reference model is loaded from a path: save it there
        save_model(model_dir)
    return GRPOTrainer(
        model=str(model_dir),
        reward_funcs=digit_reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        processing_class=tokenizer,
        rollout_func=rollout_func,
    )


def end_process_group() -> None:
    """Close this process's gloo group before Python exits: left to the interpreter's teardown, gloo's threads
    are destroyed while still joinable and a rank aborts ("terminate called without an active exception",
    SIGABRT) after the run has finished and written everything; torchrun then fails the whole launch. The barrier
    lets no rank close while another still sends."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
