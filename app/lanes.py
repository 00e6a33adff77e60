"""Two lanes for the work of a request, chosen by its price, so that small requests never wait behind costly ones.

- cheap work runs in threads of this process: quick, and the event loop stays free. A body under
  ``large_request_bytes`` starts in the small requests' threads (``threads`` at a time); a larger binary
  batch file or run zip (``light``: copied, not parsed) in the large lane's threads (``threads // 2``, at
  least 1: never every thread the small requests need). The work prices itself before its costly part
  (``app.ingest.price``: padded positions' working memory, an export's file, a compressed upload's unpacked
  size from its headers, a run zip's steps): past ``cheap_request_bytes`` or ``cheap_unpack_bytes`` it
  stops (``Costly``) and starts again in the costly lane;
- costly work, and any body of ``large_request_bytes`` or more that must be parsed (JSON, text, ``.pt``:
  parsing holds the GIL, so in a thread it would stall every other request), runs in a pool of
  ``process_workers`` worker processes (spawned, started with the app), at a lower CPU priority
  (``worker_nice``) and with ``worker_torch_threads`` torch threads, so the server's process keeps a core.
  At most ``process_queue`` more wait for a worker; past that the answer is a 503 with Retry-After
  (capacity, not a fault). One member (a signed-in session, else a client address: ``member_of``) holds at
  most ``process_queue_per_client`` of those places, and always one fewer than all: past its share its
  request is a 429 with Retry-After, so one member's loop never keeps another's costly request out. A worker
  gives its memory back to the OS once idle ``trim_idle`` seconds, and is replaced when, idle, it still holds
  ``worker_recycle_bytes`` more.

Costly work that must stay in this process (a run zip: the store's disk claims are this process's), and any
costly work when there is no pool (``process_workers = 0``, or an app whose lifespan did not run, as in the
ASGI test client), runs in the costly threads: ``threads // 2`` (at least 1) of their own, on Linux at
``worker_nice`` too (niced one by one), with places and a per-member share of their own as the pool's
(``Places``). ``Lanes.used`` counts the work each lane answered. A worker's large answer (an export) comes
back as a file the server sends in chunks (``Reply.path``), never whole through the pool's pipe.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import re
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import nullcontext, suppress
from contextvars import ContextVar
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import anyio

from app.auth import cookie_values
from app.errors import error_item, error_json
from app.ingest import Costly, cheap_work
from app.memory import allow_huge_pages_in_children, huge_pages_for, release_memory
from app.settings import Settings
from app.small_first import PausedForSmall, SmallFirst
from app.work import Reply, replying

T = TypeVar("T")

log = logging.getLogger("grpo_lens")


def exit_with_parent(parent: int, poll: float = 0.5) -> None:
    """In a worker process: exit as soon as ``parent``, the process that started it (its PID, passed
    from there), is gone: killed, crashed, or stopped without shutting its pool down; never left running
    as an orphan holding memory. The PID comes from the parent because by the time a worker gets here
    (seconds of imports after its start) the parent may already be gone and the worker re-parented."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll)
        os._exit(0)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _worker_start(settings: Settings, parent: int, small_running: Any) -> None:
    """A worker process: below the server's priority, its own torch threads, glibc tuned for (B, T) buffers,
    gone with its parent, pausing its jobs while the server computes a small request (``small_running``)."""
    exit_with_parent(parent)
    SERVER["pid"] = parent  # the spool files it writes are its server's
    WORKER["paused_for_small"] = PausedForSmall(small_running, settings.small_first_wait)
    import torch

    from grpo._allocator import keep_freed_memory

    if settings.worker_nice:
        os.nice(settings.worker_nice)
    torch.set_num_threads(settings.worker_torch_threads or torch.get_num_threads())
    keep_freed_memory()  # evaluate re-allocates dozens of (B, T) tensors: keep them mapped during a job


def _ready() -> int:
    return os.getpid()


def rss_bytes(pid: int) -> int:
    """Resident memory of process ``pid`` (0 when it is gone or /proc is not there)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class Spooled:
    """A large body as a file (tmpfs where there is one), handed to a worker by its path, not through the
    pool's pipe: pickled through the pipe it would be copied twice in the server, and one copy outlives the
    request. ``BodyLimit`` writes a large body here chunk by chunk as it arrives (``append``), so the
    server's main process never joins it in memory: a 24 MB join is a copy into freshly faulted pages, all
    of it holding the GIL that the small requests beside it need. ``head`` keeps the first ``HEAD_BYTES``
    (what ``binary_upload`` sniffs); ``len`` is the body's size."""

    HEAD_BYTES = 65536

    def __init__(self, data: bytes | None = None) -> None:
        self.size = 0
        self.head = b""
        self.taken = False  # a route took the file to hand to a lane (``take_spooled``)
        self.in_tmpfs = SPOOL_DIR is not None
        self.fd, self.path = self._open(SPOOL_DIR)
        if data is not None:  # the whole body at once; else ``append`` the chunks, then ``finish``
            self.append(data)
            self.finish()

    @staticmethod
    def _open(directory: str | None) -> tuple[int, str]:
        return tempfile.mkstemp(prefix=f"grpo-lens-{SERVER['pid']}-", dir=directory)

    def append(self, chunk: bytes) -> None:
        """Add ``chunk`` at the end. A full tmpfs (Docker's /dev/shm holds 64 MB) moves the file to the
        temp dir, what it held so far included."""
        if len(self.head) < self.HEAD_BYTES:
            self.head += chunk[: self.HEAD_BYTES - len(self.head)]
        try:
            self._write(chunk)
        except OSError:
            if not self.in_tmpfs:
                raise
            self._move_to_temp_dir()
            self._write(chunk)
        self.size += len(chunk)

    def _write(self, chunk: bytes) -> None:
        view = memoryview(chunk)
        while view:
            view = view[os.write(self.fd, view) :]

    def _move_to_temp_dir(self) -> None:
        fd, path = self._open(None)
        try:
            os.lseek(self.fd, 0, os.SEEK_SET)
            while block := os.read(self.fd, 1 << 20):
                os.write(fd, block)
            os.ftruncate(self.fd, 0)  # the tmpfs pages go back at once, whoever still holds the file
        except OSError:
            os.close(fd)
            os.unlink(path)
            raise
        self.discard()
        self.fd, self.path, self.in_tmpfs = fd, path, False

    def finish(self) -> None:
        """Writing is done: the file stays (a worker opens it by path), its descriptor here is closed."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __len__(self) -> int:
        return self.size

    def __getstate__(self) -> dict[str, Any]:
        """What a worker gets: the path and size (no descriptor of this process, no head)."""
        return {**self.__dict__, "fd": -1, "head": b""}

    def read(self) -> bytes:
        try:
            with open(self.path, "rb") as f:
                return f.read()
        finally:
            self.discard()

    def discard(self) -> None:
        self.finish()
        with suppress(FileNotFoundError):
            os.unlink(self.path)


SPOOL_DIR = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
# The server process whose spool files this process writes (in a worker: its parent's), in their names, so that
# a server starting can remove the files of servers that are gone (killed before they could).
SERVER = {"pid": os.getpid()}
# In a worker process: its jobs' pause for the server's small requests (app.small_first); elsewhere nothing.
WORKER: dict[str, Any] = {"paused_for_small": nullcontext()}
SPOOL_NAME = re.compile(r"grpo-lens-(\d+)-")


def remove_orphaned_spool_files() -> int:
    """Remove the spool files (bodies, downloads) that servers no longer running left behind; how many.
    A server killed between spooling a body or a worker's download and sending or reading it leaves its file,
    in /dev/shm memory until the machine restarts. Files of a running server (any pid alive) are left alone."""
    removed = 0
    for folder in {SPOOL_DIR, tempfile.gettempdir()} - {None}:
        with suppress(OSError):
            for name in os.listdir(folder):
                found = SPOOL_NAME.match(name)
                if found is None or _alive(int(found.group(1))):
                    continue
                with suppress(OSError):
                    os.unlink(os.path.join(str(folder), name))
                    removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


SPOOLED_BODY = "grpo_lens.spooled_body"  # the ASGI scope's key for a body ``BodyLimit`` spooled


MEMBER: ContextVar[str] = ContextVar("grpo_lens_member", default="")  # who sends the request being answered


def member_of(scope: Any) -> str:
    """Who sends a request, for the costly lane's per-member share: the signed-in session where the instance
    has sign-in (people behind one address each get their own share), else the client's address (uvicorn has
    put the forwarded one there when the proxy is trusted), as the event streams' caps count them."""
    sessions = getattr(getattr(scope.get("app"), "state", None), "sessions", None)
    if sessions is not None:
        cookie = b"; ".join(v for k, v in scope.get("headers", ()) if k == b"cookie").decode("latin-1")
        for value in cookie_values(cookie):
            if (sid := sessions.check(value)) is not None:
                return f"session {sid}"
    client = scope.get("client")
    return f"address {client[0] if client else ''}"


def take_spooled(scope: Any) -> Spooled | None:
    """The body ``BodyLimit`` spooled for this request, now the caller's to hand to a lane (``None``: the
    body is small, or not spooled; read it as usual). Once taken, the app's ``receive`` gives no bytes.
    Every answered request comes here first: its sender (``member_of``) is noted for the lane's share."""
    MEMBER.set(member_of(scope))
    spooled: Spooled | None = scope.get(SPOOLED_BODY)
    if spooled is None or spooled.taken:
        return None
    spooled.taken = True
    return spooled


def unspooled(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """``args`` with every spooled body read back as bytes (in a thread or a worker: never the event loop)."""
    return tuple(a.read() if isinstance(a, Spooled) else a for a in args)


def _spool(args: tuple[Any, ...]) -> list[Any]:
    return [Spooled(a) if isinstance(a, bytes) and len(a) >= 65536 else a for a in args]


_trim: dict[str, threading.Timer] = {}  # this process's heap trim, due once large work has paused
_rest = {"rss": 0}  # this process's resident bytes after its last trim
GROWN_BYTES = 32 * 1024 * 1024  # a process this far above its last trim has freed memory worth returning


def trim_when_idle(idle: float | None) -> None:
    """Cancel the trim that is due; with ``idle``, trim this process's heap once ``idle`` s pass without
    another call. Back-to-back large jobs reuse the pages already mapped (page-faulting a batch's
    buffers in again costs as much as computing it); a process at rest holds no more than it needs."""
    if timer := _trim.pop("due", None):
        timer.cancel()
    if idle is not None:
        _trim["due"] = timer = threading.Timer(idle, _trim_now)
        timer.daemon = True
        timer.start()


def _trim_now() -> None:
    release_memory()
    _rest["rss"] = rss_bytes(os.getpid())


def trim_if_grown(idle: float, grown: int = GROWN_BYTES) -> None:
    """After any request: when this process holds ``grown`` bytes more than after its last trim, trim
    its heap ``idle`` s from now. A trim already due is left as it is, so a stream of small requests
    never postpones it. Any route that allocates (a run listing, a download, an export) is covered
    without knowing it: ``app.middleware.TrimWhenGrown`` calls this after every response."""
    due = _trim.get("due")
    if due is not None and due.is_alive():
        return
    if rss_bytes(os.getpid()) - _rest["rss"] >= grown:
        trim_when_idle(idle)


REPLY_FILE_BYTES = 1024 * 1024  # a worker's download this large comes back as a file, not through the pool's pipe


def _in_worker(fn: Any, idle: float, *args: Any) -> Reply:
    """A job in a worker. Its freed buffers stay mapped for the next job (a back-to-back large request
    would page-fault them all in again) and go back to the OS once the worker has been idle ``idle`` s.
    A large download (an export: up to hundreds of MB) is written to a spool file that the server sends
    from: through the pipe it would be copied three times in the server's process, holding the GIL that
    the small requests beside it need, and held whole in its memory."""
    trim_when_idle(None)
    try:
        args = unspooled(args)
        with huge_pages_for(sum(len(a) for a in args if isinstance(a, bytes))), WORKER["paused_for_small"]:
            reply = replying(getattr(fn, "__name__", "request"), fn, *args)
        if reply.download and len(reply.body) >= REPLY_FILE_BYTES:
            spooled = Spooled(reply.body)
            reply.body, reply.path = b"", spooled.path
        return reply
    finally:
        del args
        trim_when_idle(idle)


def drop_reply_file(future: Any) -> None:
    """A worker's answer nobody will send (its request was cancelled): remove its file."""
    if not future.cancelled() and future.exception() is None and future.result().path:
        with suppress(FileNotFoundError):
            os.unlink(future.result().path)


@dataclass
class Escalated:
    """Cheap work that priced itself costly (``Costly``): its arguments, bodies read back, for the costly lane."""

    args: tuple[Any, ...]
    here: bool


def _cheap(fn: Any, *args: Any) -> Reply | Escalated:
    """A job in the small-request threads or the large lane's, stopped where it prices itself past the cheap
    limits (``app.ingest.price``); a spooled body is read back here, off the event loop."""
    args = unspooled(args)
    with cheap_work():
        try:
            return replying(getattr(fn, "__name__", "request"), fn, *args)
        except Costly as costly:
            return Escalated(args, costly.here)


def _costly(fn: Any, *args: Any) -> Reply:
    """A costly job in a thread of this process (the niced ones): run whatever its price."""
    return replying(getattr(fn, "__name__", "request"), fn, *unspooled(args))


def _nice_thread(nice: int) -> None:
    """A costly thread: ``nice`` below the server's CPU priority. Linux sets a priority per thread (elsewhere
    a thread's priority is its process's: left as it is)."""
    if nice and sys.platform.startswith("linux"):
        tid = threading.get_native_id()
        with suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))


class Places:
    """The places of a costly lane: ``runners`` running and ``process_queue`` more waiting, past which a request
    is a 503 with Retry-After (capacity, not a fault). One member (``member_of``) holds at most
    ``process_queue_per_client`` of them, and always one fewer than all: past its share its request is a 429
    with Retry-After, so one member's loop never keeps another's costly request out."""

    def __init__(self, runners: int, settings: Settings) -> None:
        self.limit = runners + settings.process_queue
        self.share = max(1, min(settings.process_queue_per_client, self.limit - 1))
        self.retry_after = str(settings.retry_after)
        self.taken = 0
        self.members: Counter[str] = Counter()

    def enter(self, member: str) -> Reply | None:
        """Take a place for ``member``; or the refusal to answer instead (nothing taken)."""
        if self.taken >= self.limit:
            msg = (
                f"the large-request lane is full ({self.limit} large requests running or waiting); retry after "
                f"{self.retry_after} s (requests priced cheap are not queued)"
            )
            return Reply(503, error_json([error_item(["body"], msg, "busy")]), {"retry-after": self.retry_after})
        if self.members[member] >= self.share:
            msg = (
                f"you have {self.share} large requests running or waiting (at most {self.share} each: the setting "
                f"process_queue_per_client, so others get a place); retry after {self.retry_after} s"
            )
            return Reply(429, error_json([error_item(["body"], msg, "queue_share")]), {"retry-after": self.retry_after})
        self.taken += 1
        self.members[member] += 1
        return None

    def leave(self, member: str) -> None:
        self.taken -= 1
        self.members[member] -= 1
        if not self.members[member]:
            del self.members[member]


class Lanes:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.threads = anyio.CapacityLimiter(settings.threads)
        self.small_first = SmallFirst(settings.small_first_wait)  # a large body's reading waits for them
        # threads of their own, never the small ones': large binary files and run zips, priced as they are read
        self.large_threads = ThreadPoolExecutor(max(1, settings.threads // 2), "large")
        # costly work that stays in this process, niced (a thread once niced is never un-niced: a pool of its own)
        costly = max(1, settings.threads // 2)
        self.costly_threads = ThreadPoolExecutor(
            costly, "costly", initializer=_nice_thread, initargs=(settings.worker_nice,)
        )
        # places (running or waiting) in the worker pool and in the costly threads, shared out per member
        self.process_places = Places(settings.process_workers, settings)
        self.thread_places = Places(costly, settings)
        self.used: Counter[str] = Counter()  # work answered per lane: "small", "large", "costly" (threads), "process"
        # kept pages' look-ups (a few stats, a header; a run's rescan now and then) and their bodies' chunks:
        # file reads that compute nothing, never a slot of the small requests' threads (app.summaries.page)
        self.reads = anyio.CapacityLimiter(settings.threads)
        self.pool: ProcessPoolExecutor | None = None
        self.started_rss: dict[int, int] = {}
        self.recycling = threading.Lock()  # each worker's RSS once it had imported everything
        self.jobs = 0  # large jobs done: a recycle timer acts only if none came after it

    def start(self) -> None:
        """Start the worker processes; they import the app in the background (seconds, once) while the
        server already answers."""
        _rest["rss"] = rss_bytes(os.getpid())  # at rest: imports done, nothing computed yet
        if removed := remove_orphaned_spool_files():
            log.info("removed %d spool files left by servers no longer running", removed)
        if self.settings.process_workers < 1:
            return
        context = multiprocessing.get_context("spawn")
        if self.settings.worker_huge_pages:
            allow_huge_pages_in_children()
        start = (self.settings, os.getpid(), self.small_first.flag)
        self.pool = ProcessPoolExecutor(
            self.settings.process_workers, mp_context=context, initializer=_worker_start, initargs=start
        )
        self.started_rss = {}
        for _ in range(self.settings.process_workers):
            self.pool.submit(_ready).add_done_callback(self._note_started)

    def _note_started(self, future: Any) -> None:
        if not future.cancelled() and future.exception() is None:
            self.started_rss[future.result()] = rss_bytes(future.result())

    def _recycle_if_grown(self) -> None:
        """Replace the workers when, idle, they hold ``worker_recycle_bytes`` more than when they started:
        what malloc_trim cannot return (fragmented heaps, caches) goes with the process."""
        if self.pool is None or self.process_places.taken or not self.started_rss:
            return
        grown = sum(rss_bytes(pid) - rss for pid, rss in self.started_rss.items())
        if grown > self.settings.worker_recycle_bytes:
            log.info("worker processes hold %d MB more than at start: replacing them", grown // 2**20)
            old, self.pool = self.pool, None  # meanwhile (a moment: the workers are idle) large requests use threads
            old.shutdown(wait=True)  # the old workers are gone before new ones start: never both in memory
            self.start()

    def stop(self) -> None:
        """Stop the workers now. The server is going away: a large job in flight is dropped, and the
        process's exit does not wait seconds for idle workers to notice the pool's shutdown."""
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
            for pid in self.started_rss:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            self.pool = None

    async def run(self, size: int, fn: Any, *args: Any, light: bool = False) -> Reply:
        """``fn(*args)`` off the event loop, in the lane its price calls for. A body under ``large_request_bytes``
        starts in the small-request threads; a larger one in the large lane's threads when it is ``light``
        (binary batch files, run zips: copied, not parsed) or there is no pool, else in a worker process. Work
        that prices itself costly in those threads (``Costly``) starts again in a worker process, or, where it
        must stay in this process or there is no pool, in the costly threads (niced)."""
        if size < self.settings.large_request_bytes:
            with self.small_first.small():
                done = await self._thread(self.threads, "small", fn, *args)
        elif light or self.pool is None:
            done = await self._thread(self.large_threads, "large", fn, *args)
        else:
            return await self._in_process(fn, *args)
        if isinstance(done, Reply):
            return done
        self.used["escalated"] += 1
        if done.here or self.pool is None:
            return await self._costly_thread(fn, *done.args)
        return await self._in_process(fn, *done.args)

    async def _thread(self, lane: Any, name: str, fn: Any, *args: Any) -> Reply | Escalated:
        """Cheap work in ``lane``: the small requests' threads (a limiter) or the large lane's (an executor, whose
        torch work pauses for small requests as a worker's does)."""
        job = partial(_cheap, fn, *args)
        done: Reply | Escalated
        if isinstance(lane, ThreadPoolExecutor):
            done = await asyncio.wrap_future(lane.submit(self._stepping_back, job))
            trim_when_idle(self.settings.trim_idle)
        else:
            done = await anyio.to_thread.run_sync(job, limiter=lane)
        if isinstance(done, Reply):
            self.used[name] += 1
        return done

    def _stepping_back(self, job: Callable[[], T]) -> T:
        """``job()`` in a large or costly thread, its torch operations paused while a small request runs
        (``app.small_first``): a pause sleeps, so the small request has this process's GIL as well as the core."""
        with PausedForSmall(self.small_first.flag, self.settings.small_first_wait):
            return job()

    async def _placed(self, places: Places, work: Callable[[], Awaitable[Reply]]) -> Reply:
        """``work()`` once its sender (``MEMBER``) has a place in ``places``; else the refusal (503 or 429)."""
        member = MEMBER.get()
        refused = places.enter(member)
        if refused is not None:
            return refused
        try:
            return await work()
        finally:
            places.leave(member)

    async def _costly_thread(self, fn: Any, *args: Any) -> Reply:
        """In the costly threads (niced), with places and a per-member share as the worker pool's."""
        return await self._placed(self.thread_places, partial(self._in_costly_thread, fn, *args))

    async def _in_costly_thread(self, fn: Any, *args: Any) -> Reply:
        try:
            job = partial(_costly, fn, *args)
            reply: Reply = await asyncio.wrap_future(self.costly_threads.submit(self._stepping_back, job))
        finally:
            trim_when_idle(self.settings.trim_idle)
        self.used["costly"] += 1
        return reply

    async def _in_process(self, fn: Any, *args: Any) -> Reply:
        """In a worker process of the pool (503 when its queue is full, 429 past the member's share)."""
        return await self._placed(self.process_places, partial(self._in_pool, fn, *args))

    async def _in_pool(self, fn: Any, *args: Any) -> Reply:
        spooled = await anyio.to_thread.run_sync(_spool, args)  # writing 64 MB would stall the event loop
        pool = self.pool
        try:
            if pool is None:  # the workers are being replaced (a moment): this one runs in a thread
                return await self._costly_thread(fn, *args)
            job = pool.submit(partial(_in_worker, fn, self.settings.trim_idle), *spooled)
            try:
                reply = await asyncio.wrap_future(job)
            except asyncio.CancelledError:
                job.add_done_callback(drop_reply_file)
                raise
        except BrokenProcessPool:  # a worker died (killed from outside): start fresh ones
            log.error("a worker process died; restarting the pool")
            self.stop()
            await anyio.to_thread.run_sync(self.start)
            msg = "a worker process stopped while computing this; please retry"
            return Reply(503, error_json([error_item(["body"], msg, "worker_lost")]), {"retry-after": "5"})
        finally:
            for item in spooled:
                if isinstance(item, Spooled):
                    item.discard()  # already gone unless the worker never ran
        self.used["process"] += 1
        self._after_large_job()
        return reply

    def _after_large_job(self) -> None:
        """Trim once idle; replace grown workers only once the lane has been idle ``worker_recycle_idle``
        seconds, so a run of large requests is not slowed by a worker restart (seconds) after each."""
        trim_when_idle(self.settings.trim_idle)  # the body's copies in this process
        self.jobs += 1
        timer = threading.Timer(self.settings.worker_recycle_idle, self._recycle_when_idle, (self.jobs,))
        timer.daemon = True
        timer.start()

    def _recycle_when_idle(self, jobs: int) -> None:
        if jobs != self.jobs:  # another large job came since: its own timer decides
            return
        with self.recycling:  # one replacement at a time
            self._recycle_if_grown()

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the small-request lane's threads: short work (a listing, a store's file
        operation) kept off the event loop. Unlike ``run`` it returns what ``fn`` returns and raises
        what it raises."""
        return await anyio.to_thread.run_sync(partial(fn, *args), limiter=self.threads)
