"""The lab's GRPO loop: sample groups, score them, and step the policy on ``grpo.compute_loss``.

One call to ``Trainer.step`` is one optimiser step. Every ``num_iterations`` steps a fresh
rollout is sampled (its log-probs become ``old_per_token_logps``); the steps in between reuse it,
so ratios leave 1 and clipping appears, as with TRL's ``num_iterations`` / verl's ppo_epochs.
The reference policy is a frozen copy of the initial one. Each step's batch and metrics can be
saved to a run (``grpo.runs.RunWriter``), so any step opens in the breakdown views.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

import grpo
from grpo import step_schema
from grpo.advantages import ADVANTAGES
from grpo.batch import Batch
from grpo.config import LossConfig
from grpo.errors import GrpoInputError
from grpo.fields import BATCH_FIELDS
from grpo.lab.policy import VOCAB, Policy, Rollout, frozen_copy, init_policy, sample
from grpo.lab.tasks import DEFAULT_TASK, Task, get_task
from grpo.logits import token_logprobs
from grpo.metrics import LAB_METRICS

METRICS: tuple[str, ...] = LAB_METRICS
"""What every step logs, under the trainers' names (TRL's where it has one)."""


LAB_INPUTS = frozenset({"rewards", "group_size", "entropies", "completion_mask", "sum_pi_squared"})
"""The batch fields the lab's rollouts supply beyond the log-probs: one reward per row, nothing per function."""
LAB_FIELDS = LAB_INPUTS | {"per_token_logps", "old_per_token_logps", "ref_per_token_logps"}
"""Every batch field of a lab step (``Trainer.batch_fields``)."""


def check_lab_inputs(loss: LossConfig) -> None:
    """GrpoInputError naming the advantage or the setting (and the input it lacks) when the loss reads a batch
    field the lab's rollouts do not produce (ReMax's greedy baselines; the sampler's log-probs of a rollout
    correction, ``grpo.step_schema.READS``); every other variant trains."""
    missing = [name for name in ADVANTAGES.entry(loss.advantage).needs if name not in LAB_INPUTS]
    if missing:
        raise GrpoInputError(
            "advantage",
            f"an estimator the lab can supply inputs for: {loss.advantage} reads {missing[0]} "
            f"({BATCH_FIELDS[missing[0]].doc.rstrip('.')}), which the lab's rollouts do not produce",
            got=repr(loss.advantage),
        )
    for r in step_schema.READS:  # the lab samples from its own policy: no sampler's log-probs
        if not r.stand_in and r.field not in LAB_FIELDS and r.on(loss):
            raise GrpoInputError(
                r.setting,
                f"a setting the lab can supply inputs for: {r.setting} reads {r.field} ({r.what}), which the "
                "lab's rollouts do not produce",
                got=repr(getattr(loss, r.setting)),
            )


def _setting(default: Any, doc: str, **bounds: float) -> Any:
    return field(default=default, metadata={"doc": doc, **bounds})


@dataclass(frozen=True)
class LabConfig:
    """A lab run: the task, the loss, and the few knobs of the loop around it."""

    task: str = _setting(DEFAULT_TASK, "The synthetic task (grpo.lab.TASKS).")
    steps: int = _setting(150, "Optimiser steps.", ge=1)
    seed: int = _setting(0, "Fixes the initial policy, the prompts and every sample.", ge=0)
    loss: LossConfig = field(default=LossConfig(), metadata={"doc": "The loss (any preset and override)."})
    num_iterations: int = _setting(1, "Optimiser steps per rollout (TRL num_iterations); > 1 reuses samples.", ge=1)
    prompts_per_step: int = _setting(8, "Prompts sampled per rollout.", ge=1)
    group_size: int = _setting(8, "Completions per prompt (TRL num_generations).", ge=2)
    temperature: float = _setting(1.0, "Sampling temperature (the log-probs are taken at it too).", gt=0.0)
    learning_rate: float = _setting(3e-3, "Adam learning rate.", gt=0.0)
    max_grad_norm: float = _setting(1.0, "Gradient norm clip (TRL max_grad_norm).", gt=0.0)
    hidden: int = _setting(64, "GRU width of the policy (64: about 20k parameters).", ge=4)

    def __post_init__(self) -> None:
        get_task(self.task)
        check_lab_inputs(self.loss)
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in ("task", "loss"):
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise GrpoInputError(f.name, "a finite number", got=repr(value))
            if f.type == "int" and not isinstance(value, int):
                raise GrpoInputError(f.name, "an integer", got=repr(value))
            if "ge" in f.metadata and value < f.metadata["ge"]:
                raise GrpoInputError(f.name, f"a number >= {f.metadata['ge']}", got=repr(value))
            if "gt" in f.metadata and value <= f.metadata["gt"]:
                raise GrpoInputError(f.name, f"a number > {f.metadata['gt']}", got=repr(value))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class StepWriter(Protocol):
    """What the loop needs of a run store writer (grpo.runs.RunWriter)."""

    def write_step(self, step: int, micro: int, tensors: dict[str, Tensor], meta: dict[str, Any]) -> Any: ...


@dataclass
class _Sampled:
    rollout: Rollout
    rewards: Tensor
    ref_logps: Tensor
    old_logps: Tensor | None = None
    """Set by the rollout's first step: the policy has not moved since sampling, so it is that
    step's log-probs, detached (as TRL does); one forward pass fewer per rollout."""
    sum_pi_squared: Tensor | None = None
    """Σπ² per token of the same pass (the optimal token baseline reads it, as verl's actor computes it)."""


class Trainer:
    """The policy, its frozen reference, the optimiser and the sample stream of one run."""

    def __init__(self, config: LabConfig, writer: StepWriter | None = None) -> None:
        self.config = config
        self.task: Task = get_task(config.task)
        self.policy: Policy = init_policy(config.seed, config.hidden)
        self.reference: Policy = frozen_copy(self.policy)
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=config.learning_rate)
        self.generator = torch.Generator().manual_seed(config.seed)
        self.writer = writer
        self.step_count = 0
        self._sampled: _Sampled | None = None

    def _logps(self, policy: Policy, rollout: Rollout) -> grpo.TokenLogprobs:
        logits, _ = policy(rollout.tokens)
        return token_logprobs(logits, rollout.tokens, rollout.prompt_length, temperature=self.config.temperature)

    @torch.no_grad()
    def _sample(self) -> _Sampled:
        c, task = self.config, self.task
        prompts = task.prompts(c.prompts_per_step, self.generator).repeat_interleave(c.group_size, dim=0)
        rollout = sample(self.policy, prompts, task.max_completion_length, c.temperature, self.generator)
        ref = self._logps(self.reference, rollout).logps
        mask = rollout.completion_mask
        return _Sampled(rollout, task.rewards(rollout.tokens, mask), ref * mask)

    def step(self) -> dict[str, float]:
        """One optimiser step; returns its metrics (METRICS, plus ``step`` and ``iteration``)."""
        c = self.config
        iteration = self.step_count % c.num_iterations
        if iteration == 0 or self._sampled is None:
            self._sampled = self._sample()
        s = self._sampled
        self.step_count += 1
        current = self._logps(self.policy, s.rollout)
        fields = self.batch_fields(s, current)
        batch = Batch(**fields)
        loss = grpo.compute_loss(batch, c.loss)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.policy.parameters(), c.max_grad_norm))
        self.optimizer.step()

        breakdown = grpo.evaluate(dataclasses.replace(batch, per_token_logps=batch.logp.detach()), c.loss)
        metrics = _step_metrics(breakdown, grad_norm) | {"step": self.step_count, "iteration": iteration + 1}
        if self.writer is not None:
            self._save(fields, breakdown, metrics)
        return metrics

    def batch_fields(self, s: _Sampled, current: grpo.TokenLogprobs) -> dict[str, Any]:
        """This step's batch, under the batch table's names: what ``grpo.compute_loss`` trains on and what the
        step file holds (a subclass may add a registered field of its own: it is written like the rest)."""
        mask = s.rollout.completion_mask
        logps = current.logps * mask
        if s.old_logps is None:
            s.old_logps = logps.detach()
            assert current.sum_pi_squared is not None
            s.sum_pi_squared = current.sum_pi_squared.detach().clamp(0.0, 1.0) * mask
        return {
            "per_token_logps": logps,
            "old_per_token_logps": s.old_logps,
            "ref_per_token_logps": s.ref_logps,
            "completion_mask": mask,
            "rewards": s.rewards,
            "group_size": self.config.group_size,
            "entropies": current.entropies.detach() * mask,
            "sum_pi_squared": s.sum_pi_squared,
        }

    def _save(self, fields: dict[str, Any], breakdown: grpo.Breakdown, metrics: dict[str, float]) -> None:
        """The step file: every field of the step's batch (the step schema, ``grpo.step_schema``, requires what
        the loss reads: the entropies of an entropy bonus...), with the advantages the loss computed from the
        rewards as the input (the rewards shown per row)."""
        assert self.writer is not None and self._sampled is not None
        s = self._sampled
        tensors = {k: v for k, v in fields.items() if k not in ("rewards", "group_size")}
        tensors |= {
            # one per row, or one per token where the estimator gives them so (REINFORCE++'s discounted return)
            "advantages": (
                breakdown.tokens.advantage if breakdown.per_token_advantages else breakdown.advantages
            ).detach(),
            "row_rewards": s.rewards,
            "row_groups": torch.arange(s.rewards.shape[0]) // self.config.group_size,
        }
        P = s.rollout.prompt_length
        rows = s.rollout.tokens.tolist()
        meta = {
            "loss": metrics["loss"],
            "metrics": metrics,
            "task": self.config.task,
            # the rollout this step trained on and the pass over it (1-based), as the loop chose them
            "rollout": {
                "rollout": (self.step_count - 1) // self.config.num_iterations + 1,
                "iteration": int(metrics["iteration"]),
                "iterations": self.config.num_iterations,
            },
            "prompts": [" ".join(VOCAB[t] for t in row[:P]) for row in rows],
            "tokens": [[VOCAB[t] for t in row[P:]] for row in rows],
        }
        self.writer.write_step(self.step_count, 0, tensors, meta)


def _step_metrics(breakdown: grpo.Breakdown, grad_norm: float) -> dict[str, float]:
    m = breakdown.metrics
    return {
        **{name: m[name] for name in METRICS if name in m},
        "loss": float(breakdown.loss),
        "policy_loss": float(breakdown.policy_loss),
        "kl_loss": float(breakdown.kl_loss),
        "grad_norm": grad_norm,
    }


def run(config: LabConfig, writer: StepWriter | None = None) -> Iterator[dict[str, float]]:
    """The run's steps, one metrics dict per optimiser step; stop iterating to stop training."""
    trainer = Trainer(config, writer)
    for _ in range(config.steps):
        yield trainer.step()


def train(config: LabConfig, writer: StepWriter | None = None) -> list[dict[str, float]]:
    """Every step's metrics of a whole run."""
    return list(run(config, writer))
