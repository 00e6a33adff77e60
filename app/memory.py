"""A process's memory: its heap given back to the OS when idle, and the workers' huge pages, for large jobs only.

A worker trims its heap once idle, so a large request arriving later faults its buffers in again: a JSON body
of 62 MB about 100k faults of 4 KiB, 80-140 ms of a 300 ms request (``bench/api.py``'s figure 2); in 2 MiB
pages that cost is gone. A job of a few MB gains nothing from them and pays for each 2 MiB page it touches
(zeroed whole) and again when the trim splits them, so a worker turns them off for the length of such a job.
A job whose working memory is priced past ``HUGE_PAGE_WORK_BYTES`` goes on in 4 KiB pages too: on a VM whose
host takes back the guest's free memory (virtio-balloon free page reporting, as on the machines of
``docs/benchmarks.md``), its 2 MiB pages come from the blocks the host took back, each a fresh fault on the
host: the largest request (``bench/api.py``'s figure 4, 736 MB priced) ran 2.7x slower with them. Even so
its JSON parse, before the price is known, pays for them, so they are off unless ``worker_huge_pages`` asks.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress

HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb=1"
HUGE_PAGE_JOB_BYTES = 16 * 1024 * 1024  # a worker's job with this many request bytes or more keeps its huge pages
HUGE_PAGE_WORK_BYTES = 512 * 1024 * 1024  # ... unless its working memory is priced past this
PR_SET_THP_DISABLE = 41  # linux/prctl.h: the process's transparent huge pages off (1) or back on (0)


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def release_memory() -> None:
    """Hand the heap's free pages back to the OS (glibc's malloc_trim; a no-op elsewhere)."""
    with suppress(AttributeError):  # not glibc: nothing to trim
        if libc := _libc():
            libc.malloc_trim(0)


def allow_huge_pages_in_children() -> None:
    """Processes started from here on (the spawned workers) let glibc's malloc ask for transparent huge pages
    (``madvise``; the kernel's ``transparent_hugepage`` must be ``madvise`` or ``always``, else nothing changes).
    Tunables are read when a process starts, so this process is unchanged; an operator's own
    ``glibc.malloc.hugetlb`` in ``GLIBC_TUNABLES`` is kept as it is."""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb" not in tunables:
        os.environ["GLIBC_TUNABLES"] = ":".join(t for t in (tunables, HUGE_PAGES_TUNABLE) if t)


def _huge_pages(on: bool) -> bool:
    """This process's transparent huge pages on or off for its faults from now on; True when the kernel took it."""
    libc = _libc()
    return libc is not None and libc.prctl(PR_SET_THP_DISABLE, int(not on), 0, 0, 0) == 0


class _Job:
    """The worker's job under ``huge_pages_for``: running, and whether it turned the huge pages off."""

    running = False
    off = False


@contextmanager
def huge_pages_for(job_bytes: int) -> Iterator[None]:
    """A job's pages. In a worker that allocates in huge pages (started after ``allow_huge_pages_in_children``),
    a job of fewer than ``HUGE_PAGE_JOB_BYTES`` request bytes faults its buffers in 4 KiB pages, and so does a
    job from where it prices its working memory past ``HUGE_PAGE_WORK_BYTES`` (``pages_for_work``); the
    worker's huge pages are on again after it. Elsewhere (an operator's own tunables included) nothing changes."""
    if HUGE_PAGES_TUNABLE not in os.environ.get("GLIBC_TUNABLES", ""):
        yield
        return
    _Job.running, _Job.off = True, job_bytes < HUGE_PAGE_JOB_BYTES and _huge_pages(False)
    try:
        yield
    finally:
        if _Job.off:
            _huge_pages(True)
        _Job.running = _Job.off = False


def pages_for_work(cost: int) -> None:
    """A job priced at ``cost`` bytes of working memory: inside ``huge_pages_for``, past ``HUGE_PAGE_WORK_BYTES``
    the rest of the job faults in 4 KiB pages. Elsewhere (a thread of the server's process) nothing changes."""
    if _Job.running and not _Job.off and cost > HUGE_PAGE_WORK_BYTES:
        _Job.off = _huge_pages(False)
