"""The Runs view model: what the run pages show of a run, computed from the library's check and breakdowns.

Per step, the trainer's loss and logged metrics beside GRPO Lens's with mismatches flagged and the series
the Runs view charts (``run_overview``); one step's batch as /api/v1/loss takes it (``step_batch``); the same
captured batches under another config (``replay``). ``grpo.check`` is the check itself, shared with
``python -m grpo check-run``; this is the server's view of it (``app.summaries`` runs it in its lanes).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from torch import Tensor

from grpo.batch import Batch
from grpo.check import MicroCheck, RunCheck, check_run, replay_config, step_views
from grpo.config import LossConfig
from grpo.errors import GrpoInputError
from grpo.loss import Breakdown, evaluate
from grpo.runs import Run, load_step

SERIES_METRICS = (
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "clip_ratio/region_mean",
    "actor/pg_clipfrac",
    "kl",
    "entropy",
    "completions/mean_length",
    "lens/advantage/std",
)


def _row_rewards(info: dict[str, Any]) -> list[float]:
    rewards = info["tensors"].get("row_rewards", info["tensors"].get("rewards"))
    return [] if rewards is None else [float(r) for r in rewards.tolist() if math.isfinite(r)]


def run_overview(run: Run, check: RunCheck | None = None) -> dict[str, Any]:
    """Per step: the trainer's loss and logged metrics beside GRPO Lens's, mismatches flagged, and the
    series the Runs view charts (clip fractions, KL, reward, advantage spread, lengths)."""
    check = check or check_run(run)
    by_step: dict[int, list[MicroCheck]] = {}
    for m in check.micro:
        by_step.setdefault(m.step, []).append(m)
    steps = []
    for s in check.steps:
        rewards = [r for ref in run.micro_batches(s.step) for r in _row_rewards(load_step(ref.path)[2])]
        micro = by_step[s.step]
        errors = [m.rel_error for m in micro if m.rel_error is not None]
        steps.append(
            {
                "step": s.step,
                "micro_batches": s.micro_batches,
                "trainer_loss": s.trainer_loss,
                "lens_loss": s.lens_loss,
                "max_rel_error": max(errors) if errors else None,
                "ok": s.ok and all(m.ok for m in micro),
                "mismatches": [
                    {
                        "micro": m.micro,
                        "rank": m.rank,
                        "rel_error": m.rel_error,
                        "metrics": sorted(k for k, v in m.metrics.items() if not v.ok),
                    }
                    for m in micro
                    if not m.ok
                ],
                "logged": s.logged,
                "lens_mean": {k: s.lens_mean[k] for k in SERIES_METRICS if k in s.lens_mean},
                "lens_token_weighted": s.lens_token_weighted,
                "reward": sum(rewards) / len(rewards) if rewards else None,
            }
        )
    return {**run.summary(), "info": run.info, "ok": check.ok, "rtol": check.rtol, "steps": steps}


def batch_advantages(batch: Batch, config: LossConfig) -> Tensor:
    """A step's advantages: the trainer's where the file holds them, else the ones the loss computes
    from its rewards under its config."""
    if isinstance(batch.advantages, Tensor):
        return batch.advantages
    return evaluate(batch, config).advantages


def step_batch(run: Run, step: int, micro: int | None = None) -> tuple[dict[str, Any], LossConfig, dict[str, Any]]:
    """A step's request-shaped fields (ragged rows, as /api/v1/loss takes them), config and info.

    With ``micro``, that micro-batch under its own config: the trainer's exact number. Without, the
    step's micro-batches joined into one batch under the run's config without the trainer's
    per-micro-batch scaling (the step's batch seen as one).
    """
    refs = run.micro_batches(step)
    if micro is not None:
        refs = [r for r in refs if r.micro == micro]
    if not refs:
        raise GrpoInputError("step", f"a step of this run ({', '.join(map(str, run.step_numbers()))}) and micro-batch")
    loaded = [load_step(r.path) for r in refs]
    rows: dict[str, list[list[float]]] = {}
    per_row: dict[str, list[float]] = {"advantages": [], "row_rewards": [], "row_groups": []}
    for batch, stored, info in loaded:
        lengths = (batch.mask.cumsum(-1) * batch.mask).argmax(-1) + 1  # up to the last counted position
        for name in ("per_token_logps", "old_per_token_logps", "ref_per_token_logps", "entropies", "completion_mask"):
            value = batch.mask_float if name == "completion_mask" else getattr(batch, name)
            if value is not None:
                rows.setdefault(name, []).extend(v[: int(n)].tolist() for v, n in zip(value, lengths, strict=True))
        per_row["advantages"] += batch_advantages(batch, stored).tolist()
        for name in ("row_rewards", "row_groups"):
            if name in info["tensors"]:
                per_row[name] += info["tensors"][name].tolist()
    fields: dict[str, Any] = {**rows, "advantages": per_row["advantages"]}
    config = loaded[0][1]
    if micro is None:
        config = replace(config, gradient_accumulation_steps=1, token_normalizer=None, sequence_normalizer=None)
    info = {
        "step": step,
        "micro": micro,
        "micro_batches": [r.micro for r in refs],
        "trainer": [i["meta"] for _, _, i in loaded],
        "row_rewards": per_row["row_rewards"] or None,
        "row_groups": per_row["row_groups"] or None,
    }
    return fields, config, info


def replay(run: Run, overrides: dict[str, Any], steps_only: list[int] | None = None) -> dict[str, Any]:
    """The same captured batches under another config: per-step loss, parts, clip and KL, beside the original
    (every step, or the steps in ``steps_only``)."""
    steps = []
    for step in run.step_numbers() if steps_only is None else steps_only:
        original, replayed = [], []
        for ref in run.micro_batches(step):
            batch, stored, _ = load_step(ref.path)
            original.append(evaluate(batch, stored))
            replayed.append(evaluate(batch, replay_config(stored, overrides)))
        steps.append({"step": step, "original": _step_series(original), "replay": _step_series(replayed)})
    config = replay_config(load_step(run.steps[0].path)[1], overrides) if run.steps else None
    return {"run": run.name, "config": None if config is None else config.to_dict(), "steps": steps}


def _step_series(bds: list[Breakdown]) -> dict[str, float]:
    mean, _ = step_views(bds)
    return {
        "loss": sum(float(bd.loss) for bd in bds),
        "policy_loss": sum(float(bd.policy_loss) for bd in bds),
        "kl_loss": sum(float(bd.kl_loss) for bd in bds),
        "clip_ratio/region_mean": mean.get("clip_ratio/region_mean", 0.0),
        "kl": mean.get("kl", 0.0),
    }
