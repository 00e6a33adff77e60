"""Check a run: recompute every captured micro-batch and compare with what the trainer returned and logged.

Per micro-batch: the trainer's returned loss against GRPO Lens's under the file's config (the
relative error is taken against the size of the terms that sum to the loss, since they cancel
when the loss is near 0), and every metric both name. Per step: the trainer's logged metrics
(TRL and verl log the plain mean over micro-batches) against GRPO Lens's plain mean, with the
token-weighted mean beside it, labelled. ``python -m grpo check-run RUN_DIR`` prints this.
"""

from __future__ import annotations

import math
import multiprocessing
import multiprocessing.pool
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

import torch
from torch import Tensor

from grpo._allocator import keep_freed_memory
from grpo.config import LossConfig
from grpo.corrections import SAMPLING_METRICS, SamplingSums, sampling_over_ranks
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
    """The sum of the trainer's returned micro-batch losses, over several ranks their mean (None: a
    micro-batch did not record one)."""
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
    ranks: int = 1
    """The processes whose loss calls make the step. Several: the losses are joined as DDP joins them (each
    rank's sum over its micro-batches, averaged over the ranks: what the trainer logs as the step's loss)."""


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
    applied = info.get("trainer", {}).get("importance_sampling_ratio")
    if applied is not None:
        metrics[IS_WEIGHT_CHECK] = _weights_check(applied, bd, atol)
    ok = (rel is None or rel <= rtol) and all(m.ok for m in metrics.values())
    n = int(bd.tokens.mask.sum())
    return MicroCheck(ref.step, ref.micro, ref.rank, ref.path.name, trainer, lens, rel, n, metrics, ok)


# The rollout correction's weights as the trainer applied them against GRPO Lens's, token by token.
IS_WEIGHT_CHECK = "importance_sampling_ratio (max |diff| per counted token)"


def _weights_check(applied: Tensor, bd: Breakdown, atol: float) -> MetricCheck:
    """TRL's recorded importance-sampling ratio against ``tokens.is_weight`` over the counted tokens (a sequence
    weight (rows, 1) is each token's): trainer and lens are the means, diff the largest gap, relative to the
    weight's size (float32 weights of a few units)."""
    counted = bd.tokens.mask.bool()
    theirs = applied.to(bd.tokens.is_weight.dtype).expand_as(bd.tokens.is_weight)[counted]
    ours = bd.tokens.is_weight[counted]
    if theirs.numel() == 0:
        return MetricCheck(0.0, 0.0, 0.0, True)
    diff = float(((theirs - ours).abs() / theirs.abs().clamp(min=1.0)).max())
    return MetricCheck(float(theirs.mean()), float(ours.mean()), diff, diff <= max(atol, 1e-5))


def step_views(bds: list[Breakdown]) -> tuple[dict[str, float], dict[str, float]]:
    """(plain mean over micro-batches, token-weighted mean) of each metric of a step's breakdowns."""
    return metric_views([(bd.metrics, float(bd.tokens.mask.sum())) for bd in bds])


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


def micro_result(ref: StepRef, bd: Breakdown, info: dict[str, Any], rtol: float, metric_atol: float) -> MicroResult:
    """What a step's check keeps of one micro-batch's breakdown."""
    check = check_micro(ref, bd, info, rtol, metric_atol)
    meta = info.get("meta")
    r = meta.get("rollout") if isinstance(meta, dict) else None
    given = [r.get(k) for k in ("rollout", "iteration", "steps_per_generation")] if isinstance(r, dict) else []
    numbers = [n for n in given if isinstance(n, int) and not isinstance(n, bool) and n >= 1]
    rollout = (numbers[0], numbers[1], numbers[2]) if len(numbers) == 3 else None
    return MicroResult(check, dict(bd.metrics), float(bd.tokens.mask.sum()), float(bd.loss), bd.sampling, rollout)


def check_ref(ref: StepRef, rtol: float, metric_atol: float, ahead: StepRef | None = None) -> MicroResult:
    """Load, evaluate and check one step file (a module-level function: a process pool can run it); ``ahead``,
    the run's next file, is asked of the disk first, so it is read while this one is evaluated."""
    read_ahead(ahead)
    bd, info = evaluate_ref(ref)
    return micro_result(ref, bd, info, rtol, metric_atol)


def _check_ref_args(args: tuple[StepRef, float, float, StepRef | None]) -> MicroResult:
    return check_ref(*args)


def read_ahead(ref: StepRef | None) -> None:
    """Ask the kernel to start reading a step file into the page cache and return at once
    (``posix_fadvise(WILLNEED)``): a cold run's next file is read while the present one is evaluated, instead
    of each file's read stalling its process's core. A hint: where the platform has no fadvise, or the file
    cannot be opened (its load says why), nothing happens."""
    if ref is None or not hasattr(os, "posix_fadvise"):
        return
    try:
        fd = os.open(ref.path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    except OSError:
        pass
    finally:
        os.close(fd)


MicroSeen = Callable[[StepRef, Breakdown, dict[str, Any]], None]


def check_run(
    run: Run,
    rtol: float = DEFAULT_RTOL,
    metric_atol: float = DEFAULT_METRIC_ATOL,
    seen: MicroSeen | None = None,
    pool: Pool | None = None,
) -> RunCheck:
    """Recompute every micro-batch of ``run`` and compare it with the trainer's numbers; ``seen`` gets each
    micro-batch's breakdown and info as it is computed (a view built beside the check evaluates nothing twice).

    ``pool``: anything with ``imap`` (``multiprocessing.Pool``, Ray's ``ray.util.multiprocessing.Pool``)
    evaluates the files in parallel, in order; only each file's small ``MicroResult`` comes back. Serial, or in
    a pool, one micro-batch's breakdown at a time is alive in a process: memory does not grow with the run."""
    result = RunCheck(run.name, rtol, metric_atol)
    logged_all = run.info.get("logged") or {}
    capture = run.info.get("capture")
    # a byte budget reached in the middle of a step leaves it without its last micro-batches: its per-call
    # checks stand, its step-level comparison with the trainer's log (a mean over all of them) cannot
    incomplete = capture.get("incomplete_step") if isinstance(capture, dict) else None
    by_step: dict[int, list[MicroResult]] = {}
    for item in _micro_results(run, rtol, metric_atol, seen, pool):
        by_step.setdefault(item.check.step, []).append(item)
    gathered = run.info.get("source") in GATHERING_SOURCES
    restricted = isinstance(capture, dict) and capture.get("ranks") is not None
    generated = {} if restricted else generation_metrics(by_step, logged_all, incomplete)
    for step in run.step_numbers():
        items = by_step.pop(step)
        ranks = sorted({item.check.rank or 0 for item in items})
        if gathered and len(ranks) > 1:
            items = joined_over_ranks(items, rtol, metric_atol)
        checks = [item.check for item in items]
        result.micro.extend(checks)
        # one entry per micro-batch of the step: over several ranks, their join (each rank holds the same)
        firsts = [item for item in items if (item.check.rank or 0) == ranks[0]] if gathered else items
        mean, weighted = metric_views([(item.metrics, item.tokens) for item in firsts])
        trainer_loss, lens_loss = _step_losses(items, len(ranks))
        # The metrics the loss calls logged (per micro-batch), as the trainer averaged them for the step;
        # generation-batch metrics (reward, completions/*) are the trainer's own view of other rows.
        per_call = set().union(*(c.metrics for c in checks))
        step_log = {} if step == incomplete else logged_all.get(str(step)) or {}
        logged = {k: v for k, v in step_log.items() if _finite(v) is not None}
        metrics = _compare({k: v for k, v in logged.items() if k in per_call}, mean, metric_atol)
        metrics |= _compare(logged, generated.get(step, {}), metric_atol)
        ok = all(m.ok for m in metrics.values())
        result.steps.append(
            StepCheck(step, len(checks), trainer_loss, lens_loss, logged, mean, weighted, metrics, ok, len(ranks))
        )
    return result


# Trainers that gather each loss call's metrics over the processes before logging them: TRL 1.16 logs
# token means reduced over the processes (sums and counts), ``nanmin``/``nanmax`` of the gathered clip extremes,
# ``gather(x).nanmean()`` for the rest: every rank's record of a micro-batch holds the same, joined value.
# verl's actor metrics stay per rank.
GATHERING_SOURCES = ("trl",)
RANK_JOINS: dict[str, Callable[[list[float]], float]] = {"clip_ratio/low_min": min, "clip_ratio/high_max": max}


def _nanmean(values: list[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return sum(kept) / len(kept) if kept else math.nan


def _join(name: str, values: list[tuple[float, float]]) -> float:
    """One metric of one micro-batch index over the ranks, as TRL joins it: a token mean over all ranks' counted
    tokens (its ``global_masked_mean``: summed sums over summed counts), the clip extremes' min or max, else the
    mean of the ranks' values ignoring NaN (``gather(x).nanmean()``)."""
    if name in TOKEN_MEANS:
        total = sum(n for _, n in values)
        return sum(v * n for v, n in values) / total if total else math.nan
    return RANK_JOINS.get(name, _nanmean)([v for v, _ in values])


def joined_over_ranks(items: list[MicroResult], rtol: float, metric_atol: float) -> list[MicroResult]:
    """A step's micro-batches over several ranks, each compared with the trainer's gathered metrics: the
    join over the ranks of the same micro-batch index (``_join``)."""
    by_micro: dict[int, list[MicroResult]] = {}
    for item in items:
        by_micro.setdefault(item.check.micro, []).append(item)
    out = []
    for item in items:
        group = by_micro[item.check.micro]
        names = set.intersection(*(set(g.metrics) for g in group))
        joined = {k: _join(k, [(g.metrics[k], g.tokens) for g in group]) for k in names}
        compared = _compare({k: m.trainer for k, m in item.check.metrics.items()}, joined, metric_atol)
        rel = item.check.rel_error
        ok = (rel is None or rel <= rtol) and all(m.ok for m in compared.values())
        out.append(replace(item, check=replace(item.check, metrics=compared, ok=ok), metrics=joined))
    return out


def generation_metrics(
    by_step: dict[int, list[MicroResult]], logged: dict[str, Any], incomplete: Any = None
) -> dict[int, dict[str, float]]:
    """TRL's ``sampling/*`` as it logs them, per logged step: TRL computes them once per generation batch (the
    ``steps_per_generation`` micro-batches of a rollout's first pass, on each process), gathers them over the
    processes and logs the mean over the generations since the last log. A logged step gets them only when every
    step of its window and every micro-batch of those generations was captured (a sampled or budgeted capture
    leaves the rest unchecked, never guessed)."""
    passes: dict[int, dict[int, list[MicroResult]]] = {}  # rollout -> rank -> its first pass's micro-batches
    starts: dict[int, int] = {}  # rollout -> the step its generation happened in
    for step, items in by_step.items():
        for item in items:
            if item.rollout is None or item.rollout[1] != 1:
                continue
            passes.setdefault(item.rollout[0], {}).setdefault(item.check.rank or 0, []).append(item)
            starts[item.rollout[0]] = min(starts.get(item.rollout[0], step), step)
    ranks = {item.check.rank or 0 for items in by_step.values() for item in items}
    per_generation: dict[int, dict[str, float]] = {}
    for rollout, by_rank in passes.items():
        sums = [[m.sampling for m in micro if m.sampling is not None] for micro in by_rank.values()]
        size = next(iter(by_rank.values()))[0].rollout
        whole = size is not None and set(by_rank) == ranks and all(len(s) == size[2] for s in sums)
        if whole:
            joined = [sum(s, SamplingSums()).metrics() for s in sums]
            per_generation[rollout] = sampling_over_ranks(joined)
    out: dict[int, dict[str, float]] = {}
    logged_steps = sorted(int(k) for k in logged if k.isdigit())
    for before, step in zip([0, *logged_steps], logged_steps, strict=False):
        window = range(before + 1, step + 1)
        if incomplete in window or any(s not in by_step for s in window):
            continue
        rollouts = [r for r, first in starts.items() if first in window]
        if rollouts and all(r in per_generation for r in rollouts):
            values = [per_generation[r] for r in rollouts]
            out[step] = {k: sum(v[k] for v in values) / len(values) for k in SAMPLING_METRICS}
    return out


def _step_losses(items: list[MicroResult], ranks: int) -> tuple[float | None, float]:
    """(trainer's, GRPO Lens's) loss of a step: the sum over its micro-batches, over several ranks the mean of
    each rank's sum (DDP averages the ranks' gradients; the trainer logs the ranks' mean)."""
    losses = [item.check.trainer_loss for item in items]
    trainer = None if any(v is None for v in losses) else sum(v for v in losses if v is not None) / ranks
    return trainer, sum(item.loss for item in items) / ranks


def _micro_results(
    run: Run, rtol: float, metric_atol: float, seen: MicroSeen | None, pool: Pool | None
) -> Iterator[MicroResult]:
    successors: list[StepRef | None] = [*run.steps[1:], None][: len(run.steps)]  # none for a run without files
    pairs = list(zip(run.steps, successors, strict=True))  # each file and the one read ahead
    if pool is not None:
        if seen is not None:
            raise ValueError("check_run: seen needs each breakdown, which a pool does not send back")
        yield from pool.imap(_check_ref_args, [(ref, rtol, metric_atol, ahead) for ref, ahead in pairs])
        return
    for ref, ahead in pairs:
        read_ahead(ahead)
        bd, info = evaluate_ref(ref)
        if seen is not None:
            seen(ref, bd, info)
        yield micro_result(ref, bd, info, rtol, metric_atol)


@contextmanager
def check_pool(jobs: int = 1, ray_address: str | None = None) -> Iterator[Pool | None]:
    """The pool ``check_run`` spreads a run's files over: None for one job; ``jobs`` processes on this machine
    (each with its share of the cores for torch's threads); or, with ``ray_address`` ("auto",
    "ray://host:port", or "local" to start one here), Ray's multiprocessing Pool over that cluster's workers
    (the run must sit on a filesystem they all see, and grpo be importable there)."""
    if ray_address is not None:
        import ray  # optional: only --ray needs it
        from ray.util.multiprocessing import Pool as RayPool

        ray.init(address=None if ray_address == "local" else ray_address, ignore_reinit_error=True)
        ray_pool = RayPool()
        try:
            yield ray_pool
        finally:
            ray_pool.terminate()  # type: ignore[no-untyped-call]
        return
    if jobs <= 1:
        yield None
        return
    threads = max(1, (os.cpu_count() or 1) // jobs)
    # one thread per worker (jobs = cores, the default): forked, as torch's DataLoader forks its workers, which
    # then never use the parent's OpenMP pool; several threads each, or a process a fork is not safe in: spawned,
    # importing torch afresh (seconds)
    method = "fork" if threads == 1 and fork_is_safe() else "spawn"
    with multiprocessing.get_context(method).Pool(jobs, initializer=_start_worker, initargs=(threads,)) as p:
        yield LocalPool(p, jobs)


def _start_worker(threads: int) -> None:
    """A check pool's process: its share of the cores for torch's threads, and glibc keeping freed memory in
    the heap (``keep_freed_memory``): each file's evaluate allocates dozens of (B, T) tensors, which without it
    are page-faulted in afresh for every file (a forked worker inherits the setting when its parent made it;
    a spawned one, or a pool a library caller opens, would not)."""
    torch.set_num_threads(threads)
    keep_freed_memory()


FILES_PER_TASK = 8
"""The most files a local pool hands a worker at once (``imap``'s chunksize): one file per task is a round trip
through the pool's pipes and the parent's task and result threads per file (~0.3 ms of the parent's CPU beside
~7 ms of a worker's for a 64 x 2048 file); a larger chunk leaves a worker idle longer at the end of the run."""


@dataclass(frozen=True)
class LocalPool:
    """``check_pool``'s processes on this machine: ``imap`` in chunks of up to ``FILES_PER_TASK`` files,
    fewer for a run too short to give every process four chunks."""

    pool: multiprocessing.pool.Pool
    jobs: int

    def imap(self, func: Callable[[Any], MicroResult], iterable: Iterable[Any]) -> Iterator[MicroResult]:
        items = list(iterable)
        return self.pool.imap(func, items, chunksize=files_per_task(len(items), self.jobs))


def files_per_task(files: int, jobs: int) -> int:
    """A local pool's chunksize: ``FILES_PER_TASK``, or less so each of ``jobs`` processes gets >= 4 chunks."""
    return max(1, min(FILES_PER_TASK, files // (4 * jobs)))


FORK_UNSAFE_MODULES = ("ray", "grpc")
"""Libraries that start native threads of their own (gRPC's event engine, Ray's core worker): one may hold a lock
at the moment of a fork, which the forked child then waits on forever (a check-run in a Ray driver, or in a
process that ran one, hung so)."""


def fork_is_safe() -> bool:
    """Whether this process may fork its check workers: no Python thread but the main one, and none of
    ``FORK_UNSAFE_MODULES`` imported (their threads are native: ``threading`` does not see them)."""
    return threading.active_count() == 1 and not any(name in sys.modules for name in FORK_UNSAFE_MODULES)


class Pool(Protocol):
    def imap(self, func: Callable[[Any], MicroResult], iterable: Iterable[Any]) -> Iterator[MicroResult]: ...


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
