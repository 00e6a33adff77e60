"""A lab run's Server-Sent Events: who opens a stream, the caps on open streams, and the stream itself.

The server holds no events per stream (each reads its run's one list, ``app.lab_workers.LabRun``), so
a stream's cost is the one send it waits on: bounded in time (a stalled reader is dropped) and in
number (``StreamCaps``: per run and per client, a 429 past either).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from fastapi.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from app.auth import Sessions, cookie_values
from app.errors import refused
from app.lab_workers import LabManager, LabRun

log = logging.getLogger("grpo_lens.lab")
KEEPALIVE_SECONDS = 10.0
COALESCE_SECONDS = 0.2  # a stream sends what came in this long at once: fewer wakeups per stream while a run trains


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


@dataclass
class StreamCaps:
    """Open event streams, counted per run and per client; past a cap a new one is a 429 naming it."""

    per_run: int
    per_client: int
    runs: Counter[str] = field(default_factory=Counter)
    clients: Counter[str] = field(default_factory=Counter)

    def open(self, run_id: str, client: str) -> None:
        if self.runs[run_id] >= self.per_run:
            msg = f"{self.runs[run_id]} event streams are open on this run (at most {self.per_run}: the setting "
            raise refused(429, ["path", "run_id"], msg + "lab_max_streams_per_run); retry later", "too_many_streams")
        if self.clients[client] >= self.per_client:
            msg = f"this client has {self.clients[client]} event streams open (at most {self.per_client}: the "
            raise refused(429, ["path", "run_id"], msg + "setting lab_max_streams_per_client)", "too_many_streams")
        self.runs[run_id] += 1
        self.clients[client] += 1

    def close(self, run_id: str, client: str) -> None:
        for counter, key in ((self.runs, run_id), (self.clients, client)):
            counter[key] -= 1
            if counter[key] <= 0:
                del counter[key]

    def stream(self, manager: LabManager, run: LabRun, client: str, stall: float) -> EventStream:
        """The run's event stream for ``client``, counted here until it ends (checked and counted in one
        step: no await in between)."""
        self.open(run.id, client)
        return EventStream(stream_events(manager, run), lambda: self.close(run.id, client), stall)


class EventStream(StreamingResponse):
    """A Server-Sent Events response that gives its place under the caps back however it ends, and
    drops a reader that has taken nothing for ``stall`` seconds (every buffer to it full)."""

    def __init__(self, content: AsyncIterator[bytes], release: Callable[[], None], stall: float) -> None:
        headers = {"cache-control": "no-cache", "x-accel-buffering": "no"}
        super().__init__(content, media_type="text/event-stream", headers=headers)
        self.release, self.stall = release, stall

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def bounded(message: Message) -> None:
            await asyncio.wait_for(send(message), self.stall)  # asyncio.timeout is 3.11's; the library's floor is 3.10

        try:
            await super().__call__(scope, receive, bounded)
        except asyncio.TimeoutError:  # builtin TimeoutError from 3.11 on, its own class in 3.10
            log.info("dropped an event stream whose reader took nothing for %g s", self.stall)
        finally:
            self.release()


async def stream_events(manager: LabManager, run: LabRun) -> AsyncIterator[bytes]:
    """Every event so far, then what comes as it comes; ends after the run's last event or when the
    server stops. No polling: the stream sleeps on the run's event, waking for news, for a comment
    line every KEEPALIVE_SECONDS (proxies close silent streams), or when the server closes."""
    sent = 0
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
