"""A lab run's Server-Sent Events: who opens a stream, the caps on open streams, and the stream itself.

The server holds no events per stream (each reads its run's one list, ``app.lab_workers.LabRun``), so
a stream's cost is the one send it waits on: bounded in time (a stalled reader is dropped), in number
(``StreamCaps``: per run and per client, a 429 past either; a run keeps one place for its owner), and
in what it replays (``first_event``: after the ``Last-Event-ID`` a reconnecting browser sends, and never
more than ``lab_stream_history`` past events).

A stalled reader: every send waits at most ``stall`` seconds. A send waits only once every buffer between
here and the reader is full, so an event stream's own buffers are made small (``STREAM_BUFFER_BYTES``
for this process's and the kernel's send buffers): a reader that takes nothing is found stalled after
its own receive buffer and about 3 × that much more, not after the megabytes a loopback or LAN socket
would otherwise buffer. (No server can tell a reader that stopped reading from a slow one before then.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import APIRouter, Header
from fastapi.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from app.auth import Sessions, cookie_values
from app.errors import refused
from app.lab_workers import LabManager, LabRun
from app.middleware import TRANSPORT
from app.schemas import ErrorResponse

# What an event-stream route answers besides its events, and the header a reconnecting EventSource sends: one
# definition for the lab's streams and a run's.
TOO_MANY_STREAMS: dict[int | str, dict[str, Any]] = {
    429: {"model": ErrorResponse, "description": "Too many open streams (a setting)"}
}
LastEventId = Annotated[str | None, Header(description="The last event's id a reconnecting reader has")]


def event_stream_route(
    router: APIRouter, path: str, summary: str, not_found: dict[int | str, Any]
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The decorator of an event-stream route: a GET answered as a stream, its 404 and its 429 documented."""
    return router.get(
        path, summary=summary, response_class=StreamingResponse, responses={**not_found, **TOO_MANY_STREAMS}
    )


log = logging.getLogger("grpo_lens.lab")
KEEPALIVE_SECONDS = 10.0
COALESCE_SECONDS = 0.2  # a stream sends what came in this long at once: fewer wakeups per stream while a run trains
STREAM_BUFFER_BYTES = 16 * 1024  # an event stream's send buffers: a reader that takes nothing stalls a send soon


def client_key(sessions: Sessions | None, cookie: str, address: str) -> str:
    """Who opens a stream, for the per-client cap: the signed-in session when the instance has sign-in
    (people behind one address each get their own share), else the address (uvicorn has put the
    forwarded one there when the proxy is trusted). Without sign-in a cookie proves nothing: a client
    could vary it to dodge the cap, so it does not count."""
    if sessions is not None:
        for value in cookie_values(cookie):
            if (sid := sessions.check(value)) is not None:
                return f"session {sid}"
    return f"address {address}"


def first_event(run: LabRun, last_event_id: str | None, history: int) -> int:
    """The index of the first event a new stream of ``run`` sends: the one after ``Last-Event-ID`` (what a
    reconnecting EventSource already has), and at most ``history`` back from the newest either way (a
    reader far behind, or a fresh one, gets the recent events, not the whole run again)."""
    newest = len(run.chunks)
    start = 0
    if last_event_id is not None and last_event_id.strip().isdecimal() and len(last_event_id) <= 12:
        start = min(int(last_event_id) + 1, newest)
    return max(start, newest - history)


@dataclass
class StreamCaps:
    """Open event streams, counted per run and per client; past a cap a new one is a 429 naming it.

    A run started by a client (``LabRun.owner``) keeps one place for it: its owner's first stream of it
    is let in past both caps, and the others share ``per_run`` − 1 places, so streams opened by others
    (however many sign-ins they hold) never shut the owner out of its own run."""

    per_run: int
    per_client: int
    runs: Counter[str] = field(default_factory=Counter)
    clients: Counter[str] = field(default_factory=Counter)
    owned: set[str] = field(default_factory=set)  # runs whose owner holds its kept place

    def open(self, run: LabRun, client: str) -> Callable[[], None]:
        """Counts a new stream of ``run`` for ``client`` (a 429 past a cap); the function that gives its place back."""
        run_id = run.id
        if run.owner and client == run.owner and run_id not in self.owned:
            self.owned.add(run_id)
            self.runs[run_id] += 1

            def release_kept() -> None:
                self.owned.discard(run_id)
                self._drop(self.runs, run_id)

            return release_kept
        kept = 1 if run.owner else 0  # the owner's place, in use or not
        in_use = self.runs[run_id] - (1 if run_id in self.owned else 0)
        if in_use >= self.per_run - kept:
            msg = f"{self.runs[run_id]} event streams are open on this run (at most {self.per_run}: the setting "
            raise refused(429, ["path", "run_id"], msg + "lab_max_streams_per_run); retry later", "too_many_streams")
        if self.clients[client] >= self.per_client:
            msg = f"this client has {self.clients[client]} event streams open (at most {self.per_client}: the "
            raise refused(429, ["path", "run_id"], msg + "setting lab_max_streams_per_client)", "too_many_streams")
        self.runs[run_id] += 1
        self.clients[client] += 1

        def release() -> None:
            self._drop(self.runs, run_id)
            self._drop(self.clients, client)

        return release

    @staticmethod
    def _drop(counter: Counter[str], key: str) -> None:
        counter[key] -= 1
        if counter[key] <= 0:
            del counter[key]

    def stream(self, manager: LabManager, run: LabRun, client: str, stall: float, start: int = 0) -> EventStream:
        """The run's event stream for ``client`` from event ``start`` on, counted here until it ends (checked
        and counted in one step: no await in between)."""
        release = self.open(run, client)
        return EventStream(stream_events(manager, run, start), release, stall)


class EventStream(StreamingResponse):
    """A Server-Sent Events response that gives its place under the caps back however it ends, and
    drops a reader that has taken nothing for ``stall`` seconds (every buffer to it full)."""

    def __init__(self, content: AsyncIterator[bytes], release: Callable[[], None], stall: float) -> None:
        # connection: close: the small buffers below stay with this stream, never with a later request
        headers = {"cache-control": "no-cache", "x-accel-buffering": "no", "connection": "close"}
        super().__init__(content, media_type="text/event-stream", headers=headers)
        self.release, self.stall = release, stall

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        _small_buffers(scope.get(TRANSPORT))

        async def bounded(message: Message) -> None:
            await asyncio.wait_for(send(message), self.stall)  # asyncio.timeout is 3.11's; the library's floor is 3.10

        try:
            await super().__call__(scope, receive, bounded)
        except asyncio.TimeoutError:  # builtin TimeoutError from 3.11 on, its own class in 3.10
            log.info("dropped an event stream whose reader took nothing for %g s", self.stall)
        finally:
            self.release()


def _small_buffers(transport: asyncio.Transport | None) -> None:
    """This connection's send buffers (asyncio's and the kernel's) down to ``STREAM_BUFFER_BYTES``, so a
    send to a reader that takes nothing waits (and the stall limit can end it) after little data."""
    if transport is None:  # not served by uvicorn (a test transport): nothing to tune
        return
    with contextlib.suppress(AttributeError, OSError, ValueError):
        transport.set_write_buffer_limits(high=STREAM_BUFFER_BYTES)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, STREAM_BUFFER_BYTES)


async def stream_events(manager: LabManager, run: LabRun, start: int = 0) -> AsyncIterator[bytes]:
    """The events from index ``start`` on, then what comes as it comes; ends after the run's last event or
    when the server stops. No polling: the stream sleeps on the run's event, waking for news, for a
    comment line every KEEPALIVE_SECONDS (proxies close silent streams), or when the server closes."""
    sent = start
    while True:
        woken = run.updated  # taken in the same step as the check below: no event slips between them
        if sent < len(run.chunks):
            chunk, sent = b"".join(run.chunks[sent:]), len(run.chunks)
            yield chunk
            if not run.finished and not manager.closing:
                await asyncio.sleep(COALESCE_SECONDS)
            continue
        if run.finished or manager.closing:
            return
        if not await _wait(woken, KEEPALIVE_SECONDS):
            yield b": keep-alive\n\n"


async def _wait(event: asyncio.Event, timeout: float) -> bool:
    """Whether ``event`` was set within ``timeout`` seconds."""
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except TimeoutError:
        return False
    return True
