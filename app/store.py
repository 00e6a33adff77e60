"""The run store: the one owner of run names and run directories on the server side.

A run is a directory ``runs_dir/<name>`` holding run.json and ``steps/``. The store:

- names: one full-match, ASCII-only pattern (``RUN_NAME_PATTERN``; the lab's request model uses it too);
- creates atomically: ``reserve`` is an ``os.mkdir`` of the name (exactly one of any number of
  concurrent creators gets it: the others a 409); an upload is unpacked into a staged ``.upload-*``
  directory and renamed onto its own empty reservation, so a run appears whole or not at all;
- deletes by renaming the run to ``.deleting-*`` and removing that; a link is never followed (a run
  directory that is a link is no run of the store: 404 everywhere, never deleted through);
- reads only regular files inside the run (``grpo.runs.read_regular``: never a link);
- reads a zip from its directory first (sizes, names, duplicates; every zipfile error a 422);
- keeps a disk budget (``runs_max_bytes`` and a free-space floor, ``runs_min_free_bytes``): an upload
  that would cross either is a 507 before anything is written; a full disk while writing is a 507
  too, with nothing left behind.

Staged directories a crash left (``.upload-*``, ``.deleting-*``) and empty reservations are swept at start.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import logging
import os
import re
import secrets
import shutil
import stat
import struct
import tempfile
import threading
import time
import zipfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import IO, Any, TypeVar

from app.errors import ApiError, LimitError, error_item
from app.forms import file_form
from app.ingest import check_padded, price
from app.settings import Settings
from grpo.errors import GrpoInputError
from grpo.runs import LOGGED_FILE, MAX_HEADER_BYTES, STEP_FILE, dir_mode, load_run, load_step

log = logging.getLogger("grpo_lens.store")

# Matched whole (re.fullmatch), ASCII only: no "$" (it matches before a trailing newline).
RUN_NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
RUN_NAME = re.compile(RUN_NAME_PATTERN)
STAGED_PREFIXES = (".upload-", ".deleting-")
NAMES_MSG = "names are 1 to 128 ASCII letters, digits, '.', '-' and '_', starting with a letter or digit"
CHUNK = 1024 * 1024
SPOOL_BYTES = 8 * 1024 * 1024  # a download's zip is built in memory up to this, on disk past it
USAGE_TTL = 5.0  # seconds a walk of the runs directory is trusted (lab workers write beside the server)
LAB_REMOVE_SECONDS = 10.0  # how long a DELETE waits for a lab run's worker to let go of it
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
# What zipfile raises for a corrupt, encrypted, truncated or unsupported member, opening or reading it.
ZIP_ERRORS = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    zlib.error,
    NotImplementedError,
    RuntimeError,
    EOFError,
    ValueError,
    struct.error,
)
T = TypeVar("T")


def valid_name(name: str) -> bool:
    return RUN_NAME.fullmatch(name) is not None


def not_found(loc: list[str | int], msg: str) -> ApiError:
    return ApiError(404, [error_item(loc, msg, "not_found")])


@contextlib.contextmanager
def vanished_as_404(path: Path | str, loc: tuple[str, str] = ("path", "run")) -> Iterator[None]:
    """Reading the run at ``path``: a file gone meanwhile (the run deleted, or replaced by one without it; also
    as the library words it, a GrpoInputError from the missing file) is the 404 of a run that is not there (at
    ``loc``), never a 500."""
    try:
        yield
    except (FileNotFoundError, NotADirectoryError, GrpoInputError) as exc:
        gone = (FileNotFoundError, NotADirectoryError)
        if not isinstance(exc, gone) and not isinstance(exc.__cause__, gone):
            raise
        name = Path(path).name
        raise not_found(list(loc), f"no run {name!r}: it was deleted or replaced while it was read") from exc


def open_run(root: Path, name: str, param: str = "run") -> Path:
    """The directory of the run ``name`` under ``root``: a real directory (not a link) holding a
    regular run.json; else a 404 at the path parameter ``param``."""
    if not valid_name(name):
        raise not_found(["path", param], f"no run {name!r}: {NAMES_MSG}")
    path = root / name
    if not (_is(stat.S_ISDIR, path) and _is(stat.S_ISREG, path / "run.json")):
        raise not_found(["path", param], f"no run {name!r} under the runs directory")
    return path


def _is(kind: Callable[[int], bool], path: Path) -> bool:
    """Whether ``path`` itself (a link is never followed) is of ``kind`` (``stat.S_ISDIR``, ``S_ISREG``)."""
    try:
        return kind(os.lstat(path).st_mode)
    except OSError:
        return False


def _insufficient(msg: str) -> ApiError:
    return ApiError(507, [error_item(["body", "file"], msg, "insufficient_storage")])


def _disk_full(exc: OSError) -> ApiError:
    return _insufficient(f"the runs directory's disk is full ({os.strerror(exc.errno or errno.ENOSPC)}); nothing kept")


def _zip_call(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on a zip: any of zipfile's errors as a 422 at the file."""
    try:
        return fn(*args)
    except ZIP_ERRORS as exc:
        raise GrpoInputError("file", "a readable zip of a run", got=f"{type(exc).__name__}: {exc}"[:200]) from exc


class RunStore:
    """The runs directory of one server (``app.state.store``)."""

    def __init__(self, settings: Settings) -> None:
        self.root = Path(settings.runs_dir)
        self.settings = settings
        self._lock = threading.Lock()
        self._usage: tuple[float, int] | None = None  # (when, bytes) of the last walk
        self._claimed = 0  # bytes promised to uploads being written

    # --- names -------------------------------------------------------------------------------
    def open(self, name: str, param: str = "run") -> Path:
        return open_run(self.root, name, param)

    def step_file(self, name: str, step: int, micro: int = 0, param: str = "run") -> tuple[Path, int]:
        """The step file of run ``name``'s step ``step``, micro-batch ``micro``, as one process writes it
        (no rank), and its size: a regular file in the run's real ``steps/`` directory; else a 404 at
        the path parameter at fault."""
        path = self.open(name, param) / "steps" / f"{step:06d}-{micro:03d}.safetensors"
        try:
            found = 1 <= step <= 999_999 and _is(stat.S_ISDIR, path.parent) and os.lstat(path)
        except OSError:  # no such file, or deleted meanwhile
            found = False
        if not found or not stat.S_ISREG(found.st_mode):
            raise not_found(["path", "step"], f"run {name!r} has no saved step {step}")
        return path, found.st_size

    def reserve(self, name: str, loc: tuple[str, ...] = ("body", "name")) -> Path:
        """Take ``name`` for a new run: its directory, made empty by one ``os.mkdir`` (atomic: of any
        number of concurrent callers exactly one gets it). A bad name is a 422 and a taken one a 409,
        both at ``loc``. The caller fills the directory, or gives it back with ``release``."""
        if not valid_name(name):
            raise GrpoInputError(loc[-1], f"a run name: {NAMES_MSG}", got=repr(name)[:80])
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / name
        try:
            os.mkdir(path)
        except FileExistsError as exc:
            msg = f"a run {name!r} exists; choose another name"
            raise ApiError(409, [error_item(list(loc), msg, "conflict")]) from exc
        return path

    def release(self, path: Path) -> None:
        """Give back a reservation that was never filled (a non-empty directory stays)."""
        with contextlib.suppress(OSError):
            os.rmdir(path)

    def sweep(self) -> list[str]:
        """At start: remove staged directories a crash left behind and empty reservations."""
        removed = []
        for entry in os.scandir(self.root) if self.root.is_dir() else []:
            if entry.name.startswith(STAGED_PREFIXES):
                _remove_tree(Path(entry.path))
                removed.append(entry.name)
            elif valid_name(entry.name) and entry.is_dir(follow_symlinks=False):
                with contextlib.suppress(OSError):  # only an empty directory goes
                    os.rmdir(entry.path)
                    removed.append(entry.name)
        return removed

    # --- delete ------------------------------------------------------------------------------
    def delete(self, name: str) -> None:
        """Delete the run ``name``: one rename takes it out of sight whole, then its files go."""
        path = self.open(name)
        trash = self.root / f".deleting-{name}-{secrets.token_hex(4)}"
        try:
            os.rename(path, trash)
        except FileNotFoundError as exc:  # deleted by a request beside this one
            raise not_found(["path", "run"], f"no run {name!r} under the runs directory") from exc
        _remove_tree(trash)
        self._invalidate()

    # --- download ----------------------------------------------------------------------------
    def zip_run(self, name: str) -> tuple[IO[bytes], int]:
        """The run as a zip (run.json, steps/*.safetensors): a file positioned at its start, and its size.

        Built whole before it is answered (in memory up to ``SPOOL_BYTES``, then in an unnamed file
        beside the runs), from the run's directory opened once: a DELETE beside it gives a 404,
        never a zip missing its files. Links and other non-regular files are left out.
        """
        path = self.open(name)
        out = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES, dir=str(self.root))  # noqa: SIM115 (the caller closes it)
        try:
            run_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            try:
                with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
                    _zip_file(archive, "run.json", run_fd)
                    for logged in _logged_names(run_fd):  # what the trainer logged, a line per call
                        _zip_file(archive, logged, run_fd)
                    for step in _step_names(run_fd):
                        _zip_file(archive, f"steps/{step}", run_fd)
                # DELETE renames the run before removing its files: still here under its name, it is whole
                still_here = os.stat(path, follow_symlinks=False).st_ino == os.fstat(run_fd).st_ino
            finally:
                os.close(run_fd)
        except FileNotFoundError:
            still_here = False
        except OSError as exc:
            out.close()
            if exc.errno in DISK_FULL:
                raise _disk_full(exc) from exc
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise not_found(["path", "run"], f"no run {name!r} under the runs directory") from exc
            raise
        if not still_here:
            out.close()
            raise not_found(["path", "run"], f"no run {name!r}: it was deleted while it was being zipped")
        size = out.tell()
        out.seek(0)
        return out, size

    # --- upload ------------------------------------------------------------------------------
    def add_upload(self, body: bytes, content_type: str) -> dict[str, Any]:
        """POST /api/v1/runs: a form with the zipped run as ``file`` and its ``name`` (default: the
        file's name without its extension), read as /api/v1/upload reads its form (``app.forms``)."""
        form = file_form(body, content_type, self.settings.max_upload_bytes, ("name",))
        return self.add_zip(form.fields["name"] or PurePosixPath(form.filename or "upload").stem, form.data)

    def add_zip(self, name: str, data: bytes) -> dict[str, Any]:
        """Unpack a zipped run as the run ``name``; its summary. Only run.json and
        steps/NNNNNN-NNN[-rankR].safetensors, every one read as the views will read it before the
        run appears (a 422 naming the member and field, and nothing kept)."""
        archive = _zip_call(zipfile.ZipFile, io.BytesIO(data))
        with archive:
            members = self._members(archive)
            total = sum(m.file_size for m in members)
            target = self.reserve(name)
            try:
                with self.claim(total):
                    summary = self._unpack(archive, members, target)
            except BaseException:
                self.release(target)
                raise
        return summary

    def _members(self, archive: zipfile.ZipFile) -> list[zipfile.ZipInfo]:
        """The zip's members, checked from its directory alone: names, duplicates, sizes (one pass: a zip of
        60,000 members named alike took a minute to count them name by name); then each step file's padded
        size, priced from its header (``price_step``) before anything is unpacked."""
        members = archive.infolist()
        names: set[str] = set()
        for member in members:
            check_member(member)
            if member.filename in names:
                raise GrpoInputError("file", "a zip naming each member once", got=f"{member.filename!r} more than once")
            names.add(member.filename)
        if "run.json" not in names:
            raise GrpoInputError("file", "a zip holding run.json at its top")
        info_size = next(m.file_size for m in members if m.filename == "run.json")
        if info_size > self.settings.max_run_json_bytes:
            msg = f"run.json of {info_size} bytes; at most {self.settings.max_run_json_bytes} (a setting)"
            raise LimitError(["body", "file", "run.json"], msg)
        total, limit = sum(m.file_size for m in members), self.settings.max_unpacked_bytes
        if total > limit:
            raise LimitError(["body", "file"], f"unpacks to {total} bytes; at most {limit} (a setting)")
        files = [m for m in members if not m.is_dir()]
        steps = sum(
            price_step(m.filename, _member_header(archive, m), self.settings)
            for m in files
            if m.filename.startswith("steps/")
        )
        # the lane: unpacking and checking every member is work of this process (its disk claims), in its costly
        # threads once priced past the cheap limits (its unpacked bytes, its steps' working memory)
        price(total, self.settings.cheap_unpack_bytes, "a run zip's members", here=True)
        price(steps, self.settings.cheap_request_bytes, "a run zip's steps", here=True)
        return files

    def _unpack(self, archive: zipfile.ZipFile, members: list[zipfile.ZipInfo], target: Path) -> dict[str, Any]:
        staging = Path(tempfile.mkdtemp(dir=self.root, prefix=f".upload-{target.name}-"))
        try:
            staging.chmod(dir_mode())  # the umask's mode (0755 under 022), not mkdtemp's 0700: renamed as it is
            for member in members:
                copy_member(archive, member, staging / member.filename)
            run = _checked_run(staging)
            info = {**run.info, "uploaded": True}
            (staging / "run.json").write_text(json.dumps(info, indent=1))
            os.rename(staging, target)  # onto our own empty reservation: the run appears whole
        except OSError as exc:
            _remove_tree(staging)
            if exc.errno in DISK_FULL:
                raise _disk_full(exc) from exc
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):  # another hand wrote into the reservation
                msg = f"a run {target.name!r} exists; choose another name"
                raise ApiError(409, [error_item(["body", "name"], msg, "conflict")]) from exc
            raise
        except BaseException:
            _remove_tree(staging)
            raise
        return {**run.summary(), "name": target.name}

    # --- disk budget -------------------------------------------------------------------------
    def usage(self) -> int:
        """Bytes of every file under the runs directory (lab runs included), walked at most every USAGE_TTL s."""
        with self._lock:
            return self._usage_locked()

    def _usage_locked(self) -> int:
        now = time.monotonic()
        if self._usage is None or now - self._usage[0] > USAGE_TTL:
            self._usage = (now, _tree_bytes(self.root))
        return self._usage[1]

    def _invalidate(self) -> None:
        with self._lock:
            self._usage = None

    def remaining_bytes(self) -> int | None:
        """Bytes that may still be written under the budget and above the free-space floor; None
        when neither is set. The lab's workers stop a run that reaches it."""
        with self._lock:
            return self._remaining_locked()

    def _remaining_locked(self) -> int | None:
        left = []
        if self.settings.runs_max_bytes:
            left.append(self.settings.runs_max_bytes - self._usage_locked() - self._claimed)
        if self.settings.runs_min_free_bytes:
            self.root.mkdir(parents=True, exist_ok=True)
            free = shutil.disk_usage(self.root).free
            left.append(free - self.settings.runs_min_free_bytes - self._claimed)
        return None if not left else max(0, min(left))

    @contextlib.contextmanager
    def claim(self, nbytes: int) -> Iterator[None]:
        """Promise ``nbytes`` to a write (a 507 when the budget or the floor would be crossed);
        claims beside each other count together, so concurrent uploads cannot pass it between them."""
        with self._lock:
            remaining = self._remaining_locked()
            if remaining is not None and nbytes > remaining:
                msg = (
                    f"the runs directory has room for {remaining} more bytes (GRPO_LENS_RUNS_MAX_BYTES, "
                    f"GRPO_LENS_RUNS_MIN_FREE_BYTES); this run unpacks to {nbytes}"
                )
                raise _insufficient(msg)
            self._claimed += nbytes
        try:
            yield
        finally:
            with self._lock:
                self._claimed -= nbytes
                self._usage = None


def check_member(member: zipfile.ZipInfo) -> None:
    """A member's name from the zip's directory: run.json or steps/<step file>, inside the run, no link."""
    name = member.filename
    path = PurePosixPath(name)
    is_link = (member.external_attr >> 16) & 0o170000 == 0o120000
    inside = not path.is_absolute() and ".." not in path.parts and "\\" not in name and not is_link
    allowed = (
        name in ("run.json", "steps/")
        or LOGGED_FILE.fullmatch(name) is not None
        or (len(path.parts) == 2 and path.parts[0] == "steps" and STEP_FILE.fullmatch(path.name) is not None)
    )
    if not inside or not allowed:
        raise GrpoInputError(
            "file",
            "members run.json, logged[-rankR].jsonl and steps/NNNNNN-NNN.safetensors only, inside the run",
            got=repr(name)[:120],
        )


def _member_header(archive: zipfile.ZipFile, member: zipfile.ZipInfo) -> dict[str, Any] | None:
    """A step member's safetensors header (``grpo.runs.read_header``'s rules), read from the member's first
    bytes alone; None when it is no header (unpacking it, ``load_step`` says what is wrong)."""
    if member.file_size < 8:
        return None
    with _zip_call(archive.open, member) as src:
        head = _zip_call(src.read, 8)
        (size,) = struct.unpack("<Q", head) if len(head) == 8 else (None,)
        if size is None or size > min(MAX_HEADER_BYTES, member.file_size - 8):
            return None
        text = _zip_call(src.read, size)
    try:
        header = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return header if isinstance(header, dict) else None


def price_step(name: str, header: dict[str, Any] | None, settings: Settings) -> int:
    """413 at ``["body", "file", name]`` when the step file's batch is past the padded-size or memory limits of
    /api/v1/loss, priced from its header as the run's page prices it (its per_token_logps' (B, T), the fields
    of that shape, the dtype of its config): a run is refused here rather than accepted and then answered 413.
    Returns its price (the estimate of its working memory; 0 for a file that is no step file)."""
    logp = header.get("per_token_logps") if header is not None else None
    shape = logp.get("shape") if isinstance(logp, dict) else None
    if header is None or not (isinstance(shape, list) and len(shape) == 2 and all(type(n) is int for n in shape)):
        return 0  # not a step file: loading it says what is wrong
    given = sum(isinstance(v, dict) and v.get("shape") == shape for v in header.values())
    meta = header.get("__metadata__")
    try:
        config = json.loads(meta.get("config", "{}")) if isinstance(meta, dict) else {}
    except (ValueError, RecursionError, TypeError):
        config = {}
    dtype = str(config.get("dtype") or "float32") if isinstance(config, dict) else "float32"
    try:
        return check_padded(shape[0], shape[1], given, dtype, settings)
    except LimitError as exc:
        raise LimitError(["body", "file", name], f"{name}: {exc.msg}") from exc


def copy_member(archive: zipfile.ZipFile, member: zipfile.ZipInfo, out: Path) -> None:
    """One member into ``out``, in chunks (zipfile checks its size and CRC as it reads)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with _zip_call(archive.open, member) as src, out.open("xb") as dst:
        while chunk := _zip_call(src.read, CHUNK):
            dst.write(chunk)


def _checked_run(staging: Path) -> Any:
    """The staged run, read as its views will: run.json's fields and every step file."""
    try:
        run = load_run(staging)
    except GrpoInputError as exc:  # run.json's fields: named under it
        where: list[str | int] = ["body", "file", "run.json"]
        where += [] if exc.field == "run.json" else [exc.field]
        raise ApiError(422, [error_item(where, str(exc), "value_error")]) from exc
    for ref in run.steps:
        try:
            load_step(ref.path)
        except GrpoInputError as exc:  # named under the member it is in
            loc: list[str | int] = ["body", "file", f"steps/{ref.path.name}", exc.field]
            raise ApiError(422, [error_item(loc, str(exc), "value_error")]) from exc
    return run


def _logged_names(run_fd: int) -> list[str]:
    return sorted(n for n in os.listdir(run_fd) if LOGGED_FILE.fullmatch(n))


def _step_names(run_fd: int) -> list[str]:
    try:
        steps_fd = os.open("steps", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=run_fd)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):  # no steps (a link to some is none)
            return []
        raise
    try:
        return sorted(n for n in os.listdir(steps_fd) if STEP_FILE.fullmatch(n))
    finally:
        os.close(steps_fd)


def _zip_file(archive: zipfile.ZipFile, arcname: str, run_fd: int) -> None:
    """The regular file ``arcname`` of the run into the zip; a link or anything else is left out."""
    try:
        fd = os.open(arcname, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=run_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO) and arcname != "run.json":
            return
        raise
    with os.fdopen(fd, "rb") as src:
        if not stat.S_ISREG(os.fstat(src.fileno()).st_mode):
            return
        with archive.open(arcname, "w", force_zip64=True) as dst:
            shutil.copyfileobj(src, dst, CHUNK)


def _remove_tree(path: Path) -> None:
    """Remove ``path``: a link itself (never what it points to), else the directory and its files."""
    try:
        if path.is_symlink() or not path.is_dir():
            path.unlink(missing_ok=True)
            return
        shutil.rmtree(path)  # removes links inside, never follows them
    except OSError:
        log.exception("could not remove %s; the next start sweeps it", path)
        shutil.rmtree(path, ignore_errors=True)


def _tree_bytes(root: Path) -> int:
    """Apparent size of every regular file under ``root``, links not followed."""
    total, stack = 0, [root]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            with contextlib.suppress(OSError):
                if entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
    return total
