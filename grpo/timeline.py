"""A run's timeline: per step, every number GRPO Lens recomputes beside what the trainer logged, and its anomalies.

``timeline(run_dir)`` evaluates each step file once (``grpo.check``'s per-file machinery, in a pool with
``jobs`` > 1), keeps of it only its ``MicroResult`` and small facts (``FileFacts``: sums, counts, its top
tokens), and joins them: the check's join (``run_check_from``) gives each step's loss as the trainer logs it
and its verdict; the facts give the series and the anomalies' tokens (``grpo.anomalies``).

The answer is kept beside the run (``.lens-timeline.json``, or under ``cache_dir`` when the run directory is
not writable) with the run state it was computed from: a later call with the same state answers from it
without reading a step file; a call that finds new (or changed) step files evaluates only those and joins again.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from grpo.anomalies import AnomalyThresholds, Spot, StepView, find_anomalies
from grpo.check import (
    DEFAULT_METRIC_ATOL,
    DEFAULT_RTOL,
    MetricCheck,
    MicroCheck,
    MicroResult,
    RunCheck,
    StepCheck,
    check_pool,
    failed_micro,
    micro_result,
    read_ahead,
    replay_config,
    run_check_from,
)
from grpo.corrections import MASKED, NOT_SCORED, REJECTED, SEQUENCE_MASKED, SamplingSums
from grpo.errors import GrpoInputError
from grpo.loss import Breakdown, evaluate
from grpo.objectives import CLIP_HIGH, CLIP_LOW, DUAL_CLIP
from grpo.run_directory import Run, StepRef, load_run, load_step, read_regular, write_atomic

TOP_TOKENS = 16
"""Tokens each file keeps of each kind (its largest |loss|, KL, mismatch; its clipped; its lowest entropy)."""


@dataclass(frozen=True)
class Series:
    name: str
    label: str
    description: str
    trainer: dict[str, str] = field(default_factory=dict)
    """The trainer's logged name for it, by run source."""
    metric: str | None = None
    """The breakdown metric it is (the trainer's name where the breakdown carries it), else computed here."""


SERIES: tuple[Series, ...] = (
    Series("policy_loss", "policy part of the loss", "The policy term's part of the step's loss, joined as the loss."),
    Series("kl_loss", "KL part of the loss", "beta times the aggregated KL: the KL term's part of the step's loss."),
    Series("kl", "KL to the reference", "The mean KL estimate over counted tokens.", {"trl": "kl"}, "kl"),
    Series(
        "clip_low", "clip fraction, low side", "Share of counted tokens clipped below 1 - epsilon_low with A < 0.",
        {"trl": "clip_ratio/low_mean"}, "clip_ratio/low_mean",
    ),
    Series(
        "clip_high", "clip fraction, high side", "Share of counted tokens clipped above 1 + epsilon_high with A > 0.",
        {"trl": "clip_ratio/high_mean"}, "clip_ratio/high_mean",
    ),
    Series(
        "clip_region", "clip fraction, either side", "Share of counted tokens whose ratio the clip bounded.",
        {"trl": "clip_ratio/region_mean", "verl": "actor/pg_clipfrac"}, "clip_ratio/region_mean",
    ),
    Series(
        "clip_dual", "dual-clip fraction", "Share of counted tokens with A < 0 capped by the dual clip c.",
        {"verl": "actor/pg_clipfrac_lower"}, "actor/pg_clipfrac_lower",
    ),
    Series("correction_masked", "correction: masked share", "Share of counted tokens the rollout correction masked."),
    Series(
        "correction_reweighted", "correction: reweighted share",
        "Share of counted tokens the rollout correction kept with an importance weight other than 1.",
    ),
    Series("correction_mean_weight", "correction: mean weight", "Mean importance weight over the tokens it kept."),
    Series(
        "mismatch_mean", "training/sampler mismatch, mean", "Mean |old - sampler| log-prob over counted scored tokens.",
        {"trl": "sampling/sampling_logp_difference/mean"},
    ),
    Series(
        "mismatch_max", "training/sampler mismatch, max", "Largest |old - sampler| log-prob over counted tokens.",
        {"trl": "sampling/sampling_logp_difference/max"},
    ),
    Series(
        "mismatch_kl", "training/sampler KL", "verl's KL between the training and the sampler's policies.",
        {"verl": "rollout_corr/kl"}, "rollout_corr/kl",
    ),
    Series(
        "entropy", "entropy", "Mean entropy over counted tokens.",
        {"trl": "entropy", "verl": "actor/entropy"}, "entropy",
    ),
    Series("advantage_std", "advantage spread", "Standard deviation (unbiased) of the rows' advantages."),
    Series("zero_advantage_rows", "rows with zero advantage", "Share of the step's rows whose advantage is 0."),
    Series("length_mean", "response length, mean", "Mean counted tokens per row."),
    Series("length_max", "response length, max", "Most counted tokens in a row."),
)  # fmt: skip
LABELS = {s.name: s.label for s in SERIES}


@dataclass(frozen=True)
class FileFacts:
    """What the timeline keeps of one step file once its breakdown is gone."""

    counted: int
    total: int
    rows: int
    policy_loss: float
    kl_loss: float
    abs_loss: float
    metrics: dict[str, float]
    """The file's own values of the series that are breakdown metrics."""
    correction: list[float] | None
    """(masked, reweighted, weight sum, weight count) over counted tokens; None: the batch has no sampler log-probs."""
    mismatch: list[float] | None
    """(sum, count, max) of |old - sampler| over counted scored tokens; None: no sampler log-probs."""
    advantage: list[float]
    """(rows, mean, sum of squared deviations, zero rows) of the rows' advantages."""
    lengths: list[int]
    """(sum, max) of the rows' counted tokens."""
    top: dict[str, list[list[Any]]]
    """[row, col, value] of the file's largest tokens: ``loss``, ``kl``, ``mismatch``, ``clipped``, ``entropy``."""


def _top(values: Tensor, where: Tensor, k: int, largest: bool = True) -> list[list[Any]]:
    """[row, col, value] of the ``k`` positions of ``where`` with the largest |value| (or smallest value)."""
    keyed = values.abs() if largest else -values
    if largest:  # a token that adds nothing carries nothing
        where = where & (values != 0)
    n = min(k, int(where.sum()))
    if n == 0:
        return []
    idx = torch.topk(keyed.masked_fill(~where, -math.inf).flatten(), n).indices
    width = values.shape[1]
    return [[i // width, i % width, v] for i, v in zip(idx.tolist(), values.flatten()[idx].tolist(), strict=True)]


def file_facts(bd: Breakdown, k: int) -> FileFacts:
    t = bd.tokens
    counted = t.mask
    n = int(counted.sum())
    clipped = counted & ((t.region == CLIP_LOW) | (t.region == CLIP_HIGH) | (t.region == DUAL_CLIP))
    top = {"loss": _top(t.loss, counted, k), "kl": _top(t.kl, counted, k), "clipped": _top(t.log_ratio, clipped, k)}
    correction = mismatch = None
    if bd.rollout_logps is not None:
        masked = counted & ((t.correction == MASKED) | (t.correction == SEQUENCE_MASKED) | (t.correction == REJECTED))
        kept = counted & ~masked
        reweighted = kept & (t.is_weight != 1)
        correction = [
            int(masked.sum()),
            int(reweighted.sum()),
            float(t.is_weight[kept].double().sum()),
            int(kept.sum()),
        ]
    if bd.sampled:
        scored = counted & (t.correction != NOT_SCORED)
        gap = t.sampler_log_ratio.abs()[scored].double()
        mismatch = [float(gap.sum()), gap.numel(), float(gap.max()) if gap.numel() else 0.0]
        top["mismatch"] = _top(t.sampler_log_ratio, scored, k)
    if bd.entropies is not None:
        top["entropy"] = _top(bd.entropies, counted, k, largest=False)
    adv = bd.advantages.double()
    mean = float(adv.mean())
    lengths = bd.rows.length
    names = [s.metric for s in SERIES if s.metric is not None and s.metric in bd.metrics]
    if bd.config.dual_clip is None and bd.config.delta is None and "actor/pg_clipfrac_lower" in names:
        names.remove("actor/pg_clipfrac_lower")  # no dual clip: the series cannot exist, never a 0
    return FileFacts(
        n, t.mask.numel(), int(adv.numel()), float(bd.policy_loss), float(bd.kl_loss),
        float(t.loss.double().abs().sum()),
        {m: float(bd.metrics[m]) for m in names}, correction, mismatch,
        [int(adv.numel()), mean, float(((adv - mean) ** 2).sum()), int((adv == 0).sum())],
        [int(lengths.sum()), int(lengths.max())], top,
    )  # fmt: skip


def evaluate_file(args: tuple[StepRef, StepRef | None, int]) -> tuple[MicroResult, FileFacts | None]:
    """One step file's check result and facts (module level: a pool's process runs it); a file that cannot be
    read or evaluated is its check's error and has no facts."""
    ref, ahead, k = args
    read_ahead(ahead)
    try:
        batch, stored, info = load_step(ref.path)
        bd = evaluate(batch, replay_config(stored, None))
        return micro_result(ref, bd, info, DEFAULT_RTOL, DEFAULT_METRIC_ATOL), file_facts(bd, k)
    except Exception as exc:  # as check_ref: the file's error, the run goes on
        return failed_micro(ref, exc), None


def evaluate_files(refs: list[StepRef], k: int, jobs: int = 1) -> list[tuple[MicroResult, FileFacts | None]]:
    """Each file evaluated once, in order, in ``check_pool(jobs)``."""
    args = [(ref, ahead, k) for ref, ahead in zip(refs, [*refs[1:], None][: len(refs)], strict=True)]
    with check_pool(jobs if args else 1) as pool:
        if pool is None:
            return [evaluate_file(a) for a in args]
        return list(pool.imap(evaluate_file, args))


# --- the answer: the check's join, then the series and anomalies from the facts -----------------------------
Item = tuple[StepRef, MicroResult, FileFacts | None]


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def _clean(value: Any) -> Any:
    """JSON without NaN or infinities (null in their place)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def _advantage_std(parts: list[list[float]]) -> float | None:
    """The unbiased std of every row's advantage, from each file's (rows, mean, squared deviations) (Chan et al.)."""
    n, mean, m2 = 0.0, 0.0, 0.0
    for rows, m, sq, _ in parts:
        total = n + rows
        if total:
            delta = m - mean
            mean, m2 = mean + delta * rows / total, m2 + sq + delta * delta * n * rows / total
        n = total
    return math.sqrt(m2 / (n - 1)) if n > 1 else None


def series_of(facts: list[FileFacts], ranks: int, joined: dict[str, float] | None, source: Any) -> dict[str, Any]:
    """A step's (or a rank's) series from its files' facts; ``joined``: the breakdown metrics joined as the
    trainer logs them (the check's ``lens_mean``), else each metric's plain mean over the files."""
    if not facts:
        return dict.fromkeys((s.name for s in SERIES), None)
    out: dict[str, Any] = {}
    for s in SERIES:
        if s.metric is None:
            continue
        name = s.trainer.get(source, s.metric) if all(s.trainer.get(source) in f.metrics for f in facts) else s.metric
        values = [f.metrics.get(name) for f in facts]
        plain = None if None in values else sum(v for v in values if v is not None) / len(values)
        out[s.name] = plain if joined is None or plain is None else joined.get(name, plain)
    counted = sum(f.counted for f in facts)
    out["policy_loss"] = sum(f.policy_loss for f in facts) / ranks
    out["kl_loss"] = sum(f.kl_loss for f in facts) / ranks
    cor = [f.correction for f in facts]
    if None in cor:
        out |= dict.fromkeys(("correction_masked", "correction_reweighted", "correction_mean_weight"), None)
    else:
        masked, reweighted, weights, kept = (sum(c[i] for c in cor if c is not None) for i in range(4))
        out["correction_masked"], out["correction_reweighted"] = _ratio(masked, counted), _ratio(reweighted, counted)
        out["correction_mean_weight"] = _ratio(weights, kept)
    gaps = [f.mismatch for f in facts]
    if None in gaps:
        out["mismatch_mean"] = out["mismatch_max"] = None
    else:
        out["mismatch_mean"] = _ratio(sum(g[0] for g in gaps if g), sum(g[1] for g in gaps if g))
        out["mismatch_max"] = max(g[2] for g in gaps if g is not None)
    rows = sum(f.rows for f in facts)
    out["advantage_std"] = _advantage_std([f.advantage for f in facts])
    out["zero_advantage_rows"] = _ratio(sum(f.advantage[3] for f in facts), rows)
    out["length_mean"] = _ratio(sum(f.lengths[0] for f in facts), rows)
    out["length_max"] = max(f.lengths[1] for f in facts)
    return {s.name: out[s.name] for s in SERIES}


def _rank_losses(items: list[Item]) -> dict[int, float | None]:
    losses: dict[int, float | None] = {}
    for ref, result, _ in items:
        rank = ref.rank or 0
        had = losses.get(rank, 0.0)
        losses[rank] = None if had is None or result.check.error is not None else had + result.loss
    return losses


def step_entry(check: StepCheck, items: list[Item], source: Any) -> dict[str, Any]:
    facts = [f for _, _, f in items if f is not None]
    ranks = sorted({ref.rank or 0 for ref, _, _ in items})
    logged = check.logged_loss
    entry: dict[str, Any] = {
        "step": check.step,
        "loss": {
            "recomputed": check.lens_loss,
            "logged": None if logged is None else logged.trainer,
            "logged_recomputed": None if logged is None else logged.lens,
        },
        "verdict": check.verdict,
        "tokens": {"counted": sum(f.counted for f in facts), "total": sum(f.total for f in facts)},
        "rows": sum(f.rows for f in facts),
        "series": series_of(facts, len(ranks), check.lens_mean, source),
        "logged": {s.name: check.logged[s.trainer[source]] for s in SERIES if s.trainer.get(source) in check.logged},
    }
    if len(ranks) > 1:
        losses = _rank_losses(items)
        entry["ranks"] = {}
        for rank in ranks:
            own = [f for ref, _, f in items if (ref.rank or 0) == rank and f is not None]
            entry["ranks"][str(rank)] = {
                "loss": losses[rank],
                "tokens": {"counted": sum(f.counted for f in own), "total": sum(f.total for f in own)},
                "series": series_of(own, 1, None, source),
            }
    return entry


def _spot(items: list[Item], kind: str, n: int) -> Spot | None:
    """The file holding the step's first token of ``kind`` (its largest, or lowest entropy), and its top ``n``."""
    best: tuple[float, StepRef, list[list[Any]]] | None = None
    for ref, _, f in items:
        tokens = [] if f is None else f.top.get(kind, [])
        if tokens:
            key = -tokens[0][2] if kind == "entropy" else abs(tokens[0][2])
            if best is None or key > best[0]:
                best = (key, ref, tokens)
    return None if best is None else Spot(best[1].micro, best[1].rank, best[2][:n])


def _top_loss(items: list[Item]) -> Any:
    def top(n: int) -> tuple[Spot, float] | None:
        ranked = sorted(
            ((abs(tok[2]), i, tok) for i, (_, _, f) in enumerate(items) if f for tok in f.top["loss"]),
            key=lambda x: (-x[0], x[1]),
        )[:n]
        if not ranked:
            return None
        ref = items[ranked[0][1]][0]
        tokens = [tok for _, i, tok in ranked if i == ranked[0][1]]
        return Spot(ref.micro, ref.rank, tokens), sum(abs(tok[2]) for tok in tokens)

    return top


def step_view(entry: dict[str, Any], items: list[Item], n: int) -> StepView:
    loss = _finite(entry["loss"]["recomputed"])
    spots = {kind: _spot(items, kind, n) for kind in ("kl", "mismatch", "clipped", "entropy")}
    abs_loss = sum(f.abs_loss for _, _, f in items if f is not None)
    series = {k: _finite(v) for k, v in entry["series"].items()}
    counted = entry["tokens"]["counted"]
    return StepView(entry["step"], loss, series, entry["verdict"], counted, abs_loss, _top_loss(items), spots)


def build_answer(run: Run, items: list[Item], thresholds: AnomalyThresholds) -> dict[str, Any]:
    """The timeline of ``run`` from each of its files' (ref, result, facts), in the run's file order."""
    check: RunCheck = run_check_from(run, [result for _, result, _ in items])
    by_step: dict[int, list[Item]] = {}
    for item in items:
        by_step.setdefault(item[0].step, []).append(item)
    source = str(run.info.get("source"))
    entries = [step_entry(s, by_step[s.step], source) for s in check.steps]
    logged_steps = sorted(int(k) for k, v in (run.info.get("logged") or {}).items() if k.isdigit() and v)
    windows = {n: list(range(before + 1, n + 1)) for before, n in zip([0, *logged_steps], logged_steps, strict=False)}
    for entry in entries:
        if entry["logged"] or entry["loss"]["logged"] is not None:
            entry["logged_over"] = windows.get(entry["step"], [entry["step"]])
    views = [step_view(e, by_step[e["step"]], thresholds.few_tokens) for e in entries]
    anomalies = find_anomalies(views, check, thresholds, LABELS)
    series = [
        {"name": s.name, "label": s.label, "trainer_name": s.trainer.get(source), "description": s.description}
        for s in SERIES
    ]
    answer = {
        "format": 1, "run": run.name, "verdict": check.verdict, "thresholds": asdict(thresholds), "series": series,
        "ranks": sorted({ref.rank or 0 for ref in run.steps}), "steps": entries, "anomalies": anomalies,
    }  # fmt: skip
    cleaned: dict[str, Any] = _clean(answer)
    return cleaned


# --- keeping: the answer and each file's facts beside the run, with the state they come from ---------------
KEPT = ".lens-timeline.json"
KEPT_FILES = ".lens-timeline-files.json"
"""Each step file's result and facts, for an extension: apart, so a kept answer is read without them."""
_PREFIX = b'{"digest": "'


def run_state(run: Run) -> dict[str, list[int]]:
    """[size, mtime in ns] of run.json, logged*.jsonl and every step file, by path inside the run."""
    names = ["run.json", *sorted(e.name for e in os.scandir(run.path) if e.name.startswith("logged"))]
    out = {}
    for name, path in [*((n, run.path / n) for n in names), *((_rel(run, ref), ref.path) for ref in run.steps)]:
        st = os.stat(path, follow_symlinks=False)
        out[name] = [st.st_size, st.st_mtime_ns]
    return out


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("grpo-lens")
    except metadata.PackageNotFoundError:
        return "unknown"


def _places(run: Run, cache_dir: str | os.PathLike[str] | None) -> list[Path]:
    """Where the kept answer may be: beside the run, then under ``cache_dir`` named from the run's path."""
    places = [run.path]
    if cache_dir is not None:
        name = hashlib.sha256(str(run.path.resolve()).encode()).hexdigest()[:32]
        places.append(Path(cache_dir) / name)
    return places


def _kept_path(place: Path, run: Run, name: str) -> Path:
    return place / name if place == run.path else place.with_name(f"{place.name}{name}")


def _write(path: Path, body: dict[str, Any]) -> None:
    """``body`` as JSON behind the SHA-256 of its text: a torn or changed file is told from a whole one."""
    text = json.dumps(body, allow_nan=True, separators=(",", ":")).encode()
    digest = hashlib.sha256(text).hexdigest().encode()
    write_atomic(path, _PREFIX + digest + b'", "body": ' + text + b"}")


def _read(path: Path) -> dict[str, Any] | None:
    """A kept file's body, or None when it is missing, torn or not what ``_write`` wrote."""
    try:
        data = read_regular(path)
    except (OSError, GrpoInputError):
        return None
    head = len(_PREFIX) + 64
    text = data[head + len(b'", "body": ') : -1]
    if not data.startswith(_PREFIX) or hashlib.sha256(text).hexdigest().encode() != data[len(_PREFIX) : head]:
        return None
    try:
        body = json.loads(text)
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _header(thresholds: AnomalyThresholds) -> dict[str, Any]:
    return {"format": 1, "version": _version(), "thresholds": asdict(thresholds)}


def _encode(item: Item) -> dict[str, Any]:
    """A file's result and facts as JSON (each dataclass's fields by name; ``asdict`` is ten times slower)."""
    _, result, facts = item
    check = {**vars(result.check), "metrics": {k: vars(m) for k, m in result.check.metrics.items()}}
    sampling = None if result.sampling is None else vars(result.sampling)
    kept = {**vars(result), "check": check, "sampling": sampling}
    return {"result": kept, "facts": None if facts is None else vars(facts)}


def _decode(kept: dict[str, Any]) -> tuple[MicroResult, FileFacts | None]:
    r = dict(kept["result"])
    c = dict(r["check"])
    c["metrics"] = {k: MetricCheck(**v) for k, v in c["metrics"].items()}
    r["check"] = MicroCheck(**c)
    r["sampling"] = None if r["sampling"] is None else SamplingSums(**r["sampling"])
    r["rollout"] = None if r["rollout"] is None else tuple(r["rollout"])
    facts = kept["facts"]
    return MicroResult(**r), None if facts is None else FileFacts(**facts)


@dataclass(frozen=True)
class Extension:
    """``extend``'s answer: the timeline, and what this call evaluated to give it."""

    answer: dict[str, Any]
    new_steps: list[int]
    """The steps one of whose files was evaluated by this call (none: answered from the kept file)."""
    evaluated: int
    """The step files read and evaluated by this call."""
    kept: Path | None
    """Where the answer is kept (None: neither the run directory nor ``cache_dir`` could be written)."""


def extend(
    run_dir: str | os.PathLike[str],
    thresholds: AnomalyThresholds | None = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    jobs: int = 1,
) -> Extension:
    """The run's timeline, evaluating only the step files the kept one does not hold (new, or changed since),
    and which steps they are: what a live view of a run being captured asks after each poll."""
    t = thresholds or AnomalyThresholds()
    run = load_run(run_dir)
    state, header = run_state(run), _header(t)
    places = _places(run, cache_dir)
    for place in places:
        kept = _read(_kept_path(place, run, KEPT))
        same = kept is not None and kept.get("header") == header and kept.get("state") == state
        if same and kept is not None and isinstance(kept.get("answer"), dict):
            return Extension(kept["answer"], [], 0, _kept_path(place, run, KEPT))
    known = _known_files(run, places, header, state)
    todo = [ref for ref in run.steps if _rel(run, ref) not in known]
    fresh = iter(evaluate_files(todo, t.few_tokens, jobs))
    items: list[Item] = []
    for ref in run.steps:
        result, facts = known[_rel(run, ref)] if _rel(run, ref) in known else next(fresh)
        items.append((ref, result, facts))
    try:
        answer = build_answer(run, items, t)
    except Exception:  # a kept result that decoded but does not join: never trusted, the run evaluated afresh
        if not known:
            raise
        pairs = evaluate_files(list(run.steps), t.few_tokens, jobs)
        items = [(ref, *pair) for ref, pair in zip(run.steps, pairs, strict=True)]
        todo, answer = list(run.steps), build_answer(run, items, t)
    where = _keep(run, places, header, state, answer, items)
    return Extension(answer, sorted({ref.step for ref in todo}), len(todo), where)


def _rel(run: Run, ref: StepRef) -> str:
    """A step file's name inside the run (``load_run`` finds them in ``steps/``)."""
    return f"steps/{ref.path.name}"


def _known_files(
    run: Run, places: list[Path], header: dict[str, Any], state: dict[str, list[int]]
) -> dict[str, tuple[MicroResult, FileFacts | None]]:
    """The kept results of the step files whose size and mtime are unchanged (none from a garbled file)."""
    for place in places:
        kept = _read(_kept_path(place, run, KEPT_FILES))
        if kept is None or kept.get("header") != header or not isinstance(kept.get("files"), dict):
            continue
        try:
            return {
                name: _decode(entry)
                for name, entry in kept["files"].items()
                if name in state and entry.get("state") == state[name]
            }
        except (TypeError, KeyError, ValueError, AttributeError):
            continue
    return {}


def _keep(
    run: Run, places: list[Path], header: dict[str, Any], state: dict[str, list[int]], answer: Any, items: list[Item]
) -> Path | None:
    """Write the answer and the files' results in the first place that takes them; where that was."""
    files = {_rel(run, item[0]): {"state": state[_rel(run, item[0])], **_encode(item)} for item in items}
    for place in places:
        try:
            place.parent.mkdir(parents=True, exist_ok=True)
            _write(_kept_path(place, run, KEPT_FILES), {"header": header, "files": files})
            _write(_kept_path(place, run, KEPT), {"header": header, "state": state, "answer": answer})
            return _kept_path(place, run, KEPT)
        except OSError:
            continue
    return None


def timeline(
    run_dir: str | os.PathLike[str],
    thresholds: AnomalyThresholds | None = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    jobs: int = 1,
) -> dict[str, Any]:
    """The run's timeline (see the module's docstring and docs/runs.md, "A run's timeline"): per step its loss
    recomputed and as logged, its verdict, token counts and series, per rank where the run has several; the
    anomalies ``thresholds`` find (``AnomalyThresholds()`` when None). Kept beside the run (or under
    ``cache_dir``) and answered from there while the run is unchanged; ``jobs`` > 1 evaluates in a pool."""
    return extend(run_dir, thresholds, cache_dir=cache_dir, jobs=jobs).answer
