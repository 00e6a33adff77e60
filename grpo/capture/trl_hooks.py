"""Capture a TRL 1.16 ``GRPOTrainer``'s loss calls: ``with grpo.capture.trl(trainer, run_dir): trainer.train()``.

The current log-probs are computed inside ``_compute_loss``, so the hooks wrap, on the trainer
instance only (the class is untouched and the wrappers are removed on exit):
- ``_get_per_token_logps_and_entropies``: keeps the log-probs and entropies of the loss call;
- ``_compute_loss``: records what the loss used and what it returned, one step file per call;
- ``_calculate_rewards`` and ``_generate_and_score_completions``: each row's reward and group id ride
  along in the generation batch (TRL shuffles rows before splitting micro-batches, so groups mix);
- ``log``: the metrics the trainer logged for each optimiser step, a line each in ``logged.jsonl``.
Each step file's meta names the rollout (generation batch) it trained on and the pass over it
(``rollout``: TRL's ``steps_per_generation`` and ``num_iterations``), so the Runs view can say
"iteration 2 of 2 of rollout 1" from what the trainer did, not from numbers that happen to match.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from grpo.config import LossConfig
from grpo.runs import RunWriter, Sampling, package_versions
from grpo.trainer_config import map_trl
from grpo.trainer_fields import TRL_DIVIDED_BY_GA

ROW_REWARDS = "lens_row_rewards"  # keys the hooks add to TRL's generation batch
ROW_GROUPS = "lens_row_groups"


class _TrlHooks:
    def __init__(self, trainer: Any, writer: RunWriter, config: LossConfig) -> None:
        self.trainer = trainer
        self.writer = writer
        self.config = config
        self.loss_type = trainer.loss_type
        self.in_loss = False
        self.logps: tuple[Tensor, Tensor | None] | None = None
        self.rewards: Tensor | None = None
        self.aux_loss: Tensor | None = None
        self.applied_entropy_coef: float | None = None
        self.saved: dict[str, Any] = {}

    # --- installing -------------------------------------------------------------------------
    def install(self) -> None:
        for name in ("_get_per_token_logps_and_entropies", "_compute_loss", "_calculate_rewards", "log"):
            self._wrap(name, getattr(self, f"_hook{name}" if name.startswith("_") else f"_hook_{name}"))
        self._wrap("_generate_and_score_completions", self._hook_generate)

    def _wrap(self, name: str, hook: Callable[..., Any]) -> None:
        if name in self.trainer.__dict__:
            self.saved[name] = self.trainer.__dict__[name]
        original = getattr(self.trainer, name)
        setattr(self.trainer, name, lambda *args, **kwargs: hook(original, *args, **kwargs))

    def remove(self) -> None:
        for name in ("_get_per_token_logps_and_entropies", "_compute_loss", "_calculate_rewards", "log"):
            self.trainer.__dict__.pop(name, None)
        self.trainer.__dict__.pop("_generate_and_score_completions", None)
        self.trainer.__dict__.update(self.saved)

    # --- hooks --------------------------------------------------------------------------------
    def _hook_get_per_token_logps_and_entropies(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        if self.in_loss:
            self.logps = (out[0], out[1])
            self.aux_loss = out[2] if len(out) > 2 else None  # a MoE model's router loss (aux_loss_enabled)
        return out

    def _hook_calculate_rewards(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        rewards = original(*args, **kwargs)
        self.rewards = rewards  # (B·processes, functions), gathered over processes
        return rewards

    def _hook_generate(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self.rewards = None
        out = original(*args, **kwargs)
        if not self.trainer.model.training or self.rewards is None:
            return out
        trainer = self.trainer
        B = out["advantages"].shape[0]
        per_func = self.rewards
        weights = trainer.reward_weights.to(per_func.device)
        rewards = (per_func * weights[None, :]).nansum(dim=1)  # as TRL sums them (sum_then_normalize)
        rewards[torch.isnan(per_func).all(dim=1)] = torch.nan  # unscorable rows
        start = trainer.accelerator.process_index * B
        rows = torch.arange(start, start + B, device=out["advantages"].device)
        out[ROW_REWARDS] = rewards[start : start + B].to(out["advantages"].device)
        out[ROW_GROUPS] = rows // trainer.num_generations
        return out

    def _hook_compute_loss(self, original: Callable[..., Any], model: Any, inputs: dict[str, Any]) -> Any:
        trainer = self.trainer
        if not trainer.model.training:
            return original(model, inputs)
        if not self.writer.wants(int(trainer.state.global_step) + 1):  # sampled out: nothing is gathered
            self.writer.skipped += 1
            return original(model, inputs)
        metrics = trainer._metrics["train"]
        before = {k: len(v) for k, v in metrics.items()}
        self.applied_entropy_coef = applied_entropy_coef(trainer)  # read before the call updates the controller
        self.in_loss, self.logps = True, None
        try:
            loss = original(model, inputs)
        finally:
            self.in_loss = False
        if self.logps is not None:
            logged = {k: v[-1] for k, v in metrics.items() if len(v) > before.get(k, 0)}
            self._write(inputs, loss, logged)
        return loss

    def _hook_log(self, original: Callable[..., Any], logs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        out = original(logs, *args, **kwargs)  # TRL adds its averaged metrics to logs in place
        first = self.writer.rank in (None, 0)  # TRL's logged metrics are already gathered over the processes
        if first and self.trainer.model.training and not any(k.startswith("eval_") for k in logs):
            # one line per call, appended (the end-of-training summary comes at the last step too: readers merge)
            numbers = {k: _number(v) for k, v in logs.items()}
            self.writer.log(int(self.trainer.state.global_step), {k: v for k, v in numbers.items() if _numeric(v)})
        return out

    # --- recording ------------------------------------------------------------------------------
    def _step_config(self, inputs: dict[str, Any]) -> tuple[LossConfig, dict[str, Any]]:
        """The run's config with this micro-batch's scaling, as ``_compute_loss`` applies it (spec §1.8)."""
        trainer = self.trainer
        ga = int(trainer.current_gradient_accumulation_steps)
        info: dict[str, Any] = {"gradient_accumulation_steps": ga}
        config = self.config
        if getattr(trainer, "aux_loss_enabled", False) and self.aux_loss is not None:
            # the router's loss cannot be recomputed from log-probs: the value the model returned, and TRL's
            # coefficient (the model's own when router_aux_loss_coef is None)
            aux = float(self.aux_loss.detach())
            config = dataclasses.replace(config, aux_loss_coef=float(trainer.router_aux_loss_coef), aux_loss=aux)
            info["aux_loss"] = aux
        if self.applied_entropy_coef is not None:  # adaptive: this step's coefficient, not the config's first one
            config = dataclasses.replace(config, entropy_coef=self.applied_entropy_coef)
            info["entropy_coef_applied"] = self.applied_entropy_coef
        if self.loss_type in TRL_DIVIDED_BY_GA:
            return dataclasses.replace(config, gradient_accumulation_steps=ga), info
        n_items = float(inputs["num_items_in_batch"].clamp(min=1.0))
        processes = int(trainer.accelerator.num_processes)
        per_generation = int(trainer.args.steps_per_generation)
        info |= {"num_items_in_batch": n_items, "num_processes": processes, "steps_per_generation": per_generation}
        normalizer = n_items / processes * ga / per_generation
        return dataclasses.replace(config, token_normalizer=normalizer, gradient_accumulation_steps=1), info

    def _write(self, inputs: dict[str, Any], loss: Tensor, logged: dict[str, Any]) -> None:
        trainer = self.trainer
        assert self.logps is not None
        logps, entropies = self.logps
        # TRL's batch as the loss call got it: every registered field in it (completion_mask, advantages, old and
        # reference log-probs, tool_mask, the sampler's log-probs, a plugin's field) and the correction TRL applied
        # are kept by the step schema (grpo.step_schema), the rest (prompt_ids...) left out
        tensors: dict[str, Any] = {k: v for k, v in inputs.items() if isinstance(v, Tensor)}
        old = inputs.get("old_per_token_logps")
        tensors |= {
            "per_token_logps": logps,
            "old_per_token_logps": logps if old is None else old,  # absent: TRL uses the current ones (ratio 1)
            "entropies": entropies,
            "row_rewards": inputs.get(ROW_REWARDS),
            "row_groups": inputs.get(ROW_GROUPS),
        }
        config, scaling = self._step_config(inputs)
        ga = scaling["gradient_accumulation_steps"]
        if self.applied_entropy_coef is not None and "entropy_coef" in logged:
            # TRL logs the controller's coefficient after its update at the step's end: the next step's, not the one
            # this call applied (which the step's config holds): kept apart, not compared
            scaling["entropy_coef_next"] = _number(logged.pop("entropy_coef"))
        meta = {
            "loss": float(loss.detach()),
            "metrics": {k: _number(v) for k, v in logged.items()},
            "scaling": scaling,
            "rollout": rollout(trainer),
            "processes": int(trainer.accelerator.num_processes),  # TRL gathers metrics over them (check-run)
        }
        step = int(trainer.state.global_step) + 1  # the optimiser step this loss call belongs to
        self.writer.write_step(step, int(trainer._step) % ga, tensors, meta, config=config)


def applied_entropy_coef(trainer: Any) -> float | None:
    """The entropy coefficient TRL 1.16's adaptive controller applies to this call (None: not adaptive): the
    current coefficient while the last window's entropy is at or below ``entropy_target``, else 0."""
    if not getattr(trainer, "use_adaptive_entropy", False):
        return None
    gated = trainer._last_world_entropy <= trainer.args.entropy_target
    return float(trainer.entropy_coef) if gated else 0.0


def rollout(trainer: Any) -> dict[str, int]:
    """Which generation batch this loss call trains on, and which pass over it (1-based), as
    ``_prepare_inputs`` chooses: a new generation every ``steps_per_generation * num_iterations``
    micro-steps (``trainer._step``: this call's, from 0; TRL counts it up after the call), each pass
    over the batch taking ``steps_per_generation`` of them."""
    per_generation, iterations = int(trainer.args.steps_per_generation), int(trainer.num_iterations)
    micro_step = int(trainer._step)
    return {
        "rollout": micro_step // (per_generation * iterations) + 1,
        "iteration": micro_step % (per_generation * iterations) // per_generation + 1,
        "iterations": iterations,
        "micro_step": micro_step,
        "steps_per_generation": per_generation,
    }


def _numeric(value: Any) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))


def _number(value: Any) -> Any:
    if isinstance(value, Tensor):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


@contextmanager
def trl(
    trainer: Any,
    run_dir: str | Path,
    every: int | None = None,
    steps: Iterable[int] | None = None,
    ranks: Iterable[int] | None = None,
    max_bytes: int | None = None,
) -> Iterator[RunWriter]:
    """Record every training ``_compute_loss`` call of a TRL 1.16 ``GRPOTrainer`` into ``run_dir``.

    One step file per micro-batch (step: the optimiser step, from 1; micro: from 0), with the
    log-probs the loss used, old and reference log-probs, mask, advantages, entropies, each row's
    reward and group (``row_rewards``, ``row_groups``), the config from ``trainer.args`` with this
    micro-batch's scaling, the loss the trainer returned and the metrics it logged for the call.
    run.json's ``status`` ends ``done``, ``interrupted`` or ``failed``; the logged metrics go to
    ``logged.jsonl``, a line per log call.

    For long runs: ``every=N`` records optimiser steps 1, N+1, 2N+1...; ``steps`` these steps; ``ranks`` these
    processes; ``max_bytes`` stops recording (never training) at the first step file that would cross it, per
    process (run.json's ``capture`` says what was written and skipped). Sampling that chooses no rank or step of
    the run warns at the start and says so in run.json (``capture.chooses_nothing``). Rank 0 writes run.json,
    captured or not. A job restarted into the same ``run_dir`` resumes it: nothing an earlier attempt wrote is
    overwritten (``RunWriter``'s ``resume``).
    """
    mapping = map_trl(trainer.args)
    for message in mapping.warnings:
        warnings.warn(f"grpo.capture.trl: {message}", stacklevel=3)
    processes = int(trainer.accelerator.num_processes)
    writer = RunWriter(
        run_dir,
        "trl",
        mapping.config,
        versions=package_versions("trl", "transformers", "accelerate"),
        rank=int(trainer.accelerator.process_index) if processes > 1 else None,
        background=True,  # step files are written off the training loop's path
        sampling=Sampling.of(every, steps, ranks, max_bytes),
        resume=True,
    )
    max_steps = getattr(trainer.args, "max_steps", None)  # -1: set by the epochs, known once training starts
    last_step = max_steps if isinstance(max_steps, int) and max_steps > 0 else None
    writer.check_sampling(processes, last_step, who="grpo.capture.trl")  # ranks=[1] on one process: said
    writer.update(unsupported=mapping.unsupported, loss_type=trainer.loss_type)
    hooks = _TrlHooks(trainer, writer, mapping.config)
    hooks.install()
    try:
        yield writer
    except KeyboardInterrupt:
        writer.close()
        writer.update(status="interrupted")
        raise
    except BaseException:
        writer.close()
        writer.update(status="failed")
        raise
    else:
        writer.close()
        writer.update(status="done")
    finally:
        hooks.remove()
