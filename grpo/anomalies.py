"""The anomalies of a run's timeline: each found at its step, with the tokens that carry it and a sentence.

A rolling baseline is the mean and population standard deviation (summed with ``math.fsum``) of a series over
the ``window`` steps before
a step that have a value; it counts once ``min_history`` of them do. Every anomaly names the step file
(``micro``, ``rank``) that holds its tokens, so a page can open that micro-batch with them marked. The
sentences write their numbers with ``grpo.marks.number``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from grpo.check import DIFFER, RunCheck
from grpo.marks import number


@dataclass(frozen=True)
class AnomalyThresholds:
    """When a step of a run's timeline is an anomaly (``grpo.runs.timeline``)."""

    spike_z: float = 4.0
    """Loss spike: the step's loss is at least this many standard deviations above its rolling mean. Default 4."""
    clip_jump: float = 0.1
    """Clip jump: a clip fraction moved at least this much (absolute) from its rolling mean. Default 0.1."""
    mismatch_growth: float = 3.0
    """Mismatch growth: the training/sampler mismatch mean reached this many times its mean over the first
    ``window`` steps (reported at the first step it holds). Default 3."""
    entropy_drop: float = 0.5
    """Entropy collapse: the step's entropy fell below this fraction of its rolling mean. Default 0.5."""
    kl_z: float = 4.0
    """KL blow-up: the step's KL is at least this many standard deviations above its rolling mean. Default 4."""
    few_tokens_share: float = 0.5
    """Few tokens: the step's ``few_tokens`` largest tokens hold at least this share of the sum of
    |per-token loss| over its counted tokens. Default 0.5."""
    few_tokens: int = 3
    """How many tokens "a handful" is (the few-tokens anomaly; the tokens a spike or blow-up names). Default 3."""
    window: int = 20
    """Steps in a rolling baseline (and the first steps the mismatch is measured against). Default 20."""
    min_history: int = 5
    """Steps with a value a rolling baseline needs before it counts. Default 5."""

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ValueError(f"AnomalyThresholds.{name}: a finite number >= 0, got {value!r}")
        if self.few_tokens < 1 or self.window < 1 or self.min_history < 1:
            raise ValueError("AnomalyThresholds: few_tokens, window and min_history are at least 1")


Token = list[Any]  # [row, col, value]
Baseline = tuple[float, float, int]  # a rolling baseline: (mean, population std, count)


@dataclass(frozen=True)
class Spot:
    """Tokens of one step file: where an anomaly's tokens are."""

    micro: int
    rank: int | None
    tokens: list[Token]


def rolling(values: Sequence[float | None], i: int, t: AnomalyThresholds) -> Baseline | None:
    """(mean, population std, count) of the ``window`` values before index ``i`` that exist (None: too few):
    the mean ``fsum(x) / n``, the std ``sqrt(fsum((x - mean)²) / n)``."""
    before = [v for v in values[max(0, i - t.window) : i] if v is not None]
    if len(before) < t.min_history:
        return None
    mean = math.fsum(before) / len(before)
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in before) / len(before)), len(before)


def _rows(tokens: list[Token]) -> str:
    rows = sorted({int(tok[0]) for tok in tokens})
    if len(rows) == 1:
        return f"row {rows[0]}"
    return "rows " + ", ".join(map(str, rows[:-1])) + f" and {rows[-1]}"


def _where(spot: Spot) -> str:
    rank = "" if spot.rank is None else f", rank {spot.rank}"
    return f"micro-batch {spot.micro}{rank}"


def anomaly(
    step: int, kind: str, value: float, baseline: float | None, spot: Spot | None, sentence: str, series: str = "loss"
) -> dict[str, Any]:
    """One anomaly; ``series``: the timeline series it is marked on ("loss" for the loss's own kinds)."""
    tokens = [] if spot is None else [[int(r), int(c)] for r, c, _ in spot.tokens]
    return {
        "step": step, "kind": kind, "value": value, "baseline": baseline,
        "micro": None if spot is None else spot.micro, "rank": None if spot is None else spot.rank,
        "rows": sorted({r for r, _ in tokens}), "tokens": tokens, "sentence": sentence, "series": series,
    }  # fmt: skip


@dataclass(frozen=True)
class StepView:
    """What the anomalies read of one step: its series, loss and verdict, and where its tokens are."""

    step: int
    loss: float | None
    series: dict[str, float | None]
    verdict: str
    counted: int
    """The step's counted tokens (every file of it)."""
    abs_loss: float
    """The sum of |per-token loss| over the step's files."""
    top_loss: Callable[[int], tuple[Spot, float] | None]
    """The step's ``n`` largest tokens by |loss| (those in the file holding the largest), and their |loss| sum."""
    spots: dict[str, Spot | None]
    """The tokens of other kinds: ``kl``, ``mismatch``, ``clipped``, ``entropy``."""


def find_anomalies(
    steps: list[StepView],
    check: RunCheck,
    t: AnomalyThresholds,
    labels: dict[str, str],
    start: int = 0,
    earlier: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Every anomaly of the run, by step, then kind; ``labels`` names the series as the answer does.
    ``earlier``: the anomalies of the steps before index ``start``, found before (a step's anomalies read only
    the steps before it, and the mismatch's the first ``window``): only the steps from ``start`` are looked at."""
    earlier = earlier or []
    losses = [s.loss for s in steps]
    series = {name: [v.series.get(name) for v in steps] for name in (*CLIP_SERIES, "kl", "entropy")}
    found: list[dict[str, Any]] = []
    for i, s in enumerate(steps[start:], start):
        found += _spike(s, rolling(losses, i, t), t)
        found += _few_tokens(s, t)
        found += _clip_jump(s, [(n, rolling(series[n], i, t)) for n in CLIP_SERIES], t, labels)
        found += _kl(s, rolling(series["kl"], i, t), t)
        found += _entropy(s, rolling(series["entropy"], i, t), t)
        if s.verdict == DIFFER:
            found.append(differ_anomaly(s, check))
    if not any(a["kind"] == "mismatch_growth" for a in earlier):
        found += _mismatch(steps, t, start)
    return earlier + sorted(found, key=lambda a: (a["step"], KINDS.index(a["kind"])))


KINDS = ("differ", "loss_spike", "few_tokens", "kl_blowup", "clip_jump", "mismatch_growth", "entropy_collapse")
CLIP_SERIES = ("clip_low", "clip_high", "clip_dual", "clip_region")


def _spike(s: StepView, base: Baseline | None, t: AnomalyThresholds) -> list[dict[str, Any]]:
    if s.loss is None or base is None or base[1] == 0:
        return []
    mean, std, _ = base
    z = (s.loss - mean) / std
    top = s.top_loss(t.few_tokens)
    if z < t.spike_z or top is None:
        return []
    spot, carried = top
    share = carried / s.abs_loss if s.abs_loss else 0.0
    sentence = (
        f"{_above_mean(s, 'loss', s.loss, base)}; {len(spot.tokens)} tokens of {_rows(spot.tokens)} "
        f"({_where(spot)}) carry {number(100 * share, 3)}% of its sum of |per-token loss|."
    )
    return [anomaly(s.step, "loss_spike", s.loss, mean, spot, sentence)]


def _above_mean(s: StepView, what: str, value: float, base: Baseline) -> str:
    """The sentence of a loss spike and a KL blow-up: "Step S's WHAT V is Z standard deviations above the mean
    of the N steps before it (M ± SD)"."""
    mean, std, n = base
    return (
        f"Step {s.step}'s {what} {number(value)} is {number((value - mean) / std, 2)} standard deviations above "
        f"the mean of the {n} steps before it ({number(mean)} ± {number(std)})"
    )


def _few_tokens(s: StepView, t: AnomalyThresholds) -> list[dict[str, Any]]:
    top = s.top_loss(t.few_tokens)
    if top is None or s.abs_loss == 0 or s.counted <= t.few_tokens:
        return []
    spot, carried = top
    share = carried / s.abs_loss
    if share < t.few_tokens_share or len(spot.tokens) > t.few_tokens:
        return []
    sentence = (
        f"Step {s.step}'s loss is carried by {len(spot.tokens)} of its {s.counted} tokens: those of "
        f"{_rows(spot.tokens)} ({_where(spot)}) hold {number(100 * share, 3)}% of its sum of |per-token loss| "
        f"({number(carried)} of {number(s.abs_loss)})."
    )
    return [anomaly(s.step, "few_tokens", share, t.few_tokens_share, spot, sentence)]


def _clip_jump(
    s: StepView, bases: list[tuple[str, Baseline | None]], t: AnomalyThresholds, labels: dict[str, str]
) -> list[dict[str, Any]]:
    jumps = []
    for name, base in bases:
        value = s.series.get(name)
        if value is not None and base is not None and abs(value - base[0]) >= t.clip_jump:
            jumps.append((abs(value - base[0]), name, value, base))
    if not jumps:
        return []
    _, name, value, (mean, _, n) = max(jumps)
    way = "up" if value > mean else "down"
    text = (
        f"Step {s.step}'s {labels.get(name, name)} jumped {way} to {number(value)} from a mean of "
        f"{number(mean)} over the {n} steps before it (a change of {number(abs(value - mean))})"
    )
    return _marked(s, "clip_jump", name, value, mean, text)


# kind -> (the spot of StepView.spots holding its tokens, the clause that names where they are)
SPOTS = {
    "clip_jump": ("clipped", "the most off-ratio clipped tokens are in"),
    "kl_blowup": ("kl", "its largest per-token KL is in"),
    "entropy_collapse": ("entropy", "its lowest-entropy tokens are in"),
    "mismatch_growth": ("mismatch", "the most mismatched tokens are in"),
}


def _marked(s: StepView, kind: str, series: str, value: float, baseline: float, text: str) -> list[dict[str, Any]]:
    """The anomaly ``kind`` of step ``s`` on ``series``: its sentence is ``text``, then the clause naming where
    its tokens are ("; WHAT rows ... (file)", nothing without a spot)."""
    key, what = SPOTS[kind]
    spot = s.spots.get(key)
    where = "" if spot is None else f"; {what} {_rows(spot.tokens)} ({_where(spot)})"
    return [anomaly(s.step, kind, value, baseline, spot, f"{text}{where}.", series)]


def _kl(s: StepView, base: Baseline | None, t: AnomalyThresholds) -> list[dict[str, Any]]:
    value = s.series.get("kl")
    if value is None or base is None or base[1] == 0 or (value - base[0]) / base[1] < t.kl_z:
        return []
    return _marked(s, "kl_blowup", "kl", value, base[0], _above_mean(s, "KL", value, base))


def _entropy(s: StepView, base: Baseline | None, t: AnomalyThresholds) -> list[dict[str, Any]]:
    value = s.series.get("entropy")
    if value is None or base is None or base[0] <= 0 or value >= t.entropy_drop * base[0]:
        return []
    mean, _, n = base
    text = (
        f"Step {s.step}'s entropy {number(value)} fell to {number(100 * value / mean, 3)}% of its mean over the "
        f"{n} steps before it ({number(mean)})"
    )
    return _marked(s, "entropy_collapse", "entropy", value, mean, text)


def _mismatch(steps: list[StepView], t: AnomalyThresholds, start: int = 0) -> list[dict[str, Any]]:
    """The first step, after the first ``window`` steps, whose mismatch mean reached ``mismatch_growth`` times
    theirs (from index ``start`` on: the steps before it did not)."""
    first = [s.series.get("mismatch_mean") for s in steps[: t.window]]
    known = [v for v in first if v is not None]
    base = math.fsum(known) / len(known) if known else 0.0
    if len(known) < t.min_history or base <= 0:
        return []
    for s in steps[max(t.window, start) :]:
        value = s.series.get("mismatch_mean")
        if value is None or value < t.mismatch_growth * base:
            continue
        text = (
            f"Step {s.step}'s mean training/sampler mismatch |old − sampler| {number(value)} is "
            f"{number(value / base, 3)} times its mean over the first {len(known)} steps ({number(base)})"
        )
        return _marked(s, "mismatch_growth", "mismatch_mean", value, base, text)
    return []


def differ_anomaly(s: StepView, check: RunCheck) -> dict[str, Any]:
    """A step whose verdict is differ: the first number of it past tolerance, said with both values."""
    micro = next((m for m in check.micro if m.step == s.step and m.verdict == DIFFER), None)
    step = next(c for c in check.steps if c.step == s.step)
    top = s.top_loss(3)
    spot = None if top is None else top[0]
    if micro is not None:
        spot = Spot(micro.micro, micro.rank, spot.tokens if spot and spot.micro == micro.micro else [])
        if micro.rel_error is not None and micro.rel_error > check.rtol and micro.trainer_loss is not None:
            what = f"the loss {number(micro.lens_loss or math.nan)} against the trainer's {number(micro.trainer_loss)}"
            gap, tol = micro.rel_error, check.rtol
        else:
            name, m = max(((k, v) for k, v in micro.metrics.items() if not v.ok), key=lambda kv: kv[1].diff)
            what = f"{name} {number(m.lens)} against the trainer's {number(m.trainer)}"
            gap, tol = m.diff, check.metric_atol
        where = _where(spot)
    else:
        failed = [(k, v) for k, v in step.metrics.items() if not v.ok]
        if step.logged_loss is not None and not step.logged_loss.ok:
            failed = [("the logged loss", step.logged_loss)]
        name, m = max(failed, key=lambda kv: kv[1].diff)
        tol = check.rtol if name == "the logged loss" else check.metric_atol
        what, gap, where = f"{name} {number(m.lens)} against the trainer's {number(m.trainer)}", m.diff, "the step"
    sentence = (
        f"Step {s.step} differs from the trainer: in {where}, {what} "
        f"(a difference of {number(gap)}, past {number(tol)})."
    )
    return anomaly(s.step, "differ", gap, tol, spot, sentence)
