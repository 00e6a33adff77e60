"""Check a run: recompute every captured micro-batch and compare with what the trainer returned and logged.

Per micro-batch: the trainer's returned loss against GRPO Lens's under the file's config (the
relative error is taken against the size of the terms that sum to the loss, since they cancel
when the loss is near 0), and every metric both name. Per step: the trainer's logged metrics
(TRL and verl log the plain mean over micro-batches) against GRPO Lens's plain mean, with the
token-weighted mean beside it, labelled. ``python -m grpo check-run RUN_DIR`` prints this.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from grpo.config import LossConfig
from grpo.loss import Breakdown, evaluate
from grpo.metrics import TOKEN_MEANS
from grpo.runs import Run, StepRef, load_step

DEFAULT_RTOL = 1e-5
DEFAULT_METRIC_ATOL = 1e-6
SCALING_FIELDS = (
    "gradient_accumulation_steps",
    "token_normalizer",
    "sequence_normalizer",
    "entropy_accumulation_steps",
)


@dataclass(frozen=True)
class MetricCheck:
    trainer: float
    lens: float
    diff: float
    ok: bool


@dataclass(frozen=True)
class MicroCheck:
    """One micro-batch: the trainer's loss and metrics against GRPO Lens's."""

    step: int
    micro: int
    rank: int | None
    file: str
    trainer_loss: float | None
    lens_loss: float
    rel_error: float | None
    """|lens - trainer| / max(|trainer|, sum of |per-token losses|)."""
    num_tokens: int
    """The micro-batch's counted tokens (its weight in the token-weighted step means)."""
    metrics: dict[str, MetricCheck]
    """Every metric both the trainer and GRPO Lens name, compared."""
    ok: bool
    """The loss and every compared metric within tolerance."""


@dataclass(frozen=True)
class StepCheck:
    """One optimiser step: the sum of its micro-batch losses and its metrics as the trainer logs them."""

    step: int
    micro_batches: int
    trainer_loss: float | None
    """The sum of the trainer's returned micro-batch losses (None: a micro-batch did not record one)."""
    lens_loss: float
    logged: dict[str, float]
    """What the trainer logged for the step (run.json ``logged``), when it was captured."""
    lens_mean: dict[str, float]
    """GRPO Lens's metrics as the trainer logs them: the plain mean over micro-batches."""
    lens_token_weighted: dict[str, float]
    """The same token-level metrics weighted by each micro-batch's counted tokens (not what trainers log)."""
    metrics: dict[str, MetricCheck]
    """The trainer's logged metrics against ``lens_mean``."""
    ok: bool
    """Every logged metric within tolerance."""


@dataclass(frozen=True)
class RunCheck:
    run: str
    rtol: float
    metric_atol: float
    micro: list[MicroCheck] = field(default_factory=list)
    steps: list[StepCheck] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(m.ok for m in self.micro) and all(s.ok for s in self.steps)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _compare(trainer: dict[str, Any], lens: dict[str, float], atol: float) -> dict[str, MetricCheck]:
    out = {}
    for name, value in trainer.items():
        t = _finite(value)
        if t is None or name not in lens:
            continue
        diff = abs(lens[name] - t)
        out[name] = MetricCheck(t, lens[name], diff, diff <= atol)
    return out


def replay_config(stored: LossConfig, overrides: dict[str, Any] | None) -> LossConfig:
    """A stored config under overrides (``preset`` replaces it); the trainer's scaling is kept."""
    return LossConfig.resolve(overrides, base=stored, keep=SCALING_FIELDS) if overrides else stored


def evaluate_ref(ref: StepRef, overrides: dict[str, Any] | None = None) -> tuple[Breakdown, dict[str, Any]]:
    """The breakdown of one step file (under its own config, or with ``overrides``) and its info."""
    batch, stored, info = load_step(ref.path)
    return evaluate(batch, replay_config(stored, overrides)), info


def check_micro(ref: StepRef, bd: Breakdown, info: dict[str, Any], rtol: float, atol: float) -> MicroCheck:
    meta = info["meta"] if isinstance(info.get("meta"), dict) else {}
    trainer = _finite(meta.get("loss"))
    lens = float(bd.loss)
    rel = None
    if trainer is not None:
        scale = max(abs(trainer), float(bd.tokens.loss.abs().sum()), 1e-30)
        rel = abs(lens - trainer) / scale
    logged = meta.get("metrics")  # a trainer's log is free-form: only an object of numbers is compared
    metrics = _compare(logged if isinstance(logged, dict) else {}, bd.metrics, atol)
    ok = (rel is None or rel <= rtol) and all(m.ok for m in metrics.values())
    n = int(bd.tokens.mask.sum())
    return MicroCheck(ref.step, ref.micro, ref.rank, ref.path.name, trainer, lens, rel, n, metrics, ok)


def step_views(bds: list[Breakdown]) -> tuple[dict[str, float], dict[str, float]]:
    """(plain mean over micro-batches, token-weighted mean) of each metric of a step's breakdowns."""
    names = set.intersection(*(set(bd.metrics) for bd in bds))
    mean = {k: sum(bd.metrics[k] for bd in bds) / len(bds) for k in sorted(names)}
    tokens = [float(bd.tokens.mask.sum()) for bd in bds]
    total = sum(tokens) or 1.0
    weighted = {
        k: sum(bd.metrics[k] * n for bd, n in zip(bds, tokens, strict=True)) / total for k in TOKEN_MEANS if k in names
    }
    return mean, weighted


MicroSeen = Callable[[StepRef, Breakdown, dict[str, Any]], None]


def check_run(
    run: Run, rtol: float = DEFAULT_RTOL, metric_atol: float = DEFAULT_METRIC_ATOL, seen: MicroSeen | None = None
) -> RunCheck:
    """Recompute every micro-batch of ``run`` and compare it with the trainer's numbers; ``seen`` gets each
    micro-batch's breakdown and info as it is computed (a view built beside the check evaluates nothing twice)."""
    result = RunCheck(run.name, rtol, metric_atol)
    logged_all = run.info.get("logged") or {}
    for step in run.step_numbers():
        bds = []
        checks = []
        for ref in run.micro_batches(step):
            bd, info = evaluate_ref(ref)
            if seen is not None:
                seen(ref, bd, info)
            bds.append(bd)
            checks.append(check_micro(ref, bd, info, rtol, metric_atol))
        result.micro.extend(checks)
        mean, weighted = step_views(bds)
        losses = [c.trainer_loss for c in checks]
        trainer_loss = None if any(v is None for v in losses) else sum(v for v in losses if v is not None)
        # The metrics the loss calls logged (per micro-batch), as the trainer averaged them for the step;
        # generation-batch metrics (reward, completions/*) are the trainer's own view of other rows.
        per_call = set().union(*(c.metrics for c in checks))
        logged = {k: v for k, v in (logged_all.get(str(step)) or {}).items() if _finite(v) is not None}
        metrics = _compare({k: v for k, v in logged.items() if k in per_call}, mean, metric_atol)
        result.steps.append(
            StepCheck(
                step,
                len(checks),
                trainer_loss,
                sum(float(bd.loss) for bd in bds),
                logged,
                mean,
                weighted,
                metrics,
                all(m.ok for m in metrics.values()),
            )
        )
    return result


def format_check(check: RunCheck) -> str:
    """The check as a table: one line per micro-batch, then one per step."""
    lines = [f"run {check.run}: rtol {check.rtol:g}, metrics to {check.metric_atol:g}"]
    lines.append(
        f"{'step':>6} {'micro':>5} {'trainer loss':>14} {'lens loss':>14} {'rel error':>10} {'max metric diff':>16}  "
    )
    for m in check.micro:
        worst = max(m.metrics.items(), key=lambda kv: kv[1].diff, default=None)
        worst_text = f"{worst[1].diff:.2e} {worst[0]}" if worst else "-"
        rank = "" if m.rank is None else f" r{m.rank}"
        lines.append(
            f"{m.step:>6} {m.micro:>5}{rank} {_num(m.trainer_loss):>14} {_num(m.lens_loss):>14} "
            f"{_sci(m.rel_error):>10} {worst_text:>16}  {'ok' if m.ok else 'MISMATCH'}"
        )
    lines.append("")
    lines.append(
        f"{'step':>6} {'micros':>6} {'trainer loss':>14} {'lens loss':>14} {'logged metrics':>15} {'max diff':>9}"
    )
    for s in check.steps:
        largest = max((v.diff for v in s.metrics.values()), default=None)
        lines.append(
            f"{s.step:>6} {s.micro_batches:>6} {_num(s.trainer_loss):>14} {_num(s.lens_loss):>14} "
            f"{len(s.metrics):>15} {_sci(largest):>9}  {'ok' if s.ok else 'MISMATCH'}"
        )
    bad = sum(not m.ok for m in check.micro) + sum(not s.ok for s in check.steps)
    verdict = "all within tolerance" if check.ok else f"{bad} past tolerance"
    lines.append(f"{len(check.micro)} micro-batches, {len(check.steps)} steps: {verdict}")
    return "\n".join(lines)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.8g}"


def _sci(value: float | None) -> str:
    return "-" if value is None else f"{value:.2e}"
