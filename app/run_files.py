"""A run's files read within bounds, before anything is computed from them: run.json (its size, nesting and
listed fields checked), the cost of step files from their headers (413 past the padded-size or memory limits)
and the lane size that cost calls for, what a step or replay request will read, and a step file as the
dashboard's /api/v1/loss input; and work computed once in its lane for all the requests that wait on it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.errors import LimitError
from app.ingest import check_padded
from app.lanes import Lanes
from app.runview import batch_advantages
from app.settings import Settings
from app.store import vanished_as_404
from app.work import Reply
from grpo.batch import request_advantages
from grpo.errors import GrpoInputError
from grpo.fields import ragged
from grpo.runs import FORMAT as RUN_FORMAT
from grpo.runs import Run, StepRef, load_step, read_header

MAX_INFO_BYTES = 1024 * 1024  # run.json is a run's description: a real one is a few KB
MAX_TEXT = 200  # characters of a listed field (source, created, status)
MAX_DEPTH = 32  # nesting of run.json's values (the page answers them whole)
LISTED = ("source", "created", "status")
# The lanes size work by the JSON body it comes from (app.lanes): a float32's 4 bytes in a step file are
# about 20 characters of JSON, and one evaluate holds the GIL about as long as parsing 64 KiB of JSON does.
JSON_PER_BYTE = 5
BYTES_PER_EVALUATE = 65536


@dataclass(frozen=True)
class Scan:
    """A run's files as a stat saw them: what its summary is keyed by, and what computing it costs."""

    listing: list[int]
    listing_newest: int
    files: str
    """A digest of the names, sizes, times and inodes of run.json and the step files (a file replaced by a
    rename, as every writer here does, is a new inode whatever its time)."""
    newest: int
    step_bytes: int
    step_files: int


_flights: dict[tuple[str, str], asyncio.Future[Reply]] = {}  # answers being computed, by run and key


async def computed_once(lanes: Lanes, key: tuple[str, str], size: int, work: Callable[..., Any], *args: Any) -> Reply:
    """``work(*args)`` in the lane ``size`` calls for, once for all the concurrent requests of one ``key`` (a run
    and the state of its files); it finishes, and is kept by ``work``, even if every request goes away."""
    flight = _flights.get(key)
    if flight is None:
        flight = _flights[key] = asyncio.ensure_future(lanes.run(size, work, *args))
        flight.add_done_callback(lambda _: _flights.pop(key, None))
    return await asyncio.shield(flight)


def lane_size(file_bytes: int, evaluates: int) -> int:
    """The size, as the lanes count it, of work that reads ``file_bytes`` of step files and evaluates
    ``evaluates`` micro-batches."""
    return file_bytes * JSON_PER_BYTE + evaluates * BYTES_PER_EVALUATE


# --- run.json, read within bounds --------------------------------------------------------------------------
def _problem(value: Any, depth: int = 0) -> str | None:
    """Why a run.json value cannot be answered as JSON, or None: nesting past MAX_DEPTH, or text that is
    not Unicode (a lone surrogate, which JSON's escapes can carry and UTF-8 cannot)."""
    if depth > MAX_DEPTH:
        return f"values nested at most {MAX_DEPTH} deep"
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "text that is valid Unicode (no lone surrogates)"
        return None
    items = list(value.items()) if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    for key, item in items:
        found = _problem(key, depth + 1) or _problem(item, depth + 1)
        if found:
            return found
    return None


def read_info(path: Path) -> dict[str, Any]:
    """A run's run.json, read at most MAX_INFO_BYTES and checked to be answerable; a GrpoInputError at
    ``run.json`` that says what the rules expect."""
    with open(path / "run.json", "rb") as f:
        data = f.read(MAX_INFO_BYTES + 1)
    if len(data) > MAX_INFO_BYTES:
        raise GrpoInputError("run.json", f"at most {MAX_INFO_BYTES} bytes", got="more")
    try:
        info = json.loads(data)
    except ValueError as exc:
        raise GrpoInputError("run.json", "valid JSON", got=str(exc)[:200]) from exc
    except RecursionError as exc:
        raise GrpoInputError("run.json", "valid JSON", got="nesting too deep") from exc
    if not isinstance(info, dict):
        raise GrpoInputError("run.json", "a JSON object: a run's format, source and config", got=type(info).__name__)
    if isinstance(info.get("format"), bool) or not isinstance(info.get("format"), int) or info["format"] > RUN_FORMAT:
        raise GrpoInputError("run.json", f"a run of format <= {RUN_FORMAT}", got=repr(info.get("format"))[:50])
    for name in LISTED:
        value = info.get(name)
        if isinstance(value, list | dict) or (isinstance(value, str) and len(value) > MAX_TEXT):
            got = type(value).__name__ if not isinstance(value, str) else f"{len(value)} characters"
            expected = f"{name}: a text of at most {MAX_TEXT} characters, a number or null"
            raise GrpoInputError("run.json", expected, got=got)
    problem = _problem(info)
    if problem:
        raise GrpoInputError("run.json", problem)
    return info


# --- the step files' cost, from their headers ------------------------------------------------------------
def check_costs(
    refs: tuple[StepRef, ...] | list[StepRef], settings: Settings, joined: bool = False, dtype: str | None = None
) -> int:
    """413 when a micro-batch (each, or all ``joined`` into one batch) is past the padded-size or memory
    limits, read from the files' headers (in ``dtype``, else each file's own config's); the files' total size."""
    rows, longest, fields, total, widest = 0, 0, 1, 0, "float32"
    for ref in refs:
        header = read_header(ref.path)
        total += ref.path.stat().st_size
        logp = header.get("per_token_logps")
        shape = logp.get("shape") if isinstance(logp, dict) else None
        if not (isinstance(shape, list) and len(shape) == 2 and all(isinstance(n, int) for n in shape)):
            continue  # not a step file: loading it says what is wrong
        given = sum(isinstance(v, dict) and v.get("shape") == shape for v in header.values())
        computed = dtype or _stored_dtype(header)
        if joined:
            rows, longest, fields = rows + shape[0], max(longest, shape[1]), max(fields, given)
            widest = "float64" if "float64" in (widest, computed) else widest
            continue
        _check(ref, shape[0], shape[1], given, computed, settings)
    if joined and refs:
        _check(refs[0], rows, longest, fields, widest, settings)
    return total


def _stored_dtype(header: dict[str, Any]) -> str:
    meta = header.get("__metadata__")
    try:
        config = json.loads(meta.get("config", "{}")) if isinstance(meta, dict) else {}
    except (ValueError, RecursionError, TypeError):
        return "float32"
    return str(config.get("dtype") or "float32") if isinstance(config, dict) else "float32"


def _check(ref: StepRef, rows: int, longest: int, fields: int, dtype: str, settings: Settings) -> None:
    try:
        check_padded(rows, longest, fields, dtype, settings)
    except LimitError as exc:
        raise LimitError(["path", "step"], f"step {ref.step} ({ref.path.name}): {exc.msg}") from exc


@dataclass(frozen=True)
class Plan:
    """What a step or replay request will read: the steps, the next page, and its lane size."""

    steps: list[int]
    next: int | None
    size: int


def step_plan(
    run: Run, step: int, micro: int | None, settings: Settings, dtype: str | None = None, rank: int | None = None
) -> Plan:
    """A step's micro-batches (one, across ranks, with ``micro``; one rank's, with ``rank``) are joined into one
    batch: checked as one."""
    refs = [
        r for r in run.micro_batches(step) if (micro is None or r.micro == micro) and (rank is None or r.rank == rank)
    ]
    with vanished_as_404(run.path):
        total = check_costs(refs, settings, joined=True, dtype=dtype)
    return Plan([step], None, lane_size(total, 1))


def replay_plan(run: Run, after: int, settings: Settings, dtype: str | None = None) -> Plan:
    """Whole steps after ``after``, up to ``replay_max_micro_batches`` micro-batches (each evaluated twice)."""
    budget = settings.replay_max_micro_batches
    steps: list[int] = []
    refs: list[StepRef] = []
    numbers = [s for s in run.step_numbers() if s > after]
    for number in numbers:
        these = run.micro_batches(number)
        if len(refs) + len(these) > budget:
            if not steps:
                msg = f"step {number} holds {len(these)} micro-batches; a replay covers at most {budget} (a setting)"
                raise LimitError(["path", "run"], msg)
            break
        steps.append(number)
        refs += these
    with vanished_as_404(run.path):
        total = check_costs(refs, settings, dtype=dtype)
    more = len(steps) < len(numbers)
    return Plan(steps, steps[-1] if more else None, lane_size(total, 2 * len(refs)))


# --- a step as the dashboard's input -----------------------------------------------------------------------
def step_input(path: str, step: int, settings: Settings) -> dict[str, Any]:
    """GET /api/v1/lab/runs/{run_id}/steps/{step}: one step file (``RunStore.step_file``) as the
    dashboard's /api/v1/loss request and its config, under the same limits as /api/v1/loss, checked
    from the file's size and header before its tensors are read (a lane's job)."""
    file = Path(path)
    with vanished_as_404(file.parent.parent, ("path", "step")):
        size = file.stat().st_size
        if size > settings.max_upload_bytes:
            msg = f"the step file {file.name} has {size} bytes; at most {settings.max_upload_bytes} (a setting)"
            raise LimitError(["path", "step"], msg)
        check_costs([StepRef(step, 0, None, file)], settings, dtype="float32")  # it becomes JSON, not a breakdown
        return _step_request(file)


def _step_request(path: Path) -> dict[str, Any]:
    """A step file as the dashboard's input: each row up to its last counted token, with its mask (counted
    tokens need not be a prefix); the old and reference log-probs default to the policy's, as in
    /api/v1/loss (a TRL capture at beta 0 holds no reference)."""
    batch, config, info = load_step(path)
    lengths = ((batch.mask.cumsum(-1) * batch.mask).argmax(-1) + 1).tolist()  # up to the last counted position
    tokens = info["meta"].get("tokens") if isinstance(info["meta"], dict) else None

    def rows(value: Any) -> list[list[float]]:
        value = batch.per_token_logps if value is None else value
        return [row.tolist() for row in ragged(value, lengths)]

    body: dict[str, Any] = {
        "per_token_logps": rows(batch.per_token_logps),
        "old_per_token_logps": rows(batch.old_per_token_logps),
        "ref_per_token_logps": rows(batch.ref_per_token_logps),
        "completion_mask": rows(batch.mask_float),
        "advantages": request_advantages(batch_advantages(batch, config), lengths),  # per row, or per token
    }
    if isinstance(tokens, list) and len(tokens) == len(lengths):
        body["tokens"] = [row[:n] for row, n in zip(tokens, lengths, strict=True)]
    fields = {k: v for k, v in config.to_dict().items() if k not in ("device", "dtype")}
    return {"request": body, "config": fields | {"preset": fields.get("preset") or "article"}, "meta": info["meta"]}
