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
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

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
from grpo.corrections import SamplingSums
from grpo.errors import GrpoInputError
from grpo.loss import evaluate
from grpo.run_directory import Run, StepRef, load_run, load_step, read_regular, write_atomic
from grpo.timeline_facts import LABELS, SERIES, TOP_TOKENS, FileFacts, file_facts, series_of

__all__ = ["SERIES", "TOP_TOKENS", "Extension", "FileFacts", "build_answer", "extend", "timeline"]


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


@dataclass(frozen=True)
class Built:
    """An answer, and what a later extension reuses of it: the run's check, each step's view, the run.json read."""

    answer: dict[str, Any]
    check: RunCheck
    views: list[StepView]
    info: dict[str, Any]


def build_answer(run: Run, items: list[Item], thresholds: AnomalyThresholds) -> dict[str, Any]:
    """The timeline of ``run`` from each of its files' (ref, result, facts), in the run's file order."""
    return build(run, items, thresholds).answer


def _logged_steps(info: dict[str, Any], loss: bool = False) -> list[int]:
    logged = info.get("logged") or {}
    return sorted(int(k) for k, v in logged.items() if k.isdigit() and v and (not loss or _finite(v.get("loss"))))


def rejoin_from(run: Run, before: Built, changed: set[int]) -> int | None:
    """The first step to join again when the steps ``changed`` (a file new or changed, or its log), the steps
    before it taken from ``before``: the step after the last step logged with a loss ahead of them, so that no
    logging window starts before it and ends after. None: the whole run is joined again (the run's source or
    capture changed; a capture's restrictions; no such boundary)."""
    if not run.steps or any(run.info.get(k) != before.info.get(k) for k in ("source", "capture")):
        return None  # what the join reads of run.json besides the log (its status, attempts: nothing)
    old, new = before.info.get("logged") or {}, run.info.get("logged") or {}
    changed = changed | {int(k) for k in {*old, *new} if k.isdigit() and old.get(k) != new.get(k)}
    if isinstance(run.info.get("capture"), dict) or not changed:
        return None
    first = min(changed)
    bounds = [n for n in _logged_steps(run.info, loss=True) if n < first]
    if bounds:
        return bounds[-1] + 1
    return first if not _logged_steps(run.info) else None


def _joinable_from(items: list[Item], cut: int) -> bool:
    """Whether the files from step ``cut`` on join alone as they do in the run: the same ranks, and no rollout
    (TRL's generation batch, whose sampling metrics are logged over its steps) on both sides of it."""
    ranks = {ref.rank or 0 for ref, _, _ in items}
    after = {ref.rank or 0 for ref, _, _ in items if ref.step >= cut}
    rollouts = {r.rollout[0] for ref, r, _ in items if ref.step < cut and r.rollout is not None}
    return ranks == after and not any(r.rollout and r.rollout[0] in rollouts for ref, r, _ in items if ref.step >= cut)


def build(run: Run, items: list[Item], thresholds: AnomalyThresholds, since: tuple[Built, int] | None = None) -> Built:
    """``build_answer``, keeping what an extension reuses; ``since``: (an earlier build, the step ``rejoin_from``
    gave): the steps before it are taken from that build (their entries, checks and anomalies), the rest joined
    again. Equal to a build of the whole run (``rejoin_from`` and ``_joinable_from`` say when it is)."""
    before, cut = since if since is not None and _joinable_from(items, since[1]) else (None, 0)
    part = run if before is None else Run(run.name, run.path, run.info, tuple(r for r in run.steps if r.step >= cut))
    rejoined = run_check_from(part, [result for ref, result, _ in items if ref.step >= cut])
    kept = 0 if before is None else sum(1 for s in before.check.steps if s.step < cut)
    check = rejoined
    if before is not None:
        micro = [m for m in before.check.micro if m.step < cut] + rejoined.micro
        steps = before.check.steps[:kept] + rejoined.steps
        check = RunCheck(run.name, rejoined.rtol, rejoined.metric_atol, micro, steps, rejoined.unchecked_run)
    by_step: dict[int, list[Item]] = {}
    for item in items:
        by_step.setdefault(item[0].step, []).append(item)
    source = str(run.info.get("source"))
    entries = [step_entry(s, by_step[s.step], source) for s in rejoined.steps]
    logged_steps = _logged_steps(run.info)
    windows = {n: list(range(b + 1, n + 1)) for b, n in zip([0, *logged_steps], logged_steps, strict=False)}
    old = [] if before is None else before.answer["steps"][:kept]
    cumulative = old[-1]["tokens"]["cumulative"] if old else 0
    for entry in entries:  # the run's counted tokens up to and including the step, every rank
        cumulative += entry["tokens"]["counted"]
        entry["tokens"]["cumulative"] = cumulative
        if entry["logged"] or entry["loss"]["logged"] is not None:
            entry["logged_over"] = windows.get(entry["step"], [entry["step"]])
    entries = _clean(entries)
    views = [step_view(e, by_step[e["step"]], thresholds.few_tokens) for e in entries]
    views = views if before is None else before.views[:kept] + views
    earlier = [] if before is None else [a for a in before.answer["anomalies"] if a["step"] < cut]
    anomalies = find_anomalies(views, check, thresholds, LABELS, start=kept, earlier=earlier)
    series = [
        {"name": s.name, "label": s.label, "trainer_name": s.trainer.get(source), "description": s.description}
        for s in SERIES
    ]
    answer = {
        "format": 1, "run": run.name, "verdict": check.verdict, "thresholds": asdict(thresholds), "series": series,
        "ranks": sorted({ref.rank or 0 for ref in run.steps}), "steps": old + entries,
        "anomalies": earlier + _clean(anomalies[len(earlier):]), "unchecked": check.unchecked_items(),
        "errors": [{"file": m.file, "step": m.step, "error": m.error} for m in check.micro if m.error is not None],
    }  # fmt: skip
    return Built(answer, check, views, run.info)


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
    return {"format": 2, "version": _version(), "thresholds": asdict(thresholds)}


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


@dataclass
class _Memo:
    """This process's last build of a run, trusted while its kept files are as it wrote them (``stamp``)."""

    header: dict[str, Any]
    state: dict[str, list[int]]
    files: dict[str, tuple[MicroResult, FileFacts | None]]
    built: Built
    kept: Path
    stamp: list[list[int]]
    lines: int
    """Entries in the kept files' list (appended, some superseded)."""


_MEMO: dict[tuple[Path, ...], _Memo] = {}
"""By the places a run's answer may be kept (``_places``); the ``MEMO_RUNS`` runs extended last."""
MEMO_RUNS = 4
_LOCKS: dict[tuple[Path, ...], threading.Lock] = {}
_LOCK = threading.Lock()


def _stamp(kept: Path) -> list[list[int]]:
    try:
        return [
            [st.st_size, st.st_mtime_ns]
            for st in (os.stat(kept), os.stat(kept.with_name(kept.name[:-5] + "-files.json")))
        ]
    except OSError:
        return []


def extend(
    run_dir: str | os.PathLike[str],
    thresholds: AnomalyThresholds | None = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    jobs: int = 1,
) -> Extension:
    """The run's timeline, evaluating only the step files the kept one does not hold (new, or changed since),
    and which steps they are: what a live view of a run being captured asks after each poll. In one process,
    the last build of the run is reused while its kept files are unchanged: only the steps from the last
    logging window before the new files are joined again, and the new files' facts appended to the kept list."""
    t = thresholds or AnomalyThresholds()
    run = load_run(run_dir)
    places = _places(run, cache_dir)
    with _LOCK:
        lock = _LOCKS.setdefault(tuple(places), threading.Lock())
    with lock:  # one extension of a run at a time (the live watch and the endpoint)
        return _extend(run, t, places, jobs)


def _extend(run: Run, t: AnomalyThresholds, places: list[Path], jobs: int) -> Extension:
    state, header = run_state(run), _header(t)
    with _LOCK:
        memo = _MEMO.get(tuple(places))
    if memo is not None and (memo.header != header or _stamp(memo.kept) != memo.stamp):
        memo = None
    if memo is not None and memo.state == state:
        return Extension(memo.built.answer, [], 0, memo.kept)
    if memo is None:
        for place in places:
            kept = _read(_kept_path(place, run, KEPT))
            same = kept is not None and kept.get("header") == header and kept.get("state") == state
            if same and kept is not None and isinstance(kept.get("answer"), dict):
                return Extension(kept["answer"], [], 0, _kept_path(place, run, KEPT))
    known = _known_files(run, places, header, state) if memo is None else {
        n: v for n, v in memo.files.items() if memo.state.get(n) == state.get(n)
    }  # fmt: skip
    names = [_rel(run, ref) for ref in run.steps]
    todo = [ref for ref, name in zip(run.steps, names, strict=True) if name not in known]
    fresh = iter(evaluate_files(todo, t.few_tokens, jobs))
    items: list[Item] = []
    for ref, name in zip(run.steps, names, strict=True):
        result, facts = known[name] if name in known else next(fresh)
        items.append((ref, result, facts))
    since = None
    if memo is not None and all(n in state for n in memo.state):  # no file gone: the build before stands
        cut = rejoin_from(run, memo.built, {ref.step for ref in todo})
        since = None if cut is None else (memo.built, cut)
    try:
        built = build(run, items, t, since)
    except Exception:  # a kept result that decoded but does not join: never trusted, the run evaluated afresh
        if not known:
            raise
        pairs = evaluate_files(list(run.steps), t.few_tokens, jobs)
        items = [(ref, *pair) for ref, pair in zip(run.steps, pairs, strict=True)]
        todo, built, memo = list(run.steps), build(run, items, t), None
    new = {_rel(run, ref) for ref in todo}
    where = _keep(run, places, (header, state), built, list(zip(names, items, strict=True)), memo, new)
    return Extension(built.answer, sorted({ref.step for ref in todo}), len(todo), where)


def _rel(run: Run, ref: StepRef) -> str:
    """A step file's name inside the run (``load_run`` finds them in ``steps/``)."""
    return f"steps/{ref.path.name}"


def _line(body: dict[str, Any]) -> bytes:
    """One entry of the kept files' list: its JSON behind the SHA-256 of its text, so a torn one is told."""
    text = json.dumps(body, allow_nan=True, separators=(",", ":")).encode()
    return hashlib.sha256(text).hexdigest().encode() + b" " + text + b"\n"


def _read_lines(path: Path) -> list[dict[str, Any]] | None:
    """The kept files' list: its header, then each file's entry; None when missing or when any entry is not
    what ``_line`` wrote (an append cut short included: the list is then not trusted, every file evaluated)."""
    try:
        data = read_regular(path)
    except (OSError, GrpoInputError):
        return None
    if not data.endswith(b"\n"):
        return None
    out = []
    for line in data[:-1].split(b"\n"):
        digest, _, text = line.partition(b" ")
        if hashlib.sha256(text).hexdigest().encode() != digest:
            return None
        try:
            out.append(json.loads(text))
        except ValueError:
            return None
    return out if isinstance(out[0], dict) and "header" in out[0] else None


def _known_files(
    run: Run, places: list[Path], header: dict[str, Any], state: dict[str, list[int]]
) -> dict[str, tuple[MicroResult, FileFacts | None]]:
    """The kept results of the step files whose size and mtime are unchanged (none from a garbled file)."""
    for place in places:
        lines = _read_lines(_kept_path(place, run, KEPT_FILES))
        if lines is None or lines[0].get("header") != header:
            continue
        try:
            entries = {e["name"]: e for e in lines[1:]}  # a file's later entry replaces its earlier one
            return {n: _decode(e) for n, e in entries.items() if n in state and e.get("state") == state[n]}
        except (TypeError, KeyError, ValueError, AttributeError):
            continue
    return {}


def _keep(
    run: Run,
    places: list[Path],
    said: tuple[dict[str, Any], dict[str, list[int]]],
    built: Built,
    named: list[tuple[str, Item]],
    memo: _Memo | None,
    new: set[str],
) -> Path | None:
    """Write the answer, and the files' results (appended: only the ``new`` ones, to the list ``memo`` wrote
    while it is not mostly superseded entries), in the first place that takes them; where that was."""
    header, state = said
    files = {name: (result, facts) for name, (_, result, facts) in named}
    for place in places:
        kept, listed = _kept_path(place, run, KEPT), _kept_path(place, run, KEPT_FILES)
        try:
            place.parent.mkdir(parents=True, exist_ok=True)
            if memo is not None and memo.kept == kept and memo.lines + len(new) <= 2 * len(named) + 16:
                lines = memo.lines + len(new)
                with open(listed, "ab") as out:
                    out.write(b"".join(_entry(name, item, state) for name, item in named if name in new))
            else:
                lines = len(named)
                body = _line({"header": header}) + b"".join(_entry(name, item, state) for name, item in named)
                write_atomic(listed, body)
            _write(kept, {"header": header, "state": state, "answer": built.answer})
            with _LOCK:
                _MEMO.pop(tuple(places), None)
                _MEMO[tuple(places)] = _Memo(header, state, files, built, kept, _stamp(kept), lines)
                while len(_MEMO) > MEMO_RUNS:
                    _MEMO.pop(next(iter(_MEMO)))
            return kept
        except OSError:
            continue
    with _LOCK:
        _MEMO.pop(tuple(places), None)
    return None


def _entry(name: str, item: Item, state: dict[str, list[int]]) -> bytes:
    return _line({"name": name, "state": state[name], **_encode(item)})


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
