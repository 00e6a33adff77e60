"""grpo.capture.trl on a real TRL 1.16 GRPOTrainer run on CPU, then check-run per micro-batch.

The run is the TRL capture's own: a tiny random Qwen2 built from a config, a character
tokenizer built in code, 16 prompts, num_generations 4, gradient accumulation 2, num_iterations 2,
beta 0.04, 4 optimiser steps, for loss types grpo, dapo and dr_grpo. Every captured micro-batch
must give the loss the trainer returned (relative error <= 1e-5 in float32) and the metrics it
logged (to 1e-6), and each step's logged metrics must be the plain mean over its micro-batches.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo.check import check_run
from grpo.runs import load_run, load_step

pytest.importorskip("trl")
from conftest import LOSS_TYPES

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def runs(trl_runs: dict[str, Path]) -> dict[str, Path]:
    return trl_runs


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_every_micro_batch_checks(runs: dict[str, Path], loss_type: str) -> None:
    run = load_run(runs[loss_type])
    assert run.info["source"] == "trl" and run.info["status"] == "done" and run.info["versions"]["trl"] == "1.16.0"
    # 4 optimiser steps of 2 micro-batches (gradient accumulation 2), counted from 1 and 0
    assert [(s.step, s.micro) for s in run.steps] == [(step, micro) for step in range(1, 5) for micro in range(2)]
    check = check_run(run)
    assert check.ok
    for m in check.micro:
        assert m.rel_error is not None and m.rel_error <= 1e-5
        # the loss calls' own metrics, compared to 1e-6; the KL is there since beta = 0.04
        assert {"kl", "entropy", "clip_ratio/region_mean", "clip_ratio/low_min", "clip_ratio/high_max"} <= set(
            m.metrics
        )
        assert all(v.diff <= 1e-6 for v in m.metrics.values())
    # num_iterations 2: the second pass over each generation batch is off-policy, so the clip acts
    assert any(m.metrics["clip_ratio/region_mean"].trainer > 0 for m in check.micro)
    # each step's logged metrics are the plain mean over its micro-batches (the loss calls' metrics)
    for s in check.steps:
        assert {"kl", "entropy", "clip_ratio/region_mean"} <= set(s.metrics) and s.ok
        assert s.trainer_loss == pytest.approx(s.logged["loss"], abs=1e-6)  # HF logs the sum of returned losses
        assert set(s.lens_token_weighted) >= {"kl", "clip_ratio/region_mean"}


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_step_files_hold_what_the_loss_used(runs: dict[str, Path], loss_type: str) -> None:
    run = load_run(runs[loss_type])
    batch, config, info = load_step(run.steps[0].path)
    assert config.beta == 0.04 and config.max_completion_length == 16 and config.advantage_epsilon == 1e-4
    assert batch.ref_per_token_logps is not None and batch.entropies is not None
    assert batch.logp.dtype == torch.float32
    groups, rewards = info["tensors"]["row_groups"], info["tensors"]["row_rewards"]
    assert groups.shape == rewards.shape == (4,)  # per_device_train_batch_size rows per micro-batch
    all_groups = torch.cat([load_step(r.path)[2]["tensors"]["row_groups"] for r in run.micro_batches(1)])
    assert sorted(torch.bincount(all_groups).tolist()) == [4, 4]  # 2 prompts x num_generations 4, shuffled
    scaling = info["meta"]["scaling"]
    if loss_type == "dapo":  # divided by the generation batch's tokens (1 process, GA = steps_per_generation)
        assert config.token_normalizer == scaling["num_items_in_batch"] and config.gradient_accumulation_steps == 1
    else:
        assert config.gradient_accumulation_steps == 2 and config.token_normalizer is None


def test_check_run_cli_and_eval_of_a_step_file(runs: dict[str, Path]) -> None:
    """The real entry points, in a fresh interpreter; a tampered loss makes check-run exit 1."""
    run_dir = runs["dapo"]

    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "grpo", *argv], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
        )

    done = cli("check-run", str(run_dir), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ok"] is True
    first = load_run(run_dir).steps[0].path
    batch, config, info = load_step(first)
    evaluated = cli("eval", str(first), "--json")
    assert evaluated.returncode == 0 and json.loads(evaluated.stdout)["loss"] == pytest.approx(
        info["meta"]["loss"], rel=1e-5
    )

    from grpo.runs import RunWriter

    tampered = RunWriter(run_dir.parent / "tampered", "trl", config)
    tensors = {
        "per_token_logps": batch.logp,
        "old_per_token_logps": batch.old_per_token_logps,
        "ref_per_token_logps": batch.ref_per_token_logps,
        "entropies": batch.entropies,
        "advantages": batch.advantages,
        "completion_mask": batch.mask_float,
    }
    tampered.write_step(1, 0, tensors, {**info["meta"], "loss": info["meta"]["loss"] * 1.001}, config=config)
    failed = cli("check-run", str(run_dir.parent / "tampered"))
    assert failed.returncode == 1 and "differ" in failed.stdout


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_each_step_file_names_its_rollout_and_pass(runs: dict[str, Path], loss_type: str) -> None:
    """Gradient accumulation 2 (steps_per_generation 2: one generation batch per optimiser step) and
    num_iterations 2: TRL generates at micro-steps 0 and 4, and trains each batch twice, so steps 1 and 2
    train on rollout 1 (passes 1 and 2), steps 3 and 4 on rollout 2."""
    run = load_run(runs[loss_type])
    seen = []
    for ref in run.steps:
        r = load_step(ref.path)[2]["meta"]["rollout"]
        assert (r["iterations"], r["steps_per_generation"]) == (2, 2)
        seen.append((ref.step, r["rollout"], r["iteration"]))
    assert seen == [(s, (s + 1) // 2, 2 - s % 2) for s in range(1, 5) for _ in range(2)]
