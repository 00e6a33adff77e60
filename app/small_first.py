"""Small requests first: while any small request is being computed, a large body waits before its next chunk
is read (at most ``wait`` seconds a chunk).

A large upload costs CPU on both sides of the socket while it streams in: the sender's copies into the kernel,
the kernel's out of it, this process's writes to the spool file. On a machine of few cores that time is taken
from the small requests beside it, whose compute stretches. Not reading the socket for a few milliseconds
stops all three (the kernel's buffer fills and the sender waits), so the cores go to the small request;
the upload loses that much and no more: the wait ends as soon as no small request is running, and a chunk
waits at most ``wait`` seconds, so a stream of small requests slows a large body but never stops it.
Everything here runs on the event loop (one thread): no lock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

import anyio


class SmallFirst:
    def __init__(self, wait: float) -> None:
        self.wait = wait
        self.running = 0  # small requests in their threads now
        self.waited = 0.0  # seconds large bodies waited, in all (for the benchmark)
        self._quiet: asyncio.Event | None = None

    def _event(self) -> asyncio.Event:
        if self._quiet is None:  # made on the event loop, at first use
            self._quiet = asyncio.Event()
            self._quiet.set()
        return self._quiet

    @contextmanager
    def small(self) -> Iterator[None]:
        """Around a small request's compute."""
        quiet = self._event()
        self.running += 1
        quiet.clear()
        try:
            yield
        finally:
            self.running -= 1
            if not self.running:
                quiet.set()

    async def before_large_chunk(self) -> None:
        """Before a large body's next chunk is read: wait while small requests run (at most ``wait`` s)."""
        if not self.running or self.wait <= 0:
            return
        started = asyncio.get_running_loop().time()
        with anyio.move_on_after(self.wait):
            await self._event().wait()
        self.waited += asyncio.get_running_loop().time() - started
