"""Serving: uvicorn's h11 protocol with a deadline for a request's headers (slow clients are dropped).

uvicorn closes idle keep-alive connections but waits forever for the headers of a request that
trickles in a byte at a time. ``HeaderTimeoutH11`` closes a connection whose next request's
headers have not all arrived within ``GRPO_LENS_REQUEST_TIMEOUT`` seconds of the connection
opening or the previous answer. (The body's deadline is ``BodyLimit``'s.)

    uvicorn app.main:app --http app.server:HeaderTimeoutH11     (what `make run` does)
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from app.settings import get_settings


class HeaderTimeoutH11(H11Protocol):
    timeout = get_settings().request_timeout

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        timer = getattr(self, "_header_timer", None)
        if timer is not None:
            timer.cancel()
        super().connection_lost(exc)

    def _arm(self) -> None:
        timer = getattr(self, "_header_timer", None)
        if timer is not None:
            timer.cancel()
        self._header_timer = self.loop.call_later(self.timeout, self._headers_late, self.cycle)

    def _headers_late(self, cycle_then: Any) -> None:
        """No new request has begun (its headers complete) since the timer was armed: drop the client."""
        if self.cycle is cycle_then and not self.transport.is_closing():
            self.transport.close()
