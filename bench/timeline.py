"""A run's timeline against check-run on the same run: the cost of the series and anomalies beside the check.

A run of STEPS small steps (one micro-batch of ROWS x WIDTH tokens each, ragged rows, the loss each file's config
gives recorded as the trainer's) is generated, or reused from --run. Then, in this process, on the files in the
page cache, --repeat times, alternated:
- check-run: ``check_run(load_run(RUN), pool=...)`` with ``check_pool(JOBS)``: every file evaluated and joined;
- the timeline, fresh (its kept files removed first): every file evaluated once, its facts kept, joined, the
  anomalies found, the answer and the files' facts written beside the run;
and prints their medians and the ratio timeline / check-run (the target: <= 1.5x). Then the warm answer: the
timeline asked again with the run unchanged (served from the kept file: no step file read), its median time.
Then (--extend N) a live run's cost: ``extend`` after each of N new step files added one at a time, median per
file, on a 100-step run and on a copy of the bench's run, and their ratio (1x: independent of the run's length).
Run: .venv/bin/python bench/timeline.py [--steps 40000] [--rows 4] [--width 16] [--jobs 1] [--repeat 3]
[--run DIR] [--extend 5] (--quick: 400 steps, one repeat: a smoke test of the code path, not a figure)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpo  # noqa: E402
from grpo._allocator import keep_freed_memory  # noqa: E402
from grpo.check import check_pool, check_run  # noqa: E402
from grpo.runs import RunWriter, load_run  # noqa: E402
from grpo.timeline import KEPT, KEPT_FILES, extend  # noqa: E402


def generate(run_dir: Path, steps: int, rows: int, width: int, first: int = 1) -> None:
    """``steps`` one-file steps from step ``first`` (a run resumed when it is past 1); each file records the
    loss GRPO Lens computes for its batch as the trainer's."""
    config = grpo.LossConfig.from_preset("trl-dapo")
    writer = RunWriter(run_dir, "trl", config, resume=first > 1)
    g = torch.Generator().manual_seed(first)
    for step in range(first, first + steps):
        lengths = torch.randint(1, width + 1, (rows,), generator=g)
        old = -torch.rand(rows, width, generator=g) * 3 - 0.3
        tensors = {
            "per_token_logps": old + 0.05 * torch.randn(rows, width, generator=g),
            "old_per_token_logps": old,
            "completion_mask": torch.arange(width)[None, :] < lengths[:, None],
            "advantages": torch.randn(rows, generator=g),
        }
        loss = float(grpo.evaluate(grpo.Batch(**tensors), config).loss)
        writer.write_step(step, 0, tensors, {"loss": loss})
    writer.update(status="done")


def timed_check(run_dir: Path, jobs: int) -> float:
    start = time.perf_counter()
    with check_pool(jobs) as pool:
        check = check_run(load_run(run_dir), pool=pool)
    elapsed = time.perf_counter() - start
    assert check.ok, check.counts()
    return elapsed


def timed_timeline(run_dir: Path, jobs: int, fresh: bool) -> float:
    if fresh:
        for name in (KEPT, KEPT_FILES):
            (run_dir / name).unlink(missing_ok=True)
    start = time.perf_counter()
    done = extend(run_dir, jobs=jobs)
    elapsed = time.perf_counter() - start
    assert done.evaluated == (len(load_run(run_dir).steps) if fresh else 0)
    assert done.answer["verdict"] == "match" and len(done.answer["steps"]) == len(load_run(run_dir).step_numbers())
    return elapsed


def timed_extensions(run_dir: Path, new: int, rows: int, width: int) -> float:
    """The median time of ``extend`` after one new step file, over ``new`` files added one at a time to a run
    whose timeline this process built (what the live watch asks after each poll)."""
    extend(run_dir)
    times = []
    for _ in range(new):
        generate(run_dir, 1, rows, width, first=max(load_run(run_dir).step_numbers()) + 1)
        start = time.perf_counter()
        done = extend(run_dir)
        times.append(time.perf_counter() - start)
        assert done.evaluated == 1 and done.answer["verdict"] == "match"
    return statistics.median(times)


def extension_figure(run_dir: Path, small_dir: Path, new: int, rows: int, width: int) -> None:
    """``extend`` per new file on a 100-step run and on the bench's run (its own copy: the run stays as it was)."""
    generate(small_dir, 100, rows, width)
    copy = small_dir.parent / "extended"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns(KEPT, KEPT_FILES))
    small, large = timed_extensions(small_dir, new, rows, width), timed_extensions(copy, new, rows, width)
    files = len(load_run(copy).steps) - new
    print(f"extend per new file: 100 steps {small * 1e3:8.1f} ms, {files} steps {large * 1e3:8.1f} ms")
    print(f"ratio {files} / 100 steps: {large / small:.2f}x (independent of the run's length: 1x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40_000)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--run", type=Path, default=None, help="the run's directory: generated there if absent")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--extend", type=int, default=5, help="new files timed one at a time (0: none)")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.repeat = 400, 1
    keep_freed_memory()  # as the CLI and the server's workers run
    with tempfile.TemporaryDirectory(prefix="bench-timeline-") as tmp:
        run_dir = args.run or Path(tmp) / "run"
        if not (run_dir / "run.json").exists():
            start = time.perf_counter()
            generate(run_dir, args.steps, args.rows, args.width)
            print(f"generated {args.steps} steps of {args.rows} x {args.width} in {time.perf_counter() - start:.1f} s")
        files = len(load_run(run_dir).steps)
        print(f"run: {files} step files, {args.jobs} job(s); load average {os.getloadavg()[0]:.2f}")
        timed_check(run_dir, args.jobs)  # files into the page cache, torch warm
        checks, timelines, warm = [], [], []
        for _ in range(args.repeat):
            checks.append(timed_check(run_dir, args.jobs))
            timelines.append(timed_timeline(run_dir, args.jobs, fresh=True))
            warm.append(timed_timeline(run_dir, args.jobs, fresh=False))
        check_s, timeline_s = statistics.median(checks), statistics.median(timelines)
        print(f"check-run  median {check_s:8.2f} s  (min {min(checks):.2f})")
        print(f"timeline   median {timeline_s:8.2f} s  (min {min(timelines):.2f})")
        print(f"ratio timeline / check-run: {timeline_s / check_s:.2f}x (target <= 1.5x)")
        print(f"warm (kept) answer median {statistics.median(warm):8.3f} s; load average {os.getloadavg()[0]:.2f}")
        if args.extend:
            extension_figure(run_dir, Path(tmp) / "small", args.extend, args.rows, args.width)


if __name__ == "__main__":
    main()
