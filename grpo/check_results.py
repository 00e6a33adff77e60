"""What a run's check finds: the verdicts and how they join, each micro-batch's, step's and run's result,
and the plain and token-weighted means of a step's metrics. ``grpo.check`` computes them."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from grpo.corrections import SamplingSums
from grpo.metrics import TOKEN_MEANS

MATCH, DIFFER, UNCHECKED, ERROR = "match", "differ", "unchecked", "error"
VERDICTS = (MATCH, DIFFER, UNCHECKED, ERROR)
_RANK = {MATCH: 0, UNCHECKED: 1, DIFFER: 2, ERROR: 3}  # joined, the worst wins


def joined_verdict(verdicts: Iterable[str]) -> str:
    """The verdict of several (a step of its micro-batches, a run of its steps): the worst; none is unchecked."""
    return max(verdicts, key=_RANK.__getitem__, default=UNCHECKED)


def verdict_of(compared: Iterable[bool], unchecked: list[str]) -> str:
    """``differ`` when a compared number is past tolerance, else ``unchecked`` when something was left
    uncompared (or nothing was compared at all), else ``match``."""
    results = list(compared)
    if not all(results):
        return DIFFER
    return UNCHECKED if unchecked or not results else MATCH


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
    lens_loss: float | None
    """None: the file could not be evaluated (``error``)."""
    rel_error: float | None
    """|lens - trainer| / max(|trainer|, sum of |per-token losses|)."""
    num_tokens: int
    """The micro-batch's counted tokens (its weight in the token-weighted step means)."""
    metrics: dict[str, MetricCheck]
    """Every metric both the trainer and GRPO Lens name, compared."""
    ok: bool
    """Nothing compared past tolerance, and the file was read (``verdict`` is match or unchecked)."""
    verdict: str = MATCH
    unchecked: list[str] = field(default_factory=list)
    """What was not compared, and why ("the dump holds no loss", "metrics TRL gathers over 2 processes...")."""
    error: str | None = None
    """Why the file could not be read or evaluated (``verdict`` error)."""


@dataclass(frozen=True)
class StepCheck:
    """One optimiser step: the sum of its micro-batch losses and its metrics as the trainer logs them."""

    step: int
    micro_batches: int
    trainer_loss: float | None
    """The sum of the trainer's returned micro-batch losses, over several ranks their mean (None: a
    micro-batch did not record one)."""
    lens_loss: float | None
    logged: dict[str, float]
    """What the trainer logged for the step (run.json ``logged``), when it was captured."""
    lens_mean: dict[str, float]
    """GRPO Lens's metrics as the trainer logs them: the plain mean over micro-batches."""
    lens_token_weighted: dict[str, float]
    """The same token-level metrics weighted by each micro-batch's counted tokens (not what trainers log)."""
    metrics: dict[str, MetricCheck]
    """The trainer's logged metrics against ``lens_mean`` (the logged loss keys joined as the trainer joins them)."""
    ok: bool
    """Nothing compared past tolerance (the step's micro-batches included) and every file read."""
    ranks: int = 1
    """The processes whose loss calls make the step. Several: the losses are joined as DDP joins them (each
    rank's sum over its micro-batches, averaged over the ranks: what the trainer logs as the step's loss)."""
    verdict: str = MATCH
    unchecked: list[str] = field(default_factory=list)
    """What of the step (its log, its micro-batches) was not compared, and why."""
    logged_loss: MetricCheck | None = None
    """The loss the trainer logged for this step against GRPO Lens's joined as the trainer logs it (TRL: each
    rank's sum over the logging window's micro-batches, meaned over the ranks and the window's steps); ``diff``
    relative to the size of the terms, as each micro-batch's."""


@dataclass(frozen=True)
class RunCheck:
    run: str
    rtol: float
    metric_atol: float
    micro: list[MicroCheck] = field(default_factory=list)
    steps: list[StepCheck] = field(default_factory=list)
    unchecked_run: list[str] = field(default_factory=list)
    """What of the run as a whole was not compared (no step files; a capture that chose nothing)."""

    @property
    def verdict(self) -> str:
        """The run's verdict: its steps' joined (a run without steps is unchecked)."""
        return joined_verdict([s.verdict for s in self.steps] + ([UNCHECKED] if self.unchecked_run else []))

    @property
    def ok(self) -> bool:
        """Nothing compared past tolerance and every file read (``verdict`` match or unchecked)."""
        return self.verdict in (MATCH, UNCHECKED)

    def counts(self) -> dict[str, int]:
        """Micro-batches by verdict."""
        out = dict.fromkeys(VERDICTS, 0)
        for m in self.micro:
            out[m.verdict] += 1
        return out

    def unchecked_reasons(self) -> list[tuple[str, int]]:
        """Each reason something was not compared, with how many micro-batches give it (a step's own reason,
        which none of its micro-batches gives: how many steps)."""
        seen: dict[str, int] = dict.fromkeys(self.unchecked_run, 1)
        given = [r for m in self.micro for r in m.unchecked]
        own = [r for s in self.steps for r in s.unchecked if r not in given]
        for reason in given + own:
            seen[reason] = seen.get(reason, 0) + 1
        return sorted(seen.items(), key=lambda kv: -kv[1])

    def unchecked_items(self) -> list[dict[str, Any]]:
        """``unchecked_reasons`` as JSON: each reason, its count, and what it counts (``of``: "micro-batches",
        "steps", or "run" for the run's own)."""
        given = {r for m in self.micro for r in m.unchecked}
        of = {**dict.fromkeys(self.unchecked_run, "run"), **dict.fromkeys(given, "micro-batches")}
        return [{"reason": r, "count": n, "of": of.get(r, "steps")} for r, n in self.unchecked_reasons()]

    def to_dict(self) -> dict[str, Any]:
        reasons = self.unchecked_items()
        return {"verdict": self.verdict, **asdict(self), "ok": self.ok, "counts": self.counts(), "unchecked": reasons}


def finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def compare(trainer: dict[str, Any], lens: dict[str, float], atol: float) -> dict[str, MetricCheck]:
    out = {}
    for name, value in trainer.items():
        t = finite(value)
        if t is None or name not in lens:
            continue
        diff = abs(lens[name] - t)
        out[name] = MetricCheck(t, lens[name], diff, diff <= atol)
    return out


def settled(check: MicroCheck, rtol: float, unchecked: list[str] | None = None) -> MicroCheck:
    """``check`` with its verdict and ``ok`` from what it compares (its loss, its metrics) and ``unchecked``."""
    if check.error is not None:
        return replace(check, verdict=ERROR, ok=False)
    reasons = check.unchecked if unchecked is None else unchecked
    compared = [m.ok for m in check.metrics.values()]
    if check.rel_error is not None:
        compared.append(check.rel_error <= rtol)  # NaN: past tolerance
    verdict = verdict_of(compared, reasons)
    return replace(check, verdict=verdict, ok=verdict != DIFFER, unchecked=reasons)


def metric_views(micro: list[tuple[dict[str, float], float]]) -> tuple[dict[str, float], dict[str, float]]:
    """``step_views`` from each micro-batch's (metrics, counted tokens): what outlives its breakdown."""
    names = set.intersection(*(set(metrics) for metrics, _ in micro))
    mean = {k: sum(metrics[k] for metrics, _ in micro) / len(micro) for k in sorted(names)}
    total = sum(n for _, n in micro) or 1.0
    weighted = {k: sum(metrics[k] * n for metrics, n in micro) / total for k in TOKEN_MEANS if k in names}
    return mean, weighted


@dataclass(frozen=True)
class MicroResult:
    """What a step's check needs of one micro-batch once its breakdown is gone: small, so it crosses processes
    and a check's memory stays flat however many files the run holds."""

    check: MicroCheck
    metrics: dict[str, float]
    tokens: float
    loss: float
    sampling: SamplingSums | None = None
    """The sums behind TRL's ``sampling/*`` (``Breakdown.sampling``), joined over the generation batch."""
    rollout: tuple[int, int, int] | None = None
    """(rollout, iteration, steps_per_generation) as the capture recorded them (None: not recorded)."""
    scale: float = 0.0
    """The sum of |per-token losses|: the size of the terms a joined loss's tolerance is taken against."""
    processes: int | None = None
    """The processes the trainer ran on, as the capture recorded them (None: not recorded)."""
    parts: dict[str, float] = field(default_factory=dict)
    """GRPO Lens's loss parts under verl's logged names (``actor/pg_loss``, ``actor/kl_loss``)."""
    global_batch: bool = False
    """The loss was normalised by global counts (verl's ``global_batch_info``): verl then sums its parts' metrics."""


def step_losses(items: list[MicroResult], ranks: int) -> tuple[float | None, float | None]:
    """(trainer's, GRPO Lens's) loss of a step: the sum over its micro-batches, over several ranks the mean of
    each rank's sum (DDP averages the ranks' gradients; the trainer logs the ranks' mean). None: a micro-batch
    did not record the trainer's loss, or its file could not be read."""
    losses = [item.check.trainer_loss for item in items]
    trainer = None if any(v is None for v in losses) else sum(v for v in losses if v is not None) / ranks
    lens = None if any(item.check.error is not None for item in items) else sum(item.loss for item in items) / ranks
    return trainer, lens


@dataclass
class StepItems:
    """One step's micro-batch results on their way to its ``StepCheck``."""

    number: int
    items: list[MicroResult]
    ranks: list[int]
    reasons: list[str]
    incomplete: bool
    """The capture's byte budget cut the step short."""

    @property
    def failed(self) -> list[str]:
        return [item.check.file for item in self.items if item.check.error is not None]

    def rank_losses(self, lens: bool = True) -> dict[int, list[float]]:
        """Each rank's micro-batch losses in order (GRPO Lens's, or the trainer's returned ones)."""
        out: dict[int, list[float]] = {}
        for item in sorted(self.items, key=lambda i: i.check.micro):
            value = item.loss if lens else item.check.trainer_loss
            out.setdefault(item.check.rank or 0, []).append(math.nan if value is None else value)
        return out

    def firsts(self) -> list[MicroResult]:
        """One entry per readable micro-batch of the step: over several ranks, their join (each rank holds it)."""
        readable = [item for item in self.items if item.check.error is None]
        return (
            [item for item in readable if (item.check.rank or 0) == self.ranks[0]] if len(self.ranks) > 1 else readable
        )

    def check(
        self,
        logged_all: dict[str, Any],
        generated: dict[str, float],
        logged_loss: Any,
        atol: float,
        window: dict[str, float] | str | None = None,
    ) -> StepCheck:
        """The step's check; ``window``: the loss-call metrics as the trainer logged them over a window of several
        steps (``window_means``), compared in place of the step's own, or why they cannot be."""
        items, firsts = self.items, self.firsts()
        checks = [item.check for item in items]
        mean, weighted = metric_views([(item.metrics, item.tokens) for item in firsts]) if firsts else ({}, {})
        trainer_loss, lens_loss = step_losses(items, len(self.ranks))
        # The metrics the loss calls logged (per micro-batch), as the trainer averaged them for the step;
        # generation-batch metrics (reward, completions/*) are the trainer's own view of other rows.
        per_call = set().union(*(c.metrics for c in checks))
        step_log = {} if self.incomplete else logged_all.get(str(self.number)) or {}
        logged = {k: v for k, v in step_log.items() if finite(v) is not None}
        calls = {k: v for k, v in logged.items() if k in per_call}
        metrics = compare(calls, window if isinstance(window, dict) else {} if window else mean, atol)
        metrics |= compare(logged, generated, atol)
        reasons = list(self.reasons) + ([window] if isinstance(window, str) and calls else [])
        if self.failed:
            reasons.append(f"the step's joined numbers: {len(self.failed)} step file(s) could not be read")
        if isinstance(logged_loss, str):
            reasons.append(logged_loss)
        loss_check = logged_loss if isinstance(logged_loss, MetricCheck) else None
        compared = [m.ok for m in metrics.values()] + ([loss_check.ok] if loss_check else [])
        own = verdict_of(compared, reasons)
        # a step compares nothing of its own unless the trainer logged it: its micro-batches speak for it
        verdict = joined_verdict([c.verdict for c in checks] + ([own] if compared or reasons else []))
        ok = verdict in (MATCH, UNCHECKED)
        unchecked = sorted({r for c in checks for r in c.unchecked} | set(reasons), key=str)
        number, n = self.number, len(checks)
        return StepCheck(
            number, n, trainer_loss, lens_loss, logged, mean, weighted, metrics, ok, len(self.ranks),
            verdict, unchecked, loss_check,
        )  # fmt: skip
