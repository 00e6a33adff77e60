"""Small requests first: while a small request is being computed, the large work beside it steps back, each
part of it at most ``wait`` seconds at a time.

On a machine of few cores a small request's compute stretches beside large work: a streaming upload costs CPU
on both sides of the socket (the sender's copies into the kernel, the kernel's out of it, this process's
writes to the spool file), and a worker process computing a large batch takes a core and sweeps the shared
caches (niced, it still slowed the small requests' compute by a quarter). So while any small request runs:

- a large body's next chunk is not read (``before_large_chunk``): the kernel's buffer fills and the sender
  waits, and the three copies pause;
- a worker process pauses before its next torch operation (``PausedForSmall``, told through a flag in shared
  memory): a large evaluation is a few hundred operations, so it steps back within about a millisecond. The
  large and costly threads of the server's own process pause the same way (their pause sleeps: the small
  request gets the GIL as well as the core).

Neither starves: each waits at most ``wait`` s at a time and goes on as soon as no small request runs, and
after a wait it reads or computes at least as long as it waited before it waits again, so under a stream of
small requests large work keeps at least half its pace. What the work computes is unchanged
(the worker calls each operation as it was called, only later). The counting runs on the event loop (one
thread, no lock).
"""

from __future__ import annotations

import asyncio
import ctypes
import multiprocessing
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
from torch.overrides import TorchFunctionMode

POLL = 0.0005  # seconds between a paused worker's looks at the flag


class SmallFirst:
    def __init__(self, wait: float) -> None:
        self.wait = wait
        self.running = 0  # small requests in their threads now
        self.waited = 0.0  # seconds large bodies waited, in all
        # read by the worker processes (shared memory, given to them as they start): a small request runs
        self.flag: Any = multiprocessing.get_context("spawn").RawValue(ctypes.c_bool, False)
        self._quiet: asyncio.Event | None = None
        self._next_wait = 0.0  # the event loop's time before which large bodies read on (they waited just before)

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
        self.flag.value = self.wait > 0
        try:
            yield
        finally:
            self.running -= 1
            if not self.running:
                self.flag.value = False
                quiet.set()

    async def before_large_chunk(self) -> None:
        """Before a large body's next chunk is read: wait while small requests run (at most ``wait`` s, and
        after a wait, none for as long as it lasted)."""
        loop = asyncio.get_running_loop()
        if not self.running or self.wait <= 0 or loop.time() < self._next_wait:
            return
        started = loop.time()
        with anyio.move_on_after(self.wait):
            await self._event().wait()
        ended = loop.time()
        self.waited += ended - started
        self._next_wait = ended + (ended - started)


class PausedForSmall(TorchFunctionMode):
    """In a worker process, around a job: before each torch operation, while ``flag`` says a small request
    runs in the server, wait (at most ``wait`` s, then at least as long computing before the next pause)."""

    def __init__(self, flag: Any, wait: float) -> None:
        super().__init__()
        self.flag = flag
        self.wait = wait
        self.next_pause = 0.0
        self.paused = 0.0  # seconds, in all (for tests)

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if self.flag.value and (now := time.perf_counter()) >= self.next_pause:
            deadline = now + self.wait
            while self.flag.value and time.perf_counter() < deadline:
                time.sleep(POLL)
            end = time.perf_counter()
            self.paused += end - now
            self.next_pause = end + (end - now)
        return func(*args, **(kwargs or {}))
