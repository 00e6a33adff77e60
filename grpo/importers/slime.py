"""slime's debug *train* data dumps (``--save-debug-train-data``, or ``--dump-details DIR``: ``DIR/train_data/``)
-> a run. Read with ``torch.load(weights_only=True)`` only: tensors, numbers, strings, lists and dicts; a
file that needs any other object is refused, never unpickled.

Read from THUDM/slime's source, commit 624b824 (2026-08-21), ``slime/observability/train_data_utils.py``
(``save_debug_train_data``, ``_build_dump_payload``), and the layout before its commit 681b3ad (2026-08-12),
``slime/utils/train_dump_utils.py``:
- format 2 (681b3ad on): ``{"format_version": 2, "rollout_id", "rank", "samples": [...], "dp_shards": [...]}``,
  one file per rollout holding every data-parallel shard; each sample a dict of its own values, each shard's
  schedule (``partition``, ``micro_batch_indices``, ``num_microbatches``, ``global_batch_sizes``) in ``dp_shards``.
- format 1 (before): ``{"rollout_id", "rank", "rollout_data": {column: [one value per sample], schedule}}``, one
  file per rank (all ranks wrote: a pipeline stage other than the last holds no log-probs and is skipped, a
  tensor-parallel peer holds its data-parallel rank's samples again and is skipped).
Per sample, over the response tokens: ``log_probs`` (the actor's before the update: the old policy),
``ref_log_probs``, ``rollout_log_probs`` (the sampler's), ``advantages``, ``loss_masks``; per sample
``response_lengths``, ``rewards``, ``rollout_ids`` and ``rollout_mask_sums``.

The loss is ``policy_loss_function`` and ``loss_function`` (``slime/backends/megatron_utils/loss.py``), each
optimiser step's as Megatron joins its micro-batches and data-parallel ranks: with ``calculate_per_token_loss``
the sum over the step's tokens divided by Σ_samples max(mask sum, 1) (``num_tokens``); else each rollout's token
mean (``get_sum_of_sample_mean`` over ``rollout_mask_sums``: several samples of one rollout share one mean) summed
and divided by the step's rollouts (``step_global_batch_size``). A rollout trained in several optimiser steps
(``num_microbatches`` has one entry per step) becomes one step file per optimiser step.
"""

from __future__ import annotations

import dataclasses
import io
import math
import re
from argparse import Namespace
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

import torch
from torch import Tensor

import grpo.importers.common as common
from grpo import step_schema
from grpo.errors import GrpoInputError
from grpo.fields import BATCH_FIELDS
from grpo.importers.slime_config import KEEP_OLD_ACTOR
from grpo.importers.slime_config import map_slime as map_slime
from grpo.runs import read_regular
from grpo.trainer_config import TrainerMapping

READ = "slime commit 624b824 (2026-08-21): train dump format 2, and format 1 from before 681b3ad"
DUMP_FILE = re.compile(r".*\.pt")
MAX_DUMP_BYTES = 16 * 2**30
"""A dump file past this size is refused before it is read (its bytes and then its tensors are held at once)."""
GRID_FACTOR, GRID_FLOOR = 64, 2**26
"""A step's padded (rows x longest row) grid may hold at most GRID_FACTOR x its tokens, or GRID_FLOOR cells."""
# what the import reads, and the fields it writes: any other registered field a sample holds (a plugin's) is
# written as it is
TAKEN = frozenset(
    {"log_probs", "ref_log_probs", "rollout_log_probs", "advantages", "loss_masks", "rewards", "response_lengths"}
    | {"per_token_logps", "old_per_token_logps", "ref_per_token_logps", "completion_mask", "sampling_per_token_logps"}
)
CANNOT_CHECK = [
    "the current policy's log-probs: the dump holds log_probs (the actor's before the update: the old policy), "
    "so the run uses them as current: every ratio is 1 and no clip acts",
    "the loss slime returned: it is not in the dump, so check-run has no trainer loss to compare (shown as -)",
]
ROLLOUT_LOGPROBS_CURRENT = (
    "use_rollout_logprobs: the old policy is rollout_log_probs (the sampler's) and the current one log_probs, "
    "which slime 624b824 records from the training forward itself"
)
NO_LOG_PROBS = (
    "slime dumps log_probs only when it computes them before training: not with one optimiser step per rollout "
    "and kl_coef 0 (the loss reuses the training forward's own), nor with use_rollout_logprobs; from commit "
    "624b824 it records the training forward's instead. A pipeline stage before the last holds none either"
)
ROLLOUT_DUMP = "a rollout dump (save_debug_rollout_data: {rollout_id, samples}, no training columns): skipped"
PIPELINE_STAGE = "no log_probs (a pipeline stage before the last): skipped"


# --- reading a dump file -------------------------------------------------------------------------------
def dump_files(src: Path) -> list[Path]:
    """The ``*.pt`` files of ``src`` (or of ``src/train_data``, the ``--dump-details`` layout), by name; a
    symbolic link among them (or ``train_data`` itself a link) is refused: it may point outside the dump."""
    if not src.is_dir():
        raise GrpoInputError("DIR", "a directory holding slime's train data dumps (*.pt)", got=str(src))
    sub = src / "train_data"
    if sub.is_symlink():
        raise GrpoInputError(str(sub), "a directory inside DIR, not a symbolic link (refused)", got="a link")
    where = sub if sub.is_dir() else src
    found = sorted(p for p in where.iterdir() if DUMP_FILE.fullmatch(p.name) and (p.is_symlink() or not p.is_dir()))
    for p in found:
        if p.is_symlink():
            raise GrpoInputError(str(p), "a dump file, not a symbolic link (refused)", got="a link")
    if not found:
        raise GrpoInputError("DIR", "slime's train data dumps (*.pt)", got=f"none in {where}")
    return found


def load_dump(path: Path) -> dict[str, Any]:
    """A dump file through ``torch.load(weights_only=True)``, its size checked first: any object beyond plain
    data is refused."""
    raw = read_regular(path, max_bytes=MAX_DUMP_BYTES)  # a link, a FIFO or an oversized file: refused unread
    try:
        data = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch.load raises many kinds on hostile or truncated bytes: all are bad input
        first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        raise GrpoInputError(
            path.name, "a torch.save file of plain data (loadable with weights_only=True)", got=first
        ) from exc
    if not isinstance(data, dict):
        raise GrpoInputError(path.name, "a dict (slime's train dump)", got=type(data).__name__)
    return data


@dataclass
class Dump:
    """One training dump file, read: its samples and the optimiser step of each."""

    name: str
    rollout_id: int
    rank: int | None
    """The writing rank (format 1); None for format 2, which holds every data-parallel shard."""
    samples: list[dict[str, Any]]
    step_of: list[int]
    """Each sample's optimiser step within the rollout, from 0."""
    steps: int
    """The rollout's optimiser steps (``len(num_microbatches)``)."""
    global_batch_sizes: list[int] | None
    """slime's rollouts per optimiser step, when dumped."""
    partition: tuple[int, ...] | None
    """Format 1: the rank's samples' positions in the rollout (a tensor-parallel peer repeats them)."""
    label: str
    """How a sample's values are named in the file: ``samples[{i}]['{key}']`` or ``rollout_data['{key}'][{i}]``."""

    def name_of(self, i: int, key: str) -> str:
        return self.label.format(i=i, key=key)


def _whole(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 999_999


def _ints(value: Any) -> list[int] | None:
    if isinstance(value, Tensor) and value.dim() == 1 and not value.is_floating_point():
        value = value.tolist()
    if isinstance(value, list | tuple) and all(_whole(v) for v in value):
        return list(value)
    return None


def _schedule(
    layouts: list[dict[str, Any]], where: str, by_position: bool
) -> tuple[dict[int, int], int, list[int] | None]:
    """({sample position: its optimiser step}, steps, global_batch_sizes) from each shard's ``partition`` (or
    local order), ``micro_batch_indices`` and ``num_microbatches``: a rank runs ``num_microbatches[s]`` of its
    micro-batches, in order, in optimiser step s."""
    counts = [_ints(layout.get("num_microbatches")) for layout in layouts]
    steps = max((len(c) for c in counts if c), default=1)
    sizes = _ints(layouts[0].get("global_batch_sizes")) if layouts else None
    if sizes is not None and len(sizes) != steps:
        sizes = None
    step_of: dict[int, int] = {}
    if steps == 1:
        return step_of, 1, sizes
    for layout, count in zip(layouts, counts, strict=True):
        mbs = layout.get("micro_batch_indices")
        positions = _ints(layout.get("partition")) if by_position else None
        if count is None or not isinstance(mbs, list) or len(mbs) != sum(count) or (by_position and not positions):
            raise GrpoInputError(
                "num_microbatches", f"with micro_batch_indices, to place each sample in its optimiser step ({where})",
                got=f"{steps} steps per rollout and no schedule for rank {layout.get('rank')}",
            )  # fmt: skip
        bounds = [sum(count[: s + 1]) for s in range(len(count))]
        for m, mb in enumerate(mbs):
            step = next(s for s, end in enumerate(bounds) if m < end)
            for j in _ints(mb) or []:
                if positions is not None and j >= len(positions):
                    raise GrpoInputError(
                        "micro_batch_indices", f"indices into the shard's partition ({where})", got=str(j)
                    )
                step_of[positions[j] if positions is not None else j] = step
    return step_of, steps, sizes


def read_dump(path: Path) -> Dump | str:
    """A training dump file, or why it is skipped (a rollout dump; a format 1 rank without log-probs)."""
    data = load_dump(path)
    where = path.name
    if "format_version" not in data and "rollout_data" not in data and isinstance(data.get("samples"), list):
        return ROLLOUT_DUMP
    rollout_id = data.get("rollout_id")
    if not _whole(rollout_id) or rollout_id >= 999_999:
        raise GrpoInputError("rollout_id", f"a whole number from 0 ({where})", got=repr(rollout_id)[:40])
    if data.get("format_version") == 2:
        samples = data.get("samples")
        if not isinstance(samples, list) or not all(isinstance(s, dict) for s in samples):
            raise GrpoInputError("samples", f"a list of dicts ({where})", got=type(samples).__name__)
        shards = data.get("dp_shards")
        layouts = [s for s in shards if isinstance(s, dict)] if isinstance(shards, list) else []
        step_at, steps, sizes = _schedule(layouts, where, by_position=True)
        if not samples or not all("log_probs" in s for s in samples):
            raise GrpoInputError(
                "log_probs", f"the actor's log-probs in every sample ({where}): {NO_LOG_PROBS}", got="none"
            )
        step_of = [step_at.get(s.get("rollout_position", i), -1) if steps > 1 else 0 for i, s in enumerate(samples)]
        dump = Dump(where, rollout_id, None, samples, step_of, steps, sizes, None, "samples[{i}]['{key}']")
    elif "format_version" in data:
        raise GrpoInputError("format_version", f"2, or none (format 1) ({where})", got=repr(data["format_version"]))
    else:
        dump_or_skip = _format_1(data, rollout_id, where)
        if isinstance(dump_or_skip, str):
            return dump_or_skip
        dump = dump_or_skip
    if -1 in dump.step_of:
        i = dump.step_of.index(-1)
        raise GrpoInputError(
            dump.name_of(i, "rollout_position"), f"a position in a shard's schedule ({where})", got="none"
        )
    return dump


def _format_1(data: dict[str, Any], rollout_id: int, where: str) -> Dump | str:
    columns = data.get("rollout_data")
    if not isinstance(columns, dict) or not isinstance(columns.get("response_lengths"), list):
        raise GrpoInputError("rollout_data", f"a dict of columns with response_lengths ({where})", got="none")
    rank = data.get("rank")
    if not _whole(rank):
        raise GrpoInputError("rank", f"the writing rank, a whole number ({where})", got=repr(rank)[:40])
    n = len(columns["response_lengths"])
    if not n or not isinstance(columns.get("log_probs"), list | tuple) or len(columns["log_probs"]) != n:
        return PIPELINE_STAGE
    per_sample = {k: v for k, v in columns.items() if isinstance(v, list | tuple | Tensor) and len(v) == n}
    samples = [{k: v[i] for k, v in per_sample.items()} for i in range(n)]
    step_at, steps, sizes = _schedule([{**columns, "rank": rank}], where, by_position=False)
    step_of = [step_at.get(i, -1) if steps > 1 else 0 for i in range(n)]
    partition = _ints(columns.get("partition"))
    label = "rollout_data['{key}'][{i}]"
    return Dump(where, rollout_id, rank, samples, step_of, steps, sizes, tuple(partition or ()) or None, label)


# --- a sample's values, checked --------------------------------------------------------------------------
def _tokens(dump: Dump, i: int, key: str, length: int | None) -> Tensor:
    """A sample's per-token values as float32 (B,): a 1-D tensor of real numbers, all finite, backed by its own
    data (an expanded view would be materialised far past the file's size)."""
    value = dump.samples[i][key]
    name = dump.name_of(i, key)
    if not isinstance(value, Tensor) or value.dim() != 1 or value.is_complex():
        got = f"shape {tuple(value.shape)}" if isinstance(value, Tensor) else type(value).__name__
        raise GrpoInputError(key, f"a 1-D real tensor over the response tokens ({dump.name}: {name})", row=i, got=got)
    if value.numel() * value.element_size() > value.untyped_storage().nbytes():
        raise GrpoInputError(
            dump.name, "tensors backed by their own data", got=f"{name} is a view larger than its data"
        )
    if length is not None and len(value) != length:
        raise GrpoInputError(
            key, f"{length} values: the sample's response length ({dump.name})", row=i, got=str(len(value))
        )
    out = value.detach().to(torch.float32)
    bad = (~torch.isfinite(out)).nonzero()
    if bad.numel():
        j = int(bad[0, 0])
        raise GrpoInputError(dump.name, "finite log-probs, advantages and masks", got=f"{name}[{j}] is {float(out[j])}")
    return out


def _number(dump: Dump, i: int, key: str) -> float:
    value = dump.samples[i][key]
    if isinstance(value, Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise GrpoInputError(
            dump.name, "one finite number per sample", got=f"{dump.name_of(i, key)} is {value!r}"[:120]
        )
    return float(value)


@dataclass
class Sample:
    """One sample's values over its response (float32, (T_i,))."""

    logp: Tensor
    mask: Tensor
    advantages: Tensor
    ref: Tensor | None
    sampler: Tensor | None
    reward: float | None
    rollout: Any
    """The rollout it came from (``rollout_ids``; its own index when absent)."""
    more: dict[str, Any]
    rollout_total: float | None = None
    """slime's ``rollout_mask_sums``: the loss-mask total of the sample's whole rollout, when dumped."""


def read_sample(dump: Dump, i: int) -> Sample:
    s = dump.samples[i]
    n = s.get("response_lengths")
    length = int(n) if _whole(n) else None
    if "advantages" not in s:
        raise GrpoInputError("advantages", f"per-token advantages in every sample ({dump.name})", row=i, got="missing")
    logp = _tokens(dump, i, "log_probs", length)
    mask = _tokens(dump, i, "loss_masks", len(logp)) if "loss_masks" in s else torch.ones(len(logp))
    ref = _tokens(dump, i, "ref_log_probs", len(logp)) if "ref_log_probs" in s else None
    sampler = _tokens(dump, i, "rollout_log_probs", len(logp)) if "rollout_log_probs" in s else None
    reward = s.get("rewards")
    rollout = s.get("rollout_ids")
    more = {}
    for name, key in step_schema.dumped_fields(s, TAKEN).items():
        per_token = BATCH_FIELDS[name].shape == "token"
        more[name] = _tokens(dump, i, key, len(logp)) if per_token else _number(dump, i, key)
    return Sample(
        logp,
        mask,
        _tokens(dump, i, "advantages", len(logp)),
        ref,
        sampler,
        float(reward) if isinstance(reward, int | float) and not isinstance(reward, bool) else None,
        rollout if _whole(rollout) else (dump.name, i),
        more,
        _number(dump, i, "rollout_mask_sums") if "rollout_mask_sums" in s else None,
    )


# --- the dump as optimiser steps ---------------------------------------------------------------------------
@dataclass
class StepCounts:
    """What one optimiser step of a rollout holds over every file (format 1: every rank's)."""

    tokens: int = 0
    """Σ_samples max(mask sum, 1): slime's num_tokens over the step."""
    rollouts: set[Any] = dataclasses.field(default_factory=set)
    files: list[str] = dataclasses.field(default_factory=list)
    size: int | None = None
    """slime's global_batch_sizes entry for the step: its rollouts."""


@dataclass
class Survey:
    """Every file, read once before the run is written: the global counts, and what is skipped and why."""

    usable: list[Path]
    counts: dict[tuple[int, int], StepCounts]
    steps: int
    """The most optimiser steps of any rollout: step numbers are rollout_id * steps + s + 1."""
    skipped: dict[str, str]


def survey(files: list[Path]) -> Survey:
    usable: list[Path] = []
    counts: dict[tuple[int, int], StepCounts] = {}
    skipped: dict[str, str] = {}
    seen: dict[tuple[int, tuple[int, ...]], str] = {}
    steps = 1
    for path in files:
        dump = read_dump(path)
        if isinstance(dump, str):
            skipped[path.name] = dump
            continue
        if dump.partition is not None:
            peer = seen.setdefault((dump.rollout_id, dump.partition), path.name)
            if peer != path.name:  # a tensor-parallel peer: the same samples as a file already read
                skipped[path.name] = f"the same samples as {peer} (a tensor-parallel peer of its rank): skipped"
                continue
        usable.append(path)
        steps = max(steps, dump.steps)
        for i in range(len(dump.samples)):
            sample = read_sample(dump, i)  # every value checked before anything is written
            c = counts.setdefault((dump.rollout_id, dump.step_of[i]), StepCounts())
            c.tokens += max(int((sample.mask != 0).sum()), 1)  # loss_function's num_tokens: clamp_min(sum, 1)
            c.rollouts.add(sample.rollout)
            if path.name not in c.files:
                c.files.append(path.name)
            if dump.global_batch_sizes is not None:
                c.size = dump.global_batch_sizes[dump.step_of[i]]
    if not usable:
        reasons = Counter(skipped.values())
        if reasons.get(PIPELINE_STAGE):
            raise GrpoInputError(
                "log_probs", f"at least one rank's dump holding them: {NO_LOG_PROBS}",
                got=f"none in {reasons[PIPELINE_STAGE]} rank file(s)",
            )  # fmt: skip
        raise GrpoInputError("DIR", "slime's train data dumps", got=f"only {len(skipped)} rollout dump(s)")
    for (rollout_id, s), c in counts.items():
        if c.size is not None and c.size != len(c.rollouts):
            raise GrpoInputError(
                "global_batch_sizes", f"the rollouts of optimiser step {s + 1} of rollout {rollout_id} "
                f"({', '.join(c.files)}: a rank's file missing?)", got=f"{c.size} for {len(c.rollouts)} in the dump",
            )  # fmt: skip
    return Survey(usable, counts, steps, skipped)


def _grid(rows: list[Tensor], where: str, fill: float = 0.0) -> Tensor:
    """common.grid, refused past GRID_FACTOR x the rows' tokens (or GRID_FLOOR cells): a few long rows among
    many short ones would pad the short ones far past the dump's size."""
    cells = len(rows) * max((len(r) for r in rows), default=0)
    tokens = sum(len(r) for r in rows)
    if cells > max(GRID_FACTOR * tokens, GRID_FLOOR):
        raise GrpoInputError(
            where,
            f"a padded grid of at most {GRID_FACTOR} x its {tokens} tokens",
            got=f"{cells} cells ({len(rows)} rows)",
        )
    return common.grid(rows, fill)


def _rollouts(samples: list[Sample], per_token: bool) -> list[list[Sample]]:
    """The rows of a step: one per sample; under the sequence mean one per rollout, its samples joined (slime
    divides each sample's sum by its rollout's mask total, rollout_mask_sums: one token mean per rollout)."""
    if per_token:
        return [[s] for s in samples]
    groups: dict[Any, list[Sample]] = {}
    for s in samples:
        groups.setdefault(s.rollout, []).append(s)
    return list(groups.values())


def _joined(group: list[Sample], attr: str) -> Tensor:
    return torch.cat([getattr(s, attr) for s in group])


def step_of_dump(
    dump: Dump, s: int, counts: StepCounts, ranks: int, number: int, mapping: TrainerMapping, args: dict[str, Any]
) -> common.ImportedStep | None:
    """Optimiser step ``s`` of the rollout in ``dump`` (this file's samples of it) as a step file, under the
    run's config with the step's global counts (format 1: each of ``ranks`` files holds 1/ranks of them)."""
    where = dump.name
    picked = [i for i, step in enumerate(dump.step_of) if step == s]
    if not picked:
        return None
    samples = [read_sample(dump, i) for i in picked]
    config = mapping.config
    per_token = config.aggregation == "token-mean"
    rows = _rollouts(samples, per_token)
    _check_rollouts(rows, per_token, where)
    use_rollout = bool(args.get("use_rollout_logprobs"))
    if (use_rollout or config.rollout_correction != "none") and any(x.sampler is None for x in samples):
        i = picked[next(k for k, x in enumerate(samples) if x.sampler is None)]
        setting = "use_rollout_logprobs" if use_rollout else "use_tis / get_mismatch_metrics"
        raise GrpoInputError(
            where,
            f"rollout_log_probs in every sample under {setting}",
            got=f"none in {dump.name_of(i, 'rollout_log_probs')}",
        )
    current = _grid([_joined(g, "logp") for g in rows], where)
    mask = _grid([_joined(g, "mask") for g in rows], where)
    advantages = _grid([_joined(g, "advantages") for g in rows], where)
    # a rollout's samples may carry different advantages: then the row's are per token
    constant = all(len({float(x.advantages[x.mask != 0][0]) for x in g if (x.mask != 0).any()}) <= 1 for g in rows)
    tensors: dict[str, Tensor] = {
        "per_token_logps": current,
        "old_per_token_logps": _grid([_joined(g, "sampler") for g in rows], where) if use_rollout else current.clone(),
        "completion_mask": mask,
        "advantages": common.row_advantages(advantages, mask, where) if constant else advantages,
    }
    if all(x.ref is not None for x in samples):
        tensors["ref_per_token_logps"] = _grid([_joined(g, "ref") for g in rows], where)
    rewards = [{x.reward for x in g} for g in rows]
    if all(len(r) == 1 and None not in r for r in rewards):
        tensors["row_rewards"] = torch.tensor([r.pop() for r in rewards], dtype=torch.float32)
    meta: dict[str, Any] = {"imported_from": where, "trainer": "slime", "rollout_id": dump.rollout_id}
    meta["optimiser_step"] = {"of_rollout": s + 1, "steps_per_rollout": dump.steps}
    if len(rows) != len(samples):
        meta["rows"] = "one per rollout: the samples of a rollout (rollout_ids) joined, as slime's token mean is"
    if use_rollout:
        meta["old_policy"] = ROLLOUT_LOGPROBS_CURRENT
    cannot = _cannot_check(s, dump.steps, use_rollout, bool(args.get("keep_old_actor")))
    if config.beta > 0 and "ref_per_token_logps" not in tensors:
        cannot.append("the KL penalty: ref_log_probs are not dumped, so the reference is the current policy (KL 0)")
    if all(x.sampler is not None for x in samples):
        gens = [_joined(g, "sampler") for g in rows]
        tensors[common.SAMPLER_FIELD] = common.grid(gens)
        meta["sampler_vs_old"] = common.mismatch(current, _grid(gens, where, fill=float("nan")), mask)
    meta["cannot_check"] = cannot
    tensors |= step_schema.sample_tensors(_other_fields(rows, where), len(rows), where)
    meta["normalizer"] = _normalizer(counts, ranks, per_token)
    step_config = dataclasses.replace(
        config, **{k: v for k, v in meta["normalizer"].items() if k in ("token_normalizer", "sequence_normalizer")}
    )
    common.checked(tensors, where)
    return common.ImportedStep(number, dump.rank, tensors, meta, step_config)


def _check_rollouts(rows: list[list[Sample]], per_token: bool, where: str) -> None:
    """Each row joins a whole rollout, and each sample's advantage is one value."""
    for group in rows:  # a rollout's samples on several ranks (format 1) cannot be joined into one row
        total = group[0].rollout_total
        if not per_token and total is not None and total != float(sum(x.mask.sum() for x in group)):
            raise GrpoInputError(
                where, "every sample of a rollout in this file (rollout_mask_sums: one token mean per rollout)",
                got=f"rollout {group[0].rollout}'s samples on several ranks",
            )  # fmt: skip
    for group in rows:  # each sample's advantage is one value (common.row_advantages' rule), checked alone
        for one in group:
            common.row_advantages(one.advantages[None], one.mask[None], where)


def _cannot_check(s: int, steps: int, use_rollout: bool, keep_old_actor: bool) -> list[str]:
    """What optimiser step ``s`` (of ``steps`` per rollout) cannot check against slime."""
    cannot = [] if use_rollout else [CANNOT_CHECK[0]]
    cannot.append(CANNOT_CHECK[1])
    if s > 0 and not use_rollout:
        cannot.append(
            f"optimiser step {s + 1} of {steps} of this rollout: slime had updated the weights {s} time(s) "
            "since log_probs were computed, so the current policy is not in the dump"
        )
    if keep_old_actor:
        cannot.append(KEEP_OLD_ACTOR)
    return cannot


def _other_fields(rows: list[list[Sample]], where: str) -> dict[str, list[Any]]:
    """The other registered fields of each row's samples: per token, joined; per row, the samples' one value."""
    more: dict[str, list[Any]] = {}
    for g in rows:
        for name in {n for x in g for n in x.more}:
            values = [x.more.get(name) for x in g]
            if any(v is None for v in values):
                continue
            if all(isinstance(v, Tensor) for v in values):
                more.setdefault(name, []).append(torch.cat([v for v in values if isinstance(v, Tensor)]))
            elif len(set(values)) == 1:
                more.setdefault(name, []).append(values[0])
            else:
                raise GrpoInputError(name, f"one value per rollout: its samples are one row ({where})", got="several")
    return more


def _normalizer(counts: StepCounts, ranks: int, per_token: bool) -> dict[str, Any]:
    """slime's divisor of the step, over ``ranks`` files whose losses check-run averages."""
    if per_token:
        return {"token_normalizer": counts.tokens / ranks, "num_tokens": counts.tokens, "files": ranks}
    size = counts.size if counts.size is not None else len(counts.rollouts)
    return {"sequence_normalizer": size / ranks, "step_global_batch_size": size, "files": ranks}


def steps(found: Survey, mapping: TrainerMapping, args: dict[str, Any]) -> Iterator[common.ImportedStep]:
    for path in found.usable:
        dump = read_dump(path)
        assert not isinstance(dump, str)  # the survey read it as a training dump
        for s in range(dump.steps):
            counts = found.counts.get((dump.rollout_id, s))
            if counts is None:
                continue
            number = dump.rollout_id * found.steps + s + 1
            step = step_of_dump(dump, s, counts, len(counts.files), number, mapping, args)
            if step is not None:
                yield step


def notes(skipped: dict[str, str]) -> list[str]:
    """One sentence per reason a file was skipped, with how many and the first names."""
    by_reason: dict[str, list[str]] = {}
    for name, reason in skipped.items():
        by_reason.setdefault(reason, []).append(name)
    return [
        f"{len(names)} file(s), {', '.join(names[:5])}{', ...' if len(names) > 5 else ''}: {r}"
        for r, names in by_reason.items()
    ]


def import_slime(src: str | Path, run_dir: str | Path, args: Any = None) -> Path:
    """Write slime's train dumps in ``src`` as a run at ``run_dir`` (new), under ``map_slime(args)``."""
    src = Path(src)
    mapping = map_slime(args)
    given = vars(args) if isinstance(args, Namespace) else dict(args or {})
    files = dump_files(src)
    found = survey(files)
    info = {
        "imported": {
            "trainer": "slime",
            "read_as": READ,
            "from": str(src),
            "files": [p.name for p in files],
            "skipped": list(found.skipped),
            "notes": notes(found.skipped),
            "cannot_check": CANNOT_CHECK,
            "unsupported": mapping.unsupported,
            "mapped": mapping.mapped,
            "sampler_log_probs": common.SAMPLER_WHERE,
        }
    }
    return common.write_run(run_dir, "slime", mapping.config, steps(found, mapping, given), info)
