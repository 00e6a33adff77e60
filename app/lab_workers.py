"""Lab runs in worker processes: a bounded pool at low priority, a queue, cancellation, events.

The API's threads never train. ``LabManager`` keeps at most ``max_concurrent`` worker processes
(spawned on first use, ``os.nice``-d, ``torch_threads`` each); runs past that wait in a queue
whose positions the events report. A worker sends each step's metrics back over a pipe; a
dispatcher thread hands them to the event loop, where every run keeps its events in order so a
late subscriber replays them. Cancelling writes a ``cancel`` file into the run's directory, which
the worker checks after every step (a queued run is dropped from the queue at once); the steps
so far stay as a run. Stopping the server terminates the workers at once. On start, lab runs
left ``queued`` or ``running`` by a previous process are marked ``interrupted``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import multiprocessing as mp
import os
import queue
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.context import SpawnProcess
from pathlib import Path
from typing import Any

from app.lanes import exit_with_parent
from grpo.runs import write_atomic

log = logging.getLogger("grpo_lens.lab")
TERMINAL = ("done", "error", "cancelled", "interrupted")
CANCEL_FILE = "cancel"
WATCHDOG_SECONDS = 2.0


# --- the worker process -----------------------------------------------------------------------
def _worker_main(jobs: Any, events: Any, torch_threads: int, nice: int, parent: int) -> None:
    """A worker: takes (run_id, run_dir, lab config dict, max_seconds) jobs until it gets None."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server decides when workers stop
    exit_with_parent(parent)  # ... and when it dies, they go with it
    with contextlib.suppress(OSError):
        os.nice(nice)
    import torch

    from grpo.lab.train import LabConfig, run
    from grpo.runs import RunWriter, config_from_dict

    torch.set_num_threads(torch_threads)
    while (job := jobs.get()) is not None:
        run_id, run_dir, fields, max_seconds = job
        run_dir = Path(run_dir)
        writer = None
        try:
            config = LabConfig(**{**fields, "loss": config_from_dict(fields["loss"])})
            info = json.loads((run_dir / "run.json").read_text())
            writer = RunWriter(run_dir, "lab", config.loss)
            writer.update(**{k: v for k, v in info.items() if k in ("lab", "name")}, status="running")
            events.put((run_id, "started", {"pid": os.getpid()}))
            start, count, ending = time.monotonic(), 0, ("done", {"reason": "finished"})
            steps = run(config, writer) if not (run_dir / CANCEL_FILE).exists() else iter([])
            if (run_dir / CANCEL_FILE).exists():
                ending = ("cancelled", {"reason": "cancelled before it started"})
            for metrics in steps:
                count += 1
                events.put((run_id, "step", metrics))
                if (run_dir / CANCEL_FILE).exists():
                    ending = ("cancelled", {"reason": "cancelled"})
                    break
                if time.monotonic() - start > max_seconds:
                    ending = ("done", {"reason": f"time cap: {max_seconds:g} s (a setting)"})
                    break
            writer.update(status=ending[0], steps_done=count, reason=ending[1]["reason"])
            events.put((run_id, ending[0], {**ending[1], "steps": count}))
        except Exception as exc:  # a run's failure is reported to its page and its run.json
            log.exception("lab run %s failed", run_id)
            if writer is not None:
                writer.update(status="error", error=str(exc))
            events.put((run_id, "error", {"message": f"{type(exc).__name__}: {exc}"}))
        (run_dir / CANCEL_FILE).unlink(missing_ok=True)


# --- the server side --------------------------------------------------------------------------
@dataclass
class LabRun:
    """One run as the server sees it; ``events`` is its whole event history, in order."""

    id: str
    run_dir: Path
    fields: dict[str, Any]
    status: str = "queued"
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    updated: asyncio.Event = field(default_factory=asyncio.Event)
    worker: int | None = None

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL

    def add(self, event: str, data: dict[str, Any]) -> None:
        self.events.append((event, data))
        if event in TERMINAL:
            self.status = event
        elif event == "started":
            self.status = "running"
        woken, self.updated = self.updated, asyncio.Event()
        woken.set()


@dataclass
class _Worker:
    process: SpawnProcess
    jobs: Any
    run: str | None = None


class LabManager:
    """Bounded, queued, cancellable lab runs; one per server process (app.state.lab)."""

    def __init__(self, runs_dir: Path, max_concurrent: int, max_seconds: float, torch_threads: int, nice: int) -> None:
        self.runs_dir = runs_dir
        self.max_concurrent = max_concurrent
        self.max_seconds = max_seconds
        self.torch_threads = torch_threads
        self.nice = nice
        self.runs: dict[str, LabRun] = {}
        self.pending: deque[str] = deque()
        self.workers: list[_Worker] = []
        self.closing = False
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
            except (OSError, ValueError):
                continue
            if info.get("source") == "lab" and info.get("status") in ("queued", "running"):
                info["status"] = "interrupted"
                write_atomic(info_path, (json.dumps(info, indent=1) + "\n").encode())
                marked.append(info_path.parent.name)
        return marked

    def stop(self, timeout: float = 1.0) -> None:
        """Stop every worker now (their steps so far are on disk: each file was written atomically)
        and mark the runs that had not finished ``interrupted``."""
        self.closing = True
        unfinished = [run for run in self.runs.values() if not run.finished]
        for run in unfinished:
            run.add("interrupted", {"reason": "the server stopped"})
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
        for run in unfinished:
            with contextlib.suppress(OSError, ValueError):
                _set_status(run.run_dir, "interrupted")

    # --- runs ---------------------------------------------------------------------------
    def submit(self, run_id: str, fields: dict[str, Any], info: dict[str, Any]) -> LabRun:
        """Queue a run: its run.json (status ``queued``) is written now, so it lists at once."""
        from grpo.runs import RunWriter, config_from_dict

        run_dir = self.runs_dir / run_id
        writer = RunWriter(run_dir, "lab", config_from_dict(fields["loss"]))
        writer.update(status="queued", **info)
        run = LabRun(run_id, run_dir, fields)
        self.runs[run_id] = run
        self.pending.append(run_id)
        self._report_queue()
        self._dispatch()
        return run

    def cancel(self, run_id: str) -> LabRun:
        run = self.runs[run_id]
        if run.finished:
            return run
        if run_id in self.pending:
            self.pending.remove(run_id)
            _set_status(run.run_dir, "cancelled")
            run.add("cancelled", {"reason": "cancelled while queued", "steps": 0})
            self._report_queue()
        else:
            (run.run_dir / CANCEL_FILE).touch(exist_ok=True)
        return run

    def queue_position(self, run_id: str) -> int | None:
        """1 for the next run to start; None when the run is not waiting."""
        return self.pending.index(run_id) + 1 if run_id in self.pending else None

    def _report_queue(self) -> None:
        for position, run_id in enumerate(self.pending, start=1):
            run = self.runs[run_id]
            last = next((d for e, d in reversed(run.events) if e == "queued"), None)
            if last is None or last["position"] != position:
                run.add("queued", {"position": position})

    def _dispatch(self) -> None:
        while self.pending and not self.closing:
            worker = next((w for w in self.workers if w.run is None and w.process.is_alive()), None)
            if worker is None:
                self.workers = [w for w in self.workers if w.process.is_alive() or w.run is not None]
                if len(self.workers) >= self.max_concurrent:
                    return
                worker = self._spawn()
            run_id = self.pending.popleft()
            run = self.runs[run_id]
            worker.run, run.worker = run_id, self.workers.index(worker)
            worker.jobs.put((run_id, str(run.run_dir), run.fields, self.max_seconds))
            self._report_queue()

    def _spawn(self) -> _Worker:
        if self._events is None:
            self._events = self._ctx.Queue()
            self._dispatcher = threading.Thread(target=self._read_events, name="lab-events", daemon=True)
            self._dispatcher.start()
        jobs = self._ctx.Queue()
        process = self._ctx.Process(
            target=_worker_main, args=(jobs, self._events, self.torch_threads, self.nice, os.getpid()), daemon=True
        )
        process.start()
        worker = _Worker(process, jobs)
        self.workers.append(worker)
        return worker

    def _read_events(self) -> None:
        """Dispatcher thread: worker events -> the event loop; a worker that died mid-run (killed,
        out of memory) turns into an ``error`` event for its run, and its slot is freed."""
        assert self._loop is not None
        while True:
            try:
                item = self._events.get(timeout=WATCHDOG_SECONDS)
            except queue.Empty:
                item = ()
            if item is None:
                return
            dead = [(w.run, w.process.exitcode) for w in list(self.workers) if w.run and not w.process.is_alive()]
            items = [item] if item else []
            items += [(run, "error", {"message": f"the worker process died (exit code {code})"}) for run, code in dead]
            for run_id, event, data in items:
                with contextlib.suppress(RuntimeError):  # the loop closed under us: the server is gone
                    self._loop.call_soon_threadsafe(self._on_event, run_id, event, data)

    def _on_event(self, run_id: str, event: str, data: dict[str, Any]) -> None:
        run = self.runs.get(run_id)
        if run is None or run.finished:
            return
        run.add(event, data)
        if event in TERMINAL:
            if event == "error":
                with contextlib.suppress(OSError, ValueError):
                    _set_status(run.run_dir, "error")
            for w in self.workers:
                if w.run == run_id:
                    w.run = None
            self._dispatch()


def _set_status(run_dir: Path, status: str) -> None:
    info_path = run_dir / "run.json"
    info = json.loads(info_path.read_text())
    info["status"] = status
    write_atomic(info_path, (json.dumps(info, indent=1) + "\n").encode())
