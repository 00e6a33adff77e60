"""What the runs' GET routes compute, at a bounded cost: the listing, a run's page, its timeline, a step, a replay.

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

import asyncio
import hashlib
import json
import os
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import suppress
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import IO, Any

import anyio
import orjson

import grpo
from app.errors import ApiError, LimitError, as_api_error, config_error, error_item, error_json
from app.ingest import Prepared, check_padded, read_json, validated
from app.lanes import Lanes
from app.runview import batch_advantages, replay, run_overview, step_batch
from app.schemas import ConfigRequest
from app.settings import Settings
from app.store import vanished_as_404
from app.work import Reply, loss_json
from grpo.answer import dumps
from grpo.batch import request_advantages
from grpo.check import DEFAULT_METRIC_ATOL, DEFAULT_RTOL, replay_config
from grpo.errors import GrpoInputError
from grpo.fields import ragged
from grpo.requests import row_lengths
from grpo.runs import FORMAT as RUN_FORMAT
from grpo.runs import (
    LOGGED_FILE,
    STEP_FILE,
    AnomalyThresholds,
    Run,
    StepRef,
    load_run,
    load_step,
    package_versions,
    read_header,
    timeline,
)

SUMMARY_FILE = ".lens-summary.json"
FORMAT = 4  # of the summary: a change in the page's or the entry's shape bumps it
VERSION = package_versions().get("grpo-lens", "unknown")
MAX_INFO_BYTES = 1024 * 1024  # run.json is a run's description: a real one is a few KB
MAX_HEADER_BYTES = 2 * MAX_INFO_BYTES  # the summary's header holds an entry drawn from run.json
MAX_TEXT = 200  # characters of a listed field (source, created, status)
MAX_DEPTH = 32  # nesting of run.json's values (the page answers them whole)
LISTED = ("source", "created", "status")
RACY_SECONDS = 2.0
RESCAN_SECONDS = 10.0
MAX_SCANS = 1024  # runs whose last scan is remembered
SCAN_LOCKS = 64  # a run's rescans go one at a time (runs share these locks by their path's hash)
CHUNK_BYTES = 1024 * 1024  # a kept page is answered in reads of this size
# The lanes size work by the JSON body it comes from (app.lanes): a float32's 4 bytes in a step file are
# about 20 characters of JSON, and one evaluate holds the GIL about as long as parsing 64 KiB of JSON does.
JSON_PER_BYTE = 5
BYTES_PER_EVALUATE = 65536
LIMIT_DEFAULT, LIMIT_MAX = 100, 1000  # runs per listing page


def _stamp() -> dict[str, Any]:
    """What made a summary: the summary's format, GRPO Lens's version and the check's tolerances."""
    return {"format": FORMAT, "version": VERSION, "rtol": DEFAULT_RTOL, "atol": DEFAULT_METRIC_ATOL}


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


# --- the run's files, as a stat sees them ----------------------------------------------------------------
def listing_key(path: Path) -> tuple[list[int], int]:
    """(run.json's size and time and steps/'s time, the newest of those times): what an entry is keyed by."""
    info = os.stat(path / "run.json")
    try:
        steps = os.stat(path / "steps").st_mtime_ns
    except (FileNotFoundError, NotADirectoryError):
        steps = -1
    return [info.st_size, info.st_mtime_ns, steps], max(info.st_mtime_ns, steps)


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


_flights: dict[tuple[str, str], asyncio.Future[Reply]] = {}  # pages being computed, by run and key


async def page(lanes: Lanes, path: Path, settings: Settings) -> Reply | Kept:
    """A run's page: the kept one, open, when the run's files are those it was made from (looked up in the
    lanes' ``reads`` threads, never a small request's); else computed once (concurrent reads share the
    computation, which finishes and is kept even if they go away)."""
    found, kept = await anyio.to_thread.run_sync(lookup, path, limiter=lanes.reads)
    if kept is not None:
        return kept
    key = (str(path), found.files)
    flight = _flights.get(key)
    if flight is None:
        size = lane_size(found.step_bytes, found.step_files)
        flight = _flights[key] = asyncio.ensure_future(lanes.run(size, summarise, str(path), found, settings))
        flight.add_done_callback(lambda _: _flights.pop(key, None))
    return await asyncio.shield(flight)


# --- a run's timeline ---------------------------------------------------------------------------------------
def anomaly_thresholds(settings: Settings) -> AnomalyThresholds:
    """The server's anomaly thresholds: its ``timeline_<field>`` settings (a field without one: the default)."""
    named = {f.name: f"timeline_{f.name}" for f in fields(AnomalyThresholds)}
    return AnomalyThresholds(**{k: getattr(settings, v) for k, v in named.items() if v in Settings.model_fields})


def timeline_cache_dir(settings: Settings) -> Path | None:
    """The timeline cache for read-only run directories: made private to this user (mode 0700) when absent,
    used only while it is this user's directory (a temp dir another user made first is not written to)."""
    path = settings.cache_dir
    with suppress(OSError):
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        if path.is_dir() and not path.is_symlink() and path.stat().st_uid == os.geteuid():
            return path
    return None


def timeline_json(path: str, settings: Settings) -> Any:
    """GET /api/v1/runs/{run}/timeline: ``grpo.runs.timeline`` under the server's thresholds, kept beside the run
    (in ``cache_dir`` when the run directory cannot be written) and extended from new step files (a lane's job)."""
    run_dir = Path(path)
    with vanished_as_404(run_dir):
        read_info(run_dir)
        return timeline(run_dir, anomaly_thresholds(settings), cache_dir=timeline_cache_dir(settings))


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


async def timeline_reply(lanes: Lanes, path: Path, found: Scan, etag: str | None, settings: Settings) -> Reply:
    """A run's timeline in the lane its step files' size calls for (a worker process for a long run; a kept one is
    answered from its file there); concurrent first reads of one state of the run share the computation."""
    key = (f"timeline:{path}", f"{found.files}\t{etag}")
    flight = _flights.get(key)
    if flight is None:
        size = lane_size(found.step_bytes, found.step_files)
        flight = _flights[key] = asyncio.ensure_future(lanes.run(size, timeline_json, str(path), settings))
        flight.add_done_callback(lambda _: _flights.pop(key, None))
    return await asyncio.shield(flight)


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
