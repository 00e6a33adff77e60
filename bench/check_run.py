"""check-run at scale: its wall time against its floor, and its peak memory as the run grows.

A run of FILES micro-batches of ROWS x WIDTH tokens is generated (random log-probs, ragged rows, the loss each
file's config gives recorded as the trainer's). Then, side by side:
- floor = max(reading every file cold (each file's pages dropped first with posix_fadvise DONTNEED),
  evaluating them serially on ONE torch thread in this process / the cores): no parallel check can beat both.
  The serial evaluation runs as the CLI's processes do (glibc told to keep freed memory, the files in the page
  cache, torch warm). It is timed on one thread because a check's processes each run one: a serial time on
  all the cores' threads, divided by the cores, would count the cores twice. The serial time on every core's
  thread (torch's default here) is printed too, for the record;
- `python -m grpo check-run RUN --jobs JOBS`, cold too, its wall time (interpreter start, imports, its pool,
  exit) and its ratio to the floor (the target: <= 1.5x);
- beside it, the CLI's fixed cost: `python -m grpo` (the article's 4-row example: interpreter start, imports,
  a tiny evaluation, exit as the CLI exits), and, as a second figure, check-run's wall less that fixed cost
  against the floor: what the pool does with the files, the start aside (NOT the target's figure);
- the peak RSS of that command (its own process or the largest of its pool's, from wait4) at 20 files and at
  FILES (target: FILES's <= 1.2x the peak at 20): flat in the number of files.
The timed commands run --repeat times each, alternated, cold each time; the medians are printed (min beside).
The machine's load average is printed at the start and the end: on a shared machine the figures move with it.
Run: .venv/bin/python bench/check_run.py [--files 200] [--rows 64] [--width 2048] [--jobs CORES] [--repeat 3]
(--files 2000: 2.2 GB on disk under the repository, where the fixed start weighs a tenth as much)
--base DIR: also times another checkout's check-run (run from DIR: `git worktree add DIR COMMIT`) on the same run,
alternated with this one's, and prints both medians and their ratio (a change's before and after).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpo  # noqa: E402
from grpo._allocator import keep_freed_memory  # noqa: E402
from grpo.check import check_run  # noqa: E402
from grpo.runs import RunWriter, load_run, load_step  # noqa: E402


def generate(run_dir: Path, files: int, rows: int, width: int) -> None:
    config = grpo.LossConfig.from_preset("trl-dapo")
    writer = RunWriter(run_dir, "trl", config)
    g = torch.Generator().manual_seed(0)
    for i in range(files):
        lengths = torch.randint(width // 4, width + 1, (rows,), generator=g)
        mask = torch.arange(width)[None, :] < lengths[:, None]
        old = -torch.rand(rows, width, generator=g) * 3 - 0.01
        tensors = {
            "per_token_logps": (old + 0.05 * torch.randn(rows, width, generator=g)).clamp(max=0),
            "old_per_token_logps": old,
            "completion_mask": mask,
            "advantages": torch.randn(rows, generator=g),
        }
        step, micro = i // 4 + 1, i % 4
        path = writer.write_step(step, micro, tensors, {})
        assert path is not None
        batch, stored, _ = load_step(path)
        loss = float(grpo.evaluate(batch, stored).loss)
        writer.write_step(step, micro, tensors, {"loss": loss})
    writer.update(status="done")


def drop_cache(run_dir: Path) -> None:
    for path in run_dir.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)  # dirty pages cannot be dropped
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def read_cold(run_dir: Path) -> float:
    drop_cache(run_dir)
    start = time.perf_counter()
    for ref in load_run(run_dir).steps:
        ref.path.read_bytes()
    return time.perf_counter() - start


def serial_eval(run_dir: Path, threads: int) -> float:
    """Seconds to check the run in this process on ``threads`` torch threads (files in the page cache)."""
    run = load_run(run_dir)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        start = time.perf_counter()
        check = check_run(run)
        elapsed = time.perf_counter() - start
    finally:
        torch.set_num_threads(before)
    assert check.ok
    return elapsed


def timed(argv: list[str], cwd: Path = ROOT) -> tuple[float, int]:
    """Wall seconds of a command and its peak RSS in MiB: wait4's ru_maxrss, the largest of the process and
    the children it waited for (the pool's processes). ``cwd``: where ``python -m grpo`` finds its grpo."""
    start = time.perf_counter()
    child = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    elapsed = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    stderr = child.stderr.read().decode() if child.stderr else ""
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(argv[1:])} exited {child.returncode}: {stderr[-2000:]}")
    return elapsed, usage.ru_maxrss // 1024


def check_run_cli(run_dir: Path, jobs: int, checkout: Path = ROOT) -> tuple[float, int]:
    """Wall seconds (cold) and peak RSS in MiB of ``python -m grpo check-run RUN --jobs JOBS`` (of ``checkout``'s
    grpo: ``-m`` looks in the working directory first)."""
    drop_cache(run_dir)
    return timed([sys.executable, "-m", "grpo", "check-run", str(run_dir), "--jobs", str(jobs)], checkout)


def fixed_start() -> float:
    """Wall seconds of the CLI doing next to nothing: ``python -m grpo`` (the article's 4-row example)."""
    return timed([sys.executable, "-m", "grpo"])[0]


def medians(repeat: int, *measures: Callable[[], float]) -> list[tuple[float, float]]:
    """(median, min) of each measure, the measures alternated ``repeat`` times (so load hits them alike)."""
    samples: list[list[float]] = [[] for _ in measures]
    for _ in range(repeat):
        for taken, measure in zip(samples, measures, strict=True):
            taken.append(measure())
    return [(statistics.median(taken), min(taken)) for taken in samples]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--small", type=int, default=20, help="the smaller run, for the memory figure")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeat", type=int, default=3, help="times each figure is taken (medians printed)")
    parser.add_argument("--base", type=Path, default=None, help="another checkout whose check-run is timed beside")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    keep_freed_memory()  # as the CLI's processes do: the serial floor is the best this process does
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(dir=ROOT) as tmp:
        big, small = Path(tmp) / "big", Path(tmp) / "small"
        start = time.perf_counter()
        generate(big, args.files, args.rows, args.width)
        generate(small, args.small, args.rows, args.width)
        size = sum(p.stat().st_size for p in big.rglob("*.safetensors")) / 2**20
        print(
            f"generated {args.files} + {args.small} files of {args.rows} x {args.width} in "
            f"{time.perf_counter() - start:.0f} s ({size:.0f} MiB for the large run)"
        )
        peaks = {}

        def cli(run_dir: Path, files: int) -> float:
            wall, peaks[files] = check_run_cli(run_dir, args.jobs)
            return wall

        all_threads = torch.get_num_threads()
        (cold, _), (serial, serial_min), (serial_all, _), (wall, wall_min), (fixed, fixed_min) = medians(
            args.repeat,
            lambda: read_cold(big),
            lambda: serial_eval(big, 1),
            lambda: serial_eval(big, all_threads),
            lambda: cli(big, args.files),
            fixed_start,
        )
        cli(small, args.small)
        if args.base is not None:
            base = args.base.resolve()
            (before, before_min), (after, after_min) = medians(
                args.repeat,
                lambda: check_run_cli(big, args.jobs, base)[0],
                lambda: check_run_cli(big, args.jobs)[0],
            )
            print(
                f"check-run --jobs {args.jobs}, {args.repeat} alternated runs: {base} {before:.3f} s "
                f"({before_min:.3f}), this checkout {after:.3f} s ({after_min:.3f}): {after / before:.3f}x"
            )
    floor = max(cold, serial / cores)
    load_end = os.getloadavg()[0]
    print(f"load average (1 min) {load_start:.2f} at the start, {load_end:.2f} at the end, on {cores} cores")
    print(f"{'':52}{'seconds':>8}   medians of {args.repeat} (min)")
    rows = [
        ("read cold", cold, None, ""),
        ("evaluate serially, 1 torch thread", serial, serial_min, ""),
        (f"  on {all_threads} torch threads (for the record)", serial_all, None, ""),
        (f"floor = max(read, 1-thread serial / {cores} cores)", floor, None, ""),
        (
            f"check-run --jobs {args.jobs} (cold)",
            wall,
            wall_min,
            f"{wall / floor:.2f}x the floor (target <= 1.5x)",
        ),
        ("  its fixed start: python -m grpo", fixed, fixed_min, ""),
        (
            "  check-run less its fixed start",
            wall - fixed,
            None,
            f"{(wall - fixed) / floor:.2f}x the floor (a second figure: the start aside)",
        ),
    ]
    for label, value, least, note in rows:
        low = f"({least:.2f})" if least is not None else ""
        print(f"{label:52}{value:>8.2f} {low:>7}  {note}")
    print(
        f"peak RSS: {peaks[args.small]} MiB at {args.small} files, {peaks[args.files]} MiB at {args.files} files: "
        f"{peaks[args.files] / peaks[args.small]:.2f}x (target <= 1.2x)"
    )


if __name__ == "__main__":
    main()
