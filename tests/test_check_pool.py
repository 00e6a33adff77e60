"""check-run's local pool: files in chunks, read ahead, in workers that keep freed memory; the serial check's result.

``LocalPool`` hands each worker up to ``FILES_PER_TASK`` files at once (imap's chunksize), every task names the
run's next file so its read starts while the present one is evaluated (``read_ahead``), and each worker tunes
glibc as the CLI's process does. None of this may change a number, the order of the results, or how many
breakdowns a process holds at once (one: what keeps a check's memory flat in the run's size).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch

import grpo
import grpo._allocator
import grpo.check
from grpo.check import FILES_PER_TASK, LocalPool, RunCheck, check_pool, check_run, files_per_task, read_ahead
from grpo.runs import RunWriter, StepRef, load_run, load_step

CONFIG = grpo.LossConfig.from_preset("trl-dapo")


def write_run(root: Path, files: int, tampered: int | None = None) -> Path:
    """``files`` micro-batches of 4 x 32 (four per step), each meta holding GRPO Lens's loss, the ``tampered``-th
    off by 0.01 (so one micro-batch, and its step, must come out a mismatch, in its place)."""
    writer = RunWriter(root, "trl", CONFIG)
    g = torch.Generator().manual_seed(0)
    for i in range(files):
        old = -torch.rand(4, 32, generator=g) * 3 - 0.01
        tensors = {
            "per_token_logps": (old + 0.05 * torch.randn(4, 32, generator=g)).clamp(max=0),
            "old_per_token_logps": old,
            "completion_mask": torch.arange(32)[None, :] < torch.randint(8, 33, (4, 1), generator=g),
            "advantages": torch.randn(4, generator=g),
        }
        step, micro = i // 4 + 1, i % 4
        path = writer.write_step(step, micro, tensors, {})
        assert path is not None
        batch, stored, _ = load_step(path)
        loss = float(grpo.evaluate(batch, stored).loss) + (0.01 if i == tampered else 0.0)
        writer.write_step(step, micro, tensors, {"loss": loss})
    writer.update(status="done")
    return root


def same_check(a: RunCheck, b: RunCheck) -> None:
    """The same micro-batches and steps in the same order with the same verdicts; the numbers to float32
    round-off (a worker's torch runs one thread, this process's several: a split reduction may round apart)."""
    assert a.ok == b.ok
    key = [(m.step, m.micro, m.rank, m.file, m.trainer_loss, m.num_tokens, m.ok) for m in a.micro]
    assert key == [(m.step, m.micro, m.rank, m.file, m.trainer_loss, m.num_tokens, m.ok) for m in b.micro]
    for x, y in zip(a.micro, b.micro, strict=True):
        assert x.lens_loss == pytest.approx(y.lens_loss, rel=1e-6, abs=1e-7)
    assert [(s.step, s.micro_batches, s.ok) for s in a.steps] == [(s.step, s.micro_batches, s.ok) for s in b.steps]
    for sx, sy in zip(a.steps, b.steps, strict=True):
        assert sx.lens_loss == pytest.approx(sy.lens_loss, rel=1e-6, abs=1e-7)


def forked_pool(jobs: int) -> LocalPool:
    """check_pool's local pool, forked whatever the core count (so a patch made here reaches the workers)."""
    ctx = multiprocessing.get_context("fork")
    return LocalPool(ctx.Pool(jobs, initializer=grpo.check._start_worker, initargs=(1,)), jobs)


def test_files_per_task_gives_every_process_four_chunks_up_to_the_cap() -> None:
    assert files_per_task(200, 2) == FILES_PER_TASK == 8  # 200 // (4 * 2) = 25, capped
    assert files_per_task(40, 2) == 5  # 40 // 8: each of 2 processes gets 4 chunks of 5
    assert files_per_task(7, 2) == 1  # fewer files than 4 chunks per process: one file a task
    assert files_per_task(0, 4) == 1
    for files in range(0, 300, 7):
        for jobs in (1, 2, 3, 16):
            chunk = files_per_task(files, jobs)
            assert 1 <= chunk <= FILES_PER_TASK
            assert chunk == 1 or files // chunk >= 4 * jobs


@pytest.mark.skipif(sys.platform == "win32", reason="fork")
@pytest.mark.parametrize("tampered", [None, 22])
def test_chunked_pool_gives_the_serial_result_in_order(tmp_path: Path, tampered: int | None) -> None:
    # 40 files, 2 processes: chunks of 5 (files_per_task), so a chunk's results and the read-ahead cross workers
    run = load_run(write_run(tmp_path / "run", 40, tampered))
    assert files_per_task(len(run.steps), 2) == 5
    pool = forked_pool(2)
    try:
        parallel = check_run(run, pool=pool)
    finally:
        pool.pool.terminate()
    serial = check_run(run)
    same_check(parallel, serial)
    bad = [(m.step, m.micro) for m in parallel.micro if not m.ok]
    assert bad == ([] if tampered is None else [(tampered // 4 + 1, tampered % 4)])  # 22: step 6, micro 2


def test_check_pool_yields_the_chunked_local_pool(tmp_path: Path) -> None:
    run = load_run(write_run(tmp_path / "run", 12))
    with check_pool(jobs=2) as pool:
        assert isinstance(pool, LocalPool) and pool.jobs == 2
        same_check(check_run(run, pool=pool), check_run(run))


def _worker_state(_: Any) -> tuple[bool, int]:
    return grpo._allocator.applied, torch.get_num_threads()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_worker_keeps_freed_memory_and_runs_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    # the pool's parent (this test process) never tuned its allocator: the worker does it itself
    monkeypatch.delenv("GRPO_LENS_KEEP_MALLOC", raising=False)
    monkeypatch.setattr(grpo._allocator, "applied", False)
    pool = forked_pool(1)
    try:
        assert pool.pool.map(_worker_state, [0]) == [(True, 1)]
    finally:
        pool.pool.terminate()
    assert grpo._allocator.applied is False


_evaluated: list[weakref.ref[Any]] = []


def _evaluate_alone(*args: Any, **kwargs: Any) -> Any:
    """grpo.evaluate, failing when an earlier breakdown of this process is still alive as a file starts."""
    alive = sum(ref() is not None for ref in _evaluated)
    if alive:
        raise AssertionError(f"{alive} breakdown(s) alive in process {os.getpid()} as a new file starts")
    bd = grpo.loss.evaluate(*args, **kwargs)
    _evaluated.append(weakref.ref(bd))
    return bd


@pytest.mark.skipif(sys.platform == "win32", reason="fork")
def test_a_chunk_holds_one_breakdown_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # memory flat in the run's size: a chunk of 5 files keeps each file's small MicroResult, never its breakdown
    run = load_run(write_run(tmp_path / "run", 40))
    monkeypatch.setattr(grpo.check, "evaluate", _evaluate_alone)  # forked: the workers evaluate through it
    pool = forked_pool(2)
    try:
        assert check_run(run, pool=pool).ok
    finally:
        pool.pool.terminate()


def test_each_file_reads_its_successor_ahead(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = load_run(write_run(tmp_path / "run", 6))
    asked: list[StepRef | None] = []
    monkeypatch.setattr(grpo.check, "read_ahead", asked.append)
    check_run(run)
    assert asked == [*run.steps[1:], None]  # before file k, file k + 1; after the last, nothing


def test_read_ahead_is_a_hint_that_never_fails(tmp_path: Path) -> None:
    run = load_run(write_run(tmp_path / "run", 2))
    read_ahead(None)
    read_ahead(run.steps[1])
    read_ahead(StepRef(step=9, micro=0, rank=None, path=tmp_path / "gone.safetensors"))  # its load says why


def test_a_run_without_step_files_checks_as_empty(tmp_path: Path) -> None:
    # the read-ahead pairs each file with its successor: a run with no file has no pair (it was a ValueError,
    # a 500 on such a run's page)
    writer = RunWriter(tmp_path / "empty", "trl", grpo.LossConfig())
    writer.update(status="done")
    check = check_run(load_run(tmp_path / "empty"))
    assert check.ok and check.micro == [] and check.steps == []
