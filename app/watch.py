"""The server's watch on running runs: each new step file pushed to the run's event stream within a second.

A run is watched while someone listens to its events (``GET /api/v1/runs/{name}/events``) and its run.json
says ``running``. One thread polls every ``watch_interval`` seconds (at most 1 s; ``watchfiles`` is not a
dependency), per watched run only a few stats: the run directory, run.json, logged.jsonl and steps/ (a step
file renamed into place changes steps/'s time). Nothing changed: nothing read. A change: the run's timeline
(``grpo.runs.timeline``) is extended from the new step files only (its kept ``.lens-timeline.json``: the same
one the timeline endpoint answers from), and what differs from what was sent becomes events
(``app.run_streams``). File times move in ticks, so a run that changed in the last ``RACY_SECONDS`` is looked
at again even when its times did not move (a second file renamed in the tick of the first).

The runs directory is never rescanned: only watched runs are looked at. Watching a run stops when its status
leaves ``running`` (a ``done`` event ends its streams), when it is deleted or replaced, or when its last
stream closes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import orjson

from app.errors import ApiError
from app.lab_streams import EventStream
from app.run_streams import LiveRun, RunStreams, start_index
from app.settings import Settings
from app.summaries import anomaly_thresholds, timeline_cache_dir
from grpo import runs
from grpo.run_directory import read_regular

log = logging.getLogger("grpo_lens.watch")
RACY_SECONDS = 2.0
MAX_INFO_BYTES = 1024 * 1024
Events = list[tuple[str, dict[str, Any]]]


def timeline_of(path: Path, settings: Settings) -> dict[str, Any]:
    """The run's timeline as the timeline endpoint answers it (same thresholds, same kept file)."""
    answer: dict[str, Any] = runs.timeline(path, anomaly_thresholds(settings), cache_dir=timeline_cache_dir(settings))
    return answer


def files_key(path: Path) -> tuple[int, ...]:
    """What a poll compares: the run directory's inode and time, run.json's, logged.jsonl's and steps/'s."""
    run = os.stat(path)
    info = os.stat(path / "run.json")
    key = [run.st_ino, run.st_mtime_ns, info.st_ino, info.st_size, info.st_mtime_ns]
    for name in ("logged.jsonl", "steps"):
        try:
            other = os.stat(path / name)
            key += [other.st_size, other.st_mtime_ns]
        except (FileNotFoundError, NotADirectoryError):
            key += [-1, -1]
    return tuple(key)


def step_entries(path: Path) -> int:
    """How many names steps/ holds: what tells a file renamed in within the tick of the last change."""
    try:
        return len(os.listdir(path / "steps"))
    except (FileNotFoundError, NotADirectoryError):
        return -1


def run_status(path: Path) -> str | None:
    """run.json's ``status`` (None when it has none, or is being rewritten and unreadable)."""
    try:
        info = orjson.loads(read_regular(path / "run.json", MAX_INFO_BYTES))
    except (ValueError, OSError):
        return None
    status = info.get("status") if isinstance(info, dict) else None
    return status if isinstance(status, str) else None


@dataclass
class Watch:
    """One watched run: its event log and what the watcher has seen and sent of it."""

    path: Path
    run: LiveRun
    lock: threading.Lock = field(default_factory=threading.Lock)
    key: tuple[int, ...] | None = None
    changed_at: float = 0.0  # time.monotonic() of the last change seen
    status: str | None = None
    verdict: str | None = None
    entries: int = -1  # names in steps/ when last computed
    sent: dict[Any, int] = field(default_factory=dict)  # a step's or an anomaly's identity -> hash of what was sent

    def diff(self, answer: dict[str, Any], history: int | None) -> Events:
        """The steps and anomalies of ``answer`` not sent as they are now, each step's anomalies after it (a
        first diff: its last ``history`` steps only, what a fresh stream could replay)."""
        steps = answer.get("steps", [])
        shown = steps[-history:] if history else steps
        by_step: dict[int, list[dict[str, Any]]] = {}
        for anomaly in answer.get("anomalies", []):
            by_step.setdefault(anomaly["step"], []).append(anomaly)
        events: Events = []
        for entry in shown:
            events += self._changed("step", entry["step"], entry)
            for anomaly in by_step.pop(entry["step"], []):
                events += self._changed("anomaly", _identity(anomaly), anomaly)
        if not history:  # an anomaly found later at an earlier step
            for anomaly in (a for group in by_step.values() for a in group):
                events += self._changed("anomaly", _identity(anomaly), anomaly)
        return events

    def _changed(self, kind: str, who: Any, entry: dict[str, Any]) -> Events:
        digest = hash(orjson.dumps(entry))
        if self.sent.get((kind, who)) == digest:
            return []
        self.sent[(kind, who)] = digest
        return [(kind, entry)]


def _identity(anomaly: dict[str, Any]) -> tuple[Any, ...]:
    return anomaly["step"], anomaly["kind"], anomaly.get("micro"), anomaly.get("rank")


class Watcher:
    """The watched runs, by name, and the thread that polls them; ``compute(path)`` gives a run's timeline."""

    def __init__(self, settings: Settings, compute: Callable[[Path], dict[str, Any]] | None = None) -> None:
        self.settings = settings
        self.compute = compute or (lambda path: timeline_of(path, settings))
        self.watches: dict[str, Watch] = {}
        self.streams: RunStreams | None = None
        self.loop: Any = None
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None
        self.polled = 0  # timelines computed (for the benchmark: CPU per step watched)

    def start(self) -> None:
        """Start polling (on the event loop: the events are published there)."""
        if self.thread is None:
            self.loop = asyncio.get_running_loop()
            self.stopped.clear()
            self.thread = threading.Thread(target=self._run, name="run-watcher", daemon=True)
            self.thread.start()

    def stop(self) -> None:
        """Stop polling; the open streams end with the lab manager's ``closing`` (the server is stopping)."""
        self.stopped.set()
        if self.thread is not None:
            self.thread.join(timeout=5)
            self.thread = None
        for watch in list(self.watches.values()):
            watch.run.wake()

    async def stream(
        self, path: Path, streams: RunStreams, client: str, after: int | None, last_event_id: str | None
    ) -> EventStream:
        """A new stream of the run at ``path``: its watch started (and its first poll made, off the event
        loop) when none is, from where ``Last-Event-ID`` or ``after`` say."""
        self.start()
        self.streams = streams
        watch = self.watches.get(path.name)
        if watch is None or watch.run.finished or watch.path != path:
            watch = Watch(path, LiveRun(id=path.name, run_dir=path, fields={}))
            self.watches[path.name] = watch
            await anyio.to_thread.run_sync(self.poll, watch, True)
        start = start_index(watch.run, last_event_id, after, streams.history)
        try:
            return streams.open(watch.run, client, start, self._released)
        except ApiError:
            self._released(watch.run)  # refused (a cap): a watch nobody listens to stops
            raise

    def _released(self, run: LiveRun) -> None:
        watch = self.watches.get(run.id)
        if watch is not None and watch.run is run and (run.listeners <= 0 or run.finished):
            del self.watches[run.id]

    def _run(self) -> None:
        while not self.stopped.wait(self.settings.watch_interval):
            closing = self.streams is not None and self.streams.manager.closing
            for watch in list(self.watches.values()):
                if closing:
                    self.loop.call_soon_threadsafe(watch.run.wake)
                elif watch.run.listeners > 0 and not watch.run.finished:
                    try:
                        self.poll(watch)
                    except Exception:  # one run's failure never stops the others' watch
                        log.exception("watching run %s", watch.path.name)

    def poll(self, watch: Watch, first: bool = False) -> None:
        """Look at the run's files; when they changed, publish what is new (on the event loop)."""
        with watch.lock:
            events = self._events(watch, first)
            if events:
                history = self.settings.lab_stream_history
                self.loop.call_soon_threadsafe(watch.run.publish, events, history)

    def _answer(self, watch: Watch) -> dict[str, Any]:
        """The run's timeline now; none (nothing new to send) when it cannot be read: logged, and looked at
        again when its files change."""
        self.polled += 1
        try:
            return self.compute(watch.path)
        except Exception:  # a run being written may not read whole; the watch goes on
            log.exception("the timeline of run %s", watch.path.name)
            return {}

    def _events(self, watch: Watch, first: bool) -> Events:
        try:
            key = files_key(watch.path)
        except (FileNotFoundError, NotADirectoryError):
            return [("done", {"status": None, "reason": "deleted"})]
        except OSError:  # no longer readable by the server
            return [("done", {"status": None, "reason": "unreadable"})]
        if watch.key is not None and key[0] != watch.key[0]:
            return [("done", {"status": None, "reason": "replaced"})]
        now = time.monotonic()
        if key == watch.key and (now - watch.changed_at > RACY_SECONDS or step_entries(watch.path) == watch.entries):
            return []  # unchanged (and, in the tick of the last change, no name added to steps/ either)
        if key != watch.key:
            watch.changed_at = now
        watch.key, watch.entries = key, step_entries(watch.path)
        status = run_status(watch.path)
        answer = self._answer(watch) if status == "running" or not first else {}  # not running: not read
        verdict = answer.get("verdict", watch.verdict)
        events: Events = []
        if first or (status, verdict) != (watch.status, watch.verdict):
            steps = len(answer.get("steps", []))
            events.append(("status", {"status": status, "steps": steps, "verdict": verdict}))
        watch.status, watch.verdict = status, verdict
        events += watch.diff(answer, self.settings.lab_stream_history if first else None)
        if status != "running":
            events.append(("done", {"status": status, "reason": "status"}))
        return events
