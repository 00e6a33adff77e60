"""Serving: uvicorn's HTTP protocols with a deadline for a request's headers (slow clients are dropped).

uvicorn closes idle keep-alive connections but waits forever for the headers of a request that
trickles in a byte at a time. ``HeaderTimeout`` closes a connection whose next request's headers
have not all arrived within ``GRPO_LENS_REQUEST_TIMEOUT`` seconds of the connection opening or the
previous answer. (The body's deadline is ``BodyLimit``'s.) It comes on both of uvicorn's parsers:

- ``HeaderTimeoutHttpTools``: httptools, a C parser: a large body is received with little of the
  server's GIL, which the small requests beside it need (what `make run` and the image serve); it
  goes into a spool file as it comes (``app.middleware.BodyLimit``), never joined in memory here;
- ``HeaderTimeoutH11``: h11, pure Python, where httptools is not installed.

    uvicorn app.main:app --http app.server:HeaderTimeoutHttpTools     (what `make run` does)
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

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
    pass
