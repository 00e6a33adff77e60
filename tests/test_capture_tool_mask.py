"""A real TRL 1.16 GRPOTrainer run whose completions hold an environment's tokens, captured and checked.

TRL takes a tool's (an environment's) tokens out of the loss by ``tool_mask``: from its tool-call loop, or as
``env_mask`` from a ``rollout_func``, which is how this test gives it (no model here calls tools). The capture
keeps the mask apart from ``completion_mask`` (before, it folded the two), so a step file says which tokens were
the tool's: check-run reproduces TRL's loss with it, the breakdown names those tokens, and leaving the mask out
changes the loss past check-run's tolerance.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from test_capture_offpolicy import Sampler
from trainers import grpo_trainer, save_model

import grpo
from grpo.check import check_run
from grpo.explain import TOOL_OUTPUT, token_why
from grpo.runs import load_run, load_step

pytest.importorskip("trl")


class ToolSampler(Sampler):
    """Sampler's completions, each with a run of 1-3 tokens in its middle marked as an environment's (env_mask 0)."""

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        out = super().__call__(prompts, trainer)
        masks = []
        for ids in out["completion_ids"]:
            mask = [1] * len(ids)
            if len(ids) >= 4:
                start = int(torch.randint(1, len(ids) - 2, (1,), generator=self.g))
                for j in range(start, min(start + int(torch.randint(1, 4, (1,), generator=self.g)), len(ids) - 1)):
                    mask[j] = 0
            masks.append(mask)
        return {**out, "env_mask": masks}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import grpo.capture

    root = tmp_path_factory.mktemp("tools")
    save_model(root / "model")
    trainer = grpo_trainer(root / "out", "dapo", steps=2, model_dir=root / "model", rollout_func=ToolSampler(seed=7))
    with grpo.capture.trl(trainer, root / "run"):
        trainer.train()
    return root / "run"


def test_the_tool_tokens_are_captured_apart_and_the_run_checks(run: Path) -> None:
    loaded = load_run(run)
    check = check_run(loaded)
    assert check.ok, [c for c in check.micro if not c.ok]
    tools = 0
    for ref in loaded.steps:
        batch, config, info = load_step(ref.path)
        assert batch.tool_output is not None  # the step file holds the tool mask, not a folded completion mask
        bd = grpo.evaluate(batch, config)
        why = token_why(bd)
        n = int(batch.tool_output.sum())
        tools += n
        assert why.counts()[TOOL_OUTPUT] == n
        assert not bool((batch.tool_output & batch.mask).any())  # a tool's token never counts
        if n:  # left out, the tool's tokens would count: the trainer's loss is then not reproduced
            folded = dataclasses.replace(batch, extra={})
            trainer = float(info["meta"]["loss"])
            assert abs(float(grpo.evaluate(folded, config).loss) - trainer) > 1e-4 * max(abs(trainer), 1e-3)
    assert tools > 0
