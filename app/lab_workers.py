"""Lab runs in worker processes: a bounded pool at low priority, a queue, cancellation, events.

The API's threads never train. ``LabManager`` keeps at most ``max_concurrent`` worker processes
(spawned on first use, ``os.nice``-d, ``torch_threads`` each); runs past that wait in a queue of at
most ``max_queue``, whose positions the events report.

The bookkeeping lives on the event loop and changes only in synchronous sections, never across an
await: a new run's name is checked and reserved (in memory, and by ``os.mkdir`` of its directory, the
atomic claim against the runs directory) and counted against the queue in one step; run.json is
written after that, and the reservation released if the write fails. Every job handed to a worker has
a number, the worker tags its events with it, and the job's terminal event (or its worker's death)
frees that worker whatever state its run is in: slots are tracked by worker, not by run status.

A worker sends each step's metrics back over a pipe; a dispatcher thread hands them to the event
loop, where every run keeps its events in order, encoded once and numbered (each event's ``id:`` is its
index), so a late subscriber replays them and a reconnecting one resumes after the last it had.
Cancelling sets the worker's shared cancel slot to the job's number, which the worker reads after
every step (a queued run is dropped from the queue at once); the steps so far stay as a run.
``remove`` cancels in any state, waits for the worker up to a bound, then terminates it, and forgets
the run. Stopping the server terminates the workers at once. On start, lab runs left ``queued`` or
``running`` by a previous process are marked ``interrupted``.

Every run has an owner (the client that started it: a session, else an address; ``app.lab_streams``):
one owner may have at most ``max_queue_per_client`` runs waiting, so one member cannot fill the queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import multiprocessing as mp
import os
import queue
import secrets
import shutil
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor

from app.errors import ApiError, error_item
from app.lab_catalog import tasks_json as tasks_json
from app.lanes import exit_with_parent
from app.settings import Settings
from app.store import DISK_FULL
from grpo.lab.train import LabConfig, run
from grpo.runs import RunWriter, config_from_dict, write_atomic

log = logging.getLogger("grpo_lens.lab")
TERMINAL = ("done", "error", "cancelled", "interrupted")
CANCEL_FILE = "cancel"  # a run directory's cancel request from outside the server (a person, a script)
WATCHDOG_SECONDS = 2.0
BUDGET_SETTINGS = "GRPO_LENS_RUNS_MAX_BYTES and GRPO_LENS_RUNS_MIN_FREE_BYTES"


class Job(NamedTuple):
    """One run handed to a worker; ``number`` tags every event the worker sends back for it."""

    number: int
    run_id: str
    run_dir: str
    fields: dict[str, Any]
    max_seconds: float
    budget: int | None  # bytes the run's directory may still grow by (None: no budget)


class OverBudget(Exception):
    """The next step file would take the run past the store's disk budget."""


# --- the worker process -----------------------------------------------------------------------
def _worker_main(jobs: Any, events: Any, cancel: Any, torch_threads: int, nice: int, parent: int) -> None:
    """A worker: takes ``Job``s until it gets None. ``cancel`` holds the number of a job to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server decides when workers stop
    exit_with_parent(parent)  # ... and when it dies, they go with it
    with contextlib.suppress(OSError):
        os.nice(nice)
    torch.set_num_threads(torch_threads)
    while (job := jobs.get()) is not None:
        run_job(job, events, cancel)


def run_job(job: Job, events: Any, cancel: Any) -> None:
    """Train one run, saving every step, and report ``started``, each ``step`` and one terminal event
    (the last thing the worker does for the job: after it, the run's directory is no longer touched)."""
    run_dir, writer, count = Path(job.run_dir), None, 0

    def cancelled() -> bool:
        return bool(cancel.value == job.number or (run_dir / CANCEL_FILE).exists())

    def say(event: str, data: dict[str, Any]) -> None:
        if event in TERMINAL:
            with contextlib.suppress(OSError):
                (run_dir / CANCEL_FILE).unlink(missing_ok=True)
        events.put((job.number, event, data))

    try:
        config = LabConfig(**{**job.fields, "loss": config_from_dict(job.fields["loss"])})
        queued = json.loads((run_dir / "run.json").read_text())
        kept = {k: queued[k] for k in ("lab", "name", "created") if k in queued}
        writer = BudgetedWriter(RunWriter(run_dir, "lab", config.loss, info={**kept, "status": "running"}), job.budget)
        say("started", {"pid": os.getpid()})
        start, ending = time.monotonic(), ("done", "finished")
        if cancelled():
            ending = ("cancelled", "cancelled before it started")
        else:
            for metrics in run(config, writer):
                count += 1
                say("step", metrics)
                if cancelled():
                    ending = ("cancelled", "cancelled")
                    break
                if time.monotonic() - start > job.max_seconds:
                    ending = ("done", f"time cap: {job.max_seconds:g} s (a setting)")
                    break
        writer.update(status=ending[0], steps_done=count, reason=ending[1])
        say(ending[0], {"reason": ending[1], "steps": count})
    except Exception as exc:  # a run's failure is reported to its page and its run.json
        if not isinstance(exc, OverBudget):
            log.exception("lab run %s failed", job.run_id)
        message = public_message(exc, run_dir)
        if writer is not None:
            with contextlib.suppress(OSError):  # the directory may be gone: the event still goes out
                writer.update(status="error", error=message, steps_done=count)
        say("error", {"message": message, "steps": count})


def public_message(exc: BaseException, run_dir: Path) -> str:
    """What a run's events and run.json may say of a failure: never a server path (a file error says
    what failed, not where; the run's directory in any other message becomes the run's name)."""
    if isinstance(exc, OverBudget):
        return str(exc)
    if isinstance(exc, OSError):
        return f"{type(exc).__name__}: {exc.strerror or 'the run could not be read or written'}"
    text = f"{type(exc).__name__}: {exc}"
    for path in {str(run_dir.resolve()), str(run_dir)}:
        text = text.replace(path, run_dir.name)
    return text


class BudgetedWriter:
    """A RunWriter that stops the run (``OverBudget``) when a step file would take its directory past
    ``budget`` bytes: that file is removed, the steps before it are kept."""

    def __init__(self, writer: RunWriter, budget: int | None) -> None:
        self.writer, self.budget, self.used = writer, budget, 0

    def write_step(self, step: int, micro: int, tensors: dict[str, Tensor], meta: dict[str, Any]) -> Path:
        path = self.writer.write_step(step, micro, tensors, meta)
        assert path is not None  # a lab run samples every step and has no capture budget: each is written
        if self.budget is None:
            return path
        size = path.stat().st_size
        if self.used + size > self.budget:
            path.unlink(missing_ok=True)
            raise OverBudget(
                f"stopped before step {step}: its file would cross the runs store's disk budget "
                f"({self.budget} bytes were left when the run started; settings {BUDGET_SETTINGS}); "
                "the steps so far are kept"
            )
        self.used += size
        return path

    def update(self, **fields: Any) -> None:
        self.writer.update(**fields)


# --- the server side --------------------------------------------------------------------------
def sse(event: str, data: dict[str, Any], number: int) -> bytes:
    """One Server-Sent Event, ``number`` its id (a browser's EventSource sends the last one back as
    ``Last-Event-ID`` when it reconnects); NaN and infinities as null (JSON.parse takes nothing else)."""
    finite = {k: v if not isinstance(v, float) or math.isfinite(v) else None for k, v in data.items()}
    return f"id: {number}\nevent: {event}\ndata: {json.dumps(finite)}\n\n".encode()


@dataclass
class LabRun:
    """One run as the server sees it; ``events`` is its whole event history, in order, and ``chunks``
    the same events as Server-Sent Events text (encoded once, whoever streams them; ``chunks[i]``'s id is
    ``i``). ``owner``: the client that started it ("" when none did: a run made in this process)."""

    id: str
    run_dir: Path
    fields: dict[str, Any]
    owner: str = ""
    status: str = "queued"
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    chunks: list[bytes] = field(default_factory=list)
    updated: asyncio.Event = field(default_factory=asyncio.Event)
    job: int | None = None  # the job number while a worker holds the run
    released: asyncio.Event = field(default_factory=asyncio.Event)  # set while no worker holds it

    def __post_init__(self) -> None:
        self.released.set()

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL

    def add(self, event: str, data: dict[str, Any]) -> None:
        self.chunks.append(sse(event, data, len(self.events)))
        self.events.append((event, data))
        if event in TERMINAL:
            self.status = event
        elif event == "started":
            self.status = "running"
        self.wake()

    def wake(self) -> None:
        """Wake every stream waiting on this run (each waits on the event of its time, then takes the new one)."""
        woken, self.updated = self.updated, asyncio.Event()
        woken.set()


@dataclass
class Worker:
    process: Any  # a spawned multiprocessing Process
    jobs: Any  # its job queue
    cancel: Any  # a shared int: the number of the job to stop
    job: int | None = None
    run: str | None = None


class LabRefused(ApiError):
    """A run the manager will not take or does not have, in the API's one error shape: ``loc`` names
    the request's part at fault (the body, its name, the path's run id)."""

    def __init__(self, status: int, kind: str, msg: str, loc: tuple[str, ...] = ("body",)) -> None:
        super().__init__(status, [error_item(list(loc), msg, kind)])


def new_manager(settings: Settings, budget: Callable[[], int | None] | None = None) -> LabManager:
    """The manager ``settings`` describe; ``budget``: the run store's remaining bytes, which lab runs count against."""
    return LabManager(
        settings.runs_dir,
        settings.lab_max_concurrent,
        settings.lab_max_seconds,
        settings.lab_torch_threads,
        settings.lab_nice,
        max_queue=settings.lab_max_queue,
        budget=budget,
        max_queue_per_client=settings.lab_max_queue_per_client,
    )


def lab_json(fields: dict[str, Any]) -> dict[str, Any]:
    """A run's settings as the API shows them: the loss under ``config``."""
    return {k: v for k, v in fields.items() if k != "loss"} | {"config": fields["loss"]}


def _write_queued(run_dir: Path, loss: dict[str, Any], info: dict[str, Any]) -> None:
    """A new run's run.json, written once, status ``queued``."""
    RunWriter(run_dir, "lab", loss, info={**info, "status": "queued"})


class LabManager:
    """Bounded, queued, cancellable lab runs; one per server process (app.state.lab)."""

    def __init__(
        self,
        runs_dir: Path,
        max_concurrent: int,
        max_seconds: float,
        torch_threads: int,
        nice: int,
        max_queue: int = 32,
        budget: Callable[[], int | None] | None = None,
        max_queue_per_client: int | None = None,
    ) -> None:
        self.runs_dir = Path(runs_dir)
        self.max_concurrent = max_concurrent
        self.max_seconds = max_seconds
        self.torch_threads = torch_threads
        self.nice = nice
        self.max_queue = max_queue
        self.max_queue_per_client = max_queue_per_client  # None: no share (one client may fill the queue)
        self.budget = budget  # the runs store's remaining bytes (None: no budget)
        self.runs: dict[str, LabRun] = {}
        self.pending: deque[str] = deque()
        self.workers: list[Worker] = []
        self.closing = False
        self._reserved: dict[str, str] = {}  # names whose run.json is being written -> their owners
        self._jobs = 0
        self._ctx = mp.get_context("spawn")
        self._events: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._dispatcher: threading.Thread | None = None

    # --- lifecycle ------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.mark_interrupted()

    def mark_interrupted(self) -> list[str]:
        """Lab runs a previous server left queued or running: status ``interrupted``."""
        marked = []
        for info_path in self.runs_dir.glob("*/run.json") if self.runs_dir.is_dir() else []:
            try:
                info = json.loads(info_path.read_text())
            except (OSError, ValueError, RecursionError):
                continue
            if isinstance(info, dict) and info.get("source") == "lab" and info.get("status") in ("queued", "running"):
                info["status"] = "interrupted"
                write_atomic(info_path, (json.dumps(info, indent=1) + "\n").encode())
                marked.append(info_path.parent.name)
        return marked

    def request_close(self) -> None:
        """From any thread (a signal handler): end every event stream now."""
        self.closing = True
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                self._loop.call_soon_threadsafe(self._wake_all)

    def _wake_all(self) -> None:
        for lab_run in self.runs.values():
            lab_run.wake()

    def stop(self, timeout: float = 1.0) -> None:
        """On the event loop, at shutdown: stop every worker now (their steps so far are on disk: each
        file was written atomically) and mark the runs that had not finished ``interrupted``."""
        self.closing = True
        unfinished = [r for r in self.runs.values() if not r.finished]
        for lab_run in unfinished:
            lab_run.add("interrupted", {"reason": "the server stopped"})
        self._wake_all()
        for w in self.workers:
            if w.process.is_alive():
                w.process.terminate()
        deadline = time.monotonic() + timeout
        for w in self.workers:
            w.process.join(max(0.0, deadline - time.monotonic()))
            if w.process.is_alive():
                w.process.kill()
            w.jobs.cancel_join_thread()  # nothing left to deliver: never block the exit on it
        if self._events is not None:
            self._events.cancel_join_thread()
            with contextlib.suppress(Exception):
                self._events.put(None)
        for lab_run in unfinished:
            with contextlib.suppress(OSError, ValueError):
                _set_status(lab_run.run_dir, "interrupted")

    # --- runs ---------------------------------------------------------------------------
    async def start_run(self, config: LabConfig, name: str | None, owner: str = "") -> LabRun:
        """Queue a run of ``config`` under ``name`` (default: one made of its task, the time and a random
        tag) for ``owner``; ``LabRefused`` when it cannot be taken or its directory cannot be written
        (saying why, never where)."""
        run_id = name or f"lab-{config.task}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"
        fields = config.to_dict() | {"loss": config.loss.to_dict()}
        try:
            return await self.submit(run_id, fields, {"name": run_id, "lab": lab_json(fields)}, owner)
        except OSError as exc:
            status, kind = (507, "insufficient_storage") if exc.errno in DISK_FULL else (503, "storage")
            raise LabRefused(status, kind, f"the run could not be written: {exc.strerror}") from exc

    def summary(self, lab_run: LabRun) -> dict[str, Any]:
        """A run as the lab's routes answer it: id, status, place in the queue, steps done, its settings."""
        return {
            "id": lab_run.id,
            "status": lab_run.status,
            "queue_position": self.queue_position(lab_run.id),
            "steps_done": sum(1 for e, _ in lab_run.events if e == "step"),
            "lab": lab_json(lab_run.fields),
        }

    def get(self, run_id: str) -> LabRun:
        """The run ``run_id`` of this server process; ``LabRefused`` (404) when there is none."""
        lab_run = self.runs.get(run_id)
        if lab_run is None:
            raise LabRefused(404, "not_found", f"no lab run {run_id!r} in this server process", ("path", "run_id"))
        return lab_run

    async def submit(self, run_id: str, fields: dict[str, Any], info: dict[str, Any], owner: str = "") -> LabRun:
        """Reserve ``run_id`` and a place in the queue for ``owner`` (``LabRefused`` when either is taken),
        write its run.json (status ``queued``: it lists at once), then queue it."""
        lab_run = self._reserve(run_id, fields, owner)
        try:
            await self._create(lab_run, info)
        except BaseException:
            self._reserved.pop(run_id, None)
            shutil.rmtree(lab_run.run_dir, ignore_errors=True)
            raise
        self._reserved.pop(run_id, None)
        self.runs[run_id] = lab_run
        self.pending.append(run_id)
        self._report_queue()
        self._dispatch()
        return lab_run

    def _reserve(self, run_id: str, fields: dict[str, Any], owner: str = "") -> LabRun:
        """The check and the claim in one synchronous section: no other request runs in between."""
        busy = sum(w.job is not None for w in self.workers)
        waiting = len(self.pending) + len(self._reserved)
        if waiting + 1 - max(0, self.max_concurrent - busy) > self.max_queue:
            msg = f"{waiting} lab runs are waiting (at most {self.max_queue}, a setting); retry later"
            raise LabRefused(429, "queue_full", msg)
        share = self.max_queue_per_client
        if share is not None and owner:
            mine = sum(self.runs[r].owner == owner for r in self.pending) + sum(
                o == owner for o in self._reserved.values()
            )
            free = max(0, self.max_concurrent - busy - (waiting - mine))  # the slots left after others' waiting runs
            if mine + 1 - free > share:
                msg = (
                    f"you have {mine} lab runs waiting (at most {share} each: the setting lab_max_queue_per_client); "
                    "retry when one has started"
                )
                raise LabRefused(429, "queue_share", msg)
        remaining = self.budget() if self.budget is not None else None
        if remaining is not None and remaining <= 0:
            msg = f"the runs store is full (its budget: settings {BUDGET_SETTINGS}); delete runs first"
            raise LabRefused(507, "insufficient_storage", msg)
        taken = LabRefused(409, "conflict", f"a run named {run_id!r} exists; choose another name", ("body", "name"))
        if run_id in self.runs or run_id in self._reserved:
            raise taken
        run_dir = self.runs_dir / run_id
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(run_dir)  # the claim on the runs directory: fails if anyone has the name
        except FileExistsError:
            raise taken from None
        self._reserved[run_id] = owner
        return LabRun(run_id, run_dir, fields, owner)

    async def _create(self, lab_run: LabRun, info: dict[str, Any]) -> None:
        await asyncio.to_thread(_write_queued, lab_run.run_dir, lab_run.fields["loss"], info)

    def cancel(self, run_id: str) -> LabRun:
        """Cancel a queued run at once, ask a running one to stop after its step; a finished one stays."""
        lab_run = self.runs[run_id]
        if run_id in self.pending:
            self._drop_queued(lab_run, "cancelled while queued")
            with contextlib.suppress(OSError, ValueError):
                _set_status(lab_run.run_dir, "cancelled")
        elif (worker := self._holder(lab_run)) is not None:
            worker.cancel.value = worker.job
        return lab_run

    async def remove(self, run_id: str, timeout: float) -> None:
        """Cancel ``run_id`` in whatever state it is, wait up to ``timeout`` s for its worker to let go
        (then terminate that worker and free its slot), and forget the run: its name is free again and
        its directory is the caller's to delete. An unknown name: nothing to do."""
        lab_run = self.runs.get(run_id)
        if lab_run is None:
            return
        if run_id in self.pending:
            self._drop_queued(lab_run, "deleted while queued")
        if (worker := self._holder(lab_run)) is not None:
            worker.cancel.value = worker.job
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(lab_run.released.wait(), timeout)
            if (worker := self._holder(lab_run)) is not None:  # still busy after the bound
                log.warning("lab run %s: its worker did not stop within %g s; terminating it", run_id, timeout)
                worker.process.terminate()
                self.workers.remove(worker)
                self._free(worker, lab_run)
                self._dispatch()
        if not lab_run.finished:
            lab_run.add("cancelled", {"reason": "deleted", "steps": sum(e == "step" for e, _ in lab_run.events)})
        if self.runs.get(run_id) is lab_run:
            del self.runs[run_id]

    def queue_position(self, run_id: str) -> int | None:
        """1 for the next run to start; None when the run is not waiting."""
        return self.pending.index(run_id) + 1 if run_id in self.pending else None

    def _drop_queued(self, lab_run: LabRun, reason: str) -> None:
        self.pending.remove(lab_run.id)
        lab_run.add("cancelled", {"reason": reason, "steps": 0})
        self._report_queue()

    def _holder(self, lab_run: LabRun) -> Worker | None:
        """The worker that holds ``lab_run`` now, if any."""
        return next((w for w in self.workers if w.job is not None and w.job == lab_run.job), None)

    def _free(self, worker: Worker, lab_run: LabRun | None) -> None:
        worker.job = worker.run = None
        if lab_run is not None:
            lab_run.job = None
            lab_run.released.set()

    def _report_queue(self) -> None:
        for position, run_id in enumerate(self.pending, start=1):
            lab_run = self.runs[run_id]
            last = next((d for e, d in reversed(lab_run.events) if e == "queued"), None)
            if last is None or last["position"] != position:
                lab_run.add("queued", {"position": position})

    def _dispatch(self) -> None:
        while self.pending and not self.closing:
            worker = next((w for w in self.workers if w.job is None and w.process.is_alive()), None)
            if worker is None:
                self.workers = [w for w in self.workers if w.process.is_alive() or w.job is not None]
                if len(self.workers) >= self.max_concurrent:
                    return
                worker = self._spawn()
            lab_run = self.runs[self.pending.popleft()]
            self._jobs += 1
            worker.job, worker.run, lab_run.job = self._jobs, lab_run.id, self._jobs
            lab_run.released.clear()
            budget = self.budget() if self.budget is not None else None
            job = Job(self._jobs, lab_run.id, str(lab_run.run_dir), lab_run.fields, self.max_seconds, budget)
            worker.jobs.put(job)
            self._report_queue()

    def _spawn(self) -> Worker:
        if self._events is None:
            self._events = self._ctx.Queue()
            self._dispatcher = threading.Thread(target=self._read_events, name="lab-events", daemon=True)
            self._dispatcher.start()
        jobs, cancel = self._ctx.Queue(), self._ctx.Value("q", 0)
        args = (jobs, self._events, cancel, self.torch_threads, self.nice, os.getpid())
        process = self._ctx.Process(target=_worker_main, args=args, daemon=True)
        process.start()
        worker = Worker(process, jobs, cancel)
        self.workers.append(worker)
        return worker

    def _read_events(self) -> None:
        """Dispatcher thread: worker events -> the event loop; a worker that died mid-job (killed,
        out of memory) turns into an ``error`` event for its job, which frees its slot."""
        assert self._loop is not None
        while True:
            try:
                item = self._events.get(timeout=WATCHDOG_SECONDS)
            except queue.Empty:
                item = ()
            if item is None:
                return
            dead = [(w.job, w.process.exitcode) for w in list(self.workers) if w.job and not w.process.is_alive()]
            items = [item] if item else []
            items += [(job, "error", {"message": f"the worker process died (exit code {code})"}) for job, code in dead]
            for job, event, data in items:
                with contextlib.suppress(RuntimeError):  # the loop closed under us: the server is gone
                    self._loop.call_soon_threadsafe(self.on_event, job, event, data)

    def on_event(self, job: int, event: str, data: dict[str, Any]) -> None:
        """A worker's event for job ``job``: recorded on its run if the run is still that job's and
        unfinished; a terminal event frees the worker whatever the run's state."""
        worker = next((w for w in self.workers if w.job == job), None)
        if worker is None:  # a job already ended (its worker terminated, or a second report of a death)
            return
        lab_run = self.runs.get(worker.run or "")
        if lab_run is not None and lab_run.job != job:
            lab_run = None
        if lab_run is not None and not lab_run.finished:
            lab_run.add(event, data)
        if event not in TERMINAL:
            return
        if not worker.process.is_alive():
            self.workers.remove(worker)
            if lab_run is not None:
                with contextlib.suppress(OSError, ValueError):
                    _set_status(lab_run.run_dir, "error")
        self._free(worker, lab_run)
        self._dispatch()


def _set_status(run_dir: Path, status: str) -> None:
    info_path = run_dir / "run.json"
    info = json.loads(info_path.read_text())
    info["status"] = status
    write_atomic(info_path, (json.dumps(info, indent=1) + "\n").encode())
