"""A running run's Server-Sent Events (``GET /api/v1/runs/{name}/events``): the event log a watch keeps
(``LiveRun``) and the stream a client opens on it.

The log is the lab's: a ``LiveRun`` is a ``LabRun`` (its ``chunks``, each an event as SSE text encoded once,
and the ``updated`` event streams sleep on), so a stream is the lab's own (``app.lab_streams``): the same
per-run and per-client caps (one ``StreamCaps`` for lab and live streams alike: a 429 naming the setting),
the same stall limit, the same bounded replay. Events:

- ``step``: one step's entry of the run's timeline (``grpo.runs.timeline``'s ``steps[i]``, as it is), sent
  when the step first appears and again when it changes (a later micro-batch or rank of it written);
- ``anomaly``: one of the timeline's ``anomalies`` not sent before;
- ``status``: ``{"status", "steps"}``, first, and whenever run.json's status changes;
- ``done``: ``{"status", "reason"}``, last: the run left ``running``, was deleted or replaced.

An event's id is ``{epoch}-{index}``: ``index`` its place in this log, ``epoch`` the log's own (a log lives
while someone listens; a later one starts again from 0). A reconnect whose ``Last-Event-ID`` names this log
gets the events after it; one naming another log (or none) is a fresh stream: at most ``lab_stream_history``
recent events, and with ``after`` only the events past the step the page already has.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field
from typing import Any

import orjson

from app.lab_streams import EventStream, StreamCaps, first_event, stream_events
from app.lab_workers import LabManager, LabRun

_epochs = itertools.count(1)
OLD_CHUNKS = (
    4  # events older than this many replays' worth are dropped from memory (a reader that far behind lost them)
)


@dataclass
class LiveRun(LabRun):
    """A watched run's event log. ``steps_at[i]``: the highest step any event up to ``i`` carried (what
    ``after`` is looked up in); ``listeners``: streams open on it (none: the watch stops)."""

    epoch: str = field(default_factory=lambda: str(next(_epochs)))
    steps_at: list[int] = field(default_factory=list)
    listeners: int = 0
    trimmed: int = 0  # chunks below this index are dropped (b"")

    def publish(self, events: list[tuple[str, dict[str, Any]]], history: int) -> None:
        """Append ``events`` (on the event loop) and wake the streams; a ``done`` ends the log."""
        for name, data in events:
            number = len(self.chunks)
            top = max(self.steps_at[-1] if self.steps_at else 0, int(data.get("step") or 0) if name == "step" else 0)
            body = orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY).decode()  # NaN as null
            self.chunks.append(f"id: {self.epoch}-{number}\nevent: {name}\ndata: {body}\n\n".encode())
            self.steps_at.append(top)
            if name == "done":
                self.status = "done"
        while self.trimmed < len(self.chunks) - OLD_CHUNKS * history:
            self.chunks[self.trimmed] = b""
            self.trimmed += 1
        self.wake()


def start_index(run: LiveRun, last_event_id: str | None, after: int | None, history: int) -> int:
    """Where a new stream of ``run`` starts: after ``Last-Event-ID`` when it names this log (else a fresh
    stream's bounded history), and past the events of steps up to ``after`` (what the page has)."""
    epoch, _, index = (last_event_id or "").strip().partition("-")
    start = first_event(run, index if epoch == run.epoch else None, history)
    if after is not None:
        start = max(start, bisect.bisect_right(run.steps_at, after))
    return start


@dataclass
class RunStreams:
    """What a run's stream needs besides its log: the caps it counts under, the lab manager whose
    ``closing`` ends every stream at shutdown, and the stall limit."""

    caps: StreamCaps
    manager: LabManager
    stall: float
    history: int

    def open(self, run: LiveRun, client: str, start: int, released: Any) -> EventStream:
        """The stream of ``run`` from event ``start`` for ``client``, counted under the caps (a 429 past one)
        until it ends; then ``released()`` (the watch's listener count)."""
        give_back = self.caps.open(run, client)
        run.listeners += 1

        def release() -> None:
            give_back()
            run.listeners -= 1
            released(run)

        return EventStream(stream_events(self.manager, run, start), release, self.stall)
