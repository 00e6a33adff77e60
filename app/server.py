"""Serving: uvicorn's HTTP protocols with a deadline for a request's headers (slow clients are dropped).

uvicorn closes idle keep-alive connections but waits forever for the headers of a request that
trickles in a byte at a time. ``HeaderTimeout`` closes a connection whose next request's headers
have not all arrived within ``GRPO_LENS_REQUEST_TIMEOUT`` seconds of the connection opening or the
previous answer. (The body's deadline is ``BodyLimit``'s.) It comes on both of uvicorn's parsers:

- ``HeaderTimeoutHttpTools``: httptools, a C parser: a large body is received with little of the
  server's GIL, which the small requests beside it need (what `make run` and the image serve); it
  goes into a spool file as it comes (``app.middleware.BodyLimit``), never joined in memory here:
  once ``BodyLimit`` has spooled a body, the parser writes the rest of it there itself (``BODY_SINK``);
- ``HeaderTimeoutH11``: h11, pure Python, where httptools is not installed.

    uvicorn app.main:app --http app.server:HeaderTimeoutHttpTools     (what `make run` does)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.middleware import BODY_SINK
from app.settings import get_settings


class HeaderTimeout:
    """The header deadline, for a uvicorn HTTP protocol: both set ``cycle`` once a request's headers
    are complete and call ``on_response_complete`` after each answer."""

    timeout = get_settings().request_timeout
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    cycle: Any

    def connection_made(self, transport: Any) -> None:  # an asyncio.Transport
        super().connection_made(transport)  # type: ignore[misc]
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        timer = getattr(self, "_header_timer", None)
        if timer is not None:
            timer.cancel()
        super().connection_lost(exc)  # type: ignore[misc]

    def _arm(self) -> None:
        timer = getattr(self, "_header_timer", None)
        if timer is not None:
            timer.cancel()
        self._header_timer = self.loop.call_later(self.timeout, self._headers_late, self.cycle)

    def _headers_late(self, cycle_then: Any) -> None:
        """No new request has begun (its headers complete) since the timer was armed: drop the client."""
        if self.cycle is cycle_then and not self.transport.is_closing():
            self.transport.close()


class HeaderTimeoutH11(HeaderTimeout, H11Protocol):
    pass


class HeaderTimeoutHttpTools(HeaderTimeout, HttpToolsProtocol):
    """...with a body sink: each request's scope holds, under ``BODY_SINK``, a function that has the rest of
    its body written where the caller says as the parser hands it over. uvicorn's own way joins each piece
    into the request's buffer, stops reading past 64 KiB and wakes the app's ``receive``, which copies the
    buffer out: for a 24 MB upload about a hundred wake-ups and two more copies, all in the event loop
    that the small requests beside it need. With a sink, ``receive`` wakes once, when the body is whole
    (or the client has gone). A write that raises drops the rest of the body: the caller sees it short."""

    def on_headers_complete(self) -> None:
        before = self.cycle
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle is not before:  # a new request (an upgrade is not one)
            cycle.scope[BODY_SINK] = lambda write: self._sink(cycle, write)

    def _sink(self, cycle: Any, write: Callable[[bytes], None]) -> bytes:
        """From now on ``write`` gets the rest of ``cycle``'s body; returns what came before and was not
        received yet (the caller writes it first)."""
        held = bytes(cycle.body)
        cycle.body = bytearray()
        cycle.sink = write
        if cycle.more_body and not cycle.disconnected:
            cycle.message_event.clear()  # what was held is taken: ``receive`` next wakes at the end
        self.flow.resume_reading()
        return held

    def on_body(self, body: bytes) -> None:
        write = getattr(self.cycle, "sink", None)
        if write is None or self.cycle.response_complete or (self.parser.should_upgrade() and self._should_upgrade()):
            super().on_body(body)
            return
        try:
            write(body)
        except Exception:  # not into the parser, which would answer 400 and close the connection
            self.cycle.sink = _dropped


def _dropped(body: bytes) -> None:
    """A sink whose write failed: the rest of the body goes nowhere."""
