"""The Runs view's model: what the page shows of a run, every number and sentence computed here once.

``run_overview`` recomputes every micro-batch (``grpo.check.check_run``, one ``evaluate`` each) and,
beside the check, gathers per step what the page says about it:
- the rollout the step trained on and the pass over it, from what the capture recorded in each step
  file's meta (``rollout``); "unknown" for runs captured before it was recorded, never guessed from
  numbers that happen to repeat;
- the trainer's loss per micro-batch beside GRPO Lens's (the step's label prints these, so it says
  the number the chart draws);
- zero-std groups (equal rewards in a group): advantage 0, yet their tokens keep their share of the
  aggregation's weight, which dilutes every other group's gradient: said with the numbers;
- the charts, one unit per axis: a logged series has a value only at the steps the trainer logged
  it (a gap elsewhere, never carried forward);
- quantities that the trainer and GRPO Lens name apart (``grad_norm`` over the model's parameters,
  ``lens/grad_norm_logps`` over the token log-probs): shown side by side and said to differ.
``app.summaries`` keeps the result beside the run; the browser only draws it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from torch import Tensor

from grpo.batch import Batch, request_advantages
from grpo.check import DEFAULT_METRIC_ATOL, DEFAULT_RTOL, check_run, replay_config, step_views
from grpo.config import LossConfig
from grpo.errors import GrpoInputError
from grpo.fields import fields_of, ragged
from grpo.loss import Breakdown, evaluate
from grpo.metrics import SERIES_METRICS
from grpo.runs import Run, StepRef, load_step

CLIP_METRICS = ("clip_ratio/region_mean", "clip_ratio/low_mean", "clip_ratio/high_mean", "actor/pg_clipfrac")

# (trainer's name, GRPO Lens's name, why they are different numbers): never drawn as one quantity.
NAMED_APART = (
    (
        "grad_norm",
        "lens/grad_norm_logps",
        "the trainer's grad_norm is the norm of the gradient over the model's parameters (TRL logs it before "
        "clipping to max_grad_norm); lens/grad_norm_logps is the norm of d loss / d log-prob over the counted "
        "tokens. The model's Jacobian lies between them: they differ, and neither checks the other.",
    ),
    (
        "actor/grad_norm",
        "lens/grad_norm_logps",
        "verl's actor/grad_norm is the norm of the gradient over the model's parameters; lens/grad_norm_logps "
        "is the norm of d loss / d log-prob over the counted tokens. They differ, and neither checks the other.",
    ),
)


def _four_digits(value: float) -> str:
    return f"{value:.4g}"


@dataclass
class StepFacts:
    """What the check's breakdowns of one step show beyond the check itself."""

    micro: list[dict[str, Any]] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    groups: list[int] = field(default_factory=list)
    row_weight: list[float] = field(default_factory=list)
    """Each row's share of the aggregation: its counted tokens' weights summed."""
    rollouts: list[Any] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    """Each micro-batch's metrics as its file's meta holds them (the lab logs a step's there)."""


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def gather(facts: dict[int, StepFacts], ref: StepRef, bd: Breakdown, info: dict[str, Any]) -> None:
    """One micro-batch's part of its step's facts (``check_run``'s ``seen``)."""
    step = facts.setdefault(ref.step, StepFacts())
    meta = info["meta"] if isinstance(info.get("meta"), dict) else {}
    step.micro.append(
        {"micro": ref.micro, "rank": ref.rank, "trainer_loss": _number(meta.get("loss")), "lens_loss": float(bd.loss)}
    )
    step.rollouts.append(meta.get("rollout"))
    metrics = meta.get("metrics")
    step.metrics.append(metrics if isinstance(metrics, dict) else {})
    tensors = info["tensors"]
    rewards, groups = tensors.get("row_rewards", tensors.get("rewards")), tensors.get("row_groups")
    weights = (bd.tokens.weight * bd.tokens.mask).sum(-1).tolist()  # (B, T) -> (B,)
    if rewards is not None and groups is not None and len(rewards) == len(groups) == len(weights):
        step.rewards += [float(r) for r in rewards.tolist()]
        step.groups += [int(g) for g in groups.tolist()]
        step.row_weight += [float(w) for w in weights]


def rank_sums(micro: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each rank's loss for its step: the sum over its micro-batches (the trainer's returned losses and GRPO
    Lens's; None where one is missing), what the step's mean over the ranks averages."""
    by_rank: dict[int | None, list[dict[str, Any]]] = defaultdict(list)
    for m in micro:
        by_rank[m["rank"]].append(m)

    def total(parts: list[dict[str, Any]], key: str) -> float | None:
        values = [m[key] for m in parts]
        return None if any(v is None for v in values) else sum(values)

    return [
        {
            "rank": rank,
            "micro": [m["micro"] for m in parts],
            "trainer_loss": total(parts, "trainer_loss"),
            "lens_loss": total(parts, "lens_loss"),
        }
        for rank, parts in sorted(by_rank.items(), key=lambda kv: -1 if kv[0] is None else kv[0])
    ]


def rollout_story(step: int, rollouts: list[Any], first_steps: dict[int, int]) -> dict[str, Any]:
    """The rollout a step trained on and its pass over it, from the recorded metadata; "unknown" otherwise."""
    known = [r for r in rollouts if isinstance(r, dict)]
    whole = [r for r in known if all(isinstance(r.get(k), int) for k in ("rollout", "iteration", "iterations"))]
    if len(whole) == len(rollouts) and whole and len({(r["rollout"], r["iteration"]) for r in whole}) == 1:
        r = whole[0]
        first = first_steps[r["rollout"]]
        if r["iteration"] == 1 and step == first:
            text = f"rollout {r['rollout']}, iteration 1 of {r['iterations']}: completions sampled for this step"
        else:
            updates = step - first
            text = (
                f"rollout {r['rollout']}, iteration {r['iteration']} of {r['iterations']}: the same completions "
                f"as step {first} after {updates} update{'s' if updates != 1 else ''}"
            )
        return {"rollout": r["rollout"], "iteration": r["iteration"], "iterations": r["iterations"], "text": text}
    epochs = {r.get("iterations") for r in known if isinstance(r.get("iterations"), int)}
    if len(epochs) == 1:
        n = epochs.pop()
        text = (
            f"rollout unknown: the trainer passes over each rollout {n} times (ppo_epochs = {n}); which rollout "
            "and pass this step was is not recorded"
        )
        return {"rollout": None, "iteration": None, "iterations": n, "text": text}
    text = (
        "rollout unknown: this run's step files do not record which rollout and pass each step trained on (GRPO "
        "Lens's TRL capture and its lab record both, its verl capture the passes per rollout; an import, an "
        "upload or a writer that adds no rollout record neither)"
    )
    return {"rollout": None, "iteration": None, "iterations": None, "text": text}


def zero_std_story(facts: StepFacts, aggregation: str) -> dict[str, Any] | None:
    """Zero-std groups of a step and how much of the aggregation's weight their tokens hold (None: the step's
    files hold no rows' rewards and groups)."""
    if not facts.rewards:
        return None
    by_group: dict[int, list[int]] = defaultdict(list)
    for row, group in enumerate(facts.groups):
        by_group[group].append(row)
    zero = [g for g, rows in by_group.items() if len({facts.rewards[r] for r in rows}) == 1]
    zero_rows = [r for g in zero for r in by_group[g]]
    total = sum(facts.row_weight)
    share = sum(facts.row_weight[r] for r in zero_rows) / total if total > 0 else 0.0
    out: dict[str, Any] = {
        "groups": len(zero),
        "of_groups": len(by_group),
        "rows": len(zero_rows),
        "of_rows": len(facts.rewards),
        "weight_share": share,
        "factor": 1.0 - share,
    }
    if not zero:
        out["text"] = f"no zero-std group: all {len(by_group)} groups have rewards that differ"
        return out
    out["text"] = (
        f"{len(zero)} of {len(by_group)} groups ({len(zero_rows)} of {len(facts.rewards)} rows) have equal rewards: "
        f"their advantages are 0 and they teach nothing, yet they still count in the divisor: their tokens hold "
        f"{_four_digits(100 * share)}% of the aggregation's weight ({aggregation}), so every other group's gradient is "
        f"{_four_digits(1.0 - share)}x what it would be with them left out"
    )
    return out


def named_apart(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pairs of NAMED_APART that this run's trainer logged, with the reason they differ."""
    logged = {k for s in steps for k in s["logged"]}
    return [{"trainer": t, "lens": lens, "text": text} for t, lens, text in NAMED_APART if t in logged]


def _series(name: str, values: list[Any], source: str) -> dict[str, Any]:
    return {"name": name, "values": [_number(v) for v in values], "source": source}


def charts(steps: list[dict[str, Any]], pairs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Runs view's charts, one unit per axis. A logged series is null at steps the trainer did not log."""

    def lens(key: str) -> list[Any]:
        return [s["lens_mean"].get(key) for s in steps]

    def logged(key: str) -> list[Any]:
        return [s["logged"].get(key) for s in steps]

    def both(key: str, unit_name: str) -> list[dict[str, Any]]:
        out = []
        if any(v is not None for v in lens(key)):
            out.append(_series(f"{unit_name} (GRPO Lens, mean over micro-batches)", lens(key), "lens"))
        if any(v is not None for v in logged(key)):
            out.append(_series(f"{unit_name} (trainer logged)", logged(key), "logged"))
        return out

    specs = [
        ("run-clip", "Clip fractions per step", "fraction of tokens", [x for k in CLIP_METRICS for x in both(k, k)]),
        ("run-kl", "KL to the reference per step", "KL (nats per token)", both("kl", "kl")),
        (
            "run-reward",
            "Reward per step",
            "reward",
            [
                _series("reward (trainer logged)", logged("reward"), "logged"),
                _series("reward of the rows this step trained on (GRPO Lens)", [s["reward"] for s in steps], "lens"),
            ],
        ),
        ("run-advantage", "Advantage spread per step", "advantage std", both("lens/advantage/std", "advantage std")),
        (
            "run-length",
            "Completion length per step",
            "tokens",
            both("completions/mean_length", "completions/mean_length"),
        ),
    ]
    for pair in pairs:
        specs.append(
            (
                f"run-{pair['trainer'].replace('/', '-')}",
                f"{pair['trainer']} (trainer) and {pair['lens']} (GRPO Lens): two different norms",
                f"{pair['trainer']}",
                [_series(f"{pair['trainer']} (trainer logged)", logged(pair["trainer"]), "logged")],
            )
        )
        specs.append(
            (
                f"run-{pair['lens'].replace('/', '-')}",
                f"{pair['lens']} (GRPO Lens): not the trainer's {pair['trainer']}",
                pair["lens"],
                [_series(f"{pair['lens']} (GRPO Lens)", lens(pair["lens"]), "lens")],
            )
        )
    out = []
    for chart_id, title, unit, series in specs:
        kept = [s for s in series if any(v is not None for v in s["values"])]
        if kept:
            out.append({"id": chart_id, "title": title, "unit": unit, "series": kept})
    return out


def _first_steps(facts: dict[int, StepFacts]) -> dict[int, int]:
    """Rollout number -> the first step that trained on it."""
    first_steps: dict[int, int] = {}
    for number in sorted(facts):
        for r in facts[number].rollouts:
            if isinstance(r, dict) and isinstance(r.get("rollout"), int):
                first_steps.setdefault(r["rollout"], number)
    return first_steps


def _mismatches(micro: list[Any]) -> list[dict[str, Any]]:
    """The micro-batches whose loss or a metric differs from the trainer's: where, by how much, which metrics."""
    return [
        {
            "micro": m.micro,
            "rank": m.rank,
            "rel_error": m.rel_error,
            "metrics": sorted(k for k, v in m.metrics.items() if not v.ok),
        }
        for m in micro
        if not m.ok
    ]


def run_overview(run: Run, rtol: float = DEFAULT_RTOL, metric_atol: float = DEFAULT_METRIC_ATOL) -> dict[str, Any]:
    """Per step: the trainer's loss and logged metrics beside GRPO Lens's, mismatches flagged, the rollout
    and zero-std stories, and the charts the Runs view draws (each micro-batch evaluated once)."""
    facts: dict[int, StepFacts] = {}
    check = check_run(run, rtol, metric_atol, seen=lambda *a: gather(facts, *a))
    aggregation = str((run.info.get("config") or {}).get("aggregation") or "the run's aggregation")
    first_steps = _first_steps(facts)
    lab = run.info.get("source") == "lab"
    by_step: dict[int, list[Any]] = defaultdict(list)
    for m in check.micro:
        by_step[m.step].append(m)
    steps = []
    for s in check.steps:
        f = facts.get(s.step, StepFacts())
        micro = by_step[s.step]
        errors = [m.rel_error for m in micro if m.rel_error is not None]
        rewards = [r for r in f.rewards if math.isfinite(r)]
        # the lab is its own trainer: a step's log is its one micro-batch's metrics
        logged = s.logged or (f.metrics[0] if lab and len(f.metrics) == 1 else {})
        steps.append(
            {
                "step": s.step,
                "micro_batches": s.micro_batches,
                "ranks": s.ranks,
                "micro": f.micro,
                "rank_losses": rank_sums(f.micro),
                "trainer_loss": s.trainer_loss,
                "lens_loss": s.lens_loss,
                "max_rel_error": max(errors) if errors else None,
                "ok": s.ok and all(m.ok for m in micro),
                "verdict": s.verdict,
                "unchecked": s.unchecked,
                "logged_loss": None if s.logged_loss is None else asdict(s.logged_loss),
                "errors": [{"file": m.file, "error": m.error} for m in micro if m.error is not None],
                "mismatches": _mismatches(micro),
                "logged": {k: v for k, v in logged.items() if _number(v) is not None},
                "lens_mean": {k: s.lens_mean[k] for k in SERIES_METRICS if k in s.lens_mean},
                "lens_token_weighted": s.lens_token_weighted,
                "reward": sum(rewards) / len(rewards) if rewards else None,
                "rollout": rollout_story(s.step, f.rollouts, first_steps),
                "zero_std": zero_std_story(f, aggregation),
            }
        )
    pairs = named_apart(steps)
    return {
        **run.summary(),
        "info": run.info,
        "ok": check.ok,
        "verdict": check.verdict,
        "counts": check.counts(),
        "unchecked": check.unchecked_items(),
        "rtol": check.rtol,
        "steps": steps,
        "named_apart": pairs,
        "charts": charts(steps, pairs),
    }


def batch_advantages(batch: Batch, config: LossConfig) -> Tensor:
    """A step's advantages: the trainer's where the file holds them, else the ones the loss computes
    from its rewards under its config."""
    if isinstance(batch.advantages, Tensor):
        return batch.advantages
    return evaluate(batch, config).advantages


def step_batch(
    run: Run, step: int, micro: int | None = None, rank: int | None = None
) -> tuple[dict[str, Any], LossConfig, dict[str, Any]]:
    """A step's request-shaped fields (ragged rows, as /api/v1/loss takes them), config and info.

    With ``micro``, that micro-batch under its own config: the trainer's exact number (over several ranks,
    each rank's file of that index joined, unless ``rank`` picks one). Without, the step's micro-batches
    (of ``rank`` alone, when given) joined into one batch under the run's config without the trainer's
    per-micro-batch scaling (the step's batch seen as one).
    """
    refs = [r for r in run.micro_batches(step) if rank is None or r.rank == rank]
    if micro is not None:
        refs = [r for r in refs if r.micro == micro]
    if not refs:
        raise GrpoInputError("step", f"a step of this run ({', '.join(map(str, run.step_numbers()))}) and micro-batch")
    loaded = [load_step(r.path) for r in refs]
    rows: dict[str, list[list[float]]] = {}
    per_row: dict[str, list[Any]] = {"advantages": [], "row_rewards": [], "row_groups": []}
    per_token = any(b.advantages is not None and b.advantages.dim() == 2 for b, _, _ in loaded)  # verl's (B, T)
    for batch, stored, info in loaded:
        lengths = ((batch.mask.cumsum(-1) * batch.mask).argmax(-1) + 1).tolist()  # up to the last counted position
        for name in fields_of("token"):  # every per-token field of the table, plugins' included
            value = batch.mask_float if name == "completion_mask" else getattr(batch, name, batch.extra.get(name))
            if value is not None:
                rows.setdefault(name, []).extend(row.tolist() for row in ragged(value, lengths))
        per_row["advantages"] += request_advantages(batch_advantages(batch, stored), lengths, per_token)
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
        "rank": rank,
        "micro_batches": [r.micro for r in refs],
        "ranks": sorted({r.rank for r in refs if r.rank is not None}),
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
