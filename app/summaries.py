"""What the runs' GET routes compute, at a bounded cost: the listing, a run's page, a step, a replay, and the
ETag of a run's timeline (the timeline itself: ``app.timelines``; run.json and the step files' cost: ``app.run_files``).

A run's page recomputes every micro-batch and checks it against the trainer (``grpo.check``): one
``evaluate`` per micro-batch, seconds to minutes for a long run. It is computed once, in the lane its
cost calls for (``app.lanes``: a worker process past a few micro-batches), and kept beside the run in
``run_dir/.lens-summary.json``: JSON Lines, a header (its keys and the run's listing entry) and then
the page's bytes, answered as they are, straight from the file a chunk at a time (``Kept``: a 40,000-member
run's page is 15 MB, never read whole into this process's memory), under an ETag (a 304 to a client that
has it). The page's key holds GRPO Lens's version, the check's
tolerances, and the names, sizes and modification times of run.json and the step files (a stat each,
nothing read): a step file written or changed makes a new key. Concurrent first reads of a run share
one computation.

A listing entry reads only run.json (at most ``MAX_INFO_BYTES``) and the step files' names; it is kept
in the same header under a key of run.json's size and time and the steps/ directory's time (a file
added, removed or renamed there changes it): a listing costs a few stats per run once entries are kept.
A run whose run.json the rules refuse is listed as invalid, with the reason.

A summary is kept only when the newest time its key holds is ``RACY_SECONDS`` older than the moment
its computation began reading: file times move in ticks (milliseconds; seconds on some filesystems), so
a file rewritten in the tick of its last write would keep its time; a later change has a later time.
Until a run's files settle, its page is recomputed (git's "racily clean" rule). A run's scan is
remembered for ``RESCAN_SECONDS`` while run.json and steps/ keep their own times (any step file added,
removed or renamed into place changes steps/'s): a warm page costs a few stats, not one per step
file, and a step file rewritten in place is seen within those seconds. A rescan (a stat per step file:
a tenth of a second or more for 40,000 of them) is made once for all the reads of a run waiting on it.
A kept page's look-up and its chunks are read in threads of their own (``Lanes.reads``): readers of a
long run's page never hold the threads small /loss requests compute in. The cache file is not synced:
a crash loses it (recomputed) or tears it (its length is checked, and a torn one is refused).

Steps and replays are checked as /api/v1/loss is, before anything is loaded: each micro-batch's padded
size and estimated memory from its file's header (413 past the limits), and their lane from their
size. A replay covers at most ``replay_max_micro_batches`` micro-batches (a setting), whole steps,
from ``after``; its answer names the next page's ``after``.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import anyio
import orjson

import grpo
from app.errors import ApiError, as_api_error, config_error, error_item, error_json
from app.ingest import Prepared, read_json, validated
from app.lanes import Lanes
from app.run_files import LISTED, check_costs, computed_once, lane_size, read_info, replay_plan, step_plan
from app.run_files import MAX_INFO_BYTES as MAX_INFO_BYTES
from app.run_files import Scan as Scan
from app.run_files import step_input as step_input
from app.runview import replay, run_overview, step_batch
from app.schemas import ConfigRequest
from app.settings import Settings
from app.store import vanished_as_404
from app.timelines import anomaly_thresholds as anomaly_thresholds
from app.timelines import timeline_cache_dir as timeline_cache_dir
from app.work import Reply, loss_json
from grpo.check import DEFAULT_METRIC_ATOL, DEFAULT_RTOL, replay_config
from grpo.errors import GrpoInputError
from grpo.requests import row_lengths
from grpo.runs import (
    LOGGED_FILE,
    STEP_FILE,
    Run,
    load_run,
    package_versions,
)
from grpo.view.answer import dumps

SUMMARY_FILE = ".lens-summary.json"
FORMAT = 4  # of the summary: a change in the page's or the entry's shape bumps it
VERSION = package_versions().get("grpo-lens", "unknown")
MAX_HEADER_BYTES = 2 * MAX_INFO_BYTES  # the summary's header holds an entry drawn from run.json
RACY_SECONDS = 2.0
RESCAN_SECONDS = 10.0
MAX_SCANS = 1024  # runs whose last scan is remembered
SCAN_LOCKS = 64  # a run's rescans go one at a time (runs share these locks by their path's hash)
CHUNK_BYTES = 1024 * 1024  # a kept page is answered in reads of this size
LIMIT_DEFAULT, LIMIT_MAX = 100, 1000  # runs per listing page


def _stamp() -> dict[str, Any]:
    """What made a summary: the summary's format, GRPO Lens's version and the check's tolerances."""
    return {"format": FORMAT, "version": VERSION, "rtol": DEFAULT_RTOL, "atol": DEFAULT_METRIC_ATOL}


# --- the run's files, as a stat sees them ----------------------------------------------------------------
def listing_key(path: Path) -> tuple[list[int], int]:
    """(run.json's size and time and steps/'s time, the newest of those times): what an entry is keyed by."""
    info = os.stat(path / "run.json")
    try:
        steps = os.stat(path / "steps").st_mtime_ns
    except (FileNotFoundError, NotADirectoryError):
        steps = -1
    return [info.st_size, info.st_mtime_ns, steps], max(info.st_mtime_ns, steps)


def scan(path: Path) -> Scan:
    listing, listing_newest = listing_key(path)
    rows = [f"run.json\t{listing[0]}\t{listing[1]}", f"name\t{path.name}"]  # the page names its run
    newest, total, count = listing[1], 0, 0
    with suppress(FileNotFoundError, NotADirectoryError), os.scandir(path / "steps") as entries:
        for entry in entries:
            if STEP_FILE.match(entry.name) is None:  # a write in progress (.tmp), or not a step
                continue
            try:
                stat = entry.stat()
            except OSError:  # gone since it was listed
                continue
            rows.append(f"steps/{entry.name}\t{stat.st_size}\t{stat.st_mtime_ns}\t{stat.st_ino}")
            newest, total, count = max(newest, stat.st_mtime_ns), total + stat.st_size, count + 1
    with suppress(FileNotFoundError, NotADirectoryError), os.scandir(path) as entries:
        for entry in entries:  # what the trainer logged: appended to, a line per log call
            if LOGGED_FILE.fullmatch(entry.name) is not None:
                with suppress(OSError):
                    stat = entry.stat()
                    rows.append(f"{entry.name}\t{stat.st_size}\t{stat.st_mtime_ns}\t{stat.st_ino}")
                    newest = max(newest, stat.st_mtime_ns)
    digest = hashlib.sha256("\n".join(sorted(rows)).encode("utf-8", "surrogateescape")).hexdigest()
    return Scan(listing, listing_newest, digest, newest, total, count)


def _settled(read_from: int, newest: int) -> bool:
    """Whether content read from ``read_from`` (ns) on may be kept under a key whose newest time is ``newest``:
    a change after the read then has a later time than the key holds, so a later stat sees it."""
    return read_from - newest >= RACY_SECONDS * 1e9


_scans: OrderedDict[str, tuple[list[int], float, Scan]] = OrderedDict()  # run -> (listing key, when, scan)
_scans_lock = threading.Lock()
_scan_locks = [threading.Lock() for _ in range(SCAN_LOCKS)]


def _remembered(path: Path, key: list[int]) -> Scan | None:
    with _scans_lock:
        memo = _scans.get(str(path))
    if memo is not None and memo[0] == key and time.monotonic() - memo[1] < RESCAN_SECONDS:
        return memo[2]
    return None


def current_scan(path: Path) -> Scan:
    """The run's scan, stat by stat, at most every RESCAN_SECONDS while run.json and steps/ keep their own
    times (a step file added, removed or renamed changes steps/'s): a warm page costs a few stats, not one
    per step file. A step file rewritten in place, not renamed, is seen within RESCAN_SECONDS. Concurrent
    reads of a run whose scan is due wait for one rescan and share it (four readers of a 40,000-member
    run's page each scanning it held four threads for a second every RESCAN_SECONDS)."""
    key, _ = listing_key(path)
    found = _remembered(path, key)
    if found is not None:
        return found
    with _scan_locks[hash(str(path)) % SCAN_LOCKS]:
        found = _remembered(path, key)  # made by the read this one waited for
        if found is not None:
            return found
        found = scan(path)
        with _scans_lock:
            _scans[str(path)] = (found.listing, time.monotonic(), found)
            _scans.move_to_end(str(path))
            while len(_scans) > MAX_SCANS:
                _scans.popitem(last=False)
    return found


# --- the summary file --------------------------------------------------------------------------------------
def _read_header(f: Any) -> dict[str, Any] | None:
    try:
        header = json.loads(f.readline(MAX_HEADER_BYTES))
    except (ValueError, RecursionError):
        return None
    return header if isinstance(header, dict) and header.get("stamp") == _stamp() else None


def _cached(path: Path) -> dict[str, Any] | None:
    """The summary's header; None when absent or made by other code or tolerances."""
    try:
        with open(path / SUMMARY_FILE, "rb") as f:
            return _read_header(f)
    except OSError:
        return None


@dataclass
class Kept:
    """A kept page, open: its body is ``length`` bytes of ``file`` from ``offset``, read a chunk at a time
    (``chunks``), never whole into memory. The file stays open until the last chunk is read (or ``close``):
    a summary rewritten meanwhile is a new file (a rename), and this one still reads the page looked up."""

    file: IO[bytes]
    offset: int
    length: int
    status: int
    etag: str
    headers: dict[str, str] = field(default_factory=dict)

    def read(self, start: int) -> bytes:
        """The body's bytes from ``start``, at most CHUNK_BYTES; an OSError if the file lost them."""
        chunk = os.pread(self.file.fileno(), min(CHUNK_BYTES, self.length - start), self.offset + start)
        if not chunk:
            raise OSError(f"{SUMMARY_FILE} shrank while it was answered")
        return chunk

    async def chunks(self, limiter: anyio.CapacityLimiter) -> AsyncIterator[bytes]:
        """The body, chunk by chunk, each read in a thread under ``limiter``; the file closed at the end."""
        try:
            done = 0
            while done < self.length:
                chunk = await anyio.to_thread.run_sync(self.read, done, limiter=limiter)
                done += len(chunk)
                yield chunk
        finally:
            self.close()

    def close(self) -> None:
        self.file.close()


def _kept(path: Path, want_page: str) -> Kept | None:
    """The kept page, open, when the summary's page key is ``want_page``; None when absent, torn, made by
    other code or tolerances or from other files. Only its header is read."""
    try:
        f = open(path / SUMMARY_FILE, "rb")  # noqa: SIM115 (the Kept answer closes it)
    except OSError:
        return None
    try:
        kept = _opened(f, want_page)
    except BaseException:
        f.close()
        raise
    if kept is None:
        f.close()
    return kept


def _opened(f: IO[bytes], want_page: str) -> Kept | None:
    header = _read_header(f) or {}
    status, length = header.get("status"), header.get("bytes")
    if header.get("page") != want_page or status not in (200, 422) or type(length) is not int:
        return None
    stat = os.fstat(f.fileno())
    if stat.st_size != f.tell() + length:  # torn (a crash before the page was all on disk), or not ours
        return None
    tag = f"{want_page}\t{stat.st_ino}\t{stat.st_mtime_ns}\t{stat.st_size}"  # this very file: these bytes
    etag = '"' + hashlib.sha256(tag.encode()).hexdigest()[:32] + '"'
    return Kept(f, f.tell(), length, int(status), etag, {"etag": etag, "cache-control": "private, no-cache"})


def _write(path: Path, header: dict[str, Any], body: bytes = b"") -> None:
    """Write the summary atomically (temp file + rename), not synced: a cache lost in a crash is recomputed.
    A run directory that cannot be written (read-only) just keeps no summary."""
    data = dumps({"stamp": _stamp(), **header, "bytes": len(body)}) + b"\n" + body
    try:
        fd, tmp = tempfile.mkstemp(dir=path, prefix=f"{SUMMARY_FILE}.", suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path / SUMMARY_FILE)
    except OSError:
        Path(tmp).unlink(missing_ok=True)


# --- the listing ---------------------------------------------------------------------------------------------
def count_steps(path: Path) -> tuple[int, int]:
    """(steps, step files) of a run, from the names in steps/."""
    steps, files = set(), 0
    with suppress(FileNotFoundError, NotADirectoryError), os.scandir(path / "steps") as entries:
        for entry in entries:
            match = STEP_FILE.match(entry.name)
            if match:
                steps.add(match[1])
                files += 1
    return len(steps), files


def fresh_entry(path: Path) -> dict[str, Any]:
    """A run's listing entry, read from its files: valid with Run.summary()'s fields, or invalid with the reason."""
    try:
        info = read_info(path)
    except GrpoInputError as exc:
        return {"name": path.name, "valid": False, "error": str(exc)}
    steps, files = count_steps(path)
    return {"name": path.name, **{k: info.get(k) for k in LISTED}, "steps": steps, "files": files, "valid": True}


def entry(path: Path) -> dict[str, Any]:
    """A run's listing entry: kept in its summary while run.json and steps/ are unchanged."""
    at = time.time_ns()
    key, newest = listing_key(path)
    header = _cached(path)
    if header is not None and header.get("listing_key") == key and isinstance(header.get("listing"), dict):
        return {**header["listing"], "name": path.name}  # a run renamed keeps its files' times
    found = fresh_entry(path)
    if _settled(at, newest) and (header is None or header.get("page") is None):  # never drop a kept page
        _write(path, {"listing_key": key, "listing": found, "page": None, "status": None})
    return found


def invalid_name(name: str) -> dict[str, Any]:
    shown = name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return {"name": shown, "valid": False, "error": "not a run name: letters, digits, '.', '-' and '_'"}


def listing(
    root: Path, sort: str, after: str | None, limit: int, is_name: Callable[[str], bool]
) -> tuple[list[dict[str, Any]], str | None]:
    """One page of the runs under ``root``: (entries, the next page's ``after`` or None). Sorted by name,
    or by time (the newest of run.json's and steps/'s times: the run's last write), newest first."""
    names = []
    with suppress(FileNotFoundError, NotADirectoryError), os.scandir(root) as children:
        for child in children:  # a dot: being written or deleted, or the store's own; a link is no run
            run_json = os.path.join(child.path, "run.json")
            if not child.name.startswith(".") and not child.is_symlink() and os.path.isfile(run_json):
                names.append(child.name)
    if sort == "name":
        order = sorted(names)
        start = 0 if after is None else next((i for i, n in enumerate(order) if n > after), len(order))
    else:
        times = {}
        for name in names:
            with suppress(OSError):  # gone since listed
                times[name] = listing_key(root / name)[1]
        order = sorted(times, key=lambda n: (-times[n], n))
        if after is not None and after not in times:
            msg = f"no run {after!r} to continue after (deleted since?): list again without after"
            raise ApiError(422, [error_item(["query", "after"], msg, "value_error")])
        start = 0 if after is None else order.index(after) + 1
    page = order[start : start + limit]
    entries = []
    for name in page:
        if not is_name(name):
            entries.append(invalid_name(name))
            continue
        try:
            entries.append(entry(root / name))
        except FileNotFoundError:  # deleted meanwhile
            continue
        except OSError as exc:
            entries.append({"name": name, "valid": False, "error": f"unreadable: {exc.strerror}"})
    more = start + limit < len(order)
    return entries, page[-1] if more and page else None


# --- a run's page -----------------------------------------------------------------------------------------------
def lookup(path: Path) -> tuple[Scan, Kept | None]:
    """The run's files as they are, and its page, open, when the kept one was made from exactly these."""
    with vanished_as_404(path):
        read_info(path)
        found = current_scan(path)
        return found, _kept(path, found.files)


def summarise(path: str, found: Scan, settings: Settings) -> Any:
    """Compute a run's page and keep it (a lane's job: a path and a scan in, the page's JSON out)."""
    started, run_dir = time.time_ns(), Path(path)
    with vanished_as_404(run_dir):  # deleted meanwhile: a 404, nothing kept
        return _summarised(run_dir, started, found, settings)


def _summarised(run_dir: Path, started: int, found: Scan, settings: Settings) -> Any:
    error: ApiError | None = None
    try:
        read_info(run_dir)
        run = load_run(run_dir)
        check_costs(run.steps, settings)  # 413s are not kept: they follow the settings, not the files
        body = dumps(run_overview(run, DEFAULT_RTOL, DEFAULT_METRIC_ATOL))
    except GrpoInputError as exc:  # a bad step file or run.json: kept, it is what these files are
        if isinstance(exc.__cause__, FileNotFoundError | NotADirectoryError):
            raise  # not what these files are: they are gone
        error = as_api_error(exc, "run page")
        body = error_json(error.items)
    header: dict[str, Any] = {"listing_key": None, "listing": fresh_entry(run_dir), "page": None, "status": None}
    if _settled(started, found.listing_newest):
        header["listing_key"] = found.listing
    if _settled(started, found.newest):
        header.update(page=found.files, status=200 if error is None else error.status)
    if header["listing_key"] is not None or header["page"] is not None:
        _write(run_dir, header, body)
    if error is not None:
        raise error
    return orjson.Fragment(body)


async def page(lanes: Lanes, path: Path, settings: Settings) -> Reply | Kept:
    """A run's page: the kept one, open, when the run's files are those it was made from (looked up in the
    lanes' ``reads`` threads, never a small request's); else computed once (concurrent reads share the
    computation, which finishes and is kept even if they go away)."""
    found, kept = await anyio.to_thread.run_sync(lookup, path, limiter=lanes.reads)
    if kept is not None:
        return kept
    size = lane_size(found.step_bytes, found.step_files)
    return await computed_once(lanes, (str(path), found.files), size, summarise, str(path), found, settings)


# --- a run's timeline's ETag (the timeline itself: app.timelines) -----------------------------------------
def timeline_etag(path: Path, settings: Settings) -> tuple[Scan, str | None]:
    """The run's scan and the ETag of its timeline under these thresholds: the answer follows from the run's
    files, the thresholds and GRPO Lens's version. None while the files are too new to be told apart by time."""
    with vanished_as_404(path):
        read_info(path)
        found = current_scan(path)
    if not _settled(time.time_ns(), found.newest):
        return found, None
    made_of = f"{found.files}\t{VERSION}\t{sorted(asdict(anomaly_thresholds(settings)).items())}"
    return found, '"t' + hashlib.sha256(made_of.encode()).hexdigest()[:32] + '"'


async def timeline_tag(lanes: Lanes, path: Path, settings: Settings) -> tuple[Scan, str | None]:
    """The run's scan and its timeline's ETag, looked up in the lanes' ``reads`` threads (a few stats)."""
    return await anyio.to_thread.run_sync(timeline_etag, path, settings, limiter=lanes.reads)


# --- steps and replays -----------------------------------------------------------------------------------------
def opened(path: Path) -> Run:
    """A run to read from: its run.json within the listing's bounds (a 422 saying why not), then loaded."""
    with vanished_as_404(path):
        read_info(path)
        return load_run(path)


@dataclass(frozen=True)
class Shown:
    """What of a step's breakdown its answer carries, as /api/v1/loss's ``token_rows`` and ``heatmap_rows``:
    every row's per-token arrays up to the per-token limit, past it those of ``token_rows``."""

    token_rows: list[int] | None = None
    heatmap_rows: str = "shown"


async def step(
    lanes: Lanes,
    path: Path,
    number: int,
    micro: int | None,
    config: str | None,
    settings: Settings,
    shown: Shown = Shown(),
    rank: int | None = None,
) -> Reply:
    """GET /api/v1/runs/{run}/steps/{step}: ``config`` (``?config=``, JSON text of a preset and overrides)
    checked as /api/v1/loss checks its config, the step (or its micro-batch, or its rank's) found (a 404
    naming which is missing), its cost checked from the files' headers (413), then evaluated in its lane."""
    given = overrides(None if not config else read_json(config, ["query", "config"]), ["query", "config"])
    run = await lanes.call(opened, path)
    refs = run.micro_batches(number)
    if rank is not None and refs and rank not in {r.rank for r in refs}:
        ranks = ", ".join(str(r) for r in sorted({r.rank for r in refs if r.rank is not None})) or "none named"
        msg = f"run {run.name!r} has no rank {rank} at step {number} (its ranks: {ranks})"
        raise ApiError(404, [error_item(["query", "rank"], msg, "not_found")])
    if not refs or (micro is not None and micro not in [r.micro for r in refs]):
        where = f"step {number}" + ("" if micro is None else f" micro-batch {micro}")
        raise ApiError(404, [error_item(["path", "step"], f"run {run.name!r} has no {where}", "not_found")])
    plan = await lanes.call(step_plan, run, number, micro, settings, (given or {}).get("dtype"), rank)
    return await lanes.run(plan.size, step_json, str(path), number, micro, given, settings, shown, rank)


async def replay_page(lanes: Lanes, path: Path, body: dict[str, Any], after: int, settings: Settings) -> Reply:
    """POST /api/v1/runs/{run}/replay: ``body`` is a config (or ``{"config": ...}``), checked as
    /api/v1/loss checks its config; the steps after ``after`` that fit one page, in their lane."""
    loc: list[str | int] = ["body", "config"] if "config" in body else ["body"]
    given = overrides(body.get("config", body), loc) or {}
    run = await lanes.call(opened, path)
    plan = await lanes.call(replay_plan, run, after, settings, given.get("dtype"))
    return await lanes.run(plan.size, replay_json, str(path), plan.steps, given, plan.next)


def overrides(value: Any, loc: list[str | int]) -> dict[str, Any] | None:
    """A config's overrides checked as /api/v1/loss checks its config (a 422 at ``loc`` naming the field)."""
    if value is None:
        return None
    model = validated(ConfigRequest, value, loc)
    return model.model_dump(exclude_unset=True) | dict(model.model_extra or {})  # type: ignore[no-any-return]


def _config(stored: grpo.LossConfig, given: dict[str, Any] | None, loc: list[str | int]) -> grpo.LossConfig:
    try:
        return replay_config(stored, given)
    except GrpoInputError as exc:
        raise config_error(loc, exc) from exc


def step_json(
    path: str,
    step: int,
    micro: int | None,
    given: dict[str, Any] | None,
    settings: Settings,
    shown: Shown = Shown(),
    rank: int | None = None,
) -> Any:
    """GET /api/v1/runs/{run}/steps/{step}: the step's batch (or one micro-batch) evaluated once. ``breakdown`` is
    /api/v1/loss's answer to ``request`` (the batch and the config it was evaluated under): the page draws it as
    it is, and a replay under another config is this endpoint again with ``?config=``."""
    with vanished_as_404(path):
        run = load_run(path)
        fields, stored, info = step_batch(run, step, micro, rank)
    resolved = _config(stored, given, ["query", "config"])
    request = {**fields, "config": {k: v for k, v in resolved.to_dict().items() if k != "device"}}
    lengths = row_lengths(fields)
    if any(r >= len(lengths) for r in shown.token_rows or []):
        msg = f"row numbers below {len(lengths)}, the step's rows"
        raise ApiError(422, [error_item(["query", "token_rows"], msg, "value_error")])
    rows = None if sum(lengths) <= settings.full_token_limit else shown.token_rows
    prepared = Prepared(dict(fields), lengths, None)  # a copy: evaluating lets go of its fields
    breakdown = loss_json(prepared, resolved, settings, None, rows, shown.heatmap_rows)
    return {"run": run.name, **info, "breakdown": breakdown, "request": request}


def replay_json(path: str, steps: list[int], given: dict[str, Any], nxt: int | None) -> Any:
    """POST /api/v1/runs/{run}/replay: ``steps`` of the run under ``given``, and the next page's ``after``."""
    try:
        with vanished_as_404(path):
            out = replay(load_run(path), given, steps)
    except GrpoInputError as exc:  # a config field (the preset, a value out of range): named under body.config
        if exc.field not in grpo.FIELD_NAMES:
            raise
        raise config_error(["body", "config"], exc) from exc
    return {**out, "next": nxt}
