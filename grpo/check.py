"""Check a run: recompute every captured micro-batch and compare with what the trainer returned and logged.

Per micro-batch: the trainer's returned loss against GRPO Lens's under the file's config (the
relative error is taken against the size of the terms that sum to the loss, since they cancel
when the loss is near 0), and every metric both name. Per step: the trainer's logged loss against
GRPO Lens's joined as the trainer logs it (``logged_loss``), and the trainer's logged metrics (TRL
and verl log the plain mean over micro-batches) against GRPO Lens's plain mean, with the
token-weighted mean beside it, labelled. ``python -m grpo check-run RUN_DIR`` prints this.

Every micro-batch, step and run gets a verdict: ``match`` (compared with a number the trainer wrote,
within tolerance), ``differ`` (a compared number past tolerance), ``unchecked`` (nothing past
tolerance, but something the trainer did not write, or that the capture could not join, was left
uncompared: the reasons say what), or ``error`` (the step file could not be read or evaluated: the
message says why). Joined, the worst wins: error, differ, unchecked, match.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import Any, TypeGuard

from torch import Tensor

from grpo.check_pool import FILES_PER_TASK as FILES_PER_TASK
from grpo.check_pool import FORK_UNSAFE_MODULES as FORK_UNSAFE_MODULES
from grpo.check_pool import LocalPool as LocalPool
from grpo.check_pool import Pool, start_worker
from grpo.check_pool import check_pool as check_pool
from grpo.check_pool import files_per_task as files_per_task
from grpo.check_pool import fork_is_safe as fork_is_safe
from grpo.check_results import (
    DIFFER as DIFFER,
)
from grpo.check_results import (
    ERROR as ERROR,
)
from grpo.check_results import (
    MATCH as MATCH,
)
from grpo.check_results import (
    UNCHECKED as UNCHECKED,
)
from grpo.check_results import (
    VERDICTS as VERDICTS,
)
from grpo.check_results import (
    MetricCheck as MetricCheck,
)
from grpo.check_results import (
    MicroCheck as MicroCheck,
)
from grpo.check_results import (
    MicroResult as MicroResult,
)
from grpo.check_results import (
    RunCheck as RunCheck,
)
from grpo.check_results import (
    StepCheck as StepCheck,
)
from grpo.check_results import (
    StepItems as StepItems,
)
from grpo.check_results import compare, finite
from grpo.check_results import (
    joined_verdict as joined_verdict,
)
from grpo.check_results import (
    metric_views as metric_views,
)
from grpo.check_results import (
    settled as settled,
)
from grpo.check_results import (
    verdict_of as verdict_of,
)
from grpo.check_text import format_check as format_check
from grpo.config import LossConfig
from grpo.corrections import SAMPLING_METRICS, SamplingSums, sampling_over_ranks
from grpo.loss import Breakdown, evaluate
from grpo.metrics import TOKEN_MEANS
from grpo.run_directory import Run, StepRef, load_step

DEFAULT_RTOL = 1e-5
DEFAULT_METRIC_ATOL = 1e-6
SCALING_FIELDS = (
    "gradient_accumulation_steps",
    "token_normalizer",
    "sequence_normalizer",
    "entropy_accumulation_steps",
)


def replay_config(stored: LossConfig, overrides: dict[str, Any] | None) -> LossConfig:
    """A stored config under overrides (``preset`` replaces it); the trainer's scaling is kept."""
    return LossConfig.resolve(overrides, base=stored, keep=SCALING_FIELDS) if overrides else stored


def evaluate_ref(ref: StepRef, overrides: dict[str, Any] | None = None) -> tuple[Breakdown, dict[str, Any]]:
    """The breakdown of one step file (under its own config, or with ``overrides``) and its info."""
    batch, stored, info = load_step(ref.path)
    return evaluate(batch, replay_config(stored, overrides)), info


NO_TRAINER_LOSS = "the trainer's returned loss: the step file does not record it"


def check_micro(ref: StepRef, bd: Breakdown, info: dict[str, Any], rtol: float, atol: float) -> MicroCheck:
    meta = info["meta"] if isinstance(info.get("meta"), dict) else {}
    lens = float(bd.loss)
    given = meta.get("loss")
    trainer, rel = finite(given), None
    if trainer is not None:
        scale = max(abs(trainer), float(bd.tokens.loss.abs().sum()), 1e-30)
        rel = abs(lens - trainer) / scale
    elif isinstance(given, float):  # NaN or inf returned (JSON NaN): the same non-finite value matches
        trainer = given
        rel = 0.0 if (math.isnan(given) and math.isnan(lens)) or given == lens else math.inf
    logged = meta.get("metrics")  # a trainer's log is free-form: only an object of numbers is compared
    metrics = compare(logged if isinstance(logged, dict) else {}, bd.metrics, atol)
    applied = info.get("trainer", {}).get("importance_sampling_ratio")
    if applied is not None:
        metrics[IS_WEIGHT_CHECK] = _weights_check(applied, bd, atol)
    unchecked = cannot_check(meta)
    if rel is None and not unchecked:
        unchecked = [NO_TRAINER_LOSS]
    n = int(bd.tokens.mask.sum())
    check = MicroCheck(ref.step, ref.micro, ref.rank, ref.path.name, trainer, lens, rel, n, metrics, True)
    return settled(check, rtol, unchecked)


def cannot_check(meta: dict[str, Any]) -> list[str]:
    """What a step file says cannot be compared (an importer's ``cannot_check`` / ``unchecked`` sentences)."""
    reasons = [*(meta.get("cannot_check") or []), *(meta.get("unchecked") or [])]
    return [str(r) for r in reasons if isinstance(r, str)]


def failed_micro(ref: StepRef, exc: BaseException) -> MicroResult:
    """A step file that could not be read or evaluated: its ``error``, so the rest of the run is still checked."""
    message = f"{type(exc).__name__}: {exc}"[:2000]
    check = MicroCheck(ref.step, ref.micro, ref.rank, ref.path.name, None, None, None, 0, {}, False, ERROR, [], message)
    return MicroResult(check, {}, 0.0, math.nan)


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


def micro_result(ref: StepRef, bd: Breakdown, info: dict[str, Any], rtol: float, metric_atol: float) -> MicroResult:
    """What a step's check keeps of one micro-batch's breakdown."""
    check = check_micro(ref, bd, info, rtol, metric_atol)
    meta: dict[str, Any] = info["meta"] if isinstance(info.get("meta"), dict) else {}
    r = meta.get("rollout")
    given = [r.get(k) for k in ("rollout", "iteration", "steps_per_generation")] if isinstance(r, dict) else []
    numbers: list[int] = [n for n in given if _whole(n)]
    rollout = (numbers[0], numbers[1], numbers[2]) if len(numbers) == 3 else None
    scaling: dict[str, Any] = meta["scaling"] if isinstance(meta.get("scaling"), dict) else {}
    processes = next((n for n in (meta.get("processes"), scaling.get("num_processes")) if _whole(n)), None)
    parts = {"actor/pg_loss": float(bd.policy_loss)}
    if bd.config.beta != 0:
        parts["actor/kl_loss"] = float(bd.kl_loss) / bd.config.beta
    if "actor/entropy_loss" in bd.metrics:
        parts["actor/entropy_loss"] = bd.metrics["actor/entropy_loss"]
    global_batch = (scaling.get("dp_size") or 1) > 1 or any(
        scaling.get(k) is not None for k in ("batch_num_tokens", "global_batch_size")
    )
    tokens, loss, scale = float(bd.tokens.mask.sum()), float(bd.loss), float(bd.tokens.loss.abs().sum())
    return MicroResult(
        check, dict(bd.metrics), tokens, loss, bd.sampling, rollout, scale, processes, parts, global_batch
    )


def _whole(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def check_ref(ref: StepRef, rtol: float, metric_atol: float, ahead: StepRef | None = None) -> MicroResult:
    """Load, evaluate and check one step file (a module-level function: a process pool can run it); ``ahead``,
    the run's next file, is asked of the disk first, so it is read while this one is evaluated. A file that
    cannot be read or evaluated is that file's ``error``: the run's other files are still checked, and nothing
    but a small result crosses back from a pool's process."""
    read_ahead(ahead)
    try:
        bd, info = evaluate_ref(ref)
        return micro_result(ref, bd, info, rtol, metric_atol)
    except Exception as exc:  # any failure of one file is that file's verdict, said with its message
        return failed_micro(ref, exc)


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
    return run_check_from(run, _micro_results(run, rtol, metric_atol, seen, pool), rtol, metric_atol)


def run_check_from(
    run: Run, results: Iterable[MicroResult], rtol: float = DEFAULT_RTOL, metric_atol: float = DEFAULT_METRIC_ATOL
) -> RunCheck:
    """The run's check from each step file's ``MicroResult`` (``check_ref``'s, in the run's file order): the
    cheap join of ``check_run`` without its evaluations, so results kept from an earlier pass join again."""
    logged_all = run.info.get("logged") or {}
    capture = run.info.get("capture")
    # a byte budget reached in the middle of a step leaves it without its last micro-batches: its per-call
    # checks stand, its step-level comparison with the trainer's log (a mean over all of them) cannot
    incomplete = capture.get("incomplete_step") if isinstance(capture, dict) else None
    by_step: dict[int, list[MicroResult]] = {}
    for item in results:
        by_step.setdefault(item.check.step, []).append(item)
    source = run.info.get("source")
    gathered = source in GATHERING_SOURCES
    restricted = isinstance(capture, dict) and capture.get("ranks") is not None
    generated = {} if restricted else generation_metrics(by_step, logged_all, incomplete)
    steps: list[StepItems] = []
    for step in run.step_numbers():
        items = by_step.pop(step)
        ranks = sorted({item.check.rank or 0 for item in items})
        world = _processes(items, ranks)
        missing = sorted(set(range(world)) - set(ranks)) if world is not None else None
        reasons: list[str] = []
        if gathered and missing != []:
            items = [_ungathered(item, rtol, world, ranks) for item in items]
            reasons.append(_ranks_reason(world, ranks))
        elif gathered and len(ranks) > 1:
            items = joined_over_ranks(items, rtol, metric_atol)
        steps.append(StepItems(step, items, ranks, reasons, step == incomplete))
    logged_losses = logged_loss_checks(source, steps, logged_all, rtol)
    windows = window_means(steps, logged_all) if gathered else {}
    result = RunCheck(run.name, rtol, metric_atol, unchecked_run=run_reasons(run))
    for s in steps:
        result.micro.extend(item.check for item in s.items)
        logged_loss, window = logged_losses.get(s.number), windows.get(s.number)
        result.steps.append(s.check(logged_all, generated.get(s.number, {}), logged_loss, metric_atol, window))
    return result


def window_means(steps: list[StepItems], logged: dict[str, Any]) -> dict[int, dict[str, float] | str]:
    """Per logged step whose logging window spans several steps (``logging_steps`` > 1), GRPO Lens's loss-call
    metrics as TRL logs them there: the plain mean over every loss call since the last log (TRL appends each
    call's gathered metrics and averages them at the log); or why the window cannot be joined (a sentence)."""
    by_number = {s.number: s for s in steps}
    out: dict[int, dict[str, float] | str] = {}
    logged_steps = sorted(int(k) for k, v in logged.items() if k.isdigit() and v)
    for before, number in zip([0, *logged_steps], logged_steps, strict=False):
        window = range(before + 1, number + 1)
        if number not in by_number or len(window) == 1:
            continue
        gap = _window_gap(window, by_number)
        if gap is not None:
            out[number] = gap.replace("the logged loss", "the logged metrics")
            continue
        calls = [item for n in window for item in by_number[n].firsts()]
        out[number] = metric_views([(item.metrics, item.tokens) for item in calls])[0]
    return out


def run_reasons(run: Run) -> list[str]:
    """What of the run as a whole cannot be compared: no step files, a capture that chose nothing."""
    out = [] if run.steps else ["the run holds no step files: nothing was compared"]
    capture = run.info.get("capture")
    chose = capture.get("chooses_nothing") if isinstance(capture, dict) else None
    if isinstance(chose, str):
        out.append(f"the capture chose nothing: {chose}")
    return out


def _processes(items: list[MicroResult], ranks: list[int]) -> int | None:
    """The processes the run's trainer ran on: as recorded; else one when no file names a rank; else unknown."""
    recorded = {item.processes for item in items if item.processes is not None}
    if recorded:
        return max(recorded)
    return 1 if all(item.check.rank is None for item in items) else None


def _ranks_reason(world: int | None, ranks: list[int]) -> str:
    captured = ", ".join(map(str, ranks))
    of = "an unrecorded number of processes" if world is None else f"{world} processes"
    return (
        f"the metrics TRL gathers over the processes and the step's logged loss: the run had {of} and rank "
        f"{captured} alone was captured (they are compared only when every rank of the step is)"
    )


def _ungathered(item: MicroResult, rtol: float, world: int | None, ranks: list[int]) -> MicroResult:
    """A micro-batch of a run whose step lacks some ranks: TRL's metrics are gathered over every rank, so they
    cannot be compared with these ranks' alone (its returned loss, per rank, still is)."""
    if item.check.error is not None:
        return item
    check = replace(item.check, metrics={k: v for k, v in item.check.metrics.items() if k == IS_WEIGHT_CHECK})
    reasons = [*check.unchecked, _ranks_reason(world, ranks)]
    return replace(item, check=settled(check, rtol, reasons))


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
        if item.check.error is not None:
            out.append(item)
            continue
        if any(g.check.error is not None for g in group):  # a rank's file unread: the join cannot be made
            reason = "the metrics TRL gathers over the processes: a rank's step file of this micro-batch is unread"
            check = settled(replace(item.check, metrics={}), rtol, [*item.check.unchecked, reason])
            out.append(replace(item, check=check))
            continue
        names = set.intersection(*(set(g.metrics) for g in group))
        joined = {k: _join(k, [(g.metrics[k], g.tokens) for g in group]) for k in names}
        compared = compare({k: m.trainer for k, m in item.check.metrics.items()}, joined, metric_atol)
        out.append(replace(item, check=settled(replace(item.check, metrics=compared), rtol), metrics=joined))
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


# --- the logged loss, joined as the trainer logs it --------------------------------------------------------
def logged_loss_checks(
    source: Any, steps: list[StepItems], logged: dict[str, Any], rtol: float
) -> dict[int, MetricCheck | str]:
    """Per logged step, the trainer's logged loss against GRPO Lens's joined as the trainer logs it (a
    ``MetricCheck``), or why it cannot be (a sentence: a step of the logging window or a rank not captured, a
    file unread). Only TRL logs a step's total: verl 0.9.1 logs its parts (``VERL_LOSS_KEYS``, joined in
    ``verl_logged_parts``)."""
    by_number = {s.number: s for s in steps}
    if source == "verl":
        return verl_logged_parts(by_number, logged, rtol)
    if source not in GATHERING_SOURCES:
        return {}
    out: dict[int, MetricCheck | str] = {}
    logged_steps = sorted(int(k) for k, v in logged.items() if k.isdigit() and finite((v or {}).get("loss")))
    for before, number in zip([0, *logged_steps], logged_steps, strict=False):
        window = range(before + 1, number + 1)
        if number not in by_number:
            continue
        reason = _window_gap(window, by_number)
        if reason is not None:
            out[number] = reason
            continue
        joined = trl_logged_loss([by_number[n] for n in window], before)
        scale = sum(item.scale for n in window for item in by_number[n].items)
        scale /= len(by_number[number].ranks) * len(window)
        out[number] = _loss_check(float(logged[str(number)]["loss"]), joined, scale, rtol)
    return out


def _window_gap(window: range, by_number: dict[int, StepItems]) -> str | None:
    """Why a logging window's loss cannot be joined from what was captured (None: it can)."""
    span = f"step {window[0]}" if len(window) == 1 else f"steps {window[0]}-{window[-1]}"
    what = f"the logged loss (the mean over {span})"
    for n in window:
        s = by_number.get(n)
        if s is None:
            return f"{what}: step {n} was not captured"
        if s.incomplete:
            return f"{what}: the capture's byte budget cut step {n} short"
        if s.failed:
            return f"{what}: a step file of step {n} could not be read"
        if s.reasons:  # a rank not captured
            return f"{what}: not every rank of step {n} was captured"
    return None


def trl_logged_loss(window: list[StepItems], before: int) -> float:
    """The loss transformers 5's ``Trainer`` logs for a window of steps, from GRPO Lens's micro-batch losses: each
    rank adds every micro-batch's returned loss to its ``tr_loss`` (TRL's is already divided by gradient
    accumulation: ``loss_is_scaled_for_ga``); a non-finite one is replaced by ``tr_loss / (1 + global_step -
    last_logged)`` (``logging_nan_inf_filter``, on by default); at the log, the ranks' ``tr_loss`` are gathered
    and meaned, and divided by the steps since the last log."""
    totals: dict[int, float] = {}
    for s in window:
        for rank, losses in s.rank_losses().items():
            total = totals.get(rank, 0.0)
            for loss in losses:  # during step s the trainer's global_step is s - 1
                total += loss if math.isfinite(loss) else total / (1 + (s.number - 1) - before)
            totals[rank] = total
    return sum(totals.values()) / len(totals) / len(window)


def _loss_check(trainer: float, lens: float, scale: float, rtol: float) -> MetricCheck:
    """A loss against the trainer's, relative to the size of its terms (they cancel near 0)."""
    diff = abs(lens - trainer) / max(abs(trainer), scale, 1e-30)
    return MetricCheck(trainer, lens, diff, diff <= rtol)


VERL_LOSS_KEYS = ("actor/pg_loss", "actor/kl_loss", "actor/entropy_loss")
"""What verl 0.9.1 logs of a step's loss: no total, each part apart (``verl.workers.utils.losses.ppo_loss``)."""


def verl_logged_parts(
    by_number: dict[int, StepItems], logged: dict[str, Any], rtol: float
) -> dict[int, MetricCheck | str]:
    """verl's logged loss parts against GRPO Lens's, joined as ``Metric.aggregate_dp`` joins them: the mean over
    the data-parallel ranks per micro-batch index, then summed over the micro-batches when the loss is normalised
    by the global batch (several ranks, or global token or row counts: verl's ``AggregationType.SUM``), else
    averaged. The worst part is the step's ``logged_loss``."""
    out: dict[int, MetricCheck | str] = {}
    for number, s in by_number.items():
        given = {k: v for k, v in (logged.get(str(number)) or {}).items() if k in VERL_LOSS_KEYS and finite(v)}
        if not given:
            continue
        gap = _window_gap(range(number, number + 1), by_number)
        if gap is not None:
            out[number] = gap.replace("the logged loss (the mean over step", "verl's logged loss parts (step")
            continue
        by_micro: dict[int, list[MicroResult]] = {}
        for item in s.items:
            by_micro.setdefault(item.check.micro, []).append(item)
        summed = len(s.ranks) > 1 or any(item.global_batch for item in s.items)
        worst: MetricCheck | None = None
        for key, value in given.items():
            per_micro = [[g.parts[key] for g in group if key in g.parts] for group in by_micro.values()]
            if not all(per_micro):
                continue
            means = [sum(v) / len(v) for v in per_micro]
            lens = sum(means) if summed else sum(means) / len(means)
            scale = sum(item.scale for item in s.items) / len(s.ranks)
            check = _loss_check(float(value), lens, scale, rtol)
            worst = check if worst is None or check.diff > worst.diff else worst
        if worst is not None:
            out[number] = worst
    return out


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
        try:
            bd, info = evaluate_ref(ref)
        except Exception as exc:  # as check_ref: the file's error, the run goes on
            yield failed_micro(ref, exc)
            continue
        if seen is not None:
            seen(ref, bd, info)
        yield micro_result(ref, bd, info, rtol, metric_atol)


_start_worker = start_worker  # a check pool's initializer, for callers that open a pool of their own
_Step = StepItems  # a step's micro-batch results, under the private name the verdict tests build them by
