"""The pools ``check_run`` spreads a run's step files over: processes on this machine (forked where that is
safe, else spawned) or a Ray cluster's workers."""

from __future__ import annotations

import multiprocessing
import multiprocessing.pool
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import torch

from grpo._allocator import keep_freed_memory

_R = TypeVar("_R")  # what a pool's function returns for each file


@contextmanager
def check_pool(jobs: int = 1, ray_address: str | None = None) -> Iterator[Pool | None]:
    """The pool ``check_run`` spreads a run's files over: None for one job; ``jobs`` processes on this machine
    (each with its share of the cores for torch's threads); or, with ``ray_address`` ("auto",
    "ray://host:port", or "local" to start one here), Ray's multiprocessing Pool over that cluster's workers
    (the run must sit on a filesystem they all see, and grpo be importable there)."""
    if ray_address is not None:
        import ray  # optional: only --ray needs it
        from ray.util.multiprocessing import Pool as RayPool

        ray.init(address=None if ray_address == "local" else ray_address, ignore_reinit_error=True)
        ray_pool = RayPool()
        try:
            yield ray_pool
        finally:
            ray_pool.terminate()  # type: ignore[no-untyped-call]
        return
    if jobs <= 1:
        yield None
        return
    threads = max(1, (os.cpu_count() or 1) // jobs)
    # one thread per worker (jobs = cores, the default): forked, as torch's DataLoader forks its workers, which
    # then never use the parent's OpenMP pool; several threads each, or a process a fork is not safe in: spawned,
    # importing torch afresh (seconds)
    method = "fork" if threads == 1 and fork_is_safe() else "spawn"
    with multiprocessing.get_context(method).Pool(jobs, initializer=start_worker, initargs=(threads,)) as p:
        yield LocalPool(p, jobs)


def start_worker(threads: int) -> None:
    """A check pool's process: its share of the cores for torch's threads, and glibc keeping freed memory in
    the heap (``keep_freed_memory``): each file's evaluate allocates dozens of (B, T) tensors, which without it
    are page-faulted in afresh for every file (a forked worker inherits the setting when its parent made it;
    a spawned one, or a pool a library caller opens, would not)."""
    torch.set_num_threads(threads)
    keep_freed_memory()


FILES_PER_TASK = 8
"""The most files a local pool hands a worker at once (``imap``'s chunksize): one file per task is a round trip
through the pool's pipes and the parent's task and result threads per file (~0.3 ms of the parent's CPU beside
~7 ms of a worker's for a 64 x 2048 file); a larger chunk leaves a worker idle longer at the end of the run."""


@dataclass(frozen=True)
class LocalPool:
    """``check_pool``'s processes on this machine: ``imap`` in chunks of up to ``FILES_PER_TASK`` files,
    fewer for a run too short to give every process four chunks."""

    pool: multiprocessing.pool.Pool
    jobs: int

    def imap(self, func: Callable[[Any], _R], iterable: Iterable[Any]) -> Iterator[_R]:
        items = list(iterable)
        return self.pool.imap(func, items, chunksize=files_per_task(len(items), self.jobs))


def files_per_task(files: int, jobs: int) -> int:
    """A local pool's chunksize: ``FILES_PER_TASK``, or less so each of ``jobs`` processes gets >= 4 chunks."""
    return max(1, min(FILES_PER_TASK, files // (4 * jobs)))


FORK_UNSAFE_MODULES = ("ray", "grpc")
"""Libraries that start native threads of their own (gRPC's event engine, Ray's core worker): one may hold a lock
at the moment of a fork, which the forked child then waits on forever (a check-run in a Ray driver, or in a
process that ran one, hung so)."""


def fork_is_safe() -> bool:
    """Whether this process may fork its check workers: no Python thread but the main one, and none of
    ``FORK_UNSAFE_MODULES`` imported (their threads are native: ``threading`` does not see them)."""
    return threading.active_count() == 1 and not any(name in sys.modules for name in FORK_UNSAFE_MODULES)


class Pool(Protocol):
    def imap(self, func: Callable[[Any], _R], iterable: Iterable[Any]) -> Iterator[_R]: ...
