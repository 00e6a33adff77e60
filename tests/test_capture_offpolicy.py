"""A real TRL 1.16 GRPOTrainer run whose sampler disagrees with the trainer, captured and checked.

vLLM is not installable here: the completions and the sampler's log-probs come through TRL's own ``rollout_func``
hook (as vLLM's would: one log-prob per completion token, ``None`` where it could not score one), and
``use_vllm`` is turned on after construction with a stand-in for vLLM's weight sync only; generation scoring,
the importance-sampling ratio, the loss and its logging are TRL's code. Each micro-batch's file holds the sampler's
log-probs and the ratio TRL applied; check-run reproduces the loss and those weights, in each of TRL's four modes
and with the off-policy sequence mask, and fails once a file's sampler log-probs are altered.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from trainers import grpo_trainer, save_model

from grpo.check import IS_WEIGHT_CHECK, check_run
from grpo.corrections import SAMPLING_METRICS
from grpo.runs import load_run, read_metadata

pytest.importorskip("trl")
ROOT = Path(__file__).resolve().parent.parent


class Sampler:
    """TRL's ``rollout_func``: completions of the trainer's own tokens and log-probs a sampler gave them."""

    def __init__(self, seed: int) -> None:
        self.g = torch.Generator().manual_seed(seed)

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        tok = trainer.processing_class
        digits = tok.convert_tokens_to_ids(list("0123456789ab"))
        prompt_ids, completions, logprobs = [], [], []
        for i, prompt in enumerate(prompts):
            prompt_ids.append(tok(prompt if isinstance(prompt, str) else prompt["prompt"])["input_ids"])
            n = int(torch.randint(1, 9, (1,), generator=self.g))
            ids = [digits[int(j)] for j in torch.randint(0, len(digits), (n,), generator=self.g)]
            ids[-1] = tok.eos_token_id
            completions.append(ids)
            scored: list[float | None] = (-0.05 - 3 * torch.rand(n, generator=self.g, dtype=torch.float64)).tolist()
            if i == 1 and n > 1:
                scored[0] = None  # a token the sampler could not score
            logprobs.append(scored)
        return {"prompt_ids": prompt_ids, "completion_ids": completions, "logprobs": logprobs}


def offpolicy_run(root: Path, name: str, settings: dict[str, Any]) -> Path:
    import grpo.capture

    model = root / "model"
    if not model.exists():
        save_model(model)
    trainer = grpo_trainer(
        root / f"out-{name}",
        steps=2,
        model_dir=model,
        rollout_func=Sampler(seed=len(name)),
        max_completion_length=8,
        **settings,
    )
    # vLLM's weight sync is the only stand-in; TRL applies its correction when use_vllm is set
    trainer.use_vllm = trainer.args.use_vllm = True
    trainer.vllm_generation = SimpleNamespace(sync_weights=lambda: None)
    trainer._last_loaded_step = trainer.state.global_step
    with grpo.capture.trl(trainer, root / name):
        trainer.train()
    return root / name


MODES = {
    "token_truncate": {"vllm_importance_sampling_mode": "token_truncate"},
    "token_mask": {"vllm_importance_sampling_mode": "token_mask", "vllm_importance_sampling_clip_min": 0.2},
    "sequence_truncate": {"vllm_importance_sampling_mode": "sequence_truncate"},
    "sequence_mask": {"vllm_importance_sampling_mode": "sequence_mask"},
    "opsm": {"vllm_importance_sampling_mode": "sequence_mask", "off_policy_mask_threshold": 0.5},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("offpolicy")
    return {name: offpolicy_run(root, name, {"loss_type": "dapo", **s}) for name, s in MODES.items()}


@pytest.mark.parametrize("mode", list(MODES))
def test_each_mode_is_captured_and_reproduced(runs: dict[str, Path], mode: str) -> None:
    run = load_run(runs[mode])
    assert run.info["unsupported"] == {}  # every correction setting of the run was mapped
    check = check_run(run)
    assert check.ok, [
        (m.step, m.micro, m.rel_error, {k: v.diff for k, v in m.metrics.items() if not v.ok}) for m in check.micro
    ]
    assert len(check.micro) == 4 and all(m.rel_error is not None and m.rel_error <= 1e-5 for m in check.micro)
    # TRL's applied weights, token by token, and its logged sampling/* metrics of each loss call's step
    assert all(IS_WEIGHT_CHECK in m.metrics for m in check.micro)
    weights = [m.metrics[IS_WEIGHT_CHECK] for m in check.micro]
    assert any(abs(w.trainer - 1.0) > 1e-3 for w in weights)  # the correction acted
    # TRL logs sampling/* once per generation batch (step 1: rollout 1's first pass; step 2 reuses it and logs
    # none): recomputed over the generation's two micro-batches, they match what TRL logged
    first, second = check.steps
    assert set(SAMPLING_METRICS) <= set(first.metrics), sorted(first.metrics)
    assert all(first.metrics[name].ok for name in SAMPLING_METRICS)
    assert not set(SAMPLING_METRICS) & set(second.logged)


def test_an_altered_sampler_log_prob_fails_check_run(runs: dict[str, Path], tmp_path: Path) -> None:
    source = runs["token_truncate"]
    target = tmp_path / "altered"
    subprocess.run(["cp", "-r", str(source), str(target)], check=True)
    path = sorted((target / "steps").iterdir())[0]
    metadata = read_metadata(path.read_bytes())
    tensors = load_file(path)
    sampler = tensors["sampling_per_token_logps"]
    counted = tensors["completion_mask"].bool() & ~sampler.isnan()
    sampler[counted] -= 0.7  # the sampler scored every token lower: TRL's weights would have been others
    save_file(tensors, path, metadata=metadata)
    cli = [sys.executable, "-m", "grpo", "check-run", "--jobs", "1"]
    assert subprocess.run([*cli, str(source)], cwd=ROOT, capture_output=True).returncode == 0
    assert subprocess.run([*cli, str(target)], cwd=ROOT, capture_output=True).returncode == 1
